"""`visor serve --workers 2`: two processes on one port, every session kept with the worker that
opened it (requests that land on the other worker are forwarded), one audit chain per worker, and
a supervisor that restarts a killed worker, passes SIGHUP on and leaves no process behind."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.serve.serve_proc import ACCEPT_BOTH, READY, ROOT, Reply, Serve, alive, initialize, post, serve
from tests.state.redis_server import MISSING, RedisServer

# Every tool says which process answered and which process started it: a session's upstream is a
# child of the worker that owns the session.
PID_SERVER = """\
import os

from mcp.server.mcpserver import Context, MCPServer

app = MCPServer("pid-server")


@app.tool()
def whoami() -> str:
    return f"{os.getpid()} {os.getppid()}"


@app.tool()
async def count(n: int, ctx: Context) -> str:
    for i in range(n):
        await ctx.report_progress(i + 1, n)
    return f"{os.getpid()} counted {n}"


app.run()
"""

POLICY = """\
version: "1.0"
default_action: deny
servers:
  - name: "sdk"
    allowed: true
    tools:
      - name: "whoami"
        allowed: true
      - name: "count"
        allowed: true
"""


def _upstream(tmp_path: Path) -> list[str]:
    script = tmp_path / "pid_server.py"
    script.write_text(PID_SERVER)
    pids = tmp_path / "pids"
    return ["sh", "-c", f'echo $$ >> "{pids}"; exec "{sys.executable}" "{script}"']


@contextlib.contextmanager
def _workers(tmp_path: Path, *options: str, policy: str = POLICY) -> Iterator[Serve]:
    with serve(
        tmp_path, _upstream(tmp_path), "--workers", "2", "--server-name", "sdk", "--log-format", "json",
        *options, policy=policy,
    ) as gw:  # fmt: skip
        yield gw


def _events(gw: Serve, name: str) -> list[dict[str, Any]]:
    out = []
    for line in list(gw.lines):
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("event") == name:
                out.append(event)
    return out


def _worker_pids(gw: Serve) -> dict[int, int]:
    """The pid of each worker's latest life, from the supervisor's log."""
    return {e["worker"]: e["pid"] for e in _events(gw, "worker_ready")}


def _log(gw: Serve, index: int) -> Path:
    return gw.audit.with_name(f"serve.worker-{index}.jsonl")


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def _verify(path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "visor.cli", "audit", "verify", str(path)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def _wait_for(what: str, check: Any, timeout: float = 60.0) -> Any:
    """Poll until `check()` is truthy; the deadline only turns a hang into a failure."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.1)


def _owner(sid: str) -> int:
    hexpart, dash, index = sid.rpartition(".")[2].rpartition("-")
    assert dash and len(hexpart) == 32 and int(hexpart, 16) >= 0, sid
    return int(index)


def _sessions_on_both(url: str) -> dict[int, str]:
    """A session of each worker, opened through the shared port (a new connection each time, so
    the kernel hands them to both workers)."""
    found: dict[int, str] = {}
    for _ in range(60):
        sid = initialize(url)
        found.setdefault(_owner(sid), sid)
        if len(found) == 2:
            return found
    raise AssertionError(f"60 connections all went to worker(s) {sorted(found)}")


def _call(name: str, arguments: dict[str, Any], rpc_id: int = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }


def _text(reply: Reply) -> str:
    body = reply.json()
    assert "result" in body and not body["result"].get("isError"), body
    text: str = body["result"]["content"][0]["text"]
    return text


class _UnixHTTP(http.client.HTTPConnection):
    """HTTP to one worker's private socket (the Host header still names the public port)."""

    def __init__(self, path: Path, host: str) -> None:
        super().__init__(host, timeout=30)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.connect(str(self._path))
        self.sock = sock


def _via(
    path: Path,
    gw: Serve,
    method: str,
    headers: dict[str, str],
    body: bytes | None = None,
    *,
    at: str = "/mcp",
) -> Reply:
    conn = _UnixHTTP(path, gw.base.removeprefix("http://"))
    try:
        conn.request(method, at, body=body, headers=headers)
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def _post_via(path: Path, gw: Serve, message: Any, sid: str) -> Reply:
    headers = {"Content-Type": "application/json", "Accept": ACCEPT_BOTH, "Mcp-Session-Id": sid}
    return _via(path, gw, "POST", headers, json.dumps(message).encode())


# ---------------------------------------------------------------------------------------------


def test_sessions_stay_with_their_owner_through_the_shared_port(tmp_path: Path) -> None:
    with _workers(tmp_path, "--log-level", "debug") as gw:
        workers = _worker_pids(gw)
        assert sorted(workers) == [0, 1]

        async def one_client() -> tuple[str, list[str]]:
            sids: list[str] = []

            async def seen(response: httpx2.Response) -> None:
                if sid := response.headers.get("mcp-session-id"):
                    sids.append(sid)

            # No connection reuse: every POST (and the GET stream) is a new connection, which the
            # kernel hands to either worker.
            client = httpx2.AsyncClient(
                timeout=httpx2.Timeout(30, read=300),  # the SDK's own defaults
                limits=httpx2.Limits(max_keepalive_connections=0),
                event_hooks={"response": [seen]},
            )
            async with (
                client,
                streamable_http_client(gw.url, http_client=client) as (r, w),
                ClientSession(r, w) as s,
            ):
                await s.initialize()
                await s.list_tools()
                answers = []
                for _ in range(4):
                    result = await s.call_tool("whoami", {})
                    block = result.content[0]
                    assert isinstance(block, types.TextContent) and not result.is_error
                    answers.append(block.text)
            assert len(set(sids)) == 1, sids
            return sids[0], answers

        async def main() -> list[tuple[str, list[str]]]:
            results: list[tuple[str, list[str]]] = []
            # Until both workers own sessions (the kernel picks the worker for each connection).
            for _ in range(8):
                results += await asyncio.gather(*(one_client() for _ in range(4)))
                if len({_owner(sid) for sid, _ in results}) == 2:
                    break
            return results

        results = asyncio.run(asyncio.wait_for(main(), 240))
        assert {_owner(sid) for sid, _ in results} == {0, 1}
        for sid, answers in results:
            # Every call of a session answered by one upstream process, a child of its owner.
            assert len(set(answers)) == 1, (sid, answers)
            _pid, parent = map(int, answers[0].split())
            assert parent == workers[_owner(sid)], (sid, answers, workers)
        # Requests did land on the worker that does not own their session, and were forwarded.
        forwarded = _events(gw, "request_forwarded")
        posts = [e for e in forwarded if e["method"] == "POST"]
        assert posts and all(e["status"] in (200, 202) for e in posts), posts[:5]
        # The SDK client's GET stream may reconnect as it closes, after its DELETE ended the session
        # on the owner: that GET's 404 is the owner's true answer, forwarded as it was.
        gets = [e for e in forwarded if e["method"] == "GET"]
        assert all(e["status"] in (200, 404) for e in gets), gets[:5]
        closed = {e["mcp_session"] for e in _events(gw, "session_closed")}
        assert all(e["mcp_session"] in closed for e in gets if e["status"] == 404), (gets, closed)
        assert all(e["worker"] != e["owner"] == _owner(e["mcp_session"]) for e in forwarded), forwarded[:5]
        # Each worker's log lines say which worker wrote them.
        opened = _events(gw, "session_opened")
        assert {e["mcp_session"] for e in opened} == {sid for sid, _ in results}
        assert all(e["worker"] == _owner(e["mcp_session"]) for e in opened)

        # Each session's records are in its owner's log, and only there.
        logs = {i: _records(_log(gw, i)) for i in (0, 1)}
        for sid, _ in results:
            owner = _owner(sid)
            allows = [r for r in logs[owner] if r.get("mcp_session") == sid and r["event"] == "allow"]
            assert [r["tool"] for r in allows] == ["whoami"] * 4
            assert not any(r.get("mcp_session") == sid for r in logs[1 - owner])

        # SIGHUP to the supervisor reaches both workers: a policy that does not load is refused by
        # each, on its own record.
        (tmp_path / "policy.yaml").write_text("version: [\n")
        gw.proc.send_signal(signal.SIGHUP)
        for i in (0, 1):
            _wait_for(
                f"worker {i} records the reload",
                lambda i=i: [
                    r for r in _records(_log(gw, i)) if r["event"] == "policy_reload" and not r["ok"]
                ],
            )
        assert gw.proc.poll() is None and _worker_pids(gw) == workers
    for i in (0, 1):
        _verify(_log(gw, i))
    assert not gw.audit.exists()  # no process writes the unsuffixed log


def test_a_request_for_another_workers_session_is_forwarded(tmp_path: Path) -> None:
    # With a replica id in front of the session ids (a load balancer's key), as behind nginx.
    with _workers(tmp_path, "--replica-id", "edge_1") as gw:
        rundir = Path(_events(gw, "serve_workers")[0]["rundir"])
        assert rundir.stat().st_mode & 0o777 == 0o700
        sock = {i: rundir / f"worker-{i}.sock" for i in (0, 1)}
        sid = _sessions_on_both(gw.url)[1]
        assert sid.startswith("edge_1.")
        # Worker 1's session, asked of worker 0 on its own socket: worker 0 forwards it.
        direct = _post_via(sock[1], gw, _call("whoami", {}), sid)
        forwarded = _post_via(sock[0], gw, _call("whoami", {}), sid)
        assert direct.status == forwarded.status == 200
        assert forwarded.body == direct.body
        assert forwarded.headers["content-type"] == direct.headers["content-type"] == "application/json"
        assert _text(forwarded).split()[1] == str(_worker_pids(gw)[1])
        # An answer streamed as server-sent events comes back as the owner streamed it.
        progress = _call("count", {"n": 3}, rpc_id=2)
        progress["params"]["_meta"] = {"progressToken": "p"}
        streamed = _post_via(sock[0], gw, progress, sid)
        assert streamed.status == 200 and streamed.headers["content-type"] == "text/event-stream"
        events = [
            json.loads(line[6:]) for line in streamed.body.decode().splitlines() if line.startswith("data: ")
        ]
        assert [e["params"]["progress"] for e in events[:-1]] == [1, 2, 3]
        assert events[-1]["id"] == 2 and events[-1]["result"]["content"][0]["text"].endswith("counted 3")
        # The request is refused where it arrives before it is forwarded (the Origin rule, 403).
        refused = _via(sock[0], gw, "DELETE", {"Mcp-Session-Id": sid, "Origin": "http://evil.example"})
        assert refused.status == 403
        # DELETE through worker 0 ends worker 1's session.
        assert _via(sock[0], gw, "DELETE", {"Mcp-Session-Id": sid}).status == 200
        assert _post_via(sock[1], gw, _call("whoami", {}, rpc_id=3), sid).status == 404

        # SIGTERM to the supervisor: every worker and every upstream ends, the run directory goes.
        assert post(gw.url, _call("whoami", {}), _sessions_on_both(gw.url)[0]).status == 200
        workers = _worker_pids(gw)
        upstreams = [int(p) for p in (tmp_path / "pids").read_text().split()]
        assert len(upstreams) >= 2 and all(alive(p) for p in workers.values())
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(60) == 0
    for pid in [*workers.values(), *upstreams]:
        assert not alive(pid), pid
    assert not rundir.exists()
    assert READY in gw.stderr() and gw.stderr().count(READY) == 1


def test_a_killed_worker_is_restarted_and_the_other_keeps_its_sessions(tmp_path: Path) -> None:
    with _workers(tmp_path) as gw:
        before = _worker_pids(gw)
        sids = _sessions_on_both(gw.url)
        kept = _text(post(gw.url, _call("whoami", {}), sids[0]))
        lost_upstream = int(_text(post(gw.url, _call("whoami", {}), sids[1])).split()[0])
        os.kill(before[1], signal.SIGKILL)
        after = _wait_for("worker 1 restarted", lambda: _worker_pids(gw)[1] != before[1] and _worker_pids(gw))
        assert after[0] == before[0]
        exited = _events(gw, "worker_exited")
        assert [(e["worker"], e["status"]) for e in exited] == [(1, -signal.SIGKILL)]
        # The dead worker's session is gone (no --state): 404, whichever worker the request reaches.
        assert post(gw.url, _call("whoami", {}), sids[1]).status == 404
        rundir = Path(_events(gw, "serve_workers")[0]["rundir"])
        assert _post_via(rundir / "worker-0.sock", gw, _call("whoami", {}), sids[1]).status == 404
        # Its upstream saw its stdin close and ended.
        _wait_for("the dead worker's upstream ends", lambda: not alive(lost_upstream))
        # The other worker's session is untouched: the same upstream answers.
        assert _text(post(gw.url, _call("whoami", {}, rpc_id=2), sids[0])) == kept
        # New sessions work on both, the new worker 1 among them.
        fresh = _sessions_on_both(gw.url)
        answer = _text(post(gw.url, _call("whoami", {}), fresh[1]))
        assert int(answer.split()[1]) == after[1]
        assert gw.proc.poll() is None
    for i in (0, 1):
        _verify(_log(gw, i))


def test_sessionless_requests_of_one_credential_are_one_conversation_on_one_worker(tmp_path: Path) -> None:
    """2026-07-28: no session id to route by. Every request made with one credential is one
    conversation (one budget), so every worker sends them to the same worker."""
    budget = POLICY.replace(
        '      - name: "whoami"\n        allowed: true\n',
        '      - name: "whoami"\n        allowed: true\n        max_calls: 3\n',
    )
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    }
    headers = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "whoami"}
    with _workers(tmp_path, "--log-level", "debug", policy=budget) as gw:
        answers = []
        for i in range(8):  # each on a new connection: the kernel hands them to either worker
            call = _call("whoami", {}, rpc_id=i)
            call["params"]["_meta"] = meta
            reply = post(gw.url, call, **headers)
            assert reply.status == 200, reply
            answers.append(reply.json()["result"])
        allowed = [a["content"][0]["text"] for a in answers if not a.get("isError")]
        assert len(allowed) == 3 and len(set(allowed)) == 1, answers
        assert all(a.get("isError") for a in answers[3:])
        opened = _events(gw, "conversation_opened")
        assert len(opened) == 1, opened
        # The upstream is a child of the worker that holds the conversation.
        assert int(allowed[0].split()[1]) == _worker_pids(gw)[opened[0]["worker"]]


@pytest.mark.skipif(shutil.which("redis-server") is None, reason=MISSING)
def test_with_state_the_restarted_worker_continues_its_sessions(tmp_path: Path) -> None:
    """The forwarding hook and `--state` adoption together: a dead worker's session, asked of the
    other worker, is forwarded to the restarted owner, which continues it from the store."""
    folder = tmp_path / "redis"
    folder.mkdir()
    store = RedisServer(folder)
    store.start()
    budget = POLICY.replace(
        '      - name: "whoami"\n        allowed: true\n',
        '      - name: "whoami"\n        allowed: true\n        max_calls: 3\n',
    )
    assert "max_calls: 3" in budget
    try:
        with _workers(tmp_path, "--state", store.url, policy=budget) as gw:
            rundir = Path(_events(gw, "serve_workers")[0]["rundir"])
            sid = _sessions_on_both(gw.url)[1]
            own = rundir / "worker-1.sock"
            assert _post_via(own, gw, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, sid).status == 200
            first = [_text(_post_via(own, gw, _call("whoami", {}, rpc_id=i), sid)) for i in (2, 3)]
            before = _worker_pids(gw)
            os.kill(before[1], signal.SIGKILL)
            after = _wait_for(
                "worker 1 restarted", lambda: _worker_pids(gw)[1] != before[1] and _worker_pids(gw)
            )
            # Through worker 0: forwarded to the new worker 1, which adopts the session with its
            # budget (2 of 3 calls spent) and starts a new upstream for it.
            third = _text(_post_via(rundir / "worker-0.sock", gw, _call("whoami", {}, rpc_id=4), sid))
            assert third != first[0] and int(third.split()[1]) == after[1]
            fourth = _post_via(rundir / "worker-0.sock", gw, _call("whoami", {}, rpc_id=5), sid).json()
            assert fourth["result"]["isError"] is True
            adopted = [r for r in _records(_log(gw, 1)) if r["event"] == "session_adopted"]
            assert [r["mcp_session"] for r in adopted] == [sid]
            assert not any(r["event"] == "session_adopted" for r in _records(_log(gw, 0)))
    finally:
        store.kill()
    for i in (0, 1):
        _verify(_log(gw, i))


def test_refused_at_start(tmp_path: Path) -> None:
    def start(*options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "visor.cli", "serve", "--listen", "127.0.0.1:0", *options,
             "--audit-log", str(tmp_path / "a.jsonl"), "--", *_upstream(tmp_path)],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
            env={**os.environ, "VISOR_HOME": str(tmp_path / "home")},
        )  # fmt: skip

    too_many = start("--workers", "65")
    assert too_many.returncode == 2 and "--workers 65: at most 64" in too_many.stderr
    none = start("--workers", "0")
    assert none.returncode == 2 and "must be a positive integer" in none.stderr
    # A worker that cannot start (here: the policy does not load) stops the gateway: it does not
    # keep starting workers that fail the same way, and never says it is listening.
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: [\n")
    failed = start("--workers", "2", "--policy", str(bad))
    assert failed.returncode == 1, failed.stderr
    assert "policy refused" in failed.stderr and "before it was ready; stopping" in failed.stderr
    assert READY not in failed.stderr


def test_no_worker_relays_a_call_that_names_any_workers_audit_log(tmp_path: Path) -> None:
    # --audit-log outside $VISOR_HOME/audit: each worker's own file, and its siblings', are
    # Visor's files, which no tool call may name.
    mailbox = ROOT / "tests" / "servers" / "mailbox.py"
    policy = 'version: "1.0"\ndefault_action: deny\nservers:\n  - name: "mail"\n    allowed: true\n'
    policy += "    tools:\n      - name: note\n        allowed: true\n"
    received = tmp_path / "received.jsonl"
    with serve(
        tmp_path, [sys.executable, str(mailbox)], "--workers", "2", "--server-name", "mail",
        policy=policy, env={"MAILBOX_LOG": str(received)},
    ) as gw:  # fmt: skip
        sid = initialize(gw.url)
        for rpc_id, index in enumerate((0, 1), start=1):
            target = str(_log(gw, index))
            reply = post(gw.url, _call("note", {"text": target}, rpc_id), sid)
            result = reply.json()["result"]
            assert result["isError"] is True
            assert "visor.protected_path" in result["content"][0]["text"], (index, result)
        ok = post(gw.url, _call("note", {"text": "hello"}, 3), sid)
        assert _text(ok) == "noted"
    assert len(received.read_text().splitlines()) == 1


def test_every_scrape_of_the_shared_port_shows_every_workers_series(tmp_path: Path) -> None:
    # The kernel hands each scrape's connection to either worker: every answer must hold the same
    # series (each worker's, labelled), or a Prometheus counter would jump between two values.
    from tests.serve.serve_proc import http as fetch
    from tests.serve.test_serve_metrics import scrape

    with _workers(tmp_path) as gw:
        sessions = _sessions_on_both(gw.url)
        for owner, sid in sessions.items():
            for n in range(owner + 1):  # one call on worker 0, two on worker 1
                assert _text(post(gw.url, _call("whoami", {}, rpc_id=10 + n), sid)).split()[0].isdigit()
        # Each worker's own figures, from its private socket (JSON there, and only there).
        rundir = Path(_events(gw, "serve_workers")[0]["rundir"])
        own = [
            _via(rundir / f"worker-{i}.sock", gw, "GET", {}, at="/metrics?worker-snapshot") for i in (0, 1)
        ]
        assert all(r.status == 200 for r in own), own
        mine = [r.json() for r in own]
        assert [m["verdicts"] for m in mine] == [[["allow", "tools/call", 1]], [["allow", "tools/call", 2]]]
        for _ in range(6):  # new connections: both workers answer some of these
            page = scrape(gw.url)
            assert page["visor_workers_reporting"] == 2, page
            for i in (0, 1):
                allowed = f'visor_requests_total{{worker="{i}",verdict="allow",method="tools/call"}}'
                assert page[allowed] == i + 1, page
                assert page[f'visor_sessions_open{{worker="{i}"}}'] == mine[i]["sessions_open"] >= 1, page
                assert page[f'visor_audit_commit_seconds_count{{worker="{i}"}}'] == i + 1, page
            # every sample is one worker's: nothing unlabelled but the reporting gauge
            assert {k for k in page if "worker=" not in k} == {"visor_workers_reporting"}, page
        # Through the public port the query changes nothing: the text page.
        reply = fetch("GET", gw.base + "/metrics?worker-snapshot")
        assert reply.status == 200 and reply.body.startswith(b"# HELP"), reply
