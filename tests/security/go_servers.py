"""Build a Go MCP server of tests/servers from source, for the red-team tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SERVERS = Path(__file__).parents[1] / "servers"


def build(name: str, work: Path) -> Path:
    """``tests/servers/NAME/main.go`` built into ``work``; skips the test without ``go``."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("go is not installed (Debian's golang-go): the Go server is built from source")
    env = {
        **os.environ,
        "HOME": str(work),
        "GOCACHE": str(work / "cache"),
        "GOPATH": str(work / "gopath"),
        "GO111MODULE": "off",
        "GOFLAGS": "",
        "CGO_ENABLED": "0",
    }
    out = work / name
    subprocess.run(
        [go, "build", "-o", str(out), str(SERVERS / name / "main.go")],
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out
