"""A real redis-server for the tests: a free loopback port, a private directory, no
persistence unless a test asks for a SAVE, always killed by the fixture that made it."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path

MISSING = "redis-server not installed (Debian package redis-server)"
START_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server process; ``kill`` and ``start`` again on the same port and directory
    (a restart: what it held is gone, unless the test made it SAVE first)."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError(MISSING)
        self.binary = binary
        self.dir = directory
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *extra: str) -> None:
        assert self.proc is None, "already running"
        for _ in range(5):  # a port found free may be taken before the server binds it
            port = self.port or free_port()
            log = open(self.dir / "redis.log", "ab")  # noqa: SIM115 (the child keeps it)
            proc = subprocess.Popen(
                [
                    self.binary,
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(self.dir),
                    "--daemonize",
                    "no",
                    *extra,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            log.close()
            deadline = time.monotonic() + START_TIMEOUT_S
            while proc.poll() is None and time.monotonic() < deadline:
                if _pong(port):
                    self.proc, self.port = proc, port
                    return
                time.sleep(0.02)
            self._stop(proc)
        tail = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"redis-server did not start on a free port:\n{tail}")

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL, as a crash: nothing is saved."""
        proc, self.proc = self.proc, None
        if proc is not None:
            self._stop(proc)
