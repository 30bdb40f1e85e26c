"""visor.http.client over a unix socket, and as a relay (`relay=True`): what `visor serve --workers N`
forwards a request to the worker holding its session with (visor/serve/workers.py).

Real unix sockets throughout: the project's own `HttpServer` listening on one (keep-alive, HEAD,
streamed answers), and servers that read and write exact bytes (so each case is what was really on
the wire). What is asserted: connections to the socket kept and used again; a socket that is not
there, or that nobody serves, a `ConnectFailed`; a relay sends the caller's fields only, repeated
ones each time, the caller's Host and the target it names, and hands on the answer as it came (its
header names and bytes, its content coding not decoded, no cookie kept); an answer streamed in
pieces as they come, without a cap; the TCP client unchanged (its own Host, User-Agent,
Accept-Encoding and cookies).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from visor.http.client import ConnectFailed, OriginClient
from visor.http.server import HttpServer, Request, Response, StreamResponse


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory whose socket paths fit in sun_path (pytest's tmp_path may not)."""
    path = Path(tempfile.mkdtemp(prefix="vc-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(coro(), 30))


@contextlib.asynccontextmanager
async def http_server(
    path: Path, handler: Callable[[Request], Awaitable[object]]
) -> AsyncIterator[HttpServer]:
    server = HttpServer(handler, max_body=1 << 20)  # type: ignore[arg-type]
    await server.listen_unix(str(path))
    try:
        yield server
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def raw_unix_server(
    path: Path, answer: bytes
) -> AsyncIterator[tuple[list[bytes], list[asyncio.StreamWriter]]]:
    """Reads each request's head (and Content-Length body) and writes `answer`, byte for byte."""
    requests: list[bytes] = []
    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                requests.append(head + body)
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_unix_server(handle, str(path))
    try:
        yield requests, writers
    finally:
        server.close()
        for w in writers:
            w.close()
        await server.wait_closed()


def test_requests_over_a_unix_socket_reuse_one_connection(short_dir: Path) -> None:
    sock = short_dir / "s.sock"

    async def main() -> None:
        transports: set[int] = set()
        seen: list[tuple[str, str, str | None, bytes]] = []

        async def echo(request: Request) -> Response:
            transports.add(id(request.transport))
            body = await request.read()
            seen.append((request.method, request.path, request.headers.get("Host"), body))
            return Response(body=b"got " + body, content_type="application/json")

        async with http_server(sock, echo):
            c = OriginClient("http://worker/mcp", connect_timeout=5, unix_path=str(sock))
            for i in range(10):
                async with await c.request("POST", {"X-N": str(i)}, b"%d" % i) as resp:
                    assert resp.status == 200 and await resp.read(1000) == b"got %d" % i
            # One connection carried all ten (keep-alive), and the URL still named the Host.
            assert len(transports) == 1
            assert seen[0] == ("POST", "/mcp", "worker", b"0")
            await c.close()

    run(main)


def test_a_missing_or_unserved_socket_is_a_connect_failure(short_dir: Path) -> None:
    async def main() -> None:
        missing = OriginClient("http://worker/", connect_timeout=5, unix_path=str(short_dir / "none.sock"))
        with pytest.raises(ConnectFailed, match="FileNotFoundError"):
            await missing.request("GET", {})
        # A socket file left by a process that is gone: bound, never listening.
        dead = short_dir / "dead.sock"
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(dead))
        s.close()
        refused = OriginClient("http://worker/", connect_timeout=5, unix_path=str(dead))
        with pytest.raises(ConnectFailed, match="ConnectionRefusedError"):
            await refused.request("GET", {})
        await missing.close()
        await refused.close()

    run(main)


def test_a_relay_sends_the_callers_fields_only_to_the_target_it_names(short_dir: Path) -> None:
    sock = short_dir / "s.sock"
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"

    async def main() -> None:
        async with raw_unix_server(sock, answer) as (requests, _):
            c = OriginClient("http://worker/", connect_timeout=5, unix_path=str(sock), relay=True)
            fields = [
                ("Host", "127.0.0.1:8080"),
                ("Accept", "application/json, text/event-stream"),
                ("X-Repeated", "one"),
                ("x-repeated", "two"),
                ("Accept-Encoding", "gzip"),
            ]
            async with await c.request("POST", fields, b'{"a":1}', target="/mcp?x=1&y=%20") as resp:
                assert await resp.read(100) == b"{}"
            async with await c.request("DELETE", [("Host", "h")], target="/mcp") as resp:
                assert await resp.read(100) == b"{}"
            async with await c.request("GET", {}, target="/metrics?snapshot") as resp:
                assert await resp.read(100) == b"{}"
            assert requests == [
                b"POST /mcp?x=1&y=%20 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
                b"Accept: application/json, text/event-stream\r\nX-Repeated: one\r\nx-repeated: two\r\n"
                b'Accept-Encoding: gzip\r\nContent-Length: 7\r\n\r\n{"a":1}',
                b"DELETE /mcp HTTP/1.1\r\nHost: h\r\n\r\n",
                # No Host given: the URL's.
                b"GET /metrics?snapshot HTTP/1.1\r\nHost: worker\r\n\r\n",
            ]
            await c.close()

    run(main)


def test_a_relay_refuses_framing_fields_targets_and_methods_that_would_change_the_request(
    short_dir: Path,
) -> None:
    async def main() -> None:
        c = OriginClient("http://worker/", connect_timeout=5, unix_path=str(short_dir / "s"), relay=True)
        for fields in ([("Content-Length", "5")], [("Transfer-Encoding", "chunked")], [("X-A", "a\r\nB: b")]):
            with pytest.raises(ValueError):
                await c.request("POST", fields, b"{}", target="/mcp")
        for target in ("mcp", "/a b", "/a\r\nX: y", "http://elsewhere/", "/a\x7f"):
            with pytest.raises(ValueError):
                await c.request("GET", {}, target=target)
        with pytest.raises(ValueError):
            await c.request("GET /x HTTP/1.1\r\n", {}, target="/mcp")
        await c.close()

    run(main)


def test_a_relay_hands_the_answer_on_as_it_came(short_dir: Path) -> None:
    sock = short_dir / "s.sock"
    body = gzip.compress(b'{"not": "decoded"}')
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
        b"X-Bytes: caf\xc3\xa9 \xff\r\nSet-Cookie: route=r1\r\nX-Twice: 1\r\nx-twice: 2\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )

    async def main() -> None:
        async with raw_unix_server(sock, answer) as (requests, _):
            c = OriginClient("http://worker/", connect_timeout=5, unix_path=str(sock), relay=True)
            for _ in range(2):
                async with await c.request("GET", {}, target="/mcp") as resp:
                    # The compressed bytes, not what they decode to; any coding, even one the
                    # client could not decode ("br" below).
                    assert await resp.read(1000) == body
                    names = [name for name, _ in resp.headers.items()]
                    assert names == [
                        "Content-Type", "Content-Encoding", "X-Bytes", "Set-Cookie", "X-Twice", "x-twice",
                        "Content-Length",
                    ]  # fmt: skip
                    assert resp.headers.getall("X-Twice") == ["1", "2"]
                    # The value's bytes, as visor.http.server writes them again.
                    value = resp.headers.get("X-Bytes")
                    assert value is not None
                    assert value.encode("utf-8", "surrogateescape") == b"caf\xc3\xa9 \xff"
            # No cookie kept: one client's answer never reaches another client's request.
            assert all(b"cookie" not in r.lower() for r in requests)
            await c.close()

        brotli = b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 3\r\n\r\n\x0b\x01\x80"
        async with raw_unix_server(sock, brotli):
            c = OriginClient("http://worker/", connect_timeout=5, unix_path=str(sock), relay=True)
            async with await c.request("GET", {}, target="/mcp") as resp:
                assert await resp.read(100) == b"\x0b\x01\x80"
            await c.close()

    run(main)


def test_a_relays_header_bytes_go_out_as_its_server_read_them(short_dir: Path) -> None:
    sock = short_dir / "s.sock"

    async def main() -> None:
        async with raw_unix_server(sock, b"HTTP/1.1 204 No Content\r\n\r\n") as (requests, _):
            c = OriginClient("http://worker/", connect_timeout=5, unix_path=str(sock), relay=True)
            # What visor.http.server hands a handler for the bytes `caf\xc3\xa9 \xff`.
            value = b"caf\xc3\xa9 \xff".decode("utf-8", "surrogateescape")
            async with await c.request("GET", [("X-Bytes", value)], target="/mcp") as resp:
                assert resp.status == 204 and await resp.read(10) == b""
            assert b"\r\nX-Bytes: caf\xc3\xa9 \xff\r\n" in requests[0]
            await c.close()

    run(main)


def test_the_answer_to_head_ends_with_its_head(short_dir: Path) -> None:
    sock = short_dir / "s.sock"

    async def main() -> None:
        transports: set[int] = set()

        async def handler(request: Request) -> Response:
            transports.add(id(request.transport))
            # HEAD is answered with GET's Content-Length, and no body.
            return Response(body=b"x" * 100, content_type="text/plain")

        async with http_server(sock, handler):
            c = OriginClient("http://worker/", connect_timeout=5, unix_path=str(sock), relay=True)
            async with await c.request("HEAD", {}, target="/mcp") as resp:
                assert resp.status == 200 and resp.headers.get("Content-Length") == "100"
                assert await resp.read(1000) == b""
            # llhttp cannot be told the answer had no body: that connection is not used again.
            async with await c.request("GET", {}, target="/mcp") as resp:
                assert await resp.read(1000) == b"x" * 100
            assert len(transports) == 2
            await c.close()

    run(main)


def test_an_event_stream_is_handed_on_piece_by_piece_as_it_comes(short_dir: Path) -> None:
    sock = short_dir / "s.sock"

    async def main() -> None:
        next_event = asyncio.Event()

        async def stream(request: Request) -> StreamResponse:
            response = StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for i in range(3):
                await response.write(b"data: %d\n\n" % i)
                # The next event only once the client has seen this one: a client that waited
                # for the whole stream would wait for ever.
                await next_event.wait()
                next_event.clear()
            return response

        async with http_server(sock, stream):
            c = OriginClient("http://worker/", connect_timeout=5, unix_path=str(sock), relay=True)
            async with await c.request("GET", {}, target="/mcp") as resp:
                assert resp.headers.get("Content-Type") == "text/event-stream"
                got = []
                async for chunk in resp.chunks():
                    got.append(chunk)
                    next_event.set()
            assert got == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]
            await c.close()

    run(main)


def test_a_large_answer_streams_whole_with_no_cap(short_dir: Path) -> None:
    sock = short_dir / "s.sock"
    size = 48 << 20  # far past the client's read-ahead (1 MiB): it is handed on, not held

    async def main() -> None:
        async def big(request: Request) -> StreamResponse:
            response = StreamResponse(headers={"Content-Type": "application/octet-stream"})
            await response.prepare(request)
            piece = b"y" * (1 << 20)
            for _ in range(size >> 20):
                await response.write(piece)
            return response

        async with http_server(sock, big):
            c = OriginClient("http://worker/", connect_timeout=5, unix_path=str(sock), relay=True)
            total = pieces = 0
            async with await c.request("GET", {}, target="/big") as resp:
                async for chunk in resp.chunks():
                    total += len(chunk)
                    pieces += 1
                    await asyncio.sleep(0)
            assert total == size and pieces > 1
            await c.close()

    run(main)


def test_the_tcp_client_still_adds_its_own_fields_and_keeps_cookies(short_dir: Path) -> None:
    """Without `relay` (a `visor run --url` upstream), over a unix socket too: the request goes to
    the URL's target with the URL's Host, the client's User-Agent and Accept-Encoding, and the
    origin's cookies; a content coding is decoded."""
    sock = short_dir / "s.sock"
    body = gzip.compress(b"{}")
    answer = (
        b"HTTP/1.1 200 OK\r\nSet-Cookie: route=r1\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )

    async def main() -> None:
        async with raw_unix_server(sock, answer) as (requests, _):
            c = OriginClient("http://origin.example:8080/mcp", connect_timeout=5, unix_path=str(sock))
            for _ in range(2):
                async with await c.request("POST", {"Content-Type": "application/json"}, b"{}") as resp:
                    assert await resp.read(100) == b"{}"
            first, second = requests
            assert first.startswith(b"POST /mcp HTTP/1.1\r\nHost: origin.example:8080\r\n")
            assert b"\r\nUser-Agent: visor/" in first and b"\r\nAccept-Encoding: identity\r\n" in first
            assert b"\r\nCookie: route=r1\r\n" in second
            await c.close()

    run(main)
