"""HttpUpstream against a misbehaving server (aiohttp.web on loopback, in the test's own loop):
what it sends refused as on stdio, and the transport's headers and statuses exactly."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web
from http_helpers import Driver, run

from visor.http.headers import HeaderError, encode_header_value, parse_headers
from visor.http.target import display_url
from visor.http.upstream import HttpUpstream, HttpUpstreamConfig, SessionExpired

Handler = Callable[[web.Request, dict[str, Any] | None], Awaitable[web.StreamResponse]]

INIT_RESULT = {
    "protocolVersion": "2025-11-25",
    "capabilities": {},
    "serverInfo": {"name": "fake", "version": "0"},
}


@contextlib.asynccontextmanager
async def fake_server(handler: Handler) -> AsyncIterator[tuple[str, list[web.Request]]]:
    seen: list[web.Request] = []

    async def entry(request: web.Request) -> web.StreamResponse:
        seen.append(request)
        body = orjson.loads(await request.read()) if request.method == "POST" else None
        return await handler(request, body)

    app = web.Application()
    app.router.add_route("*", "/mcp", entry)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/mcp", seen
    finally:
        await runner.cleanup()


def answer(body: dict[str, Any] | None, result: dict[str, Any]) -> bytes:
    assert body is not None
    return orjson.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result})


async def sse(request: web.Request, events: list[bytes]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for e in events:
        await resp.write(e)
    await resp.write_eof()
    return resp


BAD_BODIES = {
    "duplicate keys": b'{"jsonrpc":"2.0","id":1,"result":{"a":1},"result":{"a":2}}',
    "batches are not accepted": b'[{"jsonrpc":"2.0","id":1,"result":{}}]',
    "not valid JSON": b'{"jsonrpc":"2.0","id":1,"result":{"t":"a\nb"}}',
    "byte order mark": b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"result":{}}',
}


@pytest.mark.parametrize("reason", sorted(BAD_BODIES))
def test_a_bad_json_body_is_refused_and_the_request_answered_with_an_error(reason: str) -> None:
    async def handler(request: web.Request, body: dict[str, Any] | None) -> web.StreamResponse:
        return web.Response(body=BAD_BODIES[reason], content_type="application/json")

    async def main() -> None:
        async with fake_server(handler) as (url, _):
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            await d.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
            got = await d.recv()
            assert got is not None and got["id"] == 1 and reason in got["error"]["message"]
            assert "result" not in got
            await up.close()
            assert await d.recv() is None  # nothing else was handed on

    run(main)


def test_bad_events_are_dropped_and_the_valid_answer_after_them_passes() -> None:
    big = b'{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"' + b"x" * 600 + b'"}}'

    async def handler(request: web.Request, body: dict[str, Any] | None) -> web.StreamResponse:
        return await sse(
            request,
            [
                b"data: " + big + b"\n\n",  # over the event cap
                b'data: {"jsonrpc":"2.0","method":"a","method":"b"}\n\n',  # duplicate keys
                b'data: [{"jsonrpc":"2.0","method":"a"}]\n\n',  # a batch
                b'data: {"jsonrpc":"2.0","method":"notifications/progress",\r\ndata: "params":{"progress":1}}\r\n\r\n',
                b"data: " + answer(body, {"ok": True}) + b"\n\n",
            ],
        )

    async def main() -> None:
        async with fake_server(handler) as (url, _):
            up = HttpUpstream(HttpUpstreamConfig(url, max_event_bytes=512))
            d = Driver(up)
            response, before = await d.call("tools/list", {})
            assert response["result"] == {"ok": True}
            assert before == [
                {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}
            ]
            await up.close()

    run(main)


def test_only_message_events_are_read_as_the_sdk_client_reads_them() -> None:
    # The MCP SDK client hands on `message` events only (case-sensitive) and skips the rest; a
    # server must not be able to show a client through Visor what it would not see directly.
    async def handler(request: web.Request, body: dict[str, Any] | None) -> web.StreamResponse:
        other = b'{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"forward to eve"}}'
        return await sse(
            request,
            [
                b"event: foo\ndata: " + other + b"\n\n",
                b"event: Message\ndata: " + other + b"\n\n",
                b"event: message\ndata: " + answer(body, {"ok": True}) + b"\n\n",
            ],
        )

    async def main() -> None:
        async with fake_server(handler) as (url, _):
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            response, before = await d.call("tools/list", {})
            assert response["result"] == {"ok": True} and before == []
            await up.close()

    run(main)


@pytest.mark.parametrize("stall", ["before the head", "inside the body", "between events"])
def test_a_server_that_stalls_gets_the_request_answered_after_the_read_timeout(stall: str) -> None:
    # A server that accepted the request and then sends nothing: the client is never left waiting
    # (as the MCP SDK client, which gives up after its read timeout).
    async def handler(request: web.Request, body: dict[str, Any] | None) -> web.StreamResponse:
        if stall == "before the head":
            await asyncio.sleep(2)
        if stall == "inside the body":
            resp = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "100"})
            await resp.prepare(request)
            await resp.write(b'{"jsonrpc":"2.0",')
        else:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b'data: {"jsonrpc":"2.0","method":"notifications/progress","params":{}}\n\n')
        await asyncio.sleep(2)
        return resp

    async def main() -> None:
        async with fake_server(handler) as (url, _):
            up = HttpUpstream(HttpUpstreamConfig(url, read_timeout=0.5))
            d = Driver(up)
            await d.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
            got = await asyncio.wait_for(d.recv(), 20)
            while got is not None and "id" not in got:  # the progress notification
                got = await asyncio.wait_for(d.recv(), 20)
            assert got is not None and got["id"] == 1 and got["error"]["message"].startswith("Visor:")
            await up.close(grace=0)

    run(main)


def test_an_oversize_body_and_a_wrong_content_type_are_refused() -> None:
    async def handler(request: web.Request, body: dict[str, Any] | None) -> web.StreamResponse:
        assert body is not None
        if body["method"] == "big":
            return web.Response(body=answer(body, {"pad": "y" * 5000}), content_type="application/json")
        return web.Response(body=answer(body, {}), content_type="text/html")

    async def main() -> None:
        async with fake_server(handler) as (url, _):
            up = HttpUpstream(HttpUpstreamConfig(url, max_body_bytes=1000))
            d = Driver(up)
            big, _ = await d.call("big", {})
            assert "over the 1000-byte limit" in big["error"]["message"]
            html, _ = await d.call("html", {})
            assert "Content-Type 'text/html'" in html["error"]["message"]
            await up.close()

    run(main)


def test_a_stream_that_ends_without_ids_or_answer_gets_an_error_answer() -> None:
    async def handler(request: web.Request, body: dict[str, Any] | None) -> web.StreamResponse:
        return await sse(
            request, [b'data: {"jsonrpc":"2.0","method":"notifications/progress","params":{}}\n\n']
        )

    async def main() -> None:
        async with fake_server(handler) as (url, seen):
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            response, before = await d.call("tools/list", {})
            assert "ended before the answer" in response["error"]["message"]
            assert len(before) == 1
            assert [r.method for r in seen] == ["POST"]  # no resumption attempted without an id
            await up.close()

    run(main)


def test_session_headers_get_stream_405_and_delete() -> None:
    async def handler(request: web.Request, body: dict[str, Any] | None) -> web.StreamResponse:
        if request.method == "GET":
            return web.Response(status=405)
        if request.method == "DELETE":
            return web.Response(status=200)
        assert body is not None
        if body.get("method") == "initialize":
            return web.Response(
                body=answer(body, INIT_RESULT),
                content_type="application/json",
                headers={"Mcp-Session-Id": "sid-1"},
            )
        if "id" not in body:
            return web.Response(status=202)
        return web.Response(body=answer(body, {}), content_type="application/json")

    async def main() -> None:
        async with fake_server(handler) as (url, seen):
            up = HttpUpstream(HttpUpstreamConfig(url, headers=parse_headers(["X-Team: blue"], {})))
            d = Driver(up)
            await d.initialize()
            await d.call("tools/list", {})
            # The GET stream opens on its own task after notifications/initialized: wait for it.
            for _ in range(500):
                if any(r.method == "GET" for r in seen):
                    break
                await asyncio.sleep(0.01)
            await up.close()
            methods = [r.method for r in seen]
            assert methods[0] == "POST" and methods[-1] == "DELETE" and "GET" in methods
            first, later = seen[0], seen[1:]
            assert first.headers["Accept"] == "application/json, text/event-stream"
            assert first.headers["Content-Type"] == "application/json"
            assert "Mcp-Session-Id" not in first.headers and "MCP-Protocol-Version" not in first.headers
            for r in later:
                assert r.headers["Mcp-Session-Id"] == "sid-1", r.method
                assert r.headers["MCP-Protocol-Version"] == "2025-11-25", r.method
                assert r.headers["X-Team"] == "blue"
            assert seen[methods.index("GET")].headers["Accept"] == "text/event-stream"

    run(main)


def test_server_messages_on_the_get_stream_are_handed_on() -> None:
    async def handler(request: web.Request, body: dict[str, Any] | None) -> web.StreamResponse:
        if request.method == "GET":
            return await sse(
                request,
                [b'id: g1\ndata: {"jsonrpc":"2.0","id":"s1","method":"roots/list"}\n\n',
                 b'data: {"jsonrpc":"2.0","method":"x","method":"y"}\n\n'],
            )  # fmt: skip
        assert body is not None
        if body.get("method") == "initialize":
            return web.Response(body=answer(body, INIT_RESULT), content_type="application/json")
        return web.Response(status=202)

    async def main() -> None:
        async with fake_server(handler) as (url, _):
            up = HttpUpstream(HttpUpstreamConfig(url, max_reconnects=0))
            d = Driver(up)
            await d.initialize()
            request = await d.recv()
            assert request == {"jsonrpc": "2.0", "id": "s1", "method": "roots/list"}
            await up.close()

    run(main)


def test_404_for_the_session_ends_the_upstream_as_expired() -> None:
    async def handler(request: web.Request, body: dict[str, Any] | None) -> web.StreamResponse:
        if request.method != "POST":
            return web.Response(status=405)
        assert body is not None
        if body.get("method") == "initialize":
            return web.Response(
                body=answer(body, INIT_RESULT),
                content_type="application/json",
                headers={"Mcp-Session-Id": "sid-2"},
            )
        if "id" not in body:
            return web.Response(status=202)
        return web.Response(status=404)

    async def main() -> None:
        async with fake_server(handler) as (url, seen):
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            await d.initialize()
            response, _ = await d.call("tools/list", {})
            assert "new initialize" in response["error"]["message"]
            assert await d.recv() is None
            assert isinstance(up.failure, SessionExpired)
            await up.close()
            assert "DELETE" not in [r.method for r in seen]

    run(main)


def test_2026_request_headers_mirror_the_body() -> None:
    async def handler(request: web.Request, body: dict[str, Any] | None) -> web.StreamResponse:
        if body is not None and "id" not in body:
            return web.Response(status=202)
        return web.Response(body=answer(body, {"resultType": "complete"}), content_type="application/json")

    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }

    async def main() -> None:
        async with fake_server(handler) as (url, seen):
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            await d.call("tools/call", {"name": "wéather", "arguments": {}, "_meta": meta})
            await d.call("resources/read", {"uri": "file:///a b", "_meta": meta})
            await up.close()
            call, read = seen
            assert call.headers["MCP-Protocol-Version"] == "2026-07-28"
            assert call.headers["Mcp-Method"] == "tools/call"
            assert call.headers["Mcp-Name"] == encode_header_value("wéather").strip()
            assert call.headers["Mcp-Name"].startswith("=?base64?")
            assert read.headers["Mcp-Name"] == "file:///a b"
            assert "Mcp-Session-Id" not in call.headers
            assert [r.method for r in seen] == ["POST", "POST"]  # no GET stream, no DELETE

    run(main)


def test_requests_over_the_in_flight_cap_are_answered_at_once() -> None:

    release = asyncio.Event()

    async def handler(request: web.Request, body: dict[str, Any] | None) -> web.StreamResponse:
        await release.wait()
        return web.Response(body=answer(body, {}), content_type="application/json")

    async def main() -> None:
        async with fake_server(handler) as (url, _):
            up = HttpUpstream(HttpUpstreamConfig(url, max_in_flight=2))
            d = Driver(up)
            for i in (1, 2, 3):
                await d.send({"jsonrpc": "2.0", "id": i, "method": "slow", "params": {}})
            refused = await d.recv()
            assert refused is not None and refused["id"] == 3 and "limit 2" in refused["error"]["message"]
            release.set()
            ids = {(await d.recv() or {}).get("id") for _ in range(2)}
            assert ids == {1, 2}
            await up.close()

    run(main)


def test_header_options() -> None:
    env = {"TOKEN": "abc", "EMPTY": ""}
    (h,) = parse_headers(["Authorization: Bearer ${TOKEN}"], env)
    assert (h.name, h.value) == ("Authorization", "Bearer abc")
    assert "abc" not in repr(h)
    assert parse_headers(["X-Cost: $5 ${EMPTY}"], env)[0].value == "$5"
    cases = {
        "Authorization: Bearer ${MISSING_VAR}": "environment variable MISSING_VAR is not set",
        "no colon": "Name: value",
        "Bad Name: x": "valid header name",
        "Mcp-Session-Id: x": "sets this header itself",
        "X-A: ${1BAD}": "not a valid environment variable name",
    }
    for option, message in cases.items():
        with pytest.raises(HeaderError, match=message):
            parse_headers([option], env)
    with pytest.raises(HeaderError, match="control character") as info:
        parse_headers(["X-A: ${TOKEN}"], {"TOKEN": "line\nbreak"})
    assert "line" not in str(info.value)
    with pytest.raises(HeaderError, match="given twice"):
        parse_headers(["X-A: 1", "x-a: 2"], env)


def test_urls_shown_without_secrets() -> None:
    assert (
        display_url("https://user:pw@example.test:8443/mcp?key=secret") == "https://example.test:8443/mcp?…"
    )


def test_a_tiny_queue_holds_the_stream_back_and_loses_nothing() -> None:
    async def handler(request: web.Request, body: dict[str, Any] | None) -> web.StreamResponse:
        notes = [
            b'data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":%d}}\n\n' % i
            for i in range(50)
        ]
        return await sse(request, [*notes, b"data: " + answer(body, {}) + b"\n\n"])

    async def main() -> None:
        async with fake_server(handler) as (url, _):
            up = HttpUpstream(HttpUpstreamConfig(url, max_queued=1))
            d = Driver(up)
            response, before = await d.call("tools/list", {})
            assert response["result"] == {}
            assert [m["params"]["progress"] for m in before] == list(range(50))
            assert up._inbox.maxsize == 1
            await up.close()

    run(main)


def test_messages_pipelined_behind_initialize_wait_for_its_session_id() -> None:
    async def handler(request: web.Request, body: dict[str, Any] | None) -> web.StreamResponse:
        if request.method != "POST":
            return web.Response(status=405)
        assert body is not None
        if body.get("method") == "initialize":
            return web.Response(
                body=answer(body, INIT_RESULT),
                content_type="application/json",
                headers={"Mcp-Session-Id": "sid-3"},
            )
        if "id" not in body:
            return web.Response(status=202)
        return web.Response(body=answer(body, {}), content_type="application/json")

    async def main() -> None:
        async with fake_server(handler) as (url, seen):
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            await d.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
            await d.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            await d.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
            got = [await d.recv(), await d.recv()]
            assert [m["id"] for m in got if m] == [1, 2]
            await up.close()
            posts = [r for r in seen if r.method == "POST"]
            assert len(posts) == 3 and "Mcp-Session-Id" not in posts[0].headers
            assert all(r.headers["Mcp-Session-Id"] == "sid-3" for r in posts[1:])

    run(main)


def test_an_http_error_is_answered_with_its_status_and_the_servers_own_words() -> None:
    async def handler(request: web.Request, body: dict[str, Any] | None) -> web.StreamResponse:
        assert body is not None
        if body["method"] == "mine":  # the JSON-RPC error for this very request: passed on as it is
            err = {"jsonrpc": "2.0", "id": body["id"], "error": {"code": -32601, "message": "no such method"}}
            return web.Response(status=404, body=orjson.dumps(err), content_type="application/json")
        err = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Missing session ID"}}
        return web.Response(status=400, body=orjson.dumps(err), content_type="application/json")

    async def main() -> None:
        async with fake_server(handler) as (url, _):
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            mine, _ = await d.call("mine", {})
            assert mine["error"] == {"code": -32601, "message": "no such method"}
            other, _ = await d.call("other", {})
            assert other["error"]["code"] == -32000
            assert (
                other["error"]["message"]
                == f"Visor: the upstream {url} answered HTTP 400 Bad Request: Missing session ID"
            )
            await up.close()

    run(main)


def test_the_get_stream_reconnects_from_its_last_event_id() -> None:
    gets: list[str | None] = []

    async def handler(request: web.Request, body: dict[str, Any] | None) -> web.StreamResponse:
        if request.method == "GET":
            gets.append(request.headers.get("Last-Event-ID"))
            n = len(gets)
            return await sse(
                request, [b'retry: 10\nid: g%d\ndata: {"jsonrpc":"2.0","method":"n%d"}\n\n' % (n, n)]
            )
        if request.method == "DELETE":
            return web.Response(status=200)
        assert body is not None
        if body.get("method") == "initialize":
            return web.Response(body=answer(body, INIT_RESULT), content_type="application/json")
        return web.Response(status=202)

    async def main() -> None:
        async with fake_server(handler) as (url, _):
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            await d.initialize()
            got = [await d.recv() for _ in range(3)]
            assert [m["method"] for m in got if m] == ["n1", "n2", "n3"]
            await up.close()
            assert gets[:3] == [None, "g1", "g2"]

    run(main)


def test_a_redirect_is_not_followed_and_a_bad_session_id_is_refused() -> None:
    async def handler(request: web.Request, body: dict[str, Any] | None) -> web.StreamResponse:
        assert body is not None
        if body["method"] == "initialize":
            return web.Response(
                body=answer(body, INIT_RESULT),
                content_type="application/json",
                headers={"Mcp-Session-Id": "a b"},
            )
        return web.Response(status=307, headers={"Location": "http://elsewhere.test/mcp?token=x"})

    async def main() -> None:
        async with fake_server(handler) as (url, seen):
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            init, _ = await d.call("initialize", {})
            assert "outside visible ASCII" in init["error"]["message"] and up.session_id is None
            moved, _ = await d.call("tools/list", {})
            text = moved["error"]["message"]
            assert "redirected (307) to http://elsewhere.test/mcp?…" in text and "token" not in text
            await up.close()
            assert len(seen) == 2  # the new location was never asked

    run(main)


def test_a_stream_ended_after_the_client_cancelled_gets_no_made_up_answer() -> None:

    cancelled = asyncio.Event()

    async def handler(request: web.Request, body: dict[str, Any] | None) -> web.StreamResponse:
        assert body is not None
        if body["method"] == "notifications/cancelled":
            cancelled.set()
            return web.Response(status=202)
        if body["method"] == "slow":  # the stream ends, unanswered, once the client cancelled
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await cancelled.wait()
            await resp.write_eof()
            return resp
        return web.Response(body=answer(body, {"n": 1}), content_type="application/json")

    async def main() -> None:
        async with fake_server(handler) as (url, _):
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            await d.send({"jsonrpc": "2.0", "id": 1, "method": "slow", "params": {}})
            await d.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}})
            await cancelled.wait()
            d.next_id = 2
            response, before = await d.call("next", {})
            assert response["result"] == {"n": 1} and before == []
            await up.close()
            assert await d.recv() is None

    run(main)


def test_x_mcp_header_marks_and_their_headers() -> None:
    from visor.http.params import header_map, param_headers

    schema = {
        "type": "object",
        "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "opts": {"type": "object", "properties": {"dry": {"type": "boolean", "x-mcp-header": "Dry"}}},
            "n": {"type": "integer", "x-mcp-header": "N", "default": {"x-mcp-header": "data, not a mark"}},
        },
    }
    marks = header_map(schema)
    assert marks == {("region",): "Region", ("opts", "dry"): "Dry", ("n",): "N"}
    assert isinstance(marks, dict)
    assert param_headers(marks, {"region": " padded", "opts": {"dry": False}, "n": None}) == {
        "Mcp-Param-Region": "=?base64?IHBhZGRlZA==?=",
        "Mcp-Param-Dry": "false",
    }
    invalid = {
        "outside a chain": {"items": {"x-mcp-header": "X", "type": "string"}},
        "not a header name token": {"properties": {"a": {"type": "string", "x-mcp-header": "A B"}}},
        "only allowed on string": {"properties": {"a": {"type": "number", "x-mcp-header": "A"}}},
        "repeats": {"properties": {"a": {"type": "string", "x-mcp-header": "A"},
                                   "b": {"type": "string", "x-mcp-header": "a"}}},
    }  # fmt: skip
    for reason, bad in invalid.items():
        got = header_map(bad)
        assert isinstance(got, str) and reason in got, (reason, got)
    with pytest.raises(HeaderError, match="sets this header itself"):
        parse_headers(["Mcp-Param-Region: x"], {})


def test_a_close_without_grace_ends_a_graceful_close_and_deletes_once() -> None:

    release = asyncio.Event()

    async def handler(request: web.Request, body: dict[str, Any] | None) -> web.StreamResponse:
        if request.method == "DELETE":
            return web.Response(status=200)
        assert body is not None
        if body.get("method") == "initialize":
            return web.Response(
                body=answer(body, INIT_RESULT),
                content_type="application/json",
                headers={"Mcp-Session-Id": "s"},
            )
        if "id" not in body:
            return web.Response(status=202)
        await release.wait()  # a request the server never answers while the test runs
        return web.Response(status=500)

    async def main() -> None:
        async with fake_server(handler) as (url, seen):
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            await d.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
            assert await d.recv() is not None
            await d.send({"jsonrpc": "2.0", "id": 2, "method": "stuck", "params": {}})
            while not any(r.method == "POST" and r.headers.get("Mcp-Session-Id") for r in seen):
                await asyncio.sleep(0.01)
            graceful = asyncio.ensure_future(up.close(grace=1000))
            await asyncio.sleep(0)
            await up.close()  # returns without waiting out the grace (run() gives up after 60 s)
            await graceful
            assert [r.method for r in seen].count("DELETE") == 1
            release.set()

    run(main)


def test_a_message_naming_its_own_revision_inside_a_session_is_never_sent() -> None:
    # Sent, it would go without Mcp-Session-Id (as a 2026-07-28 request): judged in the session,
    # run outside it, in the upstream's sessionless context.
    async def handler(request: web.Request, body: dict[str, Any] | None) -> web.StreamResponse:
        if request.method in ("GET", "DELETE"):
            return web.Response(status=405 if request.method == "GET" else 200)
        assert body is not None
        if body.get("method") == "initialize":
            return web.Response(
                body=answer(body, INIT_RESULT),
                content_type="application/json",
                headers={"Mcp-Session-Id": "s1"},
            )
        if "id" not in body:
            return web.Response(status=202)
        return web.Response(body=answer(body, {"ok": True}), content_type="application/json")

    async def main() -> None:
        async with fake_server(handler) as (url, seen):
            up = HttpUpstream(HttpUpstreamConfig(url))
            d = Driver(up)
            await d.initialize()
            meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
            response, _ = await d.call("tools/call", {"name": "ping", "arguments": {}, "_meta": meta})
            assert "error" in response and "negotiated session" in response["error"]["message"]
            ordinary, _ = await d.call("tools/call", {"name": "ping", "arguments": {}})
            assert ordinary["result"] == {"ok": True}
            await up.close()
            posts = [r for r in seen if r.method == "POST"]
            assert all(r.headers.get("Mcp-Session-Id") == "s1" for r in posts[1:]), "left the session"

    run(main)
