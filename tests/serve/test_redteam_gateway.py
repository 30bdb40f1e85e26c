"""Red-team regressions for `visor serve`: sessions, conversations and one reading over HTTP.

Each test drives a real `visor serve` subprocess with raw HTTP."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.serve.serve_proc import MAIL_POLICY, MAILBOX, http, initialize, post, serve
from tests.state.redis_server import MISSING, RedisServer

VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
MODERN = "2026-07-28"
FRONT_POLICY = """
version: "1.0"
default_action: allow
servers:
  - name: "front"
    allowed: true
"""


def _ping(rpc_id: int, revision: str | None) -> dict[str, object]:
    params: dict[str, object] = {"name": "ping", "arguments": {}}
    if revision is not None:
        params["_meta"] = {VERSION_KEY: revision, CAPABILITIES_KEY: {}}
    return {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": params}


@pytest.mark.parametrize("revision", ["2026-07-28", "2025-11-25"])
def test_a_request_in_a_session_that_names_its_own_revision_does_not_leave_the_session(
    tmp_path: Path, revision: str
) -> None:
    """A gateway in front of an HTTP upstream (here, another `visor serve` in front of the
    mailbox). Judged in session A, a call whose `_meta` named a revision used to be sent upstream
    without A's session id, into the upstream's sessionless conversation, which every session of
    the front gateway shares: session B's budget on the back then counted session A's calls."""
    (tmp_path / "back").mkdir()
    (tmp_path / "front").mkdir()
    log = tmp_path / "mailbox.jsonl"
    with (
        serve(
            tmp_path / "back", [sys.executable, str(MAILBOX)], "--server-name", "mail",
            policy=MAIL_POLICY, env={"MAILBOX_LOG": str(log)},
        ) as back,
        serve(tmp_path / "front", None, "--url", back.url, "--server-name", "front", policy=FRONT_POLICY) as front,
    ):  # fmt: skip
        a, b = initialize(front.url), initialize(front.url)
        for sid in (a, a, b):
            reply = post(front.url, _ping(7, revision), sid)
            assert reply.status == 400, reply
            assert reply.json()["id"] == 7 and reply.json()["error"]["code"] == -32600
        # The sessions are unharmed: their calls run in their own upstream sessions.
        for sid in (a, b):
            reply = post(front.url, _ping(8, None), sid)
            assert reply.status == 200 and "pong" in reply.json()["result"]["content"][0]["text"], reply
        back_sessions = {r.get("mcp_session") for r in back.records() if r["event"] in ("allow", "deny")}
    assert not any(str(s).startswith("conversation-") for s in back_sessions), back_sessions
    assert len(back_sessions) == 2
    assert [json.loads(line)["tool"] for line in log.read_text().splitlines()] == ["ping", "ping"]


@pytest.mark.skipif(shutil.which("redis-server") is None, reason=MISSING)
def test_a_conversation_is_not_reached_as_a_session(tmp_path: Path) -> None:
    """With `--state`, a conversation's record sits in the store under its key, beside the
    sessions: `Mcp-Session-Id: conversation-anonymous` used to adopt it as a session (a second
    upstream and Visor state for the conversation), and a DELETE with it ended its record."""
    (tmp_path / "redis").mkdir()
    store = RedisServer(tmp_path / "redis")
    store.start()
    try:
        with serve(
            tmp_path, [sys.executable, str(MAILBOX)], "--server-name", "mail", "--state", store.url,
            policy=MAIL_POLICY, env={"MAILBOX_LOG": str(tmp_path / "mailbox.jsonl")},
        ) as gw:  # fmt: skip
            headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "ping"}
            reply = post(gw.url, _ping(1, MODERN), **headers)
            assert reply.status == 200 and "pong" in reply.json()["result"]["content"][0]["text"], reply
            key = "conversation-anonymous"
            assert post(gw.url, _ping(2, None), key).status == 404
            assert (
                http("GET", gw.url, None, {"Mcp-Session-Id": key, "Accept": "text/event-stream"}).status
                == 404
            )
            assert http("DELETE", gw.url, None, {"Mcp-Session-Id": key}).status == 404
            events = [(r["event"], r.get("mcp_session")) for r in gw.records()]
            assert ("session_adopted", key) not in events and not any(
                e == "session_adopted" for e, _ in events
            )
    finally:
        store.kill()


def test_an_underscore_spelling_of_a_routing_header_is_another_reading(tmp_path: Path) -> None:
    """`Mcp_Name: ping` beside `Mcp-Name: read_inbox`: a CGI/WSGI router (HTTP_MCP_NAME) or a
    proxy that rewrites `_` to `-` reads a name Visor does not; refused like a repeated header."""
    log = tmp_path / "mailbox.jsonl"
    with serve(
        tmp_path, [sys.executable, str(MAILBOX)], "--server-name", "mail", policy=MAIL_POLICY,
        env={"MAILBOX_LOG": str(log)},
    ) as gw:  # fmt: skip
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": _ping(1, MODERN)["params"]}
        call["params"]["name"] = "read_inbox"  # type: ignore[index]
        base = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "read_inbox"}
        for extra in ({"Mcp_Name": "ping"}, {"MCP_PROTOCOL_VERSION": MODERN}, {"Mcp_Session_Id": "x"}):
            reply = post(gw.url, call, **base, **extra)
            assert reply.status == 400 and "more than once" in reply.json()["error"]["message"], (
                extra,
                reply,
            )
        assert post(gw.url, call, **base).status == 200
    assert [json.loads(line)["tool"] for line in log.read_text().splitlines()] == ["read_inbox"]
