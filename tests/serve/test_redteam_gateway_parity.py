"""Red-team regressions: `visor serve` keeps every protection `visor run` keeps.

Each test drives a real `visor serve` subprocess (raw HTTP) in front of a real server."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.serve.serve_proc import MAIL_POLICY, MAILBOX, initialize, post, serve

VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
# A secret spelled as a tool's name (an AWS access key id: redacted by default).
AWS_ID = "AKIAIOSFODNN7EXAMPLE"


def test_a_refused_bodys_record_names_its_tool_redacted(tmp_path: Path) -> None:
    """The gateway records the bodies it refuses itself (before the relay sees them): their
    reject records used to carry the tool's name as sent, so a secret the agent was fooled into
    spelling as a tool name reached the log that holds none (stdio's reject records redact it)."""
    with serve(
        tmp_path, [sys.executable, str(MAILBOX)], "--server-name", "mail", policy=MAIL_POLICY,
        env={"MAILBOX_LOG": str(tmp_path / "mailbox.jsonl")},
    ) as gw:  # fmt: skip
        sid = initialize(gw.url)
        not_an_object = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": AWS_ID, "arguments": "x"},
        }
        names_revision = {
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": AWS_ID, "arguments": {}, "_meta": {VERSION_KEY: "2025-11-25"}},
        }  # fmt: skip
        for body in (not_an_object, names_revision):
            assert post(gw.url, body, sid).status == 400
        rejects = [r for r in gw.records() if r["event"] == "reject"]
        text = gw.audit.read_text()
    assert len(rejects) == 2, rejects
    assert all(r.get("tool") for r in rejects), rejects
    assert AWS_ID not in text
