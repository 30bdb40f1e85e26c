"""`visor run --url`: the stdio relay with a Streamable HTTP server where the child process would be.

The relay (visor/relay/proxy.py) and its session core are unchanged: the client side, the
framer, the checks, the audit commits and the approvals are exactly those of a stdio server.
What changes is what stands behind the server's two pipes. Instead of a child process, two
pipes of Visor's own lead to an `HttpUpstream`: the lines the core writes to "the server's
stdin" are POSTed, and the messages the upstream reads from HTTP are written, one line each,
to "the server's stdout", where the core frames and checks them as it does any server's output.
Closing the server's input (client EOF) lets requests in flight finish within the shutdown
grace, then ends the HTTP session (DELETE), which ends the server's output: the same order
of events as a stdio server exiting after its stdin closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import TYPE_CHECKING, Any

from visor.http.upstream import HttpUpstream, HttpUpstreamConfig
from visor.logs import get_logger
from visor.relay.proxy import Relay, RelayConfig, ServerEnd, ServerLink
from visor.wire.framer import Framer, Oversize, Truncated

if TYPE_CHECKING:
    from visor.core.checks import Checks

log = get_logger("visor.http")

_READ_CHUNK = 256 * 1024


class HttpLink(ServerLink):
    """A Streamable HTTP session behind the relay's server pipes, with a pump each way."""

    def __init__(self, upstream: HttpUpstreamConfig, config: RelayConfig) -> None:
        self.upstream_config = upstream
        self.config = config
        self.http: HttpUpstream | None = None
        self._answers_pump: asyncio.Task[None] | None = None
        self._pumps: list[asyncio.Task[None]] = []

    async def start(self) -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        self.http = HttpUpstream(self.upstream_config)
        requests_r, requests_w = os.pipe()  # the relay writes the server's input into requests_w
        answers_r, answers_w = os.pipe()  # and reads the server's output from answers_r
        for fd in (requests_r, requests_w, answers_r, answers_w):
            os.set_blocking(fd, False)
        self._answers_pump = loop.create_task(self._pump_answers(answers_w))
        self._pumps = [loop.create_task(self._pump_requests(requests_r)), self._answers_pump]
        return requests_w, answers_r

    async def finish(self) -> ServerEnd:
        assert self.http is not None
        await self.http.close()
        failure = self.http.failure
        if failure is not None:
            return ServerEnd(1, {"upstream": self.http.shown_url, "error": str(failure)}, failed=True)
        return ServerEnd(0, {"upstream": self.http.shown_url})

    async def stop(self, server_eof: asyncio.Future[None]) -> None:
        # As for a child process: the closed input first gets the shutdown grace to end the
        # session in order (requests in flight answered), then the session is ended outright.
        assert self.http is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(server_eof), self.config.shutdown_grace)
        if server_eof.done():
            return
        await self.http.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(server_eof), 1.0)
        if not server_eof.done() and self._answers_pump is not None:
            # Closing our end of the server's output is the server's EOF, whatever still waits.
            self._answers_pump.cancel()

    async def close(self) -> None:
        for task in self._pumps:
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        if self.http is not None:
            await self.http.close()

    async def _pump_requests(self, fd: int) -> None:
        """Lines the core wrote for the server: each one POSTed; at EOF the session ends."""
        assert self.http is not None
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=_READ_CHUNK)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0)
        )
        # The core writes only lines it framed and checked itself: the cap is a safeguard.
        framer = Framer(self.config.max_message_bytes)
        try:
            while True:
                data = await reader.read(_READ_CHUNK)
                if not data:
                    break
                for line in framer.feed(data):
                    if type(line) is bytes and line:
                        await self.http.send(line)
                    elif isinstance(line, Oversize | Truncated):
                        log.error("relay_line_refused", size=line.size)
        finally:
            transport.close()
        await self.http.close(grace=self.config.shutdown_grace)

    async def _pump_answers(self, fd: int) -> None:
        """Messages the HTTP server sent: one line each on the server's output, then EOF."""
        assert self.http is not None
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(fd, "wb", 0)
        )
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
        try:
            async for line in self.http:
                writer.write(line + b"\n")
                await writer.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            writer.close()


class HttpRelay(Relay):
    """One `visor run --url` session: a client's pipes and a Streamable HTTP server."""

    def __init__(
        self,
        upstream: HttpUpstreamConfig,
        argv: list[str],
        config: RelayConfig,
        checks: Checks,
        **kwargs: Any,
    ) -> None:
        self.http_link = HttpLink(upstream, config)
        super().__init__(argv, config, checks, link=self.http_link, **kwargs)
