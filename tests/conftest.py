"""Shared fixtures: run `visor run` as a real subprocess over real pipes."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Property tests check behaviour, never speed: a busy CI machine must not fail
# them on a per-example deadline.
settings.register_profile("visor", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("visor")

TESTS = Path(__file__).parent
RECORDER = TESTS / "servers" / "recorder.py"
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def initialize(version: str = "2025-11-25", msg_id: object = 0) -> dict:
    """A client's `initialize` request."""
    return {
        "jsonrpc": "2.0",
        "id": msg_id,
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }


class VisorProcess:
    """`visor run` with the recorder (or any) server behind it, driven byte by byte."""

    def __init__(
        self,
        server: list[str],
        *,
        visor_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        prelude: str | None = None,
    ):
        """`prelude`: Python run in the visor process before its CLI (to pin a tuning constant)."""
        full_env = dict(os.environ)
        full_env.update(env or {})
        if cwd is not None:
            # the project must stay importable from another working directory
            root = str(TESTS.parent)
            full_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, full_env.get("PYTHONPATH")) if p)
        entry = ["-m", "visor.cli"]
        if prelude is not None:
            entry = ["-c", f"{prelude}\nimport sys\nfrom visor.cli import main\nsys.exit(main())"]
        self.proc = subprocess.Popen(
            [sys.executable, *entry, "run", *(visor_args or []), "--", *server],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            cwd=cwd,
        )
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self.stderr_chunks: list[bytes] = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for chunk in self.proc.stderr:
            self.stderr_chunks.append(chunk)

    @property
    def stderr(self) -> str:
        return b"".join(self.stderr_chunks).decode(errors="replace")

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def request(self, obj: dict) -> None:
        self.send(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    # Generous: the suite runs on every core at once (pytest-xdist), and a wait only ends early.
    def recv_raw(self, timeout: float = 30.0) -> bytes:
        line = self._lines.get(timeout=timeout)
        if line is None:
            raise EOFError("visor closed its stdout")
        return line

    def recv(self, timeout: float = 30.0) -> dict:
        return json.loads(self.recv_raw(timeout))

    def open_session(
        self,
        version: str = "2025-11-25",
        *,
        timeout: float = 30.0,
        init_id: object = 0,
        list_id: object = "list",
    ) -> tuple[dict, dict]:
        """`initialize`, `notifications/initialized` and `tools/list`: the two answers."""
        self.request(initialize(version, init_id))
        init = self.recv(timeout)
        self.request(INITIALIZED)
        self.request({"jsonrpc": "2.0", "id": list_id, "method": "tools/list"})
        return init, self.recv(timeout)

    def no_output(self, wait: float = 0.3) -> bool:
        try:
            line = self._lines.get(timeout=wait)
        except queue.Empty:
            return True
        self._lines.put(line)
        return False

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout)

    def remaining_output(self, timeout: float = 10.0) -> list[bytes]:
        out = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            out.append(line)
        return out

    def kill(self) -> None:
        """End the session the way a client does (stdin EOF), and kill only if that hangs.

        A clean end is what lets tests read the audit log afterwards: records
        that need no fsync are on disk by `session_end`. Tests of a crash
        kill `self.proc` themselves.
        """
        if self.proc.poll() is not None:
            return
        try:
            assert self.proc.stdin is not None
            if not self.proc.stdin.closed:
                self.proc.stdin.close()
            self.proc.wait(15)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture
def recorder_log(tmp_path: Path) -> Path:
    return tmp_path / "received.jsonl"


def recorder_visor(recorder_log: Path, prelude: str | None = None) -> Iterator[VisorProcess]:
    """A real visor run in front of the recorder, its tools listed; killed after."""
    vp = VisorProcess(
        [sys.executable, str(RECORDER)],
        env={"RECORDER_LOG": str(recorder_log)},
        visor_args=["--audit-log", str(recorder_log.parent / "audit.jsonl")],
        prelude=prelude,
    )
    # List the tools first, as a client does: the default policy pins them,
    # and denies calls made before any listing. Then forget that traffic.
    vp.request({"jsonrpc": "2.0", "id": "setup-list", "method": "tools/list"})
    assert "tools" in vp.recv()["result"]
    recorder_log.write_bytes(b"")
    yield vp
    vp.kill()


@pytest.fixture
def visor(recorder_log: Path) -> Iterator[VisorProcess]:
    yield from recorder_visor(recorder_log)


def received(path: Path) -> list[bytes]:
    """The lines the recorder server received, exactly."""
    if not path.exists():
        return []
    return path.read_bytes().splitlines(keepends=True)


def sentinel(vp: VisorProcess, msg_id: int = 999_000) -> dict:
    """A ping through the relay: once it is answered, everything before it was handled."""
    vp.request({"jsonrpc": "2.0", "id": msg_id, "method": "ping"})
    resp = vp.recv()
    assert resp.get("id") == msg_id, resp
    return resp


@pytest.fixture(autouse=True)
def _visor_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests never touch the real ~/.visor.
    home = str(tmp_path / "visor-home")
    monkeypatch.setenv("VISOR_HOME", home)
    # The MCP SDK starts stdio servers with a minimal environment (as real clients do),
    # which would drop VISOR_HOME: a `visor run` it starts must still use the test's home.
    try:
        import mcp.client.stdio as sdk_stdio
    except ImportError:
        return
    minimal = sdk_stdio.get_default_environment
    monkeypatch.setattr(sdk_stdio, "get_default_environment", lambda: {**minimal(), "VISOR_HOME": home})
