"""Flow control through `visor run --url`, where the HTTP session is attached to the relay in memory
(no pipes since the link changed): a real `visor run` process, real pipes to the test's client, and
a real aiohttp server in its own process that reports what it did in files.

- A client that reads nothing while the server streams ~96 MB of events: the server is held back
  (its writes block on TCP once Visor stops reading the stream) and Visor's memory stays bounded;
  once the client reads, every event arrives in order, then the answer.
- A server that never answers initialize: Visor takes a bounded number of the client's messages
  and stops reading its stdin, instead of queueing everything it is sent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from tests.observing import read_note, rss_kib, settled, until
from tests.serve.serve_proc import INIT

POLICY = """\
version: "1.0"
default_action: deny
settings:
  session_max_calls: 0
  session_timeout_seconds: 0
servers:
  - name: "flow"
    allowed: true
    tools:
      - name: "flood"
        allowed: true
"""

SERVER = r"""
import json, os, sys
from aiohttp import web

state = sys.argv[2]

def note(name, value):
    tmp = os.path.join(state, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(str(value))
    os.replace(tmp, os.path.join(state, name))

async def mcp(request):
    if request.method == "GET":
        return web.Response(status=405)
    if request.method == "DELETE":
        return web.Response(status=200)
    msg = json.loads(await request.read())
    if "id" not in msg:
        return web.Response(status=202)
    method = msg["method"]
    if method == "initialize":
        if os.environ.get("FLOW_MUTE_INIT"):
            note("init_seen", 1)
            await request.app["never"].wait()
        result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "flow"}}
        return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "result": result},
                                 headers={"Mcp-Session-Id": "flow-1"})
    if method == "tools/list":
        tools = [{"name": "flood", "inputSchema": {"type": "object"}}]
        return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "result": {"tools": tools}})
    n = msg["params"]["arguments"]["n"]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    pad = "x" * 8000
    for i in range(n):
        event = {"jsonrpc": "2.0", "method": "notifications/message",
                 "params": {"level": "info", "data": {"seq": i, "pad": pad}}}
        await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        if i % 100 == 0:
            note("written", i)
    note("written", n)
    answer = {"jsonrpc": "2.0", "id": msg["id"], "result": {"content": [{"type": "text", "text": "flood"}]}}
    await resp.write(b"data: " + json.dumps(answer).encode() + b"\n\n")
    await resp.write_eof()
    return resp

async def make_app():
    import asyncio
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app["never"] = asyncio.Event()
    app.router.add_route("*", "/mcp", mcp)
    return app

web.run_app(make_app(), host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Stack:
    def __init__(self, tmp_path: Path, env: dict[str, str] | None = None) -> None:
        self.state = tmp_path / "state"
        self.state.mkdir()
        script = tmp_path / "flow_server.py"
        script.write_text(SERVER)
        port = _free_port()
        self.server = subprocess.Popen(
            [sys.executable, str(script), str(port), str(self.state)],
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
        )
        until(lambda: _port_open(port), "the server listens")
        policy = tmp_path / "policy.yaml"
        policy.write_text(POLICY)
        self.visor = subprocess.Popen(
            [sys.executable, "-m", "visor.cli", "run", "--server-name", "flow", "--policy", str(policy),
             "--audit-log", str(tmp_path / "audit.jsonl"), "--url", f"http://127.0.0.1:{port}/mcp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        assert self.visor.stdin is not None and self.visor.stdout is not None
        self.stdin = self.visor.stdin
        self.stdout = self.visor.stdout

    def send(self, msg: dict[str, Any]) -> None:
        self.stdin.write(json.dumps(msg).encode() + b"\n")
        self.stdin.flush()

    def recv(self) -> dict[str, Any]:
        line = self.stdout.readline()
        assert line, "visor run closed its stdout"
        return dict(json.loads(line))

    def close(self) -> None:
        for proc in (self.visor, self.server):
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_client_that_reads_nothing_holds_the_http_server_back_not_visors_memory(tmp_path: Path) -> None:
    n = 12_000
    stack = Stack(tmp_path)
    try:
        stack.send(INIT)
        assert stack.recv()["id"] == 0
        stack.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        stack.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert "tools" in stack.recv()["result"]
        rss_before = rss_kib(stack.visor.pid)
        stack.send(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "flood", "arguments": {"n": n}},
            }
        )
        until(lambda: read_note(stack.state, "written") is not None, "the server started writing")
        written = int(settled(lambda: read_note(stack.state, "written"), "the server stalled") or 0)
        assert written < n // 2, f"visor took {written} of {n} events nobody read"
        grown_mib = (rss_kib(stack.visor.pid) - rss_before) / 1024
        assert grown_mib < 80, f"visor grew by {grown_mib:.0f} MiB for a client that reads nothing"
        seqs = []
        while True:
            msg = stack.recv()
            if msg.get("id") == 2:
                break
            seqs.append(msg["params"]["data"]["seq"])
        assert seqs == list(range(n))
        assert msg["result"]["content"][0]["text"] == "flood"
        assert read_note(stack.state, "written") == str(n)
    finally:
        stack.close()


def test_a_server_that_never_answers_initialize_stops_visor_reading_the_client(tmp_path: Path) -> None:
    stack = Stack(tmp_path, env={"FLOW_MUTE_INIT": "1"})
    taken = 0
    try:
        stack.send(INIT)
        until(lambda: read_note(stack.state, "init_seen") is not None, "the server got initialize")
        line = (
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "method": "notifications/roots/list_changed",
                    "params": {"pad": "z" * 4000},
                }
            )
            + "\n"
        ).encode()
        total = 20_000  # ~80 MB: far more than any buffer on the way holds

        def flood() -> None:
            nonlocal taken
            try:
                for _ in range(total):
                    stack.stdin.write(line)
                    taken += 1
                stack.stdin.flush()
            except (BrokenPipeError, ValueError):
                pass

        writer = threading.Thread(target=flood, daemon=True)
        writer.start()
        stalled = settled(lambda: taken, "visor stopped reading its stdin")
        # Everything after initialize waits for its answer (in order, as a stdio server reads):
        # Visor holds a bounded number of lines and stops reading, so the client's writes block.
        assert stalled < total // 2, f"visor read {stalled} of {total} messages it cannot send"
        assert stack.visor.poll() is None
    finally:
        stack.close()
