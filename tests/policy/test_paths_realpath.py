"""The path readings' realpath short cut gives realpath's own string, on a real tree of links.

`visor.policy.paths._realpath` stops looking names up at the first one that does not exist (a
long text with slashes in it is read as a path by every path check, and realpath's one lstat per
slash made that cost milliseconds). The cut is only sound while nothing below a missing name can
be looked up again: these tests hold it to `os.path.realpath` on thousands of long paths built
from a real directory with absolute, relative, dangling, looping and climbing symlinks, files
used as directories, '.', empty names, '..' and names near PATH_MAX.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from visor.policy import paths

POOL = [
    "d1", "d2", "f", "abs", "rel", "dangling", "loop", "file_link", "up", "deep", "missing",
    "x y", ".", "", "..", "ünï", "d1", "d2", "rel", "abs",
]  # fmt: skip


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "d1" / "d2" / "d1").mkdir(parents=True)
    (root / "d2").mkdir()
    (root / "f").write_text("file")
    (root / "d1" / "f").write_text("file")
    for base in (root, root / "d1", root / "d1" / "d2"):
        (base / "abs").symlink_to(root / "d1")
        (base / "rel").symlink_to("d1" if base == root else ".")
        (base / "dangling").symlink_to("nowhere/at/all")
        (base / "loop").symlink_to("loop2")
        (base / "loop2").symlink_to("loop")
        (base / "file_link").symlink_to(root / "f")
        (base / "up").symlink_to("..")
        (base / "deep").symlink_to(root / "d1" / "d2")
    return root


def _same(path: str) -> None:
    assert paths._realpath(path) == os.path.realpath(path), path


def test_long_paths_read_as_realpath_reads_them(tree: Path) -> None:
    rng = random.Random(20261202)
    for _ in range(4000):
        names = [rng.choice(POOL) for _ in range(rng.randint(17, 45))]
        _same(str(tree) + "/" + "/".join(names))


def test_paths_without_climbing_and_with_a_missing_name_take_the_cut_and_agree(tree: Path) -> None:
    rng = random.Random(7)
    pool = [n for n in POOL if n != ".."]
    for _ in range(3000):
        names = [rng.choice(pool) for _ in range(rng.randint(17, 60))]
        names.insert(rng.randint(0, len(names)), "missing")
        _same(str(tree) + "/" + "/".join(names))


def test_names_near_path_max_agree(tree: Path) -> None:
    rng = random.Random(3)
    for _ in range(300):
        names = [
            rng.choice(["d1", "rel", "abs", "deep", "missing", "z" * rng.randint(1, 250)]) for _ in range(40)
        ]
        _same(str(tree) + "/" + "/".join(names))


def test_a_long_text_is_cheap_and_reads_the_same() -> None:
    text = ("see https://example.com/a/b or /etc/passwd and some/relative/words, " * 60)[:4096]
    joined = os.path.join(os.getcwd(), text)
    assert paths._realpath(joined) == os.path.realpath(joined)
    # The cut is taken: a handful of lookups, not one per slash. Counted, not timed.
    calls = 0
    real_lstat = os.lstat

    def counting(p: str, *a: object, **k: object) -> os.stat_result:
        nonlocal calls
        calls += 1
        return real_lstat(p)

    os.lstat = counting  # type: ignore[assignment]
    try:
        paths._realpath(joined)
    finally:
        os.lstat = real_lstat
    assert calls < 20 + os.getcwd().count("/") * 2, calls
    assert joined.count("/") > 200
