"""The HTTP rows' floor: a process that copies TCP bytes both ways and does nothing else.

Any gateway between an HTTP client and an HTTP server pays at least this: one more process, one
more loopback connection per client connection, and the wake-ups that carry each request and
answer through it. It parses nothing, checks nothing and writes no audit record, so the distance
between it and `visor serve --url` is what the gateway's own work costs, and the distance between
it and a direct connection is what any proxy costs on this machine.

Run: ``python -m visor.bench.tcp_relay LISTEN_FD UPSTREAM_HOST UPSTREAM_PORT``; the listening
socket is inherited (already bound and listening), so the caller knows the port before it starts.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import cast

import uvloop


class _Side(asyncio.Protocol):
    """One end of a relayed connection: what it reads goes to its peer's transport."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self._early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self._early.append(data)  # the client spoke before the upstream connection opened
            return
        peer.transport.write(data)

    def eof_received(self) -> bool:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    def joined(self, peer: _Side) -> None:
        self.peer = peer
        assert peer.transport is not None
        for data in self._early:
            peer.transport.write(data)
        self._early.clear()


async def _serve(listen: socket.socket, host: str, port: int) -> None:
    loop = asyncio.get_running_loop()

    async def accepted(client: _Side) -> None:
        try:
            _, upstream = await loop.create_connection(_Side, host, port)
        except OSError:
            if client.transport is not None:
                client.transport.close()
            return
        assert client.transport is not None
        for t in (client.transport, upstream.transport):
            sock = t.get_extra_info("socket") if t is not None else None
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        upstream.peer = client
        client.joined(upstream)

    tasks: set[asyncio.Task[None]] = set()

    def factory() -> _Side:
        side = _Side()
        task = loop.create_task(_after_made(side))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return side

    async def _after_made(side: _Side) -> None:
        await asyncio.sleep(0)  # connection_made runs before the task's first step
        await accepted(side)

    server = await loop.create_server(factory, sock=listen)
    await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m visor.bench.tcp_relay LISTEN_FD UPSTREAM_HOST UPSTREAM_PORT", file=sys.stderr)
        return 2
    listen = socket.socket(fileno=int(args[0]))
    uvloop.run(_serve(listen, args[1], int(args[2])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
