"""A real `visor run` exporting to a real OTLP/HTTP receiver: one span per final verdict,
and the metrics, configured by nothing but the standard OTEL_* variables."""

from __future__ import annotations

import sys

import pytest

from tests.approval import helpers as ap
from tests.conftest import VisorProcess

from .otlp_receiver import otlp_receiver

pytest.importorskip("opentelemetry.sdk", reason="the 'otel' extra is part of the test extras")


def test_visor_run_exports_a_span_per_verdict_and_its_metrics(tmp_path) -> None:  # type: ignore[no-untyped-def]
    approvals = tmp_path / "approvals"
    with otlp_receiver() as (endpoint, received):
        vp = VisorProcess(
            [sys.executable, str(ap.SERVER)],
            env={
                "APPROVAL_SERVER_LOG": str(tmp_path / "received.jsonl"),
                "APPROVAL_SERVER_AUDIT": str(tmp_path / "audit.jsonl"),
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                "OTEL_METRIC_EXPORT_INTERVAL": "60000",  # metrics leave at shutdown, once
            },
            visor_args=[
                "--server-name",
                "rec",
                "--policy",
                str(ap.write_policy(tmp_path)),
                "--audit-log",
                str(tmp_path / "audit.jsonl"),
                "--approval-dir",
                str(approvals),
            ],
        )
        vp.request({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
        assert "tools" in vp.recv()["result"]
        ap.call(vp, 1, "echo", {"text": "hi"})
        assert not ap.recv_id(vp, 1)["result"].get("isError")
        ap.call(vp, 2, "nope", {})
        assert ap.recv_id(vp, 2)["result"]["isError"] is True
        ap.call(vp, 3, "send_email", {"to": "someone@new.example", "body": "x"})
        found = ap.wait_pending(approvals)
        (approval_id,) = found
        answered = ap.cli("deny", approval_id, "--approval-dir", str(approvals))
        assert answered.returncode == 0, answered.stderr
        assert ap.recv_id(vp, 3)["result"]["isError"] is True
        vp.close_stdin()
        assert vp.wait() == 0

    spans = {s["attributes"]["gen_ai.tool.name"]: s for s in received.spans}
    # One span per final verdict: the human's no is the send's only span.
    assert sorted(s["attributes"]["gen_ai.tool.name"] for s in received.spans) == [
        "echo",
        "nope",
        "send_email",
    ]
    assert spans["echo"]["attributes"]["visor.verdict"] == "allow"
    assert spans["nope"]["attributes"]["visor.verdict"] == "deny"
    assert spans["send_email"]["attributes"]["visor.verdict"] == "deny"
    for span in spans.values():
        assert span["attributes"]["visor.server"] == "rec"
        assert span["attributes"]["mcp.method.name"] == "tools/call"
        assert span["end"] >= span["start"] > 0
    # The question was open while the human decided: the span covers it.
    assert (
        spans["send_email"]["end"] - spans["send_email"]["start"]
        > spans["nope"]["end"] - spans["nope"]["start"]
    )
    for name in (
        "visor.requests",
        "visor.request.duration",
        "visor.evaluation.duration",
        "visor.audit.commit.duration",
        "visor.audit.fsync.duration",
        "visor.approvals.pending",
        "visor.output_index.size",
    ):
        assert name in received.metrics, (name, sorted(received.metrics))
    # Every verdict came from an evaluation: three calls, three timings (the asked one carried
    # to its end). Cumulative temporality: each export (a flush, then shutdown) repeats the total.
    counts = [p.count for m in received.metrics["visor.evaluation.duration"] for p in m.histogram.data_points]
    assert max(counts) == 3, counts
    pending_now = [p.as_int for m in received.metrics["visor.approvals.pending"] for p in m.sum.data_points]
    assert pending_now[-1] == 0


def test_without_otel_variables_nothing_is_sent(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with otlp_receiver() as (_endpoint, received):
        vp, _log, _audit = ap.start(tmp_path)
        ap.call(vp, 1, "echo", {"text": "hi"})
        ap.recv_id(vp, 1)
        vp.close_stdin()
        assert vp.wait() == 0
    assert received.paths == []
