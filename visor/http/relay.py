"""`visor run --url`: the stdio relay with a Streamable HTTP server where the child process would be.

The relay (visor/relay/proxy.py) and its session core are unchanged: the client side, the
framer, the checks, the audit commits and the approvals are exactly those of a stdio server.
What changes is what stands behind the server's two ends. Instead of a child process's pipes,
a `ServerPort` attaches an `HttpUpstream` in memory: the lines the core writes to "the server's
stdin" are POSTed, in order, and the messages the upstream reads from HTTP are handed to the
relay as "the server's stdout", one line each, where the core frames and checks them as it does
any server's output. Closing the server's input (client EOF) lets requests in flight finish within
the shutdown grace, then ends the HTTP session (DELETE), which ends the server's output: the same
order of events as a stdio server exiting after its stdin closed.

There used to be two OS pipes here, with a task pumping each: every message then also cost a
write and a read system call, an event-loop turn and a framing each way. Flow control is what
the pipes gave: past `_QUEUED_HIGH` lines not yet handed to the upstream, the relay is told its
server's input is full (and holds its client back), and while the relay pauses the server's
output (its client reads slowly) the upstream's readers wait, so TCP flow control reaches the
server.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import TYPE_CHECKING, Any

from visor.http.upstream import HttpUpstream, HttpUpstreamConfig
from visor.logs import get_logger
from visor.relay.memory import MemoryWriteTransport
from visor.relay.proxy import Relay, RelayConfig, ServerEnd, ServerLink, ServerPort
from visor.wire.framer import Framer, Oversize, Truncated

if TYPE_CHECKING:
    from visor.core.checks import Checks

log = get_logger("visor.http")

# Lines the relay wrote and the upstream has not taken yet: past the high mark the relay is told
# its server's input is full; below the low mark, that it has room again.
_QUEUED_HIGH = 1024
_QUEUED_LOW = 256


class HttpLink(ServerLink):
    """A Streamable HTTP session attached to the relay as its server (`ServerPort`)."""

    def __init__(self, upstream: HttpUpstreamConfig, config: RelayConfig) -> None:
        self.upstream_config = upstream
        self.config = config
        self.http: HttpUpstream | None = None
        # Where the server's stdin pipe would be: what the relay writes goes to `take`.
        self._input = MemoryWriteTransport(self.take, self.queued, self.input_closed)
        self._output = _UpstreamOutput()
        self._lines: collections.deque[bytes] = collections.deque()
        # The core writes only lines it framed and checked itself: the cap is a safeguard.
        self._framer = Framer(config.max_message_bytes)
        self._wakeup: asyncio.Future[None] | None = None
        self._input_over = False
        self._sender: asyncio.Task[None] | None = None

    async def start(self) -> ServerPort:
        self.http = HttpUpstream(self.upstream_config, sink=self._output)
        self._sender = asyncio.get_running_loop().create_task(self._send_lines())
        return ServerPort(self._input, self._output)

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
        if not server_eof.done():
            # Ending the server's output is the server's EOF, whatever still waits.
            self._output.end()

    async def close(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(BaseException):
                await self._sender
        if self.http is not None:
            await self.http.close()

    # ------------------------------------------------------------ the server's input
    def take(self, data: bytes) -> None:
        """Bytes the relay wrote to the server's input: whole lines, each one POSTed in order."""
        for line in self._framer.feed(data):
            if type(line) is bytes and line:
                self._lines.append(line)
            elif isinstance(line, Oversize | Truncated):
                log.error("relay_line_refused", size=line.size)
        if len(self._lines) > _QUEUED_HIGH:
            self._input.pause()
        self._wake()

    def input_closed(self) -> None:
        self._input_over = True
        self._wake()

    def queued(self) -> int:
        return len(self._lines)

    def _wake(self) -> None:
        waiter = self._wakeup
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _send_lines(self) -> None:
        """POST what the relay wrote, one line after another (a send waits for the session to
        be initialized, as a stdio server reads its input in order); at its end, the session ends."""
        http = self.http
        assert http is not None
        loop = asyncio.get_running_loop()
        while True:
            while self._lines:
                line = self._lines.popleft()
                if len(self._lines) < _QUEUED_LOW:
                    self._input.resume()
                await http.send(line)
            if self._input_over:
                break
            self._wakeup = loop.create_future()
            try:
                await self._wakeup
            finally:
                self._wakeup = None
        await http.close(grace=self.config.shutdown_grace)


class _UpstreamOutput(asyncio.ReadTransport):
    """Where the server's stdout pipe would be: the upstream's messages, one line each, to the
    relay's protocol; `deliver` waits while the relay has paused reading. The end comes after
    every message already being delivered, as a pipe's EOF comes after the bytes written to it."""

    def __init__(self) -> None:
        super().__init__()
        self._protocol: asyncio.Protocol | None = None
        self._reading = asyncio.Event()
        self._reading.set()
        self._closing = False
        self._waiting = 0  # deliveries held by a pause
        self._end_wanted = False
        self._end_sent = False

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        assert isinstance(protocol, asyncio.Protocol)
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def pause_reading(self) -> None:
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    def is_reading(self) -> bool:
        return self._reading.is_set()

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        # The relay's close of the server's output: nothing more is handed to it.
        self._closing = True
        self._reading.set()  # deliveries still waiting return (and drop their message)

    async def deliver(self, raw: bytes) -> None:
        """One message from the upstream (the `MessageSink` side)."""
        if self._end_wanted:
            return  # the upstream ended before this one was sent on
        if not self._reading.is_set():
            self._waiting += 1
            try:
                await self._reading.wait()
            finally:
                self._waiting -= 1
        if not self._closing and self._protocol is not None:
            self._protocol.data_received(raw + b"\n")
        if self._end_wanted and not self._waiting:
            self._send_end()

    def end(self) -> None:
        """The upstream has no more messages (or the link ends the output): the server's EOF,
        once, after the messages whose delivery a pause is holding."""
        if self._end_wanted:
            return
        self._end_wanted = True
        if not self._waiting:
            self._send_end()

    def _send_end(self) -> None:
        if self._end_sent:
            return
        self._end_sent = True
        if not self._closing and self._protocol is not None:
            self._protocol.eof_received()


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
