"""One validated tools/call in, one verdict out.

The relay hands every valid `tools/call` request to `Gate.on_tool_call`,
which answers with `Forward` (relay these bytes to the server), `Answer`
(send these bytes to the client; the server sees nothing) or `Deferred` (a
future that resolves to one of them, or to `Drop`). `PolicyGate` is the only
place that combines a decision, an approval and an audit commit; the relay
also tells it what the server answered, so that the session learns pins and
untrusted output.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from visor.approval.model import arguments_digest, focus_arguments, make_request, remember_scope
from visor.approval.protected import Protected
from visor.audit.writer import AuditUnhealthy
from visor.gating import DENIED_REQUEST, DataGuard
from visor.logs import get_logger
from visor.policy import readings
from visor.policy.evaluate import UNTRUSTED_OUTPUT_ASK, Decision, ToolCall, evaluate
from visor.wire import errors
from visor.wire.message import Message, Rejected

if TYPE_CHECKING:
    from visor.approval.broker import ApprovalBroker, ClientLink
    from visor.approval.model import ApprovalAnswer
    from visor.audit.writer import AuditWriter
    from visor.policy.schema import Policy
    from visor.relay.proxy import _ServerLink as ServerLink
    from visor.session import SessionEvent, SessionState

log = get_logger("visor.gate")

# A tools/call that comes before any listing waits for Visor's own tools/list
# (every page) for at most this long; no answer or an error denies it.
LISTING_TIMEOUT_SECONDS = 15.0
# Pages of that listing Visor follows; a server that never stops paging gets
# the pins of these pages and no more.
_MAX_LISTING_PAGES = 1000
# The members of a call's _meta that say which protocol revision it speaks:
# Visor's own tools/list carries them too.
_PROTOCOL_META_PREFIX = "io.modelcontextprotocol/"

# A call with several questions (two unknown recipients) is asked about each in
# turn; past this many rounds it is denied rather than asked forever.
_MAX_APPROVAL_ROUNDS = 8


@dataclass(frozen=True, slots=True)
class Forward:
    line: bytes


@dataclass(frozen=True, slots=True)
class Answer:
    line: bytes


@dataclass(frozen=True, slots=True)
class Drop:
    """Send nothing anywhere (a cancelled call)."""


@dataclass(frozen=True, slots=True)
class Deferred:
    """The verdict needs an async step; `ordered` keeps it in line with later messages."""

    future: asyncio.Future[Forward | Answer | Drop]
    ordered: bool


Verdict = Forward | Answer | Deferred


@dataclass(slots=True)
class CallContext:
    """What the relay knows about the call's session when it arrives."""

    modern: bool = False
    client_capabilities: dict[str, Any] | None = None
    progress_token: Any = None


class Gate:
    """Forwards every valid call unchanged: the relay's behaviour with no checks at all."""

    def on_tool_call(self, msg: Message, ctx: CallContext) -> Verdict:
        return Forward(msg.raw)

    def on_tool_result(self, request: Message | None, tool: str | None, response: Message) -> bytes | None:
        """Observe a server's answer to a tools/call; return replacement bytes or None."""
        return None

    def on_tools_list(self, response: Message, request: Message | None = None) -> bytes | None:
        return None

    def on_client_request(self, msg: Message) -> bytes | None:
        """A resources/read, resources/subscribe or prompts/get: None forwards it unchanged;
        bytes starting with b"S" are the rewritten request for the server; other bytes answer the client."""
        return None

    def on_response(self, method: str, response: Message) -> bytes | None:
        """A resources/read, prompts/get or tasks/result answer: replacement bytes or None."""
        return None

    def on_server_request(self, msg: Message) -> bytes | None:
        """A request from the server: an error line to send back to it (refused), or None (relay it)."""
        return None

    def rewrite_server_request(self, msg: Message) -> bytes | None:
        """A relayed server request as the client may see it, or None to relay it unchanged."""
        return None

    def on_server_info(self, info: dict[str, Any]) -> None:
        """The server said who it is (initialize or server/discover)."""

    def on_reject(
        self,
        direction: str,
        reason: str,
        rejected: Rejected | None,
        *,
        size: int | None = None,
        digest: str | None = None,
    ) -> None:
        """A wire-level refusal in either direction: `size` and `digest` (SHA-256) of the refused line."""

    def cancel(self, request_id: Any) -> bool:
        """The client cancelled a call that has not been forwarded; True if one was waiting."""
        return False

    def on_withdrawn(self, msg: Message) -> None:
        """An allowed call was cancelled by the client before it was relayed; it never ran."""

    def attach_client(self, link: ClientLink) -> None:
        """The relay's channel for Visor's own requests to the client (elicitation, progress)."""

    def attach_server(self, link: ServerLink) -> None:
        """The relay's channel for Visor's own requests to the server (tools/list before a call)."""

    async def close(self) -> None:
        """The session is over."""


_REASON_CHARS = 200


def _bounded_reason(text: str) -> str:
    """Text for a reject record: at most _REASON_CHARS characters of it (on_reject's helper)."""
    if len(text) <= _REASON_CHARS:
        return text
    return f"{text[:_REASON_CHARS]}... ({len(text)} characters)"


def denial_text(decision: Decision) -> str:
    return f"Visor denied this call: {decision.reason} (rule: {decision.rule})"


class PolicyGate(Gate):
    """Decide with the policy, commit allows to the audit log before they are relayed."""

    def __init__(
        self,
        *,
        policy: Policy,
        session: SessionState,
        audit: AuditWriter,
        server_name: str,
        argv: list[str],
        pin_saver: Any = None,
        approvals: ApprovalBroker | None = None,
        protected: Protected | None = None,
        listing_timeout: float = LISTING_TIMEOUT_SECONDS,
    ) -> None:
        self.policy = policy
        # Visor's own files (approval directory, audit log, pins, policy): no call may name them.
        self.protected = protected or Protected()
        self.session = session
        self.audit = audit
        self.server = server_name
        self._pin_saver = pin_saver
        # Redaction, resource/prompt/server-request gating, output limits.
        self.guard = DataGuard(policy, server_name, self._append)
        self.approvals = approvals
        # request id -> the task waiting for a human on that call
        self._waiting: dict[Any, asyncio.Task[None]] = {}
        # (rule, arguments digest): approval_required answers remembered for the exact call
        self._exact_approvals: set[tuple[str, str]] = set()
        self._closing = False
        # request id -> (seq of the allow record, monotonic start) for `result` events
        self._inflight: dict[Any, tuple[int, float]] = {}
        # Visor's own tools/list, for calls that come before any listing.
        self._server_link: ServerLink | None = None
        self.listing_timeout = listing_timeout
        self._listing: asyncio.Task[str | None] | None = None
        # request id -> (call, its verdict) for calls waiting for that listing, in arrival order
        self._before_listing: dict[Any, tuple[Message, asyncio.Future[Verdict | Drop]]] = {}
        self._append(
            {
                "event": "session_start",
                "server": server_name,
                "argv0": argv[0] if argv else "",
                "policy": policy.sha256,
            }
        )
        self._append({"event": "policy_load", "source": str(policy.source), "policy": policy.sha256})

    # ------------------------------------------------------------- decisions
    def on_tool_call(self, msg: Message, ctx: CallContext) -> Verdict:
        assert msg.tool is not None and msg.arguments is not None
        if self._before_listing or (not self.session.listing_seen and self._server_link is not None):
            # Nothing is pinned yet (a client that cached a listing, or knows the
            # tool): Visor lists the tools itself, then judges the call.
            return self._after_listing(msg, ctx)
        return self._decide(msg, ctx)

    def _decide(self, msg: Message, ctx: CallContext) -> Verdict:
        assert msg.tool is not None and msg.arguments is not None
        call = ToolCall(self.server, msg.tool, msg.arguments)
        try:
            decision = evaluate(self.policy, self.session, call)
        except Exception as exc:  # a bug must never turn into an allow
            log.exception("evaluate_failed", tool=msg.tool)
            decision = Decision(
                "deny", "internal.error", f"the policy evaluator failed ({type(exc).__name__})"
            )
        named = self._names_protected(msg.arguments)
        # The policy saw the original arguments; from here on (audit, server) only redacted ones.
        msg = self.guard.redact_call(msg)
        if named is not None:
            # Above any policy: an answer file written by a tool is the agent approving itself.
            decision = Decision(
                "deny",
                "visor.protected_path",
                "an argument names Visor's own files (approval directory, audit log, pins or policy); "
                "no tool call may read or write them",
            )
        if decision.action == "allow":
            return self._allow(msg, call, decision, ctx)
        if decision.action == "ask":
            return self._ask(msg, call, decision, ctx)
        return self._deny(msg, decision, ctx)

    # ------------------------------------------------- listing before a call
    def _after_listing(self, msg: Message, ctx: CallContext) -> Deferred:
        """Hold the call until Visor's own tools/list is pinned, then decide it.

        Ordered: the client's later messages wait behind it, as behind a call
        waiting for its audit commit. Calls that come meanwhile wait for the
        same listing and are decided in the order they came.
        """
        loop = asyncio.get_running_loop()
        if self._listing is None or (self._listing.done() and not self.session.listing_seen):
            self._listing = loop.create_task(self._fetch_listing(self._protocol_meta(msg)))
        listing = self._listing
        verdict: asyncio.Future[Verdict | Drop] = loop.create_future()
        self._before_listing[msg.id] = (msg, verdict)

        def listed(task: asyncio.Task[str | None]) -> None:
            waiting = self._before_listing.get(msg.id)
            if waiting is None or waiting[1] is not verdict:
                return  # withdrawn by the client meanwhile (see cancel)
            del self._before_listing[msg.id]
            if task.cancelled():
                failure: str | None = "the session ended"
            elif task.exception() is not None:
                log.error("listing_failed", error=repr(task.exception()))
                failure = "Visor failed while reading it"
            else:
                failure = task.result()
            if failure is None and not self.session.listing_seen:
                failure = "the server's answer held no list of tools"
            if failure is not None:
                decision = Decision(
                    "deny",
                    "pin.no_tools_list",
                    f"tool {msg.tool!r} was called before the server's tools were listed, and Visor's "
                    f"own tools/list failed ({failure}), so there is nothing to pin the call against",
                )
                verdict.set_result(self._deny(self.guard.redact_call(msg), decision, ctx))
                return
            try:
                result: Verdict = self._decide(msg, ctx)
            except Exception as exc:  # a bug must never turn into an allow
                log.exception("gate_failed", tool=msg.tool)
                failed = Decision("deny", "internal.error", f"Visor failed ({type(exc).__name__})")
                result = self._deny(self.guard.redact_call(msg), failed, ctx)
            verdict.set_result(result)

        listing.add_done_callback(listed)
        return Deferred(verdict, ordered=True)  # type: ignore[arg-type]

    @staticmethod
    def _protocol_meta(msg: Message) -> dict[str, Any]:
        params = msg.obj.get("params")
        meta = params.get("_meta") if type(params) is dict else None
        if type(meta) is not dict:
            return {}
        return {k: v for k, v in meta.items() if type(k) is str and k.startswith(_PROTOCOL_META_PREFIX)}

    async def _fetch_listing(self, meta: dict[str, Any]) -> str | None:
        """Visor's own tools/list, every page (following nextCursor), pinned as the
        first listing. None when it is pinned, else why it failed."""
        link = self._server_link
        assert link is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.listing_timeout
        cursor: str | None = None
        for _ in range(_MAX_LISTING_PAGES):
            params: dict[str, Any] = {"_meta": meta} if meta else {}
            if cursor is not None:
                params["cursor"] = cursor
            rpc_id, reply_fut = link.request("tools/list", params)
            try:
                async with asyncio.timeout_at(deadline):
                    reply = await reply_fut
            except TimeoutError:
                link.forget(rpc_id)
                return f"no answer within {self.listing_timeout:g} seconds"
            finally:
                if not reply_fut.done():
                    link.forget(rpc_id)
            result = reply.get("result")
            if type(result) is not dict or type(result.get("tools")) is not list:
                error = reply.get("error")
                code = error.get("code") if type(error) is dict else None
                if type(code) is int:
                    return f"the server answered with error {code}"
                return "the server's answer held no list of tools"
            self._observe_listing(result, cursor)
            nxt = result.get("nextCursor")
            if type(nxt) is not str or not nxt:
                return None
            cursor = nxt
        log.warning("listing_pages_capped", pages=_MAX_LISTING_PAGES)
        return None

    def _names_protected(self, value: dict[str, Any]) -> str | None:
        """The string that names Visor's own files under any reading of ``value``
        (JSON inside strings included, as a server that decodes them reads it)."""
        if not self.protected:
            return None
        named = self.protected.named_by(value)
        if named is None:
            try:
                decoded = readings.every_decoding(value)
            except readings.AmbiguousJson:
                return "(arguments nested too deeply to check)"
            if decoded is not None:
                named = self.protected.named_by(decoded)
        return named

    def _deny(self, msg: Message, decision: Decision, ctx: CallContext) -> Answer:
        self._record(msg, "deny", decision)
        return Answer(errors.tool_error_result(msg.id, denial_text(decision), modern=ctx.modern))

    def _allow(
        self,
        msg: Message,
        call: ToolCall,
        decision: Decision,
        ctx: CallContext,
        extra: dict[str, Any] | None = None,
    ) -> Verdict:
        event = self._event(msg, "allow", decision)
        if extra:
            event.update(extra)
        try:
            commit = self.audit.submit(event)
        except AuditUnhealthy as exc:
            return self._audit_failed(msg, ctx, exc)
        # Budgets, history and taints change now, not when the fsync returns:
        # the next pipelined call must already see this one.
        events = self.session.record_allowed(call)
        for ev in events:
            self._session_event(ev)
        verdict: asyncio.Future[Forward | Answer | Drop] = asyncio.get_running_loop().create_future()
        started = time.monotonic()

        def durable(fut: asyncio.Future[dict[str, Any]]) -> None:
            exc = fut.exception()
            if exc is not None:
                verdict.set_result(self._audit_failed(msg, ctx, exc))
                return
            self._inflight[msg.id] = (fut.result()["seq"], started)
            verdict.set_result(Forward(msg.raw))

        commit.add_done_callback(durable)
        return Deferred(verdict, ordered=True)

    def _audit_failed(self, msg: Message, ctx: CallContext, exc: BaseException) -> Answer:
        log.error("audit_unhealthy", error=str(exc), tool=msg.tool)
        text = (
            "Visor denied this call: the audit log cannot be written, so no call can be allowed "
            f"until Visor is restarted with a working log ({exc})"
        )
        return Answer(errors.tool_error_result(msg.id, text, modern=ctx.modern))

    # ------------------------------------------------------------- approvals
    def _ask(self, msg: Message, call: ToolCall, decision: Decision, ctx: CallContext) -> Verdict:
        self._record(msg, "ask", decision)
        scope = remember_scope(decision.rule, decision.argument, decision.destination)
        if (
            scope == "exact"
            and (decision.rule, arguments_digest(call.tool, call.arguments)) in self._exact_approvals
        ):
            # The same tool with the same arguments was approved earlier in
            # this session with "remember": nothing else about it can differ.
            event = self._event(msg, "approve", decision)
            event.update(channel="session", remembered=True)
            self._append(event)
            allow = Decision(
                "allow",
                decision.rule,
                f"approved earlier in this session: {decision.reason}",
                decision.destination,
                decision.argument,
            )
            return self._allow(msg, call, allow, ctx, {"approval": "remembered"})
        broker = self.approvals
        out_of_band_only = self._out_of_band_only(call)
        if broker is None or not broker.channels_for(ctx, out_of_band_only=out_of_band_only):
            failure = "out_of_band" if out_of_band_only else "unavailable"
            return self._deny(msg, self._no_approval(decision, failure), ctx)
        verdict: asyncio.Future[Forward | Answer | Drop] = asyncio.get_running_loop().create_future()
        task = asyncio.get_running_loop().create_task(self._wait(msg, call, decision, ctx, verdict))
        self._waiting[msg.id] = task

        def finished(t: asyncio.Task[None]) -> None:
            if self._waiting.get(msg.id) is t:
                del self._waiting[msg.id]
            if verdict.done():
                return
            if t.cancelled():
                verdict.set_result(Drop())
                return
            if t.exception() is None:
                return  # an allow whose commit is still on its way settles the verdict
            log.error("approval_failed", error=repr(t.exception()), tool=msg.tool)
            failed = Decision("deny", "internal.error", "the approval step failed")
            verdict.set_result(self._deny(msg, failed, ctx))

        task.add_done_callback(finished)
        # Unordered: later messages from the client do not wait behind a human.
        return Deferred(verdict, ordered=False)

    def _no_approval(self, decision: Decision, failure: str | None) -> Decision:
        if decision.rule == UNTRUSTED_OUTPUT_ASK and failure in (None, "unavailable", "out_of_band"):
            # `untrusted_output: ask` asks only when a human can answer; with
            # no channel it is the deny it stands for.
            return Decision(
                "deny",
                "provenance.untrusted_output",
                f"{decision.reason}; no approval channel can ask a human, so it is denied",
                decision.destination,
                decision.argument,
            )
        broker = self.approvals
        if failure == "timeout" and broker is not None:
            rule = "approval.timeout"
            text = (
                f"this call needs a human's approval ({decision.reason}) and no answer came within "
                f"{broker.timeout:g} seconds (settings.approval_timeout_seconds), so it is denied"
            )
        elif failure == "failed":
            rule = "approval.failed"
            text = (
                f"this call needs a human's approval ({decision.reason}) and no approval channel could "
                "ask (the client's elicitation failed or the approval directory is unwritable), so it is denied"
            )
        elif failure == "out_of_band":
            rule = "approval.unavailable"
            text = (
                f"this call needs a human's approval ({decision.reason}) and the policy lets only an "
                "out-of-band channel answer for this tool (approval: out_of_band), never the client's "
                "elicitation; Visor has none, so it is denied; to be asked, run visor with "
                "--approval-dir DIR (answer with `visor approve`) or --approval-tty"
            )
        else:
            rule = "approval.unavailable"
            text = (
                f"this call needs a human's approval ({decision.reason}) and Visor has no approval channel "
                "for it, so it is denied; to be asked, run visor with --approval-dir DIR (answer with "
                "`visor approve`) or --approval-tty, or use a client that declares MCP elicitation "
                "in initialize"
            )
        return Decision("deny", rule, text, decision.destination, decision.argument)

    async def _wait(
        self,
        msg: Message,
        call: ToolCall,
        decision: Decision,
        ctx: CallContext,
        verdict: asyncio.Future[Forward | Answer | Drop],
    ) -> None:
        broker = self.approvals
        assert broker is not None
        approved: list[Decision] = []
        ids: list[str] = []
        current = decision
        try:
            for _ in range(_MAX_APPROVAL_ROUNDS):
                req = make_request(
                    server=self.server,
                    tool=call.tool,
                    arguments=call.arguments,
                    request_id=msg.id,
                    session=self.audit.session,
                    rule=current.rule,
                    reason=current.reason,
                    destination=current.destination,
                    argument=current.argument,
                    now=time.time(),
                    timeout=broker.timeout,
                    focus=self._approval_focus(call, current),
                )
                outcome = await broker.ask(req, ctx, out_of_band_only=self._out_of_band_only(call))
                answer = outcome.answer
                if answer is None:
                    verdict.set_result(self._deny(msg, self._no_approval(current, outcome.failure), ctx))
                    return
                self._record_answer(msg, current, answer, req.id, req.call_hash)
                if not answer.approved:
                    declined = Decision(
                        "deny",
                        "approval.declined",
                        f"a human declined it ({current.reason})",
                        current.destination,
                        current.argument,
                    )
                    verdict.set_result(self._deny(msg, declined, ctx))
                    return
                approved.append(current)
                ids.append(req.id)
                if answer.remember:
                    self._remember(call, current)
                # Re-check at the moment of the allow: budgets, taints and
                # pins may have moved while a human was deciding.
                nxt = self._reevaluate(call, approved)
                if nxt.action == "deny":
                    verdict.set_result(self._deny(msg, nxt, ctx))
                    return
                if nxt.action == "allow":
                    allowed = self._allow(msg, call, nxt, ctx, {"approval": ids[0] if len(ids) == 1 else ids})
                    self._settle(verdict, allowed)
                    return
                self._record(msg, "ask", nxt)
                current = nxt
            too_many = Decision("deny", "approval.rounds", "this call raised too many questions for approval")
            verdict.set_result(self._deny(msg, too_many, ctx))
        except asyncio.CancelledError:
            reason = (
                "the session ended while the call waited for approval"
                if self._closing
                else "the client cancelled the call while it waited for approval"
            )
            self._record(
                msg,
                "deny",
                Decision("deny", "approval.cancelled", reason, current.destination, current.argument),
            )
            if not verdict.done():
                verdict.set_result(Drop())
            raise

    @staticmethod
    def _settle(verdict: asyncio.Future[Forward | Answer | Drop], allowed: Verdict) -> None:
        if type(allowed) is Deferred:
            allowed.future.add_done_callback(lambda f: verdict.done() or verdict.set_result(f.result()))
        elif not verdict.done():
            verdict.set_result(allowed)  # type: ignore[arg-type]

    def _reevaluate(self, call: ToolCall, approved: list[Decision]) -> Decision:
        """Evaluate again with this call's approvals in force; a question already answered yes passes."""
        # Destination approvals for this call are lent to the session for one
        # synchronous evaluation (nothing else runs meanwhile) and taken back
        # unless the human asked to remember them.
        lent: list[tuple[str, str, str]] = []
        for d in approved:
            if d.destination is not None and d.argument is not None:
                key = (call.tool, d.argument, d.destination)
                if key not in self.session.approvals:
                    self.session.approvals.add(key)
                    lent.append(key)
        answered = frozenset((d.rule, d.argument, d.destination) for d in approved)
        try:
            nxt = evaluate(self.policy, self.session, call, answered=answered)
        except Exception as exc:  # a bug must never turn into an allow
            log.exception("evaluate_failed", tool=call.tool)
            return Decision("deny", "internal.error", f"the policy evaluator failed ({type(exc).__name__})")
        finally:
            for key in lent:
                self.session.approvals.discard(key)
        if nxt.action == "ask" and any(
            (nxt.rule, nxt.argument, nxt.destination) == (d.rule, d.argument, d.destination) for d in approved
        ):
            return Decision(
                "allow", nxt.rule, f"approved by a human: {nxt.reason}", nxt.destination, nxt.argument
            )
        if nxt.action == "allow":
            first = approved[0]
            return Decision(
                "allow", first.rule, f"approved by a human: {first.reason}", first.destination, first.argument
            )
        return nxt

    def _remember(self, call: ToolCall, decision: Decision) -> None:
        scope = remember_scope(decision.rule, decision.argument, decision.destination)
        if scope == "destination":
            # "remember": the destination stays approved across restarts too
            self.session.remember_approval(call, decision, persist=True)
        elif scope == "exact":
            self._exact_approvals.add((decision.rule, arguments_digest(call.tool, call.arguments)))

    def _record_answer(
        self, msg: Message, decision: Decision, answer: ApprovalAnswer, approval_id: str, hash_: str
    ) -> None:
        event = self._event(msg, "approve" if answer.approved else "decline", decision)
        event.update(
            channel=answer.channel,
            approval=approval_id,
            call_hash=hash_,
            remember=answer.remember,
            client_reported=answer.client_reported,
        )
        if answer.who is not None:
            event["answered_by"] = answer.who
            if not answer.client_reported:
                # A person Visor can name (answer-file owner, terminal owner);
                # a client's self-reported name is never recorded as one.
                event["who"] = answer.who
        if answer.detail is not None:
            event["detail"] = answer.detail
        self._append(event)
        if answer.approved and msg.tool is not None:
            # Any yes to a destination trusts it for the rest of the session
            # (tool, argument, destination): a server that echoes "sent to X"
            # must not turn the next send to X into a deny.
            self.session.remember_approval(ToolCall(self.server, msg.tool, {}), decision)

    def _out_of_band_only(self, call: ToolCall) -> bool:
        """The policy lets only the directory or the terminal answer this tool (`approval: out_of_band`)."""
        try:
            entry = self.session.effective(call.tool).entry
        except Exception:  # an unreadable entry: the stricter reading
            log.exception("approval_mode_failed", tool=call.tool)
            return True
        return entry is not None and entry.approval == "out_of_band"

    def _approval_focus(self, call: ToolCall, decision: Decision) -> tuple[str, ...]:
        """The arguments a human sees first: the one the rule read, then every checked one."""
        try:
            entry = self.session.effective(call.tool).entry
            extra = (*entry.write_params, *entry.sink_params) if entry is not None else ()
            return focus_arguments(call.arguments, decision.argument, extra)
        except Exception:
            log.exception("approval_focus_failed", tool=call.tool)
            return ()

    def on_withdrawn(self, msg: Message) -> None:
        # The allow is on record; this says the call never reached the server.
        allow_seq, _ = self._inflight.pop(msg.id, (None, None))
        event: dict[str, Any] = {
            "event": "result",
            "server": self.server,
            "tool": msg.tool,
            "id": msg.id,
            "outcome": "cancelled_before_relay",
        }
        if allow_seq is not None:
            event["allow_seq"] = allow_seq
        self._append(event)

    def cancel(self, request_id: Any) -> bool:
        before = self._before_listing.pop(request_id, None)
        if before is not None:
            msg, verdict = before
            reason = "the client cancelled the call while Visor fetched the server's tools/list"
            self._record(self.guard.redact_call(msg), "deny", Decision("deny", "pin.cancelled", reason))
            if not verdict.done():
                verdict.set_result(Drop())
            return True
        task = self._waiting.pop(request_id, None)
        if task is None:
            return False
        task.cancel()
        return True

    def attach_client(self, link: ClientLink) -> None:
        if self.approvals is not None:
            self.approvals.link = link

    def attach_server(self, link: ServerLink) -> None:
        self._server_link = link

    # ------------------------------------------------------------ observing
    def on_tool_result(self, request: Message | None, tool: str | None, response: Message) -> bytes | None:
        obj = response.obj
        payload = obj.get("result")
        outcome = "ok"
        if payload is None:
            payload = obj.get("error")
            outcome = "error"
        elif payload.get("isError") is True:
            outcome = "tool_error"
        if type(payload) is dict:
            self.session.observe_output(tool, payload)
        allow_seq, started = self._inflight.pop(response.id, (None, None))
        event: dict[str, Any] = {
            "event": "result",
            "server": self.server,
            "tool": tool,
            "id": response.id,
            "outcome": outcome,
            "bytes": len(response.raw),
        }
        if allow_seq is not None and started is not None:
            event["allow_seq"] = allow_seq
            event["duration_ms"] = round((time.monotonic() - started) * 1000, 3)
        self._append(event)
        # Observed above as the server sent it; the client gets it redacted and within limits.
        return self.guard.tool_result(tool, response)

    def on_tools_list(self, response: Message, request: Message | None = None) -> bytes | None:
        result = response.obj.get("result")
        if type(result) is not dict:
            return None
        params = request.obj.get("params") if request is not None else None
        cursor = params.get("cursor") if type(params) is dict else None
        self._observe_listing(result, cursor)
        return self.guard.hide_tools(self.session, response)

    def _observe_listing(self, result: dict[str, Any], cursor: Any) -> None:
        """One tools/list page, the client's or Visor's own: pins and output schemas."""
        events = self.session.observe_tools_list(result, cursor)
        for ev in events:
            self._session_event(ev)
        if events and self._pin_saver is not None:
            self._pin_saver(self.session.export_pins())
        # Pins and output schemas come from the full list; hiding happens after.
        self.guard.observe_tools_list(result)

    def on_client_request(self, msg: Message) -> bytes | None:
        params = msg.obj.get("params")
        if type(params) is dict and self._names_protected(params) is not None:
            # A resource read of a pending approval file would hand the agent the
            # hash an answer must carry: Visor's own files are nobody's resource.
            reason = "the request names Visor's own files (approval directory, audit log, pins or policy)"
            self._append(
                {
                    "event": "deny",
                    "server": self.server,
                    "method": msg.method,
                    "id": msg.id,
                    "rule": "visor.protected_path",
                    "reason": reason,
                    "policy": self.policy.sha256,
                }
            )
            return errors.error_response(
                msg.id,
                DENIED_REQUEST,
                f"Visor denied {msg.method}: {reason} (rule: visor.protected_path)",
                {"visor": {"rule": "visor.protected_path"}},
            )
        return self.guard.client_request(msg)

    def on_response(self, method: str, response: Message) -> bytes | None:
        """A resources/read, prompts/get or tasks/result answer: untrusted output like a tool
        result (indexed for provenance as the server sent it), redacted for the client."""
        obj = response.obj
        payload = obj.get("result", obj.get("error"))
        if type(payload) is dict:
            self.session.observe_output(None, payload)
        if method == "tasks/result":
            # the deferred result of a task-augmented tools/call: a tool result in all but timing
            return self.guard.tool_result(None, response)
        return self.guard.response(method, response)

    def on_server_request(self, msg: Message) -> bytes | None:
        refusal = self.guard.server_request(msg)
        if refusal is None:
            # What the server asks the client's model (sampling) or user (elicitation)
            # to read is the server's text: untrusted output.
            params = msg.obj.get("params")
            if type(params) is dict:
                self.session.observe_output(None, params)
        return refusal

    def rewrite_server_request(self, msg: Message) -> bytes | None:
        """The server request as the client may see it (secrets redacted), or None if unchanged."""
        return self.guard.redact_server_request(msg)

    def on_server_info(self, info: dict[str, Any]) -> None:
        for ev in self.session.observe_server_info(info):
            self._session_event(ev)

    def on_reject(
        self,
        direction: str,
        reason: str,
        rejected: Rejected | None,
        *,
        size: int | None = None,
        digest: str | None = None,
    ) -> None:
        # The refused line itself is never recorded: only its size and SHA-256.
        # Reasons can quote a member name from the line, so they are cut short.
        event: dict[str, Any] = {
            "event": "reject",
            "server": self.server,
            "direction": direction,
            "reason": _bounded_reason(reason),
        }
        if size is not None:
            event["bytes"] = size
        if digest is not None:
            event["sha256"] = digest
        if rejected is not None:
            event["code"] = rejected.code
            if rejected.method:
                event["method"] = _bounded_reason(rejected.method)
            if rejected.tool:
                event["tool"] = _bounded_reason(rejected.tool)
            if rejected.reply_ids:
                # A string id of any length would otherwise be copied whole;
                # the record builder replaces one over its bound by a digest.
                event["id"] = rejected.reply_ids[0]
        self._append(event)

    async def close(self) -> None:
        # Calls still waiting for a human are withdrawn (their pending files
        # deleted) and recorded before the session ends.
        self._closing = True
        if self._listing is not None and not self._listing.done():
            self._listing.cancel()
            with contextlib.suppress(BaseException):
                await self._listing
        waiting = list(self._waiting.values())
        for task in waiting:
            task.cancel()
        for task in waiting:
            with contextlib.suppress(BaseException):
                await task
        self._append({"event": "session_end", "server": self.server})
        await self.audit.close()
        stats = self.audit.stats
        log.info(
            "audit_stats",
            commits=stats.commits,
            fsyncs=stats.fsync_count,
            records=stats.records_written,
            largest_group=stats.largest_group,
            healthy=self.audit.healthy,
        )

    # ------------------------------------------------------------- evidence
    def _event(self, msg: Message, kind: str, decision: Decision) -> dict[str, Any]:
        event: dict[str, Any] = {
            "event": kind,
            "server": self.server,
            "tool": msg.tool,
            "id": msg.id,
            "args": msg.arguments,
            "rule": decision.rule,
            "reason": decision.reason,
            "policy": self.policy.sha256,
        }
        if decision.destination is not None:
            event["destination"] = decision.destination
        if decision.argument is not None:
            event["argument"] = decision.argument
        return event

    def _record(self, msg: Message, kind: str, decision: Decision) -> None:
        event = self._event(msg, kind, decision)
        self._append(event)
        if kind in ("deny", "ask"):
            # One line on stderr per deny and per question, with the command that answers it.
            from visor.watch import announce

            announce(self, event, log)

    def _session_event(self, ev: SessionEvent) -> None:
        kind = ev.kind
        detail = dict(ev.detail)
        if kind == "pin_new":
            # A tool that appeared after the first listing: pinned, but never trusted.
            kind = "pin"
            detail["late"] = True
        event: dict[str, Any] = {"event": kind, "server": self.server, **detail}
        if ev.tool is not None:
            event["tool"] = ev.tool
        self._append(event)

    def _append(self, event: dict[str, Any]) -> None:
        try:
            self.audit.append(event)
        except (AuditUnhealthy, ValueError) as exc:
            # Later allows fail on their own commit; a lost non-allow record is logged.
            log.error("audit_append_failed", error=str(exc), audit_event=event.get("event"))
