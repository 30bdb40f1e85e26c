"""The stdio relay and the `--url` relay as one MCP session of the gateway.

`Relay.run` and `HttpRelay.run` own the process's SIGINT and SIGTERM: one `visor run` is one
session. A gateway runs many relays in one event loop, and each would install and then remove
the process's handlers under the others; the gateway's own handler ends every session instead.
These drivers are those two `run`s without the signal handlers, and nothing else changed: the
client side is a pair of the gateway's pipes, the core, the checks and the audit commits are
the stdio relay's.
"""

from __future__ import annotations

import asyncio
import os

from visor.http.relay import HttpRelay
from visor.http.relay import _Pipes as _HttpPipes
from visor.http.upstream import HttpUpstream
from visor.relay import upstream as upstream_mod
from visor.relay.proxy import Relay, _ClientLink


class SessionRelay(Relay):
    """A stdio server for one MCP session: its own process, its own core."""

    upstream_pid: int | None = None

    async def run(self, client_in_fd: int, client_out_fd: int) -> int:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._server_eof = loop.create_future()
        try:
            upstream = self._upstream = await upstream_mod.spawn(self.argv)
        except BaseException:
            # The relay never took the client's pipe ends: they are ours to close.
            os.close(client_in_fd)
            os.close(client_out_fd)
            raise
        self.upstream_pid = upstream.pid
        try:
            await self._connect(loop, client_in_fd, client_out_fd)
            if self.approvals is not None:
                self.approvals.link = _ClientLink(self)
            returncode = await self._lifecycle()
        finally:
            # As in `visor run`: nothing of the server's process group survives, and it is reaped.
            upstream_mod.kill_group(upstream.pid)
            await upstream_mod.reap(upstream)
        return upstream_mod.exit_status(returncode)


class HttpSessionRelay(HttpRelay):
    """An HTTP server for one MCP session: its own upstream HTTP session, its own core."""

    upstream_pid: int | None = None

    async def run(self, client_in_fd: int, client_out_fd: int) -> int:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._server_eof = loop.create_future()
        self.http = HttpUpstream(self.upstream_config)
        requests_r, requests_w = os.pipe()
        answers_r, answers_w = os.pipe()
        for fd in (requests_r, requests_w, answers_r, answers_w):
            os.set_blocking(fd, False)
        self._upstream = _HttpPipes(requests_w, answers_r)  # type: ignore[assignment]
        pumps: list[asyncio.Task[None]] = []
        try:
            await self._connect(loop, client_in_fd, client_out_fd)
            self._answers_pump = loop.create_task(self._pump_answers(answers_w))
            pumps = [loop.create_task(self._pump_requests(requests_r)), self._answers_pump]
            if self.approvals is not None:
                self.approvals.link = _ClientLink(self)
            return await self._lifecycle()
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            await self.http.close()
