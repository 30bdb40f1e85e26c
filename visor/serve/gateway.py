"""The HTTP side of `visor serve`: the Streamable HTTP transport's rules at `/mcp`, and `/healthz`.

Every rule that can refuse a request is checked before its body reaches a session, and each
refusal is the specification's status with a JSON-RPC error body (id null unless the message's
own id can be trusted): the gateway never answers a bad request with a crash or a bare page.
Order: Origin (403), client token (401), method and headers (405, 406, 415), session id (400,
404), body size (413), the body itself held to the wire rules (400), limits (429, 503).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import hashlib
import hmac
import ipaddress
import re
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson

from visor.audit import events as audit_events
from visor.http.bodies import classify_body
from visor.http.server import Answer, Request, Response, StreamResponse, json_response
from visor.logs import get_logger
from visor.serve.metrics import CONTENT_TYPE, SNAPSHOT_QUERY, GatewayMetrics
from visor.serve.metrics import render as render_metrics
from visor.serve.session import ENDED, Exchange, McpSession, id_key
from visor.serve.sessionless import (
    CONVERSATION_PREFIX,
    VERSION_KEY,
    Renamed,
    Renamer,
    check_request,
    conversation_key,
)
from visor.wire import errors
from visor.wire.message import Kind, Message, Rejected

if TYPE_CHECKING:
    from visor.serve.state import Adoption, SharedState

log = get_logger("visor.serve")

SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"
# The revisions whose HTTP transport this gateway serves (sessions created by initialize).
SUPPORTED_VERSIONS = frozenset({"2025-03-26", "2025-06-18", "2025-11-25"})
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
# `visor serve --workers`: a request for another worker's session is answered by that worker
# (visor/serve/workers.py); None means "serve it here".
Forwarder = Callable[[Request], Awaitable[Answer | None]]
# Headers that route or identify a request: each may appear once.
_SINGLE_HEADERS = (
    SESSION_HEADER, VERSION_HEADER, "Mcp-Method", "Mcp-Name", "Authorization", "Last-Event-ID",
    "Content-Type", "Origin", "Host",
)  # fmt: skip
_SINGLE_FOLDED = frozenset(h.lower() for h in _SINGLE_HEADERS)
# Ended session ids remembered against re-adoption while the store learns they ended.
_ENDED_KEEP = 4096

# (session id, the record of a session another replica started, or None for a new one)
SessionFactory = Callable[[str, "Adoption | None"], Awaitable[McpSession]]


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    host: str
    port: int
    token: str | None
    allowed_origins: frozenset[str]
    max_message_bytes: int
    max_sessions: int
    max_in_flight: int
    idle_timeout: float
    end_grace: float
    server_name: str
    # `--replica-id`: the first part of every session id minted here ("ID."), for routing.
    replica_id: str | None = None


def is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _error(status: int, code: int, message: str, *, rpc_id: Any = None, headers: Any = None) -> Response:
    body = {"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": message}}
    return Response(status=status, body=orjson.dumps(body), content_type="application/json", headers=headers)


# Clients send the same Accept, Content-Type and Host on every request: each is parsed once and
# its answer kept (bounded, so varied values only cost the parse again).
_PARSED_KEEP = 64


@functools.lru_cache(maxsize=_PARSED_KEEP)
def _media_types(value: str) -> frozenset[str]:
    return frozenset(part.split(";", 1)[0].strip().lower() for part in value.split(",") if part.strip())


# A Host value, and an Origin's host part, as RFC 9110 and browsers write them: a name or an IP
# literal and an optional port; nothing a lenient URL parser would read past (`evil\\@127.0.0.1`).
_HOST_VALUE = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::[0-9]{1,5})?")
_ORIGIN_VALUE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://" + _HOST_VALUE.pattern)


@functools.lru_cache(maxsize=_PARSED_KEEP)
def _names_loopback(host: str) -> bool:
    """Whether a Host header's value names this machine's loopback."""
    if not _HOST_VALUE.fullmatch(host):
        return False
    try:
        name = urlsplit("//" + host).hostname
    except ValueError:
        return False
    return name is not None and is_loopback(name)


def _over_unix_socket(request: Request) -> bool:
    """Whether the request came over a unix socket (a worker's private one), not the TCP port."""
    sock = request.transport.get_extra_info("socket") if request.transport is not None else None
    return sock is not None and sock.family == socket.AF_UNIX


class Gateway:
    """The session table and the request handlers."""

    def __init__(
        self,
        config: GatewayConfig,
        new_session: SessionFactory,
        metrics: GatewayMetrics | None = None,
        state: SharedState | None = None,
    ) -> None:
        self.config = config
        # `--state`: sessions are recorded in a shared store, and any replica continues any of them.
        self.state = state
        self._adopting: dict[str, asyncio.Task[McpSession | Response]] = {}
        # Sessions that ended here, so that none is adopted again before the store says it ended.
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._closing = False
        self._background: set[asyncio.Task[Any]] = set()
        self.metrics = metrics if metrics is not None else GatewayMetrics()
        self._new_session = new_session
        self.sessions: dict[str, McpSession] = {}
        # 2026-07-28 requests have no session: one conversation per client credential
        # (visor/serve/sessionless.py), each with its own Visor state and upstream.
        self.conversations: dict[str, McpSession] = {}
        self._renamers: dict[str, Renamer] = {}
        self._opening_conversation: dict[str, asyncio.Task[McpSession | Response]] = {}
        self._opening = 0
        self._ending: set[asyncio.Task[None]] = set()
        # The token's digest, made once: each request's Authorization is compared with it.
        self._expected_digest = (
            hashlib.sha256(f"Bearer {config.token}".encode()).digest() if config.token is not None else None
        )
        self._listen_loopback = is_loopback(config.host)
        # Set by a worker of `visor serve --workers N`: its index on the ids it mints, and its forwarder.
        self.sid_suffix = ""
        self.forward: Forwarder | None = None
        # Set by a worker too: the other workers' /metrics figures, for a scrape to show with its own
        # (this worker's index, [(index, figures) of each other worker that answered]).
        self.peer_metrics: Callable[[], Awaitable[tuple[int, list[tuple[int, dict[str, Any]]]]]] | None = None

    async def handle(self, request: Request) -> Answer:
        """Every request the HTTP server takes: `/mcp`, `/healthz`, `/metrics`; 404 for the rest.
        Paths are compared as sent (`/%6dcp` is not `/mcp`)."""
        path = request.path
        if path == "/mcp":
            return await self.mcp(request)
        if path in ("/healthz", "/metrics"):
            if request.method not in ("GET", "HEAD"):
                return _error(
                    405, errors.INVALID_REQUEST, "Method Not Allowed", headers={"Allow": "GET, HEAD"}
                )
            return await (self.healthz(request) if path == "/healthz" else self.metrics_page(request))
        return _error(404, errors.INVALID_REQUEST, "Not Found")

    # ------------------------------------------------------------ sessions
    def mint_sid(self) -> str:
        """128 random bits, visible ASCII; `--replica-id` puts `ID.` in front, so a load balancer
        can tell the replica that holds the session, and a worker adds `-I`, so any worker can
        tell the one that does."""
        prefix = f"{self.config.replica_id}." if self.config.replica_id else ""
        return prefix + secrets.token_hex(16) + self.sid_suffix

    def _open_count(self) -> int:
        return len(self.sessions) + len(self.conversations) + self._opening

    def session_ended(self, session: McpSession) -> None:
        if self.conversations.get(session.sid) is session:
            del self.conversations[session.sid]
            self._renamers.pop(session.sid, None)
            log.info("conversation_closed", mcp_session=session.sid)
        if self.sessions.get(session.sid) is session:
            del self.sessions[session.sid]
            log.info("session_closed", mcp_session=session.sid, sessions=len(self.sessions))
        if self.state is not None and not self._closing and not session.keep_in_store:
            # Over for every replica (DELETE, idle, or its upstream ended). A replica that stops
            # leaves its sessions in the store instead, for the others to continue.
            self._ended[session.sid] = None
            while len(self._ended) > _ENDED_KEEP:
                self._ended.popitem(last=False)
            self._in_background(self._end_in_store(session.sid))

    async def _end_in_store(self, sid: str) -> None:
        assert self.state is not None
        try:
            await asyncio.to_thread(self.state.ledger.end, sid)
        except Exception as exc:  # it expires with its TTL; until then another replica could adopt it
            log.error("state_session_end_failed", mcp_session=sid, error=str(exc))

    def _in_background(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _end_later(self, session: McpSession) -> None:
        task = asyncio.get_running_loop().create_task(session.end(self.config.end_grace))
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    async def expire_idle(self) -> None:
        """End sessions with nothing in flight and no POST for the idle timeout (a GET stream
        alone does not keep a session alive: the SDK client holds one open for its whole life)."""
        interval = max(0.05, min(self.config.idle_timeout / 4, 30.0))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for session in [*self.sessions.values(), *self.conversations.values()]:
                if session.in_flight == 0 and now - session.last_active >= self.config.idle_timeout:
                    log.info("session_idle_expired", mcp_session=session.sid)
                    # Idle here is not over everywhere: another replica may have continued it.
                    # The store's record expires on its own TTL (twice the idle timeout).
                    session.keep_in_store = True
                    self._end_later(session)

    async def close(self) -> None:
        """Every session ended (its upstream stopped) before the gateway stops. With `--state`,
        they stay open in the store: another replica continues them."""
        self._closing = True
        sessions = [*self.sessions.values(), *self.conversations.values()]
        await asyncio.gather(*(s.end(self.config.end_grace) for s in sessions), return_exceptions=True)
        if self._ending:
            await asyncio.gather(*self._ending, return_exceptions=True)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # ------------------------------------------------------------ checks common to every method
    def _refuse_origin_or_auth(self, request: Request) -> Response | None:
        if self._listen_loopback and not self._host_is_loopback(request):
            # DNS rebinding from a page whose browser omits Origin: the name it used is not ours.
            log.warning("host_refused", host=request.headers.get("Host", "")[:200])
            return _error(403, errors.INVALID_REQUEST, "Forbidden: this Host may not use this server")
        origin = request.headers.get("Origin")
        if origin is not None and not self._origin_allowed(origin):
            log.warning("origin_refused", origin=origin[:200])
            return _error(403, errors.INVALID_REQUEST, "Forbidden: this Origin may not use this server")
        if self._expected_digest is not None:
            given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            # Constant time in the token: compare digests of equal length.
            if not hmac.compare_digest(hashlib.sha256(given).digest(), self._expected_digest):
                return _error(
                    401, errors.INVALID_REQUEST, "Unauthorized: present Authorization: Bearer <token>",
                    headers={"WWW-Authenticate": 'Bearer realm="visor"'},
                )  # fmt: skip
        return None

    @staticmethod
    def _host_is_loopback(request: Request) -> bool:
        host = request.headers.get("Host")
        if host is None:
            return True  # HTTP/1.0 without Host: no name was used to reach us
        return _names_loopback(host)

    def _origin_allowed(self, origin: str) -> bool:
        if origin in self.config.allowed_origins:
            return True
        if not _ORIGIN_VALUE.fullmatch(origin):
            return False  # not the scheme://host[:port] a browser sends
        try:
            host = urlsplit(origin).hostname
        except ValueError:
            return False
        if not host:
            return False
        listen = self.config.host.lower().strip("[]")
        if host.lower() == listen:
            return True
        # A page served from this machine's loopback under another spelling is the same machine.
        return is_loopback(listen) and is_loopback(host)

    async def _session_for(self, request: Request) -> McpSession | Response:
        sid = request.headers.get(SESSION_HEADER)
        if sid is None:
            if request.headers.get(VERSION_HEADER) in errors.MODERN_PROTOCOL_VERSIONS:
                # 2026-07-28 has no session to stream to or delete: no GET stream, no DELETE.
                return _error(
                    405, errors.INVALID_REQUEST,
                    f"Method Not Allowed: {request.method} without a session on this revision",
                    headers={"Allow": "POST"},
                )  # fmt: skip
            return _error(400, errors.INVALID_REQUEST, f"Bad Request: {SESSION_HEADER} header is required")
        version = request.headers.get(VERSION_HEADER)
        if version is not None and version not in SUPPORTED_VERSIONS:
            return _error(
                400, errors.INVALID_REQUEST, f"Bad Request: unsupported {VERSION_HEADER} {version[:40]!r}"
            )
        if sid.startswith(CONVERSATION_PREFIX):
            # Never minted (a session id is hex): the shared store's record of a 2026-07-28
            # conversation, which a session id must not reach (adopted as a second session of it
            # beside the conversation, or ended in the store by a DELETE).
            return _error(404, errors.INVALID_REQUEST, "Session not found (unknown, ended or expired)")
        session = self.sessions.get(sid)
        if session is None and self.state is not None and sid not in self._ended:
            return await self._adopt(sid, request)
        if session is None or session.ended:
            return _error(404, errors.INVALID_REQUEST, "Session not found (unknown, ended or expired)")
        return session

    async def _adopt(self, sid: str, request: Request) -> McpSession | Response:
        """A session this replica does not hold: continue it from the shared store, once (the
        requests for it that arrive meanwhile wait for the same adoption)."""
        authorization = request.headers.get("Authorization")
        return await self._once(self._adopting, sid, lambda: self._adopt_once(sid, authorization))

    async def _once(
        self,
        opening: dict[str, asyncio.Task[McpSession | Response]],
        key: str,
        start: Callable[[], Coroutine[Any, Any, McpSession | Response]],
    ) -> McpSession | Response:
        """Open the session `key` once: requests that arrive meanwhile wait for the same start."""
        task = opening.get(key)
        if task is None:
            if self._open_count() >= self.config.max_sessions:
                return _error(
                    503,
                    errors.INTERNAL_ERROR,
                    "Service Unavailable: too many sessions",
                    headers={"Retry-After": "5"},
                )
            task = asyncio.get_running_loop().create_task(start())
            opening[key] = task
            task.add_done_callback(lambda _t: opening.pop(key, None))
        # Shielded: a client that goes away must not leave a half-opened session nobody can end.
        return await asyncio.shield(task)

    async def _adopt_once(self, sid: str, authorization: str | None) -> McpSession | Response:
        from visor.serve.state import Adoption, client_digest
        from visor.state.ledger import StateUnavailable

        state = self.state
        assert state is not None
        unavailable = _error(
            503,
            errors.INTERNAL_ERROR,
            "Service Unavailable: the shared session state cannot be read; retry later",
            headers={"Retry-After": "5"},
        )
        try:
            record = await asyncio.to_thread(state.ledger.load, sid)
        except ValueError:  # not an id this gateway could have given out
            return _error(404, errors.INVALID_REQUEST, "Session not found (unknown, ended or expired)")
        except StateUnavailable as exc:
            log.error("session_adopt_failed", mcp_session=sid, error=str(exc))
            return unavailable
        if record is None or record.ended:
            return _error(404, errors.INVALID_REQUEST, "Session not found (unknown, ended or expired)")
        if record.client != client_digest(authorization):
            # Opened with another credential: to this one, the session does not exist.
            log.warning("session_adopt_refused", mcp_session=sid, reason="another client credential")
            return _error(404, errors.INVALID_REQUEST, "Session not found (unknown, ended or expired)")
        if record.pins is None and record.calls_total > 0:
            # Calls ran, so tools were pinned, but the pins never reached the store: a new upstream's
            # tools would be trusted afresh. The session cannot be continued safely.
            log.error(
                "session_adopt_refused", mcp_session=sid, reason="the session's pins are not in the store"
            )
            return _error(
                404, errors.INVALID_REQUEST, "Session not found (its pins could not be carried over)"
            )
        try:
            previous = await asyncio.to_thread(state.ledger.claim, sid, state.owner)
        except StateUnavailable as exc:
            log.error("session_adopt_failed", mcp_session=sid, error=str(exc))
            return unavailable
        self._opening += 1
        try:
            session = await self._new_session(sid, Adoption(record, previous))
        except Exception as exc:
            log.error("session_adopt_failed", mcp_session=sid, error=str(exc))
            return _error(502, errors.INTERNAL_ERROR, f"the session could not be continued here: {exc}")
        finally:
            self._opening -= 1
        self.sessions[sid] = session
        log.info("session_adopted", mcp_session=sid, previous_owner=previous, sessions=len(self.sessions))
        return session

    # ------------------------------------------------------------ handlers
    async def healthz(self, request: Request) -> Response:
        return Response(text="ok\n")

    async def metrics_page(self, request: Request) -> Response:
        # The same door as /mcp: Host, Origin and, when one is configured, the client token.
        refused = self._refuse_origin_or_auth(request)
        if refused is not None:
            return refused
        own = self.metrics.snapshot(sessions_open=len(self.sessions))
        if self.peer_metrics is None:
            body = render_metrics([(None, own)])
        elif SNAPSHOT_QUERY in request.query and _over_unix_socket(request):
            # Another worker answering a scrape (`--workers N`): this worker's own figures. Only
            # on the private unix socket; through the public port the query changes nothing.
            return json_response(own)
        else:
            index, peers = await self.peer_metrics()
            workers: list[tuple[int, dict[str, Any]]] = sorted([(index, own), *peers], key=lambda p: p[0])
            body = render_metrics(workers)
        return Response(body=body.encode(), headers={"Content-Type": CONTENT_TYPE})

    async def mcp(self, request: Request) -> Answer:
        response = await self._mcp(request)
        # Only a worker (`forward` set) listens on a unix socket: one process asks no transport.
        if self.forward is None or not _over_unix_socket(request):
            # A request forwarded from another worker (`--workers N`) is counted there, once:
            # a scrape sums every worker's figures.
            self.metrics.http_request(request.method, response.status)
        return response

    async def _mcp(self, request: Request) -> Answer:
        headers = request.headers
        # Only a request that gives some header name twice (in any case) can repeat one of these.
        repeated = None
        names = {name.lower() for name in headers}
        if len(names) != len(headers):
            repeated = next((h for h in _SINGLE_HEADERS if len(headers.getall(h, ())) > 1), None)
        if repeated is None:
            # CGI and WSGI readers (and proxies that rewrite `_` to `-`) take `Mcp_Name` for
            # `Mcp-Name`: such a spelling beside, or instead of, the header is another reading.
            repeated = next((n for n in names if "_" in n and n.replace("_", "-") in _SINGLE_FOLDED), None)
        if repeated is not None:
            # Readers differ on a repeated header (the first, the last, or all joined by commas):
            # a router and Visor could each route or judge by another value. Refused, not guessed.
            return _error(400, errors.INVALID_REQUEST, f"Bad Request: {repeated} header given more than once")
        refused = self._refuse_origin_or_auth(request)
        if refused is not None:
            return refused
        if self.forward is not None and (forwarded := await self.forward(request)) is not None:
            return forwarded
        if request.method == "POST":
            return await self._post(request)
        if request.method == "GET":
            return await self._get(request)
        if request.method == "DELETE":
            return await self._delete(request)
        return _error(
            405, errors.INVALID_REQUEST, "Method Not Allowed", headers={"Allow": "GET, POST, DELETE"}
        )

    async def _post(self, request: Request) -> Answer:
        accept = _media_types(request.headers.get("Accept", ""))
        if not ({"application/json", "text/event-stream"} <= accept or "*/*" in accept):
            return _error(
                406,
                errors.INVALID_REQUEST,
                "Not Acceptable: Accept must list application/json and text/event-stream",
            )
        if _media_types(request.headers.get("Content-Type", "")) != {"application/json"}:
            return _error(
                415, errors.INVALID_REQUEST, "Unsupported Media Type: Content-Type must be application/json"
            )
        if any(
            coding.strip().lower() != "identity" for coding in request.headers.getall("Content-Encoding", ())
        ):
            # A compressed body would be judged after decoding and could expand past every limit
            # on the way; no MCP client compresses what it sends.
            return _error(
                415,
                errors.INVALID_REQUEST,
                "Unsupported Media Type: the body must not be compressed (Content-Encoding)",
            )
        sid = request.headers.get(SESSION_HEADER)
        session: McpSession | None = None
        if sid is not None:
            # The session first: a body for no session is never read, held or parsed.
            found = await self._session_for(request)
            if isinstance(found, Response):
                return found
            session = found
        # Over --max-message-bytes (declared or counted), read() raises and the server answers 413.
        body = await request.read()
        msg = classify_body(body, from_client=True)
        if isinstance(msg, Rejected):
            if session is not None:
                self._record_reject(session, body, msg)
            rpc_id = msg.reply_ids[0] if len(msg.reply_ids) == 1 and not msg.reply_null else None
            return _error(400, msg.code, msg.reason, rpc_id=rpc_id)
        if session is None:
            if msg.kind is Kind.REQUEST and msg.method == "initialize":
                return await self._initialize(request, msg)
            if request.headers.get(VERSION_HEADER) in errors.MODERN_PROTOCOL_VERSIONS or _claims_modern(msg):
                return await self._sessionless(request, msg)
            return _error(400, errors.INVALID_REQUEST, f"Bad Request: {SESSION_HEADER} header is required")
        if _names_revision(msg):
            # A session's revision is the one its initialize negotiated. A message that names one
            # of its own in `_meta` would leave the session on the way up (an HTTP upstream sends
            # such a message without the session id, in its sessionless conversation, which every
            # session of this gateway shares): judged here in this session, run in none of them.
            reason = f"params._meta[{VERSION_KEY!r}] has no place in a session (its revision is negotiated)"
            self._record_reject(
                session, body, Rejected(errors.INVALID_REQUEST, reason, method=msg.method, tool=msg.tool)
            )
            return _error(400, errors.INVALID_REQUEST, f"Bad Request: {reason}", rpc_id=msg.id)
        session.last_active = time.monotonic()
        if msg.kind is not Kind.REQUEST:
            # A notification or a response (to a server's request): accepted once on the relay's input.
            try:
                await session.send(msg.raw)
            except ConnectionError:
                return _error(404, errors.INVALID_REQUEST, "Session not found (ended)")
            return Response(status=202)
        # The request's limits, then its exchange, called from here: one await level less.
        refused = self._refuse_request(session, msg, None)
        if refused is not None:
            return refused
        response, _ = await self._exchange(request, session, msg, {})
        return response

    async def _initialize(self, request: Request, msg: Message) -> Answer:
        if self._open_count() >= self.config.max_sessions:
            return _error(
                503,
                errors.INTERNAL_ERROR,
                "Service Unavailable: too many sessions",
                rpc_id=msg.id,
                headers={"Retry-After": "5"},
            )
        sid = self.mint_sid()
        self._opening += 1
        try:
            if self.state is not None:
                refused = await self._record_new(sid, msg, request.headers.get("Authorization"))
                if refused is not None:
                    return refused
            # Shielded: a client that goes away mid-start must not leave a session nobody can end
            # (registered, it expires when idle).
            session = await asyncio.shield(asyncio.get_running_loop().create_task(self._open(sid)))
        except Exception as exc:
            log.error("session_start_failed", error=str(exc))
            return _error(
                500, errors.INTERNAL_ERROR, f"the upstream session could not start: {exc}", rpc_id=msg.id
            )
        finally:
            self._opening -= 1
        response, answered = await self._exchange(request, session, msg, {SESSION_HEADER: sid})
        if not answered:
            # No session without a successful initialize: the upstream is stopped at once.
            self._end_later(session)
        return response

    async def _record_new(self, sid: str, msg: Message, authorization: str | None) -> Response | None:
        """Put a new session in the shared store before its id is given out, so that any replica
        can continue it; a store that cannot take it refuses the session (503), never runs it
        unrecorded."""
        from visor.serve.state import client_digest

        state = self.state
        assert state is not None
        try:
            await asyncio.to_thread(
                state.ledger.create,
                sid,
                initialize=msg.raw,
                client=client_digest(authorization),
                owner=state.owner,
            )
        except Exception as exc:
            log.error("state_session_create_failed", mcp_session=sid, error=f"{type(exc).__name__}: {exc}")
            return _error(
                503,
                errors.INTERNAL_ERROR,
                "Service Unavailable: the shared session state cannot be written; retry later",
                rpc_id=msg.id,
                headers={"Retry-After": "5"},
            )
        return None

    async def _open(self, sid: str) -> McpSession:
        session = await self._new_session(sid, None)
        self.sessions[sid] = session
        log.info("session_opened", mcp_session=sid, sessions=len(self.sessions))
        return session

    async def _request(
        self, request: Request, session: McpSession, msg: Message, renamed: Renamed | None = None
    ) -> Answer:
        refused = self._refuse_request(session, msg, renamed)
        if refused is not None:
            return refused
        response, _ = await self._exchange(request, session, msg, {}, renamed)
        return response

    def _refuse_request(self, session: McpSession, msg: Message, renamed: Renamed | None) -> Response | None:
        """The per-session limits on a request: in flight (429) and its id's uniqueness (400)."""
        if session.in_flight >= self.config.max_in_flight:
            return _error(
                429,
                errors.INVALID_REQUEST,
                f"Too Many Requests: at most {self.config.max_in_flight} in flight per session",
                rpc_id=msg.id,
            )
        if renamed is None and id_key(msg.id) in session.exchanges:
            return _error(
                400,
                errors.INVALID_REQUEST,
                "Bad Request: a request with this id is already in flight",
                rpc_id=msg.id,
            )
        return None

    async def _exchange(
        self,
        request: Request,
        session: McpSession,
        msg: Message,
        headers: dict[str, str],
        renamed: Renamed | None = None,
    ) -> tuple[Answer, bool]:
        """Send one request and answer the POST with what comes back for it: the answer alone as
        JSON, or everything before it and the answer as an SSE stream. True when a result came.
        A `renamed` request (sessionless) travels under the gateway's id and progress token, and
        what comes back for it is given the client's again."""
        rpc_id: Any
        token: Any
        if renamed is not None:
            line, rpc_id, token = renamed.line, renamed.internal_id, renamed.internal_token
            restore = renamed.restore
        else:
            meta = _meta(msg)
            line, rpc_id = msg.raw, msg.id
            token = meta.get("progressToken") if meta is not None else None
            restore = _as_is
        ex = session.open_exchange(id_key(rpc_id), token)
        streamed = False
        try:
            # Sent and awaited here, not in a coroutine of its own: every await level is one more
            # frame on each of the request's resumptions.
            try:
                await session.send(line)
            except ConnectionError:
                first = ENDED
            else:
                first = await ex.queue.get()
                session.delivered()
            if first is ENDED:
                return _error(
                    502, errors.INTERNAL_ERROR, "the session ended before the answer", rpc_id=msg.id
                ), False
            if first is ex.answer:
                body = restore(first)
                return Response(body=body, content_type="application/json", headers=headers), ex.answer_ok
            # Something came before the answer (progress, a server's request): stream them all.
            # On 2025-11-25 each event has an id, so a client whose stream breaks can resume it.
            resumable = renamed is None
            if resumable:
                session.new_stream(ex)
            response = StreamResponse(headers={**headers, **_SSE_HEADERS})
            await response.prepare(request)
            streamed = True
            answered = await self._stream(response, session, ex, [first], restore, resumable)
            if answered is None:
                if renamed is not None:
                    session.send_nowait(renamed.cancellation("the client closed the request's stream"))
                return response, False
            return response, answered
        except asyncio.CancelledError:
            # The client went away while the request waited (the server cancels the handler). On
            # 2026-07-28 that is how a request is cancelled: the relay is told, as a cancel; on
            # 2025-11-25 a stream that already gave event ids waits to be resumed.
            if renamed is not None:
                session.send_nowait(renamed.cancellation("the client closed the request's stream"))
            elif streamed:
                session.detach(ex)
            raise
        finally:
            if ex.detached is None:
                session.close_exchange(ex)

    async def _stream(
        self,
        response: StreamResponse,
        session: McpSession,
        ex: Exchange,
        pending: list[bytes],
        restore: Callable[[bytes], bytes],
        resumable: bool,
    ) -> bool | None:
        """Write a request's events until its answer: True when it was a result, False when
        the session ended first, None when the client went away (the stream is then detached
        for resuming, if `resumable`)."""
        # `pending` and the queue hold the lines as the session routed them: the answer is the one
        # the routing marked (`ex.answer`), so no line is parsed again here.
        try:
            queued = iter(pending)
            while True:
                raw = next(queued, None)
                if raw is None:
                    raw = await ex.queue.get()
                    session.delivered()
                    if raw is ENDED:
                        await response.write_eof()
                        return False
                out = restore(raw)
                await response.write(
                    ex.event(out) if resumable else b"event: message\ndata: " + out + b"\n\n"
                )
                if raw is ex.answer:
                    await response.write_eof()
                    return ex.answer_ok
        except ConnectionResetError:
            log.info("stream_closed_by_client", mcp_session=session.sid)
            if resumable:
                session.detach(ex)
            return None

    # ------------------------------------------------------------ 2026-07-28: no session
    async def _sessionless(self, request: Request, msg: Message) -> Answer:
        """A request of the 2026-07-28 revision: checked header against body, then judged and
        relayed in its client credential's conversation (visor/serve/sessionless.py)."""
        if msg.kind is not Kind.REQUEST:
            # This revision has no client notifications or responses over HTTP.
            return _error(
                400, errors.INVALID_REQUEST, "Bad Request: only requests are sent without a session"
            )
        refusal = check_request(request.headers, msg.obj)
        if refusal is not None:
            return _error(400, refusal.code, f"Bad Request: {refusal.message}", rpc_id=msg.id)
        found = await self._conversation(conversation_key(request.headers.get("Authorization")), request)
        if isinstance(found, Response):
            return found
        found.last_active = time.monotonic()
        renamer = self._renamers.setdefault(found.sid, Renamer())
        return await self._request(request, found, msg, renamer.rename(msg.obj))

    async def _conversation(self, key: str, request: Request) -> McpSession | Response:
        session = self.conversations.get(key)
        if session is not None and not session.ended:
            return session
        authorization = request.headers.get("Authorization")
        return await self._once(
            self._opening_conversation, key, lambda: self._open_conversation(key, authorization)
        )

    async def _open_conversation(self, key: str, authorization: str | None) -> McpSession | Response:
        adoption = None
        self._opening += 1
        try:
            if self.state is not None:
                found = await self._conversation_in_store(key, authorization)
                if isinstance(found, Response):
                    return found
                adoption = found
            try:
                session = await self._new_session(key, adoption)
            except Exception as exc:
                log.error("conversation_start_failed", mcp_session=key, error=str(exc))
                return _error(500, errors.INTERNAL_ERROR, f"the upstream session could not start: {exc}")
        finally:
            self._opening -= 1
        # A conversation outlives any one replica's upstream: it is never ended in the store.
        session.keep_in_store = True
        self.conversations[key] = session
        log.info("conversation_opened", mcp_session=key, continued=adoption is not None)
        return session

    async def _conversation_in_store(self, key: str, authorization: str | None) -> Adoption | Response | None:
        """The conversation's record in the shared store: continued when it exists, made when not."""
        from visor.serve.state import CONVERSATION_MARK, Adoption, client_digest
        from visor.state.ledger import StateConflict, StateUnavailable

        state = self.state
        assert state is not None
        client = client_digest(authorization)
        try:
            for _ in range(2):
                record = await asyncio.to_thread(state.ledger.load, key)
                if record is not None:
                    if record.client != client:
                        raise StateUnavailable("the conversation's record names another credential")
                    previous = await asyncio.to_thread(state.ledger.claim, key, state.owner)
                    return Adoption(record, previous)
                try:
                    await asyncio.to_thread(
                        state.ledger.create,
                        key,
                        initialize=CONVERSATION_MARK,
                        client=client,
                        owner=state.owner,
                    )
                    return None
                except StateConflict:
                    continue  # another replica made it meanwhile: continue it
            raise StateUnavailable("the conversation's record could not be made or read")
        except StateUnavailable as exc:
            log.error("conversation_state_failed", mcp_session=key, error=str(exc))
            return _error(
                503,
                errors.INTERNAL_ERROR,
                "Service Unavailable: the shared session state cannot be read; retry later",
                headers={"Retry-After": "5"},
            )

    async def _get(self, request: Request) -> Answer:
        if "text/event-stream" not in _media_types(request.headers.get("Accept", "")):
            return _error(406, errors.INVALID_REQUEST, "Not Acceptable: Accept must list text/event-stream")
        found = await self._session_for(request)
        if isinstance(found, Response):
            return found
        session = found
        last_event_id = request.headers.get("Last-Event-ID")
        if last_event_id is not None:
            resumed = session.resume(last_event_id)
            if resumed is not None:
                return await self._resume(request, session, *resumed)
        ex = session.open_get_stream()
        if ex is None:
            return _error(409, errors.INVALID_REQUEST, "Conflict: this session's GET stream is already open")
        try:
            response = StreamResponse(
                headers={
                    "Content-Type": "text/event-stream",
                    "Cache-Control": "no-cache",
                    "X-Accel-Buffering": "no",
                }
            )
            await response.prepare(request)
            try:
                while True:
                    line = await ex.queue.get()
                    session.delivered()
                    if line is ENDED:
                        break
                    await response.write(b"event: message\ndata: " + line + b"\n\n")
                await response.write_eof()
            except ConnectionResetError:
                log.info("get_stream_closed_by_client", mcp_session=session.sid)
            return response
        finally:
            session.close_get_stream(ex)

    async def _resume(
        self, request: Request, session: McpSession, ex: Exchange, replay: list[bytes]
    ) -> Answer:
        """A request's stream resumed (GET with the Last-Event-ID of one of its events): the events
        the client missed, then the rest of them up to the answer, on this stream."""
        log.info("stream_resumed", mcp_session=session.sid, stream=ex.stream, replayed=len(replay))
        response = StreamResponse(headers=_SSE_HEADERS)
        try:
            await response.prepare(request)
            for event in replay:
                await response.write(event)
            if ex.sent and ex.sent[-1][1] is ex.answer:  # the answer went out before the break
                await response.write_eof()
                return response
            await self._stream(response, session, ex, [], _as_is, True)
            return response
        except asyncio.CancelledError:
            session.detach(ex)
            raise
        except ConnectionResetError:
            session.detach(ex)
            return response
        finally:
            if ex.detached is None:
                session.close_exchange(ex)

    async def _delete(self, request: Request) -> Answer:
        found = await self._session_for(request)
        if isinstance(found, Response):
            return found
        await found.end(self.config.end_grace)
        return Response(status=200)

    def _record_reject(self, session: McpSession, body: bytes, msg: Rejected) -> None:
        """A refused body is one audit record with its size and digest, as on stdio."""
        from visor.core.checks import PolicyChecks

        # The names the agent chose are redacted as stdio's reject records redact them (a secret
        # spelled as a tool or method name); without the policy's patterns to do it, left out.
        checks = session.relay.checks
        guard = checks.guard if isinstance(checks, PolicyChecks) else None
        tool = guard.evidence(msg.tool) if guard is not None and msg.tool else None
        method = guard.evidence(msg.method) if guard is not None and msg.method else None
        event = audit_events.reject(
            server=self.config.server_name,
            direction="client",
            reason=msg.reason,
            size=len(body),
            digest=hashlib.sha256(body).hexdigest(),
            code=msg.code,
            method=method,
            tool=tool,
        )
        audit = session.relay.audit
        if audit is not None:
            try:
                audit.append(event)
            except Exception as exc:
                log.error("audit_append_failed", error=str(exc), audit_event="reject")


def _meta(msg: Message) -> dict[str, Any] | None:
    params = msg.obj.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta if isinstance(meta, dict) else None


def _claims_modern(msg: Message) -> bool:
    """A body in the 2026-07-28 form (its revision in `_meta`), whatever its headers say: judged
    on that path, where headers that disagree with it are refused as such."""
    version = (_meta(msg) or {}).get(VERSION_KEY)
    return type(version) is str and version in errors.MODERN_PROTOCOL_VERSIONS


def _names_revision(msg: Message) -> bool:
    """A message that names a revision of its own in `_meta` (any value: an HTTP upstream sends
    any such message as a request of that revision, without the session's id)."""
    return VERSION_KEY in (_meta(msg) or {})


_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _as_is(line: bytes) -> bytes:
    return line
