"""The protected-files check looks up a reading's parents by their identity (device, inode), so
that a hard link or another spelling of a protected folder is caught. A long reading (a 4 KB text
with slashes, read as a path) has hundreds of parents; the check stops at the first name that does
not exist. These tests hold that short cut to the plain walk (one lstat per parent) on a real tree
of links, and show through the real check that a protected folder is still found below a long,
real path and that a long text costs a handful of lookups."""

from __future__ import annotations

import os
import random
from pathlib import Path

from visor.approval import protected as protected_mod
from visor.approval.protected import Protected, _existing_ancestors


def _plain(real: str) -> list[tuple[str, tuple[int, int]]]:
    out = []
    path = real
    while True:
        try:
            st = os.lstat(path)
            out.append((path, (st.st_dev, st.st_ino)))
        except (OSError, ValueError):
            pass
        parent = os.path.dirname(path)
        if parent == path:
            return out
        path = parent


def _tree(root: Path) -> None:
    (root / "a" / "b" / "c").mkdir(parents=True)
    (root / "f").write_text("x")
    (root / "a" / "link").symlink_to(root / "a" / "b")
    (root / "a" / "dangling").symlink_to("nowhere")
    (root / "a" / "loop").symlink_to("loop")


def test_the_short_cut_finds_the_same_parents_as_the_plain_walk(tmp_path: Path) -> None:
    _tree(tmp_path)
    rng = random.Random(11)
    pool = ["a", "b", "c", "f", "link", "dangling", "loop", "missing", "..", ".", "z" * 200, "ü"]
    for _ in range(3000):
        names = [rng.choice(pool) for _ in range(rng.randint(17, 60))]
        for reading in {
            os.path.normpath(str(tmp_path) + "/" + "/".join(names)),
            os.path.realpath(str(tmp_path) + "/" + "/".join(names)),
        }:
            got = [(p, (st.st_dev, st.st_ino)) for p, st in _existing_ancestors(reading)]
            assert got == _plain(reading), reading


def test_a_protected_folder_is_found_under_a_long_real_path_and_a_long_text_is_cheap(tmp_path: Path) -> None:
    secret = tmp_path / "home" / ".visor"
    deep = secret / "/".join(f"level{i}" for i in range(30))
    deep.mkdir(parents=True)
    alias = tmp_path / "alias"
    alias.symlink_to(tmp_path / "home")
    guard = Protected.of([secret], [], cwd=str(tmp_path))
    assert guard.named_by({"path": str(deep / "file.txt")}) is not None
    assert guard.named_by({"path": str(alias / ".visor" / "level0" / "x")}) is not None
    text = ("notes / on a/b/c and more/words " * 150)[:4096]
    calls = 0
    real_lstat = os.lstat

    def counting(p: str, *a: object, **k: object) -> os.stat_result:
        nonlocal calls
        calls += 1
        return real_lstat(p)

    protected_mod.os.lstat = counting  # type: ignore[assignment]
    try:
        assert guard.named_by({"body": text}) is None
    finally:
        protected_mod.os.lstat = real_lstat
    assert calls < 300, calls  # the plain walk: one lstat per parent of every reading, about 1,600
