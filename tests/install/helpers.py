"""Run the real `visor` CLI in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
VISOR_EXE = VENV_BIN / "visor"
SDK_SERVER = Path(__file__).parents[1] / "servers" / "sdk_server.py"


def visor(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120):
    full = dict(os.environ)
    # As after `pipx install`: `visor` is on the PATH (a test that needs otherwise passes PATH).
    full["PATH"] = f"{VENV_BIN}{os.pathsep}{full.get('PATH', '')}"
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "visor.cli", *args],
        cwd=cwd,
        env=full,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def venv_tool(name: str) -> str:
    exe = VENV_BIN / name
    if not exe.exists():
        raise AssertionError(f"{name} is not installed next to {sys.executable}; install the test extra")
    return str(exe)
