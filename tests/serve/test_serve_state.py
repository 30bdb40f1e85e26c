"""`visor serve --state`: a session continued by another replica keeps its budgets, provenance,
pins and approvals; a store that is gone fails closed. Two real `visor serve` processes, a real
redis-server, a real MCP SDK stdio server behind each; requests are raw HTTP so that the test,
not a load balancer, decides which replica gets each one (tests/serve/test_scaleout_e2e.py puts
a real nginx in front)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.approval.helpers import pending, wait_pending
from tests.serve.serve_proc import MAIL_POLICY, MAILBOX, initialize, post, serve
from tests.state.redis_server import MISSING, RedisServer

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason=MISSING)


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    folder = tmp_path / "redis"
    folder.mkdir()
    server = RedisServer(folder)
    server.start()
    try:
        yield server
    finally:
        server.kill()


def _replica(
    tmp_path: Path, name: str, store: str, log: Path, *options: str, policy: str = MAIL_POLICY
) -> Any:
    folder = tmp_path / name
    folder.mkdir()
    return serve(
        folder,
        [sys.executable, str(MAILBOX)],
        "--state", store, "--server-name", "mail", "--replica-id", name, *options,
        policy=policy,
        env={"MAILBOX_LOG": str(log)},
    )  # fmt: skip


_ids = iter(range(1000, 10**6))


def call(url: str, sid: str, tool: str, **arguments: Any) -> dict[str, Any]:
    msg = {
        "jsonrpc": "2.0",
        "id": next(_ids),
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }
    reply = post(url, msg, sid)
    assert reply.status == 200, (reply.status, reply.body[:300])
    body = reply.body
    if reply.headers.get("content-type", "").startswith("text/event-stream"):
        body = [ln for ln in body.splitlines() if ln.startswith(b"data: ")][-1][6:]
    answer = json.loads(body)
    assert "result" in answer, answer
    return answer["result"]


def text(result: dict[str, Any]) -> str:
    return " ".join(c.get("text", "") for c in result.get("content", []))


def received(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_session_continued_on_another_replica_keeps_budget_provenance_and_pins(
    tmp_path: Path, redis: RedisServer
) -> None:
    log = tmp_path / "mailbox.jsonl"
    with _replica(tmp_path, "a", redis.url, log) as a, _replica(tmp_path, "b", redis.url, log) as b:
        sid = initialize(a.url)
        assert sid.startswith("a.") and len(sid) == 34  # the replica that holds it, for a router
        assert not call(a.url, sid, "ping").get("isError")
        assert not call(a.url, sid, "ping").get("isError")
        inbox = call(a.url, sid, "read_inbox")
        assert "drop@exfil.example" in text(inbox)
        pid_a = {r["pid"] for r in received(log)}
        # Replica b has never seen this session: it continues it from the store.
        third = call(b.url, sid, "ping")
        assert not third.get("isError"), third
        pid_b = int(text(third).split()[-1])
        assert pid_b not in pid_a  # b's own upstream ran it
        fourth = call(b.url, sid, "ping")
        assert fourth.get("isError") and "budget" in text(fourth).lower(), fourth
        # The address a's upstream showed is still untrusted output on b.
        sent = call(b.url, sid, "send_email", to="drop@exfil.example", body="the report")
        assert sent.get("isError"), sent
        assert "provenance.untrusted_output" in text(sent), sent
        # An address no output showed is a question (no one to ask here), not a provenance deny.
        asked = call(b.url, sid, "send_email", to="colleague@corp.example", body="the report")
        assert "approval.unavailable" in text(asked), asked
    tools = [r["tool"] for r in received(log)]
    assert tools == ["ping", "ping", "read_inbox", "ping"]
    b_records = b.records()
    adopted = [r for r in b_records if r["event"] == "session_adopted"]
    assert len(adopted) == 1 and adopted[0]["mcp_session"] == sid and adopted[0]["calls_total"] == 3
    assert adopted[0]["pins"] == 4  # every tool the mailbox lists
    denies = {r["rule"] for r in b_records if r["event"] == "deny"}
    assert "budget.max_calls" in denies and "provenance.untrusted_output" in denies
    # Every call an upstream received has its allow record in one replica's log.
    allows = [r for r in a.records() + b_records if r["event"] == "allow"]
    assert sorted(r["tool"] for r in allows) == sorted(tools)


def test_an_ended_session_is_not_continued_elsewhere_and_another_credential_cannot_adopt(
    tmp_path: Path, redis: RedisServer
) -> None:
    log = tmp_path / "mailbox.jsonl"
    with _replica(tmp_path, "a", redis.url, log) as a, _replica(tmp_path, "b", redis.url, log) as b:
        sid = initialize(a.url, Authorization="Bearer one")
        stranger = post(
            b.url, {"jsonrpc": "2.0", "id": 7, "method": "tools/list"}, sid, Authorization="Bearer two"
        )
        assert stranger.status == 404, stranger
        from tests.serve.serve_proc import http

        assert (
            http("DELETE", a.url, headers={"Mcp-Session-Id": sid, "Authorization": "Bearer one"}).status
            == 200
        )
        gone = post(
            b.url, {"jsonrpc": "2.0", "id": 8, "method": "tools/list"}, sid, Authorization="Bearer one"
        )
        assert gone.status == 404, gone
    assert not [r for r in b.records() if r["event"] == "session_adopted"]


def test_a_lost_store_refuses_new_sessions_and_calls(tmp_path: Path, redis: RedisServer) -> None:
    log = tmp_path / "mailbox.jsonl"
    with _replica(tmp_path, "a", redis.url, log) as a:
        sid = initialize(a.url)
        assert not call(a.url, sid, "ping").get("isError")
        redis.kill()
        refused = post(a.url, {**json.loads(json.dumps(INIT_MSG))})
        assert refused.status == 503, refused
        assert refused.json()["error"]["message"].startswith("Service Unavailable")
        denied = call(a.url, sid, "ping")
        assert denied.get("isError"), denied
        # A destination that is unknown because the store is gone is not trusted.
        sent = call(a.url, sid, "send_email", to="colleague@corp.example", body="x")
        assert sent.get("isError"), sent
    assert [r["tool"] for r in received(log)] == ["ping"]
    rules = [r["rule"] for r in a.records() if r["event"] == "deny"]
    assert "state.unavailable" in rules


INIT_MSG = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "visor-state-test", "version": "0"},
    },
}


def test_two_replicas_serving_one_session_at_once_cannot_overspend_its_budget(
    tmp_path: Path, redis: RedisServer
) -> None:
    log = tmp_path / "mailbox.jsonl"
    with _replica(tmp_path, "a", redis.url, log) as a, _replica(tmp_path, "b", redis.url, log) as b:
        sid = initialize(a.url)
        assert not call(a.url, sid, "ping").get("isError")  # 1, on a
        assert not call(b.url, sid, "ping").get("isError")  # 2, b continues the session
        # a still holds the session too, and believes one call was made: the store says two. The
        # call is judged again on the store's counts (nothing was counted for the stale judgement).
        assert not call(a.url, sid, "ping").get("isError")  # 3
        for url in (a.url, b.url):
            spent = call(url, sid, "ping")
            assert spent.get("isError") and "budget" in text(spent).lower(), spent
    assert [r["tool"] for r in received(log)] == ["ping", "ping", "ping"]
    denies = [r["rule"] for r in a.records() + b.records() if r["event"] == "deny"]
    assert denies == ["budget.max_calls", "budget.max_calls"]


# `note` needs a human every time; a "remember" yes covers the exact same call for the session.
NOTE_POLICY = (
    MAIL_POLICY
    + """      - name: note
        allowed: true
        approval_required: true
"""
)


def _visor(tmp_path: Path, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "visor.cli", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, "VISOR_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_remembered_yes_to_an_exact_call_follows_the_session_to_another_replica(
    tmp_path: Path, redis: RedisServer
) -> None:
    log = tmp_path / "mailbox.jsonl"
    dir_a, dir_b = tmp_path / "approvals-a", tmp_path / "approvals-b"
    with (
        _replica(tmp_path, "a", redis.url, log, "--approval-dir", str(dir_a), policy=NOTE_POLICY) as a,
        _replica(tmp_path, "b", redis.url, log, "--approval-dir", str(dir_b), policy=NOTE_POLICY) as b,
    ):
        sid = initialize(a.url)
        first: list[dict[str, Any]] = []
        caller = threading.Thread(target=lambda: first.append(call(a.url, sid, "note", text="ship it")))
        caller.start()
        (request_id,) = wait_pending(dir_a)
        _visor(tmp_path, "approve", "--remember", "--approval-dir", str(dir_a), request_id)
        caller.join(60)
        assert first and not first[0].get("isError"), first
        # Replica b continues the session: the same call runs with no question,
        second = call(b.url, sid, "note", text="ship it")
        assert not second.get("isError"), second
        assert pending(dir_b) == {}
        # and any other call of that tool is still asked.
        third: list[dict[str, Any]] = []
        caller = threading.Thread(target=lambda: third.append(call(b.url, sid, "note", text="ship that")))
        caller.start()
        (other,) = wait_pending(dir_b)
        _visor(tmp_path, "deny", "--approval-dir", str(dir_b), other)
        caller.join(60)
        assert third and third[0].get("isError"), third
    assert [r["arguments"] for r in received(log) if r["tool"] == "note"] == [{"text": "ship it"}] * 2
    remembered = [r for r in b.records() if r["event"] == "approve" and r.get("tool") == "note"]
    assert [(r["channel"], r.get("remembered")) for r in remembered] == [("session", True)], remembered
