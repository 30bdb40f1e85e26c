"""The bench's core floor judges as Visor does: a floor that skipped the judgement would make the
distance it measures (the gateway's own I/O layers) look larger than it is.

A real floor process in front of the real HTTP echo server, driven over HTTP: the allowed call is
answered by the server and its allow is in a valid audit chain before its result; a tool the policy
does not allow is refused with the same isError result as stdio and never reaches the server.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import uvloop

from visor.audit.verify import verify_path
from visor.bench.http_rows import McpHttp, core_floor, echo_server


def test_core_floor_allows_denies_and_audits_like_visor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VISOR_HOME", str(tmp_path / "home"))

    async def drive(url: str) -> tuple[dict[str, object], dict[str, object]]:
        client = McpHttp(url)
        try:
            await client.start()
            allowed = await client.request("tools/call", {"name": "echo", "arguments": {"text": "hello"}})
            denied = await client.request("tools/call", {"name": "rm", "arguments": {"path": "/"}})
        finally:
            await client.close()
        return allowed, denied

    with echo_server() as up, core_floor(up.url, tmp_path) as floor:
        allowed, denied = uvloop.run(drive(floor.url))

    assert allowed == {"content": [{"type": "text", "text": "hello"}]}
    assert denied["isError"] is True
    log = tmp_path / "core-floor-audit.jsonl"
    report = verify_path(log)
    assert report.ok, report.problem
    events = [(r["event"], r.get("tool")) for r in map(orjson.loads, log.read_bytes().splitlines())]
    calls = [e for e in events if e[0] in ("allow", "ask", "deny", "result")]
    assert calls == [("allow", "echo"), ("result", "echo"), ("deny", "rm")], events
