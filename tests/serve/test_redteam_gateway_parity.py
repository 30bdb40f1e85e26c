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


def test_a_secret_spelled_as_a_method_name_never_reaches_the_log(tmp_path: Path) -> None:
    """A method is a name the model chooses as freely as a tool's: a secret spelled as one was
    recorded as sent by the gateway's door (a message naming its own revision), by the relay's
    reject (a case-folded duplicate member) and by the deny of a request naming Visor's own
    files, and from those records it went to telemetry's span names."""
    with serve(
        tmp_path, [sys.executable, str(MAILBOX)], "--server-name", "mail", policy=MAIL_POLICY,
        env={"MAILBOX_LOG": str(tmp_path / "mailbox.jsonl")},
    ) as gw:  # fmt: skip
        sid = initialize(gw.url)
        bodies = [
            {"jsonrpc": "2.0", "id": 1, "method": AWS_ID, "params": {"_meta": {VERSION_KEY: "2025-11-25"}}},
            {"jsonrpc": "2.0", "id": 2, "method": AWS_ID, "params": {"x": 1, "X": 2}},
            {"jsonrpc": "2.0", "id": 3, "method": AWS_ID, "params": {"path": str(gw.audit)}},
        ]
        for body in bodies:
            assert "error" in post(gw.url, body, sid).json()
        records = [
            r for r in gw.records() if r.get("mcp_session") == sid and r["event"] in ("reject", "deny")
        ]
        text = gw.audit.read_text()
    assert [r["event"] for r in records] == ["reject", "reject", "deny"], records
    assert all(r.get("method") for r in records), records
    assert AWS_ID not in text
