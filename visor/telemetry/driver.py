"""The session core's events and actions, read as telemetry: one report per final verdict.

The driver shows this observer each event before the core handles it and each
action after it is performed. A verdict's span starts when Visor read what led
to it (the client's bytes, or for an approved call the bytes that raised the
question) and ends when the verdict is final: an allow when its record is
durable (it is relayed at that moment), a deny or a human's no when it is
recorded. Nothing here can change what the core decides.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

from visor.audit.record import MAX_STRING_BYTES
from visor.core.calls import ToolCallState
from visor.core.events import (
    Action,
    AppendRecord,
    ApprovalAnswered,
    AskHuman,
    CommitDone,
    CommitFailed,
    CommitRecord,
    Event,
    WithdrawApproval,
)
from visor.telemetry import Telemetry

#: Records that end a request's life at Visor (an allowed tools/call ends with its durable commit;
#: a human's no is recorded as `decline`, then as the `deny` that answers the call).
_FINAL = frozenset({"deny", "allow"})


class DriverTelemetry:
    __slots__ = ("_allows", "_asked", "_carried", "_evaluation", "_start_ns", "telemetry")

    def __init__(self, telemetry: Telemetry, evaluation: Callable[[], float | None] | None = None) -> None:
        """`evaluation`: takes (reads and clears) how long the last policy evaluation took."""
        self.telemetry = telemetry
        self._evaluation = evaluation or (lambda: None)
        self._start_ns = 0
        self._asked: dict[ToolCallState, tuple[int, float | None]] = {}
        self._carried: float | None = None  # an asked call's evaluation, for its final verdict
        self._allows: dict[ToolCallState, tuple[int, float, dict[str, Any], float | None]] = {}

    def before(self, event: Event) -> None:
        """`event` is about to be handed to the core."""
        now = time.time_ns()
        self._start_ns = now
        self._carried = None
        match event:
            case ApprovalAnswered(call=call):
                asked = self._asked.pop(call, None)
                if asked is not None:
                    self.telemetry.approvals_pending(-1)
                    self._start_ns, self._carried = asked
            case CommitDone(call=call):
                allow = self._allows.pop(call, None)
                if allow is not None:
                    started, submitted, record, evaluation = allow
                    self.telemetry.committed(time.monotonic() - submitted)
                    self._report(record, "allow", started, now, evaluation)
            case CommitFailed(call=call):
                allow = self._allows.pop(call, None)
                if allow is not None:  # the deny the core records next belongs to this call
                    self._start_ns = allow[0]

    def performed(self, action: Action) -> None:
        """The driver performed `action`."""
        match action:
            case AppendRecord(event=record):
                kind = record.get("event")
                if kind in _FINAL:
                    self._report(record, kind, self._start_ns, time.time_ns(), self._took())
            case CommitRecord(event=record, call=call):
                self._allows[call] = (self._start_ns, time.monotonic(), record, self._took())
            case AskHuman(call=call):
                if call not in self._asked:
                    self.telemetry.approvals_pending(1)
                self._asked[call] = (self._start_ns, self._took())
            case WithdrawApproval(call=call):
                if self._asked.pop(call, None) is not None:
                    self.telemetry.approvals_pending(-1)

    def _took(self) -> float | None:
        taken = self._evaluation()
        return taken if taken is not None else self._carried

    def _report(
        self, record: dict[str, Any], verdict: str, start_ns: int, end_ns: int, evaluation: float | None
    ) -> None:
        method = record.get("method")
        tool = record.get("tool")
        self.telemetry.gated(
            method=method if isinstance(method, str) else "tools/call",
            tool=_bounded(tool) if isinstance(tool, str) else None,
            verdict=verdict,
            rule=str(record.get("rule", "")),
            start_ns=start_ns,
            end_ns=end_ns,
            evaluation_s=evaluation,
        )


def _bounded(name: str) -> str:
    """A tool name as the audit log keeps it: one over its bound becomes its size and digest (the
    record's `omitted`). The model chooses the name; whole, megabytes of it per call would fill the
    exporter's queue and batches, and a collector refusing a batch drops the real spans in it."""
    if len(name) <= MAX_STRING_BYTES // 4:
        return name
    raw = name.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_STRING_BYTES:
        return name
    return f"[omitted: {len(raw)} bytes, sha256 {hashlib.sha256(raw).hexdigest()}]"
