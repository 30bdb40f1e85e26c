"""HTTP/1.1 to one origin, for `HttpUpstream` and the `--workers` forwarder: keep-alive connections,
llhttp parsing, streamed bodies.

An MCP session over Streamable HTTP talks to exactly one URL, sends small JSON bodies with a
Content-Length, and reads either one JSON body or an event stream back. A general client pays
for what this never uses (redirects, proxies, multipart, tracing, a cookie jar for every domain,
a request object of dozens of fields); in `visor serve --url` that was the largest cost a call
added over the gateway in front of a stdio server (see docs/benchmarks.md). This one does the
narrow job:

- requests are written as bytes the module built itself, one request per connection at a time
  (no pipelining), to the origin of the URL it was made for and nowhere else: redirects are not
  followed, there is no proxy;
- responses are parsed by llhttp (Node.js's parser, through httptools), which enforces the
  message syntax: chunked framing, Content-Length, conflicting framing headers. Header sections
  are capped here (`MAX_HEADER_BYTES`), since llhttp has no cap of its own;
- a body is handed on chunk by chunk as it arrives; reading pauses while more than
  `_HIGH_WATER` bytes wait for the caller (TCP flow control then reaches the server);
- ``gzip`` and ``deflate`` content codings are decoded (Visor asks for ``identity``, but a server
  may compress anyway), any other is refused;
- connections are opened to every address of the host at once, IPv4 and IPv6, the second 250 ms
  behind the first (happy eyeballs, RFC 8305, through aiohappyeyeballs);
- a connection goes back to the idle pool only after its response was read to the end and the
  server did not ask to close; an idle connection is used again within `KEEPALIVE_SECONDS`;
- cookies the origin sets are kept for it (load balancers pin a session to a replica with one):
  name and value, removed by ``Max-Age<=0`` or a past ``Expires``, ``Secure`` ones sent only
  over https. Domain and Path are not needed: every request goes to the one URL;
- the answer to a HEAD request ends with its head; its connection is not used again (llhttp,
  through httptools, cannot be told that no body follows the head).

Two options serve `visor serve --workers N`, whose workers pass a request for another worker's
session on to that worker (visor/serve/workers.py):

- ``unix_path``: the connections go to a unix socket instead of the URL's host and port (the
  URL still gives the Host header);
- ``relay=True``: requests and responses pass as they are, for a proxy. Only the caller's header
  fields are sent (its Host among them; no User-Agent or Accept-Encoding is added), to the target
  each request names; a body's content coding is left alone (any coding, not decoded); no cookie
  is kept; header bytes keep their value both ways (read and written as UTF-8 with surrogate
  escapes, as visor.http.server reads and writes them).
"""

from __future__ import annotations

import asyncio
import collections
import email.utils
import re
import socket
import ssl
import time
import zlib
from collections.abc import AsyncIterator, Collection, Iterable, Iterator, Mapping
from http.cookies import CookieError, SimpleCookie
from types import TracebackType
from typing import cast
from urllib.parse import quote, urlsplit

import aiohappyeyeballs
import httptools

from visor import __version__
from visor.http.headers import unsafe_field

#: The most a response's status line and header fields may take together.
MAX_HEADER_BYTES = 64 * 1024
#: An idle connection older than this is closed rather than used again.
KEEPALIVE_SECONDS = 15.0
#: Interim (1xx) responses taken before the final one; one more is a broken response.
MAX_INTERIM = 16
#: Idle connections kept for later requests; more are closed.
MAX_IDLE = 32
_HIGH_WATER = 1 << 20
_DECODE_STEP = 256 * 1024
_LOW_WATER = 256 * 1024
_USER_AGENT = f"visor/{__version__}"
_SAFE_TO_REPEAT = frozenset({"GET", "DELETE"})
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# A request target in origin form: a path (and query), no space or control character.
_ORIGIN_FORM = re.compile(r"/[^\x00-\x20\x7f]*")
# Framing is the client's own (Content-Length from the body): a caller's would contradict it.
_FRAMING = frozenset({"content-length", "transfer-encoding"})
# RFC 6265 section 4.1.1: a cookie's name is a token; its value cookie-octets, optionally quoted.
_COOKIE_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_COOKIE_VALUE = re.compile(
    r'[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*|"[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*"'
)


class HttpClientError(Exception):
    """The request could not be made or its response could not be read."""


class ConnectFailed(HttpClientError):
    """No connection to the origin (refused, unreachable, timed out, TLS failed)."""


class ResponseBroken(HttpClientError):
    """The connection ended or broke the HTTP syntax before the response was complete."""


class ResponseTimeout(ResponseBroken):
    """No byte of the response for the request's `read_timeout`: the server stalled."""


class Headers:
    """A response's header fields: case-insensitive names, repeated fields kept in order."""

    __slots__ = ("_fields", "_items")

    def __init__(self) -> None:
        self._fields: dict[str, list[str]] = {}
        self._items: list[tuple[str, str]] = []

    def add(self, name: str, value: str) -> None:
        self._fields.setdefault(name.lower(), []).append(value)
        self._items.append((name, value))

    def items(self) -> list[tuple[str, str]]:
        """Every field as it came, in order: its name as the server spelled it, and its value."""
        return list(self._items)

    def get(self, name: str, default: str | None = None) -> str | None:
        values = self._fields.get(name.lower())
        return values[0] if values else default

    def getall(self, name: str) -> list[str]:
        return list(self._fields.get(name.lower(), ()))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._fields


class Response:
    """One response: status and headers at once, the body as it streams in.

    Use it as an async context manager (`OriginClient.request` returns it entered): leaving it
    hands the connection back when the body was read to the end, and closes it otherwise.
    """

    def __init__(
        self, conn: _Connection, status: int, reason: str, headers: Headers, *, decode: bool = True
    ) -> None:
        self._conn = conn
        self.status = status
        self.reason = reason
        self.headers = headers
        ctype = headers.get("Content-Type")
        # As most clients read it: the media type alone, lower case; none given reads as binary.
        self.content_type = (
            ctype.split(";", 1)[0].strip().lower() if ctype is not None else "application/octet-stream"
        )
        length = headers.get("Content-Length")
        self.content_length = int(length) if length is not None and length.isdigit() else None
        # (A relay hands the body on as it came, in whatever coding.)
        self._decoder = _decoder(headers.get("Content-Encoding")) if decode else None

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes (decoded) as they arrive; raises `ResponseBroken` if it is cut short.

        A compressed body is decoded at most `_DECODE_STEP` bytes at a time: a few KB of gzip
        can stand for gigabytes, and the caller's limits must see them come in pieces."""
        decoder = self._decoder
        while True:
            data = await self._conn.read_body()
            if decoder is None:
                if not data:
                    return
                yield data
                continue
            try:
                if not data:
                    decoder.finish()
                    return
                for piece in decoder.pieces(data):
                    yield piece
            except (zlib.error, ResponseBroken) as exc:
                self._conn.abort()
                if isinstance(exc, ResponseBroken):
                    raise
                raise ResponseBroken(f"the body's content coding is corrupt: {exc}") from exc

    async def read(self, limit: int) -> bytes:
        """The whole body; `ResponseTooLarge` past `limit` bytes (decoded)."""
        buf = bytearray()
        async for chunk in self.chunks():
            buf += chunk
            if len(buf) > limit:
                raise ResponseTooLarge(limit)
        return bytes(buf)

    def release(self) -> None:
        self._conn.finish_response()

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class ResponseTooLarge(HttpClientError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the body is over the {limit}-byte limit")
        self.limit = limit


class _ZlibStream:
    """gzip or deflate (zlib-wrapped or raw, as servers send both), decoded in bounded pieces."""

    def __init__(self, gzip: bool) -> None:
        self._gzip = gzip
        self._obj = zlib.decompressobj(wbits=31 if gzip else zlib.MAX_WBITS)
        self._started = False

    def pieces(self, data: bytes) -> Iterator[bytes]:
        if not self._started and not self._gzip:
            self._started = True
            # "deflate" is specified as zlib-wrapped, but some servers send raw deflate.
            if data and (data[0] & 0x0F) != 8:
                self._obj = zlib.decompressobj(wbits=-zlib.MAX_WBITS)
        obj = self._obj
        while True:
            if obj.eof and data:
                raise ResponseBroken("the body goes on after the end of its compressed stream")
            out = obj.decompress(data, _DECODE_STEP)
            data = obj.unconsumed_tail or (obj.unused_data if obj.eof else b"")
            if out:
                yield out
            # A full piece may leave output inside zlib with no input left: ask again for it.
            if not data and len(out) < _DECODE_STEP:
                return

    def finish(self) -> None:
        if not self._obj.eof:
            raise ResponseBroken("the body ended before its compressed stream did")


def _decoder(coding: str | None) -> _ZlibStream | None:
    if coding is None:
        return None
    name = coding.strip().lower()
    if name in ("", "identity"):
        return None
    if name in ("gzip", "x-gzip"):
        return _ZlibStream(gzip=True)
    if name == "deflate":
        return _ZlibStream(gzip=False)
    raise ResponseBroken(f"the response's Content-Encoding {coding!r} is not one Visor reads (gzip, deflate)")


class _Connection(asyncio.Protocol):
    """One TCP, TLS or unix socket connection and the llhttp parser reading the responses on it."""

    def __init__(self, client: OriginClient) -> None:
        self._client = client
        self._relay = client.relay
        # How header bytes read as text: latin-1 for the origin, kept byte for byte by a relay.
        self._charset, self._errors = ("utf-8", "surrogateescape") if client.relay else ("latin-1", "strict")
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.lost = False
        # Taken from the idle pool for this request (not opened for it).
        self.reused = False
        self.idle_since = 0.0
        self._head: asyncio.Future[Response] | None = None
        self._status = 0
        self._reason = b""
        self._headers = Headers()
        self._header_bytes = 0
        self._name = b""
        self._headers_done = False
        self._until_close = False
        self._complete = False
        self._keep_alive = False
        self._interim = 0
        # The request was HEAD: its response has no body, whatever its headers say.
        self._no_body = False
        self._response: Response | None = None
        self._body: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._error: HttpClientError | None = None
        # Seconds without a byte of the response before it is given up (None: wait for ever).
        self.read_timeout: float | None = None

    # ------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._head is None and self._response is None:
            # Bytes while no request waits: a server speaking out of turn. The connection is
            # not in a state anyone can trust again.
            self._fail(ResponseBroken("the server sent bytes no request asked for"))
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(ResponseBroken("the server switched protocols"))
        except httptools.HttpParserError as exc:
            if self._error is None:
                self._fail(ResponseBroken(f"the server's response is not valid HTTP/1.1: {exc}"))
            else:
                self._fail(self._error)

    def eof_received(self) -> bool:
        if self._headers_done and not self._complete and self._until_close:
            self._complete = True  # a body delimited by the end of the connection
            self._wake()
        self._fail(ResponseBroken("the server closed the connection before the response was complete"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(
            ResponseBroken(f"the connection was lost: {exc}" if exc else "the server closed the connection")
        )

    def pause_writing(self) -> None:
        pass  # requests are small and written once

    def resume_writing(self) -> None:
        pass

    # ------------------------------------------------------------ llhttp callbacks
    def on_message_begin(self) -> None:
        if self._complete:
            # A second response in the bytes after the one asked for: never part of the first
            # one's body, and the connection is not in a state to read another answer from.
            raise ResponseBroken("the server sent a response no request asked for")

    def on_status(self, status: bytes) -> None:
        self._reason += status
        self._count(len(status))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        self._headers.add(name.decode(self._charset, self._errors), value.decode(self._charset, self._errors))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            # An interim response (100 Continue, 103 Early Hints): the real one follows. A server
            # that sends nothing else would keep Visor parsing them for ever.
            self._interim += 1
            if self._interim > MAX_INTERIM:
                self._error = ResponseBroken(f"the server sent over {MAX_INTERIM} interim (1xx) responses")
                raise self._error
            self._reset_message()
            return
        self._status = status
        self._headers_done = True
        h = self._headers
        if self._no_body:
            # The answer to HEAD ends with its head. llhttp cannot be told so (httptools gives no
            # way to), and would read the next bytes as the body its headers announce: the
            # connection is not used again.
            self._complete = True
            self._keep_alive = False
        else:
            self._until_close = (
                "content-length" not in h and "transfer-encoding" not in h and status not in (204, 304)
            )
        try:
            response = Response(
                self, status, self._reason.decode("latin-1").strip(), h, decode=not self._relay
            )
        except ResponseBroken as exc:
            self._error = exc
            raise
        self._response = response
        head = self._head
        self._head = None
        if head is not None and not head.done():
            head.set_result(response)

    def on_body(self, body: bytes) -> None:
        if self._no_body:
            return
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if not self._headers_done or self._no_body:
            return  # the end of an interim response, or of what llhttp took for a HEAD answer's body
        # llhttp answers this only inside the callback: its flags are reset once it returns.
        self._keep_alive = self._parser.should_keep_alive()
        self._complete = True
        self._wake()

    # ------------------------------------------------------------ the client's side
    def send(self, request: bytes, *, no_body: bool = False) -> asyncio.Future[Response]:
        assert self.transport is not None and self._head is None and self._response is None
        self._reset_message()
        self._interim = 0
        self._no_body = no_body
        head: asyncio.Future[Response] = self._loop.create_future()
        self._head = head
        self.transport.write(request)
        return head

    async def read_body(self) -> bytes:
        """The next piece of the body, or b"" at its end."""
        while True:
            if self._body:
                data = self._body.popleft()
                self._buffered -= len(data)
                if self._paused and self._buffered < _LOW_WATER and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                return data
            if self._complete:
                return b""
            if self._error is not None:
                raise self._error
            self._waiter = self._loop.create_future()
            try:
                if self.read_timeout is None:
                    await self._waiter
                else:
                    async with asyncio.timeout(self.read_timeout):
                        await self._waiter
            except TimeoutError:
                self._fail(ResponseTimeout(f"no byte of the response for {self.read_timeout:g} s"))
                raise self._error or ResponseTimeout("the response stalled") from None
            finally:
                self._waiter = None

    def finish_response(self) -> None:
        """The caller is done with the response: keep the connection if it can carry another."""
        reusable = (
            self._complete and not self._body and self._error is None and not self.lost and self._keep_alive
        )
        self._response = None
        if reusable:
            self._client.put_back(self)
        else:
            self.abort()

    def abort(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.abort()

    # ------------------------------------------------------------ internals
    def _reset_message(self) -> None:
        self._status = 0
        self._reason = b""
        self._headers = Headers()
        self._header_bytes = 0
        self._headers_done = False
        self._until_close = False
        self._complete = False
        self._keep_alive = False
        self._body.clear()
        self._buffered = 0

    def _count(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > MAX_HEADER_BYTES:
            self._error = ResponseBroken(f"the response's header section is over {MAX_HEADER_BYTES} bytes")
            raise self._error

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: HttpClientError) -> None:
        already = self.lost
        self.lost = True
        if self._error is None and not self._complete:
            self._error = error
        head = self._head
        self._head = None
        if head is not None and not head.done():
            head.set_exception(self._error or error)
        self._wake()
        if not already and self.transport is not None:
            self.transport.abort()
        self._client.forget(self)


class OriginClient:
    """Requests to one http(s) URL over a small pool of keep-alive connections.

    `unix_path`: connect to this unix socket rather than to the URL's host and port (which still
    give the Host header, and the name a TLS certificate must carry). `relay`: pass requests and
    responses on as they are (see the module's docstring)."""

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float,
        ssl_context: ssl.SSLContext | None = None,
        max_idle: int = MAX_IDLE,
        unix_path: str | None = None,
        relay: bool = False,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("an http:// or https:// URL with a host is needed")
        self.secure = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.secure else 80)
        default_port = parts.port is None or parts.port == (443 if self.secure else 80)
        # The request line and Host carry ASCII only: a name in another script goes as its IDNA
        # form, and a path or query character outside ASCII percent-encoded as UTF-8 (what a
        # browser sends for the same URL); escapes already in the URL are kept as they are.
        ascii_host = self.host if self.host.isascii() else self.host.encode("idna").decode("ascii")
        shown_host = f"[{ascii_host}]" if ":" in ascii_host else ascii_host
        self._host_header = shown_host if default_port else f"{shown_host}:{self.port}"
        path = quote(parts.path or "/", safe="/%:@!$&'()*+,;=~")
        query = quote(parts.query, safe="/?%:@!$&'()*+,;=~")
        self._target = path + (f"?{query}" if query else "")
        self._connect_timeout = connect_timeout
        self._ssl: ssl.SSLContext | None = None
        if self.secure:
            self._ssl = ssl_context or ssl.create_default_context()
        self._idle: collections.deque[_Connection] = collections.deque()
        self._all: set[_Connection] = set()
        self._cookies: dict[str, tuple[str, float | None, bool]] = {}
        self._closed = False
        self._max_idle = max_idle
        self.unix_path = unix_path
        self.relay = relay

    async def request(
        self,
        method: str,
        headers: Mapping[str, str] | Iterable[tuple[str, str]],
        body: bytes | None = None,
        *,
        read_timeout: float | None = None,
        target: str | None = None,
    ) -> Response:
        """Send one request and wait for its status and headers (the body streams on).

        `headers`: a mapping, or (name, value) pairs where a field is given more than once.
        `read_timeout`: the longest wait for the head, and then between pieces of the body, before
        `ResponseTimeout` (a server that accepted the request and stalls); None waits for ever.
        `target`: a path (and query) of the origin's to ask instead of the URL's."""
        if self._closed:
            raise HttpClientError("the client is closed")
        if target is not None and not _ORIGIN_FORM.fullmatch(target):
            raise ValueError(f"request target {target[:100]!r} is not a path without spaces or controls")
        if self.relay:
            wire = self._relay_encode(method, headers, body, target)
        else:
            wire = self._encode(method, headers, body, target)
        no_body = method == "HEAD"
        conn = await self._connection()
        conn.read_timeout = read_timeout
        try:
            response = await self._head(conn, wire, no_body)
        except ResponseTimeout:
            conn.abort()
            raise
        except ResponseBroken:
            conn.abort()
            # A kept connection the server closed as this request went out. GET and DELETE are
            # sent once more on a new connection, as clients do; a POST may have run: never.
            if not conn.reused or method not in _SAFE_TO_REPEAT:
                raise
            conn = await self._connection(fresh=True)
            conn.read_timeout = read_timeout
            try:
                response = await self._head(conn, wire, no_body)
            except BaseException:
                conn.abort()
                raise
        except BaseException:
            conn.abort()
            raise
        if not self.relay:
            self._keep_cookies(response.headers)
        return response

    @staticmethod
    async def _head(conn: _Connection, wire: bytes, no_body: bool) -> Response:
        head = conn.send(wire, no_body=no_body)
        if conn.read_timeout is None:
            return await head
        try:
            async with asyncio.timeout(conn.read_timeout):
                return await head
        except TimeoutError:
            raise ResponseTimeout(f"no response for {conn.read_timeout:g} s") from None

    def put_back(self, conn: _Connection) -> None:
        if self._closed or len(self._idle) >= self._max_idle:
            conn.abort()
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def forget(self, conn: _Connection) -> None:
        self._all.discard(conn)
        # A connection that dies while idle is dropped when next taken (see _connection).

    async def close(self) -> None:
        self._closed = True
        for conn in list(self._all):
            conn.abort()
        self._all.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # the transports' connection_lost runs before the loop may close

    # ------------------------------------------------------------ internals
    async def _connection(self, *, fresh: bool = False) -> _Connection:
        now = time.monotonic()
        while self._idle and not fresh:
            conn = self._idle.pop()  # the most recently used: the least likely to be closed by now
            if conn.lost or conn.transport is None or conn.transport.is_closing():
                continue
            if now - conn.idle_since > KEEPALIVE_SECONDS:
                conn.abort()
                continue
            conn.reused = True
            return conn
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                if self.unix_path is not None:
                    _, conn = await loop.create_unix_connection(
                        lambda: _Connection(self),
                        self.unix_path,
                        ssl=self._ssl,
                        server_hostname=self.host if self._ssl is not None else None,
                    )
                else:
                    conn = await self._tcp_connection(loop)
        except TimeoutError as exc:
            raise ConnectFailed(f"connecting took over {self._connect_timeout:g} s") from exc
        except (OSError, ssl.SSLError) as exc:
            raise ConnectFailed(f"{type(exc).__name__}: {exc}") from exc
        if self._closed:
            conn.abort()
            raise HttpClientError("the client is closed")
        self._all.add(conn)
        return conn

    async def _tcp_connection(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        # Both address families at once, the second 250 ms behind (RFC 8305), as browsers
        # and aiohttp do: a name with an IPv6 address a network drops silently must not
        # spend the whole connect timeout there. uvloop has no happy eyeballs of its own.
        sock = await aiohappyeyeballs.start_connection(
            infos, happy_eyeballs_delay=0.25, interleave=1, loop=loop
        )
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _, conn = await loop.create_connection(
            lambda: _Connection(self),
            sock=sock,
            ssl=self._ssl,
            server_hostname=self.host if self._ssl is not None else None,
        )
        return conn

    def _encode(
        self,
        method: str,
        headers: Mapping[str, str] | Iterable[tuple[str, str]],
        body: bytes | None,
        target: str | None = None,
    ) -> bytes:
        fields = _fields(headers)
        lines = [f"{method} {target or self._target} HTTP/1.1", f"Host: {self._host_header}"]
        given = {name.lower() for name, _ in fields}
        for name, value in fields:
            _check_field(name, value)
            lines.append(f"{name}: {value}")
        if "user-agent" not in given:
            lines.append(f"User-Agent: {_USER_AGENT}")
        lines.append("Accept-Encoding: identity")
        cookie = self._cookie_header()
        if cookie:
            _check_field("Cookie", cookie)
            lines.append(f"Cookie: {cookie}")
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head + body if body else head

    def _relay_encode(
        self,
        method: str,
        headers: Mapping[str, str] | Iterable[tuple[str, str]],
        body: bytes | None,
        target: str | None,
    ) -> bytes:
        """A relay's request: the caller's fields only, its Host among them (the URL's when it
        gives none), the framing the client's own."""
        if not _TOKEN.fullmatch(method):
            raise ValueError(f"method {method[:40]!r} is not an HTTP token")
        fields = _fields(headers)
        lines = [f"{method} {target or self._target} HTTP/1.1"]
        if not any(name.lower() == "host" for name, _ in fields):
            lines.append(f"Host: {self._host_header}")
        for name, value in fields:
            _check_field(name, value)
            if name.lower() in _FRAMING:
                raise ValueError(f"header {name!r} is the client's own (it frames the body itself)")
            lines.append(f"{name}: {value}")
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        # The bytes the relay's own server read (UTF-8, surrogate escapes for the rest), unchanged.
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")
        return head + body if body else head

    def _keep_cookies(self, headers: Headers) -> None:
        for raw in headers.getall("Set-Cookie"):
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(raw)
            except CookieError:
                continue
            for name, morsel in jar.items():
                # Sent back exactly as the server wrote it, and only in RFC 6265's cookie syntax:
                # the parser decodes escapes (`\\015` is a CR), and a decoded value written into
                # the Cookie line would let the server add header lines or requests of its own.
                value = morsel.coded_value
                if not _COOKIE_NAME.fullmatch(name) or not _COOKIE_VALUE.fullmatch(value):
                    continue
                expires: float | None = None
                max_age = morsel["max-age"]
                if max_age:
                    try:
                        expires = time.time() + int(max_age)
                    except ValueError:
                        expires = None
                elif morsel["expires"]:
                    expires = _timestamp(morsel["expires"])
                if expires is not None and expires <= time.time():
                    self._cookies.pop(name, None)
                else:
                    self._cookies[name] = (value, expires, bool(morsel["secure"]))

    def _cookie_header(self) -> str:
        if not self._cookies:
            return ""
        now = time.time()
        out = []
        for name, (value, expires, secure) in list(self._cookies.items()):
            if expires is not None and expires <= now:
                del self._cookies[name]
            elif self.secure or not secure:
                out.append(f"{name}={value}")
        return "; ".join(out)


def _timestamp(http_date: str) -> float | None:
    try:
        return email.utils.parsedate_to_datetime(http_date).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _fields(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> Collection[tuple[str, str]]:
    if isinstance(headers, dict):
        return headers.items()
    return list(headers.items() if isinstance(headers, Mapping) else headers)


def _check_field(name: str, value: str) -> None:
    # The values come from the protocol or from --header (already checked); a line break here
    # would start a header or a request of the caller's choosing.
    if unsafe_field(name, value):
        raise ValueError(f"header {name!r} holds a character an HTTP header cannot carry")
