"""`GET /metrics` of `visor serve`, scraped after real traffic from the SDK client."""

from __future__ import annotations

import asyncio
import re
import resource
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.serve.serve_proc import http, serve, stdio_upstream
from visor.serve.command import connection_cap

POLICY = """\
version: "1.0"
default_action: deny
servers:
  - name: "sdk"
    allowed: true
    tools:
      - name: "add"
        allowed: true
        max_calls: 2
      - name: "fail"
        allowed: false
"""
TOKEN = "metrics-token-0123456789abcdef"
# One sample line of the text format: name, optional labels, a number.
SAMPLE = re.compile(r'^([a-z_]+)(\{(?:[a-z_]+="[^"\\\n]*",?)*\})? (-?[0-9.e+-]+|\+Inf)$')


def scrape(url: str, **headers: str) -> dict[str, float]:
    reply = http("GET", url.removesuffix("/mcp") + "/metrics", headers=headers)
    assert reply.status == 200, reply
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, float] = {}
    for line in reply.body.decode().splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        m = SAMPLE.match(line)
        assert m is not None, f"not a sample line: {line!r}"
        samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return samples


def test_metrics_count_verdicts_sessions_and_audit_latency(tmp_path: Path) -> None:
    with serve(tmp_path, stdio_upstream(tmp_path / "pids"), "--server-name", "sdk", policy=POLICY) as gw:
        before = scrape(gw.url)
        assert before["visor_sessions_open"] == 0
        assert not any(k.startswith("visor_requests_total") for k in before)

        async def main() -> dict[str, float]:
            async with streamable_http_client(gw.url) as (r, w), ClientSession(r, w) as s:
                await s.initialize()
                for _ in range(3):  # two allowed, the third over the budget
                    await s.call_tool("add", {"a": 1, "b": 2})
                await s.call_tool("fail", {"reason": "x"})
                return await asyncio.to_thread(scrape, gw.url)

        during = asyncio.run(asyncio.wait_for(main(), 90))
        after = scrape(gw.url)

    assert during["visor_sessions_open"] == 1
    assert during['visor_requests_total{verdict="allow",method="tools/call"}'] == 2
    assert during['visor_requests_total{verdict="deny",method="tools/call"}'] == 2
    assert during["visor_approvals_pending"] == 0
    # every allow was committed (durable) and at least one fsync was timed
    assert during["visor_audit_commit_seconds_count"] == 2
    assert during['visor_audit_commit_seconds_bucket{le="+Inf"}'] == 2
    assert during["visor_audit_fsync_seconds_count"] >= 1
    assert during["visor_audit_fsync_seconds_sum"] > 0
    assert during['visor_http_requests_total{method="POST",status="200"}'] >= 5
    # the session ended when the client closed it (DELETE)
    assert after["visor_sessions_open"] == 0
    assert after['visor_http_requests_total{method="DELETE",status="200"}'] == 1
    buckets = [v for k, v in after.items() if k.startswith("visor_audit_fsync_seconds_bucket")]
    assert buckets == sorted(buckets)  # cumulative


def test_metrics_need_the_client_token_when_one_is_set(tmp_path: Path) -> None:
    with serve(
        tmp_path,
        stdio_upstream(tmp_path / "pids"),
        "--client-token-env",
        "SERVE_TOKEN",
        env={"SERVE_TOKEN": TOKEN},
    ) as gw:
        base = gw.url.removesuffix("/mcp")
        missing = http("GET", base + "/metrics")
        assert missing.status == 401
        assert b"visor_" not in missing.body
        assert http("GET", base + "/metrics", headers={"Authorization": f"Bearer {TOKEN}x"}).status == 401
        scraped: dict[str, Any] = scrape(gw.url, Authorization=f"Bearer {TOKEN}")
        assert scraped["visor_sessions_open"] == 0
        # and Origin is checked as on /mcp
        foreign = http(
            "GET",
            base + "/metrics",
            headers={"Authorization": f"Bearer {TOKEN}", "Origin": "http://evil.test"},
        )
        assert foreign.status == 403


def test_the_page_of_several_workers_labels_each_and_refuses_a_malformed_snapshot() -> None:
    # Pure: what a worker answering a scrape does with the others' figures (visor/serve/metrics.py).
    import pytest

    from visor.serve.metrics import GatewayMetrics, render

    one, two = GatewayMetrics(), GatewayMetrics()
    for m, verdict in ((one, "allow"), (two, "allow"), (two, 'de"ny\n')):
        m.gated(
            method="tools/call", tool="t", verdict=verdict, rule="r", start_ns=0, end_ns=1, evaluation_s=None
        )
    one.committed(0.0003)
    page = render([(0, one.snapshot(sessions_open=1)), (1, two.snapshot(sessions_open=2))])
    lines = page.splitlines()
    assert 'visor_requests_total{worker="0",verdict="allow",method="tools/call"} 1' in lines
    assert 'visor_requests_total{worker="1",verdict="de\\"ny\\n",method="tools/call"} 1' in lines
    assert 'visor_sessions_open{worker="1"} 2' in lines
    assert 'visor_audit_commit_seconds_bucket{worker="0",le="0.0005"} 1' in lines
    assert 'visor_audit_commit_seconds_count{worker="1"} 0' in lines
    assert "visor_workers_reporting 2" in lines
    assert sum(1 for ln in lines if ln == "# TYPE visor_requests_total counter") == 1
    # one process: no worker label, no reporting gauge
    alone = render([(None, one.snapshot(sessions_open=1))]).splitlines()
    assert "visor_sessions_open 1" in alone and not any("worker" in ln for ln in alone)
    broken = one.snapshot(sessions_open=1)
    broken["commit"] = {"counts": [1], "count": 1, "total": 0.1}  # other buckets
    with pytest.raises(ValueError):
        render([(0, broken)])
    with pytest.raises(KeyError):
        render([(0, {"verdicts": []})])


def test_connections_over_the_cap_are_refused_and_counted(tmp_path: Path) -> None:
    # One session with one request in flight: the cap is 1 x (1 + 1) + 64 = 66 connections.
    with serve(
        tmp_path, stdio_upstream(tmp_path / "pids"), "--max-sessions", "1", "--max-in-flight", "1"
    ) as gw:
        host, port = gw.url.removeprefix("http://").split("/")[0].rsplit(":", 1)
        held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(66)]
        try:
            # Until the server has taken all 66, one more is taken too (and says nothing): it is
            # dropped and another tried. Past the cap the answer comes unasked.
            deadline = time.monotonic() + 30
            while True:
                over = socket.create_connection((host, int(port)), timeout=2)
                try:
                    answer = over.recv(4096)
                except TimeoutError:
                    answer = b""
                finally:
                    over.close()
                if answer.startswith(b"HTTP/1.1 503 "):
                    break
                assert time.monotonic() < deadline, answer
            assert b"too many connections" in answer and b"Connection: close" in answer
            held.pop().close()
            for _ in range(100):  # the closed one is seen gone, then a scrape gets in
                try:
                    scraped = scrape(gw.url)
                    break
                except (AssertionError, OSError):  # refused: a 503, or a reset before it
                    time.sleep(0.1)
            else:
                raise AssertionError("no scrape was let in after a held connection closed")
        finally:
            for sock in held:
                sock.close()
    assert scraped["visor_http_connections_refused_total"] >= 1
    assert 65 <= scraped["visor_http_connections_open"] <= 66


def test_the_gateway_connection_limit_follows_its_sessions_within_the_descriptor_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def soft_limit(soft: int) -> None:
        monkeypatch.setattr(resource, "getrlimit", lambda _: (soft, resource.RLIM_INFINITY))

    soft_limit(1_000_000)
    # each session's requests in flight and its event stream, and room for clients arriving
    assert connection_cap(64, 64) == 64 * 65 + 64
    assert connection_cap(1, 1) == 66
    soft_limit(resource.RLIM_INFINITY)
    assert connection_cap(1000, 100) == 1000 * 101 + 64
    soft_limit(1024)  # half the descriptors at most
    assert connection_cap(64, 64) == 512
    soft_limit(20)  # and never fewer than 64
    assert connection_cap(64, 64) == 64
