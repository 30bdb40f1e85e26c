"""One MCP session of the gateway: a relay behind a pair of pipes, and the routing of its output.

The gateway writes each client message, already held to the wire rules, as one line into the
relay's "stdin" pipe; the relay (the stdio driver, unchanged) judges it exactly as it judges a
line from a stdio client. What the relay writes to its "stdout" pipe is framed here and routed:

* a response goes to the HTTP request waiting for its id (the JSON-RPC id, type included);
* a progress notification goes to the request that gave its `progressToken`;
* anything else (a server's request, a log line, a list change) goes to the request most
  recently opened and still waiting, else to the GET stream, else waits (bounded) for a GET
  stream to open. Over stdio nothing ties a server's request to the client request that caused
  it; the newest open request is the likeliest cause, and the SDK client takes either.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from visor.logs import get_logger
from visor.relay.proxy import Relay
from visor.wire.framer import Framer

log = get_logger("visor.serve")

# Messages kept for a GET stream that is not open yet; older ones are dropped (and logged).
_UNROUTED_KEEP = 1000
# Reading the relay's output pauses while this many messages wait for slow HTTP clients.
_QUEUED_HIGH = 1024

# What an exchange's queue yields when the session ended before its answer.
ENDED = b""


@dataclass(slots=True, eq=False)
class Exchange:
    """One HTTP request's wait: the messages routed to it, the last being its response."""

    key: bytes
    queue: asyncio.Queue[bytes] = field(default_factory=asyncio.Queue)
    progress_token: bytes | None = None


def id_key(value: Any) -> bytes:
    """A JSON-RPC id as a table key: its JSON form, so that 1 and "1" stay apart."""
    return orjson.dumps(value)


class McpSession:
    """A session id, its relay (its own upstream, its own core and Visor session state) and its routes."""

    def __init__(
        self,
        sid: str,
        relay: Relay,
        *,
        max_message_bytes: int,
        on_end: Callable[[McpSession], None],
    ) -> None:
        self.sid = sid
        self.relay = relay
        self.last_active = time.monotonic()
        self.in_flight = 0
        self.exchanges: dict[bytes, Exchange] = {}
        self._by_token: dict[bytes, Exchange] = {}
        self.get_stream: Exchange | None = None
        self._unrouted: collections.deque[bytes] = collections.deque(maxlen=_UNROUTED_KEEP)
        self._framer = Framer(max_message_bytes)
        self._on_end = on_end
        self._to_relay: asyncio.StreamWriter | None = None
        self._from_relay: asyncio.ReadTransport | None = None
        self._task: asyncio.Task[int] | None = None
        self._paused = False
        self._relay_over = False
        self._output_over = False
        self.ended = False
        # Ended here but not for other replicas (`--state`): an idle expiry, not a DELETE.
        self.keep_in_store = False

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the relay (and with it the upstream) behind two pipes of ours."""
        loop = asyncio.get_running_loop()
        in_r, in_w = os.pipe()  # we write the client's messages into in_w, the relay reads in_r
        out_r, out_w = os.pipe()  # the relay writes to out_w, we read out_r
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(in_w, "wb", 0)
        )
        self._to_relay = asyncio.StreamWriter(transport, protocol, None, loop)
        self._from_relay, _ = await loop.connect_read_pipe(
            lambda: _LineReader(self._on_data, self._on_eof), os.fdopen(out_r, "rb", 0)
        )
        self._task = loop.create_task(self.relay.run(in_r, out_w))
        self._task.add_done_callback(self._relay_done)

    def _relay_done(self, task: asyncio.Task[int]) -> None:
        if task.cancelled():
            log.warning("session_relay_cancelled", mcp_session=self.sid)
        elif (exc := task.exception()) is not None:
            log.error("session_relay_failed", mcp_session=self.sid, error=repr(exc))
        else:
            log.info("session_relay_ended", mcp_session=self.sid, status=task.result())
            # A relay that ended normally closed its output: what it wrote last (answers sent as
            # the upstream exited) is still being read, and waits that long are settled after it.
            self._relay_over = True
            if self._output_over:
                self._finish()
            return
        self._finish()

    def _finish(self) -> None:
        if not self.ended:
            self.ended = True
            self._on_end(self)
        if self._to_relay is not None and not self._to_relay.is_closing():
            self._to_relay.close()
        for ex in list(self.exchanges.values()):
            ex.queue.put_nowait(ENDED)
        if self.get_stream is not None:
            self.get_stream.queue.put_nowait(ENDED)

    async def end(self, grace: float) -> None:
        """End the session as a stdio client would: EOF on the relay's input, then wait for it.

        The relay closes the server's stdin, waits its shutdown grace, escalates, and reaps the
        process (or DELETEs the upstream HTTP session); the wait here is a bound on all that.
        """
        if not self.ended:
            self.ended = True
            self._on_end(self)
        if self._to_relay is not None and not self._to_relay.is_closing():
            self._to_relay.close()
        task = self._task
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), grace)
            except TimeoutError:
                log.error("session_end_stuck", mcp_session=self.sid)
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        self._finish()

    async def replay_initialize(self, initialize: bytes, timeout: float = 30.0) -> None:
        """Continue a session another replica started: its client's `initialize` (under an id of
        Visor's own, its answer kept from the client, who had its answer long ago) and the
        `initialized` notification, to this replica's new upstream. Raises if the upstream does
        not answer with a result."""
        obj = orjson.loads(initialize)
        if not isinstance(obj, dict) or obj.get("method") != "initialize":
            raise ValueError("the stored session holds no initialize request")
        rpc_id = f"visor-adopt-{secrets.token_hex(8)}"
        obj["id"] = rpc_id
        ex = self.open_exchange(id_key(rpc_id), None)
        try:
            await self.send(orjson.dumps(obj))
            async with asyncio.timeout(timeout):
                while True:
                    line = await ex.queue.get()
                    self.delivered()
                    if line is ENDED:
                        raise ConnectionError("the session ended during its initialize")
                    answer = orjson.loads(line)
                    # Anything the upstream sends before its answer (a log line) is the old client's
                    # business no more: only the answer matters here.
                    if isinstance(answer, dict) and "method" not in answer and answer.get("id") == rpc_id:
                        break
        finally:
            self.close_exchange(ex)
        if "result" not in answer:
            raise ConnectionError(
                f"the new upstream refused the session's initialize: {answer.get('error')!r}"
            )
        await self.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')

    # ------------------------------------------------------------ to the relay
    async def send(self, line: bytes) -> None:
        """One client message, already checked, as one line on the relay's input."""
        writer = self._to_relay
        if writer is None or writer.is_closing() or self.ended:
            raise ConnectionError("the session has ended")
        writer.write(line + b"\n")
        await writer.drain()

    def send_nowait(self, line: bytes) -> None:
        """One line on the relay's input without waiting for room (a cancel, as its request ends)."""
        writer = self._to_relay
        if writer is not None and not writer.is_closing() and not self.ended:
            writer.write(line + b"\n")

    def open_exchange(self, key: bytes, progress_token: Any) -> Exchange:
        ex = Exchange(key)
        if self.ended:
            ex.queue.put_nowait(ENDED)
        if progress_token is not None:
            ex.progress_token = id_key(progress_token)
            self._by_token[ex.progress_token] = ex
        self.exchanges[key] = ex
        self.in_flight += 1
        return ex

    def close_exchange(self, ex: Exchange) -> None:
        if self.exchanges.get(ex.key) is ex:
            del self.exchanges[ex.key]
            self.in_flight -= 1
        if ex.progress_token is not None and self._by_token.get(ex.progress_token) is ex:
            del self._by_token[ex.progress_token]
        self.last_active = time.monotonic()
        self._maybe_resume()

    def open_get_stream(self) -> Exchange | None:
        if self.get_stream is not None:
            return None
        ex = self.get_stream = Exchange(b"GET")
        while self._unrouted:
            ex.queue.put_nowait(self._unrouted.popleft())
        return ex

    def close_get_stream(self, ex: Exchange) -> None:
        if self.get_stream is ex:
            self.get_stream = None
            # Messages it did not deliver wait for the next GET stream.
            while not ex.queue.empty():
                line = ex.queue.get_nowait()
                if line:
                    self._unrouted.append(line)

    def delivered(self) -> None:
        """A consumer took a message off a queue: reading may resume."""
        self._maybe_resume()

    # ------------------------------------------------------------ from the relay
    def _on_data(self, data: bytes) -> None:
        for line in self._framer.feed(data):
            if type(line) is bytes and line:
                self._route(line)
            elif not isinstance(line, bytes):
                # The relay writes only lines it framed itself: this is a bug, not an attack.
                log.error("relay_output_refused", mcp_session=self.sid, frame=repr(line))
        if self._queued() > _QUEUED_HIGH:
            self._paused = True
            if self._from_relay is not None:
                self._from_relay.pause_reading()

    def _maybe_resume(self) -> None:
        if self._paused and self._queued() <= _QUEUED_HIGH // 2:
            self._paused = False
            if self._from_relay is not None and not self.ended:
                self._from_relay.resume_reading()

    def _queued(self) -> int:
        waiting = sum(ex.queue.qsize() for ex in self.exchanges.values())
        return waiting + (self.get_stream.queue.qsize() if self.get_stream is not None else 0)

    def _on_eof(self) -> None:
        log.debug("relay_output_closed", mcp_session=self.sid)
        self._output_over = True
        if self._relay_over:
            self._finish()

    def _route(self, line: bytes) -> None:
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            log.error("relay_output_not_json", mcp_session=self.sid, size=len(line))
            return
        if not isinstance(obj, dict):
            log.error("relay_output_not_an_object", mcp_session=self.sid, size=len(line))
            return
        method = obj.get("method")
        if method is None:
            ex = self.exchanges.get(id_key(obj.get("id")))
            if ex is None:
                # Its request's HTTP exchange is gone (the client disconnected): nowhere to deliver.
                log.warning("response_without_waiting_request", mcp_session=self.sid, id=obj.get("id"))
                return
            ex.queue.put_nowait(line)
            return
        if method == "notifications/progress" and "id" not in obj:
            params = obj.get("params")
            token = params.get("progressToken") if isinstance(params, dict) else None
            if token is not None and (ex := self._by_token.get(id_key(token))) is not None:
                ex.queue.put_nowait(line)
                return
        if self.exchanges:
            next(reversed(self.exchanges.values())).queue.put_nowait(line)
        elif self.get_stream is not None:
            self.get_stream.queue.put_nowait(line)
        else:
            if len(self._unrouted) == self._unrouted.maxlen:
                log.warning("unrouted_message_dropped", mcp_session=self.sid)
            self._unrouted.append(line)


class _LineReader(asyncio.Protocol):
    def __init__(self, on_data: Callable[[bytes], None], on_eof: Callable[[], None]) -> None:
        self._on_data = on_data
        self._on_eof = on_eof

    def data_received(self, data: bytes) -> None:
        self._on_data(data)

    def eof_received(self) -> bool:
        self._on_eof()
        return False
