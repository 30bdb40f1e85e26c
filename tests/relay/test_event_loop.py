"""Where uvloop cannot be imported, `visor run` and `visor serve` run on asyncio's own loop and say so once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import RECORDER, TESTS

# The import of uvloop fails as it does where it is not installed (sys.modules[name] = None
# makes `import name` raise ImportError), then the CLI runs as `python -m visor.cli` would.
_WITHOUT_UVLOOP = (
    "import runpy, sys; sys.modules['uvloop'] = None; sys.argv[0] = 'visor'; "
    "runpy.run_module('visor.cli', run_name='__main__')"
)


def _env(tmp_path: Path) -> dict[str, str]:
    root = str(TESTS.parent)
    return {
        **os.environ,
        "VISOR_HOME": str(tmp_path / "home"),
        "RECORDER_LOG": str(tmp_path / "received.jsonl"),
        "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
    }


def test_visor_run_falls_back_to_the_asyncio_loop(tmp_path: Path) -> None:
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"a": 1}},
        },
    ]
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _WITHOUT_UVLOOP,
            "run",
            "--server-name",
            "rec",
            "--",
            sys.executable,
            str(RECORDER),
        ],
        input=b"".join(json.dumps(m).encode() + b"\n" for m in messages),
        capture_output=True,
        env=_env(tmp_path),
        timeout=60,
    )
    stderr = proc.stderr.decode()
    assert proc.returncode == 0, stderr
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [a["id"] for a in answers] == [1, 2]
    assert "tools" in answers[0]["result"]
    assert stderr.count("uvloop_unavailable") == 1, stderr
    assert "running on the standard asyncio event loop" in stderr


def test_visor_run_with_uvloop_says_nothing_about_the_loop(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "visor.cli",
            "run",
            "--server-name",
            "rec",
            "--",
            sys.executable,
            str(RECORDER),
        ],
        input=b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n',
        capture_output=True,
        env=_env(tmp_path),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert "uvloop_unavailable" not in proc.stderr.decode()


def test_visor_serve_falls_back_to_the_asyncio_loop(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _WITHOUT_UVLOOP,
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--",
            sys.executable,
            str(RECORDER),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=_env(tmp_path),
    )
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 30
        while not any("listening on http://127.0.0.1:" in line for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            lines.append(proc.stderr.readline().decode())
    finally:
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=30)[1].decode()
    stderr = "".join(lines) + rest
    assert proc.returncode == 0, stderr
    assert stderr.count("uvloop_unavailable") == 1, stderr
