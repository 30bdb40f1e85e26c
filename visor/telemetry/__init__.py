"""Telemetry: what Visor decided and how long it took, for the team's collector.

Telemetry is evidence for operators, not a control: losing it never changes a
verdict, and the relay never waits on it. The session driver reports each gated
request once, when its verdict is final, through the small interface below.
`NoTelemetry` is what runs unless OpenTelemetry is asked for; the OpenTelemetry
implementation (`visor.telemetry.otel`) is imported only then, so a plain
`visor run` pays nothing for it at start-up.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Protocol

from visor.logs import get_logger

#: The standard variables that turn OTLP export on (OpenTelemetry's own names).
OTLP_ENDPOINT_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)


class Telemetry(Protocol):
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
        """One gated request whose verdict is final (allow relayed, deny answered, ask resolved)."""

    def committed(self, seconds: float) -> None:
        """An allow's audit record became durable `seconds` after it was queued."""

    def fsynced(self, seconds: float) -> None:
        """One fsync of the audit log took `seconds`."""

    def approvals_pending(self, delta: int) -> None:
        """An approval question was opened (+1) or closed (-1)."""

    def watch_output_index(self, size: Callable[[], int]) -> None:
        """Report the provenance index's size by calling `size` when metrics are collected."""

    def shutdown(self) -> None:
        """Flush what is buffered, within a short bound; never raises."""


class NoTelemetry:
    """Telemetry off: every report is dropped where it is made."""

    __slots__ = ()

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
        return None

    def committed(self, seconds: float) -> None:
        return None

    def fsynced(self, seconds: float) -> None:
        return None

    def approvals_pending(self, delta: int) -> None:
        return None

    def watch_output_index(self, size: Callable[[], int]) -> None:
        return None

    def shutdown(self) -> None:
        return None


def requested(environ: Mapping[str, str]) -> bool:
    """Whether the environment asks for OTLP export (and has not switched the SDK off)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(environ.get(name, "").strip() for name in OTLP_ENDPOINT_VARIABLES)


def start(*, server: str, session: str, environ: Mapping[str, str] | None = None) -> Telemetry:
    """The telemetry this process should use: OpenTelemetry when the environment asks for it.

    Asked for but not installed is said on stderr once and otherwise ignored:
    the calls are still judged and audited exactly the same way.
    """
    env = os.environ if environ is None else environ
    if not requested(env):
        return NoTelemetry()
    try:
        from visor.telemetry.otel import OpenTelemetry
    except ImportError as exc:
        get_logger("visor.telemetry").warning(
            "telemetry_unavailable",
            reason="OTEL_EXPORTER_OTLP_* is set but the 'otel' extra is not installed",
            hint="pip install 'visor-mcp-proxy[otel]'",
            error=str(exc),
        )
        return NoTelemetry()
    return OpenTelemetry(server=server, session=session)
