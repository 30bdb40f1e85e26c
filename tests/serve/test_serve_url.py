"""`visor serve --url` in front of the SDK server run with transport "streamable-http"."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp.types as types
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.serve.serve_proc import HTTP_SDK_SERVER, serve

POLICY = """\
version: "1.0"
default_action: deny
servers:
  - name: "remote"
    allowed: true
    tools:
      - name: "add"
        allowed: true
        max_calls: 1
      - name: "slow_count"
        allowed: true
      - name: "confirm"
        allowed: true
"""


@contextlib.contextmanager
def http_sdk_server() -> Iterator[str]:
    """tests/http's SDK server on a loopback socket opened here (no port race); yields its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, str(HTTP_SDK_SERVER), "--fd", str(sock.fileno())],
        pass_fds=(sock.fileno(),),
        env=dict(os.environ),
        stdin=subprocess.DEVNULL,
    )
    sock.close()
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"ok": True})


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def test_serve_url_in_front_of_an_http_sdk_server(tmp_path: Path) -> None:
    with (
        http_sdk_server() as upstream,
        serve(tmp_path, None, "--url", upstream, "--server-name", "remote", policy=POLICY) as gw,
    ):

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
                added = await s.call_tool("add", {"a": 20, "b": 22})
                over_budget = await s.call_tool("add", {"a": 1, "b": 1})
                counted = await s.call_tool("slow_count", {"n": 2}, progress_callback=on_progress)
                confirmed = await s.call_tool("confirm", {"question": "go?"})
                return {
                    "tools": tools,
                    "added": _text(added),
                    "over_budget": bool(over_budget.is_error),
                    "counted": _text(counted),
                    "progress": progress,
                    "confirmed": _text(confirmed),
                }

        out = asyncio.run(asyncio.wait_for(main(), 90))
        assert {"add", "slow_count", "confirm"} <= set(out["tools"])
        assert out["added"] == "42" and out["over_budget"] is True
        assert out["counted"] == "counted 2" and out["progress"] == [1, 2]
        assert out["confirmed"] == "accepted ok=True"
        records = gw.records()
        allow = next(r for r in records if r["event"] == "allow" and r["tool"] == "add")
        assert len(allow["mcp_session"]) == 32
        assert any(r["event"] == "deny" and r["tool"] == "add" for r in records)
