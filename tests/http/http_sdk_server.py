"""The SDK's MCPServer served over Streamable HTTP (transport "streamable-http"), for tests.

Usage: python http_sdk_server.py --fd N [--json] [--event-store] [--retry-ms MS] [--token-env VAR]

It serves on a listening socket the test opened and passed down (no port race, no readiness
wait: connections queue in the backlog until uvicorn accepts them). --token-env names an
environment variable holding a bearer token every request must present (401 otherwise).
"""

from __future__ import annotations

import argparse
import os
import socket
from typing import Annotated, Any

import anyio
import mcp.types as types
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from pydantic import BaseModel, Field

app = MCPServer("visor-http-test-server")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool()
async def slow_count(n: int, ctx: Context) -> str:
    """Reports progress n times, then answers."""
    for i in range(n):
        await ctx.report_progress(i + 1, n, f"step {i + 1}")
    return f"counted {n}"


@app.tool()
async def break_then_finish(n: int, ctx: Context) -> str:
    """Reports progress, closes its own SSE connection, then reports more and answers.

    With an event store the client must resume with Last-Event-ID to see the rest.
    """
    await ctx.report_progress(1, n + 1, "before the break")
    await ctx.close_sse_stream()
    await anyio.sleep(0.2)
    for i in range(n):
        await ctx.report_progress(i + 2, n + 1, f"after the break {i + 1}")
    return f"finished after the break ({n})"


class Confirm(BaseModel):
    ok: bool


@app.tool()
async def confirm(question: str, ctx: Context) -> str:
    """Asks the client through elicitation (a server-to-client request on the stream)."""
    result = await ctx.elicit(question, Confirm)
    if result.action == "accept":
        return f"accepted ok={result.data.ok}"
    return result.action


@app.tool()
async def sleep_for(seconds: float, ctx: Context) -> str:
    """Reports that it started, then sleeps; when cancelled, says so in the file $SLEEP_CANCELLED_FILE names."""
    await ctx.report_progress(0, 1, "started")
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        marker = os.environ.get("SLEEP_CANCELLED_FILE")
        if marker:
            with open(marker, "w") as f:
                f.write("cancelled")
        raise
    return f"slept {seconds}"


@app.tool()
def locate(
    region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})],
    limit: Annotated[int, Field(json_schema_extra={"x-mcp-header": "Limit"})] = 1,
) -> str:
    """Arguments the 2026-07-28 transport mirrors into Mcp-Param-* headers."""
    return f"{region}:{limit}"


@app.tool()
def fail(reason: str) -> str:
    """Always raises."""
    raise ValueError(reason)


class MemoryEventStore(EventStore):
    """Every event kept in order, so a broken stream can be replayed from any id."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []

    async def store_event(self, stream_id: str, message: types.JSONRPCMessage | None) -> str:
        event_id = f"ev-{len(self.events) + 1}"
        self.events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> str | None:
        index = next((i for i, (eid, _, _) in enumerate(self.events) if eid == last_event_id), None)
        if index is None:
            return None
        stream_id = self.events[index][1]
        for eid, sid, message in self.events[index + 1 :]:
            if sid == stream_id and message is not None:
                await send_callback(EventMessage(message, eid))
        return stream_id


class RequireBearer:
    """ASGI middleware: 401 with a Bearer challenge unless the token is presented."""

    def __init__(self, inner: Any, token: str) -> None:
        self.inner = inner
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != self.expected:
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [(b"www-authenticate", b'Bearer realm="visor-test", error="invalid_token"')],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        await self.inner(scope, receive, send)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--event-store", action="store_true")
    parser.add_argument("--retry-ms", type=int)
    parser.add_argument("--token-env")
    args = parser.parse_args()
    asgi: Any = app.streamable_http_app(
        json_response=args.json,
        event_store=MemoryEventStore() if args.event_store else None,
        retry_interval=args.retry_ms,
    )
    if args.token_env:
        asgi = RequireBearer(asgi, os.environ[args.token_env])
    sock = socket.socket(fileno=args.fd)
    server = uvicorn.Server(uvicorn.Config(asgi, log_level="warning", lifespan="on"))
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
