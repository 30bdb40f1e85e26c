"""The allow records of one read from the client reach the audit writer as one hand-off.

The relay runs in-process on uvloop with the real policy checks, a real
audit log on disk and the recorder server; the client's whole conversation
is in the pipe before the relay starts (so it is one read), and the writer
is watched only to count how records are handed to it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import uvloop

from tests.conftest import RECORDER
from visor.audit.writer import AuditWriter, new_session_id
from visor.core.checks import PolicyChecks
from visor.policy.loader import load_policy_text
from visor.relay.proxy import Relay, RelayConfig
from visor.session import SessionState

POLICY = """\
version: "1.0"
default_action: deny
servers:
  - name: "rec"
    allowed: true
    tools:
      - name: "echo"
        allowed: true
"""


class CountingWriter:
    """The real writer, with a count of records appended and of records submitted (awaited)."""

    def __init__(self, writer: AuditWriter) -> None:
        self._writer = writer
        self.appended: list[str] = []
        self.submitted: list[str] = []

    def append(self, event: dict[str, Any]) -> dict[str, Any]:
        self.appended.append(event["event"])
        return self._writer.append(event)

    def submit(self, event: dict[str, Any], *, sole: bool = False) -> Any:
        self.submitted.append(event["event"])
        return self._writer.submit(event, sole=sole)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)


def test_one_read_of_pipelined_calls_is_one_hand_off_and_every_call_runs_after_it(tmp_path: Path) -> None:
    received = tmp_path / "received.jsonl"
    os.environ["RECORDER_LOG"] = str(received)
    try:
        calls = [
            {
                "jsonrpc": "2.0",
                "id": n,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": {"n": n}},
            }
            for n in range(5)
        ]
        listing = {"jsonrpc": "2.0", "id": "l", "method": "tools/list"}
        in_r, in_w = os.pipe()
        os.write(in_w, b"".join(json.dumps(m).encode() + b"\n" for m in [listing, *calls]))
        os.close(in_w)
        out_path = tmp_path / "client_out"
        out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        policy = load_policy_text(POLICY, "test.yaml")
        audit_path = tmp_path / "audit.jsonl"
        writer = CountingWriter(AuditWriter.open(audit_path, session=new_session_id()))

        async def session() -> int:
            checks = PolicyChecks(
                policy=policy,
                session=SessionState(policy, "rec"),
                audit_session=writer.session,
                server_name="rec",
                argv=[sys.executable],
            )
            relay = Relay([sys.executable, str(RECORDER)], RelayConfig(), checks, audit=writer)  # type: ignore[arg-type]
            return await relay.run(in_r, out_fd)

        uvloop.run(session())
        os.close(out_fd)
    finally:
        del os.environ["RECORDER_LOG"]
    # the five allows: four appended, the last submitted, and nothing else awaited
    assert writer.submitted == ["allow"]
    assert writer.appended.count("allow") == 4
    records = [json.loads(line) for line in audit_path.read_bytes().splitlines()]
    assert [r["id"] for r in records if r["event"] == "allow"] == [0, 1, 2, 3, 4]
    got = [json.loads(line) for line in received.read_bytes().splitlines()]
    assert [m["id"] for m in got if m.get("method") == "tools/call"] == [0, 1, 2, 3, 4]
    answers = [json.loads(line) for line in out_path.read_bytes().splitlines()]
    assert sorted(str(a["id"]) for a in answers) == ["0", "1", "2", "3", "4", "l"]
    assert all("result" in a for a in answers)
