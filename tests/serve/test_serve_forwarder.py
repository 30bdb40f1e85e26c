"""The forwarder of `visor serve --workers N` (visor/serve/workers.py `Forwarder`) in one process:
a front `HttpServer` on loopback whose handler is the forwarder, and the owner worker's
`HttpServer` on `RUNDIR/worker-1.sock`, both real servers on real sockets.

What is asserted is what a forwarded request relies on: method, target, body and every header
but the hop-by-hop ones reach the owner; its answer comes back as it was written (status, header
fields, body), an event stream event by event as the owner writes it; one connection to the owner
serves request after request; an owner that is not there leaves the request to this worker; an
owner that dies mid-answer leaves the client a broken stream, not a whole one; the `/metrics`
figures of the other workers, and nothing from a worker that does not answer in time; closing
ends the connections to the owners. (tests/serve/test_serve_workers.py runs it all between real
worker processes.)
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import orjson
import pytest

from visor.http.client import OriginClient, ResponseBroken
from visor.http.server import Answer, HttpServer, Request, Response, StreamResponse
from visor.serve import workers
from visor.serve.metrics import SNAPSHOT_QUERY, GatewayMetrics
from visor.serve.workers import Forwarder, WorkerSpec

SID = "0123456789abcdef0123456789abcdef-1"  # minted by worker 1


@pytest.fixture
def rundir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="vf-", dir="/tmp"))  # short: a unix socket path must fit
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(coro(), 60))


@contextlib.asynccontextmanager
async def front_and_owner(
    rundir: Path, owner: Callable[[Request], Awaitable[Answer]] | None
) -> AsyncIterator[tuple[OriginClient, Forwarder, HttpServer | None]]:
    """Worker 0 (the front, on loopback TCP) forwarding to worker 1 (`owner`, on its socket; None:
    no worker 1). A request the forwarder leaves to worker 0 is answered `local`."""
    forwarder = Forwarder(WorkerSpec(0, 0, 0, 2, rundir), shared_state=False)

    async def front(request: Request) -> Answer:
        answer = await forwarder(request)
        return answer if answer is not None else Response(text="local")

    front_server = HttpServer(front, max_body=1 << 20)
    port = await front_server.listen("127.0.0.1", 0)
    owner_server = None
    if owner is not None:
        owner_server = HttpServer(owner, max_body=1 << 20)
        await owner_server.listen_unix(str(rundir / "worker-1.sock"))
    client = OriginClient(f"http://127.0.0.1:{port}/mcp", connect_timeout=5, relay=True)
    try:
        yield client, forwarder, owner_server
    finally:
        await client.close()
        await forwarder.close()
        await front_server.close()
        if owner_server is not None:
            await owner_server.close()


def test_a_request_reaches_the_owner_whole_and_its_answer_comes_back_as_written(rundir: Path) -> None:
    async def main() -> None:
        seen: list[tuple[str, str, list[tuple[str, str]], bytes]] = []
        transports: set[int] = set()

        async def owner(request: Request) -> Answer:
            transports.add(id(request.transport))
            body = await request.read()
            seen.append(
                (
                    request.method,
                    f"{request.path}?{request.query_string}",
                    list(request.headers.items()),
                    body,
                )
            )
            return Response(
                status=202,
                body=b'{"owner": true}',
                headers={"Content-Type": "application/json", "X-Owner": "1", "Mcp-Session-Id": SID},
            )

        async with front_and_owner(rundir, owner) as (client, _, _):
            fields = [
                ("Host", "127.0.0.1:1234"),
                ("Content-Type", "application/json"),
                ("Accept", "application/json, text/event-stream"),
                ("Mcp-Session-Id", SID),
                ("X-Repeated", "one"),
                ("X-Repeated", "two"),
                # The connection's own: not passed on.
                ("Connection", "keep-alive"),
                ("Keep-Alive", "timeout=5"),
                ("TE", "trailers"),
                ("Proxy-Connection", "keep-alive"),
            ]
            for i in range(5):
                body = b'{"n": %d}' % i
                async with await client.request("POST", fields, body, target="/mcp?a=1&b=%20") as resp:
                    assert resp.status == 202
                    assert await resp.read(1000) == b'{"owner": true}'
                    assert resp.headers.get("Content-Type") == "application/json"
                    assert resp.headers.get("X-Owner") == "1" and resp.headers.get("Mcp-Session-Id") == SID
                    # Framed again by the front (chunked), not with the owner's Content-Length.
                    assert resp.headers.get("Transfer-Encoding") == "chunked"
                    assert "Content-Length" not in resp.headers
            assert len(seen) == 5
            method, target, headers, body = seen[-1]
            assert (method, target, body) == ("POST", "/mcp?a=1&b=%20", b'{"n": 4}')
            assert headers == [
                ("Host", "127.0.0.1:1234"),
                ("Content-Type", "application/json"),
                ("Accept", "application/json, text/event-stream"),
                ("Mcp-Session-Id", SID),
                ("X-Repeated", "one"),
                ("X-Repeated", "two"),
                ("Content-Length", "8"),
            ]
            # One connection to the owner carried every forwarded request.
            assert len(transports) == 1

            # GET and DELETE too, with no body.
            async with await client.request("DELETE", [("Mcp-Session-Id", SID)], target="/mcp") as resp:
                assert resp.status == 202 and await resp.read(100) == b'{"owner": true}'
            assert seen[-1][0] == "DELETE" and seen[-1][3] == b""
            # Only the client's fields: none of the forwarder's own (a User-Agent, an Accept-Encoding).
            assert [name for name, _ in seen[-1][2]] == ["Host", "Mcp-Session-Id"]

            # A session no worker minted, and this worker's own: served here.
            for sid in ("not-a-worker-id", "0123456789abcdef0123456789abcdef-0"):
                async with await client.request("GET", [("Mcp-Session-Id", sid)], target="/mcp") as resp:
                    assert await resp.read(100) == b"local"
            assert len(seen) == 6

    run(main)


def test_an_event_stream_comes_back_event_by_event(rundir: Path) -> None:
    async def main() -> None:
        next_event = asyncio.Event()

        async def owner(request: Request) -> Answer:
            response = StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await response.prepare(request)
            for i in range(3):
                await response.write(b"event: message\ndata: %d\n\n" % i)
                # The next event only once the client has this one: a forwarder that held the
                # stream until its end would never hand it on.
                await next_event.wait()
                next_event.clear()
            return response

        async with front_and_owner(rundir, owner) as (client, _, _):
            async with await client.request("GET", [("Mcp-Session-Id", SID)], target="/mcp") as resp:
                assert resp.status == 200
                assert resp.headers.get("Content-Type") == "text/event-stream"
                assert resp.headers.get("Cache-Control") == "no-cache"
                got = b""
                async for chunk in resp.chunks():
                    got += chunk
                    if got.endswith(b"\n\n"):
                        next_event.set()
            assert got == b"".join(b"event: message\ndata: %d\n\n" % i for i in range(3))

    run(main)


def test_a_large_answer_is_streamed_through_whole(rundir: Path) -> None:
    size = 32 << 20

    async def main() -> None:
        async def owner(request: Request) -> Answer:
            response = StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            for _ in range(size >> 20):
                await response.write(b"z" * (1 << 20))
            return response

        async with front_and_owner(rundir, owner) as (client, _, _):
            async with await client.request("GET", [("Mcp-Session-Id", SID)], target="/mcp") as resp:
                total = 0
                async for chunk in resp.chunks():
                    total += len(chunk)
            assert total == size

    run(main)


def test_an_owner_that_is_not_there_leaves_the_request_here(rundir: Path) -> None:
    async def main() -> None:
        async with front_and_owner(rundir, None) as (client, _, _):
            async with await client.request("GET", [("Mcp-Session-Id", SID)], target="/mcp") as resp:
                assert await resp.read(100) == b"local"
            # A socket file its dead worker left behind: refused, served here too.
            stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            stale.bind(str(rundir / "worker-1.sock"))
            stale.close()
            async with await client.request("GET", [("Mcp-Session-Id", SID)], target="/mcp") as resp:
                assert await resp.read(100) == b"local"

    run(main)


def test_an_owner_that_dies_mid_answer_leaves_a_broken_stream(rundir: Path) -> None:
    async def main() -> None:
        async def owner(request: Request) -> Answer:
            response = StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b"data: 0\n\n")
            await asyncio.sleep(0.1)
            assert request.transport is not None
            request.transport.abort()  # the owner's process is gone
            await asyncio.sleep(1)
            return response

        async with front_and_owner(rundir, owner) as (client, _, _):
            async with await client.request("GET", [("Mcp-Session-Id", SID)], target="/mcp") as resp:
                got = b""
                with pytest.raises(ResponseBroken):
                    async for chunk in resp.chunks():
                        got += chunk
            assert got == b"data: 0\n\n"

    run(main)


def test_the_other_workers_figures_and_none_from_one_that_stalls(
    rundir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workers, "PEER_METRICS_TIMEOUT", 0.5)
    figures = GatewayMetrics().snapshot(sessions_open=3)

    async def main() -> None:
        stall = False
        asked: list[tuple[str, str | None, str | None]] = []

        async def owner(request: Request) -> Answer:
            asked.append(
                (request.query_string, request.headers.get("Host"), request.headers.get("Authorization"))
            )
            if stall:
                await asyncio.sleep(30)
            return Response(body=orjson.dumps(figures), content_type="application/json")

        async with front_and_owner(rundir, owner) as (_, forwarder, _):
            assert await forwarder.peer_metrics("tok") == (0, [(1, figures)])
            assert asked == [(SNAPSHOT_QUERY, "localhost", "Bearer tok")]
            stall = True
            started = time.monotonic()
            assert await forwarder.peer_metrics(None) == (0, [])
            assert time.monotonic() - started < 5
            # Asked once more, the owner answering again: the stalled connection was not kept.
            stall = False
            assert await forwarder.peer_metrics(None) == (0, [(1, figures)])

    run(main)


def test_close_ends_the_connections_to_the_owners(rundir: Path) -> None:
    async def main() -> None:
        async def owner(request: Request) -> Answer:
            return Response(text="owner")

        async with front_and_owner(rundir, owner) as (client, forwarder, owner_server):
            assert owner_server is not None
            async with await client.request("GET", [("Mcp-Session-Id", SID)], target="/mcp") as resp:
                assert await resp.read(100) == b"owner"
            assert len(owner_server.connections) == 1  # kept for the next forwarded request
            await forwarder.close()
            for _ in range(100):
                if not owner_server.connections:
                    break
                await asyncio.sleep(0.01)
            assert not owner_server.connections

    run(main)


def test_a_head_request_is_forwarded_and_answered_without_a_body(rundir: Path) -> None:
    async def main() -> None:
        async def owner(request: Request) -> Answer:
            # (The gateway answers HEAD on /mcp 405; any answer with a Content-Length will do.)
            return Response(status=405, body=b'{"error": "no"}', headers={"Allow": "GET, POST, DELETE"})

        async with front_and_owner(rundir, owner) as (client, _, _):
            for _ in range(2):
                async with await client.request("HEAD", [("Mcp-Session-Id", SID)], target="/mcp") as resp:
                    assert resp.status == 405 and resp.headers.get("Allow") == "GET, POST, DELETE"
                    assert await resp.read(100) == b""
            async with await client.request("DELETE", [("Mcp-Session-Id", SID)], target="/mcp") as resp:
                assert resp.status == 405 and await resp.read(100) == b'{"error": "no"}'

    run(main)
