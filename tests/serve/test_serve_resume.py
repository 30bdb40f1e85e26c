"""A request's event stream that breaks before its answer is resumed with Last-Event-ID
(2025-11-25): the events the client missed, then the rest, then the answer, once. A real
`visor serve` in front of a real SDK stdio server; raw HTTP, so the test decides when the
connection breaks."""

from __future__ import annotations

import http.client
import json
import socket
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from tests.serve.serve_proc import ACCEPT_BOTH, initialize, serve

PACED = """\
import asyncio

from mcp.server.mcpserver import Context, MCPServer

app = MCPServer("paced")


@app.tool()
async def paced(steps: int, pause: float, ctx: Context) -> str:
    for i in range(steps):
        await ctx.report_progress(i + 1, steps, f"step {i + 1}")
        await asyncio.sleep(pause)
    return f"done after {steps}"


app.run()
"""
POLICY = 'version: "1.0"\ndefault_action: deny\nservers:\n  - name: "paced"\n    allowed: true\n'
POLICY += '    tools:\n      - name: "paced"\n        allowed: true\n'


def _events(raw: bytes) -> list[dict[str, str]]:
    events = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        fields: dict[str, str] = {}
        for line in block.decode().splitlines():
            name, _, value = line.partition(": ")
            fields[name] = value
        if "data" in fields:
            events.append(fields)
    return events


def test_a_broken_request_stream_is_resumed_with_the_events_the_client_missed(tmp_path: Path) -> None:
    script = tmp_path / "paced.py"
    script.write_text(PACED)
    with serve(tmp_path, [sys.executable, str(script)], "--server-name", "paced", policy=POLICY) as gw:
        sid = initialize(gw.url)
        parts = urlsplit(gw.url)
        call = {
            "jsonrpc": "2.0",
            "id": 41,
            "method": "tools/call",
            "params": {
                "name": "paced",
                "arguments": {"steps": 4, "pause": 0.4},
                "_meta": {"progressToken": "t"},
            },
        }
        body = json.dumps(call).encode()
        sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
        request = (
            f"POST {parts.path} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\n"
            f"Content-Type: application/json\r\nAccept: {ACCEPT_BOTH}\r\nMcp-Session-Id: {sid}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        sock.sendall(request)
        seen = b""
        while b"\n\n" not in seen.split(b"\r\n\r\n", 1)[-1] or b"id: " not in seen:
            chunk = sock.recv(65536)
            assert chunk, seen
            seen += chunk
        head, _, stream = seen.partition(b"\r\n\r\n")
        assert b"text/event-stream" in head.lower()
        first = _events(stream)[0]
        assert json.loads(first["data"])["method"] == "notifications/progress"
        sock.close()  # the stream breaks after its first event; the call runs on
        time.sleep(1.0)  # (more progress is routed meanwhile and kept for the client)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        try:
            conn.request(
                "GET",
                parts.path,
                headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid, "Last-Event-ID": first["id"]},
            )
            reply = conn.getresponse()
            assert reply.status == 200
            resumed = _events(reply.read())
        finally:
            conn.close()
    messages = [json.loads(e["data"]) for e in resumed]
    progress = [m["params"]["progress"] for m in messages if m.get("method") == "notifications/progress"]
    assert progress == [2, 3, 4], messages  # none missed, none twice
    answer = messages[-1]
    assert answer["id"] == 41 and answer["result"]["content"][0]["text"] == "done after 4"
    stream_no = first["id"].split(".")[0]
    assert [e["id"] for e in resumed] == [f"{stream_no}.{n}" for n in range(2, 2 + len(resumed))]
    assert "stream_resumed" in gw.stderr()
    allows = [r for r in gw.records() if r["event"] == "allow" and r.get("tool") == "paced"]
    assert len(allows) == 1  # one call, run once


def test_an_unknown_or_foreign_last_event_id_opens_a_plain_get_stream(tmp_path: Path) -> None:
    script = tmp_path / "paced.py"
    script.write_text(PACED)
    with serve(tmp_path, [sys.executable, str(script)], "--server-name", "paced", policy=POLICY) as gw:
        sid = initialize(gw.url)
        parts = urlsplit(gw.url)
        for bogus in ("9.1", "x.y", "1", "99999999999999.1"):
            deadline = time.monotonic() + 30
            while True:
                conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
                try:
                    headers = {"Accept": "text/event-stream", "Mcp-Session-Id": sid, "Last-Event-ID": bogus}
                    conn.request("GET", parts.path, headers=headers)
                    reply = conn.getresponse()
                    status, kind = reply.status, reply.getheader("Content-Type")
                finally:
                    conn.close()
                # 409 while the gateway has not yet seen the previous stream's client go away
                if status != 409 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            # The session's GET stream (nothing to replay): open, and waiting for messages.
            assert status == 200 and kind == "text/event-stream", (bogus, status)
