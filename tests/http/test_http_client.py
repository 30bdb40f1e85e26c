"""visor.http.client against real sockets: servers on loopback that answer with exact bytes
(so each case is the response a server really sent), and one real aiohttp server.

What is asserted is what the upstream session relies on: connections kept and used again only
when the last response was read to its end and the server allowed it; bodies framed by llhttp
(chunked, Content-Length, the end of the connection) and handed on as they arrive; content
codings decoded or refused; header sections capped; a cut response an error, never a short body
taken as whole; no header line a caller's value can add.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import ssl
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from visor.http import client as client_mod
from visor.http.client import ConnectFailed, OriginClient, ResponseBroken, ResponseTooLarge

JSON_OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


@dataclass
class RawServer:
    """Reads each request (head and Content-Length body) and writes what `answer` returns."""

    answer: Callable[[int, bytes], Awaitable[bytes | None]]
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                self.requests.append(head + body)
                out = await self.answer(len(self.requests), head + body)
                if out is None:
                    writer.close()
                    return
                writer.write(out)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def raw_server(
    answer: Callable[[int, bytes], Awaitable[bytes | None]],
) -> AsyncIterator[tuple[str, RawServer]]:
    state = RawServer(answer)
    server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/mcp", state
    finally:
        server.close()
        for w in state.writers:
            w.close()
        await server.wait_closed()


def fixed(*responses: bytes) -> Callable[[int, bytes], Awaitable[bytes | None]]:
    async def answer(n: int, request: bytes) -> bytes | None:
        return responses[min(n, len(responses)) - 1]

    return answer


def run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(coro(), 30))


async def get(client: OriginClient, limit: int = 1 << 20) -> tuple[int, bytes]:
    async with await client.request("POST", {"Content-Type": "application/json"}, b"{}") as resp:
        return resp.status, await resp.read(limit)


def test_a_connection_is_used_again_for_the_next_request() -> None:
    async def main() -> None:
        async with raw_server(fixed(JSON_OK)) as (url, srv):
            c = OriginClient(url, connect_timeout=5)
            for _ in range(20):
                assert await get(c) == (200, b"{}")
            assert srv.connections == 1
            await c.close()

    run(main)


def test_a_real_aiohttp_server_keeps_one_connection_for_many_requests() -> None:
    async def main() -> None:
        peers: set[object] = set()

        async def echo(request: web.Request) -> web.Response:
            peers.add(request.transport.get_extra_info("peername") if request.transport else None)
            return web.json_response({"got": (await request.read()).decode()})

        app = web.Application()
        app.router.add_post("/mcp", echo)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            c = OriginClient(f"http://127.0.0.1:{port}/mcp", connect_timeout=5)
            for _ in range(10):
                assert await get(c) == (200, b'{"got": "{}"}')
            assert len(peers) == 1
            await c.close()
        finally:
            await runner.cleanup()

    run(main)


def test_connection_close_and_http_1_0_are_not_used_again() -> None:
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    old = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}"

    async def main() -> None:
        for response in (closing, old):
            async with raw_server(fixed(response)) as (url, srv):
                c = OriginClient(url, connect_timeout=5)
                for _ in range(3):
                    assert await get(c) == (200, b"{}")
                assert srv.connections == 3
                await c.close()

    run(main)


def test_a_response_not_read_to_its_end_closes_its_connection() -> None:
    async def main() -> None:
        async with raw_server(fixed(JSON_OK)) as (url, srv):
            c = OriginClient(url, connect_timeout=5)
            async with await c.request("POST", {}, b"{}") as resp:
                assert resp.status == 200  # the body is never read
            assert await get(c) == (200, b"{}")
            assert srv.connections == 2
            await c.close()

    run(main)


def test_an_idle_connection_the_server_closed_is_not_used() -> None:
    async def main() -> None:
        async def answer(n: int, request: bytes) -> bytes | None:
            return JSON_OK

        async with raw_server(answer) as (url, srv):
            c = OriginClient(url, connect_timeout=5)
            assert await get(c) == (200, b"{}")
            srv.writers[0].close()  # the server ends the idle keep-alive connection
            await asyncio.sleep(0.1)
            assert await get(c) == (200, b"{}")
            assert srv.connections == 2
            await c.close()

    run(main)


def test_unasked_bytes_on_an_idle_connection_retire_it() -> None:
    async def main() -> None:
        async with raw_server(fixed(JSON_OK + JSON_OK)) as (url, srv):
            c = OriginClient(url, connect_timeout=5)
            # The first answer carries a second response nobody asked for: that connection is
            # not in a state to read the next answer from.
            assert await get(c) == (200, b"{}")
            await asyncio.sleep(0.05)
            assert await get(c) == (200, b"{}")
            assert srv.connections == 2
            await c.close()

    run(main)


def test_an_idle_connection_past_the_keepalive_time_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_mod, "KEEPALIVE_SECONDS", 0.05)

    async def main() -> None:
        async with raw_server(fixed(JSON_OK)) as (url, srv):
            c = OriginClient(url, connect_timeout=5)
            assert await get(c) == (200, b"{}")
            await asyncio.sleep(0.2)
            assert await get(c) == (200, b"{}")
            assert srv.connections == 2
            await c.close()

    run(main)


BODIES = {
    "chunked": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n",
        b"abcdefg",
    ),
    "chunked with extensions and trailers": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nX-T: 1\r\n\r\n",
        b"abc",
    ),
    "gzip": (
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n"
        % len(gzip.compress(b"x" * 5000))
        + gzip.compress(b"x" * 5000),
        b"x" * 5000,
    ),
    "deflate (zlib)": (
        b"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nContent-Length: %d\r\n\r\n"
        % len(zlib.compress(b"yz" * 99))
        + zlib.compress(b"yz" * 99),
        b"yz" * 99,
    ),
    "an interim 103 first": (
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + JSON_OK,
        b"{}",
    ),
}


@pytest.mark.parametrize("case", sorted(BODIES))
def test_bodies_are_framed_and_decoded(case: str) -> None:
    wire, expected = BODIES[case]

    async def main() -> None:
        async with raw_server(fixed(wire)) as (url, srv):
            c = OriginClient(url, connect_timeout=5)
            assert await get(c) == (200, expected)
            assert await get(c) == (200, expected)  # and the connection is reusable after it
            assert srv.connections == 1
            await c.close()

    run(main)


def test_raw_deflate_as_some_servers_send_it_is_read() -> None:
    obj = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    raw = obj.compress(b"hello " * 50) + obj.flush()
    wire = b"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nContent-Length: %d\r\n\r\n%s" % (len(raw), raw)

    async def main() -> None:
        async with raw_server(fixed(wire)) as (url, _):
            c = OriginClient(url, connect_timeout=5)
            assert await get(c) == (200, b"hello " * 50)
            await c.close()

    run(main)


def test_a_body_that_ends_with_the_connection_is_read_and_not_kept() -> None:
    async def main() -> None:
        async def answer(n: int, request: bytes) -> bytes | None:
            return b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"until":"close"}'

        async def then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(2)
            writer.write(await answer(1, b"") or b"")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(then_close, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        c = OriginClient(f"http://127.0.0.1:{port}/mcp", connect_timeout=5)
        assert await get(c) == (200, b'{"until":"close"}')
        assert await get(c) == (200, b'{"until":"close"}')
        await c.close()
        server.close()

    run(main)


CUT = {
    "Content-Length longer than the body": b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}",
    "a chunk cut short": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc",
    "no last chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
    "headers cut short": b"HTTP/1.1 200 OK\r\nContent-Le",
}


@pytest.mark.parametrize("case", sorted(CUT))
def test_a_response_cut_short_is_an_error_not_a_short_body(case: str) -> None:
    async def main() -> None:
        async def answer(n: int, request: bytes) -> bytes | None:
            return CUT[case]

        async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(2)
            writer.write(await answer(1, b"") or b"")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(cut, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        c = OriginClient(f"http://127.0.0.1:{port}/mcp", connect_timeout=5)
        with pytest.raises(ResponseBroken):
            await get(c)
        await c.close()
        server.close()

    run(main)


BROKEN = {
    "not HTTP": b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    "Content-Length and chunked both": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    ),
    "two different Content-Lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}x",
    "a bare LF inside a header value": b"HTTP/1.1 200 OK\r\nX-A: a\rb\r\nContent-Length: 2\r\n\r\n{}",
    "an unknown content coding": b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 2\r\n\r\n{}",
    "corrupt gzip": b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\nabcd",
    "a header section over the cap": (
        b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 1000) for i in range(70)) + b"\r\n"
    ),
    "protocol switch": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
    "interim responses without end": b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" * 17 + JSON_OK,
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_response_that_breaks_http_is_refused(case: str) -> None:
    async def main() -> None:
        async with raw_server(fixed(BROKEN[case])) as (url, _):
            c = OriginClient(url, connect_timeout=5)
            with pytest.raises(ResponseBroken):
                await get(c)
            await c.close()

    run(main)


def test_a_body_over_the_limit_is_refused_while_it_streams() -> None:
    big = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"a" * 100000

    async def main() -> None:
        async with raw_server(fixed(big)) as (url, _):
            c = OriginClient(url, connect_timeout=5)
            with pytest.raises(ResponseTooLarge):
                await get(c, limit=1000)
            await c.close()

    run(main)


def test_an_event_stream_is_handed_on_before_it_ends() -> None:
    async def main() -> None:
        release = asyncio.Event()

        async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(2)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            writer.write(b"6\r\ndata: \r\n")
            await writer.drain()
            await release.wait()
            writer.write(b"3\r\n1\n\n\r\n0\r\n\r\n")
            await writer.drain()

        server = await asyncio.start_server(stream, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        c = OriginClient(f"http://127.0.0.1:{port}/mcp", connect_timeout=5)
        async with await c.request("POST", {}, b"{}") as resp:
            assert resp.content_type == "text/event-stream"
            pieces = resp.chunks()
            assert await pieces.__anext__() == b"data: "  # before the server sent the rest
            release.set()
            assert await pieces.__anext__() == b"1\n\n"
            with pytest.raises(StopAsyncIteration):
                await pieces.__anext__()
        await c.close()
        server.close()

    run(main)


def test_cookies_the_origin_sets_are_sent_back_and_removed_when_it_says() -> None:
    def answer_with(*set_cookies: bytes) -> bytes:
        extra = b"".join(b"Set-Cookie: %s\r\n" % c for c in set_cookies)
        return b"HTTP/1.1 200 OK\r\n" + extra + b"Content-Length: 2\r\n\r\n{}"

    responses = [
        answer_with(b"lb=replica-2; Path=/; HttpOnly", b"tls_only=1; Secure", b"gone=1"),
        answer_with(b"gone=; Max-Age=0"),
        JSON_OK,
    ]

    async def main() -> None:
        async with raw_server(fixed(*responses)) as (url, srv):
            c = OriginClient(url, connect_timeout=5)
            for _ in range(3):
                await get(c)
            cookie_lines = [
                [ln for ln in r.split(b"\r\n") if ln.lower().startswith(b"cookie:")] for r in srv.requests
            ]
            assert cookie_lines[0] == []
            assert cookie_lines[1] == [b"Cookie: lb=replica-2; gone=1"]  # Secure: not over http
            assert cookie_lines[2] == [b"Cookie: lb=replica-2"]
            await c.close()

    run(main)


def test_a_cookie_cannot_add_header_lines_or_requests_to_later_requests() -> None:
    # Python's cookie parser decodes octal escapes in a quoted value (\\015\\012 is CR LF): a
    # decoded value written into the Cookie line would end it, and the server would have put a
    # header, or a whole request to a path and Host of its choosing, into each of Visor's.
    smuggle = (
        b'sid="a\\015\\012X-Injected: yes\\015\\012Content-Length: 0\\015\\012\\015\\012'
        b'GET /smuggled HTTP/1.1\\015\\012Host: x\\015\\012X-Pad: "'
    )
    first = b"HTTP/1.1 200 OK\r\nSet-Cookie: " + smuggle + b'\r\nSet-Cookie: ok="v1"\r\n'
    first += b"Set-Cookie: sp=a\\054b\r\nContent-Length: 2\r\n\r\n{}"

    async def main() -> None:
        async with raw_server(fixed(first, JSON_OK)) as (url, srv):
            c = OriginClient(url, connect_timeout=5)
            for _ in range(2):
                await get(c)
            second = srv.requests[1]
            assert second.count(b"HTTP/1.1") == 1 and b"X-Injected" not in second
            assert b"smuggled" not in second
            # A well-formed quoted value goes back exactly as it came.
            cookie = [ln for ln in second.split(b"\r\n") if ln.lower().startswith(b"cookie:")]
            assert cookie == [b'Cookie: ok="v1"']
            await c.close()

    run(main)


def test_the_request_is_what_the_caller_gave_and_no_more() -> None:
    async def main() -> None:
        async with raw_server(fixed(JSON_OK)) as (url, srv):
            c = OriginClient(url + "?team=blue", connect_timeout=5)
            async with await c.request("POST", {"Accept": "application/json", "X-A": "b"}, b'{"x":1}') as r:
                await r.read(100)
            head, _, body = srv.requests[0].partition(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            port = url.split(":")[2].split("/")[0]
            assert lines[0] == b"POST /mcp?team=blue HTTP/1.1"
            assert b"Host: 127.0.0.1:%s" % port.encode() in lines
            assert b"Content-Length: 7" in lines and b"Accept-Encoding: identity" in lines
            assert body == b'{"x":1}'
            for bad in ("a\r\nX-Injected: 1", "a\nb", "a\0b"):
                with pytest.raises(ValueError):
                    await c.request("POST", {"X-A": bad}, b"{}")
            with pytest.raises(ValueError):
                await c.request("POST", {"X-A\r\nX-B": "1"}, b"{}")
            assert len(srv.requests) == 1
            await c.close()

    run(main)


def test_a_refused_connection_is_connect_failed() -> None:
    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        c = OriginClient(f"http://127.0.0.1:{port}/mcp", connect_timeout=5)
        with pytest.raises(ConnectFailed):
            await get(c)
        await c.close()

    run(main)


def test_https_is_verified_against_the_trust_store(tmp_path: Path) -> None:
    """A real TLS server: the request goes through with the server's certificate trusted, and
    is refused (ConnectFailed naming the certificate) with the default trust store."""
    from tests.serve.scaleout import self_signed

    tls = self_signed(tmp_path / "tls")

    async def main() -> None:
        async def hello(request: web.Request) -> web.Response:
            return web.json_response({"tls": request.secure})

        app = web.Application()
        app.router.add_post("/mcp", hello)
        runner = web.AppRunner(app)
        await runner.setup()
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(tls.cert, tls.key)
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
        await site.start()
        url = f"https://127.0.0.1:{runner.addresses[0][1]}/mcp"
        try:
            trusted = OriginClient(url, connect_timeout=5, ssl_context=tls.client_context())
            assert await get(trusted) == (200, b'{"tls": true}')
            assert await get(trusted) == (200, b'{"tls": true}')
            await trusted.close()
            default = OriginClient(url, connect_timeout=5)
            with pytest.raises(ConnectFailed, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
                await get(default)
            await default.close()
        finally:
            await runner.cleanup()

    run(main)


def test_an_address_that_drops_connects_does_not_cost_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The host's first address swallows the SYN (a listener whose backlog is full: the kernel
    drops the connect, as a network that drops IPv6 does); the second answers. Trying one address
    after the other would spend the whole connect timeout on the first; both are tried, the second
    250 ms behind (happy eyeballs), and the request goes through on the second."""
    import socket
    import time

    async def main() -> None:
        hole = socket.socket()
        hole.bind(("127.0.0.1", 0))
        hole.listen(0)
        filler = socket.socket()
        filler.connect(hole.getsockname())  # the one connection the backlog holds
        async with raw_server(fixed(JSON_OK)) as (url, srv):
            real_port = int(url.split(":")[2].split("/")[0])
            addresses = [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", hole.getsockname()),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", real_port)),
            ]

            async def two_addresses(self: object, host: str, port: int, **kw: object) -> list[object]:
                return list(addresses)

            monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", two_addresses)
            c = OriginClient(f"http://dual.test:{real_port}/mcp", connect_timeout=20)
            began = time.monotonic()
            assert await get(c) == (200, b"{}")
            assert time.monotonic() - began < 5, "the dropped address held the request"
            assert srv.connections == 1
            await c.close()
        filler.close()
        hole.close()

    run(main)


def test_a_url_outside_ascii_is_sent_as_ascii() -> None:
    async def main() -> None:
        async with raw_server(fixed(JSON_OK)) as (url, srv):
            c = OriginClient(url.replace("/mcp", "/ünï code/mcp%2Fx") + "?q=é&a=b c", connect_timeout=5)
            assert await get(c) == (200, b"{}")
            request_line = srv.requests[0].split(b"\r\n")[0]
            assert request_line == b"POST /%C3%BCn%C3%AF%20code/mcp%2Fx?q=%C3%A9&a=b%20c HTTP/1.1"
            await c.close()
        assert (
            OriginClient("https://bücher.example/mcp", connect_timeout=5)._host_header
            == "xn--bcher-kva.example"
        )

    run(main)


def _gzip_body(payload: bytes, *, extra: bytes = b"", cut: int = 0) -> bytes:
    body = gzip.compress(payload)
    body = (body[:-cut] if cut else body) + extra
    return b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def test_a_compressed_body_is_decoded_in_bounded_pieces() -> None:
    """64 MiB of zeros gzip to about 64 KB: the pieces handed on stay small, and the caller's
    limit stops the read long before the whole is in memory."""

    async def main() -> None:
        async with raw_server(fixed(_gzip_body(bytes(64 << 20)))) as (url, _):
            c = OriginClient(url, connect_timeout=5)
            async with await c.request("POST", {}, b"{}") as resp:
                sizes = []
                async for piece in resp.chunks():
                    sizes.append(len(piece))
                    if sum(sizes) > 4 << 20:
                        break
            assert max(sizes) <= client_mod._DECODE_STEP
            with pytest.raises(ResponseTooLarge):
                await get(c, limit=1 << 20)
            await c.close()

    run(main)


@pytest.mark.parametrize(
    "case",
    ["cut short", "bytes after the end", "a second member"],
)
def test_a_compressed_body_that_does_not_end_where_its_stream_does_is_refused(case: str) -> None:
    wire = {
        "cut short": _gzip_body(b"hello " * 1000, cut=6),
        "bytes after the end": _gzip_body(b"hello", extra=b"junk"),
        "a second member": _gzip_body(b"hello", extra=gzip.compress(b"smuggled")),
    }[case]

    async def main() -> None:
        async with raw_server(fixed(wire)) as (url, _):
            c = OriginClient(url, connect_timeout=5)
            with pytest.raises(ResponseBroken):
                await get(c)
            await c.close()

    run(main)


@pytest.mark.parametrize("method", ["GET", "DELETE", "POST"])
def test_a_kept_connection_closed_under_a_request_repeats_only_what_is_safe_to_repeat(method: str) -> None:
    """The server answers once on a connection, then closes it as the next request arrives (an
    idle timeout racing the request). GET and DELETE go again on a new connection; a POST, which
    may have run, is an error and is sent once."""
    seen: list[tuple[int, bytes]] = []

    async def main() -> None:
        connections = 0

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            mine = connections
            served = 0
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = next(
                        (
                            int(x.split(b":")[1])
                            for x in head.split(b"\r\n")
                            if x.lower().startswith(b"content-length:")
                        ),
                        0,
                    )
                    if length:
                        await reader.readexactly(length)
                    seen.append((mine, head.split(b" ", 1)[0]))
                    if mine == 1 and served == 1:
                        writer.close()  # the second request on the first connection: closed unanswered
                        return
                    served += 1
                    writer.write(JSON_OK)
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        c = OriginClient(f"http://127.0.0.1:{port}/mcp", connect_timeout=5)
        async with await c.request(method, {}, b"{}" if method == "POST" else None) as r:
            assert await r.read(100) == b"{}"
        if method == "POST":
            with pytest.raises(ResponseBroken):
                await c.request(method, {}, b"{}")
        else:
            async with await c.request(method, {}) as r:
                assert r.status == 200 and await r.read(100) == b"{}"
        await c.close()
        server.close()

    run(main)
    verb = method.encode()
    if method == "POST":
        assert seen == [(1, verb), (1, verb)]  # sent once, never again
    else:
        assert seen == [(1, verb), (1, verb), (2, verb)]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("X-Note", "a\r\nX-Injected: 1"),
        ("X-Note", "a\nX-Injected: 1"),
        ("X-Note", "a\rb"),
        ("X-Note", "a\x00b"),
        ("X-Injected: 1\r\nX-Note", "a"),
        ("X:Note", "a"),
    ],
    ids=[
        "CRLF in a value",
        "LF in a value",
        "CR in a value",
        "NUL in a value",
        "CRLF in a name",
        "colon in a name",
    ],
)
def test_a_field_that_would_split_the_head_is_refused_before_anything_is_sent(name: str, value: str) -> None:
    # Values come from the protocol (a session id) or --header: one holding a line break would add
    # headers, or a whole request, of its author's choosing.
    async def main() -> None:
        async with raw_server(fixed(JSON_OK)) as (url, srv):
            c = OriginClient(url, connect_timeout=5)
            with pytest.raises(ValueError, match="cannot carry"):
                await c.request("POST", {name: value, "Content-Type": "application/json"}, b"{}")
            assert await get(c) == (200, b"{}")  # the client still serves the next request
            assert len(srv.requests) == 1 and b"X-Injected" not in srv.requests[0]
            await c.close()

    run(main)
