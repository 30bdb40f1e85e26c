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
  (`BODY_TIMEOUT_SECONDS`), and the body (`max_body`, 413: a larger Content-Length is refused
  before any of it arrives, bytes past it are not kept, and a chunked body's framing and trailer
  may take no more bytes than the body itself plus `MAX_HEADER_BYTES`); only HTTP/1.0 and 1.1
  are served (505);
- connections are capped (`max_connections`): one accepted past the cap is answered 503 at once
  and closed, unparsed; each costs a descriptor and up to a head's bytes for the head timeout,
  and all that comes before the handler can check who the client is;
- a head's reads are held back from llhttp until its end (CRLF CRLF) or `HEAD_PIECE_BYTES` has
  come: llhttp grows a partial header name or value by copying it whole at each feed, so a head
  sent a byte at a time would otherwise cost its size squared;
- the handler starts when a request's head is complete, so it can refuse the request by its
  headers before its body is read; `Request.read()` waits for the body (sending `100 Continue`
  first when the client asked for it);
- requests pipelined on one connection are answered in order, one handler at a time; at most
  `MAX_QUEUED` are parsed ahead (also within one read: the rest of it waits, unparsed), then
  reading pauses; a request refused as malformed is answered after those before it, then the
  connection closed;
- a client that goes away cancels its request's handler; writes to a connection that is gone
  raise `ConnectionResetError`;
- only the origin form of a request target (`/path?query`) is served; an upgrade (`Upgrade:`
  with `Connection: upgrade`) is answered as a plain request and the connection then closed.
"""

from __future__ import annotations

import asyncio
import collections
import re
import socket
from collections.abc import Awaitable, Callable
from typing import Any, cast
from urllib.parse import parse_qs

import httptools
import orjson
from multidict import CIMultiDict

from visor.http.headers import unsafe_field
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
#: How long the rest of a body answered before it arrived is read (and dropped) before closing.
LINGER_SECONDS = 2.0
#: An idle keep-alive connection is closed after this.
KEEPALIVE_SECONDS = 75.0
#: A client that takes none of what is waiting for it for this long is disconnected: it would
#: otherwise hold its connection, and what is buffered for it, for ever.
WRITE_TIMEOUT_SECONDS = 60.0
#: Pipelined requests parsed ahead of the one being answered; then reading pauses.
MAX_QUEUED = 8
#: A head's reads are held back from llhttp until its end has come or they reach this size, so
#: llhttp sees a head in at most MAX_HEADER_BYTES / HEAD_PIECE_BYTES + 2 pieces.
HEAD_PIECE_BYTES = 4096
#: Connections served at once by default (`HttpServer(max_connections=...)`).
MAX_CONNECTIONS = 1024

# A byte that begins a request (llhttp skips the CR and LF a client may send between requests).
_NOT_CRLF = re.compile(rb"[^\r\n]")
# What ends the holding back of a head's reads: its end (CRLF CRLF), or a bare LF, which llhttp
# refuses at once (400). Held back, a head sent with bare LF line ends would wait, unanswered,
# for the head timeout. (A false find only feeds llhttp early.)
_FEED_NOW = re.compile(rb"\r\n\r\n|(?<!\r)\n")


def _feed_now(data: bytes, tail: bytes) -> bool:
    """Whether `data` holds a head's end or a bare LF (an LF first in `data` after a CR that
    ended the read before it is no bare LF: a head dripped a byte at a time is still held)."""
    found = _FEED_NOW.search(data)
    if found is not None and found.start() == 0 and data[:1] == b"\n" and tail.endswith(b"\r"):
        found = _FEED_NOW.search(data, 1)
    return found is not None


class BodyTooLarge(Exception):
    """The request's body is over the server's `max_body`."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the body is over {limit} bytes")
        self.limit = limit


class BodyTimeout(Exception):
    """The request's body did not arrive within `BODY_TIMEOUT_SECONDS`."""


class ServerBusy(Exception):
    """The bodies the server holds at once would pass its `max_held`: this one is refused (503)."""


class BodyInvalid(Exception):
    """The request's body broke the message syntax (a bad chunk) after its handler started."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


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
        "_answered",
        "_chunks",
        "_complete",
        "_conn",
        "_continue",
        "_discarding",
        "_invalid",
        "_kept",
        "_lost",
        "_overloaded",
        "_query",
        "_size",
        "_too_large",
        "_waiter",
        "_wire",
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
        # Bytes on the wire while the body is parsed (chunk framing and trailer included).
        self._wire = 0
        self._complete = False
        self._kept = 0
        self._discarding = False
        self._overloaded = False
        self._too_large = False
        if self.content_length is not None and self.content_length > conn.server.max_body:
            # Refused on its word: read() raises at once, and no 100 Continue invites the body.
            self._too_large = True
            self.keep_alive = False
        self._invalid: BodyInvalid | None = None
        self._lost = False
        # The status line and headers of its answer are written.
        self._answered = False
        self._waiter: asyncio.Future[None] | None = None
        # An HTTP/1.0 client's expectation is ignored (RFC 9110 10.1.1): it knows no 100.
        self._continue = version == "1.1" and headers.get("Expect", "").lower() == "100-continue"
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
        `BodyInvalid` when its framing is broken, `ConnectionResetError` when the client went away."""
        waiting = not (self._complete or self._lost or self._too_large or self._invalid or self._overloaded)
        if waiting and self._continue:
            self._continue = False
            if self.transport is not None and not self.transport.is_closing():
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if waiting:
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
        if self._overloaded:
            raise ServerBusy("the server holds too many request bodies at once")
        if self._invalid is not None:
            raise self._invalid
        if self._lost and not self._complete:
            raise ConnectionResetError("the client went away before its body was complete")
        return self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)

    # The connection's side.
    def _feed(self, data: bytes) -> None:
        self._size += len(data)
        server = self._conn.server
        if self._size > server.max_body:
            self._overflow()
            return
        if self._overloaded or self._discarding:
            return
        if server.held + len(data) > server.max_held:
            # Many clients each sending a body just under the limit (and holding it) must not
            # take the process's memory: past the server's budget a body is refused, not kept.
            self._overloaded = True
            self._release()
            self.keep_alive = False
            self._wake()
            self._conn._discard()
            return
        server.held += len(data)
        self._kept += len(data)
        self._chunks.append(data)

    async def _drain_body(self) -> None:
        """Its answer went out before its body arrived (refused by its headers): the rest is read
        and dropped, for up to `LINGER_SECONDS`, so that the client finishes sending and reads the
        answer instead of a broken pipe. The connection is closed after it all the same."""
        self._discarding = True
        self._release()
        if self._complete or self._lost or self._too_large:
            return
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(LINGER_SECONDS):
                await waiter
        except TimeoutError:
            pass
        finally:
            self._waiter = None

    def _release(self) -> None:
        """The body's bytes are no longer held here (answered, refused, or the client is gone)."""
        self._conn.server.held -= self._kept
        self._kept = 0
        self._chunks.clear()

    def _wired(self, size: int) -> None:
        # httptools keeps a trailer field's name and value until the field ends, and a chunk's
        # size line and extensions are no body bytes: without this a chunked body of three bytes
        # could be followed by a trailer field as long as the client likes, all of it held. The
        # framing may be as large as the body (chunks of a few bytes) and MAX_HEADER_BYTES more.
        self._wire += size
        if self._wire - self._size > self._size + MAX_HEADER_BYTES:
            self._overflow()

    def _overflow(self) -> None:
        if not self._too_large:
            self._too_large = True
            self._release()
            # The connection is not kept after it.
            self.keep_alive = False
            self._wake()
        # The rest of the input is read and dropped, never parsed (a trailer would be held).
        self._conn._discard()

    def _fail(self, status: int, message: str) -> None:
        self._invalid = BodyInvalid(status, message)
        self.keep_alive = False
        self._wake()

    def _finish(self) -> None:
        self._complete = True
        self._wake()

    def _abort(self) -> None:
        self._lost = True
        self._release()
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

    __slots__ = ("_chunked", "_conn", "_head_only", "finished", "headers", "prepared", "status")

    def __init__(self, *, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.headers = dict(headers) if headers else {}
        self._conn: _Connection | None = None
        self._chunked = True
        # An answer to HEAD: its head says what GET's would, and no byte of a body follows (one
        # would be read as the start of the connection's next answer).
        self._head_only = False
        self.prepared = False
        self.finished = False

    async def prepare(self, request: Request) -> None:
        if self.prepared:
            return
        conn = request._conn
        self._chunked = conn.write_head(request, self.status, self.headers, None)
        self._head_only = request.method == "HEAD"
        # Only once its head is out (write_head refuses a header with a line break): a stream
        # whose head was refused is not one the server may end with a zero chunk.
        self._conn = conn
        self.prepared = True

    async def write(self, data: bytes) -> None:
        conn = self._conn
        if conn is None or self.finished:
            raise RuntimeError("write() before prepare() or after write_eof()")
        if data and not self._head_only:
            conn.write(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data)
            await conn.drain()

    async def write_eof(self) -> None:
        conn = self._conn
        if conn is None or self.finished:
            return
        self.finished = True
        if self._chunked and not self._head_only:
            conn.write(b"0\r\n\r\n")
            await conn.drain()


# What a handler answers with.
Answer = Response | StreamResponse
Handler = Callable[[Request], Awaitable[Answer]]


def _error_body(message: str) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}})


def _busy_answer() -> bytes:
    body = _error_body("Service Unavailable: too many connections; retry later")
    head = (
        f"HTTP/1.1 503 {_REASONS[503]}\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


# What a connection past `max_connections` is answered, whatever it sends.
_TOO_MANY_CONNECTIONS = _busy_answer()


class _Connection(asyncio.Protocol):
    """One client connection: the llhttp parser, the queue of parsed requests, the handler task."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._url = bytearray()
        self._fields: list[tuple[str, str]] = []
        # The head's limit, two ways, each a lower bound of its size (so neither counts a byte
        # twice): the names and values of its fields, and the bytes of reads wholly inside it
        # (llhttp keeps a partial name or value until it ends, so that one is counted as it comes).
        self._field_bytes = 0
        self._head_bytes = 0
        self._head_deadline = 0.0
        self._in_head = False
        # Reads of a head held back from llhttp (`_gather`), and when the first byte of a head
        # llhttp has not seen yet came (its head timer runs from then, not from when it is fed).
        self._gathered = bytearray()
        self._head_start: float | None = None
        # The last 3 bytes read: a CRLF CRLF may be split across reads.
        self._tail = b""
        self._messages = 0
        self._parsing: Request | None = None
        self._queue: collections.deque[Request] = collections.deque()
        # Bytes read but not parsed yet: MAX_QUEUED requests were parsed ahead.
        self._backlog = b""
        self.task: asyncio.Task[None] | None = None
        self._current: Request | None = None
        self._reading_paused = False
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        # No more requests are read (the client asked for an upgrade, a request was malformed or
        # too large): what is queued is answered, then the connection closed.
        self._no_more_input = False
        # A malformed request's answer, written once the requests before it are answered.
        self._pending: tuple[int, str] | None = None
        self._closing = False
        self._lost = False
        # The status to answer when the parser stops on a limit of ours, not a syntax error.
        self._refusal: tuple[int, str] | None = None

    # ------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        server = self.server
        if len(server.connections) >= server.max_connections:
            # Refused before a byte is parsed, holding no timer and not counted: what it costs
            # ends once the answer (a few hundred bytes, taken by the socket's buffer) is out.
            self._closing = True
            self._no_more_input = True
            server.refused += 1
            self.transport.write(_TOO_MANY_CONNECTIONS)
            self.transport.close()
            return
        server.connections.add(self)
        self._arm(HEAD_TIMEOUT_SECONDS)

    def data_received(self, data: bytes) -> None:
        tail = self._tail
        self._tail = data[-3:] if len(data) >= 3 else (tail + data)[-3:]
        if self._closing or self._no_more_input:
            return
        if self._backlog:  # (reading is paused then; kept in order all the same)
            self._backlog += data
            return
        if self._parsing is None:
            # In a head or between requests (never inside a body: its bytes go to llhttp as they
            # come, for the handler reading it).
            gathered = self._gather(data, tail)
            if gathered is None:
                return
            self._parse(gathered)
            # Its time was taken by the head it began (on_message_begin), if any: a head that
            # begins later is timed from its own first byte.
            self._head_start = None
        else:
            self._parse(data)
        self._dispatch()

    def eof_received(self) -> bool:
        # The client closed its side: taken as gone (as browsers and HTTP clients mean it), so a
        # stream it no longer reads is ended and its handler cancelled.
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._closing = True
        self._backlog = b""
        self._gathered = bytearray()
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

    # ------------------------------------------------------------ parsing
    def _gather(self, data: bytes, tail: bytes) -> bytes | None:
        """What of a head is to be parsed now: None while its reads are held back.

        httptools grows a header name or value that spans feeds by `bytes +=`, copying it whole
        at each feed: a 64 KiB head fed a byte at a time would copy some 2 GB. So reads that hold
        no head's end (CRLF CRLF, looked for in this read and across its edge with the `tail`
        before it) are gathered here, in a bytearray (which grows in amortised constant time), up
        to `HEAD_PIECE_BYTES`, and llhttp is fed pieces of at least that size, or ones holding a
        head's end or a bare LF (which llhttp refuses as soon as it sees one). A read that ends a
        head or is large enough goes on at once, unless reads before it are held."""
        gathered = self._gathered
        ended = b"\r\n\r\n" in tail + data[:3] or _feed_now(data, tail)
        if not gathered and (ended or len(data) >= HEAD_PIECE_BYTES):
            return data
        if not self._in_head and self._head_start is None and _NOT_CRLF.search(data) is not None:
            # A head begins that llhttp will not see for now: it is timed from here, on a kept
            # connection too (where the idle timer runs, far longer) and while a handler runs
            # (the timer then closes nothing, and `_serve` looks at `_head_deadline` when done).
            now = self._loop.time()
            self._head_start = now
            self._head_deadline = now + HEAD_TIMEOUT_SECONDS
            self._arm(HEAD_TIMEOUT_SECONDS)
        gathered += data
        if not ended and len(gathered) < HEAD_PIECE_BYTES:
            return None
        self._gathered = bytearray()
        return bytes(gathered)

    def _parse(self, data: bytes) -> None:
        """Feed llhttp, in pieces that cannot complete more heads than the queue has room for.

        pause_reading() stops the next read, not the parse of this one, and one read can hold
        thousands of small requests (uvloop reads up to 256 KiB), each a Request object queued.
        A head ends with CRLF CRLF (llhttp takes no bare LF), so a piece holding `room` of them
        completes at most `room` heads, one fewer when a head's CRLF CRLF was split before the
        piece: the rest of the read waits, unparsed, in `_backlog`. A head is at least 18 bytes
        ("GET / HTTP/1.1" and its CRLF CRLF), so a CRLF CRLF within 14 bytes after one counted is
        not a head's end (it is not counted), and neither is one in the rest of a Content-Length
        body. A read holding up to `room` requests is fed whole, in one piece."""
        while data and not (self._no_more_input or self._closing):
            room = MAX_QUEUED - len(self._queue)
            if room <= 0:
                self._backlog = data
                self._pause_reading()
                return
            # A head split in the middle of its CRLF CRLF ends in this piece without a whole one.
            if self._in_head and data[0] in b"\r\n":
                room -= 1
            parsing = self._parsing
            start = 0
            if parsing is not None and parsing.content_length is not None:
                start = max(parsing.content_length - parsing._size, 0)
            cut = len(data)
            for _ in range(room + 1):
                found = data.find(b"\r\n\r\n", start)
                if found < 0:
                    break
                cut = found + 3  # before its last byte: that head does not end in this piece
                start = found + 18
            else:
                data, piece = data[cut:], data[:cut]
                self._feed(piece)
                continue
            self._feed(data)
            return

    def _feed(self, piece: bytes) -> None:
        messages, parsing, in_head = self._messages, self._parsing, self._in_head
        try:
            self._parser.feed_data(piece)
        except httptools.HttpParserUpgrade:
            self._end_of_input()
            return
        except httptools.HttpParserError as exc:
            status, message = self._refusal or (400, f"Bad Request: not valid HTTP/1.1 ({exc})")
            self._refuse(status, message)
            return
        if messages != self._messages:
            return
        if in_head and self._in_head:
            # All of it inside a head begun before it and still incomplete.
            self._head_bytes += len(piece)
            if self._head_bytes > MAX_HEADER_BYTES:
                self._refuse(431, f"Request Header Fields Too Large: at most {MAX_HEADER_BYTES} bytes")
        elif parsing is not None and parsing is self._parsing:
            # All of it inside one request's body (its chunk framing and trailer included).
            parsing._wired(len(piece))

    def _dispatch(self) -> None:
        """After a read: the next request's handler if none runs, or the connection's end."""
        if self.task is not None or self._lost:
            return
        if self._queue:
            self._next()
        elif self._pending is not None:
            self._answer_pending()
        elif self._no_more_input:
            self._close()

    def _resume(self) -> None:
        """The queue has room again: what was read ahead is parsed, then reading resumes."""
        if not self._reading_paused or self._no_more_input or self._closing:
            return
        backlog, self._backlog = self._backlog, b""
        if backlog:
            self._parse(backlog)
            self._dispatch()
        if not (self._backlog or self._no_more_input or self._closing) and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    # ------------------------------------------------------------ llhttp callbacks
    def on_message_begin(self) -> None:
        self._messages += 1
        self._url.clear()
        self._fields = []
        self._field_bytes = 0
        self._head_bytes = 0
        self._in_head = True
        now = self._loop.time()
        # From its first byte, which may have been held back (`_gather`) for a while.
        start, self._head_start = self._head_start, None
        self._head_deadline = (now if start is None else start) + HEAD_TIMEOUT_SECONDS
        self._arm(max(self._head_deadline - now, 0.0))

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_TARGET_BYTES:
            self._refusal = (414, f"URI Too Long: at most {MAX_TARGET_BYTES} bytes")
            raise ValueError("target too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        # (A chunked body's trailer fields come here too, counted with the head's.)
        fields = self._fields
        self._field_bytes += len(name) + len(value)
        if len(fields) >= MAX_HEADERS or self._field_bytes > MAX_HEADER_BYTES:
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
        parser = self._parser
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            # llhttp takes HTTP/0.9 (no version) and 2.0 too.
            self._refusal = (505, f"HTTP Version Not Supported: HTTP/{version}")
            raise ValueError("version")
        target = self._url.decode("utf-8", "surrogateescape")
        if not target.startswith("/"):
            # Absolute form (a proxy's), authority form (CONNECT) and `*`: not for this server.
            self._refusal = (400, "Bad Request: the request target must be a path")
            raise ValueError("not origin-form")
        request = Request(
            self,
            parser.get_method().decode("ascii"),
            target,
            version,
            CIMultiDict(self._fields),
            # llhttp answers this only inside its callbacks.
            parser.should_keep_alive(),
        )
        if version == "1.1" and "Host" not in request.headers:
            # RFC 9112 3.2: a server must refuse an HTTP/1.1 request without Host.
            self._refusal = (400, "Bad Request: an HTTP/1.1 request needs a Host header")
            raise ValueError("host")
        expect = request.headers.get("Expect")
        if expect is not None and expect.lower() != "100-continue":
            self._refusal = (417, "Expectation Failed: only 100-continue is understood")
            raise ValueError("expectation")
        self._parsing = request
        # Queued, not started: its handler starts once the read is parsed (`_dispatch`), as
        # llhttp may yet refuse the request (a Transfer-Encoding other than chunked is refused
        # after this callback) and a refused request must never reach the handler.
        self._queue.append(request)
        if request._too_large:
            self._discard()

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
            self._loop.call_soon(self._resume)
        self._current = request
        self.task = self._loop.create_task(self._serve(request))

    async def _serve(self, request: Request) -> None:
        try:
            try:
                response: Answer = await self.server.handler(request)
            except (BodyTooLarge, BodyTimeout, BodyInvalid, ServerBusy) as exc:
                response = _plain_error(exc)
            except (asyncio.CancelledError, ConnectionResetError):
                raise
            except Exception as exc:
                log.error(
                    "http_handler_failed", error=f"{type(exc).__name__}: {exc}", path=request.path[:200]
                )
                response = _internal_error(request)
            if isinstance(response, StreamResponse) and response.prepared:
                await response.write_eof()
            elif request._answered:
                # The handler failed after its stream's head went out: no second answer can
                # follow, and no zero chunk either, so the client sees the stream cut short.
                self._close()
                return
            else:
                try:
                    if isinstance(response, StreamResponse):
                        await response.prepare(request)
                        await response.write_eof()
                    else:
                        self.write_head(request, response.status, response.headers, response.body)
                except ConnectionResetError:
                    raise
                except Exception as exc:
                    # Refused before a byte was written (a header with a line break in it): the
                    # client still gets an answer, and the connection is not left waiting.
                    log.error(
                        "http_response_failed", error=f"{type(exc).__name__}: {exc}", path=request.path[:200]
                    )
                    if request._answered:
                        self._close()
                        return
                    response = _internal_error(request)
                    self.write_head(request, response.status, response.headers, response.body)
            # Nothing more is answered until the client takes this answer: one that pipelines
            # requests and reads no answer would have them all held here, without bound.
            await self.drain()
            if not request._complete and not (request._too_large or request._overloaded or request._invalid):
                await request._drain_body()
        except ConnectionResetError:
            self._close()
            return
        except asyncio.CancelledError:
            # (The client went away, or the server is closing; or a handler let a cancellation
            # of its own escape: the connection, left unanswered, must not stay open for ever.)
            self._close()
            raise
        finally:
            self.task = None
            self._current = None
            request._release()
        if self._lost:
            return
        if not request.keep_alive or self._closing or not request._complete:
            # Not kept: asked so, or a request whose body still arrives after its answer went out
            # (its bytes would have to be read to the end to find the next request).
            self._close()
        elif self._queue:
            self._next()
        elif self._pending is not None:
            self._answer_pending()
        elif self._no_more_input:
            self._close()
        elif self._in_head or self._head_start is not None:
            # A head begun while the handler ran (parsed, or held back from llhttp): its timer
            # may have run out meanwhile (and could not close a connection with a handler running).
            self._arm(max(self._head_deadline - self._loop.time(), 0.0))
        elif self._parsing is None:
            self._arm(KEEPALIVE_SECONDS)

    def write_head(self, request: Request, status: int, headers: dict[str, str], body: bytes | None) -> bool:
        """The status line and headers, and the whole body unless `body` is None. With None the
        body follows in pieces: True when they must be framed as chunks (HTTP/1.1)."""
        if self._lost or self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the client went away")
        chunked = body is None and request.version == "1.1"
        if body is None and not chunked:
            request.keep_alive = False  # HTTP/1.0: the body ends with the connection
        if (
            self._closing
            or self.server.closing
            # (its body still to come: not looked for, the connection ends with the answer)
            or not request._complete
            or (self._no_more_input and not self._queue and not self._pending)
        ):
            request.keep_alive = False  # the last answer on this connection
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
        for name, value in headers.items():
            # NUL too (RFC 9110 5.5: CR, LF and NUL are never valid in a field).
            if unsafe_field(name, value):
                raise ValueError(f"response header {name!r} holds a character a header cannot carry")
            lines.append(f"{name}: {value}")
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        elif chunked:
            lines.append("Transfer-Encoding: chunked")
        if not request.keep_alive:
            lines.append("Connection: close")
        elif request.version == "1.0":
            # An HTTP/1.0 connection is kept only when the answer says so (RFC 9112 9.3).
            lines.append("Connection: keep-alive")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")
        if body and request.method != "HEAD":
            self.transport.write(head + body)
        else:
            self.transport.write(head)
        request._answered = True
        return chunked

    def write(self, data: bytes) -> None:
        if self._lost or self.transport is None or self.transport.is_closing():
            # (A transport being closed drops what is written to it, silently.)
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
        try:
            async with asyncio.timeout(WRITE_TIMEOUT_SECONDS):
                await drain
        except TimeoutError:
            if self.transport is not None:
                self.transport.abort()
            raise ConnectionResetError(f"the client read nothing for {WRITE_TIMEOUT_SECONDS:g} s") from None

    # ------------------------------------------------------------ internals
    def _refuse(self, status: int, message: str) -> None:
        """A request the parser cannot go on with: nothing more is read; it is answered after the
        requests parsed before it (the one being read, if its handler runs, through read()),
        then the connection closed."""
        self._no_more_input = True
        self._backlog = b""
        self._pause_reading()
        bad, self._parsing = self._parsing, None
        if bad is not None:
            if bad is self._current:
                bad._fail(status, message)
                return
            if self._queue and self._queue[-1] is bad:
                self._queue.pop()
            bad._release()
        self._pending = (status, message)

    def _answer_pending(self) -> None:
        assert self._pending is not None
        status, message = self._pending
        self._pending = None
        if self.transport is not None and not self._lost and not self.transport.is_closing():
            body = _error_body(message)
            head = (
                f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            self.transport.write(head.encode() + body)
        self._close()

    def _discard(self) -> None:
        """A body over the limit: the rest of the input is read and dropped, not parsed."""
        self._no_more_input = True
        self._backlog = b""

    def _end_of_input(self) -> None:
        self._no_more_input = True
        self._backlog = b""
        self._pause_reading()

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
            # Not close(): that waits to flush what a client that reads nothing never takes.
            self.transport.abort()
        return task


def _plain_error(exc: BodyTooLarge | BodyTimeout | BodyInvalid | ServerBusy) -> Response:
    if isinstance(exc, ServerBusy):
        body = _error_body(f"Service Unavailable: {exc}; retry later")
        return Response(status=503, body=body, content_type="application/json", headers={"Retry-After": "1"})
    if isinstance(exc, BodyTooLarge):
        status, message = 413, f"Payload Too Large: at most {exc.limit} bytes"
    elif isinstance(exc, BodyInvalid):
        status, message = exc.status, str(exc)
    else:
        status, message = 408, f"Request Timeout: {exc}"
    return Response(status=status, body=_error_body(message), content_type="application/json")


def _internal_error(request: Request) -> Response:
    request.keep_alive = False
    return Response(status=500, body=_error_body("Internal Server Error"), content_type="application/json")


class HttpServer:
    """`handler` served on any number of listening sockets (TCP or unix)."""

    def __init__(
        self,
        handler: Handler,
        *,
        max_body: int,
        max_held: int | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.handler = handler
        self.max_body = max_body
        # Open connections at once; one past it is answered 503 and closed, unparsed.
        self.max_connections = max_connections
        # Connections refused so (for the operator: a cap too low, or a flood).
        self.refused = 0
        # Request body bytes held at once, across connections (`max_held`: by default room for
        # four bodies at the limit, and at least 64 MiB).
        self.max_held = max_held if max_held is not None else max(4 * max_body, 64 << 20)
        self.held = 0
        self.connections: set[_Connection] = set()
        # close() has begun: answers say `Connection: close`.
        self.closing = False
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
        return _Connection(self)

    async def close(self, timeout: float = 1.0) -> None:
        """No new connections; handlers still running get `timeout` seconds, then are cancelled."""
        self.closing = True
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
