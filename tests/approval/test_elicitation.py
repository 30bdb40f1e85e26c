"""Approval through MCP elicitation, with the real `mcp` SDK client in front of `visor run`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from tests.approval.helpers import SERVER, cli, events_for, records, wait_pending, write_policy
from tests.conftest import received


def _params(tmp_path: Path, *, timeout: int = 60, approval_dir: Path | None = None) -> StdioServerParameters:
    policy = write_policy(tmp_path, timeout)
    args = ["-m", "visor.cli", "run", "--server-name", "rec", "--policy", str(policy)]
    args += ["--audit-log", str(tmp_path / "audit.jsonl")]
    if approval_dir is not None:
        args += ["--approval-dir", str(approval_dir)]
    return StdioServerParameters(
        command=sys.executable,
        args=[*args, "--", sys.executable, str(SERVER)],
        env={
            "APPROVAL_SERVER_LOG": str(tmp_path / "received.jsonl"),
            "APPROVAL_SERVER_AUDIT": str(tmp_path / "audit.jsonl"),
            "VISOR_HOME": str(tmp_path / "home"),
        },
    )


def _calls(tmp_path: Path) -> list[bytes]:
    return [x for x in received(tmp_path / "received.jsonl") if b"tools/call" in x]


def _text(result: types.CallToolResult) -> str:
    return result.content[0].text  # type: ignore[union-attr]


async def _session(params: StdioServerParameters, callback: Any, body: Any, modern: bool = False) -> Any:
    async with stdio_client(params) as (r, w):
        kw = {"elicitation_callback": callback} if callback is not None else {}
        async with ClientSession(r, w, **kw) as s:
            if modern:
                await s.discover()
            else:
                await s.initialize()
            await s.list_tools()
            return await body(s)


def _answering(content: dict | None, action: str = "accept", seen: list | None = None) -> Any:
    async def cb(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        if seen is not None:
            seen.append(params)
        return types.ElicitResult(action=action, content=content)  # type: ignore[arg-type]

    return cb


def test_accept_and_approve_runs_the_call(tmp_path: Path) -> None:
    seen: list[Any] = []

    async def body(s: ClientSession) -> types.CallToolResult:
        return await s.call_tool("send_email", {"to": "new@example.org", "body": "hi"})

    result = anyio.run(_session, _params(tmp_path), _answering({"decision": "approve"}, seen=seen), body)
    assert not result.is_error and _text(result) == "done send_email"
    assert result.structured_content == {"audit_allow_present": True}
    (asked,) = seen
    assert "new@example.org" in asked.message and "provenance.unknown_destination" in asked.message
    props = asked.requested_schema["properties"]
    assert set(props) == {"decision", "remember"} and props["decision"]["enum"] == ["approve", "deny"]
    audit = tmp_path / "audit.jsonl"
    call_id = next(r["id"] for r in records(audit) if r["event"] == "ask")
    assert events_for(audit, call_id) == ["ask", "approve", "allow"]
    approve = next(r for r in records(audit) if r["event"] == "approve")
    assert approve["channel"] == "elicitation" and approve["detail"] == "accept"
    assert len(_calls(tmp_path)) == 1
    # Visor's own request never reached the server, nor did the client's answer to it
    assert not any(b'"visor-' in x or b'"action"' in x for x in received(tmp_path / "received.jsonl"))


@pytest.mark.parametrize(
    ("action", "content"),
    [
        ("decline", None),
        ("cancel", None),
        ("accept", {"decision": "deny"}),
        ("accept", {"decision": "yes"}),  # malformed: never an approval
    ],
)
def test_anything_but_accept_with_approve_denies(tmp_path: Path, action: str, content: dict | None) -> None:
    async def body(s: ClientSession) -> types.CallToolResult:
        return await s.call_tool("send_email", {"to": "new@example.org"})

    result = anyio.run(_session, _params(tmp_path), _answering(content, action), body)
    assert result.is_error and _text(result).startswith("Visor denied")
    assert _calls(tmp_path) == []


def test_no_answer_within_the_timeout_denies_and_withdraws_the_dialog(tmp_path: Path) -> None:
    state: dict[str, Any] = {}

    async def cb(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            state["withdrawn"] = True  # Visor sent notifications/cancelled for its request
            raise
        raise AssertionError("unreachable")

    async def body(s: ClientSession) -> types.CallToolResult:
        result = await s.call_tool("send_email", {"to": "new@example.org"})
        with anyio.fail_after(20):
            while "withdrawn" not in state:
                await anyio.sleep(0.02)
        return result

    result = anyio.run(_session, _params(tmp_path, timeout=1), cb, body)
    assert result.is_error and "approval.timeout" in _text(result)
    assert state.get("withdrawn") is True
    assert _calls(tmp_path) == []


def test_client_cancelling_the_call_withdraws_the_dialog_and_the_server_gets_nothing(tmp_path: Path) -> None:
    asked = anyio.Event()
    state: dict[str, Any] = {}

    async def cb(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            state["withdrawn"] = True
            raise
        raise AssertionError("unreachable")

    async def body(s: ClientSession) -> str:
        async with anyio.create_task_group() as tg:

            async def doomed() -> None:
                await s.call_tool("send_email", {"to": "new@example.org"})

            tg.start_soon(doomed)
            await asked.wait()
            tg.cancel_scope.cancel()  # the SDK sends notifications/cancelled for the call
        with anyio.fail_after(20):
            while "withdrawn" not in state:
                await anyio.sleep(0.02)
        await s.send_ping()  # the session is alive and in order
        return "ok"

    assert anyio.run(_session, _params(tmp_path), cb, body) == "ok"
    assert _calls(tmp_path) == []
    audit = tmp_path / "audit.jsonl"
    assert [r["rule"] for r in records(audit) if r["event"] == "deny"] == ["approval.cancelled"]


def test_pings_and_other_calls_flow_while_a_dialog_is_open(tmp_path: Path) -> None:
    release = anyio.Event()
    asked = anyio.Event()

    async def cb(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.set()
        await release.wait()
        return types.ElicitResult(action="accept", content={"decision": "approve"})

    async def body(s: ClientSession) -> list[str]:
        order: list[str] = []
        async with anyio.create_task_group() as tg:

            async def waiting() -> None:
                r = await s.call_tool("send_email", {"to": "new@example.org"})
                order.append(f"waiting:{r.is_error}")

            tg.start_soon(waiting)
            await asked.wait()
            await s.send_ping()
            order.append("ping")
            r = await s.call_tool("send_email", {"to": "boss@example.com"})
            order.append(f"trusted:{r.is_error}")
            release.set()
        return order

    assert anyio.run(_session, _params(tmp_path), cb, body) == ["ping", "trusted:False", "waiting:False"]


def test_progress_keeps_a_waiting_call_alive(tmp_path: Path) -> None:
    beats: list[tuple[float, str | None]] = []

    async def cb(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        with anyio.fail_after(20):
            while not beats:
                await anyio.sleep(0.02)
        return types.ElicitResult(action="accept", content={"decision": "approve"})

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        beats.append((p, message))

    async def body(s: ClientSession) -> types.CallToolResult:
        return await s.call_tool("send_email", {"to": "new@example.org"}, progress_callback=on_progress)

    result = anyio.run(_session, _params(tmp_path), cb, body)
    assert not result.is_error
    assert beats and "waiting for a human" in (beats[0][1] or "")


def test_a_client_without_elicitation_falls_to_the_approval_dir(tmp_path: Path) -> None:
    adir = tmp_path / "approvals"

    async def body(s: ClientSession) -> types.CallToolResult:
        async with anyio.create_task_group() as tg:
            out: list[types.CallToolResult] = []

            async def go() -> None:
                out.append(await s.call_tool("send_email", {"to": "new@example.org"}))

            tg.start_soon(go)
            (pid,) = await anyio.to_thread.run_sync(wait_pending, adir)
            done = await anyio.to_thread.run_sync(lambda: cli("approve", "--approval-dir", str(adir), pid))
            assert done.returncode == 0, done.stderr
        return out[0]

    result = anyio.run(_session, _params(tmp_path, approval_dir=adir), None, body)
    assert not result.is_error
    approve = next(r for r in records(tmp_path / "audit.jsonl") if r["event"] == "approve")
    assert approve["channel"] == "directory"


def test_a_client_without_elicitation_and_no_other_channel_is_denied(tmp_path: Path) -> None:
    async def body(s: ClientSession) -> types.CallToolResult:
        return await s.call_tool("send_email", {"to": "new@example.org"})

    result = anyio.run(_session, _params(tmp_path), None, body)
    assert result.is_error and "approval.unavailable" in _text(result)


def test_modern_protocol_skips_elicitation_and_uses_the_approval_dir(tmp_path: Path) -> None:
    """2026-07-28 over stdio: the SDK client answers elicitation/create with "method not found"."""
    adir = tmp_path / "approvals"
    seen: list[Any] = []

    async def body(s: ClientSession) -> types.CallToolResult:
        async with anyio.create_task_group() as tg:
            out: list[types.CallToolResult] = []

            async def go() -> None:
                out.append(await s.call_tool("send_email", {"to": "new@example.org"}))

            tg.start_soon(go)
            (pid,) = await anyio.to_thread.run_sync(wait_pending, adir)
            assert cli("approve", "--approval-dir", str(adir), pid).returncode == 0
        return out[0]

    params = _params(tmp_path, approval_dir=adir)
    result = anyio.run(_session, params, _answering({"decision": "approve"}, seen=seen), body, True)
    assert not result.is_error and seen == []
