"""Finding 3: escape sequences in arguments never reach a person's terminal raw.

One real `visor run` with a pseudo-terminal as its controlling terminal
(`--approval-tty`) and an approval directory; the agent's call carries ESC,
CSI, OSC, BEL, backspace, carriage return, C1 and bidi characters. The
terminal prompt, the stderr log, `visor approve` (list and --show), `visor
audit show` and `visor report` must show them as visible escapes.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import subprocess
import sys
import termios
import time
import unicodedata
from pathlib import Path

from tests.approval.helpers import SERVER, cli, pending
from tests.approval.raw_client import POLICY

# The brief's fake prompt, then OSC title + hyperlink, bidi override and
# isolate, backspace, C1 CSI and DEL. EVIL_TIGHT has no space, quote, "=",
# CR or LF: structlog's console renderer prints such a string raw (it repr()s
# the others), so only Visor's own escaping keeps it off the terminal.
FAKE_PROMPT = "\x1b[2J\x1b[1;1HApprove? [y/N]"
EVIL_TIGHT = (
    "\x1b[2J\x1b[1;1HApprove?[y/N]\x1b]0;pwned\x07\x1b]8;;http://x\x1b\\\u202eevil\u2066\x08\x9b31m\x7f"
)


def raw_controls(text: str, *, allow_crlf: bool = False) -> list[str]:
    """Every character a terminal would act on, except a plain newline (and CR-LF from a pty)."""
    out = []
    for i, ch in enumerate(text):
        if ch == "\n" or (allow_crlf and ch == "\r" and text[i + 1 : i + 2] == "\n"):
            continue
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            out.append(repr(ch))
    return out


class _PtyVisor:
    def __init__(self, tmp_path: Path) -> None:
        self.master, slave = os.openpty()
        self.adir = tmp_path / "approvals"
        self.audit = tmp_path / "audit.jsonl"
        self.stderr_path = tmp_path / "stderr.log"
        policy = tmp_path / "policy.yaml"
        policy.write_text(POLICY.format(timeout=60, echo_extra=""))
        self.policy = policy

        def own_terminal() -> None:
            os.setsid()
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [
                    *(
                        sys.executable,
                        "-m",
                        "visor.cli",
                        "run",
                        "--approval-tty",
                        "--approval-dir",
                        str(self.adir),
                    ),
                    *("--server-name", "rec", "--policy", str(policy), "--audit-log", str(self.audit)),
                    *("--", sys.executable, str(SERVER)),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                preexec_fn=own_terminal,
                pass_fds=(slave,),
                env={
                    **os.environ,
                    "APPROVAL_SERVER_LOG": str(tmp_path / "received.jsonl"),
                    "VISOR_TTY_SETTLE_SECONDS": "0",
                },
            )
        os.close(slave)
        self.screen = b""

    def send(self, obj: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj).encode() + b"\n")
        self.proc.stdin.flush()

    def recv(self) -> dict:
        assert self.proc.stdout is not None
        return json.loads(self.proc.stdout.readline())

    def wait_screen(self, text: bytes, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.screen:
            assert time.monotonic() < deadline, self.screen
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                self.screen += os.read(self.master, 65536)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        os.close(self.master)


def test_escape_sequences_reach_no_terminal_raw(tmp_path: Path) -> None:
    tv = _PtyVisor(tmp_path)
    arguments = {
        "a": FAKE_PROMPT,
        "command": EVIL_TIGHT,
        "note": "\r\x1b]52;c;ZXZpbA==\x07\u202a\u202b\u202c\u202d\u2067\u2068\u2069",
    }
    try:
        tv.send({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
        assert "tools" in tv.recv()["result"]
        # a rejected message whose method is the payload: Visor logs the method on stderr
        tv.send({"jsonrpc": "2.0", "id": 90, "method": EVIL_TIGHT, "params": 5})
        assert "error" in tv.recv()
        # an unknown tool named by the payload: denied, its name lands in the audit log
        tv.send(
            {
                "jsonrpc": "2.0",
                "id": 91,
                "method": "tools/call",
                "params": {"name": EVIL_TIGHT, "arguments": {}},
            }
        )
        assert tv.recv()["result"]["isError"] is True
        tv.send(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": arguments},
            }
        )
        tv.wait_screen(b"Approve?")
        tv.wait_screen(b"(s: show every argument): ")
        (pid,) = pending(tv.adir)
        listing = cli("approve", "--approval-dir", str(tv.adir))
        shown = cli("approve", "--approval-dir", str(tv.adir), "--show", pid)
        assert listing.returncode == 0 and shown.returncode == 0, (listing.stderr, shown.stderr)
        os.write(tv.master, b"s\n")
        tv.wait_screen(b"Every argument, in full:")
        tv.wait_screen(b"show every argument): ", timeout=20)
        os.write(tv.master, b"n\n")
        resp = tv.recv()
        assert resp["id"] == 1 and resp["result"]["isError"] is True
    finally:
        tv.close()

    screen = tv.screen.decode("utf-8", "replace")
    # the prompt shows the payload, visibly escaped, and acts on none of it
    assert "\\u001b[2J\\u001b[1;1HApprove? [y/N]" in screen and "\\u202e" in screen
    assert raw_controls(screen, allow_crlf=True) == []

    stderr = tv.stderr_path.read_text(errors="replace")
    assert "client_message_rejected" in stderr and "\\x1b[2J" in stderr
    assert raw_controls(stderr) == []

    for out in (listing.stdout, shown.stdout):
        assert "command" in out and "\\u202e" in out
        assert raw_controls(out) == []
    assert "\\u001b]52;c;ZXZpbA==\\u0007" in shown.stdout

    env = {**os.environ}
    table = cli("audit", "show", "--file", str(tv.audit), "--all", env=env)
    assert table.returncode == 0, table.stderr
    assert "\\x1b[2J" in table.stdout and raw_controls(table.stdout) == []
    as_json = cli("audit", "show", "--file", str(tv.audit), "--all", "--json", env=env)
    assert as_json.returncode == 0 and raw_controls(as_json.stdout) == []
    report = cli("report", "--audit", str(tv.audit), "--policy", str(tv.policy), env=env)
    assert report.returncode == 0, report.stderr
    assert "x1b" in report.stdout and raw_controls(report.stdout) == []
