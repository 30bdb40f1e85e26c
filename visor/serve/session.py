"""One MCP session of the gateway: a relay attached in memory, and the routing of its output.

The gateway hands each client message, already held to the wire rules, as one line to the relay
(`Relay.client_data`, through a `ClientPort`); the relay (the stdio driver, unchanged) judges it
exactly as it judges a line from a stdio client. What the relay writes to its client output is
framed here and routed as it is written:

* a response goes to the HTTP request waiting for its id (the JSON-RPC id, type included);
* a progress notification goes to the request that gave its `progressToken`;
* anything else (a server's request, a log line, a list change) goes to the request most
  recently opened and still waiting, else to the GET stream, else waits (bounded) for a GET
  stream to open. Over stdio nothing ties a server's request to the client request that caused
  it; the newest open request is the likeliest cause, and the SDK client takes either.

There used to be two OS pipes here, one each way: every message then cost a write and a read
system call and an event-loop turn more in each direction, in the same process. Flow control
is what the pipes gave: the relay pauses its input (the server's stdin full, a backlog behind a
held call) and `send` waits for room; the session pauses the relay's output while more than
`_QUEUED_HIGH` messages wait for slow HTTP clients, and the relay then stops reading its server.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from visor.logs import get_logger
from visor.relay.memory import MemoryWriteTransport
from visor.relay.proxy import ClientPort, Relay
from visor.wire.framer import Framer

log = get_logger("visor.serve")

# Messages kept for a GET stream that is not open yet; older ones are dropped (and logged).
_UNROUTED_KEEP = 1000
# Reading the relay's output pauses while this many messages wait for slow HTTP clients.
_QUEUED_HIGH = 1024

# What an exchange's queue yields when the session ended before its answer.
ENDED = b""


class Inbox:
    """The messages routed to one HTTP request, and its wait for the next: the part of
    `asyncio.Queue` the gateway uses, for one reader. One is made per request, and a Queue's
    construction and its getters' bookkeeping were the largest item of the session's own code in
    a pipelined profile."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: collections.deque[bytes] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: bytes) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> bytes:
        while not self._items:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    def get_nowait(self) -> bytes:
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.popleft()

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items


# Events of one request's stream kept for a client that reconnects with Last-Event-ID.
_SENT_KEEP = 256
# How long a request whose stream broke before its answer waits for the client to resume it.
RESUME_GRACE_S = 120.0


@dataclass(slots=True, eq=False)
class Exchange:
    """One HTTP request's wait: the messages routed to it, the last being its response.

    Once its answer goes out as an event stream, the stream has a number and each event an id
    `STREAM.N` (`sent` keeps the last ones), so that a client whose stream broke can resume it."""

    key: bytes
    queue: Inbox = field(default_factory=Inbox)
    progress_token: bytes | None = None
    stream: int = 0
    sent: collections.deque[tuple[int, bytes]] = field(
        default_factory=functools.partial(collections.deque, maxlen=_SENT_KEEP)
    )
    seq: int = 0
    detached: asyncio.TimerHandle | None = None
    # The response line routed here, as routed (identity marks it), and whether it is a result:
    # read once by the routing, which parses every line anyway.
    answer: bytes | None = None
    answer_ok: bool = False

    def event(self, line: bytes) -> bytes:
        """`line` as the next event of this stream, with its id."""
        self.seq += 1
        self.sent.append((self.seq, line))
        return b"id: %d.%d\nevent: message\ndata: %s\n\n" % (self.stream, self.seq, line)

    def replay_after(self, seq: int) -> list[bytes] | None:
        """The events after `seq`, or None when they are no longer all kept."""
        kept = [(n, line) for n, line in self.sent if n > seq]
        if seq < self.seq and (not kept or kept[0][0] != seq + 1):
            return None
        return [b"id: %d.%d\nevent: message\ndata: %s\n\n" % (self.stream, n, line) for n, line in kept]


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
        self._stream_count = 0
        self._detached: dict[int, Exchange] = {}
        self._unrouted: collections.deque[bytes] = collections.deque(maxlen=_UNROUTED_KEEP)
        self._framer = Framer(max_message_bytes)
        self._on_end = on_end
        self._input = _RelayInput(self)
        # Where a stdio client's stdout pipe would be: what the relay writes is framed and routed
        # at once; the "buffer" is the messages routed and not yet taken by their HTTP requests.
        self._output = MemoryWriteTransport(self._on_data, self._queued, self._on_eof)
        self._task: asyncio.Task[int] | None = None
        # The relay's input: whether it takes bytes now (it starts paused: not connected yet),
        # what waits for it to (sent without waiting: a cancel), and how it ended.
        self._reading = False
        self._connected = False
        self._held: collections.deque[bytes] = collections.deque()
        # Messages taken this turn, handed to the relay together on the next: one core event and
        # one audit hand-off for a window of pipelined requests, as one read of a pipe gave.
        self._outbox: list[bytes] = []
        self._outbox_scheduled = False
        self._room = asyncio.Event()
        self._eof_wanted = False
        self._eof_sent = False
        self._input_closed = False
        # The relay's output: paused while slow HTTP clients leave too many messages queued.
        self._paused = False
        self._relay_over = False
        self._output_over = False
        self.ended = False
        # Ended here but not for other replicas (`--state`): an idle expiry, not a DELETE.
        self.keep_in_store = False

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the relay (and with it the upstream), attached to this session."""
        self._task = asyncio.get_running_loop().create_task(
            self.relay.run_attached(ClientPort(self._input, self._output))
        )
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
        # The relay is over: nothing more reaches it, and whoever waits for room hears so.
        self._input_closed = True
        self._held.clear()
        self._outbox.clear()
        self._room.set()
        for ex in list(self.exchanges.values()):
            ex.queue.put_nowait(ENDED)
        if self.get_stream is not None:
            self.get_stream.queue.put_nowait(ENDED)
        for ex in list(self._detached.values()):  # nobody will resume a stream of an ended session
            if ex.detached is not None:
                ex.detached.cancel()
            self.close_exchange(ex)
        self._detached.clear()

    async def end(self, grace: float) -> None:
        """End the session as a stdio client would: EOF on the relay's input, then wait for it.

        The relay closes the server's stdin, waits its shutdown grace, escalates, and reaps the
        process (or DELETEs the upstream HTTP session); the wait here is a bound on all that.
        """
        if not self.ended:
            self.ended = True
            self._on_end(self)
        self._end_input()
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
        """One client message, already checked, to the relay once it takes input (handed over on
        the next turn of the loop, with the others of this turn)."""
        while True:
            if self.ended or self._input_closed or self._eof_wanted:
                raise ConnectionError("the session has ended")
            if self._reading and not self._held:
                break
            self._room.clear()
            await self._room.wait()
        self._post(line)

    def send_nowait(self, line: bytes) -> None:
        """One message to the relay without waiting for room (a cancel, as its request ends):
        held, in order, while the relay's input is paused."""
        if self.ended or self._input_closed or self._eof_wanted:
            return
        if self._reading and not self._held:
            self._post(line)
        else:
            self._held.append(line)

    def _post(self, line: bytes) -> None:
        self._outbox.append(line)
        self._outbox.append(b"\n")
        if not self._outbox_scheduled:
            self._outbox_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_outbox)

    def _flush_outbox(self) -> None:
        self._outbox_scheduled = False
        if self._outbox and not self._input_closed and not self._eof_sent:
            data = b"".join(self._outbox)
            self._outbox.clear()
            self.relay.client_data(data)

    def _end_input(self) -> None:
        """The client's end, as a stdio client's closed stdin: after what is held, paused or not
        (an end carries no data to hold back); at once if the relay is connected, else then."""
        if self._eof_wanted or self._input_closed:
            return
        self._eof_wanted = True
        self._room.set()
        if self._connected:
            self._release(force=True)

    def _release(self, force: bool = False) -> None:
        """Hand the relay what waited for it to read: held messages, then the end if asked."""
        self._flush_outbox()
        while self._held and (self._reading or force) and not self._input_closed:
            self.relay.client_data(self._held.popleft() + b"\n")
        if self._input_closed:
            self._held.clear()
        elif self._eof_wanted and not self._held and not self._eof_sent:
            self._eof_sent = True
            self.relay.client_eof()
        if (self._reading and not self._held) or self._input_closed or self._eof_wanted:
            self._room.set()

    # The relay's calls on its input (`_RelayInput`), as on a stdin pipe.
    def _input_paused(self) -> None:
        self._reading = False

    def _input_resumed(self) -> None:
        self._reading = True
        if not self._connected:
            self._connected = True
            if self._eof_wanted:
                self._release(force=True)
                return
        if self._held:
            # Not from inside the relay's own call: the held messages go on the next turn.
            asyncio.get_running_loop().call_soon(self._release)
        else:
            self._room.set()

    def _input_closed_by_relay(self) -> None:
        # The relay closed its input (its client output was lost): as with a pipe, that close is
        # the input's end, seen by the relay on the next turn.
        self._input_closed = True
        self._held.clear()
        self._room.set()
        asyncio.get_running_loop().call_soon(self._closed_input_ends)

    def _closed_input_ends(self) -> None:
        if not self._eof_sent and not self._relay_over and self._task is not None and not self._task.done():
            self._eof_sent = True
            self.relay.client_eof()

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

    def new_stream(self, ex: Exchange) -> None:
        """Number `ex`'s event stream (a stream's events carry its number in their ids)."""
        self._stream_count += 1
        ex.stream = self._stream_count

    def detach(self, ex: Exchange) -> None:
        """`ex`'s stream broke before its answer: keep routing to it for a while, for the client to
        resume it with Last-Event-ID (its call runs on: on 2025-11-25 that is no cancellation)."""
        if ex.detached is not None or self.exchanges.get(ex.key) is not ex:
            return
        self._detached[ex.stream] = ex
        ex.detached = asyncio.get_running_loop().call_later(RESUME_GRACE_S, self._give_up, ex)
        log.info("stream_detached", mcp_session=self.sid, stream=ex.stream)

    def _give_up(self, ex: Exchange) -> None:
        if self._detached.get(ex.stream) is ex:
            del self._detached[ex.stream]
            log.info("stream_not_resumed", mcp_session=self.sid, stream=ex.stream)
            self.close_exchange(ex)

    def resume(self, last_event_id: str) -> tuple[Exchange, list[bytes]] | None:
        """The detached request stream `last_event_id` names, and the events the client missed;
        None when there is none to resume (the id is another stream's, unknown, or too old)."""
        stream, dot, seq = last_event_id.partition(".")
        if not (dot and _ascii_number(stream) and _ascii_number(seq)):
            return None
        ex = self._detached.get(int(stream))
        if ex is None:
            return None
        replay = ex.replay_after(int(seq))
        if replay is None:
            return None
        del self._detached[ex.stream]
        if ex.detached is not None:
            ex.detached.cancel()
            ex.detached = None
        return ex, replay

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
        if not self._paused and self._queued() > _QUEUED_HIGH:
            self._paused = True
            self._output.pause()

    def _maybe_resume(self) -> None:
        if self._paused and self._queued() <= _QUEUED_HIGH // 2:
            self._paused = False
            self._output.resume()

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
            ex.answer, ex.answer_ok = line, "result" in obj
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


class _RelayInput(asyncio.ReadTransport):
    """Where a stdio client's stdin pipe would be: the relay pauses, resumes and closes it."""

    def __init__(self, session: McpSession) -> None:
        super().__init__()
        self._session = session
        self._closing = False

    def pause_reading(self) -> None:
        self._session._input_paused()

    def resume_reading(self) -> None:
        if not self._closing:
            self._session._input_resumed()

    def is_reading(self) -> bool:
        return self._session._reading

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._session._input_paused()
            self._session._input_closed_by_relay()


def _ascii_number(text: str) -> bool:
    """1 to 11 ASCII digits (`str.isdigit` takes "²", which `int()` refuses)."""
    return 0 < len(text) < 12 and text.isascii() and text.isdigit()
