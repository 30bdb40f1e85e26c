"""One telemetry report handed to several receivers: `visor serve`'s `/metrics` and, when the
OTEL_* variables ask for it, the team's OpenTelemetry collector. A receiver that fails is
logged and skipped; the others still get the report (telemetry never changes a verdict)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from visor.logs import get_logger
from visor.telemetry import Telemetry

log = get_logger("visor.telemetry")
T = TypeVar("T")


class FanOut:
    __slots__ = ("receivers",)

    def __init__(self, *receivers: Telemetry) -> None:
        self.receivers = receivers

    def gated(
        self,
        *,
        method: str,
        tool: str | None,
        verdict: str,
        rule: str,
        start_ns: int,
        end_ns: int,
        evaluation_s: float | None,
    ) -> None:
        for r in self.receivers:
            try:
                r.gated(
                    method=method,
                    tool=tool,
                    verdict=verdict,
                    rule=rule,
                    start_ns=start_ns,
                    end_ns=end_ns,
                    evaluation_s=evaluation_s,
                )
            except Exception as exc:
                log.warning("telemetry_report_failed", receiver=type(r).__name__, error=repr(exc))

    def committed(self, seconds: float) -> None:
        for r in self.receivers:
            self._each(r.committed, seconds)

    def fsynced(self, seconds: float) -> None:
        for r in self.receivers:
            self._each(r.fsynced, seconds)

    def approvals_pending(self, delta: int) -> None:
        for r in self.receivers:
            self._each(r.approvals_pending, delta)

    def watch_output_index(self, size: Callable[[], int]) -> None:
        for r in self.receivers:
            self._each(r.watch_output_index, size)

    def shutdown(self) -> None:
        for r in self.receivers:
            try:
                r.shutdown()
            except Exception as exc:
                log.warning("telemetry_shutdown_failed", receiver=type(r).__name__, error=repr(exc))

    @staticmethod
    def _each(report: Callable[[T], None], value: T) -> None:
        try:
            report(value)
        except Exception as exc:
            log.warning("telemetry_report_failed", error=repr(exc))
