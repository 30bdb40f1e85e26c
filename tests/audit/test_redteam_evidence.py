"""Red team, evidence and what humans read: through the real `visor` commands.

Whoever can write a log (the one `visor audit verify` exists to catch) also
chooses what verify and repair quote from it. Those lines go to a terminal, so
they must not carry the bytes that would let the forger repaint a FAIL as OK.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from visor.audit import record as rec
from visor.audit.report import build_report
from visor.audit.writer import AuditWriter
from visor.display import has_unsafe

# Erase the line, go back to its start, print a pass, and hide what follows.
FAKE_PASS = (
    "\x1b[2K\rOK 3 records, seq 0..2, 1 session(s), 1 file(s) [fs.jsonl], head " + "ab" * 32 + "\x1b[8m"
)


def _visor(*argv: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VISOR_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "visor.cli", *argv], capture_output=True, text=True, env=env, timeout=60
    )


def _forged(path: Path, rotated_from: str) -> None:
    """A chain with recomputed hashes whose first record claims to continue `rotated_from`."""
    prev, out = "cd" * 32, []
    events = [
        {"event": "audit_open", "file": path.name, "rotated_from": rotated_from},
        {"event": "session_end"},
    ]
    for seq, event in enumerate(events, start=5):
        enc = rec.build(event, session="s", seq=seq, prev=prev)
        prev = enc.record["hash"]
        out.append(enc.line)
    path.write_bytes(b"".join(out))


def test_verify_and_repair_never_print_a_forged_logs_escape_sequences(tmp_path: Path) -> None:
    log = tmp_path / "fs.jsonl"
    _forged(log, FAKE_PASS)
    verify = _visor("audit", "verify", str(log), home=tmp_path)
    assert verify.returncode == 1
    assert verify.stdout.startswith("FAIL ") and "\\x1b[2K\\rOK 3 records" in verify.stdout
    assert not has_unsafe(verify.stdout.replace("\n", ""))
    repair = _visor("audit", "repair", str(log), home=tmp_path)
    assert repair.returncode == 1 and "without --force" in repair.stderr
    assert not has_unsafe(repair.stderr.replace("\n", ""))


def test_verify_never_prints_a_planted_file_name_raw(tmp_path: Path) -> None:
    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / "x\x1b[2K\rOK.jsonl").write_bytes(b"not a record\n")
    (audit / "y\u202e.jsonl.1").write_bytes(b"")
    verify = _visor("audit", "verify", home=tmp_path)
    assert verify.returncode == 1 and verify.stdout.count("FAIL ") == 2
    assert not has_unsafe(verify.stdout.replace("\n", ""))


# A character reference is decoded by every CommonMark renderer unless its & is escaped.
_REFERENCE = re.compile(r"(?<!\\)&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")


def test_the_review_pack_renders_a_tool_name_as_the_characters_the_log_holds(tmp_path: Path) -> None:
    # Each is a denied call's tool name, chosen by the model: rendered, the first shows as
    # read_file behind a right-to-left override, the second struck through, the third a tag.
    names = ["&#x202E;elif_daer", "~~send_email~~", "&lt;img src=x&gt;", "&ZeroWidthSpace;rm"]
    log = tmp_path / "mail.jsonl"
    writer = AuditWriter.open(log, session="s")
    for i, name in enumerate(names):
        writer.append({"event": "deny", "server": "mail", "tool": name, "id": i, "rule": "pin.unknown_tool"})
    writer.close_sync()
    pack = build_report([log])
    assert "elif" in pack and "send" in pack
    assert _REFERENCE.search(pack) is None, _REFERENCE.search(pack)
    assert re.search(r"(?<!\\)~(?<!\\)~", pack) is None
