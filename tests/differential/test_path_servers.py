"""Path readings against real servers, through a real `visor run`, judged by the file system after.

Two servers read paths differently:

* the npm reference filesystem server normalises `..` lexically, then
  resolves symlinks; on Linux `\\` is a name character to it;
* tests/servers/naive_fs.py opens the raw path with open(): the kernel
  follows symlinks before `..`.

Each server is given a root wider than the sandbox (the tmp directory), so
the server itself would do what it is asked; Visor's policy confines
`write_file` to the sandbox. Run directly, each attack lands outside the
sandbox (the differential is real); through Visor it is denied and nothing
is created anywhere.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import VisorProcess

HERE = Path(__file__).resolve().parent
NAIVE = HERE.parent / "servers" / "naive_fs.py"
# `make test` installs the npm reference server here (see the Makefile).
NODE = HERE.parents[1] / ".venv" / "node" / "node_modules" / ".bin" / "mcp-server-filesystem"

POLICY = """\
version: "1.0"
default_action: deny
servers:
  - name: "fs"
    allowed: true
    tools:
      - name: "write_file"
        allowed: true
        write_params: ["path"]
        allowed_path_prefixes: ["{sandbox}"]
      - name: "read_file"
        allowed: true
      - name: "read_text_file"
        allowed: true
"""


class _Direct:
    """The server with nothing in between: JSON-RPC lines in, lines out."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def request(self, obj: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj).encode() + b"\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float = 20.0) -> dict:
        return json.loads(self.lines.get(timeout=timeout))

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _handshake(p: _Direct | VisorProcess) -> None:
    p.request(
        {
            "jsonrpc": "2.0",
            "id": "init",
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "1"},
            },
        }
    )
    assert "result" in _until(p, "init")
    p.request({"jsonrpc": "2.0", "method": "notifications/initialized"})
    p.request({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
    assert "tools" in _until(p, "list")["result"]


def _until(p: _Direct | VisorProcess, mid: object) -> dict:
    while True:
        msg = p.recv(20.0)
        if msg.get("id") == mid:
            return msg


def _call(p: _Direct | VisorProcess, mid: int, tool: str, **arguments: str) -> dict:
    p.request(
        {
            "jsonrpc": "2.0",
            "id": mid,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments},
        }
    )
    return _until(p, mid)["result"]


def _text(result: dict) -> str:
    return " ".join(c.get("text", "") for c in result.get("content", []))


def _visor(
    tmp_path: Path, sandbox: Path, server: list[str], env: dict[str, str] | None = None
) -> VisorProcess:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(sandbox=sandbox))
    vp = VisorProcess(
        server,
        env=env,
        visor_args=[
            "--server-name",
            "fs",
            "--policy",
            str(policy),
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
        ],
    )
    _handshake(vp)
    return vp


def _layout(tmp_path: Path) -> tuple[Path, Path]:
    """<tmp>/sandbox (the allowed prefix) and the traps an agent could have set inside the server's root."""
    root = tmp_path / "root"
    sandbox = root / "sandbox"
    sandbox.mkdir(parents=True)
    (root / "outside" / "deeper").mkdir(parents=True)
    # symlink then "..": the kernel lands in <root>/outside, the lexical reading in the sandbox
    (sandbox / "link").symlink_to(root / "outside" / "deeper")
    # a directory whose POSIX name reads as "<root>/sandbox" with Windows separators
    (root / "other\\..\\sandbox").mkdir()
    (sandbox / ".env").write_text("API_KEY=not-for-the-agent\n")
    return root.resolve(), sandbox.resolve()


def _attacks(root: Path, sandbox: Path) -> list[tuple[str, Path]]:
    """(path argument, where a server that escapes would write)."""
    return [
        (f"{sandbox}/link/../x.pth", root / "outside" / "x.pth"),  # the kernel's reading
        (f"{root}/other\\..\\sandbox/y.pth", root / "other\\..\\sandbox" / "y.pth"),  # POSIX names
        (f"{sandbox}/a\\..\\..\\z.pth", root / "z.pth"),  # Windows separators
    ]


def _every_file(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# ------------------------------------------------------------------ naive server


def test_naive_server_directly_the_kernel_reading_escapes(tmp_path: Path) -> None:
    root, sandbox = _layout(tmp_path)
    direct = _Direct([sys.executable, str(NAIVE)])
    try:
        _handshake(direct)
        res = _call(direct, 1, "write_file", path=f"{sandbox}/link/../x.pth", content="import os")
        assert res["isError"] is False
        res = _call(direct, 2, "write_file", path=f"{root}/other\\..\\sandbox/y.pth", content="import os")
        assert res["isError"] is False
    finally:
        direct.kill()
    # what open() did: symlink followed before "..", "\" a name character
    assert (root / "outside" / "x.pth").read_text() == "import os"
    assert not (sandbox / "x.pth").exists()
    assert (root / "other\\..\\sandbox" / "y.pth").exists() and not (sandbox / "y.pth").exists()


def test_naive_server_through_visor_denies_every_escape_and_creates_nothing(tmp_path: Path) -> None:
    root, sandbox = _layout(tmp_path)
    log = tmp_path / "naive.log"
    before = _every_file(root)
    vp = _visor(tmp_path, sandbox, [sys.executable, str(NAIVE)], env={"NAIVE_LOG": str(log)})
    try:
        for i, (path, escaped) in enumerate(_attacks(root, sandbox), start=1):
            res = _call(vp, i, "write_file", path=path, content="import os")
            assert res.get("isError") is True and "Visor denied" in _text(res), (path, res)
            assert not escaped.exists(), path
        res = _call(vp, 10, "read_file", path=f"{sandbox}/.Env")
        assert res.get("isError") is True and "Visor denied" in _text(res)
        assert _every_file(root) == before
        assert not log.exists(), "a denied call reached the server"
        # the control: an ordinary write inside the sandbox goes through
        res = _call(vp, 11, "write_file", path=f"{sandbox}/ok.txt", content="fine")
        assert res["isError"] is False, res
        assert (sandbox / "ok.txt").read_text() == "fine"
        assert len(log.read_text().splitlines()) == 1
    finally:
        vp.kill()


# ------------------------------------------------------------------ npm reference server


def _node() -> list[str]:
    if not NODE.exists():
        pytest.fail("the npm filesystem server is not installed; `make test` installs it")
    return [str(NODE)]


def test_node_server_directly_writes_where_posix_names_point(tmp_path: Path) -> None:
    root, sandbox = _layout(tmp_path)
    direct = _Direct([*_node(), str(root)])
    try:
        _handshake(direct)
        res = _call(direct, 1, "write_file", path=f"{root}/other\\..\\sandbox/y.pth", content="import os")
        assert res.get("isError") is not True, res
    finally:
        direct.kill()
    # Node on Linux reads "\" as a name character: outside the sandbox
    assert (root / "other\\..\\sandbox" / "y.pth").exists() and not (sandbox / "y.pth").exists()


def test_node_server_through_visor_denies_every_escape_and_creates_nothing(tmp_path: Path) -> None:
    root, sandbox = _layout(tmp_path)
    before = _every_file(root)
    vp = _visor(tmp_path, sandbox, [*_node(), str(root)])
    try:
        for i, (path, escaped) in enumerate(_attacks(root, sandbox), start=1):
            res = _call(vp, i, "write_file", path=path, content="import os")
            assert res.get("isError") is True and "Visor denied" in _text(res), (path, res)
            assert not escaped.exists(), path
        # `.Env` is another file on Linux, but `.env` to a macOS or Windows server
        for i, name in enumerate([".Env", ".ENV", ".env.", ".env "], start=20):
            res = _call(vp, i, "read_text_file", path=f"{sandbox}/{name}")
            assert res.get("isError") is True and "Visor denied" in _text(res), (name, res)
            assert "not-for-the-agent" not in _text(res)
        assert _every_file(root) == before
        # the control: reads and writes inside the sandbox work
        res = _call(vp, 30, "write_file", path=f"{sandbox}/ok.txt", content="fine")
        assert res.get("isError") is not True, res
        assert (sandbox / "ok.txt").read_text() == "fine"
        res = _call(vp, 31, "read_text_file", path=f"{sandbox}/ok.txt")
        assert res.get("isError") is not True and "fine" in _text(res), res
    finally:
        vp.kill()
