"""Approvals through `visor serve`: Visor's own elicitation on the call's SSE stream, and the approval directory."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import mcp.types as types
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.approval.helpers import POLICY, SERVER, wait_pending
from tests.serve.serve_proc import serve


def _upstream_env(tmp_path: Path, audit: Path) -> dict[str, str]:
    return {"APPROVAL_SERVER_LOG": str(tmp_path / "received.jsonl"), "APPROVAL_SERVER_AUDIT": str(audit)}


async def _call(url: str, callback: Any) -> types.CallToolResult:
    kw = {"elicitation_callback": callback} if callback is not None else {}
    async with streamable_http_client(url) as (r, w), ClientSession(r, w, **kw) as s:
        await s.initialize()
        await s.list_tools()
        return await s.call_tool("send_email", {"to": "new@example.org", "body": "hi"})


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def test_visor_asks_the_http_client_by_elicitation_and_the_yes_runs_the_call(tmp_path: Path) -> None:
    audit = tmp_path / "audit" / "serve.jsonl"
    seen: list[str] = []

    async def approve(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        seen.append(params.message)
        return types.ElicitResult(action="accept", content={"decision": "approve"})

    policy = POLICY.format(timeout=60, echo_approval="false")
    with serve(
        tmp_path, [sys.executable, str(SERVER)], "--server-name", "rec",
        policy=policy, env=_upstream_env(tmp_path, audit),
    ) as gw:  # fmt: skip
        result = asyncio.run(asyncio.wait_for(_call(gw.url, approve), 90))
        assert not result.is_error and _text(result) == "done send_email"
        # The server checked, when the call reached it, that its allow was already on disk.
        assert result.structured_content == {"audit_allow_present": True}
        assert len(seen) == 1 and "new@example.org" in seen[0]
        verdicts = ("ask", "approve", "allow", "result")
        events = [
            r["event"] for r in gw.records() if r.get("tool") == "send_email" and r["event"] in verdicts
        ]
        assert events == ["ask", "approve", "allow", "result"]
        approved = next(r for r in gw.records() if r["event"] == "approve")
        assert approved["channel"] == "elicitation" and len(approved["mcp_session"]) == 32


def test_an_approval_directory_answer_reaches_the_session_that_asked(tmp_path: Path) -> None:
    audit = tmp_path / "audit" / "serve.jsonl"
    approvals = tmp_path / "approvals"
    policy = POLICY.format(timeout=60, echo_approval="false")
    with serve(
        tmp_path, [sys.executable, str(SERVER)], "--server-name", "rec", "--approval-dir", str(approvals),
        policy=policy, env=_upstream_env(tmp_path, audit),
    ) as gw:  # fmt: skip
        outcome: list[types.CallToolResult] = []
        caller = threading.Thread(target=lambda: outcome.append(asyncio.run(_call(gw.url, None))))
        caller.start()
        (request_id,) = wait_pending(approvals)
        answer = subprocess.run(
            [sys.executable, "-m", "visor.cli", "approve", "--approval-dir", str(approvals), request_id],
            capture_output=True, text=True, timeout=60, env={"VISOR_HOME": str(tmp_path / "home")},
        )  # fmt: skip
        assert answer.returncode == 0, answer.stdout + answer.stderr
        caller.join(90)
        [result] = outcome
        assert not result.is_error and _text(result) == "done send_email"
        assert result.structured_content == {"audit_allow_present": True}
