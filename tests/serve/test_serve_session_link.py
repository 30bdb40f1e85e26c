"""The link between a gateway session and its relay (in memory since the pipes went): flow control
both ways and the end of each side, through a real `visor serve` and a real stdio server process.

The server is a small raw JSON-RPC script written per test: it floods, stalls, quits or dies on
command, and reports what it did in files, so that the tests read what happened rather than time it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from http.client import HTTPConnection
from pathlib import Path
from urllib.parse import urlsplit

from tests.observing import read_note, rss_kib, settled, until
from tests.serve.serve_proc import ACCEPT_BOTH, INIT, alive, http, initialize, post, serve

POLICY = """\
version: "1.0"
default_action: deny
settings:
  session_max_calls: 0
  session_timeout_seconds: 0
servers:
  - name: "link"
    allowed: true
    tools:
      - name: "flood"
        allowed: true
      - name: "stall"
        allowed: true
      - name: "quit"
        allowed: true
      - name: "die"
        allowed: true
"""

SERVER = r"""
import json, os, signal, sys, time

state = os.environ["LINK_STATE"]
resumed = False

def note(name, value):
    tmp = os.path.join(state, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(str(value))
    os.replace(tmp, os.path.join(state, name))

def on_usr1(signum, frame):
    global resumed
    resumed = True

signal.signal(signal.SIGUSR1, on_usr1)
note("pid", os.getpid())
out = sys.stdout.buffer
tools = [{"name": n, "inputSchema": {"type": "object"}} for n in ("flood", "stall", "quit", "die")]
notes = 0
while True:
    line = sys.stdin.buffer.readline()
    if not line:
        note("eof", "stdin closed")
        sys.exit(0)
    msg = json.loads(line)
    method = msg.get("method")
    if "id" not in msg:
        if method == "notifications/roots/list_changed":
            notes += 1
            note("notes", notes)
        continue
    result = {}
    if method == "initialize":
        result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "link"}}
    elif method == "tools/list":
        result = {"tools": tools}
    elif method == "tools/call":
        name = msg["params"]["name"]
        if name == "flood":
            n = msg["params"]["arguments"]["n"]
            pad = "x" * 8000
            for i in range(n):
                event = {"jsonrpc": "2.0", "method": "notifications/message",
                         "params": {"level": "info", "data": {"seq": i, "pad": pad}}}
                out.write(json.dumps(event).encode() + b"\n")
                if i % 100 == 0:
                    out.flush()
                    note("written", i)
            out.flush()
            note("written", n)
        elif name == "die":
            os._exit(3)
        result = {"content": [{"type": "text", "text": name}]}
    out.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}).encode() + b"\n")
    out.flush()
    if method == "tools/call" and msg["params"]["name"] == "quit":
        note("quit", "answered")
        sys.exit(0)
    if method == "tools/call" and msg["params"]["name"] == "stall":
        # Stops reading stdin until SIGUSR1: its pipe fills, and the gateway must hold the client back.
        while not resumed:
            time.sleep(0.05)
"""


def _gateway(tmp_path: Path):  # type: ignore[no-untyped-def]
    state = tmp_path / "state"
    state.mkdir()
    script = tmp_path / "link_server.py"
    script.write_text(SERVER)
    gw = serve(
        tmp_path,
        [sys.executable, str(script)],
        "--server-name",
        "link",
        policy=POLICY,
        env={"LINK_STATE": str(state)},
    )
    return gw, state


def _call(name: str, rpc_id: int, **arguments: object) -> dict[str, object]:
    params = {"name": name, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": params}


def _listed(url: str, sid: str) -> None:
    reply = post(url, {"jsonrpc": "2.0", "id": 100, "method": "tools/list"}, sid)
    assert reply.status == 200 and "tools" in reply.json()["result"], reply


def test_a_slow_http_client_stalls_the_server_not_the_gateways_memory(tmp_path: Path) -> None:
    """A server that answers a call with ~96 MB of notifications, to a client that reads none of
    them: the gateway stops reading the server (it blocks on its full stdout) instead of queueing
    everything; once the client reads, every message arrives, in order, then the answer."""
    n = 12_000
    gw_cm, state = _gateway(tmp_path)
    with gw_cm as gw:
        sid = initialize(gw.url)
        _listed(gw.url, sid)
        rss_before = rss_kib(gw.proc.pid)
        parts = urlsplit(gw.url)
        conn = HTTPConnection(parts.hostname, parts.port, timeout=300)
        try:
            headers = {"Content-Type": "application/json", "Accept": ACCEPT_BOTH, "Mcp-Session-Id": sid}
            conn.request("POST", parts.path, body=json.dumps(_call("flood", 1, n=n)), headers=headers)
            # Nothing read yet: the server writes until the gateway stops taking its output.
            until(lambda: read_note(state, "written") is not None, "the server started writing")
            written = int(settled(lambda: read_note(state, "written"), "the server stalled") or 0)
            assert written < n // 2, f"the gateway took {written} of {n} messages nobody read"
            grown_mib = (rss_kib(gw.proc.pid) - rss_before) / 1024
            assert grown_mib < 80, f"the gateway grew by {grown_mib:.0f} MiB for a client that reads nothing"
            # Now the client reads: everything comes, in order, and the answer last.
            response = conn.getresponse()
            assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"
            body = response.read()
        finally:
            conn.close()
        events = [json.loads(line[5:]) for line in body.split(b"\n") if line.startswith(b"data:")]
        seqs = [e["params"]["data"]["seq"] for e in events[:-1]]
        assert seqs == list(range(n))
        assert events[-1]["id"] == 1 and events[-1]["result"]["content"][0]["text"] == "flood"
        assert read_note(state, "written") == str(n)


def test_a_server_that_stops_reading_holds_the_client_back(tmp_path: Path) -> None:
    """The server stops reading its stdin: the gateway takes a bounded number of the client's
    notifications (its POSTs answered 202) and holds the rest, then delivers every one once the
    server reads again."""
    total = 40
    gw_cm, state = _gateway(tmp_path)
    with gw_cm as gw:
        sid = initialize(gw.url)
        _listed(gw.url, sid)
        assert post(gw.url, _call("stall", 1), sid).status == 200
        pad = "y" * (512 * 1024)
        note = {"jsonrpc": "2.0", "method": "notifications/roots/list_changed", "params": {"pad": pad}}
        accepted: list[int] = []

        def send() -> None:
            reply = post(gw.url, note, sid)
            accepted.append(reply.status)

        threads = [threading.Thread(target=send) for _ in range(total)]
        for t in threads:
            t.start()
        try:
            taken = settled(lambda: len(accepted), "the gateway stopped taking notifications")
            assert taken is not None and taken < total // 2, (
                f"{taken} of {total} taken by a server that reads none"
            )
        finally:
            os.kill(int(read_note(state, "pid") or 0), signal.SIGUSR1)
            for t in threads:
                t.join(120)
        assert accepted == [202] * total
        until(lambda: read_note(state, "notes") == str(total), "the server read every notification")


def test_delete_is_the_servers_end_of_input(tmp_path: Path) -> None:
    """The client's end (DELETE) reaches the server as EOF on its stdin; it exits on its own."""
    gw_cm, state = _gateway(tmp_path)
    with gw_cm as gw:
        sid = initialize(gw.url)
        _listed(gw.url, sid)
        pid = int(read_note(state, "pid") or 0)
        assert http("DELETE", gw.url, None, {"Mcp-Session-Id": sid}).status == 200
        assert read_note(state, "eof") == "stdin closed"
        assert not alive(pid)
        assert post(gw.url, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, sid).status == 404


def test_a_server_that_exits_after_answering_ends_the_session_with_its_answer_delivered(
    tmp_path: Path,
) -> None:
    """The server's end: what it wrote last is delivered, then the session is gone (404), and a
    new session gets a new server."""
    gw_cm, state = _gateway(tmp_path)
    with gw_cm as gw:
        sid = initialize(gw.url)
        _listed(gw.url, sid)
        reply = post(gw.url, _call("quit", 1), sid)
        assert reply.status == 200 and reply.json()["result"]["content"][0]["text"] == "quit"
        until(
            lambda: post(gw.url, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, sid).status == 404,
            "the session ended with its server",
        )
        assert read_note(state, "eof") is None  # it ended by itself, not for lack of input
        other = initialize(gw.url)
        _listed(gw.url, other)


def test_a_server_that_dies_mid_call_fails_the_call_not_the_gateway(tmp_path: Path) -> None:
    gw_cm, _state = _gateway(tmp_path)
    with gw_cm as gw:
        sid = initialize(gw.url)
        _listed(gw.url, sid)
        reply = post(gw.url, _call("die", 1), sid)
        assert reply.status == 502, reply
        assert reply.json()["error"]["message"] == "the session ended before the answer"
        assert post(gw.url, INIT).status == 200
