"""The asyncio session: two pumps, correlation tables, shutdown.

Both directions are driven by protocol callbacks rather than tasks: bytes
arrive in `data_received`, go through the framer and the validator, and are
written out in the same callback unless a verdict needs an async step (an
audit commit, an approval). An `Outbox` keeps the order of writes in each
direction even then. Back-pressure is transport flow control: when the
server's stdin (or the client's stdout) buffers past its high-water mark,
reading from the other side pauses until it drains.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import hashlib
import os
import signal
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from visor.approval.model import VISOR_ID_PREFIX, is_visor_rpc_id, new_rpc_id
from visor.gate import Answer, CallContext, Deferred, Drop, Forward, Gate
from visor.logs import get_logger
from visor.relay import upstream as upstream_mod
from visor.wire import errors
from visor.wire.framer import Framer, Oversize, Truncated
from visor.wire.message import Kind, Message, Rejected, classify, is_valid_id

log = get_logger("visor.relay")

_MISSING = object()
_READ_CHUNK = 256 * 1024
_MODERN_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
_MODERN_CAPS_KEY = "io.modelcontextprotocol/clientCapabilities"
_SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
# Methods beyond tools/call that the gate sees (visor/gating.py).
_GATED_CLIENT_METHODS = frozenset(("resources/read", "resources/subscribe", "prompts/get"))
# Answers that carry server content: indexed as untrusted output and redacted.
_REDACTED_RESULTS = frozenset(("resources/read", "prompts/get", "tasks/result"))
_GATED_SERVER_METHODS = frozenset(("sampling/createMessage", "elicitation/create"))


@dataclass(frozen=True, slots=True)
class RelayConfig:
    max_message_bytes: int = 16 * 1024 * 1024
    shutdown_grace: float = 5.0
    term_grace: float = 2.0
    max_pending: int = 10_000
    # Entries waiting in one direction's outbox before reading pauses.
    max_backlog: int = 4096


@dataclass(slots=True)
class PendingRequest:
    method: str
    msg: Message | None
    tool: str | None
    started: float
    forwarded: bool


@dataclass(slots=True)
class ProtocolState:
    """What the relay learns about the session from the traffic itself."""

    protocol_version: str | None = None
    client_capabilities: dict[str, Any] | None = None
    client_info: dict[str, Any] | None = None
    initialized: bool = False
    client_pending: dict[Any, PendingRequest] = field(default_factory=dict)
    server_pending: dict[Any, str] = field(default_factory=dict)


class Outbox:
    """Writes whole lines to a transport in the order they were submitted.

    Lines are gathered and written with one call per batch: a pipelined
    client sends many messages per read, and one write system call per
    message would cost more than everything else Visor does with them.
    """

    __slots__ = ("_batch", "_loop", "_on_idle", "_queue", "_scheduled", "_transport")

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: asyncio.WriteTransport) -> None:
        self._loop = loop
        self._transport = transport
        self._queue: collections.deque[asyncio.Future[bytes | None]] = collections.deque()
        self._on_idle: list[Callable[[], None]] = []
        self._batch: list[bytes] = []
        self._scheduled = False

    def write(self, line: bytes) -> None:
        if self._queue:
            fut: asyncio.Future[bytes | None] = self._loop.create_future()
            fut.set_result(line)
            self._queue.append(fut)
            return
        self._batch.append(line)
        self._batch.append(b"\n")
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        batch = self._batch
        if batch:
            self._batch = []
            if not self._transport.is_closing():
                self._transport.writelines(batch)

    def write_now(self, line: bytes) -> None:
        """Write ahead of the entries still waiting: Visor's own requests, which
        the entries waiting may themselves be waiting for (a call waiting for
        Visor's tools/list must not hold back that tools/list)."""
        self._batch.append(line)
        self._batch.append(b"\n")
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def write_later(self, fut: asyncio.Future[bytes | None]) -> None:
        self._queue.append(fut)
        fut.add_done_callback(self._release)

    @property
    def backlog(self) -> int:
        return len(self._queue)

    def when_idle(self, callback: Callable[[], None]) -> None:
        if self._queue:
            self._on_idle.append(callback)
        else:
            self.flush()
            callback()

    def _release(self, _: object = None) -> None:
        queue = self._queue
        while queue and queue[0].done():
            fut = queue.popleft()
            if fut.cancelled():
                continue
            exc = fut.exception()
            if exc is not None:
                log.error("outbox_entry_failed", error=repr(exc))
                continue
            data = fut.result()
            if data is not None:
                self._batch.append(data)
                self._batch.append(b"\n")
        self.flush()
        if not queue and self._on_idle:
            callbacks, self._on_idle = self._on_idle, []
            for cb in callbacks:
                cb()


class _ReadProtocol(asyncio.Protocol):
    def __init__(self, on_data: Callable[[bytes], None], on_eof: Callable[[], None]) -> None:
        self._on_data = on_data
        self._on_eof = on_eof
        self._ended = False

    def data_received(self, data: bytes) -> None:
        self._on_data(data)

    def eof_received(self) -> bool:
        self._end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            self._on_eof()


class _WriteProtocol(asyncio.Protocol):
    def __init__(
        self, pause: Callable[[], None], resume: Callable[[], None], lost: Callable[[], None]
    ) -> None:
        self._pause = pause
        self._resume = resume
        self._lost = lost
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def pause_writing(self) -> None:
        self._pause()

    def resume_writing(self) -> None:
        self._resume()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        self._lost()


class _FileWriteTransport(asyncio.WriteTransport):
    """Stdout that the event loop cannot watch (a regular file, /dev/null): write directly.

    Such writes cannot block for long. A failed write (a full disk, a
    descriptor opened for reading only) ends the client's side of the
    session the way a closed pipe does, through `lost`.
    """

    def __init__(self, fd: int, lost: Callable[[], None]) -> None:
        super().__init__()
        self._fd = fd
        self._closing = False
        self._lost = lost

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        except OSError as exc:
            log.warning("client_stdout_failed", error=exc.strerror or repr(exc))
            self._closing = True
            asyncio.get_running_loop().call_soon(self._lost)

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._closing = True

    def get_write_buffer_size(self) -> int:
        return 0


_PIPE_SIZE = 1 << 20
_F_SETPIPE_SZ = 1031


_LOG_CHARS = 200


def _short(value: object) -> str:
    """A client- or server-controlled value for a log line: its repr, at most _LOG_CHARS characters."""
    text = value if type(value) is str else repr(value)
    return text if len(text) <= _LOG_CHARS else f"{text[:_LOG_CHARS]}... ({len(text)} characters)"


class _LineDigests:
    """SHA-256 and size of every client line the framer drops, fed the same chunks.

    The framer discards a line over the limit as it streams in, so its bytes
    are gone by the time it is reported. This hashes the line that is still
    open at the end of each chunk (complete lines inside a chunk are never
    hashed unless the chunk itself is over the limit), and keeps a
    ``(size, sha256)`` for each line that ends over the limit, and for the
    partial line at EOF, in the order the framer reports them.
    Sizes and digests cover the line without its newline, a CR included.
    """

    __slots__ = ("_cr", "_hasher", "_held", "_limit", "found")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._hasher: Any = None
        self._held = 0  # bytes of the open line so far
        self._cr = False  # the open line's last byte is a CR
        self.found: collections.deque[dict[str, Any]] = collections.deque()

    def feed(self, data: bytes) -> None:
        first = data.find(b"\n")
        if first < 0:
            self._extend(data)
            return
        view = memoryview(data)
        if self._held:
            self._extend(view[:first])
            self._finish()
        elif first:
            self._whole(view[:first])
        if len(data) > self._limit + 1:
            # Only a chunk longer than the limit can hold a whole line over it.
            start = first + 1
            while True:
                nl = data.find(b"\n", start)
                if nl < 0:
                    break
                self._whole(view[start:nl])
                start = nl + 1
        else:
            start = data.rfind(b"\n") + 1
        if start < len(data):
            self._extend(view[start:])

    def eof(self) -> None:
        if self._held:
            self.found.append({"size": self._held, "digest": self._hasher.hexdigest()})
        self._reset()

    def _over(self, size: int, ends_with_cr: bool) -> bool:
        # The framer's rule: one trailing CR is not part of the line.
        return size - ends_with_cr > self._limit

    def _whole(self, line: memoryview) -> None:
        size = len(line)
        if size > self._limit and self._over(size, line[-1] == 13):
            self.found.append({"size": size, "digest": hashlib.sha256(line).hexdigest()})

    def _extend(self, part: bytes | memoryview) -> None:
        if not part:
            return
        if self._hasher is None:
            self._hasher = hashlib.sha256()
        self._hasher.update(part)
        self._held += len(part)
        self._cr = part[-1] == 13

    def _finish(self) -> None:
        if self._over(self._held, self._cr):
            self.found.append({"size": self._held, "digest": self._hasher.hexdigest()})
        self._reset()

    def _reset(self) -> None:
        self._hasher = None
        self._held = 0
        self._cr = False


def _pollable(fd: int) -> bool:
    """Whether the event loop can watch `fd`: a pipe, a socket or a terminal.

    Anything else (a regular file, /dev/null and other character devices) is
    refused by epoll, and uvloop aborts the whole process on it; those are
    read in a thread and written directly instead.
    """
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or (stat.S_ISCHR(mode) and os.isatty(fd))


def _fd_kind(fd: int) -> str:
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "not a pipe"


def _grow_pipe(fd: int) -> None:
    """Ask for 1 MiB pipe buffers: large messages then cross in a few system calls, not hundreds."""
    with contextlib.suppress(OSError):
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_SIZE)


class _ClientLink:
    """Visor's own messages to the client: elicitation requests, progress, cancellation.

    Request ids carry VISOR_ID_PREFIX and a random suffix; the relay refuses
    server requests with that prefix, so a response to one of Visor's ids is
    Visor's and is consumed here, never forwarded to the server.
    """

    def __init__(self, relay: Relay) -> None:
        self._relay = relay

    def request(self, method: str, params: dict[str, Any]) -> tuple[str, asyncio.Future[dict[str, Any]]]:
        relay = self._relay
        rpc_id = new_rpc_id()
        fut: asyncio.Future[dict[str, Any]] = relay._loop.create_future()
        if relay._client_closed:
            fut.set_result({"error": {"code": errors.INTERNAL_ERROR, "message": "the client is gone"}})
            return rpc_id, fut
        relay._visor_requests[rpc_id] = fut
        relay.to_client.write(
            orjson.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})
        )
        return rpc_id, fut

    def notify(self, method: str, params: dict[str, Any]) -> None:
        if not self._relay._client_closed:
            self._relay.to_client.write(orjson.dumps({"jsonrpc": "2.0", "method": method, "params": params}))

    def forget(self, rpc_id: str) -> None:
        self._relay._visor_requests.pop(rpc_id, None)

    def client_name(self) -> str | None:
        info = self._relay.state.client_info
        name = info.get("name") if info else None
        return name if type(name) is str else None


class _ServerLink:
    """Visor's own requests to the server (the tools/list fetched before a call
    that came before any listing).

    Ids carry VISOR_ID_PREFIX and 128 random bits; a response to one of them
    is Visor's, consumed by the relay and never forwarded to the client. The
    request goes out ahead of anything the Outbox holds back: the call that
    waits for it holds back the client's later messages, never Visor's own.
    """

    def __init__(self, relay: Relay) -> None:
        self._relay = relay

    def request(self, method: str, params: dict[str, Any]) -> tuple[str, asyncio.Future[dict[str, Any]]]:
        relay = self._relay
        rpc_id = new_rpc_id()
        fut: asyncio.Future[dict[str, Any]] = relay._loop.create_future()
        if relay._server_closed or relay._server_in.is_closing():
            fut.set_result({"error": {"code": errors.INTERNAL_ERROR, "message": "the server is gone"}})
            return rpc_id, fut
        relay._visor_server_requests[rpc_id] = fut
        relay.to_server.write_now(
            orjson.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})
        )
        return rpc_id, fut

    def forget(self, rpc_id: str) -> None:
        """No answer is awaited any more (a timeout): a late one is dropped and logged."""
        self._relay._visor_server_requests.pop(rpc_id, None)


class Relay:
    """One `visor run` session between a client's pipes and a server's."""

    def __init__(self, argv: list[str], config: RelayConfig, gate: Gate) -> None:
        self.argv = argv
        self.config = config
        self.gate = gate
        self.state = ProtocolState()
        self._client_framer = Framer(config.max_message_bytes)
        self._client_digests = _LineDigests(config.max_message_bytes)
        self._server_framer = Framer(config.max_message_bytes)
        self._client_closed = False
        self._server_closed = False
        self._stopping = False
        self.gate_closed = False
        self._pause_reasons: set[str] = set()
        # Visor's own requests to the client (approvals), by id.
        self._visor_requests: dict[str, asyncio.Future[dict[str, Any]]] = {}
        # Visor's own requests to the server (tools/list before a call), by id.
        self._visor_server_requests: dict[str, asyncio.Future[dict[str, Any]]] = {}

    # ------------------------------------------------------------------ setup
    async def run(self, client_in_fd: int, client_out_fd: int) -> int:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._server_eof = loop.create_future()
        self._upstream = await upstream_mod.spawn(self.argv)
        try:
            await self._connect(loop, client_in_fd, client_out_fd)
            self.gate.attach_client(_ClientLink(self))
            self.gate.attach_server(_ServerLink(self))
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self._on_signal, sig)
            returncode = await self._lifecycle()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            # Every exit path, an exception included: nothing of the server's
            # process group survives, and the server itself is reaped (no zombie).
            upstream_mod.kill_group(self._upstream.pid)
            await upstream_mod.reap(self._upstream)
        return upstream_mod.exit_status(returncode)

    async def _connect(self, loop: asyncio.AbstractEventLoop, client_in_fd: int, client_out_fd: int) -> None:
        up = self._upstream
        for fd in (up.stdin_fd, up.stdout_fd, client_in_fd, client_out_fd):
            _grow_pipe(fd)
        self._server_in_proto = _WriteProtocol(
            lambda: self._pause_client("server_stdin"),
            lambda: self._resume_client("server_stdin"),
            self._on_server_stdin_lost,
        )
        server_in, _ = await loop.connect_write_pipe(
            lambda: self._server_in_proto, os.fdopen(up.stdin_fd, "wb", 0)
        )
        self._server_in = server_in
        server_out, _ = await loop.connect_read_pipe(
            lambda: _ReadProtocol(self._on_server_data, self._on_server_eof), os.fdopen(up.stdout_fd, "rb", 0)
        )
        self._server_out = server_out

        if not _pollable(client_out_fd):
            log.info("client_stdout_not_a_pipe", kind=_fd_kind(client_out_fd))
            client_out: asyncio.WriteTransport = _FileWriteTransport(client_out_fd, self._on_client_gone)
            self._client_out_proto: _WriteProtocol | None = None
        else:
            self._client_out_proto = _WriteProtocol(
                lambda: self._pause_server("client_stdout"),
                lambda: self._resume_server("client_stdout"),
                self._on_client_gone,
            )
            client_out, _ = await loop.connect_write_pipe(
                lambda: self._client_out_proto, os.fdopen(client_out_fd, "wb", 0)
            )
        self._client_out = client_out
        self.to_server = Outbox(loop, server_in)
        self.to_client = Outbox(loop, client_out)

        if not _pollable(client_in_fd):
            log.info("client_stdin_not_a_pipe", kind=_fd_kind(client_in_fd))
            self._client_in: asyncio.ReadTransport | None = None
            loop.create_task(self._read_file(client_in_fd))
        else:
            self._client_in, _ = await loop.connect_read_pipe(
                lambda: _ReadProtocol(self._on_client_data, self._on_client_eof),
                os.fdopen(client_in_fd, "rb", 0),
            )

    async def _read_file(self, fd: int) -> None:
        # A regular file or a device cannot be watched by the event loop; read it in a thread.
        while True:
            try:
                data = await self._loop.run_in_executor(None, os.read, fd, _READ_CHUNK)
            except OSError as exc:
                log.warning("client_stdin_failed", error=exc.strerror or repr(exc))
                break
            if not data or self._client_closed:
                break
            self._on_client_data(data)
            while self._pause_reasons and not self._client_closed:
                await asyncio.sleep(0.001)
        self._on_client_eof()

    async def _lifecycle(self) -> int:
        await self._server_eof
        up = self._upstream
        returncode = await upstream_mod.stop(up, self.config.shutdown_grace, self.config.term_grace)
        await self._close_client_out()
        self.gate_closed = True
        await self.gate.close()
        log.info("session_end", returncode=returncode)
        return returncode

    async def _close_client_out(self) -> None:
        done = self._loop.create_future()
        self.to_client.when_idle(lambda: done.done() or done.set_result(None))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(done, 5.0)
        self._client_out.close()
        if self._client_out_proto is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._client_out_proto.closed), 5.0)

    # ----------------------------------------------------------- flow control
    def _pause_client(self, reason: str) -> None:
        if not self._pause_reasons and self._client_in is not None:
            self._client_in.pause_reading()
        self._pause_reasons.add(reason)

    def _resume_client(self, reason: str) -> None:
        self._pause_reasons.discard(reason)
        if not self._pause_reasons and self._client_in is not None and not self._client_closed:
            self._client_in.resume_reading()

    def _pause_server(self, reason: str) -> None:
        self._server_out.pause_reading()
        # Visor answers some client messages itself (rejections, denials): a
        # client that does not read them must not make them pile up here.
        self._pause_client(reason)

    def _resume_server(self, reason: str) -> None:
        if not self._server_closed:
            self._server_out.resume_reading()
        self._resume_client(reason)

    # ------------------------------------------------------ client -> server
    def _on_client_data(self, data: bytes) -> None:
        if self._client_closed:
            return
        digests = self._client_digests
        digests.feed(data)
        for event in self._client_framer.feed(data):
            if type(event) is bytes:
                try:
                    self._client_line(event)
                except Exception:
                    # One message must never stop the session: an exception
                    # escaping data_received closes the client's pipe.
                    log.exception("client_message_failed", size=len(event))
                    self.on_reject("client", "Visor failed while checking this message", None, event)
            else:
                self._client_frame_problem(event)
        if digests.found:
            # Never carried over to another chunk's lines (the framer reported fewer).
            digests.found.clear()
        self.to_server.flush()
        self.to_client.flush()
        if self.to_server.backlog > self.config.max_backlog:
            self._pause_client("backlog")
            self.to_server.when_idle(lambda: self._resume_client("backlog"))

    def _client_frame_problem(self, event: Oversize | Truncated) -> None:
        found = self._client_digests.found
        evidence = found.popleft() if found else {"size": event.size, "digest": None}
        if type(event) is Oversize:
            log.warning("client_message_too_large", size=event.size, limit=self.config.max_message_bytes)
            self.on_reject("client", "message larger than the limit", None, **evidence)
            self.to_client.write(
                errors.error_response(
                    None, errors.INVALID_REQUEST, f"message larger than {self.config.max_message_bytes} bytes"
                )
            )
        else:
            log.warning("client_partial_line_at_eof", size=event.size)
            self.on_reject("client", "stream ended inside a message", None, **evidence)

    def _client_line(self, line: bytes) -> None:
        if not line.strip(b" \t"):
            return
        msg = classify(line)
        if type(msg) is Rejected:
            self._reject_client(msg, line)
            return
        kind = msg.kind
        if kind is Kind.REQUEST:
            self._client_request(msg)
        elif kind is Kind.NOTIFICATION:
            self._client_notification(msg)
        else:
            self._client_response(msg)

    def _reject_client(self, rej: Rejected, line: bytes) -> None:
        log.warning(
            "client_message_rejected",
            reason=_short(rej.reason),
            code=rej.code,
            method=None if rej.method is None else _short(rej.method),
        )
        self.on_reject("client", rej.reason, rej, line)
        for msg_id in rej.reply_ids:
            self.to_client.write(errors.error_response(msg_id, rej.code, rej.reason))
        if rej.reply_null:
            self.to_client.write(errors.error_response(None, rej.code, rej.reason))

    def _client_request(self, msg: Message) -> None:
        state = self.state
        pending = state.client_pending
        if msg.id in pending:
            self._reject_client(
                Rejected(
                    errors.INVALID_REQUEST,
                    "id is already in use by a request in flight",
                    (msg.id,),
                    method=msg.method,
                ),
                msg.raw,
            )
            return
        if len(pending) >= self.config.max_pending:
            self.on_reject("client", "too many requests in flight", None, msg.raw)
            self.to_client.write(
                errors.error_response(msg.id, errors.INTERNAL_ERROR, "too many requests in flight")
            )
            return
        method = msg.method
        assert method is not None
        if method == "tools/call":
            self._client_tool_call(msg)
            return
        if method == "initialize":
            self._note_initialize(msg)
        line = msg.raw
        if method in _GATED_CLIENT_METHODS:
            try:
                verdict = self.gate.on_client_request(msg)
            except Exception:
                log.exception("gate_failed", method=_short(method))
                self.on_reject("client", "Visor could not check this request", None, msg.raw)
                verdict = errors.error_response(
                    msg.id, errors.INTERNAL_ERROR, "Visor could not check this request"
                )
            if verdict is not None:
                if not verdict.startswith(b"S"):
                    self.to_client.write(verdict)  # denied: the server never sees it
                    return
                line = verdict[1:]
        # a tools/list request is kept: its cursor tells which listing a page belongs to
        kept = msg if method == "tools/list" else None
        pending[msg.id] = PendingRequest(method, kept, None, time.perf_counter(), True)
        self.to_server.write(line)

    def _client_tool_call(self, msg: Message) -> None:
        ctx = self._call_context(msg)
        entry = PendingRequest("tools/call", msg, msg.tool, time.perf_counter(), False)
        pending = self.state.client_pending
        pending[msg.id] = entry
        try:
            verdict = self.gate.on_tool_call(msg, ctx)
        except Exception as exc:  # a bug in the gate must never turn into an allow
            log.exception("gate_failed", tool=_short(msg.tool))
            self.on_reject(
                "client", f"Visor failed while checking this call ({type(exc).__name__})", None, msg.raw
            )
            verdict = Answer(
                errors.tool_error_result(
                    msg.id,
                    f"Visor denied this call: internal error ({type(exc).__name__})",
                    modern=ctx.modern,
                )
            )
        if type(verdict) is Forward:
            entry.forwarded = True
            self.to_server.write(verdict.line)
        elif type(verdict) is Answer:
            del pending[msg.id]
            self.to_client.write(verdict.line)
        else:
            assert type(verdict) is Deferred
            self._defer(msg, entry, verdict)

    def _defer(self, msg: Message, entry: PendingRequest, verdict: Deferred) -> None:
        loop = self._loop
        out: asyncio.Future[bytes | None] = loop.create_future()

        def settle(fut: asyncio.Future[Forward | Answer | Drop | Deferred]) -> None:
            result: Forward | Answer | Drop | Deferred
            if fut.cancelled():
                result = Drop()
            elif fut.exception() is not None:
                log.error("gate_failed", error=_short(repr(fut.exception())), tool=_short(msg.tool))
                result = Answer(
                    errors.tool_error_result(msg.id, "Visor denied this call: internal error", modern=False)
                )
            else:
                result = fut.result()
            if type(result) is Deferred:
                # A verdict that needed a first step (Visor's own tools/list)
                # and now needs another (an audit commit, a human).
                if result.ordered:
                    result.future.add_done_callback(settle)  # keeps this place in line
                else:
                    out.set_result(None)  # a human's answer holds nothing back
                    self._defer(msg, entry, result)
                return
            if self.state.client_pending.get(msg.id) is not entry:
                # Cancelled by the client while it waited: nothing goes anywhere.
                if type(result) is Forward:
                    log.info("withdrawn_before_relay", request_id=_short(msg.id), tool=_short(msg.tool))
                    try:
                        self.gate.on_withdrawn(msg)
                    except Exception:
                        log.exception("gate_failed", tool=_short(msg.tool))
                out.set_result(None)
                return
            if type(result) is Forward:
                entry.forwarded = True
                out.set_result(result.line)
                return
            del self.state.client_pending[msg.id]
            if type(result) is Answer:
                self.to_client.write(result.line)
            out.set_result(None)

        verdict.future.add_done_callback(settle)
        if verdict.ordered:
            self.to_server.write_later(out)
        else:
            out.add_done_callback(lambda f: f.result() is not None and self.to_server.write(f.result()))

    def _call_context(self, msg: Message) -> CallContext:
        params = msg.obj.get("params") or {}
        meta = params.get("_meta") if type(params) is dict else None
        version = self.state.protocol_version
        caps = self.state.client_capabilities
        token = None
        if type(meta) is dict:
            version = meta.get(_MODERN_VERSION_KEY, version)
            if type(meta.get(_MODERN_CAPS_KEY)) is dict:
                caps = meta[_MODERN_CAPS_KEY]
            token = meta.get("progressToken")
        return CallContext(
            modern=type(version) is str and version in errors.MODERN_PROTOCOL_VERSIONS,
            client_capabilities=caps,
            progress_token=token,
        )

    def _note_initialize(self, msg: Message) -> None:
        params = msg.obj.get("params") or {}
        caps = params.get("capabilities")
        if type(caps) is dict:
            self.state.client_capabilities = caps
        if type(params.get("clientInfo")) is dict:
            self.state.client_info = params["clientInfo"]

    def _client_notification(self, msg: Message) -> None:
        if msg.method == "notifications/cancelled":
            params = msg.obj.get("params") or {}
            target = params.get("requestId", _MISSING)
            # Only a valid id can name a request: anything else (an array, true
            # for 1, 1.0) names nothing, and is never hashed against the table.
            entry = self.state.client_pending.get(target) if is_valid_id(target) else None
            if entry is None or not entry.forwarded:
                # The server never saw that request: there is nothing for it to
                # cancel. A call waiting in Visor (for a human, or for its audit
                # commit) is withdrawn: it is never relayed and never answered.
                if entry is not None:
                    del self.state.client_pending[target]
                    try:
                        self.gate.cancel(target)
                    except Exception:
                        log.exception("cancel_failed", request_id=_short(target))
                log.info("cancel_absorbed", request_id=_short(target))
                return
        elif msg.method == "notifications/initialized":
            self.state.initialized = True
        self.to_server.write(msg.raw)

    def _client_response(self, msg: Message) -> None:
        if is_visor_rpc_id(msg.id):
            # An answer to Visor's own request (an approval): consumed here.
            fut = self._visor_requests.pop(msg.id, None)
            if fut is None:
                log.warning("client_response_unmatched", id=_short(msg.id))
                self.on_reject("client", "response to no request Visor sent", None, msg.raw)
            elif not fut.done():
                fut.set_result(msg.obj)
            return
        method = self.state.server_pending.pop(msg.id, None)
        if method is None:
            log.warning("client_response_unmatched", id=_short(msg.id))
            self.on_reject("client", "response to no request the server sent", None, msg.raw)
            return
        self.to_server.write(msg.raw)

    def _on_client_eof(self) -> None:
        if self._client_closed:
            return
        self._client_digests.eof()
        for event in self._client_framer.eof():
            self._client_frame_problem(event)
        self._client_closed = True
        log.info("client_closed")
        self._begin_shutdown()

    def _on_client_gone(self) -> None:
        # The client stopped reading our stdout: nobody can receive answers.
        if not self._client_closed:
            self._client_closed = True
            if self._client_in is not None:
                self._client_in.close()
            self._begin_shutdown()

    def _on_signal(self, sig: int) -> None:
        log.info("signal_received", signal=signal.Signals(sig).name)
        if self._client_in is not None and not self._client_closed:
            self._client_in.pause_reading()
        self._client_closed = True
        self._begin_shutdown()

    def _begin_shutdown(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        # Everything already accepted reaches the server before its stdin closes.
        self.to_server.when_idle(self._server_in.close)
        self._loop.create_task(self._escalate_if_stuck())

    async def _escalate_if_stuck(self) -> None:
        # The server may keep stdout open after its stdin closed; stop it in order.
        await upstream_mod.stop(self._upstream, self.config.shutdown_grace, self.config.term_grace)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._server_eof), 1.0)
        if not self._server_eof.done():
            self._server_out.close()
            self._server_eof.set_result(None)

    def _on_server_stdin_lost(self) -> None:
        if not self._stopping:
            log.info("server_stdin_closed")

    # ------------------------------------------------------ server -> client
    def _on_server_data(self, data: bytes) -> None:
        for event in self._server_framer.feed(data):
            if type(event) is bytes:
                try:
                    self._server_line(event)
                except Exception:
                    log.exception("server_message_failed", size=len(event))
                    self.on_reject("server", "Visor failed while checking this message", None, event)
            else:
                log.warning("server_message_dropped", reason=type(event).__name__, size=event.size)
                # The server's stream is not hashed as it streams (its large answers are
                # the hot path): a dropped server line is recorded by its size alone.
                self.on_reject("server", "message larger than the limit", None, size=event.size)
        self.to_client.flush()

    def _server_line(self, line: bytes) -> None:
        if not line.strip(b" \t"):
            return
        # Case-insensitive key matching is a server-side parser's habit;
        # what the server sends is held to exact duplicates only.
        msg = classify(line, fold_case=False)
        if type(msg) is Rejected:
            log.warning("server_message_rejected", reason=_short(msg.reason), code=msg.code)
            self.on_reject("server", msg.reason, msg, line)
            return
        kind = msg.kind
        if kind is Kind.RESPONSE:
            self._server_response(msg)
        elif kind is Kind.REQUEST:
            if is_visor_rpc_id(msg.id):
                # Visor's own requests to the client use this prefix; a server
                # request with it could collide with an approval, so it is refused.
                log.warning("server_request_reserved_id", id=_short(msg.id))
                self.on_reject(
                    "server", f"request id uses the reserved prefix {VISOR_ID_PREFIX!r}", None, msg.raw
                )
                self.to_server.write(
                    errors.error_response(
                        msg.id,
                        errors.INVALID_REQUEST,
                        f"request ids starting with {VISOR_ID_PREFIX!r} are reserved",
                    )
                )
                return
            pending = self.state.server_pending
            if msg.id in pending:
                log.warning("server_request_duplicate_id", id=_short(msg.id))
                return
            if len(pending) >= self.config.max_pending:
                # A client that never answers must not let the table grow without bound.
                self.to_server.write(
                    errors.error_response(
                        msg.id, errors.INTERNAL_ERROR, "too many requests waiting for the client"
                    )
                )
                return
            if msg.method in _GATED_SERVER_METHODS:
                try:
                    refusal = self.gate.on_server_request(msg)
                except Exception:
                    log.exception("gate_failed", method=msg.method)
                    refusal = errors.error_response(
                        msg.id, errors.INTERNAL_ERROR, "Visor could not check this request"
                    )
                if refusal is not None:
                    self.to_server.write(refusal)  # the client never sees a refused request
                    return
                try:
                    line = self.gate.rewrite_server_request(msg) or msg.raw
                except Exception:
                    log.exception("gate_failed", method=msg.method)
                    self.to_server.write(
                        errors.error_response(
                            msg.id, errors.INTERNAL_ERROR, "Visor could not check this request"
                        )
                    )
                    return
            else:
                line = msg.raw
            pending[msg.id] = msg.method  # type: ignore[assignment]
            self.to_client.write(line)
        else:
            if msg.method == "notifications/cancelled":
                params = msg.obj.get("params") or {}
                target = params.get("requestId", _MISSING)
                if is_visor_rpc_id(target):
                    # Only Visor may withdraw its own approval requests.
                    log.warning("server_cancel_reserved_id", id=repr(target))
                    return
                if not is_valid_id(target):
                    # It names no request the server could have sent.
                    log.warning("server_cancel_bad_id", id=_short(target))
                    self.on_reject(
                        "server", "notifications/cancelled without a valid requestId", None, msg.raw
                    )
                    return
                self.state.server_pending.pop(target, None)
            self.to_client.write(msg.raw)

    def _server_response(self, msg: Message) -> None:
        if is_visor_rpc_id(msg.id):
            fut = self._visor_server_requests.pop(msg.id, None)  # type: ignore[arg-type]
            if fut is not None:
                # The answer to Visor's own request: consumed here, never forwarded.
                if not fut.done():
                    fut.set_result(msg.obj)
                return
        entry = self.state.client_pending.get(msg.id, _MISSING)
        if entry is _MISSING or not entry.forwarded:  # type: ignore[union-attr]
            log.warning("server_response_unmatched", id=_short(msg.id))
            self.on_reject("server", "response to no request the client sent", None, msg.raw)
            return
        del self.state.client_pending[msg.id]
        assert isinstance(entry, PendingRequest)
        try:
            replacement = self._observe_response(entry, msg)
        except Exception:
            # Unobserved output must not reach the client unredacted or
            # unpinned: the client gets an error for its request instead.
            log.exception("server_response_check_failed", method=entry.method, id=_short(msg.id))
            replacement = errors.error_response(
                msg.id, errors.INTERNAL_ERROR, "Visor could not check the server's answer"
            )
        self.to_client.write(msg.raw if replacement is None else replacement)

    def _observe_response(self, entry: PendingRequest, msg: Message) -> bytes | None:
        replacement: bytes | None = None
        if entry.method == "tools/call":
            replacement = self.gate.on_tool_result(entry.msg, entry.tool, msg)
        elif entry.method == "tools/list":
            replacement = self.gate.on_tools_list(msg, entry.msg)
        elif entry.method in _REDACTED_RESULTS:
            replacement = self.gate.on_response(entry.method, msg)
        elif entry.method == "initialize":
            result = msg.obj.get("result")
            if type(result) is dict:
                if type(result.get("protocolVersion")) is str:
                    self.state.protocol_version = result["protocolVersion"]
                if type(result.get("serverInfo")) is dict:
                    self.gate.on_server_info(result["serverInfo"])
        elif entry.method == "server/discover":
            result = msg.obj.get("result")
            meta = result.get("_meta") if type(result) is dict else None
            if type(meta) is dict and type(meta.get(_SERVER_INFO_KEY)) is dict:
                self.gate.on_server_info(meta[_SERVER_INFO_KEY])
        return replacement

    def _on_server_eof(self) -> None:
        if self._server_closed:
            return
        self._server_closed = True
        for event in self._server_framer.eof():
            log.warning("server_message_dropped", reason=type(event).__name__, size=event.size)
            self.on_reject("server", "stream ended inside a message", None, size=event.size)
        log.info("server_stdout_closed")
        # Nothing will answer Visor's own requests now: whatever waits on them is denied.
        waiting, self._visor_server_requests = self._visor_server_requests, {}
        for fut in waiting.values():
            if not fut.done():
                fut.set_result({"error": {"code": errors.INTERNAL_ERROR, "message": "the server closed"}})
        if not self._server_eof.done():
            self._server_eof.set_result(None)
        if not self._stopping:
            self._stopping = True
            self.to_server.when_idle(self._server_in.close)

    def on_reject(
        self,
        direction: str,
        reason: str,
        rej: Rejected | None,
        line: bytes | None = None,
        *,
        size: int | None = None,
        digest: str | None = None,
    ) -> None:
        """Record one refusal: by the refused `line`'s size and SHA-256, or the given ones."""
        if line is not None:
            size, digest = len(line), hashlib.sha256(line).hexdigest()
        try:
            self.gate.on_reject(direction, reason, rej, size=size, digest=digest)
        except Exception:
            log.exception("reject_record_failed", direction=direction)
