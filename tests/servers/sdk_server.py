"""A small MCP server written with the SDK's MCPServer, for integration tests."""

from __future__ import annotations

import mcp.types as types
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

app = MCPServer("visor-test-server")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Weather(BaseModel):
    city: str
    celsius: float
    tags: list[str]


@app.tool()
def weather(city: str) -> Weather:
    """Structured output."""
    return Weather(city=city, celsius=21.5, tags=["sunny", "ünïcode"])


@app.tool()
def with_meta(text: str) -> types.CallToolResult:
    """A result that carries _meta and structured content."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content={"echo": text},
        _meta={"example.org/trace": {"id": 9007199254740993, "note": "kept"}},
    )


@app.tool()
async def slow_count(n: int, ctx: Context) -> str:
    """Reports progress n times."""
    for i in range(n):
        await ctx.report_progress(i + 1, n, f"step {i + 1}")
    return f"counted {n}"


class Confirm(BaseModel):
    ok: bool


@app.tool()
async def confirm(question: str, ctx: Context) -> str:
    """Asks the client through elicitation."""
    result = await ctx.elicit(question, Confirm)
    if result.action == "accept":
        return f"accepted ok={result.data.ok}"
    return result.action


@app.tool()
def fail(reason: str) -> str:
    """Always raises."""
    raise ValueError(reason)


@app.resource("memo://greeting")
def greeting() -> str:
    return "hello from a resource"


@app.prompt()
def review(code: str) -> str:
    return f"Review this: {code}"


if __name__ == "__main__":
    app.run()
