"""Approval on the controlling terminal, /dev/tty: never stdin or stdout, which carry the protocol.

The prompt runs in a worker thread (reading a terminal blocks), one prompt
at a time; the thread polls its terminal with select so that a wait that
ends elsewhere (an answer on another channel, a cancel, the timeout)
withdraws the prompt instead of leaving a stale question on screen.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import select
import termios
import threading

from visor.approval import model
from visor.approval.model import ApprovalAnswer, ApprovalRequest

TTY_PATH = "/dev/tty"


class TtyError(Exception):
    pass


def probe(path: str = TTY_PATH) -> None:
    """Refuse --approval-tty at start when there is no terminal to ask on."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
    except OSError as exc:
        raise TtyError(
            f"--approval-tty: cannot open {path} ({exc.strerror or exc}); "
            "Visor has no controlling terminal (an MCP client started it?). Use --approval-dir instead"
        ) from exc
    os.close(fd)


def _who(fd: int) -> str:
    uid = os.fstat(fd).st_uid  # a terminal belongs to the user logged in on it
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid}, {os.ttyname(fd)})"
    except (KeyError, OSError):
        return f"uid {uid}"


def _prompt(req: ApprovalRequest, stop: threading.Event, path: str) -> ApprovalAnswer | None:
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return None
    try:
        rememberable = req.scope is not None
        choices = "[y]es / [r]emember for this session / [N]o" if rememberable else "[y]es / [N]o"
        # Input typed before this prompt is shown is not an answer to it.
        with contextlib.suppress(OSError):
            termios.tcflush(fd, termios.TCIFLUSH)
        # Every value in the text is escaped (visor/display.py): an argument
        # cannot clear this screen or paint a prompt of its own.
        text = model.describe(req, more="type s at the prompt to show every argument in full")
        prompt = f"Approve? {choices} (s: show every argument): "
        os.write(fd, f"\n{text}\n{prompt}".encode(errors="replace"))
        buf = b""
        while not stop.is_set():
            ready, _, _ = select.select([fd], [], [], 0.1)
            if not ready:
                continue
            chunk = os.read(fd, 1024)
            if not chunk:
                return None
            buf += chunk
            if b"\n" in buf or len(buf) > 256:
                line = buf.split(b"\n", 1)[0].decode(errors="replace")
                buf = b""
                if line.strip().lower() in ("s", "show"):
                    lines, _ = model.render_arguments(req.arguments, req.focus, full=True)
                    shown = "\n".join(["Every argument, in full:", *(lines or ["  (none)"])])
                    os.write(fd, f"{shown}\n{prompt}".encode(errors="replace"))
                    continue
                approved, remember = model.parse_tty_line(line, rememberable)
                os.write(fd, b"approved\n" if approved else b"denied\n")
                return ApprovalAnswer(approved, remember, "tty", _who(fd), None)
        os.write(fd, b"\n(withdrawn: answered elsewhere, cancelled or timed out)\n")
        return None
    except OSError:
        return None
    finally:
        os.close(fd)


class TtyChannel:
    name = "tty"

    def __init__(self, path: str = TTY_PATH) -> None:
        self.path = path
        # One prompt at a time: two questions interleaved on one screen
        # would make "y" ambiguous.
        self._lock = asyncio.Lock()

    async def ask(self, req: ApprovalRequest) -> ApprovalAnswer | None:
        async with self._lock:
            stop = threading.Event()
            loop = asyncio.get_running_loop()
            fut = loop.run_in_executor(None, _prompt, req, stop, self.path)
            try:
                return await asyncio.shield(fut)
            finally:
                # Cancelled or not, the thread stops within one select timeout.
                stop.set()
                with contextlib.suppress(Exception):
                    await asyncio.shield(fut)
