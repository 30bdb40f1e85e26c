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
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from visor.logs import get_logger
from visor.wire import errors
from visor.wire.message import Message, Rejected

if TYPE_CHECKING:
    from visor.audit.writer import AuditWriter
    from visor.policy.evaluate import Decision, ToolCall
    from visor.policy.schema import Policy
    from visor.session import SessionEvent, SessionState

log = get_logger("visor.gate")


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

    def on_tools_list(self, response: Message) -> bytes | None:
        return None

    def on_server_info(self, info: dict[str, Any]) -> None:
        """The server said who it is (initialize or server/discover)."""

    def on_reject(self, direction: str, reason: str, rejected: Rejected | None) -> None:
        """A wire-level refusal in either direction."""

    def cancel(self, request_id: Any) -> bool:
        """The client cancelled a call that has not been forwarded; True if one was waiting."""
        return False

    async def close(self) -> None:
        """The session is over."""


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
    ) -> None:
        self.policy = policy
        self.session = session
        self.audit = audit
        self.server = server_name
        self._pin_saver = pin_saver
        # request id -> (seq of the allow record, monotonic start) for `result` events
        self._inflight: dict[Any, tuple[int, float]] = {}
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
        from visor.policy.evaluate import Decision, ToolCall, evaluate

        assert msg.tool is not None and msg.arguments is not None
        call = ToolCall(self.server, msg.tool, msg.arguments)
        try:
            decision = evaluate(self.policy, self.session, call)
        except Exception as exc:  # a bug must never turn into an allow
            log.exception("evaluate_failed", tool=msg.tool)
            decision = Decision(
                "deny", "internal.error", f"the policy evaluator failed ({type(exc).__name__})"
            )
        if decision.action == "allow":
            return self._allow(msg, call, decision, ctx)
        if decision.action == "ask":
            self._record(msg, "ask", decision)
            decision = Decision(
                "deny",
                "approval.unavailable",
                f"this call needs a human's approval ({decision.reason}) and Visor has no approval channel "
                "configured, so it is denied",
                decision.destination,
                decision.argument,
            )
        self._record(msg, "deny", decision)
        return Answer(errors.tool_error_result(msg.id, denial_text(decision), modern=ctx.modern))

    def _allow(self, msg: Message, call: ToolCall, decision: Decision, ctx: CallContext) -> Verdict:
        from visor.audit.writer import AuditUnhealthy

        event = self._event(msg, "allow", decision)
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
        return None

    def on_tools_list(self, response: Message) -> bytes | None:
        result = response.obj.get("result")
        if type(result) is not dict:
            return None
        events = self.session.observe_tools_list(result)
        for ev in events:
            self._session_event(ev)
        if events and self._pin_saver is not None:
            self._pin_saver(self.session.export_pins())
        return None

    def on_server_info(self, info: dict[str, Any]) -> None:
        for ev in self.session.observe_server_info(info):
            self._session_event(ev)

    def on_reject(self, direction: str, reason: str, rejected: Rejected | None) -> None:
        event: dict[str, Any] = {
            "event": "reject",
            "server": self.server,
            "direction": direction,
            "reason": reason,
        }
        if rejected is not None:
            event["code"] = rejected.code
            if rejected.method:
                event["method"] = rejected.method
            if rejected.tool:
                event["tool"] = rejected.tool
            if rejected.reply_ids:
                event["id"] = rejected.reply_ids[0]
        self._append(event)

    async def close(self) -> None:
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
        self._append(self._event(msg, kind, decision))

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
        from visor.audit.writer import AuditUnhealthy

        try:
            self.audit.append(event)
        except (AuditUnhealthy, ValueError) as exc:
            # Later allows fail on their own commit; a lost non-allow record is logged.
            log.error("audit_append_failed", error=str(exc), audit_event=event.get("event"))
