"""HttpUpstream against the real MCP SDK server run with transport "streamable-http"."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from http_helpers import Driver, run, sdk_server

from visor.http.headers import parse_headers
from visor.http.upstream import AuthRequired, HttpUpstream, HttpUpstreamConfig


@pytest.mark.parametrize("mode", ["sse", "json"])
def test_initialize_list_and_call(mode: str) -> None:
    flags = ("--json",) if mode == "json" else ()
    with sdk_server(*flags) as url:

        async def main() -> None:
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            init = await d.initialize()
            assert init["result"]["serverInfo"]["name"] == "visor-http-test-server"
            assert up.session_id and up.protocol_version == init["result"]["protocolVersion"]
            listing, _ = await d.call("tools/list", {})
            assert {t["name"] for t in listing["result"]["tools"]} >= {"add", "slow_count", "confirm"}
            result, _ = await d.call("tools/call", {"name": "add", "arguments": {"a": 2, "b": 40}})
            assert result["result"]["content"][0]["text"] == "42"
            failed, _ = await d.call("tools/call", {"name": "fail", "arguments": {"reason": "nope"}})
            assert failed["result"]["isError"] is True
            await up.close()

        run(main)


def test_progress_notifications_stream_before_the_result() -> None:
    with sdk_server() as url:

        async def main() -> None:
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            await d.initialize()
            result, before = await d.call(
                "tools/call", {"name": "slow_count", "arguments": {"n": 3}, "_meta": {"progressToken": "p1"}}
            )
            assert result["result"]["content"][0]["text"] == "counted 3"
            progress = [
                m["params"]["progress"] for m in before if m.get("method") == "notifications/progress"
            ]
            assert progress == [1, 2, 3]
            assert all(m["params"]["progressToken"] == "p1" for m in before)
            await up.close()

        run(main)


def test_server_to_client_request_answered_by_posting_the_response() -> None:
    with sdk_server() as url:

        async def main() -> None:
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            await d.initialize({"elicitation": {"form": {}}})
            await d.send(
                {"jsonrpc": "2.0", "id": 99, "method": "tools/call",
                 "params": {"name": "confirm", "arguments": {"question": "go?"}}}
            )  # fmt: skip
            ask = await d.recv()
            assert ask is not None and ask["method"] == "elicitation/create" and "id" in ask
            assert ask["params"]["message"] == "go?"
            await d.send(
                {"jsonrpc": "2.0", "id": ask["id"], "result": {"action": "accept", "content": {"ok": True}}}
            )
            answer = await d.recv()
            assert answer is not None and answer["id"] == 99
            assert answer["result"]["content"][0]["text"] == "accepted ok=True"
            await up.close()

        run(main)


def test_session_id_is_sent_and_delete_ends_the_session() -> None:
    with sdk_server() as url:

        async def main() -> None:
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            await d.initialize()
            sid = up.session_id
            assert sid
            # The SDK server refuses a request without the session id (400): the listing
            # working shows the id went with it.
            listing, _ = await d.call("tools/list", {})
            assert "result" in listing
            await up.close()
            async with aiohttp.ClientSession() as s, s.post(
                url,
                data=b'{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{}}',
                headers={"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
                         "Mcp-Session-Id": sid, "MCP-Protocol-Version": up.protocol_version or ""},
            ) as resp:  # fmt: skip
                assert resp.status == 404  # DELETE ended it on the server

        run(main)


def test_a_broken_stream_is_resumed_with_last_event_id() -> None:
    with sdk_server("--event-store", "--retry-ms", "50") as url:

        async def main() -> None:
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            await d.initialize()
            result, before = await d.call(
                "tools/call",
                {"name": "break_then_finish", "arguments": {"n": 2}, "_meta": {"progressToken": 7}},
            )
            assert result["result"]["content"][0]["text"] == "finished after the break (2)"
            messages = [m["params"]["message"] for m in before if m.get("method") == "notifications/progress"]
            assert messages == ["before the break", "after the break 1", "after the break 2"]
            await up.close()

        run(main)


def test_401_is_a_clear_error_and_a_header_from_the_environment_passes() -> None:
    with sdk_server("--token-env", "VISOR_TEST_TOKEN", env={"VISOR_TEST_TOKEN": "s3cret-t0ken"}) as url:

        async def refused() -> None:
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            await d.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
            answer = await d.recv()
            assert answer is not None and answer["id"] == 1
            text = answer["error"]["message"]
            assert url in text and "401" in text and "Authorization" in text
            assert 'WWW-Authenticate: Bearer realm="visor-test"' in text and "OAuth" in text
            assert await d.recv() is None  # the stream of messages ends
            assert isinstance(up.failure, AuthRequired)
            await up.close()

        run(refused)

        headers = parse_headers(
            ["Authorization: Bearer ${TOKEN_FOR_TEST}"], {"TOKEN_FOR_TEST": "s3cret-t0ken"}
        )

        async def accepted() -> None:
            up = HttpUpstream(HttpUpstreamConfig(url, headers=headers))
            d = Driver(up)
            init = await d.initialize()
            assert "result" in init
            result, _ = await d.call("tools/call", {"name": "add", "arguments": {"a": 1, "b": 1}})
            assert result["result"]["content"][0]["text"] == "2"
            await up.close()

        run(accepted)


def test_a_2026_07_28_request_carries_its_revision_and_method_headers() -> None:
    with sdk_server() as url:

        async def main() -> None:
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            meta = {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "visor-http-test", "version": "0"},
            }
            result, _ = await d.call(
                "tools/call", {"name": "add", "arguments": {"a": 3, "b": 4}, "_meta": meta}
            )
            assert result["result"]["content"][0]["text"] == "7", result
            assert up.session_id is None
            await up.close()

        run(main)


MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "visor-http-test", "version": "0"},
}


@pytest.mark.parametrize("modern", [False, True], ids=["2025-11-25", "2026-07-28"])
def test_a_cancelled_call_stops_on_the_server_and_gets_no_made_up_answer(
    modern: bool, tmp_path: Path
) -> None:
    marker = tmp_path / "cancelled"
    with sdk_server(env={"SLEEP_CANCELLED_FILE": str(marker)}) as url:

        async def main() -> None:
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            meta = {"_meta": MODERN_META} if modern else {}
            if not modern:
                await d.initialize()
            await d.send(
                {"jsonrpc": "2.0", "id": "slow", "method": "tools/call",
                 "params": {"name": "sleep_for", "arguments": {"seconds": 30},
                            "_meta": {**meta.get("_meta", {}), "progressToken": "p"}}}
            )  # fmt: skip
            started = await d.recv()  # the tool is running on the server
            assert started is not None and started["method"] == "notifications/progress"
            await d.send(
                {"jsonrpc": "2.0", "method": "notifications/cancelled",
                 "params": {"requestId": "slow", "reason": "changed my mind", **meta}}
            )  # fmt: skip
            # Nothing Visor made up for the cancelled call; a server's own answer to it passes
            # (the SDK answers -32800 on 2025-11-25; on 2026-07-28 the closed stream is the end).
            result, before = await d.call(
                "tools/call", {"name": "add", "arguments": {"a": 1, "b": 2}, **meta}
            )
            assert result["result"]["content"][0]["text"] == "3"
            server_said = {
                "jsonrpc": "2.0",
                "id": "slow",
                "error": {"code": -32800, "message": "Request cancelled"},
            }
            assert before == [] if modern else before in ([], [server_said])
            # The server's tool saw the cancellation: on 2026-07-28 only because the stream closed.
            for _ in range(400):
                if marker.exists():
                    break
                await asyncio.sleep(0.05)
            assert marker.read_text() == "cancelled"
            await up.close()
            assert await d.recv() is None

        run(main)


def test_2026_07_28_arguments_marked_x_mcp_header_are_mirrored_into_mcp_param_headers() -> None:
    with sdk_server() as url:

        async def main() -> None:
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            call = {"name": "locate", "arguments": {"region": "eu-wëst", "limit": 3}, "_meta": MODERN_META}
            # Before any listing Visor knows no marks: the SDK server refuses the call.
            early, _ = await d.call("tools/call", call)
            assert "error" in early or early["result"].get("isError"), early
            listing, _ = await d.call("tools/list", {"_meta": MODERN_META})
            assert any(t["name"] == "locate" for t in listing["result"]["tools"])
            result, _ = await d.call("tools/call", call)
            assert result["result"]["content"][0]["text"] == "eu-wëst:3", result
            await up.close()

        run(main)
