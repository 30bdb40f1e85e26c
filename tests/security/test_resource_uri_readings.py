"""A resource URI is judged as the server's URL parser reads it.

The TypeScript SDK's McpServer reads every ``resources/read`` URI with
``new URL()`` (WHATWG) before it matches a template, so ``" file:///x/.env"``,
``"fi\\tle:///x/.env"`` or ``"\\x01file:///x/.env"`` open ``/x/.env``. Visor read
only URIs that begin with ``file:`` as files: a sensitive file, or a pending
approval in Visor's own directory, was read through a real TypeScript server
(tests/servers/node_resources.mjs) behind a real ``visor run``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import VisorProcess

SERVER = Path(__file__).parents[1] / "servers" / "node_resources.mjs"
SECRET = "the-secret-in-the-file"


def _node() -> list[str]:
    node = shutil.which("node")
    if (
        node is None
        or not (
            Path(__file__).parents[2] / ".venv" / "node" / "node_modules" / "@modelcontextprotocol"
        ).exists()
    ):
        pytest.fail("node and the TypeScript SDK in .venv/node are needed; `make test` installs them")
    return [node, str(SERVER)]


def _spellings(path: Path) -> list[str]:
    return [
        f" file://{path}",
        f"fi\tle://{path}",
        f"\x01file://{path}",
        f"\tfile://{path}",
        f"file://{path} \n",
    ]


def _files(tmp_path: Path) -> tuple[Path, Path, Path]:
    approvals = tmp_path / "approvals"
    approvals.mkdir(mode=0o700)
    pending = approvals / "0f3a9c.pending"
    pending.write_text(SECRET)
    env = tmp_path / ".env"
    env.write_text(SECRET)
    return approvals, pending, env


def _read(send, msg_id: int, uri: str) -> dict:  # type: ignore[no-untyped-def]
    return send({"jsonrpc": "2.0", "id": msg_id, "method": "resources/read", "params": {"uri": uri}})


def test_the_server_itself_reads_the_file_from_every_spelling(tmp_path: Path) -> None:
    _, _, env = _files(tmp_path)
    init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    lines = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
    ]
    lines += [
        {"jsonrpc": "2.0", "id": 1 + i, "method": "resources/read", "params": {"uri": u}}
        for i, u in enumerate(_spellings(env))
    ]
    out = subprocess.run(
        _node(),
        input="".join(json.dumps(x) + "\n" for x in lines),
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    answers = [json.loads(x) for x in out.splitlines() if x.strip()]
    assert sum(SECRET in json.dumps(a) for a in answers) == len(_spellings(env)), out


def test_no_spelling_reads_a_sensitive_file_or_visors_own_through_visor(tmp_path: Path) -> None:
    approvals, pending, env = _files(tmp_path)
    (tmp_path / "notes.txt").write_text("notes")
    vp = VisorProcess(
        _node(),
        visor_args=[
            "--server-name",
            "files",
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
            "--approval-dir",
            str(approvals),
        ],
        env={"VISOR_HOME": str(tmp_path / "home")},
    )

    def send(obj: dict) -> dict:
        vp.request(obj)
        return vp.recv()

    try:
        vp.open_session("2025-06-18")
        for i, uri in enumerate(_spellings(env)):
            resp = _read(send, 10 + i, uri)
            assert resp["error"]["data"]["visor"]["rule"] == "resource.sensitive", (uri, resp)
        for i, uri in enumerate(_spellings(pending)):
            resp = _read(send, 20 + i, uri)
            assert resp["error"]["data"]["visor"]["rule"] == "visor.protected_path", (uri, resp)
        ok = _read(send, 30, f"file://{tmp_path}/notes.txt")
        assert ok["result"]["contents"][0]["text"] == "notes", ok
    finally:
        vp.kill()
