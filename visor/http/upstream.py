"""A Streamable HTTP server, seen by the relay as a server pipe.

`visor/relay/upstream.py` spawns a stdio server and hands the relay two pipes. This module
stands in the same place for a remote server: the relay calls `send(line)` with one
newline-free JSON-RPC message, and reads the server's messages, one newline-free message per
item, by iterating over the upstream. Everything HTTP stays in here:

- each message is its own POST (``Accept: application/json, text/event-stream``); a request is
  answered by one JSON body or an SSE stream, a notification or response by ``202``;
- ``Mcp-Session-Id`` from the initialize response is sent on every later request, and
  ``MCP-Protocol-Version`` once negotiated (2025-11-25); a 2026-07-28 message carries its
  revision in ``_meta`` and gets ``MCP-Protocol-Version``, ``Mcp-Method`` and ``Mcp-Name``
  from it, with no session and no GET stream;
- after ``notifications/initialized`` a GET stream is opened for server-initiated messages
  (``405``: the server offers none);
- a stream that breaks before its response, where the server gave event ids, is resumed with
  a GET carrying ``Last-Event-ID`` after the server's ``retry`` delay;
- close sends ``DELETE`` with the session id.

Every message read from HTTP goes through `classify_body` (the stdio wire rules) before it is
handed on; what fails is logged and dropped, never passed on. A request whose answer never came
as a valid message (a refused body, a broken stream that cannot be resumed, an HTTP error) is
answered with a JSON-RPC error naming the reason, so the client is never left waiting.

Fatal conditions end the stream of messages and are kept in `failure`: ``401``/``403`` (OAuth
is not supported: credentials come from ``--header``), and ``404`` on a request carrying the
session id, which the specification defines as the session having expired: the client must
start a new session with a new initialize, so Visor ends as a stdio server would and the
client's reconnect makes that new session.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from visor.http.bodies import classify_body
from visor.http.client import HttpClientError, OriginClient, Response, ResponseBroken, ResponseTooLarge
from visor.http.headers import ExtraHeader, encode_header_value
from visor.http.params import HeaderMap, header_map, param_headers
from visor.http.sse import DEFAULT_MAX_EVENT_BYTES, Event, EventReader, EventTooLarge
from visor.http.target import UrlError, check_url, display_url
from visor.logs import get_logger
from visor.wire import errors
from visor.wire.framer import DEFAULT_MAX_MESSAGE_BYTES
from visor.wire.message import JsonId, Kind, Message, Rejected, classify, is_valid_id

log = get_logger("visor.http")

PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"
# Methods whose name or uri the 2026-07-28 transport mirrors into Mcp-Name.
_NAME_PARAM = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
_ACCEPT_BOTH = "application/json, text/event-stream"
_DEFAULT_RETRY_MS = 1000
#: A JSON-RPC error code in the implementation-defined server range, for answers Visor makes
#: when the upstream gave none that could be passed on.
UPSTREAM_ERROR = -32000


class UpstreamHttpError(Exception):
    """The upstream cannot be used any more; the message says why and what to do."""


class AuthRequired(UpstreamHttpError):
    pass


class SessionExpired(UpstreamHttpError):
    pass


@dataclass(frozen=True, slots=True)
class HttpUpstreamConfig:
    url: str
    headers: tuple[ExtraHeader, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
    #: Requests awaiting their answer at once; one more is answered with an error at once.
    max_in_flight: int = 64
    #: Messages read from HTTP and not yet taken by a reader iterating over the upstream; past
    #: it, reading waits. (Through `HttpLink` there is no queue: the relay takes each at once.)
    max_queued: int = 1024
    connect_timeout: float = 30.0
    #: The longest a server's ``retry`` may make Visor wait before reconnecting.
    max_retry_seconds: float = 30.0
    #: Reconnections of one stream without a message in between before giving up.
    max_reconnects: int = 5
    delete_timeout: float = 5.0
    #: A request's answer (JSON or event stream) with no byte for this long is given up and the
    #: request answered with an error: as the MCP SDK client's read timeout (5 minutes). The GET
    #: stream, quiet while the server has nothing to say, has none.
    read_timeout: float = 300.0


class _Refused(Exception):
    """A body or stream the upstream sent that cannot be handed on."""


class MessageSink(Protocol):
    """Where the upstream's messages go when not read by iterating over the upstream."""

    async def deliver(self, raw: bytes) -> None:
        """Take one newline-free message; waiting here holds the sender back (flow control)."""

    def end(self) -> None:
        """No more messages: the server's output has ended."""


class HttpUpstream:
    """One MCP session with a Streamable HTTP server."""

    def __init__(self, config: HttpUpstreamConfig, sink: MessageSink | None = None) -> None:
        try:
            check_url(config.url)
        except UrlError as exc:
            raise UpstreamHttpError(str(exc)) from exc
        self.config = config
        self.url = config.url
        self.shown_url = display_url(config.url)
        #: Why the upstream ended, when it ended on its own (None after a normal close).
        self.failure: UpstreamHttpError | None = None
        self.session_id: str | None = None
        self.protocol_version: str | None = None
        self._http: OriginClient | None = None
        # The messages read from HTTP: handed to `sink`, or queued for iteration.
        self._sink = sink
        self._inbox: asyncio.Queue[bytes | None] = asyncio.Queue(config.max_queued)
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight: dict[JsonId, asyncio.Task[None]] = {}
        self._modern: set[JsonId] = set()  # in flight on the 2026-07-28 revision
        self._cancelled: set[JsonId] = set()  # in flight, and cancelled by the client
        # Tool name -> its arguments mirrored into Mcp-Param-* headers (2026-07-28).
        self._tool_marks: dict[str, HeaderMap] = {}
        self._listener: asyncio.Task[None] | None = None
        self._closed = False
        self._ended = False
        self._end_task: asyncio.Future[None] | None = None
        self._closing: asyncio.Future[None] | None = None
        self._hurry = asyncio.Event()
        # Cleared while an initialize is in flight.
        self._initialized = asyncio.Event()
        self._initialized.set()

    # ------------------------------------------------------------------ the pipe

    async def send(self, line: bytes) -> None:
        """Send one JSON-RPC message (newline-free, already checked by the relay)."""
        if self._closed or self._ended:
            return
        msg = classify(line, fold_case=False)
        if type(msg) is Rejected:
            raise ValueError(f"not a JSON-RPC message: {msg.reason}")
        assert type(msg) is Message
        # What a client sends after initialize belongs to the session its answer opens: it
        # waits for that answer (and its Mcp-Session-Id), in order, as a stdio server reads it.
        await self._initialized.wait()
        if self._closed or self._ended:
            return
        if self.session_id is not None and _message_revision(msg) is not None:
            # A session's revision is the one its initialize negotiated. A message naming one of
            # its own would go without the session's id, to run outside the session it was judged
            # in (in the upstream's sessionless context, which others may share): never sent.
            why = "a message that names its own protocol revision has no place in a negotiated session"
            if msg.kind is Kind.REQUEST:
                assert msg.id is not None
                await self._answer(msg.id, why)
            else:
                log.warning("upstream_message_refused", url=self.shown_url, method=msg.method, reason=why)
            return
        if msg.kind is Kind.REQUEST:
            assert msg.id is not None
            if len(self._in_flight) >= self.config.max_in_flight:
                await self._answer(
                    msg.id, f"too many requests in flight to the upstream (limit {self.config.max_in_flight})"
                )
                return
            if msg.id in self._in_flight:
                await self._answer(msg.id, "a request with this id is already in flight to the upstream")
                return
            if msg.method == "initialize":
                self._initialized.clear()
            task = self._spawn(self._request(msg))
            self._in_flight[msg.id] = task
            if _message_revision(msg) is not None:
                self._modern.add(msg.id)
        else:
            if msg.method == "notifications/cancelled":
                self._cancel(msg)
            self._spawn(self._post_one_way(msg))

    def _cancel(self, msg: Message) -> None:
        params = msg.obj.get("params")
        target = params.get("requestId") if type(params) is dict else None
        if not is_valid_id(target):
            return
        task = self._in_flight.get(target)
        if task is None:
            return
        self._cancelled.add(target)
        if target in self._modern:
            # 2026-07-28: closing the request's response stream is the cancellation (the
            # notification is still posted; such a server acknowledges and drops it).
            task.cancel()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[bytes]:
        while True:
            item = await self._inbox.get()
            if item is None:
                return
            yield item

    async def close(self, grace: float = 0.0) -> None:
        """End the session: stop the streams, DELETE the session, close the connections.

        With `grace`, requests already sent get up to that many seconds to be answered first,
        as a stdio server whose input closed may still answer what it read. A close without
        grace while another waits ends that wait at once; the session is ended only once.
        """
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close(grace))
        elif grace <= 0:
            self._hurry.set()
        await asyncio.shield(self._closing)

    async def _close(self, grace: float) -> None:
        if grace > 0 and self._in_flight and not self._ended:
            answered = asyncio.ensure_future(asyncio.wait(list(self._in_flight.values())))
            hurried = asyncio.ensure_future(self._hurry.wait())
            await asyncio.wait((answered, hurried), timeout=grace, return_when=asyncio.FIRST_COMPLETED)
            answered.cancel()  # stops the waiting only: the requests are cancelled below
            hurried.cancel()
        self._closed = True
        if self._listener is not None:
            self._listener.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._http is not None:
            if self.session_id is not None and self.failure is None:
                await self._delete_session()
            await self._http.close()
        self._end()

    # ------------------------------------------------------------------ requests

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _client(self) -> OriginClient:
        if self._http is None:
            # Cookies are kept: load balancers pin a session to a replica with one.
            self._http = OriginClient(self.url, connect_timeout=self.config.connect_timeout)
        return self._http

    def _headers(self, msg: Message | None, accept: str) -> dict[str, str]:
        headers = {h.name: h.value for h in self.config.headers}
        headers["Accept"] = accept
        if msg is not None:
            headers["Content-Type"] = "application/json"
        version = self.protocol_version
        modern = _message_revision(msg) if msg is not None else None
        if modern is not None:
            # The per-request revision: the header must say what the body's _meta says.
            version = modern
            assert msg is not None and msg.method is not None
            headers["Mcp-Method"] = encode_header_value(msg.method)
            key = _NAME_PARAM.get(msg.method)
            params = msg.obj.get("params")
            if key is not None and type(params) is dict and type(params.get(key)) is str:
                headers["Mcp-Name"] = encode_header_value(params[key])
            if msg.method == "tools/call" and type(params) is dict:
                tool = params.get("name")
                marks = self._tool_marks.get(tool) if type(tool) is str else None
                arguments = params.get("arguments")
                if marks and type(arguments) is dict:
                    headers.update(param_headers(marks, arguments))
        elif self.session_id is not None:
            headers["Mcp-Session-Id"] = self.session_id
        if version is not None:
            headers["MCP-Protocol-Version"] = version
        return headers

    async def _request(self, msg: Message) -> None:
        assert msg.id is not None
        answered = False
        reason = "the upstream gave no answer"
        try:
            answered, reason = await self._post_request(msg)
        except UpstreamHttpError as exc:
            # Answered before the stream of messages ends with the failure.
            await self._answer(msg.id, str(exc))
            answered = True
            await self._fail(exc)
        except _Refused as exc:
            reason = str(exc)
        except (TimeoutError, HttpClientError, OSError) as exc:
            reason = f"the upstream {self.shown_url} could not be reached: {_describe(exc)}"
            log.warning(
                "upstream_request_failed", url=self.shown_url, method=msg.method, error=_describe(exc)
            )
        except asyncio.CancelledError:
            raise
        finally:
            self._in_flight.pop(msg.id, None)
            self._modern.discard(msg.id)
            # A request the client cancelled expects no answer: none is made up for it.
            cancelled = msg.id in self._cancelled
            self._cancelled.discard(msg.id)
            if msg.method == "initialize":
                self._initialized.set()
        if not answered and not self._closed and not cancelled:
            await self._answer(msg.id, reason)

    async def _post_request(self, msg: Message) -> tuple[bool, str]:
        sent_session = self.session_id
        async with await self._client().request(
            "POST", self._headers(msg, _ACCEPT_BOTH), msg.raw, read_timeout=self.config.read_timeout
        ) as resp:
            self._check_status(resp, sent_session is not None)
            if msg.method == "initialize" and resp.status == 200:
                self._take_session_id(resp)
            ctype = resp.content_type
            if 200 <= resp.status < 300:
                if resp.status == 202:
                    return False, "the upstream accepted the request (202) but sent no answer"
                if ctype == "application/json":
                    return await self._deliver_answer(msg, await self._read_body(resp)), _NOT_ANSWERED
                if ctype == "text/event-stream":
                    return await self._read_post_stream(msg, resp), _STREAM_ENDED
                raise _Refused(
                    f"the upstream answered with Content-Type {ctype!r}, not JSON or an event stream"
                )
            # An HTTP error may still carry the JSON-RPC error for this request.
            said = ""
            if ctype == "application/json":
                with contextlib.suppress(_Refused):
                    body = await self._read_body(resp)
                    result = classify_body(body)
                    if (
                        type(result) is Message
                        and result.kind is Kind.RESPONSE
                        and _same_id(result.id, msg.id)
                    ):
                        await self._deliver(result.raw)
                        return True, ""
                    said = _error_text(result)
            status = f"HTTP {resp.status} {resp.reason or ''}".rstrip()
            return False, f"the upstream {self.shown_url} answered {status}{said}"

    async def _post_one_way(self, msg: Message) -> None:
        """A notification or a response: the server answers 202 and nothing else."""
        try:
            sent_session = self.session_id
            async with await self._client().request(
                "POST", self._headers(msg, _ACCEPT_BOTH), msg.raw
            ) as resp:
                self._check_status(resp, sent_session is not None)
                if resp.status not in (200, 202):
                    log.warning(
                        "upstream_refused_message",
                        url=self.shown_url,
                        kind=msg.kind.value,
                        method=msg.method,
                        status=resp.status,
                    )
                    return
        except UpstreamHttpError as exc:
            await self._fail(exc)
            return
        except (TimeoutError, HttpClientError, OSError) as exc:
            log.warning("upstream_message_lost", url=self.shown_url, method=msg.method, error=_describe(exc))
            return
        if msg.method == "notifications/initialized" and self._listener is None and not self._closed:
            self._listener = self._spawn(self._listen())

    def _check_status(self, resp: Response, sent_session: bool) -> None:
        status = resp.status
        if status in (401, 403):
            challenge = resp.headers.get("WWW-Authenticate")
            sent_auth = any(h.name.lower() == "authorization" for h in self.config.headers)
            what = (
                "refused the Authorization header Visor sent"
                if sent_auth
                else "needs credentials: pass them with --header 'Authorization: Bearer ${TOKEN}' "
                "(the token read from the environment variable TOKEN)"
            )
            shown = f"; WWW-Authenticate: {challenge}" if challenge else ""
            raise AuthRequired(
                f"the upstream {self.shown_url} answered {status} {resp.reason or ''}: it {what}{shown}. "
                "OAuth sign-in is not supported by visor run --url."
            )
        if status == 404 and sent_session:
            raise SessionExpired(
                f"the upstream {self.shown_url} ended the MCP session (404 for session id): the client must "
                "start a new session with a new initialize; Visor stops so that the client's reconnect does so"
            )
        if 300 <= status < 400:
            where = resp.headers.get("Location", "")
            raise _Refused(
                f"the upstream {self.shown_url} redirected ({status}) to {display_url(where) if where else 'nowhere'}; "
                "Visor does not follow redirects: give that URL to --url"
            )

    def _take_session_id(self, resp: Response) -> None:
        sid = resp.headers.get("Mcp-Session-Id")
        if sid is None:
            return
        if not sid or not all(0x21 <= ord(c) <= 0x7E for c in sid):
            raise _Refused("the upstream's Mcp-Session-Id holds characters outside visible ASCII")
        self.session_id = sid
        log.info(
            "upstream_session",
            url=self.shown_url,
            session_digest=hashlib.sha256(sid.encode()).hexdigest()[:16],
        )

    async def _read_body(self, resp: Response) -> bytes:
        cap = self.config.max_body_bytes
        if resp.content_length is not None and resp.content_length > cap:
            raise _Refused(f"the upstream's body is {resp.content_length} bytes, over the {cap}-byte limit")
        try:
            return await resp.read(cap)
        except ResponseTooLarge:
            raise _Refused(f"the upstream's body is over the {cap}-byte limit") from None

    async def _deliver_answer(self, msg: Message, body: bytes) -> bool:
        """Hand on a JSON body; True when it answered `msg`."""
        result = classify_body(body)
        if type(result) is Rejected:
            self._log_refused("body", body, result.reason)
            raise _Refused(f"the upstream's answer was refused: {result.reason}")
        assert type(result) is Message
        self._observe(msg, result)
        await self._deliver(result.raw)
        return result.kind is Kind.RESPONSE and _same_id(result.id, msg.id)

    # ------------------------------------------------------------------ streams

    async def _read_post_stream(self, msg: Message, resp: Response) -> bool:
        """Read a request's SSE stream, resuming it where the server allows; True once answered."""
        state = _StreamState()
        answered = await self._read_events(resp, msg, state)
        reconnects = 0
        while not answered and not self._closed:
            if not state.last_event_id or _message_revision(msg) is not None:
                return False
            if reconnects >= self.config.max_reconnects:
                log.warning("upstream_stream_abandoned", url=self.shown_url, reconnects=reconnects)
                return False
            reconnects += 1
            await asyncio.sleep(self._retry_delay(state))
            progressed = state.delivered
            async with await self._client().request(
                "GET", self._resume_headers(state.last_event_id), read_timeout=self.config.read_timeout
            ) as again:
                self._check_status(again, self.session_id is not None)
                if again.status != 200 or again.content_type != "text/event-stream":
                    log.warning("upstream_resume_refused", url=self.shown_url, status=again.status)
                    return False
                log.info("upstream_stream_resumed", url=self.shown_url, method=msg.method)
                answered = await self._read_events(again, msg, state)
            if state.delivered > progressed:
                reconnects = 0
        return answered

    def _resume_headers(self, last_event_id: str) -> dict[str, str]:
        headers = self._headers(None, "text/event-stream")
        headers["Last-Event-ID"] = last_event_id
        return headers

    def _retry_delay(self, state: _StreamState) -> float:
        ms = state.retry if state.retry is not None else _DEFAULT_RETRY_MS
        return min(ms / 1000, self.config.max_retry_seconds)

    async def _read_events(self, resp: Response, origin: Message | None, state: _StreamState) -> bool:
        """Hand on each event's message; True when the response to `origin` came (then stop reading)."""
        reader = EventReader(self.config.max_event_bytes)
        try:
            async for chunk in resp.chunks():
                for item in reader.feed(chunk):
                    if type(item) is EventTooLarge:
                        log.warning(
                            "upstream_event_refused",
                            url=self.shown_url,
                            reason=f"event over the {self.config.max_event_bytes}-byte limit",
                            size=item.size,
                        )
                        continue
                    assert type(item) is Event
                    if not item.data:
                        continue  # a priming event: only its id matters
                    if item.event != "message":
                        # The MCP SDK client reads only `message` events (the name is
                        # case-sensitive) and skips the rest: so does Visor, or a server could
                        # show a client through Visor what it would not see directly.
                        log.info("upstream_event_skipped", url=self.shown_url, event_name=item.event[:40])
                        continue
                    result = classify_body(item.data)
                    if type(result) is Rejected:
                        self._log_refused("event", item.data, result.reason)
                        continue
                    assert type(result) is Message
                    if origin is not None:
                        self._observe(origin, result)
                    await self._deliver(result.raw)
                    state.delivered += 1
                    if origin is not None and result.kind is Kind.RESPONSE and _same_id(result.id, origin.id):
                        return True
                # Kept as they come: a break in the middle of the next read resumes from here.
                state.last_event_id = reader.last_event_id or state.last_event_id
                state.retry = reader.retry if reader.retry is not None else state.retry
        except (TimeoutError, ResponseBroken) as exc:
            log.info("upstream_stream_broke", url=self.shown_url, error=_describe(exc))
        state.last_event_id = reader.last_event_id or state.last_event_id
        state.retry = reader.retry if reader.retry is not None else state.retry
        dropped = reader.eof()
        if dropped:
            log.info("upstream_stream_cut", url=self.shown_url, incomplete_event_bytes=dropped)
        return False

    async def _listen(self) -> None:
        """The GET stream for server-initiated messages, reopened when it ends, while the server offers it."""
        state = _StreamState()
        failures = 0
        while not self._closed:
            headers = self._headers(None, "text/event-stream")
            if state.last_event_id:
                headers["Last-Event-ID"] = state.last_event_id
            try:
                async with await self._client().request("GET", headers) as resp:
                    self._check_status(resp, self.session_id is not None)
                    if resp.status == 405:
                        log.info("upstream_no_get_stream", url=self.shown_url)
                        return
                    if resp.status != 200 or resp.content_type != "text/event-stream":
                        log.warning("upstream_get_stream_refused", url=self.shown_url, status=resp.status)
                        failures += 1
                    else:
                        before = state.delivered
                        await self._read_events(resp, None, state)
                        failures = 0 if state.delivered > before else failures + 1
            except UpstreamHttpError as exc:
                await self._fail(exc)
                return
            except _Refused as exc:
                log.warning("upstream_get_stream_refused", url=self.shown_url, reason=str(exc))
                return
            except (TimeoutError, HttpClientError, OSError) as exc:
                log.info("upstream_get_stream_failed", url=self.shown_url, error=_describe(exc))
                failures += 1
            if failures > self.config.max_reconnects:
                log.warning("upstream_get_stream_abandoned", url=self.shown_url, attempts=failures)
                return
            await asyncio.sleep(self._retry_delay(state))

    # ------------------------------------------------------------------ the rest

    def _observe(self, origin: Message, result: Message) -> None:
        """What later requests' headers need: the negotiated revision (initialize) and the
        tools' ``x-mcp-header`` marks (tools/list)."""
        if result.kind is not Kind.RESPONSE or not _same_id(result.id, origin.id):
            return
        res = result.obj.get("result")
        if type(res) is not dict:
            return
        if origin.method == "initialize":
            version = res.get("protocolVersion")
            if type(version) is str and version.isascii() and version.isprintable():
                self.protocol_version = version
        elif origin.method == "tools/list" and type(res.get("tools")) is list:
            for tool in res["tools"]:
                name = tool.get("name") if type(tool) is dict else None
                if type(name) is not str:
                    continue
                assert type(tool) is dict
                marks = header_map(tool.get("inputSchema"))
                if isinstance(marks, str):
                    log.warning(
                        "upstream_tool_header_marks_invalid", url=self.shown_url, tool=name, reason=marks
                    )
                    self._tool_marks.pop(name, None)
                elif marks:
                    self._tool_marks[name] = marks
                else:
                    self._tool_marks.pop(name, None)

    async def _delete_session(self) -> None:
        assert self._http is not None
        try:
            async with asyncio.timeout(self.config.delete_timeout):
                async with await self._http.request("DELETE", self._headers(None, _ACCEPT_BOTH)) as resp:
                    log.info("upstream_session_deleted", url=self.shown_url, status=resp.status)
        except (TimeoutError, HttpClientError, OSError) as exc:
            log.info("upstream_delete_failed", url=self.shown_url, error=_describe(exc))

    async def _deliver(self, raw: bytes) -> None:
        # A full queue (the relay not reading, because its client is not) holds the sender
        # here: a stream stops being read and TCP flow control reaches the server, as a pipe would.
        if self._ended:
            return
        if self._sink is not None:
            await self._sink.deliver(raw)
        else:
            await self._inbox.put(raw)

    async def _answer(self, msg_id: JsonId, reason: str) -> None:
        await self._deliver(errors.error_response(msg_id, UPSTREAM_ERROR, f"Visor: {reason}"))

    def _log_refused(self, where: str, data: bytes, reason: str) -> None:
        # As on stdio: the size and digest of what was refused, never its bytes.
        log.warning(
            "upstream_message_refused",
            url=self.shown_url,
            carrier=where,
            reason=reason,
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
        )

    async def _fail(self, exc: UpstreamHttpError) -> None:
        if self.failure is None:
            self.failure = exc
            log.error("upstream_failed", url=self.shown_url, error=str(exc))
        # Requests still waiting get their answer before the stream ends.
        for msg_id, task in list(self._in_flight.items()):
            if task is not asyncio.current_task():
                task.cancel()
                await self._answer(msg_id, str(exc))
        self._in_flight.clear()
        self._end()

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            if self._sink is not None:
                self._sink.end()
                return
            try:
                self._inbox.put_nowait(None)
            except asyncio.QueueFull:
                # The end waits behind what is queued; close() never waits for this task.
                self._end_task = asyncio.ensure_future(self._inbox.put(None))


@dataclass(slots=True)
class _StreamState:
    last_event_id: str = ""
    retry: int | None = None
    delivered: int = 0


_NOT_ANSWERED = "the upstream's answer did not answer the request"
_STREAM_ENDED = "the upstream's event stream ended before the answer and could not be resumed"


def _message_revision(msg: Message) -> str | None:
    """The revision a 2026-07-28-style message names in its ``_meta``, or None."""
    params = msg.obj.get("params")
    meta = params.get("_meta") if type(params) is dict else None
    version = meta.get(PROTOCOL_VERSION_META) if type(meta) is dict else None
    if type(version) is str and version.isascii() and version.isprintable():
        return version
    return None


def _error_text(result: Message | Rejected) -> str:
    """The message of a JSON-RPC error the server sent without this request's id (e.g. id null)."""
    if type(result) is not Message or result.kind is not Kind.RESPONSE:
        return ""
    error = result.obj.get("error")
    text = error.get("message") if type(error) is dict else None
    if type(text) is not str or not text:
        return ""
    return f": {text[:300]}"


def _same_id(a: JsonId | None, b: JsonId | None) -> bool:
    return a is not None and type(a) is type(b) and a == b


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
