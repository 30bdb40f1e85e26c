"""The server child process: spawn from argv (no shell), and stop it.

The child gets its own pipes for stdin and stdout, Visor's stderr as its
stderr, and Visor's environment and working directory. It runs in its own
session so that a terminal's Ctrl-C reaches Visor, which then shuts the
server down in order; on Linux the kernel also kills it if Visor dies
without that chance.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
from dataclasses import dataclass

from visor.logs import get_logger

log = get_logger("visor.upstream")

_PR_SET_PDEATHSIG = 1


def _parent_death_signal() -> None:
    # Runs in the child between fork and exec: no allocation-heavy work.
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


@dataclass(slots=True)
class Upstream:
    process: asyncio.subprocess.Process
    stdin_fd: int  # Visor's write end of the server's stdin
    stdout_fd: int  # Visor's read end of the server's stdout

    @property
    def pid(self) -> int:
        return self.process.pid


class SpawnError(Exception):
    pass


async def spawn(argv: list[str]) -> Upstream:
    if not argv:
        raise SpawnError("no server command given after --")
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=in_r,
            stdout=out_w,
            stderr=None,
            start_new_session=True,
            preexec_fn=_parent_death_signal if _LIBC is not None else None,
        )
    except OSError as exc:
        for fd in (in_r, in_w, out_r, out_w):
            os.close(fd)
        raise SpawnError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
    os.close(in_r)
    os.close(out_w)
    os.set_blocking(in_w, False)
    os.set_blocking(out_r, False)
    log.info("server_started", pid=process.pid, argv0=argv[0])
    return Upstream(process, in_w, out_r)


async def stop(upstream: Upstream, grace: float, term_grace: float) -> int:
    """Wait for the server to exit after its stdin closed, then TERM, then KILL."""
    proc = upstream.process
    with contextlib.suppress(asyncio.TimeoutError):
        return await asyncio.wait_for(proc.wait(), grace)
    log.warning("server_slow_to_exit", pid=proc.pid, action="SIGTERM")
    _signal_group(proc.pid, signal.SIGTERM)
    with contextlib.suppress(asyncio.TimeoutError):
        return await asyncio.wait_for(proc.wait(), term_grace)
    log.warning("server_ignored_sigterm", pid=proc.pid, action="SIGKILL")
    _signal_group(proc.pid, signal.SIGKILL)
    return await proc.wait()


async def reap(upstream: Upstream, timeout: float = 5.0) -> None:
    """Collect the server's exit status after `kill_group`, so that it is never left a zombie."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(upstream.process.wait(), timeout)


def kill_group(pid: int) -> None:
    """Last resort: make sure nothing of the server's process group survives."""
    _signal_group(pid, signal.SIGKILL)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def exit_status(returncode: int) -> int:
    """The shell's convention: a signal-killed child gives 128 + signal."""
    return 128 - returncode if returncode < 0 else returncode
