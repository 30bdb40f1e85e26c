"""Red team, telemetry and evidence: a secret the model puts in a name, not an argument.

A fooled agent chooses the tool name and a resource's URI as freely as the
arguments. The arguments are redacted before the audit log, stderr and the
telemetry see them, and so is a verdict's reason that quotes them; the same
secret spelled as the tool name (or the URI of a denied read, or a prompt's
name) must not reach the log, the stderr line or the spans sent to a collector
either. Through a real `visor run`, a real server and a real OTLP receiver.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import VisorProcess
from tests.servers.leaky import AWS_ID, GITHUB

from .otlp_receiver import otlp_receiver

pytest.importorskip("opentelemetry.sdk", reason="the 'otel' extra is part of the test extras")

LEAKY = Path(__file__).parents[1] / "servers" / "leaky.py"
POLICY = """\
version: "1.0"
default_action: deny
servers:
  - name: "leaky"
    allowed: true
    resources:
      deny: ["secret://**"]
    prompts:
      deny: ["forbidden-*"]
    tools:
      - {name: echo, allowed: true}
"""


def test_a_secret_spelled_as_a_name_reaches_no_evidence_and_no_collector(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    audit = tmp_path / "audit.jsonl"
    with otlp_receiver() as (endpoint, received):
        vp = VisorProcess(
            [sys.executable, str(LEAKY)],
            env={
                "LEAKY_LOG": str(tmp_path / "received.jsonl"),
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                "OTEL_METRIC_EXPORT_INTERVAL": "60000",
            },
            visor_args=["--server-name", "leaky", "--policy", str(policy), "--audit-log", str(audit)],
        )
        vp.request({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
        assert "tools" in vp.recv()["result"]
        calls = [
            ("tools/call", {"name": GITHUB, "arguments": {}}),
            ("tools/call", {"name": f"send {AWS_ID}", "arguments": {"to": GITHUB}}),
            ("resources/read", {"uri": f"secret://vault/{GITHUB}"}),
            ("prompts/get", {"name": f"forbidden-{AWS_ID}", "arguments": {}}),
        ]
        for i, (method, params) in enumerate(calls, start=1):
            vp.request({"jsonrpc": "2.0", "id": i, "method": method, "params": params})
            answer = vp.recv()
            assert answer["id"] == i
            assert answer.get("error") or answer["result"]["isError"] is True  # every one denied
        vp.close_stdin()
        assert vp.wait() == 0

    log = audit.read_text()
    denies = [r for r in map(json.loads, log.splitlines()) if r["event"] == "deny"]
    assert len(denies) == 4
    assert [r.get("tool") for r in denies[:2]] == [
        "[REDACTED:github_token]",
        "send [REDACTED:aws_access_key_id]",
    ]
    assert len(received.spans) == 4
    shown = {
        "audit log": log,
        "stderr": vp.stderr,
        "spans": json.dumps(received.spans, default=str),
    }
    for where, text in shown.items():
        for secret in (GITHUB, AWS_ID):
            assert secret not in text, f"{secret} reached the {where}"


def test_a_huge_tool_name_is_bounded_in_telemetry_as_in_the_log(tmp_path: Path) -> None:
    """The audit log keeps no string over 4096 bytes (a digest and size instead); a span took the
    name whole: a model could fill the exporter's queue and batches with megabytes per call, and a
    collector that refuses the oversized batch drops the real spans in it too."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    audit = tmp_path / "audit.jsonl"
    huge = "x" * (1 << 20)
    with otlp_receiver() as (endpoint, received):
        vp = VisorProcess(
            [sys.executable, str(LEAKY)],
            env={
                "LEAKY_LOG": str(tmp_path / "received.jsonl"),
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                "OTEL_METRIC_EXPORT_INTERVAL": "60000",
            },
            visor_args=["--server-name", "leaky", "--policy", str(policy), "--audit-log", str(audit)],
        )
        vp.request({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
        assert "tools" in vp.recv()["result"]
        vp.request(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": huge, "arguments": {}}}
        )
        assert vp.recv()["result"]["isError"] is True
        vp.request(
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {}}}
        )
        assert "isError" not in vp.recv()["result"]
        vp.close_stdin()
        assert vp.wait() == 0

    # The deny's line on stderr (the client's log of the server) is bounded too.
    assert huge[:200] not in vp.stderr and len(vp.stderr) < 64 * 1024
    (deny,) = [r for r in map(json.loads, audit.read_text().splitlines()) if r["event"] == "deny"]
    assert "tool" not in deny and deny["omitted"]["tool"]["bytes"] == 1 << 20
    assert sorted(s["attributes"]["visor.verdict"] for s in received.spans) == ["allow", "deny"]
    for span in received.spans:
        assert len(span["name"]) <= 4096 + 64
        assert all(len(str(v)) <= 4096 + 64 for v in span["attributes"].values())
    (denied,) = [s for s in received.spans if s["attributes"]["visor.verdict"] == "deny"]
    assert deny["omitted"]["tool"]["sha256"] in denied["attributes"]["gen_ai.tool.name"]
