"""mcp-visor policy meanings through a real `visor run` with the recorder server
behind it: redaction.sensitive_files on tool calls, the default 100-call
budget, max_export_rows, and a pinned stdio invocation digest."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from tests.conftest import RECORDER, VisorProcess, received
from visor.run import measure_invocation

# No session settings at all: the budget is mcp-visor's default of 100 calls.
POLICY = """\
version: "1.0"
default_action: deny
servers:
  - name: "rec"
    allowed: true
{attestation}    tools:
      - name: "echo"
        allowed: true
        rules:
          - type: max_export_rows
            rows: 50
redaction:
  sensitive_files: ["**/credentials"]
"""

ATTESTATION = """\
    attestation:
      kind: "stdio_invocation_sha256_v1"
      digest: "{digest}"
      entry_arg_positions: [0]
"""


def _start(tmp_path: Path, attestation: str = "") -> tuple[VisorProcess, Path]:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY.format(attestation=attestation))
    log = tmp_path / "received.jsonl"
    vp = VisorProcess(
        [sys.executable, str(RECORDER)],
        env={"RECORDER_LOG": str(log)},
        visor_args=[
            "--server-name",
            "rec",
            "--policy",
            str(policy_file),
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
        ],
    )
    vp.request({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
    assert "tools" in vp.recv()["result"]
    log.write_bytes(b"")
    return vp, log


def _call(vp: VisorProcess, msg_id: int, arguments: dict) -> dict:
    vp.request(
        {
            "jsonrpc": "2.0",
            "id": msg_id,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": arguments},
        }
    )
    resp = vp.recv()
    assert resp["id"] == msg_id
    return resp


def _rule(resp: dict) -> str | None:
    """The rule of a denied call: Visor answers it as a tool error naming the rule."""
    result = resp.get("result") or {}
    if not result.get("isError"):
        return None
    text = result["content"][0]["text"]
    m = re.search(r"\(rule: ([^()]+)\)$", text)
    return m.group(1) if m else None


def _allowed(resp: dict) -> bool:
    return "result" in resp and not resp["result"].get("isError")


def _calls_received(log: Path) -> list[dict]:
    return [m for m in map(json.loads, received(log)) if m.get("method") == "tools/call"]


def test_sensitive_file_and_max_export_rows_are_enforced(tmp_path: Path) -> None:
    vp, log = _start(tmp_path)
    try:
        assert _rule(_call(vp, 1, {"path": "/home/someone/app/credentials"})) == "path.sensitive"
        assert _rule(_call(vp, 2, {"path": "/home/someone/app/CREDENTIALS"})) == "path.sensitive"
        assert _rule(_call(vp, 3, {"limit": 51})) == "servers[rec].tools[echo].max_export_rows"
        assert _allowed(_call(vp, 4, {"limit": 50, "path": "/home/someone/app/readme.md"}))
        # only the allowed call reached the server
        got = _calls_received(log)
        assert [m["id"] for m in got] == [4]
    finally:
        vp.kill()


def test_default_budget_denies_the_101st_call(tmp_path: Path) -> None:
    vp, log = _start(tmp_path)
    try:
        for i in range(1, 101):
            assert _allowed(_call(vp, i, {"i": i})), i
        resp = _call(vp, 101, {"i": 101})
        assert _rule(resp) == "budget.session_calls"
        assert "budget of 100 calls" in resp["result"]["content"][0]["text"]
        assert len(_calls_received(log)) == 100
    finally:
        vp.kill()


def test_matching_attestation_lets_calls_through(tmp_path: Path) -> None:
    digest, why = measure_invocation([sys.executable, str(RECORDER)], (0,))
    assert digest is not None, why
    vp, log = _start(tmp_path, ATTESTATION.format(digest=digest))
    try:
        assert _allowed(_call(vp, 1, {"i": 1}))
        assert len(_calls_received(log)) == 1
    finally:
        vp.kill()


def test_other_attestation_denies_every_call(tmp_path: Path) -> None:
    # the digest of another entry file: the recorder is not the server pinned
    other = tmp_path / "other_server.py"
    other.write_text("print('not the recorder')\n")
    digest, _ = measure_invocation([sys.executable, str(other)], (0,))
    assert digest is not None
    vp, log = _start(tmp_path, ATTESTATION.format(digest=digest))
    try:
        for i in range(1, 4):
            resp = _call(vp, i, {"i": i})
            assert _rule(resp) == "servers[rec].attestation", resp
        assert _calls_received(log) == []
        # Visor starts and answers everything else; only tools/call is refused (as in mcp-visor)
        vp.request({"jsonrpc": "2.0", "id": 9, "method": "ping"})
        assert vp.recv()["id"] == 9
    finally:
        vp.kill()
