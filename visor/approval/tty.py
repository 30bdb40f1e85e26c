"""Approval on the controlling terminal, /dev/tty: never stdin or stdout, which carry the protocol.

The prompt runs in a worker thread (reading a terminal blocks), one prompt
at a time; the thread polls its terminal with select so that a wait that
ends elsewhere (an answer on another channel, a cancel, the timeout)
withdraws the prompt instead of leaving a stale question on screen.

Keys pressed in the first `settle_seconds` after a question is drawn are no answer to it: a
client that cancels the question on screen and sends another as the human presses "y" would
otherwise have that "y" approve a call the human never read. They are ignored, and the human is
told to answer again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import select
import stat
import termios
import threading
import time

from visor.approval import model
from visor.approval.model import ApprovalAnswer, ApprovalRequest

TTY_PATH = "/dev/tty"
#: How long after a question is drawn keys are taken for typed before it could be read
#: (`VISOR_TTY_SETTLE_SECONDS` changes it).
SETTLE_SECONDS = 0.5


def settle_seconds() -> float:
    raw = os.environ.get("VISOR_TTY_SETTLE_SECONDS")
    if not raw:
        return SETTLE_SECONDS
    try:
        value = float(raw)
    except ValueError:
        return SETTLE_SECONDS
    return value if 0 <= value <= 60 else SETTLE_SECONDS


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


# /dev/tty itself: a character device of its own (5, 0), owned by root whoever opens it.
_TTY_ALIAS = os.makedev(5, 0)


def _controlling_terminal() -> tuple[str, os.stat_result] | None:
    """The device behind this process's /dev/tty (Linux: /proc/self/stat's tty_nr), or None."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read()
        # the command name (field 2) is in parentheses and may hold anything: read after its end
        tty_nr = int(fields[fields.rindex(b")") + 2 :].split()[4])
    except (OSError, ValueError, IndexError):
        return None
    if tty_nr == 0:
        return None
    device = os.makedev((tty_nr >> 8) & 0xFFF, (tty_nr & 0xFF) | ((tty_nr >> 12) & 0xFFF00))
    for folder in ("/dev/pts", "/dev"):
        with contextlib.suppress(OSError):
            for entry in os.scandir(folder):
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    if st.st_rdev == device and stat.S_ISCHR(st.st_mode):
                        return entry.path, st
    return None


def _who(fd: int) -> str:
    """Who answered: the user a terminal belongs to (the one logged in on it)."""
    st = os.fstat(fd)
    name: str | None = None
    if st.st_rdev == _TTY_ALIAS:
        # Opened as /dev/tty: its own owner is root, not the terminal's user.
        found = _controlling_terminal()
        if found is None:
            uid = os.getuid()
            return f"the controlling terminal of uid {uid} (its owner could not be read)"
        name, st = found
    else:
        with contextlib.suppress(OSError):
            name = os.ttyname(fd)
    uid = st.st_uid
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}, {name}" if name else f"uid {uid}"
    return f"{user} (uid {uid}, {name})" if name else f"{user} (uid {uid})"


def _prompt(req: ApprovalRequest, stop: threading.Event, path: str, settle: float) -> ApprovalAnswer | None:
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
        drawn = time.monotonic()
        buf = b""
        told = False
        while not stop.is_set():
            ready, _, _ = select.select([fd], [], [], 0.1)
            if not ready:
                continue
            chunk = os.read(fd, 1024)
            if not chunk:
                return None
            if time.monotonic() - drawn < settle:
                # Typed before this question could be read: meant for another, or for none.
                if not told:
                    told = True
                    os.write(fd, f"\n(ignored: typed before this question could be read)\n{prompt}".encode())
                continue
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
        self.settle = settle_seconds()
        # One prompt at a time: two questions interleaved on one screen
        # would make "y" ambiguous.
        self._lock = asyncio.Lock()

    async def ask(self, req: ApprovalRequest) -> ApprovalAnswer | None:
        async with self._lock:
            stop = threading.Event()
            loop = asyncio.get_running_loop()
            fut = loop.run_in_executor(None, _prompt, req, stop, self.path, self.settle)
            try:
                return await asyncio.shield(fut)
            finally:
                # Cancelled or not, the thread stops within one select timeout.
                stop.set()
                with contextlib.suppress(Exception):
                    await asyncio.shield(fut)
