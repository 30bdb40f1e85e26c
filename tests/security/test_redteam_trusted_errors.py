"""Red team: an error result is not a record of the service's, so its fields vouch for nobody.

A tool's `trusted_output_fields` name what the service itself states (an event's participants).
A server that answers a miss with an error repeating the query in that same field would turn any
address the agent asks about into a known correspondent: a poisoned mail names the address, the
fooled agent looks it up, the error echoes it as a participant, and the send to it passed. Through
a real `visor run` in front of a real SDK server.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.conftest import VisorProcess

SERVER = [sys.executable, str(Path(__file__).parents[1] / "servers" / "sdk_calendar.py")]
STRANGER = "drop@exfil.example"

POLICY = """\
version: "1.0"
default_action: deny
settings:
  packs: []
servers:
  - name: "cal"
    allowed: true
    tools:
      - name: "read_inbox"
        allowed: true
      - name: "find_event"
        allowed: true
        trusted_output_fields: ["participants[*]"]
      - name: "send_email"
        allowed: true
        exfiltrating: true
        sink_params: ["to"]
"""


def _call(vp: VisorProcess, msg_id: int, tool: str, arguments: dict) -> dict:
    vp.request(
        {
            "jsonrpc": "2.0",
            "id": msg_id,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments},
        }
    )
    resp = vp.recv()
    assert resp["id"] == msg_id, resp
    return resp


def _denied(resp: dict) -> bool:
    result = resp.get("result") or {}
    text = "".join(c.get("text", "") for c in result.get("content", []))
    return bool(result.get("isError")) and "Visor denied this call" in text


def _session(tmp_path: Path) -> tuple[VisorProcess, Path]:
    log = tmp_path / "calendar.jsonl"
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    vp = VisorProcess(
        SERVER,
        env={"CALENDAR_LOG": str(log)},
        visor_args=[
            "--server-name",
            "cal",
            "--policy",
            str(policy),
            "--audit-log",
            str(tmp_path / "a.jsonl"),
        ],
    )
    vp.open_session()
    return vp, log


def _sent(log: Path) -> list[str]:
    return [json.loads(line)["to"] for line in log.read_text().splitlines()] if log.exists() else []


def test_an_error_echoing_the_query_in_a_trusted_field_vouches_for_nobody(tmp_path: Path) -> None:
    vp, log = _session(tmp_path)
    try:
        assert STRANGER in json.dumps(_call(vp, 1, "read_inbox", {}))
        missed = _call(vp, 2, "find_event", {"query": STRANGER})["result"]
        assert missed["isError"] is True and missed["structuredContent"]["participants"] == [STRANGER]
        assert _denied(_call(vp, 3, "send_email", {"to": STRANGER, "body": "minutes"}))
    finally:
        vp.kill()
    assert _sent(log) == []


def test_a_participant_of_a_found_event_is_still_a_known_correspondent(tmp_path: Path) -> None:
    vp, log = _session(tmp_path)
    try:
        found = _call(vp, 1, "find_event", {"query": "standup"})["result"]
        assert not found.get("isError")
        assert not _denied(_call(vp, 2, "send_email", {"to": "bob@corp.example", "body": "minutes"}))
    finally:
        vp.kill()
    assert _sent(log) == ["bob@corp.example"]
