"""Which argument strings name Visor's own files (visor/approval/protected.py): pure, no relay."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from visor.approval.protected import Protected


@pytest.fixture
def prot(tmp_path: Path) -> Protected:
    (tmp_path / "approvals").mkdir()
    return Protected.of([tmp_path / "approvals"], [tmp_path / "audit.jsonl"])


@pytest.mark.parametrize(
    "spell",
    [
        "{d}/approvals/abc.answer",
        "{d}/approvals",
        "{d}/x/../approvals/abc.answer",
        "file://{d}/approvals/abc.answer",
        "file://localhost{d}/approvals/abc.answer",
        "FILE:{d}/approvals/abc.answer",
        "{d}/%61pprovals/abc.answer",
        "echo yes > {d}/approvals/abc.answer",
        "--out={d}/approvals/abc.answer",
        "'{d}/approvals/abc.answer'",
        "{d}/audit.jsonl",
        "{d}/audit.jsonl.1",
        "{d}/audit.jsonl.lock",
        "{d}/link/abc.answer",
    ],
)
def test_spellings_of_a_protected_path_are_caught(tmp_path: Path, prot: Protected, spell: str) -> None:
    (tmp_path / "link").symlink_to(tmp_path / "approvals")
    text = spell.format(d=tmp_path)
    assert prot.named_by({"path": text}) == text
    assert prot.named_by({"nested": [{"deep": text}]}) == text
    assert prot.named_by({text: 1}) == text


def test_relative_and_bare_names_from_inside_the_directory(
    tmp_path: Path, prot: Protected, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Relative names are read from the working directory the server was started in.
    monkeypatch.chdir(tmp_path)
    here = Protected.of(prot.dirs, prot.files)
    assert here.named_by({"p": "approvals/abc.answer"})
    assert here.named_by({"p": "./audit.jsonl"})
    monkeypatch.chdir(tmp_path / "approvals")
    inside = Protected.of(prot.dirs, prot.files)
    assert inside.named_by({"p": "abc.answer"})
    # given explicitly, the server's directory is the one read from, wherever Visor is now
    monkeypatch.chdir("/")
    assert Protected.of(prot.dirs, prot.files, cwd=str(tmp_path)).named_by({"p": "approvals/abc.answer"})
    assert not Protected.of(prot.dirs, prot.files).named_by({"p": "approvals/abc.answer"})


def test_the_working_directory_is_the_one_the_server_started_in(
    tmp_path: Path, prot: Protected, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server keeps the directory it was started in: a later change of Visor's own (none is
    # made today) does not move where the server's relative names point.
    monkeypatch.chdir(tmp_path)
    started_here = Protected.of(prot.dirs, prot.files)
    monkeypatch.chdir("/")
    assert started_here.named_by({"p": "approvals/abc.answer"})
    assert started_here.named_by({"p": "audit.jsonl"})


def test_home_relative_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    prot = Protected.of([tmp_path / ".visor" / "approvals"], [])
    assert prot.named_by({"p": "~/.visor/approvals/x.answer"})


@pytest.mark.parametrize(
    "text",
    [
        "hello",
        "{d}/approvalsX/a",
        "{d}/audit.jsonlX",
        "https://example.com/approvals/a",
        "{d}/other",
        "a\x00b",
    ],
)
def test_other_strings_pass(tmp_path: Path, prot: Protected, text: str) -> None:
    assert prot.named_by({"p": text.format(d=tmp_path), "n": 1, "b": True, "z": None}) is None


def test_empty_protects_nothing() -> None:
    assert not Protected()
    assert Protected().named_by({"p": os.getcwd()}) is None


def test_a_protected_directory_renamed_after_start_up_is_still_protected(
    tmp_path: Path, prot: Protected
) -> None:
    # The agent renames a parent (which names nothing protected), then reaches
    # the pending files through the new name.
    (tmp_path / "approvals" / "x.pending").write_text("{}")
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "approvals").rename(home / "approvals")
    moved = home.rename(tmp_path / "elsewhere")
    assert prot.named_by({"p": f"{moved}/approvals/x.pending"})
    assert prot.named_by({"p": f"{moved}/approvals"})
    assert prot.named_by({"p": f"{moved}"}) is None  # its parent is not ours


@pytest.mark.parametrize(
    "spell",
    [
        "{d}/approvals/abc.answer",
        "'{d}/approvals/abc.answer'",
        '"{d}/approvals/abc.answer"',
        "echo yes > '{d}/approvals/abc.answer'",
        "echo yes >{d}/approvals/abc.answer",
        "cp x {e}/approvals/abc.answer",
        "cat {e}/audit.jsonl.1",
        "--out={d}/approvals/abc.answer",
        "--out='{d}/approvals/abc.answer'",
        "sh -c \"cat '{d}/audit.jsonl'\"",
        "'{d}'/approvals/abc.answer",
        "{d}/approvals/abc.answer\n",
    ],
)
def test_a_home_with_spaces_is_caught_however_a_shell_or_an_argument_spells_it(
    tmp_path: Path, spell: str
) -> None:
    # Visor's files under a folder whose name holds spaces ("/Users/Jane Doe"): a quoted or
    # backslash-escaped name, or an `--out=PATH` taken as one argument, keeps the spaces, and is
    # still the protected file. Splitting at white space alone found none of these.
    home = tmp_path / "Jane Doe" / "Ünï côde"
    (home / "approvals").mkdir(parents=True)
    prot = Protected.of([home / "approvals"], [home / "audit.jsonl"])
    text = spell.format(d=home, e=str(home).replace(" ", "\\ "))
    assert prot.named_by({"command": text}) == text


@pytest.mark.parametrize(
    "spell",
    [
        "{d}/approvals/abc.answer",
        '"{d}/approvals/abc.answer"',
        'echo yes > "{d}/audit.jsonl"',
        "cat {e}/audit.jsonl",
        '--out="{d}/approvals/x"',
    ],
)
def test_a_home_with_a_quote_in_its_name_is_caught_in_a_shell_spelling(tmp_path: Path, spell: str) -> None:
    home = tmp_path / "O'Brien"
    (home / "approvals").mkdir(parents=True)
    prot = Protected.of([home / "approvals"], [home / "audit.jsonl"])
    text = spell.format(d=home, e=re.sub(r"([' ])", r"\\\1", str(home)))
    assert prot.named_by({"command": text}) == text


def test_a_text_with_spaces_that_names_another_file_is_not_caught(tmp_path: Path) -> None:
    home = tmp_path / "Jane Doe"
    (home / "approvals").mkdir(parents=True)
    prot = Protected.of([home / "approvals"], [home / "audit.jsonl"])
    for text in (
        f"cat '{home}/notes.txt'",
        f"--out={home}/approvals-old/x",
        f"echo 'unclosed {home}/audit.jsonl-copy",
        "a sentence with a/slash in it",
    ):
        assert prot.named_by({"command": text}) is None, text
