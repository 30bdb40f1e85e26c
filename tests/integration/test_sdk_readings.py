"""Servers that re-read strings: the real MCP Python SDK, directly and through ``visor run``.

The SDK JSON-decodes a string given for a parameter that is not typed
``str``, and pydantic reads numeric strings leniently. Each attack is first
shown to work against the server directly (the ground truth), then the same
call goes through a real ``visor run`` and must be denied, with nothing read,
written or returned.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import INITIALIZED, VisorProcess, initialize

SERVER = [sys.executable, str(Path(__file__).parents[1] / "servers" / "sdk_typed.py")]

POLICY = """\
version: "1.0"
default_action: deny
servers:
  - name: "typed"
    allowed: true
    tools:
      - name: "read_files"
        allowed: true
        allowed_path_prefixes: ["{root}"]
      - name: "write_file"
        allowed: true
        write_params: ["path"]
        allowed_path_prefixes: ["{root}"]
      - name: "copy_file"
        allowed: true
        allowed_path_prefixes: ["{root}"]
      - name: "list_rows"
        allowed: true
        rules:
          - type: max_result_rows
            rows: 100
"""


def _call(msg_id: int, tool: str, arguments: dict) -> dict:
    return {
        "jsonrpc": "2.0",
        "id": msg_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }


def direct(calls: list[dict]) -> dict[int, dict]:
    """The server's answers to ``calls``, with no Visor in between."""
    lines = [initialize(), INITIALIZED, *calls]
    data = b"".join(json.dumps(m).encode() + b"\n" for m in lines)
    proc = subprocess.Popen(SERVER, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(data)
    proc.stdin.flush()
    answers: dict[int, dict] = {}
    want = {c["id"] for c in calls}
    while not want <= answers.keys():
        line = proc.stdout.readline()
        if not line:
            break
        msg = json.loads(line)
        if "id" in msg:
            answers[msg["id"]] = msg
    proc.stdin.close()
    proc.wait(10)
    return answers


def _text(resp: dict) -> str:
    return "".join(c.get("text", "") for c in resp["result"]["content"])


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path, Path]:
    root = tmp_path / "sandbox"
    root.mkdir()
    (root / ".env").write_text("TOKEN=secret-1")
    (root / "notes.txt").write_text("plain notes")
    outside = tmp_path / "outside.txt"
    outside.write_text("outside text")
    return root, root / ".env", outside


def _attacks(root: Path, env: Path, outside: Path) -> list[dict]:
    # The escaped dot keeps ".env" out of the literal string Visor's checks read.
    hidden_env = json.dumps([str(env)]).replace("/.env", "/\\u002eenv")
    return [
        _call(1, "read_files", {"paths": hidden_env}),
        _call(2, "read_files", {"paths": json.dumps([str(outside)])}),
        _call(3, "copy_file", {"spec": json.dumps({"source": str(env), "destination": str(root / "c")})}),
        _call(4, "copy_file", {"spec": json.dumps({"source": str(outside), "destination": str(root / "d")})}),
        _call(5, "list_rows", {"limit": "+100000"}),
        _call(6, "list_rows", {"limit": "100_000"}),
        _call(7, "list_rows", {"limit": " 100000 "}),
    ]


def test_the_sdk_server_acts_on_every_reading(files: tuple[Path, Path, Path]) -> None:
    root, env, outside = files
    answers = direct(_attacks(root, env, outside))
    assert "TOKEN=secret-1" in _text(answers[1])
    assert "outside text" in _text(answers[2])
    assert (root / "c").read_text() == "TOKEN=secret-1"
    assert (root / "d").read_text() == "outside text"
    for i in (5, 6, 7):
        assert _text(answers[i]) == "rows=100000", answers[i]


def _visor(tmp_path: Path, root: Path, extra: list[str] = ()) -> VisorProcess:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(root=root))
    vp = VisorProcess(
        SERVER,
        visor_args=[
            "--server-name",
            "typed",
            "--policy",
            str(policy),
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
            *extra,
        ],
    )
    init, listed = vp.open_session()
    assert "serverInfo" in init["result"]
    assert len(listed["result"]["tools"]) == 4
    return vp


def test_every_reading_is_denied_through_visor(tmp_path: Path, files: tuple[Path, Path, Path]) -> None:
    root, env, outside = files
    vp = _visor(tmp_path, root)
    try:
        for call in _attacks(root, env, outside):
            vp.request(call)
            resp = vp.recv()
            assert resp["id"] == call["id"]
            assert resp["result"]["isError"] is True, (call, resp)
            text = _text(resp)
            assert "Visor denied" in text, text
            assert "secret-1" not in text and "outside text" not in text and "rows=" not in text
        assert not (root / "c").exists() and not (root / "d").exists()
        # Ordinary calls, in either form, still go through.
        vp.request(_call(20, "read_files", {"paths": [str(root / "notes.txt")]}))
        assert "plain notes" in _text(vp.recv())
        vp.request(_call(21, "read_files", {"paths": json.dumps([str(root / "notes.txt")])}))
        assert "plain notes" in _text(vp.recv())
        vp.request(_call(22, "list_rows", {"limit": "50"}))
        assert _text(vp.recv()) == "rows=50"
        # A plain-string parameter is never decoded: JSON text inside it is just content.
        body = json.dumps({"path": str(outside)})
        vp.request(_call(23, "write_file", {"path": str(root / "data.json"), "content": body}))
        assert "wrote" in _text(vp.recv())
        assert json.loads((root / "data.json").read_text()) == {"path": str(outside)}
    finally:
        vp.kill()


def test_the_approval_directory_hidden_in_json_is_still_visors(
    tmp_path: Path, files: tuple[Path, Path, Path]
) -> None:
    """The critical variant: a JSON-string list naming the approval directory (escaped) is denied."""
    root, _env, _outside = files
    approvals = root / "approvals"
    vp = _visor(tmp_path, root, ["--approval-dir", str(approvals)])
    try:
        pending = approvals / "x.pending.json"
        hidden = json.dumps([str(pending)]).replace("/approvals/", "/\\u0061pprovals/")
        assert "approvals" not in hidden
        vp.request(_call(30, "read_files", {"paths": hidden}))
        resp = vp.recv()
        assert resp["result"]["isError"] is True
        assert "visor.protected_path" in _text(resp) or "Visor's own files" in _text(resp)
        hidden_write = json.dumps(
            {"source": str(root / "notes.txt"), "destination": str(approvals / "y.answer")}
        )
        vp.request(_call(31, "copy_file", {"spec": hidden_write.replace("approvals", "\\u0061pprovals")}))
        assert vp.recv()["result"]["isError"] is True
        assert not (approvals / "y.answer").exists()
    finally:
        vp.kill()
