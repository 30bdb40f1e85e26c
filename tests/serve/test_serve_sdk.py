"""`visor serve` in front of the stdio SDK test server, driven by the real SDK Streamable HTTP client."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import mcp.types as types
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from tests.serve.serve_proc import SDK_SERVER, alive, serve, stdio_upstream

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
      - name: "slow_count"
        allowed: true
      - name: "confirm"
        allowed: true
      - name: "fail"
        allowed: false
"""


def _run(main: Any) -> Any:
    return asyncio.run(asyncio.wait_for(main(), 90))


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def _elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"ok": True})


def _session_ids(stderr: str) -> list[str]:
    return re.findall(r"session_opened\s+mcp_session=([0-9a-f]{32})", stderr)


def test_list_allow_progress_elicitation_and_deny_through_serve(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    with serve(tmp_path, stdio_upstream(pids), "--server-name", "sdk", policy=POLICY) as gw:

        async def main() -> dict[str, Any]:
            progress: list[float] = []

            async def on_progress(p: float, total: float | None, message: str | None) -> None:
                progress.append(p)

            async with (
                streamable_http_client(gw.url) as (r, w),
                ClientSession(r, w, elicitation_callback=_elicit) as s,
            ):
                await s.initialize()
                tools = sorted(t.name for t in (await s.list_tools()).tools)
                added = await s.call_tool("add", {"a": 2, "b": 3})
                counted = await s.call_tool("slow_count", {"n": 3}, progress_callback=on_progress)
                confirmed = await s.call_tool("confirm", {"question": "go?"})
                denied = await s.call_tool("fail", {"reason": "x"})
                return {
                    "tools": tools,
                    "added": _text(added),
                    "counted": _text(counted),
                    "progress": progress,
                    "confirmed": _text(confirmed),
                    "denied": (denied.is_error, _text(denied)),
                }

        out = _run(main)
        assert "add" in out["tools"] and "fail" in out["tools"]
        assert out["added"] == "5"
        assert out["counted"] == "counted 3" and out["progress"] == [1, 2, 3]
        assert out["confirmed"] == "accepted ok=True"
        assert out["denied"][0] is True
        sids = _session_ids(gw.stderr())
        assert len(sids) == 1
        # The allow of `add` is on disk (the commit hold fsyncs it before the server sees the call)
        # and names the MCP session, as does every record the session wrote.
        records = gw.records()
        allow = next(r for r in records if r["event"] == "allow" and r["tool"] == "add")
        assert allow["mcp_session"] == sids[0]
        # (The writer's own records, audit_open and the like, belong to the gateway's chain.)
        assert all(r["mcp_session"] == sids[0] for r in records if not r["event"].startswith("audit_"))
        deny = next(r for r in records if r["event"] == "deny")
        assert deny["tool"] == "fail" and deny["mcp_session"] == sids[0]
    # The chain verifies with the added field (it is hashed like any other).
    verify = subprocess.run(
        [sys.executable, "-m", "visor.cli", "audit", "verify", str(gw.audit)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    # The deny is the same tool error a stdio client reads from `visor run`.
    policy_file = tmp_path / "policy.yaml"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "visor.cli", "run", "--server-name", "sdk", "--policy", str(policy_file),
              "--audit-log", str(tmp_path / "stdio.jsonl"), "--", sys.executable, str(SDK_SERVER)],
        env={"VISOR_HOME": str(tmp_path / "home")},
    )  # fmt: skip

    async def stdio() -> tuple[bool, str]:
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            await s.list_tools()
            denied = await s.call_tool("fail", {"reason": "x"})
            return bool(denied.is_error), _text(denied)

    assert _run(stdio) == out["denied"]
    # The session's upstream process ended with it (the SDK client DELETEs on exit).
    for pid in map(int, pids.read_text().split()):
        assert not alive(pid)


def test_two_sessions_keep_separate_state(tmp_path: Path) -> None:
    with serve(tmp_path, stdio_upstream(tmp_path / "pids"), "--server-name", "sdk", policy=POLICY) as gw:

        async def main() -> tuple[list[bool], list[bool]]:
            async with (
                streamable_http_client(gw.url) as (r1, w1),
                ClientSession(r1, w1) as one,
                streamable_http_client(gw.url) as (r2, w2),
                ClientSession(r2, w2) as two,
            ):
                await one.initialize()
                await two.initialize()
                await one.list_tools()
                await two.list_tools()
                # `add` has a budget of 2 per session: the first session spends all of it ...
                first = [bool((await one.call_tool("add", {"a": 1, "b": i})).is_error) for i in range(3)]
                # ... and the second still has its own.
                second = [bool((await two.call_tool("add", {"a": 1, "b": i})).is_error) for i in range(3)]
                return first, second

        first, second = _run(main)
        assert first == [False, False, True]
        assert second == [False, False, True]
        sids = _session_ids(gw.stderr())
        assert len(set(sids)) == 2
        records = gw.records()
        for sid in sids:
            verdicts = [
                r["event"] for r in records if r.get("mcp_session") == sid and r["event"] in ("allow", "deny")
            ]
            assert verdicts == ["allow", "allow", "deny"]
