"""One MCP session as a synchronous state machine: events in, actions out.

`SessionCore.handle(event)` takes what happened on the wire or in the
outside world (bytes from the client or the server, an audit commit done, a
human's answer, a cancel, EOF, a timer) and returns what to do about it
(`visor.core.events`): write bytes to either side, append records, hold a
call until its record is durable, ask a human, withdraw a question, start a
timer, close. It owns the one table of requests in flight from the client,
the server's requests in flight to the client, and Visor's own requests.

Routing rules kept here (tests/core pins each):

* Order to the server: a call held for its audit commit, or for Visor's own
  tools/list, holds back every message the client sent after it; a call
  waiting for a human holds back nothing. Visor's own requests to the server
  go ahead of anything held (the held call may be waiting for them).
  Nothing is ever held in the other direction.
* Correlation: a response must answer a request the other side sent and
  Visor relayed, or one of Visor's own (consumed, never relayed).
* A cancel of a call the server has not seen is absorbed: the call is
  withdrawn (never relayed, never answered); if it was allowed, a `result`
  record says it never ran.

No I/O, no clock but `time.monotonic` in the checks, no event loop.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from visor.approval.model import VISOR_ID_PREFIX, is_visor_rpc_id, new_rpc_id
from visor.core.calls import CallContext, Slot, Stage, ToolCallState
from visor.core.digests import LineDigests
from visor.core.events import (
    Action,
    AppendRecord,
    ApprovalAnswered,
    AskHuman,
    CancelTimer,
    ClientData,
    ClientEof,
    ClientGone,
    CloseServerInput,
    Closing,
    CommitDone,
    CommitFailed,
    CommitRecord,
    DeliverReply,
    Event,
    PolicyReloaded,
    PolicyReloadFailed,
    SendToClient,
    SendToServer,
    ServerData,
    ServerEof,
    ServerInputLost,
    StartTimer,
    StopServer,
    Timer,
    TimerFired,
    VisorForget,
    VisorNotify,
    VisorRequest,
    WithdrawApproval,
)
from visor.core.passthrough import (
    LISTING_TIMEOUT_SECONDS,
    Answer,
    AwaitCommit,
    AwaitHuman,
    Checks,
    Forward,
    Refuse,
    Rewrite,
    Verdict,
)
from visor.logs import get_logger
from visor.wire import errors
from visor.wire.folding import go_fold
from visor.wire.framer import Framer, Oversize, Truncated
from visor.wire.message import Kind, Message, Rejected, classify, is_valid_id

# The relay's log lines keep the name they always had.
log = get_logger("visor.relay")

_MISSING = object()
_MODERN_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
_MODERN_CAPS_KEY = "io.modelcontextprotocol/clientCapabilities"
_SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
# The members of a call's _meta that say which protocol revision it speaks:
# Visor's own tools/list carries them too.
_PROTOCOL_META_PREFIX = "io.modelcontextprotocol/"
# Methods beyond tools/call that the policy judges (visor/core/guard.py); every other request but
# initialize still gets the check for Visor's own files (PolicyChecks.on_client_request).
GATED_CLIENT_METHODS = frozenset(("resources/read", "resources/subscribe", "prompts/get"))
_GATED_SERVER_METHODS = frozenset(("sampling/createMessage", "elicitation/create"))
# The client's methods Visor judges or pins by. A server that finds methods case-insensitively
# or trimmed (strings.EqualFold) runs `Tools/Call` as a tools/call that no check saw, no budget
# counted and no record shows: a spelling that folds onto one of these without being it is
# refused (folded keys: the methods as such a server reads them).
_JUDGED_METHODS = {go_fold(m): m for m in ("tools/call", "tools/list", "initialize", *GATED_CLIENT_METHODS)}
# Pages of Visor's own listing it follows; a server that never stops paging gets
# the pins of these pages and no more.
MAX_LISTING_PAGES = 1000

_LOG_CHARS = 200


def short(value: object) -> str:
    """A client- or server-controlled value for a log line: its repr, at most _LOG_CHARS characters."""
    text = value if type(value) is str else repr(value)
    return text if len(text) <= _LOG_CHARS else f"{text[:_LOG_CHARS]}... ({len(text)} characters)"


@dataclass(frozen=True, slots=True)
class CoreConfig:
    max_message_bytes: int = 16 * 1024 * 1024
    max_pending: int = 10_000
    # How long a call made before any listing waits for Visor's own tools/list.
    listing_timeout: float = LISTING_TIMEOUT_SECONDS


@dataclass(slots=True, eq=False)
class Pending:
    """A request from the client that the server has not answered yet (or that Visor holds)."""

    method: str
    # A tools/list request is kept: its cursor tells which listing a page belongs to.
    msg: Message | None
    call: ToolCallState | None  # a tools/call
    forwarded: bool


@dataclass(slots=True, eq=False)
class Listing:
    """Visor's own tools/list, fetched for calls made before any listing."""

    meta: dict[str, Any]
    timer: Timer
    waiting: list[ToolCallState]
    rpc_id: str | None = None
    cursor: str | None = None
    pages: int = 0


class SessionCore:
    """One session's routing: feed it events, perform the actions it returns, in order."""

    def __init__(
        self,
        checks: Checks,
        config: CoreConfig | None = None,
        *,
        new_id: Callable[[], str] | None = None,
    ) -> None:
        self.checks = checks
        self.config = config or CoreConfig()
        self._new_id = new_id or new_rpc_id
        self._out: list[Action] = []
        checks.attach(self._out.append)
        self._client_framer = Framer(self.config.max_message_bytes)
        self._client_digests = LineDigests(self.config.max_message_bytes)
        self._server_framer = Framer(self.config.max_message_bytes)
        # What the session learns from the traffic itself.
        self.protocol_version: str | None = None
        self.client_capabilities: dict[str, Any] | None = None
        self.client_info: dict[str, Any] | None = None
        # The one table of the client's requests in flight, by id.
        self.pending: dict[Any, Pending] = {}
        # The server's requests in flight to the client: id -> method.
        self.server_pending: dict[Any, str] = {}
        # Visor's own requests: to the client (elicitation), to the server (the listing).
        self._visor_to_client: set[str] = set()
        self._visor_to_server: dict[str, Listing] = {}
        self._listing: Listing | None = None
        # The line to the server: places held for calls, in the order the client sent them.
        self._line: deque[Slot] = deque()
        self.client_closed = False
        self.server_closed = False
        self._server_input_closed = False
        self._stopping = False
        self._close_input_when_idle = False
        self.closed = False

    # ------------------------------------------------------------ interface
    def start(self) -> list[Action]:
        """The records a session begins with."""
        self.checks.start()
        return self._take()

    def handle(self, event: Event) -> list[Action]:
        match event:
            case ClientData(data=data):
                self._client_data(data)
            case ServerData(data=data):
                self._server_data(data)
            case CommitDone(call=call, seq=seq):
                self._committed(call, seq)
            case CommitFailed(call=call, error=error):
                self._commit_failed(call, error)
            case ApprovalAnswered():
                self._answered(event)
            case TimerFired(timer=timer):
                self._timer(timer)
            case ClientEof():
                self._client_eof()
            case ClientGone():
                self._client_gone()
            case ServerEof():
                self._server_eof()
            case ServerInputLost():
                self._server_input_closed = True
            case VisorRequest():
                self._visor_request(event)
            case VisorNotify(method=method, params=params):
                if not self.client_closed:
                    self._to_client(orjson.dumps({"jsonrpc": "2.0", "method": method, "params": params}))
            case VisorForget(rpc_id=rpc_id):
                self._visor_to_client.discard(rpc_id)
            case PolicyReloaded(policy=policy, path=path):
                # Between two events: no call is inside the checks now. Calls waiting for
                # a human keep the policy they were judged under (Approval.policy).
                self.checks.on_policy_reload(policy, path)
            case PolicyReloadFailed(source=source, error=error, sha256=sha256, path=path):
                self.checks.on_policy_reload_failed(source, error, sha256, path)
            case Closing():
                self._close()
            case _:
                raise TypeError(f"not a session event: {event!r}")
        return self._take()

    @property
    def stopping(self) -> bool:
        """The session is ending: the server's stdin closes once everything accepted is sent."""
        return self._stopping

    @property
    def server_backlog(self) -> int:
        """Messages for the server held behind a call (flow control pauses the client past a bound)."""
        return len(self._line)

    def client_name(self) -> str | None:
        info = self.client_info
        name = info.get("name") if info else None
        return name if type(name) is str else None

    def _take(self) -> list[Action]:
        if self._close_input_when_idle and not self._line:
            self._close_input_when_idle = False
            self._server_input_closed = True
            self._out.append(CloseServerInput())
        out = self._out[:]
        self._out.clear()
        return out

    # ---------------------------------------------------------------- lines
    def _to_client(self, line: bytes) -> None:
        self._out.append(SendToClient(line))

    def _to_server(self, line: bytes) -> None:
        """In line: behind every place still held."""
        if self._line:
            self._line.append(Slot(line, True))
        else:
            self._out.append(SendToServer(line))

    def _hold(self) -> Slot:
        slot = Slot()
        self._line.append(slot)
        return slot

    def _fill(self, slot: Slot, line: bytes | None) -> None:
        slot.line = line
        slot.ready = True
        line_ = self._line
        while line_ and line_[0].ready:
            head = line_.popleft()
            if head.line is not None:
                self._out.append(SendToServer(head.line))

    # ------------------------------------------------------- client -> server
    def _client_data(self, data: bytes) -> None:
        if self.client_closed:
            return
        digests = self._client_digests
        digests.feed(data)
        for event in self._client_framer.feed(data):
            if type(event) is bytes:
                try:
                    self._client_line(event)
                except Exception:
                    # One message must never stop the session.
                    log.exception("client_message_failed", size=len(event))
                    self._reject("client", "Visor failed while checking this message", None, event)
            else:
                assert isinstance(event, Oversize | Truncated)
                self._client_frame_problem(event)
        if digests.found:
            # Never carried over to another chunk's lines (the framer reported fewer).
            digests.found.clear()

    def _client_frame_problem(self, event: Oversize | Truncated) -> None:
        found = self._client_digests.found
        evidence = found.popleft() if found else {"size": event.size, "digest": None}
        if type(event) is Oversize:
            log.warning("client_message_too_large", size=event.size, limit=self.config.max_message_bytes)
            self._reject(
                "client",
                "message larger than the limit",
                None,
                size=evidence["size"],
                digest=evidence["digest"],
            )
            self._to_client(
                errors.error_response(
                    None, errors.INVALID_REQUEST, f"message larger than {self.config.max_message_bytes} bytes"
                )
            )
        else:
            log.warning("client_partial_line_at_eof", size=event.size)
            self._reject(
                "client",
                "stream ended inside a message",
                None,
                size=evidence["size"],
                digest=evidence["digest"],
            )

    def _client_line(self, line: bytes) -> None:
        if not line.strip(b" \t"):
            return
        msg = classify(line)
        if type(msg) is Rejected:
            self._reject_client(msg, line)
            return
        assert isinstance(msg, Message)
        kind = msg.kind
        method = msg.method
        if method is not None and kind is not Kind.RESPONSE:
            judged = _JUDGED_METHODS.get(go_fold(method.strip()))
            if judged is not None and judged != method:
                ids = (msg.id,) if kind is Kind.REQUEST and msg.id is not None else ()
                reason = f"method {short(method)} is a variant of {judged}; a server may read it as {judged}"
                self._reject_client(Rejected(errors.INVALID_REQUEST, reason, ids, method=method), line)
                return
        if kind is Kind.REQUEST:
            self._client_request(msg)
        elif kind is Kind.NOTIFICATION:
            self._client_notification(msg)
        else:
            self._client_response(msg)

    def _reject_client(self, rej: Rejected, line: bytes) -> None:
        log.warning(
            "client_message_rejected",
            reason=short(rej.reason),
            code=rej.code,
            method=None if rej.method is None else short(rej.method),
        )
        self._reject("client", rej.reason, rej, line)
        for msg_id in rej.reply_ids:
            self._to_client(errors.error_response(msg_id, rej.code, rej.reason))
        if rej.reply_null:
            self._to_client(errors.error_response(None, rej.code, rej.reason))

    def _client_request(self, msg: Message) -> None:
        pending = self.pending
        request_id = msg.id
        assert request_id is not None  # a request has one (classify)
        if request_id in pending:
            self._reject_client(
                Rejected(
                    errors.INVALID_REQUEST,
                    "id is already in use by a request in flight",
                    (request_id,),
                    method=msg.method,
                ),
                msg.raw,
            )
            return
        if len(pending) >= self.config.max_pending:
            self._reject("client", "too many requests in flight", None, msg.raw)
            self._to_client(
                errors.error_response(msg.id, errors.INTERNAL_ERROR, "too many requests in flight")
            )
            return
        method = msg.method
        assert method is not None
        if method == "tools/call":
            self._tool_call(msg)
            return
        if method == "initialize":
            self._note_initialize(msg)
        line = msg.raw
        if method != "initialize":
            try:
                verdict = self.checks.on_client_request(msg)
            except Exception:
                log.exception("gate_failed", method=short(method))
                self._reject("client", "Visor could not check this request", None, msg.raw)
                verdict = Refuse(
                    errors.error_response(msg.id, errors.INTERNAL_ERROR, "Visor could not check this request")
                )
            if type(verdict) is Refuse:
                self._to_client(verdict.line)  # denied: the server never sees it
                return
            if type(verdict) is Rewrite:
                line = verdict.line
        kept = msg if method == "tools/list" else None
        pending[msg.id] = Pending(method, kept, None, True)
        self._to_server(line)

    def _note_initialize(self, msg: Message) -> None:
        params = msg.obj.get("params") or {}
        caps = params.get("capabilities")
        if type(caps) is dict:
            self.client_capabilities = caps
        if type(params.get("clientInfo")) is dict:
            self.client_info = params["clientInfo"]

    def _call_context(self, msg: Message) -> CallContext:
        params = msg.obj.get("params") or {}
        meta = params.get("_meta") if type(params) is dict else None
        version: Any = self.protocol_version
        caps = self.client_capabilities
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

    # --------------------------------------------------------------- calls
    def _tool_call(self, msg: Message) -> None:
        call = ToolCallState(msg, self._call_context(msg))
        self.pending[msg.id] = Pending("tools/call", None, call, False)
        listing = self._listing
        if (listing is not None and listing.waiting) or self.checks.needs_listing():
            # Held in line like a call waiting for its commit; calls that come
            # meanwhile wait for the same listing and are judged in order.
            call.stage = Stage.LISTING
            call.slot = self._hold()
            self._wait_for_listing(call)
            return
        try:
            verdict: Verdict = self.checks.on_tool_call(msg, call.ctx)
        except Exception as exc:  # a bug in the checks must never turn into an allow
            log.exception("gate_failed", tool=short(msg.tool))
            self._reject(
                "client", f"Visor failed while checking this call ({type(exc).__name__})", None, msg.raw
            )
            verdict = Answer(
                errors.tool_error_result(
                    msg.id,
                    f"Visor denied this call: internal error ({type(exc).__name__})",
                    modern=call.ctx.modern,
                )
            )
        self._apply(call, verdict)

    def _apply(self, call: ToolCallState, verdict: Verdict) -> None:
        """Act on a verdict about a call that is still the client's (not withdrawn)."""
        match verdict:
            case AwaitCommit(record=record, line=line, after=after, started=started):
                if call.slot is None and call.stage is Stage.DECIDING:
                    # Judged as it arrived: its place in line is taken now, and the
                    # client's later messages wait behind it. A call a human approved
                    # takes its place when its record is durable, behind what came meanwhile.
                    call.slot = self._hold()
                call.stage = Stage.COMMIT
                call.line = line
                call.started = started
                self._out.append(CommitRecord(record, call))
                self._out.extend(AppendRecord(r) for r in after)
            case AwaitHuman(approval=approval, request=request, out_of_band_only=out_of_band_only):
                call.stage = Stage.HUMAN
                call.approval = approval
                self._release(call)  # a human's answer holds nothing back
                self._out.append(AskHuman(call, request, call.ctx, out_of_band_only))
            case Forward(line=line):
                self._relay(call, line)
            case Answer(line=line):
                call.stage = Stage.DONE
                self._forget(call)
                self._release(call)
                self._to_client(line)

    def _relay(self, call: ToolCallState, line: bytes) -> None:
        call.stage = Stage.RELAYED
        entry = self.pending.get(call.msg.id)
        if entry is not None and entry.call is call:
            entry.forwarded = True
        slot, call.slot = call.slot, None
        if slot is not None:
            self._fill(slot, line)
        else:
            self._to_server(line)

    def _release(self, call: ToolCallState) -> None:
        slot, call.slot = call.slot, None
        if slot is not None:
            self._fill(slot, None)

    def _forget(self, call: ToolCallState) -> None:
        entry = self.pending.get(call.msg.id)
        if entry is not None and entry.call is call:
            del self.pending[call.msg.id]

    def _committed(self, call: ToolCallState, seq: int) -> None:
        if call.stage is not Stage.COMMIT:
            return
        call.allow_seq = seq
        if call.withdrawn:
            # Cancelled by the client while its record was committed: it never runs.
            call.stage = Stage.DONE
            log.info("withdrawn_before_relay", request_id=short(call.msg.id), tool=short(call.msg.tool))
            try:
                self.checks.on_withdrawn(call)
            except Exception:
                log.exception("gate_failed", tool=short(call.msg.tool))
            self._release(call)
            return
        assert call.line is not None
        self._relay(call, call.line)

    def _commit_failed(self, call: ToolCallState, error: str) -> None:
        if call.stage is not Stage.COMMIT:
            return
        if call.withdrawn:
            call.stage = Stage.DONE
            self._release(call)
            return
        self._apply(call, self.checks.on_commit_failed(call, error))

    def _answered(self, event: ApprovalAnswered) -> None:
        call = event.call
        if call.stage is not Stage.HUMAN or call.withdrawn:
            return  # withdrawn meanwhile: its denial is on record already
        approval = call.approval
        assert approval is not None
        verdict: Verdict | None = None
        if event.outcome is not None:  # None: the driver logged why the step failed
            try:
                verdict = self.checks.on_approval(approval, event.outcome, call.ctx)
            except Exception as exc:
                log.error("approval_failed", error=repr(exc), tool=call.msg.tool)
        if verdict is None:
            verdict = self._failed(call, "the approval step failed")
        self._apply(call, verdict)

    def _failed(self, call: ToolCallState, reason: str) -> Answer:
        try:
            return self.checks.on_call_failed(call.msg, call.ctx, reason)
        except Exception:
            log.exception("gate_failed", tool=short(call.msg.tool))
            return Answer(
                errors.tool_error_result(call.msg.id, "Visor denied this call: internal error", modern=False)
            )

    def _withdraw(self, call: ToolCallState, *, closing: bool) -> None:
        """The call is no longer the client's: nothing about it reaches the server or the client."""
        call.withdrawn = True
        stage = call.stage
        if stage is Stage.LISTING:
            listing = self._listing
            if listing is not None and call in listing.waiting:
                listing.waiting.remove(call)
            call.stage = Stage.DONE
            self._cancelled(call, closing)
            self._release(call)
        elif stage is Stage.HUMAN:
            call.stage = Stage.DONE
            self._out.append(WithdrawApproval(call))
            self._cancelled(call, closing)
        # COMMIT: the record is on its way; the call is dropped when it is durable.

    def _cancelled(self, call: ToolCallState, closing: bool) -> None:
        try:
            self.checks.on_cancelled(call, closing=closing)
        except Exception:
            log.exception("cancel_failed", request_id=short(call.msg.id))

    # ----------------------------------------------------- Visor's listing
    def _wait_for_listing(self, call: ToolCallState) -> None:
        listing = self._listing
        if listing is None:
            listing = Listing(self._protocol_meta(call.msg), Timer("tools/list"), [])
            self._listing = listing
            self._out.append(StartTimer(listing.timer, self.config.listing_timeout))
            listing.waiting.append(call)
            self._request_page(listing)
            return
        listing.waiting.append(call)

    @staticmethod
    def _protocol_meta(msg: Message) -> dict[str, Any]:
        params = msg.obj.get("params")
        meta = params.get("_meta") if type(params) is dict else None
        if type(meta) is not dict:
            return {}
        return {k: v for k, v in meta.items() if type(k) is str and k.startswith(_PROTOCOL_META_PREFIX)}

    def _request_page(self, listing: Listing) -> None:
        params: dict[str, Any] = {"_meta": listing.meta} if listing.meta else {}
        if listing.cursor is not None:
            params["cursor"] = listing.cursor
        rpc_id = self._new_id()
        listing.rpc_id = rpc_id
        listing.pages += 1
        if self.server_closed or self._server_input_closed:
            self._listing_reply(
                listing, {"error": {"code": errors.INTERNAL_ERROR, "message": "the server is gone"}}
            )
            return
        self._visor_to_server[rpc_id] = listing
        # Ahead of anything held: the calls held wait for this very request.
        self._out.append(
            SendToServer(
                orjson.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": "tools/list", "params": params})
            )
        )

    def _listing_reply(self, listing: Listing, reply: dict[str, Any]) -> None:
        if listing is not self._listing:
            return
        listing.rpc_id = None
        result = reply.get("result")
        if type(result) is not dict or type(result.get("tools")) is not list:
            error = reply.get("error")
            code = error.get("code") if type(error) is dict else None
            if type(code) is int:
                self._listed(f"the server answered with error {code}")
            else:
                self._listed("the server's answer held no list of tools")
            return
        try:
            self.checks.on_listing_page(result, listing.cursor)
        except Exception as exc:
            log.error("listing_failed", error=repr(exc))
            self._listed("Visor failed while reading it")
            return
        nxt = result.get("nextCursor")
        if type(nxt) is not str or not nxt:
            self._listed(None)
            return
        if listing.pages >= MAX_LISTING_PAGES:
            log.warning("listing_pages_capped", pages=MAX_LISTING_PAGES)
            self._listed(None)
            return
        listing.cursor = nxt
        self._request_page(listing)

    def _listed(self, failure: str | None) -> None:
        """Visor's listing is over (None: pinned, else why it failed): judge the calls that waited."""
        listing = self._listing
        assert listing is not None
        self._listing = None
        self._out.append(CancelTimer(listing.timer))
        if listing.rpc_id is not None:
            self._visor_to_server.pop(listing.rpc_id, None)
        for call in listing.waiting:
            why = failure
            if why is None and self.checks.needs_listing():
                why = "the server's answer held no list of tools"
            msg = call.msg
            try:
                if why is not None:
                    verdict: Verdict = self.checks.on_listing_failed(msg, call.ctx, why)
                else:
                    verdict = self.checks.on_tool_call(msg, call.ctx)
            except Exception as exc:  # a bug must never turn into an allow
                log.exception("gate_failed", tool=short(msg.tool))
                verdict = self._failed(call, f"Visor failed ({type(exc).__name__})")
            self._apply(call, verdict)

    def _timer(self, timer: Timer) -> None:
        listing = self._listing
        if listing is None or listing.timer is not timer:
            return
        if listing.rpc_id is not None:
            # A late answer is dropped and logged like any unmatched one.
            self._visor_to_server.pop(listing.rpc_id, None)
            listing.rpc_id = None
        self._listed(f"no answer within {self.config.listing_timeout:g} seconds")

    # ------------------------------------------------------- notifications
    def _client_notification(self, msg: Message) -> None:
        if msg.method == "notifications/cancelled":
            params = msg.obj.get("params") or {}
            target = params.get("requestId", _MISSING)
            # Only a valid id can name a request: anything else (an array, true
            # for 1, 1.0) names nothing, and is never hashed against the table.
            entry = self.pending.get(target) if is_valid_id(target) else None
            if entry is None or not entry.forwarded:
                # The server never saw that request: there is nothing for it to
                # cancel. A call waiting in Visor (for a human, for its audit
                # commit, for the listing) is withdrawn: never relayed, never answered.
                if entry is not None:
                    del self.pending[target]
                    if entry.call is not None:
                        self._withdraw(entry.call, closing=False)
                log.info("cancel_absorbed", request_id=short(target))
                return
        self._to_server(msg.raw)

    def _client_response(self, msg: Message) -> None:
        if is_visor_rpc_id(msg.id):
            # An answer to Visor's own request (an approval): consumed here.
            if msg.id not in self._visor_to_client:
                log.warning("client_response_unmatched", id=short(msg.id))
                self._reject("client", "response to no request Visor sent", None, msg.raw)
            else:
                self._visor_to_client.discard(msg.id)
                self._out.append(DeliverReply(msg.id, msg.obj))
            return
        method = self.server_pending.pop(msg.id, None)
        if method is None:
            log.warning("client_response_unmatched", id=short(msg.id))
            self._reject("client", "response to no request the server sent", None, msg.raw)
            return
        if method == "roots/list":
            try:
                self.checks.on_roots(msg)
            except Exception:
                # Roots Visor could not take in are roots the server must not take either.
                log.exception("roots_check_failed")
                self._reject("client", "Visor could not read these roots", None, msg.raw)
                self._to_server(
                    errors.error_response(msg.id, errors.INTERNAL_ERROR, "Visor could not read these roots")
                )
                return
        self._to_server(msg.raw)

    def _visor_request(self, event: VisorRequest) -> None:
        if self.client_closed:
            self._out.append(
                DeliverReply(
                    event.rpc_id, {"error": {"code": errors.INTERNAL_ERROR, "message": "the client is gone"}}
                )
            )
            return
        self._visor_to_client.add(event.rpc_id)
        self._to_client(
            orjson.dumps(
                {"jsonrpc": "2.0", "id": event.rpc_id, "method": event.method, "params": event.params}
            )
        )

    # ------------------------------------------------------------ shutdown
    def _client_eof(self) -> None:
        if self.client_closed:
            return
        self._client_digests.eof()
        for event in self._client_framer.eof():
            assert isinstance(event, Oversize | Truncated)
            self._client_frame_problem(event)
        self.client_closed = True
        log.info("client_closed")
        self._begin_shutdown()

    def _client_gone(self) -> None:
        self.client_closed = True
        self._begin_shutdown()

    def _begin_shutdown(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        # Everything already accepted reaches the server before its stdin closes.
        self._close_input_when_idle = True
        self._out.append(StopServer())

    def _server_eof(self) -> None:
        if self.server_closed:
            return
        self.server_closed = True
        for event in self._server_framer.eof():
            assert isinstance(event, Oversize | Truncated)
            log.warning("server_message_dropped", reason=type(event).__name__, size=event.size)
            self._reject("server", "stream ended inside a message", None, size=event.size)
        log.info("server_stdout_closed")
        # Nothing will answer Visor's own requests now: whatever waits on them is denied.
        waiting, self._visor_to_server = self._visor_to_server, {}
        for listing in waiting.values():
            self._listing_reply(
                listing, {"error": {"code": errors.INTERNAL_ERROR, "message": "the server closed"}}
            )
        if not self._stopping:
            self._stopping = True
            self._close_input_when_idle = True

    def _close(self) -> None:
        """Calls still held are withdrawn and recorded; then the session's last record."""
        if self.closed:
            return
        self.closed = True
        listing = self._listing
        if listing is not None:
            if listing.rpc_id is not None:
                self._visor_to_server.pop(listing.rpc_id, None)
                listing.rpc_id = None
            self._listed("the session ended")
        for entry in list(self.pending.values()):
            call = entry.call
            if call is not None and call.stage is Stage.HUMAN:
                self._withdraw(call, closing=True)
        try:
            self.checks.on_close()
        except Exception:
            log.exception("gate_failed")

    # ------------------------------------------------------ server -> client
    def _server_data(self, data: bytes) -> None:
        for event in self._server_framer.feed(data):
            if type(event) is bytes:
                try:
                    self._server_line(event)
                except Exception:
                    log.exception("server_message_failed", size=len(event))
                    self._reject("server", "Visor failed while checking this message", None, event)
            else:
                assert isinstance(event, Oversize | Truncated)
                log.warning("server_message_dropped", reason=type(event).__name__, size=event.size)
                # The server's stream is not hashed as it streams (its large answers are
                # the hot path): a dropped server line is recorded by its size alone.
                self._reject("server", "message larger than the limit", None, size=event.size)

    def _server_line(self, line: bytes) -> None:
        if not line.strip(b" \t"):
            return
        # Case-insensitive key matching is a server-side parser's habit;
        # what the server sends is held to exact duplicates only.
        msg = classify(line, fold_case=False)
        if type(msg) is Rejected:
            log.warning("server_message_rejected", reason=short(msg.reason), code=msg.code)
            self._reject("server", msg.reason, msg, line)
            return
        assert isinstance(msg, Message)
        kind = msg.kind
        if kind is Kind.RESPONSE:
            self._server_response(msg)
        elif kind is Kind.REQUEST:
            self._server_request(msg)
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
                    log.warning("server_cancel_bad_id", id=short(target))
                    self._reject("server", "notifications/cancelled without a valid requestId", None, msg.raw)
                    return
                self.server_pending.pop(target, None)
            try:
                line = self.checks.on_notification(msg) or msg.raw
            except Exception:
                # Unobserved output must not reach the client unredacted.
                log.exception("server_notification_check_failed", method=msg.method)
                self._reject("server", "Visor could not check this notification", None, msg.raw)
                return
            self._to_client(line)

    def _server_request(self, msg: Message) -> None:
        if is_visor_rpc_id(msg.id):
            # Visor's own requests to the client use this prefix; a server
            # request with it could collide with an approval, so it is refused.
            log.warning("server_request_reserved_id", id=short(msg.id))
            self._reject("server", f"request id uses the reserved prefix {VISOR_ID_PREFIX!r}", None, msg.raw)
            self._to_server(
                errors.error_response(
                    msg.id,
                    errors.INVALID_REQUEST,
                    f"request ids starting with {VISOR_ID_PREFIX!r} are reserved",
                )
            )
            return
        pending = self.server_pending
        if msg.id in pending:
            log.warning("server_request_duplicate_id", id=short(msg.id))
            return
        if len(pending) >= self.config.max_pending:
            # A client that never answers must not let the table grow without bound.
            self._to_server(
                errors.error_response(
                    msg.id, errors.INTERNAL_ERROR, "too many requests waiting for the client"
                )
            )
            return
        method = msg.method
        assert method is not None
        line = msg.raw
        if method in _GATED_SERVER_METHODS:
            could_not = errors.error_response(
                msg.id, errors.INTERNAL_ERROR, "Visor could not check this request"
            )
            try:
                refusal = self.checks.on_server_request(msg)
            except Exception:
                log.exception("gate_failed", method=method)
                refusal = could_not
            if refusal is not None:
                self._to_server(refusal)  # the client never sees a refused request
                return
            try:
                line = self.checks.rewrite_server_request(msg) or msg.raw
            except Exception:
                log.exception("gate_failed", method=method)
                self._to_server(could_not)
                return
        pending[msg.id] = method
        self._to_client(line)

    def _server_response(self, msg: Message) -> None:
        if type(msg.id) is str and is_visor_rpc_id(msg.id):
            listing = self._visor_to_server.pop(msg.id, None)
            if listing is not None:
                # The answer to Visor's own request: consumed here, never forwarded.
                self._listing_reply(listing, msg.obj)
                return
        entry = self.pending.get(msg.id)
        if entry is None or not entry.forwarded:
            log.warning("server_response_unmatched", id=short(msg.id))
            self._reject("server", "response to no request the client sent", None, msg.raw)
            return
        del self.pending[msg.id]
        try:
            replacement = self._observe_response(entry, msg)
        except Exception:
            # Unobserved output must not reach the client unredacted or
            # unpinned: the client gets an error for its request instead.
            log.exception("server_response_check_failed", method=entry.method, id=short(msg.id))
            replacement = errors.error_response(
                msg.id, errors.INTERNAL_ERROR, "Visor could not check the server's answer"
            )
        self._to_client(msg.raw if replacement is None else replacement)

    def _observe_response(self, entry: Pending, msg: Message) -> bytes | None:
        method = entry.method
        checks = self.checks
        if method == "tools/call":
            call = entry.call
            return checks.on_tool_result(call, call.msg.tool if call is not None else None, msg)
        if method == "tools/list":
            return checks.on_tools_list(msg, entry.msg)
        if method == "initialize":
            result = msg.obj.get("result")
            if type(result) is dict:
                if type(result.get("protocolVersion")) is str:
                    self.protocol_version = result["protocolVersion"]
                if type(result.get("serverInfo")) is dict:
                    checks.on_server_info(result["serverInfo"])
        elif method == "server/discover":
            result = msg.obj.get("result")
            meta = result.get("_meta") if type(result) is dict else None
            if type(meta) is dict and type(meta.get(_SERVER_INFO_KEY)) is dict:
                checks.on_server_info(meta[_SERVER_INFO_KEY])
        # Everything else the server answers (initialize's instructions, resources, prompts,
        # completions, errors) is its text too: indexed as untrusted output and redacted.
        return checks.on_response(method or "", msg)

    # ------------------------------------------------------------- evidence
    def _reject(
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
            self.checks.on_reject(direction, reason, rej, size=size, digest=digest)
        except Exception:
            log.exception("reject_record_failed", direction=direction)
