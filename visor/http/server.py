"""HTTP/1.1 server for `visor serve`: llhttp parsing, one handler task per request, streamed answers.

The gateway answers small JSON bodies and event streams at one path. A general web framework pays
per request for what this never uses (a router of patterns, middleware chains, a request object of
dozens of lazily built fields, access logs, a task to read the connection and another to run the
handler); measured on this project's machine that was 140-190 µs of CPU per request, against
16-20 µs for the same exchange here (docs/benchmarks.md). This one does the narrow job:

- requests are parsed by llhttp (Node.js's parser, through httptools), which enforces the message
  syntax: chunked framing, one Content-Length, no Content-Length beside Transfer-Encoding, no bare
  CR or LF in a header. Limits llhttp has not are kept here: the request target
  (`MAX_TARGET_BYTES`, 414), the header section (`MAX_HEADER_BYTES` and `MAX_HEADERS`, 431), the
  time a request's head may take to arrive (`HEAD_TIMEOUT_SECONDS`), the time its body may take
  (`BODY_TIMEOUT_SECONDS`), and the body (`max_body`: bytes past it are counted, not kept);
- the handler starts when a request's head is complete, so it can refuse the request by its
  headers before its body is read; `Request.read()` waits for the body (sending `100 Continue`
  first when the client asked for it);
- requests pipelined on one connection are answered in order, one handler at a time; at most
  `MAX_QUEUED` are parsed ahead, then reading pauses;
- a client that goes away cancels its request's handler; writes to a connection that is gone
  raise `ConnectionResetError`;
- only the origin form of a request target (`/path?query`) is served; an upgrade (`Upgrade:`
  with `Connection: upgrade`) is answered as a plain request and the connection then closed.
"""

from __future__ import annotations

import asyncio
import collections
import socket
from collections.abc import Awaitable, Callable
from typing import Any, cast
from urllib.parse import parse_qs

import httptools
import orjson
from multidict import CIMultiDict

from visor.logs import get_logger

log = get_logger("visor.http.server")

#: The request line's target: longer ones are answered 414.
MAX_TARGET_BYTES = 8 * 1024
#: The header fields of one request, names and values together: more is answered 431.
MAX_HEADER_BYTES = 64 * 1024
#: Header fields in one request: more is answered 431.
MAX_HEADERS = 128
#: From a request's first byte to the end of its head; a slower client is disconnected.
HEAD_TIMEOUT_SECONDS = 30.0
#: How long `Request.read()` waits for the rest of a body; a slower client gets 408.
BODY_TIMEOUT_SECONDS = 60.0
#: An idle keep-alive connection is closed after this.
KEEPALIVE_SECONDS = 75.0
#: Pipelined requests parsed ahead of the one being answered; then reading pauses.
MAX_QUEUED = 8


class BodyTooLarge(Exception):
    """The request's body is over the server's `max_body`."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the body is over {limit} bytes")
        self.limit = limit


class BodyTimeout(Exception):
    """The request's body did not arrive within `BODY_TIMEOUT_SECONDS`."""


_REASONS = {
    100: "Continue", 200: "OK", 202: "Accepted", 204: "No Content", 400: "Bad Request",
    401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
    406: "Not Acceptable", 408: "Request Timeout", 409: "Conflict", 413: "Content Too Large",
    414: "URI Too Long", 415: "Unsupported Media Type", 417: "Expectation Failed",
    429: "Too Many Requests", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
    502: "Bad Gateway", 503: "Service Unavailable", 505: "HTTP Version Not Supported",
}  # fmt: skip


class Request:
    """One request: its head at once, its body through `read()`."""

    __slots__ = (
        "_chunks",
        "_complete",
        "_conn",
        "_continue",
        "_lost",
        "_query",
        "_size",
        "_too_large",
        "_waiter",
        "content_length",
        "headers",
        "keep_alive",
        "method",
        "path",
        "query_string",
        "transport",
        "version",
    )  # fmt: skip

    def __init__(
        self,
        conn: _Connection,
        method: str,
        target: str,
        version: str,
        headers: CIMultiDict[str],
        keep_alive: bool,
    ) -> None:
        self._conn = conn
        self.method = method
        self.path, _, self.query_string = target.partition("?")
        self.version = version
        self.headers = headers
        self.transport: asyncio.Transport | None = conn.transport
        self.keep_alive = keep_alive
        length = headers.get("Content-Length")
        # llhttp has checked it is one decimal number.
        self.content_length = int(length) if length is not None else None
        self._chunks: list[bytes] = []
        self._size = 0
        self._complete = False
        self._too_large = False
        self._lost = False
        self._waiter: asyncio.Future[None] | None = None
        self._continue = headers.get("Expect", "").lower() == "100-continue"
        self._query: dict[str, list[str]] | None = None

    @property
    def query(self) -> dict[str, list[str]]:
        if self._query is None:
            self._query = parse_qs(self.query_string, keep_blank_values=True)
        return self._query

    @property
    def body_exists(self) -> bool:
        return bool(self.content_length) or "Transfer-Encoding" in self.headers

    async def read(self) -> bytes:
        """The whole body; `BodyTooLarge` past the server's limit, `BodyTimeout` when it is slow,
        `ConnectionResetError` when the client went away."""
        if not self._complete and not self._lost and self._continue:
            self._continue = False
            if self.transport is not None and not self.transport.is_closing():
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if not self._complete and not self._lost and not self._too_large:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(BODY_TIMEOUT_SECONDS):
                    await waiter
            except TimeoutError:
                self.keep_alive = False
                raise BodyTimeout(f"the body took over {BODY_TIMEOUT_SECONDS:g} s") from None
            finally:
                self._waiter = None
        if self._too_large:
            raise BodyTooLarge(self._conn.server.max_body)
        if self._lost and not self._complete:
            raise ConnectionResetError("the client went away before its body was complete")
        return self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)

    # The connection's side.
    def _feed(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self._conn.server.max_body:
            if not self._too_large:
                self._too_large = True
                self._chunks.clear()
                # The rest of the body is read and dropped; the connection is not kept after it.
                self.keep_alive = False
                self._wake()
            return
        self._chunks.append(data)

    def _finish(self) -> None:
        self._complete = True
        self._wake()

    def _abort(self) -> None:
        self._lost = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Response:
    """A whole response: written at once, with its Content-Length."""

    __slots__ = ("body", "headers", "status")

    def __init__(
        self,
        *,
        status: int = 200,
        body: bytes = b"",
        text: str | None = None,
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status = status
        self.body = text.encode() if text is not None else body
        self.headers = dict(headers) if headers else {}
        if content_type is not None:
            self.headers["Content-Type"] = content_type
        elif text is not None and "Content-Type" not in self.headers:
            self.headers["Content-Type"] = "text/plain; charset=utf-8"


def json_response(data: Any, *, status: int = 200) -> Response:
    return Response(status=status, body=orjson.dumps(data), content_type="application/json")


class StreamResponse:
    """A response written as it goes (an event stream): chunked, after `prepare()`."""

    __slots__ = ("_chunked", "_conn", "finished", "headers", "prepared", "status")

    def __init__(self, *, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.headers = dict(headers) if headers else {}
        self._conn: _Connection | None = None
        self._chunked = True
        self.prepared = False
        self.finished = False

    async def prepare(self, request: Request) -> None:
        if self.prepared:
            return
        conn = request._conn
        self._conn = conn
        self.prepared = True
        self._chunked = conn.write_head(request, self.status, self.headers, None)

    async def write(self, data: bytes) -> None:
        conn = self._conn
        if conn is None or self.finished:
            raise RuntimeError("write() before prepare() or after write_eof()")
        if data:
            conn.write(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data)
            await conn.drain()

    async def write_eof(self) -> None:
        conn = self._conn
        if conn is None or self.finished:
            return
        self.finished = True
        if self._chunked:
            conn.write(b"0\r\n\r\n")
            await conn.drain()


# What a handler answers with.
Answer = Response | StreamResponse
Handler = Callable[[Request], Awaitable[Answer]]


def _error_body(message: str) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}})


class _Connection(asyncio.Protocol):
    """One client connection: the llhttp parser, the queue of parsed requests, the handler task."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._url = bytearray()
        self._fields: list[tuple[str, str]] = []
        self._head_bytes = 0
        self._in_head = False
        self._messages = 0
        self._parsing: Request | None = None
        self._queue: collections.deque[Request] = collections.deque()
        self.task: asyncio.Task[None] | None = None
        self._current: Request | None = None
        self._reading_paused = False
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        # No more requests are read (the client asked for an upgrade): what is queued
        # is answered, then the connection closed.
        self._no_more_input = False
        self._closing = False
        self._lost = False
        # The status to answer when the parser stops on a limit of ours, not a syntax error.
        self._refusal: tuple[int, str] | None = None

    # ------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.server.connections.add(self)
        self._arm(HEAD_TIMEOUT_SECONDS)

    def data_received(self, data: bytes) -> None:
        if self._closing or self._no_more_input:
            return
        messages = self._messages
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._end_of_input()
            return
        except httptools.HttpParserError as exc:
            status, message = self._refusal or (400, f"Bad Request: not valid HTTP/1.1 ({exc})")
            self._refuse(status, message)
            return
        if self._in_head and messages == self._messages:
            # A head begun in an earlier read and still incomplete: its bytes count toward the
            # head's limit here, since llhttp keeps a partial name or value until it ends.
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEADER_BYTES:
                self._refuse(431, f"Request Header Fields Too Large: at most {MAX_HEADER_BYTES} bytes")

    def eof_received(self) -> bool:
        # The client closed its side: taken as gone (as browsers and HTTP clients mean it), so a
        # stream it no longer reads is ended and its handler cancelled.
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._closing = True
        self.server.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for request in (self._parsing, self._current, *self._queue):
            if request is not None:
                request._abort()
        self._queue.clear()
        if self.task is not None:
            self.task.cancel()
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_exception(ConnectionResetError("the client went away"))

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    # ------------------------------------------------------------ llhttp callbacks
    def on_message_begin(self) -> None:
        self._messages += 1
        self._url.clear()
        self._fields = []
        self._head_bytes = 0
        self._in_head = True
        self._arm(HEAD_TIMEOUT_SECONDS)

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_TARGET_BYTES:
            self._refusal = (414, f"URI Too Long: at most {MAX_TARGET_BYTES} bytes")
            raise ValueError("target too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        fields = self._fields
        self._head_bytes += len(name) + len(value)
        if len(fields) >= MAX_HEADERS or self._head_bytes > MAX_HEADER_BYTES:
            self._refusal = (
                431,
                f"Request Header Fields Too Large: at most {MAX_HEADERS} fields, {MAX_HEADER_BYTES} bytes",
            )
            raise ValueError("header section too large")
        # UTF-8, bytes that are not kept as surrogates (never lost, never guessed).
        fields.append((name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        target = self._url.decode("utf-8", "surrogateescape")
        if not target.startswith("/"):
            # Absolute form (a proxy's), authority form (CONNECT) and `*`: not for this server.
            self._refusal = (400, "Bad Request: the request target must be a path")
            raise ValueError("not origin-form")
        parser = self._parser
        request = Request(
            self,
            parser.get_method().decode("ascii"),
            target,
            parser.get_http_version(),
            CIMultiDict(self._fields),
            # llhttp answers this only inside its callbacks.
            parser.should_keep_alive(),
        )
        expect = request.headers.get("Expect")
        if expect is not None and expect.lower() != "100-continue":
            self._refusal = (417, "Expectation Failed: only 100-continue is understood")
            raise ValueError("expectation")
        self._parsing = request
        self._queue.append(request)
        if len(self._queue) > MAX_QUEUED:
            self._pause_reading()
        if self.task is None:
            self._next()

    def on_body(self, body: bytes) -> None:
        if self._parsing is not None:
            self._parsing._feed(body)

    def on_message_complete(self) -> None:
        request = self._parsing
        self._parsing = None
        if request is not None:
            request._finish()

    # ------------------------------------------------------------ serving
    def _next(self) -> None:
        request = self._queue.popleft()
        if self._reading_paused and not self._no_more_input and len(self._queue) <= MAX_QUEUED // 2:
            self._reading_paused = False
            if self.transport is not None:
                self.transport.resume_reading()
        self._current = request
        self.task = self._loop.create_task(self._serve(request))

    async def _serve(self, request: Request) -> None:
        try:
            try:
                response = await self.server.handler(request)
            except (BodyTooLarge, BodyTimeout) as exc:
                response = _plain_error(exc)
            except (asyncio.CancelledError, ConnectionResetError):
                raise
            except Exception as exc:
                log.error(
                    "http_handler_failed", error=f"{type(exc).__name__}: {exc}", path=request.path[:200]
                )
                response = Response(
                    status=500, body=_error_body("Internal Server Error"), content_type="application/json"
                )
                request.keep_alive = False
            if isinstance(response, StreamResponse):
                if not response.prepared:
                    await response.prepare(request)
                await response.write_eof()
            else:
                self.write_head(request, response.status, response.headers, response.body)
        except ConnectionResetError:
            self._close()
            return
        finally:
            self.task = None
            self._current = None
        if self._lost:
            return
        if not request.keep_alive or self._closing or not request._complete:
            # Not kept: asked so, or a request whose body still arrives after its answer went out
            # (its bytes would have to be read to the end to find the next request).
            self._close()
        elif self._queue:
            self._next()
        elif self._no_more_input:
            self._close()
        elif self._parsing is None and not self._in_head:
            self._arm(KEEPALIVE_SECONDS)

    def write_head(self, request: Request, status: int, headers: dict[str, str], body: bytes | None) -> bool:
        """The status line and headers, and the whole body unless `body` is None. With None the
        body follows in pieces: True when they must be framed as chunks (HTTP/1.1)."""
        if self._lost or self.transport is None:
            raise ConnectionResetError("the client went away")
        chunked = body is None and request.version == "1.1"
        if body is None and not chunked:
            request.keep_alive = False  # HTTP/1.0: the body ends with the connection
        if self._closing or (self._no_more_input and not self._queue):
            request.keep_alive = False
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
        for name, value in headers.items():
            if any(c in name for c in "\r\n:") or any(c in value for c in "\r\n"):
                raise ValueError(f"response header {name!r} holds a character a header cannot carry")
            lines.append(f"{name}: {value}")
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        elif chunked:
            lines.append("Transfer-Encoding: chunked")
        if not request.keep_alive:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")
        if body and request.method != "HEAD":
            self.transport.write(head + body)
        else:
            self.transport.write(head)
        return chunked

    def write(self, data: bytes) -> None:
        if self._lost or self.transport is None:
            raise ConnectionResetError("the client went away")
        self.transport.write(data)

    async def drain(self) -> None:
        if self._lost:
            raise ConnectionResetError("the client went away")
        if not self._write_paused:
            return
        drain = self._drain
        if drain is None or drain.done():
            drain = self._drain = self._loop.create_future()
        await drain

    # ------------------------------------------------------------ internals
    def _refuse(self, status: int, message: str) -> None:
        """A request the parser cannot go on with: answered unless a handler is writing, then closed."""
        self._closing = True
        self._pause_reading()
        self._queue.clear()
        if self.task is None and self.transport is not None and not self._lost:
            body = _error_body(message)
            head = (
                f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            self.transport.write(head.encode() + body)
            self._close()

    def _end_of_input(self) -> None:
        self._no_more_input = True
        self._pause_reading()
        if self.task is None and not self._queue:
            self._close()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None and not self._lost:
            self._reading_paused = True
            self.transport.pause_reading()

    def _arm(self, seconds: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(seconds, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if self.task is None:
            self._close()

    def _close(self) -> None:
        self._closing = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def shut(self) -> asyncio.Task[None] | None:
        """Stop at once (the server is closing): the handler is cancelled, the connection closed."""
        self._closing = True
        task = self.task
        if task is not None:
            task.cancel()
        if self.transport is not None:
            self.transport.close()
        return task


def _plain_error(exc: BodyTooLarge | BodyTimeout) -> Response:
    if isinstance(exc, BodyTooLarge):
        status, message = 413, f"Content Too Large: at most {exc.limit} bytes"
    else:
        status, message = 408, f"Request Timeout: {exc}"
    return Response(status=status, body=_error_body(message), content_type="application/json")


class HttpServer:
    """`handler` served on any number of listening sockets (TCP or unix)."""

    def __init__(self, handler: Handler, *, max_body: int) -> None:
        self.handler = handler
        self.max_body = max_body
        self.connections: set[_Connection] = set()
        self._servers: list[asyncio.Server] = []

    async def listen(self, host: str, port: int) -> int:
        """Listen on HOST:PORT (address reuse on); the port bound (for port 0)."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(self._protocol, host, port, reuse_address=True, backlog=1024)
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def listen_socket(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self._servers.append(await loop.create_server(self._protocol, sock=sock, backlog=1024))

    async def listen_unix(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        self._servers.append(await loop.create_unix_server(self._protocol, path, backlog=1024))

    def _protocol(self) -> _Connection:
        conn = _Connection(self)
        return conn

    async def close(self, timeout: float = 1.0) -> None:
        """No new connections; handlers still running get `timeout` seconds, then are cancelled."""
        for server in self._servers:
            server.close()
        busy = [c for c in self.connections if c.task is not None]
        for conn in list(self.connections):
            if conn.task is None:
                conn.shut()
        if busy:
            tasks = [c.task for c in busy if c.task is not None]
            await asyncio.wait(tasks, timeout=timeout)
        tasks = [t for t in (conn.shut() for conn in list(self.connections)) if t is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
