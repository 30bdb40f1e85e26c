"""Shared by the HTTP tests: the SDK server in a subprocess, and a JSON-RPC driver over HttpUpstream."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import orjson
import uvloop

from visor.http.upstream import HttpUpstream

SERVER = Path(__file__).resolve().parent / "http_sdk_server.py"
T = TypeVar("T")


@contextlib.contextmanager
def sdk_server(*flags: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """The real SDK server over streamable-http on a loopback socket opened here; yields its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--fd", str(sock.fileno()), *flags],
        pass_fds=(sock.fileno(),),
        env={**os.environ, **(env or {})},
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


def run(main: Callable[[], Awaitable[T]]) -> T:
    """Run a test's coroutine on uvloop, the loop visor run uses."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(asyncio.wait_for(main(), 60))


class Driver:
    """Raw JSON-RPC over an HttpUpstream: what the relay does, one message at a time."""

    def __init__(self, upstream: HttpUpstream) -> None:
        self.upstream = upstream
        self.messages = aiter(upstream)
        self.next_id = 1

    async def recv(self) -> dict[str, Any] | None:
        try:
            raw = await anext(self.messages)
        except StopAsyncIteration:
            return None
        assert b"\n" not in raw
        return orjson.loads(raw)

    async def call(
        self, method: str, params: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Send a request; return its response and everything the server sent before it."""
        msg_id = self.next_id
        self.next_id += 1
        await self.send(
            {
                "jsonrpc": "2.0",
                "id": msg_id,
                "method": method,
                **({"params": params} if params is not None else {}),
            }
        )
        before: list[dict[str, Any]] = []
        while True:
            msg = await self.recv()
            assert msg is not None, f"the upstream ended before answering {method}: {before}"
            if msg.get("id") == msg_id and "method" not in msg:
                return msg, before
            before.append(msg)

    async def send(self, obj: dict[str, Any]) -> None:
        await self.upstream.send(orjson.dumps(obj))

    async def initialize(self, capabilities: dict[str, Any] | None = None) -> dict[str, Any]:
        response, _ = await self.call(
            "initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": capabilities or {},
                "clientInfo": {"name": "visor-http-test", "version": "0"},
            },
        )
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return response
