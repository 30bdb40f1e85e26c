"""`visor serve` exports to the team's collector as `visor run` does: one span per final verdict
of every MCP session, and the metrics, turned on by the standard OTEL_* variables alone; its
`/metrics` page counts the same verdicts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.serve.serve_proc import ROOT, http, initialize, post, serve

from .otlp_receiver import otlp_receiver

pytest.importorskip("opentelemetry.sdk", reason="the 'otel' extra is part of the test extras")

MAILBOX = ROOT / "tests" / "servers" / "mailbox.py"
POLICY = """
version: "1.0"
default_action: deny
servers:
  - name: "mail"
    allowed: true
    tools:
      - name: ping
        allowed: true
"""


def _call(url: str, sid: str, rpc_id: int, tool: str) -> None:
    msg = {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": {"name": tool, "arguments": {}}}
    assert post(url, msg, sid).status == 200


def test_visor_serve_exports_a_span_per_verdict_of_every_session(tmp_path: Path) -> None:
    with otlp_receiver() as (endpoint, received):
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_METRIC_EXPORT_INTERVAL": "60000"}
        with serve(
            tmp_path, [sys.executable, str(MAILBOX)], "--server-name", "mail", policy=POLICY, env=env
        ) as gw:
            first, second = initialize(gw.url), initialize(gw.url)
            _call(gw.url, first, 1, "ping")
            _call(gw.url, second, 1, "read_inbox")  # not in the policy: denied
            page = http("GET", gw.base + "/metrics").body.decode()
        assert gw.proc.returncode == 0, gw.stderr()
    verdicts = sorted(
        (s["attributes"]["gen_ai.tool.name"], s["attributes"]["visor.verdict"]) for s in received.spans
    )
    assert verdicts == [("ping", "allow"), ("read_inbox", "deny")]
    for span in received.spans:
        assert span["attributes"]["visor.server"] == "mail"
    assert "visor.requests" in received.metrics and "visor.audit.fsync.duration" in received.metrics
    # /metrics counted the same two verdicts.
    assert 'verdict="allow"' in page and 'verdict="deny"' in page
