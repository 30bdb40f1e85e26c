"""Through a real `visor run` in front of a chat server with the tools of
AgentDojo's slack suite (tests/security/chat_server.py), judged by the
built-in slack pack (`sink_kinds`, kinds of trusted fields):

- adding a user first seen in a channel message (the injection) is denied,
  and never reaches the server; adding a listed user to a channel that only
  that message named is allowed: the channel is no recipient of data, while
  a message sent to that channel is denied;
- a user and a channel of one name are two destinations: a channel the
  service listed does not place a direct message to a user of that name, nor
  a listed user a channel.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import VisorProcess

SERVER = Path(__file__).with_name("chat_server.py")

POLICY = """
version: "1.0"
default_action: deny
servers:
  - name: "slack"
    allowed: true
    tools:
      - {name: "get_channels", allowed: true}
      - {name: "get_users_in_channel", allowed: true}
      - {name: "read_channel_messages", allowed: true}
      - {name: "send_direct_message", allowed: true}
      - {name: "send_channel_message", allowed: true}
      - {name: "add_user_to_channel", allowed: true}
      - {name: "invite_user_to_slack", allowed: true}
"""


class Chat:
    def __init__(self, vp: VisorProcess, log: Path, audit: Path) -> None:
        self.vp, self.log, self.audit = vp, log, audit
        self._next = 0

    def call(self, tool: str, **arguments: str) -> tuple[int, dict[str, Any]]:
        self._next += 1
        mid = self._next
        self.vp.request(
            {
                "jsonrpc": "2.0",
                "id": mid,
                "method": "tools/call",
                "params": {"name": tool, "arguments": arguments},
            }
        )
        resp = self.vp.recv()
        assert resp["id"] == mid, resp
        return mid, resp

    def verdicts(self, mid: int) -> list[tuple[str, str, str | None]]:
        # a deny is answered before its record is durable: read the log once
        # the session has ended (end())
        assert self.vp.proc.poll() is not None, "end() the session first"
        out = []
        for line in self.audit.read_bytes().splitlines():
            r = json.loads(line)
            if r.get("id") == mid and r.get("event") in ("allow", "deny", "ask"):
                out.append((r["event"], r.get("rule", ""), r.get("destination")))
        return out

    def end(self) -> None:
        self.vp.kill()

    def reached(self, mid: int) -> bool:
        if not self.log.exists():
            return False
        return any(json.loads(x)["id"] == mid for x in self.log.read_text().splitlines() if x.strip())


@pytest.fixture
def chat(tmp_path: Path) -> Iterator[Chat]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    log, audit = tmp_path / "calls.jsonl", tmp_path / "audit.jsonl"
    vp = VisorProcess(
        [sys.executable, str(SERVER)],
        env={"CHAT_LOG": str(log)},
        visor_args=["--server-name", "slack", "--policy", str(policy), "--audit-log", str(audit)],
    )
    try:
        init, listed = vp.open_session("2025-06-18", init_id="init")
        assert init["result"]["serverInfo"]["name"] == "chat"
        assert len(listed["result"]["tools"]) == 7
        yield Chat(vp, log, audit)
    finally:
        vp.kill()


def _ok(resp: dict[str, Any]) -> bool:
    return "result" in resp and not resp["result"].get("isError")


def test_the_user_added_is_the_destination_and_the_channel_is_not(chat: Chat) -> None:
    for tool, args in (
        ("get_channels", {}),
        ("get_users_in_channel", {"channel": "general"}),
        ("read_channel_messages", {"channel": "general"}),  # the injection: Mallory7, #finance-2
    ):
        _mid, resp = chat.call(tool, **args)
        assert _ok(resp), resp

    stranger, stranger_resp = chat.call("add_user_to_channel", user="Mallory7", channel="general")
    post, post_resp = chat.call("send_channel_message", channel="finance-2", body="Q3: 1.2M")
    # Bob is a member the service listed; finance-2 only the message named
    member, member_resp = chat.call("add_user_to_channel", user="Bob", channel="finance-2")
    chat.end()

    assert not _ok(stranger_resp) and not chat.reached(stranger)
    assert chat.verdicts(stranger) == [("deny", "provenance.untrusted_output", "user:mallory7")]
    assert not _ok(post_resp) and not chat.reached(post)
    assert chat.verdicts(post) == [("deny", "provenance.untrusted_output", "channel:finance-2")]
    assert _ok(member_resp), member_resp
    assert chat.reached(member)
    assert [v[0] for v in chat.verdicts(member)] == ["allow"]


def test_a_user_and_a_channel_of_one_name_are_two_destinations(chat: Chat) -> None:
    for tool, args in (("get_channels", {}), ("get_users_in_channel", {"channel": "general"})):
        _mid, resp = chat.call(tool, **args)
        assert _ok(resp), resp

    # listed as a channel: a message to the channel passes, a direct message
    # to the user "random" is not placed by that list
    to_channel, to_channel_resp = chat.call("send_channel_message", channel="random", body="hello")
    to_user, to_user_resp = chat.call("send_direct_message", recipient="random", body="hello")
    # listed as a user: a direct message passes, a channel of that name does not
    dm, dm_resp = chat.call("send_direct_message", recipient="Bob", body="hello")
    post, post_resp = chat.call("send_channel_message", channel="Bob", body="hello")
    chat.end()

    assert _ok(to_channel_resp) and chat.reached(to_channel)
    assert _ok(dm_resp) and chat.reached(dm)
    for mid, resp, key in ((to_user, to_user_resp, "user:random"), (post, post_resp, "channel:bob")):
        assert not _ok(resp) and not chat.reached(mid)
        events = chat.verdicts(mid)
        # asked, and with nobody to ask, denied
        assert events[0] == ("ask", "provenance.unknown_destination", key), events
        assert events[-1][0] == "deny", events
