"""Approval on /dev/tty: a real pseudo-terminal as Visor's controlling terminal, real pipes for the wire."""

from __future__ import annotations

import fcntl
import json
import os
import select
import subprocess
import sys
import termios
import time
from pathlib import Path

from tests.approval.helpers import SERVER, records, write_policy


class _TtyVisor:
    def __init__(self, tmp_path: Path, timeout: int = 60, settle: str = "0") -> None:
        self.master, slave = os.openpty()
        self.terminal = os.ttyname(slave)
        # The terminal's user, as the record must name them: as root, another user's terminal (a
        # /dev/tty opened by root is root's own device whoever sits at the terminal).
        self.terminal_uid = os.geteuid()
        if self.terminal_uid == 0:
            self.terminal_uid = 65534
            os.chown(self.terminal, self.terminal_uid, -1)
        self.log = tmp_path / "received.jsonl"
        self.audit = tmp_path / "audit.jsonl"
        policy = write_policy(tmp_path, timeout)

        def own_terminal() -> None:
            os.setsid()
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "visor.cli", "run", "--approval-tty", "--server-name", "rec"),
                *("--policy", str(policy), "--audit-log", str(self.audit), "--", sys.executable, str(SERVER)),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            preexec_fn=own_terminal,
            # keep one slave fd open in Visor: between prompts the master would read EIO
            pass_fds=(slave,),
            # (no settle time unless a test asks: these tests answer as soon as the question shows)
            env={**os.environ, "APPROVAL_SERVER_LOG": str(self.log), "VISOR_TTY_SETTLE_SECONDS": settle},
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
                self.screen += os.read(self.master, 4096)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        os.close(self.master)


def _call(tv: _TtyVisor, msg_id: int, to: str) -> None:
    if msg_id == 1:
        tv.send({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
        tv.recv()
    params = {"name": "send_email", "arguments": {"to": to}}
    tv.send({"jsonrpc": "2.0", "id": msg_id, "method": "tools/call", "params": params})


def test_a_yes_on_the_terminal_approves_and_stdin_cannot(tmp_path: Path) -> None:
    tv = _TtyVisor(tmp_path)
    try:
        _call(tv, 1, "new@example.org")
        tv.wait_screen(b"Approve?")
        assert b"new@example.org" in tv.screen
        # the agent's side typing "y" on the wire is only a protocol error
        assert tv.proc.stdin is not None
        tv.proc.stdin.write(b"y\n")
        tv.proc.stdin.flush()
        assert tv.recv()["error"]["code"] == -32700
        os.write(tv.master, b"y\n")
        resp = tv.recv()
        assert resp["id"] == 1 and resp["result"]["isError"] is False
    finally:
        tv.close()
    approve = next(r for r in records(tv.audit) if r["event"] == "approve")
    assert approve["channel"] == "tty"
    assert f"uid {tv.terminal_uid}, {tv.terminal}" in approve["who"], approve["who"]
    assert [r["event"] for r in records(tv.audit) if r.get("id") == 1 and r["event"] != "result"] == [
        "ask",
        "approve",
        "allow",
    ]


def test_anything_but_yes_on_the_terminal_denies(tmp_path: Path) -> None:
    tv = _TtyVisor(tmp_path)
    try:
        _call(tv, 1, "new@example.org")
        tv.wait_screen(b"Approve?")
        os.write(tv.master, b"\n")
        resp = tv.recv()
        assert resp["result"]["isError"] is True and "declined" in resp["result"]["content"][0]["text"]
        assert not any(b"tools/call" in x for x in tv.log.read_bytes().splitlines())
    finally:
        tv.close()


def test_a_timed_out_prompt_is_withdrawn(tmp_path: Path) -> None:
    tv = _TtyVisor(tmp_path, timeout=1)
    try:
        _call(tv, 1, "new@example.org")
        resp = tv.recv()
        assert "approval.timeout" in resp["result"]["content"][0]["text"]
        tv.wait_screen(b"withdrawn")
    finally:
        tv.close()


def test_approval_tty_without_a_terminal_refuses_to_start(tmp_path: Path) -> None:
    policy = write_policy(tmp_path)
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "visor.cli", "run", "--approval-tty", "--policy", str(policy)),
            *("--audit-log", str(tmp_path / "a.jsonl"), "--", sys.executable, str(SERVER)),
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
        start_new_session=True,  # no controlling terminal
    )
    assert proc.returncode == 1 and "/dev/tty" in proc.stderr


def test_keys_pressed_as_a_question_is_drawn_are_no_answer_to_it(tmp_path: Path) -> None:
    # A client that cancels the question on screen and sends another as the human presses "y"
    # would have that "y" approve a call the human never read: keys pressed before a question
    # could be read are ignored (here the settle time is long, so the keys surely come within it).
    tv = _TtyVisor(tmp_path, settle="30")
    try:
        _call(tv, 1, "new@example.org")
        tv.wait_screen(b"Approve?")
        os.write(tv.master, b"y\n")
        tv.wait_screen(b"(ignored: typed before this question could be read)")
        time.sleep(0.5)
        assert not tv.log.exists() or not any(b"tools/call" in x for x in tv.log.read_bytes().splitlines())
        assert not [r for r in records(tv.audit) if r["event"] in ("approve", "allow") and r.get("id") == 1]
    finally:
        tv.close()
