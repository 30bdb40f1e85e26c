"""OpenTelemetry export: a span per gated request, and Visor's metrics, over OTLP/HTTP.

Configured only by OpenTelemetry's standard environment variables
(`OTEL_EXPORTER_OTLP_ENDPOINT`, `..._TRACES_ENDPOINT`, `..._METRICS_ENDPOINT`,
`..._HEADERS`, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
`OTEL_METRIC_EXPORT_INTERVAL`, `OTEL_BSP_*`), read by the SDK itself. Spans and
metrics leave on the SDK's own background threads; the relay only records.

Visor's providers are its own, never installed as the process-wide globals,
so nothing else in the process can redirect or silence them.

Attribute names follow OpenTelemetry's MCP semantic conventions where they
have one (`mcp.method.name`, `gen_ai.tool.name`, `mcp.session.id`); Visor's
own are under `visor.`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Status, StatusCode

from visor import __version__
from visor.logs import get_logger

_SCOPE = "visor"
#: Bound on the flush at shutdown: an unreachable collector must not hold up the client.
_SHUTDOWN_MILLIS = 3000


def _resource(server: str, session: str) -> Resource:
    attributes: dict[str, str] = {
        "service.version": __version__,
        "visor.server": server,
        "mcp.session.id": session,
    }
    # OTEL_SERVICE_NAME, when set, names the service; Resource.create reads it.
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = "visor"
    return Resource.create(attributes)


class OpenTelemetry:
    """The `Telemetry` interface over the OpenTelemetry SDK."""

    def __init__(self, *, server: str, session: str) -> None:
        self._server = server
        resource = _resource(server, session)
        self._tracer_provider = TracerProvider(resource=resource)
        self._tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self._tracer = self._tracer_provider.get_tracer(_SCOPE, __version__)
        self._meter_provider = MeterProvider(
            resource=resource, metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())]
        )
        meter = self._meter_provider.get_meter(_SCOPE, __version__)
        self._requests = meter.create_counter(
            "visor.requests", unit="{request}", description="Gated requests by final verdict"
        )
        self._request_duration = meter.create_histogram(
            "visor.request.duration", unit="s", description="From the request's arrival to its final verdict"
        )
        self._evaluation = meter.create_histogram(
            "visor.evaluation.duration", unit="s", description="Policy evaluation of one call"
        )
        self._commit = meter.create_histogram(
            "visor.audit.commit.duration", unit="s", description="From queuing an allow's record to its fsync"
        )
        self._fsync = meter.create_histogram(
            "visor.audit.fsync.duration", unit="s", description="One audit fsync"
        )
        self._pending = meter.create_up_down_counter(
            "visor.approvals.pending",
            unit="{approval}",
            description="Approval questions waiting for an answer",
        )
        self._index_size: Callable[[], int] | None = None
        meter.create_observable_gauge(
            "visor.output_index.size",
            callbacks=[self._observe_index],
            unit="{key}",
            description="Destination keys in the provenance index",
        )
        self._closed = False

    def _observe_index(self, _options: CallbackOptions) -> Iterable[Observation]:
        size = self._index_size
        if size is None:
            return ()
        return (Observation(size(), {"visor.server": self._server}),)

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
        attributes: dict[str, str] = {
            "mcp.method.name": method,
            "visor.server": self._server,
            "visor.verdict": verdict,
            "visor.rule": rule,
        }
        if tool is not None:
            attributes["gen_ai.tool.name"] = tool
        span = self._tracer.start_span(
            f"{method} {tool}" if tool is not None else method, start_time=start_ns, attributes=attributes
        )
        if verdict != "allow":
            span.set_status(Status(StatusCode.ERROR, f"{verdict}: {rule}"))
        span.end(end_time=max(end_ns, start_ns))
        counted = {"mcp.method.name": method, "visor.verdict": verdict, "visor.server": self._server}
        self._requests.add(1, counted)
        self._request_duration.record(max(end_ns - start_ns, 0) / 1e9, counted)
        if evaluation_s is not None:
            self._evaluation.record(evaluation_s, {"visor.server": self._server})

    def committed(self, seconds: float) -> None:
        self._commit.record(seconds, {"visor.server": self._server})

    def fsynced(self, seconds: float) -> None:
        self._fsync.record(seconds, {"visor.server": self._server})

    def approvals_pending(self, delta: int) -> None:
        self._pending.add(delta, {"visor.server": self._server})

    def watch_output_index(self, size: Callable[[], int]) -> None:
        self._index_size = size

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        # The exporters log and drop on a collector that is down; nothing here may
        # raise into the relay's shutdown path.
        try:
            self._tracer_provider.force_flush(_SHUTDOWN_MILLIS)
            self._tracer_provider.shutdown()
            self._meter_provider.force_flush(_SHUTDOWN_MILLIS)
            self._meter_provider.shutdown(timeout_millis=_SHUTDOWN_MILLIS)
        except Exception as exc:
            get_logger("visor.telemetry").warning("telemetry_flush_failed", error=str(exc))
