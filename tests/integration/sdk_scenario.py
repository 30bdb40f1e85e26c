"""One client scenario, run directly and through `visor run`, so results can be compared."""

from __future__ import annotations

import sys
from typing import Any

import anyio
import mcp.types as types
from mcp import ClientSession, StdioServerParameters, stdio_client


def visor_params(
    server: list[str], visor_args: list[str] | None = None, env: dict | None = None
) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "visor.cli", "run", *(visor_args or []), "--", *server],
        env=env,
    )


def direct_params(server: list[str], env: dict | None = None) -> StdioServerParameters:
    return StdioServerParameters(command=server[0], args=server[1:], env=env)


async def _elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"ok": True})


def dump(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


async def sdk_server_scenario(params: StdioServerParameters, modern: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append((p, total, message))

    async with stdio_client(params) as (r, w), ClientSession(r, w, elicitation_callback=_elicit) as s:
        if modern:
            # Protocol 2026-07-28: no handshake; every request carries its envelope in _meta.
            found = await s.discover()
            out["server"] = found.meta["io.modelcontextprotocol/serverInfo"]["name"]  # type: ignore[index]
        else:
            init = await s.initialize()
            out["server"] = init.server_info.name
        tools = await s.list_tools()
        out["tools"] = sorted(t.name for t in tools.tools)
        out["tool_defs"] = [dump(t) for t in sorted(tools.tools, key=lambda t: t.name)]
        out["add"] = dump(await s.call_tool("add", {"a": 2, "b": 40}))
        out["weather"] = dump(await s.call_tool("weather", {"city": "Zürich"}))
        out["with_meta"] = dump(await s.call_tool("with_meta", {"text": "hi"}))
        out["slow_count"] = dump(await s.call_tool("slow_count", {"n": 3}, progress_callback=on_progress))
        if not modern:
            # Stdio in the modern revision has no back-channel for server requests.
            out["confirm"] = dump(await s.call_tool("confirm", {"question": "proceed?"}))
        out["fail"] = dump(await s.call_tool("fail", {"reason": "boom"}))
        out["resources"] = [str(r.uri) for r in (await s.list_resources()).resources]
        out["resource"] = dump(await s.read_resource("memo://greeting"))
        out["prompt"] = dump(await s.get_prompt("review", {"code": "x = 1"}))
        if not modern:
            await s.send_ping()
    out["progress"] = progress
    return out


def run(coro: Any) -> Any:
    return anyio.run(lambda: coro)
