"""`visor audit verify` on rotated logs written by a real `visor run`: every missing,
emptied, cut or misplaced file fails, naming it, with a non-zero exit.

Rotated files are numbered in the order they were written and the newest is
always followed by the live file, so deleting the live file, a file in the
middle, or the end of any file is records deleted, never something to skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import RECORDER, VisorProcess


def _call(i: int) -> dict:
    return {
        "jsonrpc": "2.0",
        "id": i,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"i": i}},
    }


@pytest.fixture(scope="module")
def rotated_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A VISOR_HOME whose default log for server `rec` has rotated several times."""
    home = tmp_path_factory.mktemp("rotated") / "home"
    vp = VisorProcess(
        [sys.executable, str(RECORDER)],
        visor_args=["--server-name", "rec", "--audit-max-bytes", "2048"],
        env={"VISOR_HOME": str(home)},
    )
    try:
        vp.request({"jsonrpc": "2.0", "id": 0, "method": "tools/list"})
        assert "tools" in vp.recv()["result"]
        for i in range(1, 25):
            vp.request(_call(i))
            assert vp.recv()["id"] == i
    finally:
        vp.kill()
    assert vp.proc.returncode == 0
    names = sorted(p.name for p in (home / "audit").iterdir() if not p.name.endswith(".lock"))
    assert {"rec.jsonl", "rec.jsonl.1", "rec.jsonl.2", "rec.jsonl.3", "rec.jsonl.4"} <= set(names), names
    return home


@pytest.fixture
def home(rotated_home: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "home"
    shutil.copytree(rotated_home, copy)
    return copy


def verify(home: Path, *files: Path) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "visor.cli", "audit", "verify", *map(str, files)],
        capture_output=True,
        timeout=60,
        env={**os.environ, "VISOR_HOME": str(home)},
    )
    return proc.returncode, (proc.stdout + proc.stderr).decode()


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_the_intact_rotated_log_verifies_by_path_and_by_default(home: Path) -> None:
    live = home / "audit" / "rec.jsonl"
    for args in ((live,), ()):
        rc, out = verify(home, *args)
        assert rc == 0 and out.startswith("OK "), out
        assert "rec.jsonl.1, rec.jsonl.2" in out


def test_deleting_the_live_file_fails_naming_it(home: Path) -> None:
    live = home / "audit" / "rec.jsonl"
    live.unlink()
    newest = sorted((home / "audit").glob("rec.jsonl.*[0-9]"), key=lambda p: int(p.suffix[1:]))[-1]
    for args in ((live,), ()):  # named, and found by default from its rotated files
        rc, out = verify(home, *args)
        assert rc == 1, out
        assert f"FAIL {live}: missing" in out and newest.name in out


def test_emptying_the_live_file_fails_naming_it(home: Path) -> None:
    live = home / "audit" / "rec.jsonl"
    live.write_bytes(b"")
    rc, out = verify(home, live)
    assert rc == 1 and f"FAIL {live}: empty" in out, out


def test_deleting_a_rotated_file_in_the_middle_fails_naming_it(home: Path) -> None:
    (home / "audit" / "rec.jsonl.2").unlink()
    rc, out = verify(home, home / "audit" / "rec.jsonl")
    assert rc == 1 and f"FAIL {home / 'audit' / 'rec.jsonl.2'}: missing" in out, out


def test_deleting_the_newest_rotated_file_fails_at_the_file_that_continued_it(home: Path) -> None:
    audit = home / "audit"
    rotated = sorted(audit.glob("rec.jsonl.*[0-9]"), key=lambda p: int(p.suffix[1:]))
    rotated[-1].unlink()
    rc, out = verify(home, audit / "rec.jsonl")
    assert rc == 1 and f"FAIL {audit / 'rec.jsonl'}:1: does not continue {rotated[-2].name}" in out, out


def test_emptying_a_rotated_file_fails_naming_it(home: Path) -> None:
    target = home / "audit" / "rec.jsonl.3"
    target.write_bytes(b"")
    rc, out = verify(home, home / "audit" / "rec.jsonl")
    assert rc == 1 and f"FAIL {target}: empty" in out, out


def test_cutting_whole_lines_from_a_rotated_file_fails_at_its_successor(home: Path) -> None:
    audit = home / "audit"
    target = audit / "rec.jsonl.2"
    target.write_bytes(b"".join(_lines(target)[:-2]))
    rc, out = verify(home, audit / "rec.jsonl")
    assert rc == 1, out
    assert f"FAIL {audit / 'rec.jsonl.3'}:1: does not continue rec.jsonl.2" in out
    assert "2 record(s) deleted" in out


def test_cutting_a_rotated_file_mid_line_fails_naming_it(home: Path) -> None:
    target = home / "audit" / "rec.jsonl.2"
    data = target.read_bytes()
    target.write_bytes(data[: len(data) - 40])
    rc, out = verify(home, home / "audit" / "rec.jsonl")
    n = len(_lines(target))
    assert rc == 1 and f"FAIL {target}:{n}: truncated" in out, out


def test_swapping_two_rotated_files_fails_naming_the_first_out_of_place(home: Path) -> None:
    audit = home / "audit"
    one, two = audit / "rec.jsonl.1", audit / "rec.jsonl.2"
    tmp = audit / "swap"
    one.rename(tmp)
    two.rename(one)
    tmp.rename(two)
    rc, out = verify(home, audit / "rec.jsonl")
    assert rc == 1 and f"FAIL {one}:1:" in out, out


def test_renaming_a_rotated_file_out_of_the_numbering_fails(home: Path) -> None:
    audit = home / "audit"
    (audit / "rec.jsonl.3").rename(audit / "rec.jsonl.9")
    rc, out = verify(home, audit / "rec.jsonl")
    assert rc == 1 and f"FAIL {audit / 'rec.jsonl.3'}: missing" in out, out


def test_removing_the_oldest_files_on_purpose_still_verifies_and_says_so(home: Path) -> None:
    audit = home / "audit"
    (audit / "rec.jsonl.1").unlink()
    (audit / "rec.jsonl.2").unlink()
    rc, out = verify(home, audit / "rec.jsonl")
    assert rc == 0 and "earlier rotated files are not present" in out, out
