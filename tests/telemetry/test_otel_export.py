"""OpenTelemetry export, received by a real OTLP/HTTP endpoint and decoded with the real protobufs."""

from __future__ import annotations

import time

import pytest

from visor import telemetry
from visor.telemetry import NoTelemetry

from .otlp_receiver import otlp_receiver

pytest.importorskip("opentelemetry.sdk", reason="the 'otel' extra is part of the test extras")


def test_off_unless_an_otlp_endpoint_is_set() -> None:
    assert not telemetry.requested({})
    assert not telemetry.requested({"OTEL_SERVICE_NAME": "x"})
    assert telemetry.requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert telemetry.requested({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert not telemetry.requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "TRUE"})
    assert isinstance(telemetry.start(server="s", session="x", environ={}), NoTelemetry)


def test_spans_and_metrics_reach_the_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    with otlp_receiver() as (endpoint, received):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
        tel = telemetry.start(server="mail", session="sess-1")
        assert not isinstance(tel, NoTelemetry)
        now = time.time_ns()
        tel.gated(
            method="tools/call",
            tool="send_email",
            verdict="deny",
            rule="provenance.untrusted_output",
            start_ns=now,
            end_ns=now + 250_000,
            evaluation_s=0.00002,
        )
        tel.gated(
            method="tools/call",
            tool="read",
            verdict="allow",
            rule="tools.read",
            start_ns=now,
            end_ns=now + 900_000,
            evaluation_s=0.00001,
        )
        tel.committed(0.0004)
        tel.fsynced(0.0003)
        tel.approvals_pending(1)
        tel.approvals_pending(-1)
        tel.watch_output_index(lambda: 42)
        tel.shutdown()

    by_tool = {s["attributes"]["gen_ai.tool.name"]: s for s in received.spans}
    assert set(by_tool) == {"send_email", "read"}
    deny = by_tool["send_email"]
    assert deny["name"] == "tools/call send_email"
    assert deny["attributes"]["visor.verdict"] == "deny"
    assert deny["attributes"]["visor.rule"] == "provenance.untrusted_output"
    assert deny["attributes"]["visor.server"] == "mail"
    assert deny["end"] - deny["start"] == 250_000
    assert deny["status"] == 2  # STATUS_CODE_ERROR
    assert by_tool["read"]["status"] != 2
    assert received.resources[0]["service.name"] == "visor"
    assert received.resources[0]["mcp.session.id"] == "sess-1"

    names = set(received.metrics)
    for expected in (
        "visor.requests",
        "visor.request.duration",
        "visor.evaluation.duration",
        "visor.audit.commit.duration",
        "visor.audit.fsync.duration",
        "visor.approvals.pending",
        "visor.output_index.size",
    ):
        assert expected in names, (expected, names)
    counts = {
        dict((a.key, a.value.string_value) for a in p.attributes)["visor.verdict"]: p.as_int
        for m in received.metrics["visor.requests"]
        for p in m.sum.data_points
    }
    assert counts == {"deny": 1, "allow": 1}
    gauge = received.metrics["visor.output_index.size"][-1].gauge.data_points[0]
    assert gauge.as_int == 42


def test_a_collector_that_is_down_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    # A port nothing listens on: export fails in the SDK's threads, shutdown stays bounded and quiet.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    tel = telemetry.start(server="s", session="x")
    tel.gated(
        method="tools/call", tool="t", verdict="allow", rule="r", start_ns=1, end_ns=2, evaluation_s=None
    )
    tel.shutdown()
    tel.shutdown()
