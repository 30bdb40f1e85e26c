"""Shell command allow lists through a real `visor run`: the bypasses that fooled
the old splitter are denied and never reach the server; a plain ls is relayed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.conftest import RECORDER, VisorProcess, received, sentinel

POLICY = """\
version: "1.0"
default_action: deny
servers:
  - name: "rec"
    allowed: true
    tools:
      - name: "echo"
        allowed: true
        rules:
          - type: allow_command_pattern
            patterns: ["^ls( |$)"]
"""

BYPASSES = [
    "ls #'\ntouch X #'",  # a newline hidden in a comment by a quote
    "ls $(echo ')'; touch X)",  # a quoted ) inside $( )
    "ls <<EOF\ntouch X\nEOF",  # unreadable: refused, not guessed
]


def test_shell_bypasses_are_denied_and_plain_ls_is_relayed(tmp_path: Path) -> None:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY)
    log = tmp_path / "received.jsonl"
    audit = tmp_path / "audit" / "audit.jsonl"
    vp = VisorProcess(
        [sys.executable, str(RECORDER)],
        env={"RECORDER_LOG": str(log), "RECORDER_AUDIT": str(audit)},
        visor_args=["--server-name", "rec", "--policy", str(policy_file), "--audit-log", str(audit)],
    )
    try:
        vp.request({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
        assert "tools" in vp.recv()["result"]
        log.write_bytes(b"")
        for i, cmd in enumerate(BYPASSES):
            vp.request(
                {
                    "jsonrpc": "2.0",
                    "id": i,
                    "method": "tools/call",
                    "params": {"name": "echo", "arguments": {"command": cmd}},
                }
            )
            resp = vp.recv()
            assert resp["id"] == i
            assert resp["result"]["isError"] is True, cmd
            assert "Visor denied this call" in resp["result"]["content"][0]["text"]
        sentinel(vp)
        # none of them reached the server: it saw only the ping
        assert [json.loads(line).get("method") for line in received(log)] == ["ping"]
        vp.request(
            {
                "jsonrpc": "2.0",
                "id": 10,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": {"command": "ls -la"}},
            }
        )
        resp = vp.recv()
        assert resp["id"] == 10 and not resp["result"].get("isError")
        sentinel(vp)
        relayed = [json.loads(line) for line in received(log)]
        calls = [m for m in relayed if m.get("method") == "tools/call"]
        assert [c["params"]["arguments"]["command"] for c in calls] == ["ls -la"]
    finally:
        vp.close_stdin()
        vp.wait()
    denies = [json.loads(x) for x in audit.read_bytes().splitlines() if b'"deny"' in x]
    assert len([d for d in denies if d.get("event") == "deny"]) == len(BYPASSES)
