"""What Visor checks, as synchronous hooks that answer with effects.

The session core (visor/core/session.py) calls a `Checks` for every message
that needs a judgement and acts on what it returns: `Forward` (relay these
bytes), `Answer` (send these bytes to the client; the server sees nothing),
`AwaitCommit` (relay once the allow record is durable) or `AwaitHuman` (put
this question to a human first). Nothing here waits: records are emitted as
actions, and the core comes back with `on_committed`, `on_approval`, ...

`Checks` itself passes everything (`visor run --no-checks`; it lives in
visor/core/passthrough.py, with the verdicts); `PolicyChecks` is the only
place where a decision, an approval and an audit record meet.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from visor.approval.model import arguments_digest, focus_arguments, make_request, remember_scope
from visor.approval.protected import Protected
from visor.audit import events
from visor.core.calls import Approval, CallContext
from visor.core.events import Action, Announce, AppendRecord, SaveApprovals, SavePins
from visor.core.guard import DENIED_REQUEST, DataGuard, Refuse, RequestVerdict

# Re-exported: the core, the drivers and the tests name them from here.
from visor.core.passthrough import LISTING_TIMEOUT_SECONDS as LISTING_TIMEOUT_SECONDS
from visor.core.passthrough import Answer as Answer
from visor.core.passthrough import AwaitCommit as AwaitCommit
from visor.core.passthrough import AwaitHuman as AwaitHuman
from visor.core.passthrough import Checks as Checks
from visor.core.passthrough import Forward as Forward
from visor.core.passthrough import Verdict as Verdict
from visor.logs import get_logger
from visor.policy import attestation, chains, paths
from visor.policy.evaluate import UNTRUSTED_OUTPUT_ASK, Decision, ToolCall, evaluate
from visor.policy.requests import network_uri, resource_uris, uri_readings
from visor.session import SharedStateConflict, SharedStateError
from visor.wire import errors

if TYPE_CHECKING:
    from visor.approval.broker import ApprovalBroker, Outcome
    from visor.approval.model import ApprovalAnswer
    from visor.core.calls import ToolCallState
    from visor.policy.schema import Policy
    from visor.session import SessionEvent, SessionState
    from visor.wire.message import Message, Rejected

# The stderr lines of call decisions keep the name they always had.
LOGGER = "visor.gate"
log = get_logger(LOGGER)

# A call with several questions (two unknown recipients) is asked about each in
# turn; past this many rounds it is denied rather than asked forever.
_MAX_APPROVAL_ROUNDS = 8


def denial_text(decision: Decision) -> str:
    return f"Visor denied this call: {decision.reason} (rule: {decision.rule})"


def _ignore(action: Action) -> None:
    """Where a `Checks` sends records before a core attaches it: nowhere."""


# What a running session was measured as at launch, for an attested server entry:
# (entry_arg_positions, observed digest, why it could not be measured).
_Measurement = tuple[tuple[int, ...], str | None, str | None]


def _launch_measurement(policy: Policy, server: str) -> _Measurement | None:
    entry = policy.server(server)
    att = entry.attestation if entry is not None else None
    return None if att is None else (att.entry_arg_positions, att.observed, att.unresolved)


def _traces_output(policy: Policy) -> bool:
    """Whether the provenance index must record where each key was seen (SessionState's `_trace`)."""
    return policy.settings.untrusted_output == "ask" or any(
        t.untrusted_output == "ask" for srv in policy.servers for t in srv.tools.values()
    )


class PolicyChecks(Checks):
    """Decide with the policy; an allow is relayed only once its record is durable."""

    def __init__(
        self,
        *,
        policy: Policy,
        session: SessionState,
        audit_session: str,
        server_name: str,
        argv: list[str],
        approvals: ApprovalBroker | None = None,
        protected: Protected | None = None,
        save_pins: bool = False,
        fixed_identity: str | None = None,
    ) -> None:
        self.policy = policy
        # `visor run --identity`: kept across reloads (else the policy's settings.identity).
        self._fixed_identity = fixed_identity
        # What a reload may not change: the launch measurement and the provenance index's shape.
        self._launch = _launch_measurement(policy, server_name)
        self._index_keys = policy.settings.output_index_max_keys
        self._traced = _traces_output(policy)
        # Visor's own files (approval directory, audit log, pins, policy): no call may name them.
        self.protected = protected or Protected()
        self.session = session
        # The evaluator's first check reads them from the session (visor.protected_path).
        session.protected = self.protected if self.protected else None
        session.path_bases = self.protected.bases
        # How long the last evaluation of a client's call took (telemetry takes and clears it).
        self.evaluation_seconds: float | None = None
        self.audit_session = audit_session
        self.server = server_name
        self._argv0 = argv[0] if argv else ""
        self._save_pins = save_pins
        self._emit: Callable[[Action], None] = _ignore
        # Redaction, resource/prompt/server-request gating, output limits.
        self.guard = DataGuard(policy, server_name, self._emit_action)
        self.approvals = approvals
        # (rule, arguments digest): approval_required answers remembered for the exact call
        self._exact_approvals: set[tuple[str, str]] = set()

    def attach(self, emit: Callable[[Action], None]) -> None:
        self._emit = emit

    def _emit_action(self, action: Action) -> None:
        # The guard is built before the core attaches: it reaches the sink through here.
        self._emit(action)

    def start(self) -> None:
        group = self.session.group.audit() if self.session.group is not None else None
        self._append(events.session_start(self.server, self._argv0, self.policy.sha256, group))
        self._append(events.policy_load(str(self.policy.source), self.policy.sha256))

    # ------------------------------------------------------------- decisions
    def needs_listing(self) -> bool:
        # Nothing is pinned yet (a client that cached a listing, or knows the
        # tool): Visor lists the tools itself, then judges the call.
        return not self.session.listing_seen

    def on_tool_call(self, msg: Message, ctx: CallContext) -> Verdict:
        try:
            return self._judge_call(msg, ctx, stale_ok=False)
        except SharedStateConflict:
            # Another replica served this session meanwhile (visor serve --state): the session
            # now holds the shared counts and history, and the call is judged again on them.
            return self._judge_call(msg, ctx, stale_ok=True)

    def _judge_call(self, msg: Message, ctx: CallContext, *, stale_ok: bool) -> Verdict:
        """Evaluate and record one call. A conflict with the shared store (nothing recorded yet)
        propagates unless ``stale_ok``, where it is a deny: counts that move under a second
        judgement mean replicas are racing on this session."""
        assert msg.tool is not None and msg.arguments is not None
        call = ToolCall(self.server, msg.tool, msg.arguments)
        try:
            began = time.perf_counter()
            decision = evaluate(self.policy, self.session, call)
            self.evaluation_seconds = time.perf_counter() - began
        except Exception as exc:  # a bug must never turn into an allow
            log.exception("evaluate_failed", tool=msg.tool)
            decision = Decision(
                "deny", "internal.error", f"the policy evaluator failed ({type(exc).__name__})"
            )
        # The policy saw the original arguments; from here on (audit, server) only redacted ones,
        # and the verdict's own words too (a webhook URL is both a secret and a destination).
        msg = self.guard.redact_call(msg)
        decision = self._redact_decision(decision)
        if decision.action == "allow":
            return self._allow(msg, call, decision, ctx, conflicts=stale_ok)
        if decision.action == "ask":
            return self._ask(msg, call, decision, ctx)
        return self._deny(msg, decision, ctx)

    def _redact_decision(self, decision: Decision) -> Decision:
        """``decision`` with its reason and destination redacted as the arguments are: they quote
        the arguments, and go to the audit log, the client's denial, the approval question and
        stderr. (A redacted destination remembered by a human's yes matches no later call: it is
        asked again, and no secret is kept on disk.)"""
        pset = self.guard.redactor.arguments
        reason = pset.redact_text(decision.reason)[0]
        destination = decision.destination
        if destination is not None:
            destination = pset.redact_text(destination)[0]
        if reason == decision.reason and destination == decision.destination:
            return decision
        return dataclasses.replace(decision, reason=reason, destination=destination)

    def on_listing_page(self, result: dict[str, Any], cursor: Any) -> None:
        self._observe_listing(result, cursor)

    def on_listing_failed(self, msg: Message, ctx: CallContext, failure: str) -> Answer:
        msg = self.guard.redact_call(msg)  # the reason quotes the tool's name
        decision = Decision(
            "deny",
            "pin.no_tools_list",
            f"tool {msg.tool!r} was called before the server's tools were listed, and Visor's "
            f"own tools/list failed ({failure}), so there is nothing to pin the call against",
        )
        return self._deny(msg, decision, ctx)

    def on_call_failed(self, msg: Message, ctx: CallContext, reason: str) -> Answer:
        return self._deny(self.guard.redact_call(msg), Decision("deny", "internal.error", reason), ctx)

    def _names_protected(self, value: dict[str, Any]) -> str | None:
        """The string that names Visor's own files under any reading of ``value`` (a tool call's
        arguments are checked by the evaluator's first check; this is for the other requests)."""
        return self.protected.named_in_any_reading(value)

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
        *,
        conflicts: bool = True,
    ) -> AwaitCommit | Answer:
        """``conflicts``: a conflict with the shared store is a deny (else it is raised, for the
        call to be judged again on the counts the session just took from the store)."""
        # Budgets, history and taints change now, not when the fsync returns:
        # the next pipelined call must already see this one.
        try:
            recorded = self.session.record_allowed(call)
        except SharedStateConflict:
            if not conflicts:
                raise
            log.error("shared_state_conflict", tool=msg.tool)
            return self._deny(
                msg,
                Decision(
                    "deny",
                    "state.conflict",
                    "another replica of the gateway is serving this session at the same time; retry",
                ),
                ctx,
            )
        except SharedStateError as exc:
            # Not counted where every replica counts: a call no budget saw must not run.
            log.error("shared_state_refused", tool=msg.tool, error=str(exc))
            return self._deny(msg, Decision("deny", "state.unavailable", str(exc)), ctx)
        record = self._event(msg, "allow", decision)
        if extra:
            record.update(extra)
        after = tuple(self._session_record(ev) for ev in recorded)
        return AwaitCommit(record, msg.raw, after, time.monotonic())

    def on_commit_failed(self, call: ToolCallState, error: str) -> Answer:
        log.error("audit_unhealthy", error=error, tool=call.msg.tool)
        text = (
            "Visor denied this call: the audit log cannot be written, so no call can be allowed "
            f"until Visor is restarted with a working log ({error})"
        )
        return Answer(errors.tool_error_result(call.msg.id, text, modern=call.ctx.modern))

    # ------------------------------------------------------------- approvals
    def _ask(self, msg: Message, call: ToolCall, decision: Decision, ctx: CallContext) -> Verdict:
        self._record(msg, "ask", decision)
        scope = remember_scope(decision.rule, decision.argument, decision.destination)
        if scope == "exact" and self._remembered_exact(
            decision.rule, arguments_digest(call.tool, call.arguments)
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
        # Later messages from the client do not wait behind a human.
        return self._question(Approval(msg, call, decision, self.policy), ctx)

    def _question(self, approval: Approval, ctx: CallContext) -> Verdict:
        """The next question about the call, or its denial when it raised too many."""
        if approval.rounds >= _MAX_APPROVAL_ROUNDS:
            too_many = Decision("deny", "approval.rounds", "this call raised too many questions for approval")
            return self._deny(approval.msg, too_many, ctx)
        broker = self.approvals
        assert broker is not None
        call, current = approval.call, approval.current
        approval.rounds += 1
        approval.request = make_request(
            server=self.server,
            tool=call.tool,
            arguments=call.arguments,
            request_id=approval.msg.id,
            session=self.audit_session,
            rule=current.rule,
            reason=current.reason,
            destination=current.destination,
            argument=current.argument,
            now=time.time(),
            timeout=broker.timeout,
            focus=self._approval_focus(call, current),
            # Secrets stay out of the pending file and the question, as out of the log.
            shown_arguments=approval.msg.arguments,
        )
        return AwaitHuman(approval, approval.request, self._out_of_band_only(call))

    def on_approval(self, approval: Approval, outcome: Outcome, ctx: CallContext) -> Verdict:
        with self._under(approval.policy):
            return self._on_approval(approval, outcome, ctx)

    def _on_approval(self, approval: Approval, outcome: Outcome, ctx: CallContext) -> Verdict:
        msg, call, current, req = approval.msg, approval.call, approval.current, approval.request
        assert req is not None
        answer = outcome.answer
        if answer is None:
            return self._deny(msg, self._no_approval(current, outcome.failure), ctx)
        self._record_answer(msg, current, answer, req.id, req.call_hash)
        if not answer.approved:
            declined = Decision(
                "deny",
                "approval.declined",
                f"a human declined it ({current.reason})",
                current.destination,
                current.argument,
            )
            return self._deny(msg, declined, ctx)
        approval.approved.append(current)
        approval.ids.append(req.id)
        if answer.remember:
            self._remember(call, current)
        # Re-check at the moment of the allow: budgets, taints and
        # pins may have moved while a human was deciding.
        nxt = self._reevaluate(call, approval.approved)
        if nxt.action == "deny":
            return self._deny(msg, nxt, ctx)
        if nxt.action == "allow":
            ids = approval.ids
            return self._allow(msg, call, nxt, ctx, {"approval": ids[0] if len(ids) == 1 else list(ids)})
        self._record(msg, "ask", nxt)
        approval.current = nxt
        return self._question(approval, ctx)

    def on_cancelled(self, call: ToolCallState, *, closing: bool) -> None:
        approval = call.approval
        if approval is None:
            # Still waiting for Visor's own tools/list.
            reason = "the client cancelled the call while Visor fetched the server's tools/list"
            self._record(self.guard.redact_call(call.msg), "deny", Decision("deny", "pin.cancelled", reason))
            return
        reason = (
            "the session ended while the call waited for approval"
            if closing
            else "the client cancelled the call while it waited for approval"
        )
        current = approval.current
        with self._under(approval.policy):
            self._record(
                approval.msg,
                "deny",
                Decision("deny", "approval.cancelled", reason, current.destination, current.argument),
            )

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
            before = len(self.session.remembered)
            self.session.remember_approval(call, decision, persist=True)
            if len(self.session.remembered) != before:
                self._emit(SaveApprovals(self.session.export_approvals()))
        elif scope == "exact":
            key = (decision.rule, arguments_digest(call.tool, call.arguments))
            self._exact_approvals.add(key)
            ledger = self.session.ledger
            if ledger is not None:  # visor serve --state: the yes follows the session to any replica
                try:
                    ledger.remember_exact(*key)
                except SharedStateError as exc:
                    # It holds here; a replica that continues the session asks again.
                    log.error("shared_approval_not_kept", tool=call.tool, error=str(exc))

    def _remembered_exact(self, rule: str, digest: str) -> bool:
        """Whether a human approved this exact call earlier in the session with "remember": in
        this process, or (visor serve --state) on any replica that served the session. A store
        that cannot answer says no: the human is asked again."""
        if (rule, digest) in self._exact_approvals:
            return True
        ledger = self.session.ledger
        if ledger is None:
            return False
        try:
            shared = ledger.exact_approvals()
        except SharedStateError as exc:
            log.warning("shared_approvals_unreadable", error=str(exc))
            return False
        self._exact_approvals |= shared
        return (rule, digest) in shared

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
            entry = self.session.effective(call.tool, call.arguments).entry
        except Exception:  # an unreadable entry: the stricter reading
            log.exception("approval_mode_failed", tool=call.tool)
            return True
        return entry is not None and entry.approval == "out_of_band"

    def _approval_focus(self, call: ToolCall, decision: Decision) -> tuple[str, ...]:
        """The arguments a human sees first: the one the rule read, then every checked one."""
        try:
            entry = self.session.effective(call.tool, call.arguments).entry
            extra = (*entry.write_params, *entry.sink_params) if entry is not None else ()
            return focus_arguments(call.arguments, decision.argument, extra)
        except Exception:
            log.exception("approval_focus_failed", tool=call.tool)
            return ()

    def on_withdrawn(self, call: ToolCallState) -> None:
        # The allow is on record; this says the call never reached the server.
        msg = call.msg
        self._append(
            events.result(
                server=self.server,
                tool=msg.tool,
                request_id=msg.id,
                outcome="cancelled_before_relay",
                allow_seq=call.allow_seq,
            )
        )

    # ------------------------------------------------------------ observing
    def on_tool_result(self, call: ToolCallState | None, tool: str | None, response: Message) -> bytes | None:
        obj = response.obj
        payload = obj.get("result")
        outcome = "ok"
        if payload is None:
            payload = obj.get("error")
            outcome = "error"
        elif payload.get("isError") is True:
            outcome = "tool_error"
        if type(payload) is dict:
            # the call's own arguments: a pack vouches for the answer only to the call it describes
            called = call.msg.arguments if call is not None and call.msg.arguments is not None else ()
            self.session.observe_output(tool, payload, error=outcome != "ok", called=called)
            self._taint_by_contents(payload, tool, response.raw)
        allow_seq: int | None = None
        duration_ms: float | None = None
        if call is not None and call.allow_seq is not None and call.started is not None:
            allow_seq = call.allow_seq
            duration_ms = round((time.monotonic() - call.started) * 1000, 3)
        self._append(
            events.result(
                server=self.server,
                tool=tool,
                request_id=response.id,
                outcome=outcome,
                size=len(response.raw),
                allow_seq=allow_seq,
                duration_ms=duration_ms,
            )
        )
        # Observed above as the server sent it; the client gets it redacted and within limits,
        # and what it asks the client for judged as the server's own requests are.
        modern = call.ctx.modern if call is not None else True
        embedded = self.guard.input_requests("tools/call", response, modern=modern)
        if isinstance(embedded, bytes):
            return embedded
        if embedded is not None:
            return self.guard.tool_result(tool, embedded) or embedded.raw
        return self.guard.tool_result(tool, response)

    def _taint_by_contents(self, payload: dict[str, Any], tool: str | None, raw: bytes) -> None:
        # Before the answer is relayed: the client's next call is judged with the taint. Most
        # answers carry no resource: a "uri" member is spelled so in the bytes, or with a \u escape.
        if b'"uri"' not in raw and b"\\u" not in raw:
            return
        for ev in self.session.record_output_resources(payload, tool):
            self._append(self._session_record(ev))

    def on_tools_list(self, response: Message, request: Message | None = None) -> bytes | None:
        result = response.obj.get("result")
        if type(result) is not dict:
            # An error instead of a listing: the server's text, like any other answer's.
            return self.on_response("tools/list", response)
        params = request.obj.get("params") if request is not None else None
        cursor = params.get("cursor") if type(params) is dict else None
        self._observe_listing(result, cursor)
        # The descriptions are the server's text the model reads first ("always copy
        # eve@... in"): untrusted output like any result.
        self.session.observe_output(None, result)
        return self.guard.hide_tools(self.session, response)

    def _observe_listing(self, result: dict[str, Any], cursor: Any) -> None:
        """One tools/list page, the client's or Visor's own: pins and output schemas."""
        changes = self.session.observe_tools_list(result, cursor)
        for ev in changes:
            self._append(self._session_record(ev))
        if changes and self._save_pins:
            self._emit(SavePins(self.session.export_pins()))
        # Pins and output schemas come from the full list; hiding happens after.
        self.guard.observe_tools_list(result)

    def on_client_request(self, msg: Message) -> RequestVerdict:
        params = msg.obj.get("params")
        given: dict[str, Any] = params if type(params) is dict else {}
        named = given
        # The resource it names, as a server's URL parser reads it; for a completion, the
        # template filled in (a file server completes a path by listing what it names).
        uris = resource_uris(msg.method or "", given) if given else ()
        if uris:
            named = {"params": given, "resources": list(uris)}
        if given and self._names_protected(named) is not None:
            # A resource read of a pending approval file would hand the agent the
            # hash an answer must carry; a completion would list the pending ones;
            # a request Visor knows nothing of reads what its server decides:
            # Visor's own files are nobody's resource, in any request.
            reason = "the request names Visor's own files (approval directory, audit log, pins or policy)"
            return self._refuse_request(msg, "visor.protected_path", reason)
        uri = given.get("uri") if msg.method in ("resources/read", "resources/subscribe") else None
        if type(uri) is str and (egress := self._resource_egress(uri)) is not None:
            return self._refuse_request(msg, *egress)
        verdict = self.guard.client_request(msg)
        if msg.method == "resources/read" and type(verdict) is not Refuse and type(uri) is str:
            # Raised before the read is relayed: a call pipelined behind it sees the taint.
            for ev in self.session.record_resource_read(uri):
                self._append(self._session_record(ev))
        return verdict

    def _refuse_request(self, msg: Message, rule: str, reason: str) -> Refuse:
        """A client request refused by Visor: its deny record, and the error the client gets."""
        self._append(
            events.request_verdict(
                "deny",
                server=self.server,
                method=self._evidence(msg.method),
                request_id=msg.id,
                rule=rule,
                reason=reason,
                policy=self.policy.sha256,
            )
        )
        return Refuse(
            errors.error_response(
                msg.id,
                DENIED_REQUEST,
                f"Visor denied {msg.method}: {reason} (rule: {rule})",
                {"visor": {"rule": rule}},
            )
        )

    def _resource_egress(self, uri: str) -> tuple[str, str] | None:
        """(rule, reason) when reading ``uri`` is egress from a tainted session: a resource on
        the network is fetched by its URI, which can carry what the session read out (a query
        string, a path). No egress control names a resource read as a sink, so every control
        whose taint is raised holds it (its sink_servers still apply)."""
        taints = self.session.all_taints()
        if not taints or not any(network_uri(reading) for reading in uri_readings(uri)):
            return None
        for control in self.policy.egress_controls:
            if control.when_tainted not in taints:
                continue
            if control.sink_servers and not chains.name_matches(control.sink_servers, self.server):
                continue
            return (
                f"egress_controls[{control.name}]",
                f"the session is tainted ({control.when_tainted}) and a network resource is egress",
            )
        return None

    def on_response(self, method: str, response: Message) -> bytes | None:
        """Any answer but a tool call's or a tool listing's (resources, prompts, initialize's
        instructions, completions, an error to anything): untrusted output like a tool result,
        indexed for provenance as the server sent it and redacted for the client."""
        obj = response.obj
        payload = obj.get("result", obj.get("error"))
        if type(payload) is dict:
            self.session.observe_output(None, payload)
            self._taint_by_contents(payload, None, response.raw)
        embedded = self.guard.input_requests(method, response)
        if isinstance(embedded, bytes):
            return embedded
        if embedded is not None:
            return self.guard.response(method, embedded) or embedded.raw
        if method == "tasks/result":
            # the deferred result of a task-augmented tools/call: a tool result in all but timing
            return self.guard.tool_result(None, response)
        return self.guard.response(method, response)

    def on_notification(self, msg: Message) -> bytes | None:
        """A server's notification (progress, log message, list changed): its text reaches the
        model like a result's, so it is indexed and redacted the same way."""
        params = msg.obj.get("params")
        if type(params) is dict:
            self.session.observe_output(None, params)
        return self.guard.notification(msg)

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

    def on_roots(self, response: Message) -> None:
        """A filesystem server reads relative names from the client's roots (Node's replaces its
        allowed directories with them): Visor's own files are sought from every root seen too."""
        result = response.obj.get("result")
        roots = result.get("roots") if type(result) is dict else None
        if type(roots) is not list:
            return
        found: list[str] = []
        for root in roots:
            uri = root.get("uri") if type(root) is dict else None
            if type(uri) is str and uri[:5].lower() == "file:":
                with contextlib.suppress(paths.PathError):
                    found.extend(paths.forms(uri))
        protected = self.protected.with_bases(found)
        if protected is not self.protected:
            self.protected = protected
            self.session.protected = protected if protected else None
            self.session.path_bases = protected.bases

    def on_server_info(self, info: dict[str, Any]) -> None:
        for ev in self.session.observe_server_info(info):
            self._append(self._session_record(ev))

    def on_reject(
        self,
        direction: str,
        reason: str,
        rejected: Rejected | None,
        *,
        size: int | None = None,
        digest: str | None = None,
    ) -> None:
        self._append(
            events.reject(
                server=self.server,
                direction=direction,
                reason=reason,
                size=size,
                digest=digest,
                code=rejected.code if rejected is not None else None,
                method=self._evidence(rejected.method) if rejected is not None else None,
                tool=self._evidence(rejected.tool) if rejected is not None else None,
                request_id=rejected.reply_ids[0] if rejected is not None and rejected.reply_ids else None,
                has_id=rejected is not None and bool(rejected.reply_ids),
            )
        )

    def on_close(self) -> None:
        self._append(events.session_end(self.server))

    def _evidence(self, name: str | None) -> str | None:
        """A method or tool name the client chose, as records keep it: the model spells a secret
        as a method as freely as a tool (an unknown method is relayed under its own name)."""
        return self.guard.evidence(name) if name else None

    # ------------------------------------------------------------- reloads
    def on_policy_reload(self, policy: Policy, path: str | None = None) -> None:
        old = self.policy
        self._protect_policy_file(path)
        policy = attestation.observe(policy, self.server, self._launched)
        refusal = self._cannot_change(policy)
        if refusal is not None:
            self._reload_failed(str(policy.source), refusal, policy.sha256)
            return
        self._bind(policy)
        if self.approvals is not None:
            # Questions asked from now on; one already open keeps the wait it started with.
            self.approvals.timeout = float(policy.settings.approval_timeout_seconds)
        attested = self._attestation_state(policy)
        log.info("policy_reloaded", source=str(policy.source), previous=old.sha256, policy=policy.sha256)
        self._append(
            events.policy_reload(
                source=str(policy.source),
                previous=old.sha256,
                policy=policy.sha256,
                ok=True,
                attestation=attested,
            )
        )

    def on_policy_reload_failed(
        self, source: str, error: str, sha256: str | None, path: str | None = None
    ) -> None:
        self._protect_policy_file(path)
        self._reload_failed(source, error, sha256)

    def _protect_policy_file(self, path: str | None) -> None:
        # The file a reload read may not be the one resolved at start (a symlink pointed at the
        # next version): whether it loaded or not, it is the operator's next policy, and a tool
        # that could write it would choose what the next reload puts in force.
        if path is not None and self.protected:
            self.protected = self.protected.with_file(path)
            self.session.protected = self.protected

    def _reload_failed(self, source: str, error: str, sha256: str | None) -> None:
        log.error(
            "policy_reload_failed",
            error=error,
            detail=f"the policy in force is unchanged ({self.policy.source}, {self.policy.sha256[:12]})",
        )
        self._append(
            events.policy_reload(
                source=source, previous=self.policy.sha256, policy=sha256, ok=False, error=error
            )
        )

    def _cannot_change(self, policy: Policy) -> str | None:
        """Why `policy` cannot be put in force in a running session, or None."""
        restart = "; restart visor run to apply it"
        keys = policy.settings.output_index_max_keys
        if keys != self._index_keys:
            return (
                f"settings.output_index_max_keys cannot change while the session runs "
                f"({self._index_keys} at start, {keys} in the new policy){restart}"
            )
        if _traces_output(policy) and not self._traced:
            return (
                "untrusted_output: ask cannot be turned on while the session runs (the provenance index "
                f"was started without recording where each destination was seen){restart}"
            )
        fixed = self._fixed_identity
        if fixed is not None and not any(i.name == fixed for i in policy.identities):
            return f"identity {fixed!r} (visor run --identity) is not defined in the new policy's identities"
        return None

    def _launched(self, positions: tuple[int, ...]) -> tuple[str | None, str | None]:
        """The launch measurement for an attested entry in a reloaded policy: the running
        server is what was measured at start, and is never measured again (files read now
        may not be what was launched)."""
        launch = self._launch
        if launch is None:
            return None, (
                "the attestation came with a policy reload and the running server was not measured "
                "when it started; restart visor run to measure it"
            )
        launched, observed, unresolved = launch
        if positions != launched:
            return None, (
                f"a policy reload changed entry_arg_positions ({list(launched)} at start, {list(positions)} "
                "now) and the running server was measured with the former; restart visor run to measure it"
            )
        return observed, unresolved

    def _attestation_state(self, policy: Policy) -> str | None:
        """For the reload record: None (no attestation), "match", or why calls are denied."""
        entry = policy.server(self.server)
        att = entry.attestation if entry is not None else None
        if att is None:
            return None
        return attestation.verdict(att.observed, att.unresolved, att.digest) or "match"

    def _bind(self, policy: Policy) -> None:
        self.policy = policy
        self.guard.rebind(policy)
        self.session.rebind(policy, self._fixed_identity)

    @contextlib.contextmanager
    def _under(self, policy: Policy) -> Iterator[None]:
        """Judge with `policy` for the duration (a call's own, older one), then with the current.

        Synchronous: nothing else runs meanwhile, so no other call sees the older policy."""
        current = self.policy
        if policy is current:
            yield
            return
        self._bind(policy)
        try:
            yield
        finally:
            self._bind(current)

    # ------------------------------------------------------------- evidence
    def _event(self, msg: Message, kind: str, decision: Decision) -> dict[str, Any]:
        return events.call_verdict(
            kind,
            server=self.server,
            tool=msg.tool,
            request_id=msg.id,
            arguments=msg.arguments,
            decision=decision,
            policy=self.policy.sha256,
        )

    def _record(self, msg: Message, kind: str, decision: Decision) -> None:
        event = self._event(msg, kind, decision)
        self._append(event)
        if kind in ("deny", "ask"):
            # One line on stderr per deny and per question, with the command that answers it.
            self._emit(Announce(event, LOGGER))

    def _session_record(self, ev: SessionEvent) -> dict[str, Any]:
        kind = ev.kind
        detail = dict(ev.detail)
        if kind == "pin_new":
            # A tool that appeared after the first listing: pinned, but never trusted.
            kind = "pin"
            detail["late"] = True
        matched = detail.get("matched")
        if type(matched) is str and matched:
            # The argument value that raised a taint: redacted as the call's arguments are, or
            # the taint record would keep the secret the allow record beside it leaves out.
            detail["matched"] = self.guard.redactor.arguments.redact_text(matched)[0]
        return events.session_change(kind, self.server, ev.tool, detail)

    def _append(self, event: dict[str, Any]) -> None:
        self._emit(AppendRecord(event))
