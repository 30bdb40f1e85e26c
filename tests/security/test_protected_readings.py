"""Visor's own files under every reading a server could take (visor/approval/protected.py).

Real directories, symlinks and hardlinks in tmp_path; no model of a file system.
"""

from __future__ import annotations

import os
import subprocess
import unicodedata
from pathlib import Path

import pytest

from visor.approval.protected import Protected


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "approvals").mkdir()
    (tmp_path / "audit.jsonl").write_text('{"event":"start"}\n')
    (tmp_path / "sandbox" / "sub").mkdir(parents=True)
    return tmp_path


@pytest.fixture
def prot(home: Path) -> Protected:
    return Protected.of([home / "approvals"], [home / "audit.jsonl"])


def _upper(p: Path) -> str:
    return str(p).upper()


@pytest.mark.parametrize(
    "spell",
    [
        # case: a protected dir /root/.visor/approvals is named by /ROOT/.Visor/Approvals
        lambda d: _upper(d / "approvals" / "abc.answer"),
        lambda d: f"{d}/Approvals/abc.answer",
        lambda d: f"{d}/AUDIT.JSONL",
        lambda d: f"{d}/Audit.jsonl.1",
        # Windows names: trailing dots and spaces, streams
        lambda d: f"{d}/approvals./abc.answer",
        lambda d: f"{d}/approvals /abc.answer",
        lambda d: f"{d}/audit.jsonl.",
        lambda d: f"{d}/audit.jsonl::$DATA",
        # backslash as separator
        lambda d: f"{d}\\approvals\\abc.answer",
        lambda d: f"{d}/sandbox\\..\\approvals\\abc.answer",
        lambda d: f"{d}/sandbox/sub\\..\\..\\audit.jsonl",
        # percent-encoding, once and twice; file: URIs
        lambda d: f"{d}/%61pprovals/abc.answer",
        lambda d: f"{d}/%2561pprovals/abc.answer",
        lambda d: f"file://{d}/approvals/abc.answer",
        lambda d: f"FILE://localhost{d}/Approvals/abc.answer",
        lambda d: f"file://{d}/sandbox/x#/../../approvals/abc.answer",
        lambda d: f"file://evil.example{d}/approvals/abc.answer",
        # a C server stops at the NUL
        lambda d: f"{d}/audit.jsonl\x00.txt",
        # in a longer string
        lambda d: f"echo yes > {_upper(d / 'approvals')}/abc.answer",
        lambda d: f"--log={d}\\audit.jsonl",
    ],
)
def test_every_spelling_names_the_protected_file(home: Path, prot: Protected, spell) -> None:  # type: ignore[no-untyped-def]
    text = spell(home)
    assert prot.named_by({"path": text}) == text
    assert prot.named_by({"a": [{"b": text}]}) == text


def test_nfd_and_nfc_spellings_of_a_protected_directory(tmp_path: Path) -> None:
    nfc = unicodedata.normalize("NFC", "genehmigungen-für-visor")
    (tmp_path / nfc).mkdir()
    prot = Protected.of([tmp_path / nfc], [])
    nfd = unicodedata.normalize("NFD", nfc)
    assert nfd != nfc
    assert prot.named_by({"p": f"{tmp_path}/{nfd}/x.answer"})
    assert prot.named_by({"p": f"{tmp_path}/{nfc.upper()}/x.answer"})
    # and the other way round: protected under its NFD name
    (tmp_path / "d").mkdir()
    prot2 = Protected.of([tmp_path / "d" / nfd], [])
    assert prot2.named_by({"p": f"{tmp_path}/d/{nfc}/x"})


def test_symlink_to_the_directory_and_to_the_file(home: Path, prot: Protected) -> None:
    (home / "sandbox" / "a").symlink_to(home / "approvals")
    (home / "sandbox" / "log").symlink_to(home / "audit.jsonl")
    assert prot.named_by({"p": f"{home}/sandbox/a/abc.answer"})
    assert prot.named_by({"p": f"{home}/sandbox/log"})


def test_kernel_reading_symlink_then_dotdot(home: Path, prot: Protected) -> None:
    deep = home / "sandbox" / "sub" / "deep"
    deep.mkdir()
    (home / "sandbox" / "j").symlink_to(deep)
    for name in ("approvals/abc.answer", "audit.jsonl"):
        text = f"{home}/sandbox/j/../../../{name}"
        # lexically <parent of home>/NAME, not ours; the kernel follows j first:
        # <home>/sandbox/sub/deep/../../../NAME = <home>/NAME, ours.
        assert os.path.normpath(text) == f"{home.parent}/{name}"
        assert os.path.realpath(text) == f"{home}/{name}"
        assert prot.named_by({"p": text}) == text


def test_lexical_then_resolved_reading(home: Path, prot: Protected, tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    # Node's filesystem server normalises ".." first, then resolves symlinks.
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "deep"
    elsewhere.mkdir()
    (home / "sandbox" / "L").symlink_to(elsewhere)
    (home / "sandbox" / "a").symlink_to(home / "approvals")
    text = f"{home}/sandbox/L/../a/abc.answer"
    # the kernel: <elsewhere>/a/abc.answer (not ours); lexically then resolved: ours
    assert os.path.realpath(text) == f"{elsewhere.parent}/a/abc.answer"
    assert os.path.realpath(os.path.normpath(text)) == f"{home}/approvals/abc.answer"
    assert prot.named_by({"p": text}) == text


def test_a_hardlink_to_the_audit_log_is_the_audit_log(home: Path, prot: Protected) -> None:
    link = home / "sandbox" / "innocent.txt"
    os.link(home / "audit.jsonl", link)
    assert link.stat().st_ino == (home / "audit.jsonl").stat().st_ino
    assert prot.named_by({"path": str(link)}) == str(link)
    assert prot.named_by({"path": f"{home}/sandbox/sub/../innocent.txt"})


def test_a_hardlink_to_a_protected_file_replaced_after_start_up(home: Path, prot: Protected) -> None:
    # The pin file or policy may be rewritten (write to a temporary, rename):
    # the new file is checked by its identity now, not the one at start-up.
    (home / "new").write_text("{}")
    os.replace(home / "new", home / "audit.jsonl")
    os.link(home / "audit.jsonl", home / "sandbox" / "again.txt")
    assert prot.named_by({"path": f"{home}/sandbox/again.txt"})


def test_a_bind_mount_of_the_approval_directory(home: Path, prot: Protected) -> None:
    target = home / "sandbox" / "mnt"
    target.mkdir()
    r = subprocess.run(
        ["mount", "--bind", str(home / "approvals"), str(target)], capture_output=True, check=False
    )
    if r.returncode != 0:
        pytest.skip(f"bind mounts are not permitted here: {r.stderr.decode(errors='replace').strip()}")
    try:
        assert prot.named_by({"p": f"{target}/abc.answer"})
    finally:
        subprocess.run(["umount", str(target)], check=False)


@pytest.mark.parametrize(
    "spell",
    [
        "{d}/sandbox/x.txt",
        "{d}/sandbox\\notes.txt",
        "{d}/approvalsX/a",
        "{d}/audit.jsonlX",
        "{d}/sandbox/sub/../x.txt",
        "hello world",
        "https://example.com/approvals/a",
    ],
)
def test_other_paths_pass(home: Path, prot: Protected, spell: str) -> None:
    (home / "sandbox" / "x.txt").write_text("not a link")
    assert prot.named_by({"p": spell.format(d=home)}) is None
