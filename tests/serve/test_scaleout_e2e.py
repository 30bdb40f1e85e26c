"""Two `visor serve` replicas behind a real nginx (the shipped docs/deploy/nginx.conf), sharing
state on a real redis-server, driven by the real `mcp` SDK Streamable HTTP client over TLS.

What is shown: a session's calls stay on one upstream process; a replica killed mid-session
loses no allowed call's record, and the survivor continues the session with its budget and
provenance intact; a replica that loses the store refuses rather than trusts.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.serve import scaleout
from tests.serve.serve_proc import INIT, ROOT, Serve, alive, serve
from tests.state.redis_server import RedisServer
from visor.serve.command import DEFAULT_MAX_MESSAGE_BYTES

SERVER = Path(__file__).with_name("scaleout_server.py")
TOKEN = "scaleout-test-token-0123456789"
MALLORY = "mallory@evil.example"
POLICY = """\
version: "1.0"
default_action: deny
settings:
  session_max_calls: 0
  session_timeout_seconds: 0
servers:
  - name: "scaleout"
    allowed: true
    tools:
      - name: "whoami"
        allowed: true
      - name: "count"
        allowed: true
        max_calls: 3
      - name: "read_inbox"
        allowed: true
      - name: "send_mail"
        allowed: true
        exfiltrating: true
        sink_params: [to]
        trusted_destinations: ["ops@example.org"]
"""

_SKIP = scaleout.missing("nginx", "nginx") or scaleout.missing("redis-server", "redis-server")
# The tests that start the services; the ones that read the shipped files run anywhere.
needs_services = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")


@dataclass
class Cluster:
    replicas: list[Serve]
    front: scaleout.Nginx
    redis: RedisServer | None
    tls: scaleout.Tls
    calls_file: Path
    tmp: Path

    def calls(self) -> list[dict[str, Any]]:
        """What the upstream processes of every replica received, in order."""
        if not self.calls_file.exists():
            return []
        return [json.loads(line) for line in self.calls_file.read_text().splitlines()]

    def owner_of(self, sid: str) -> Serve:
        """The replica whose audit log holds the session's allowed calls."""
        owners = [
            r
            for r in self.replicas
            if any(rec.get("mcp_session") == sid and rec["event"] == "allow" for rec in r.records())
        ]
        assert len(owners) == 1, f"session {sid} has allowed calls on {len(owners)} replicas"
        return owners[0]


@contextlib.contextmanager
def cluster(tmp: Path, *, state: bool) -> Iterator[Cluster]:
    """redis-server (with `state`), two replicas on loopback with their own audit logs, the same
    policy and client token, each in front of the recording stdio server; nginx in front."""
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    calls = tmp / "calls.jsonl"
    pids = tmp / "upstream.pids"
    upstream = [
        "sh", "-c",
        f'echo $$ >> "{pids}"; SCALEOUT_CALLS="{calls}" exec "{sys.executable}" "{SERVER}"',
    ]  # fmt: skip
    tls = scaleout.self_signed(tmp / "tls")
    with contextlib.ExitStack() as stack:
        redis: RedisServer | None = None
        if state:
            (tmp / "redis").mkdir()
            redis = RedisServer(tmp / "redis")
            stack.callback(redis.kill)
            redis.start()
        options = [
            "--server-name",
            "scaleout",
            "--policy",
            str(policy),
            "--client-token-env",
            "SCALEOUT_TOKEN",
        ]
        if redis is not None:
            options += ["--state", redis.url]
        replicas = [
            stack.enter_context(serve(tmp / f"replica{i}", upstream, *options, env={"SCALEOUT_TOKEN": TOKEN}))
            for i in (1, 2)
        ]
        addresses = [urlsplit(r.url).netloc for r in replicas]
        front = stack.enter_context(scaleout.nginx(tmp, addresses, tls))
        try:
            yield Cluster(replicas, front, redis, tls, calls, tmp)
        finally:
            # Upstreams of a killed replica see EOF and exit; any that lingers is ended here.
            stack.close()
            if pids.exists():
                for pid in map(int, pids.read_text().split()):
                    if alive(pid):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)


def _client(c: Cluster) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(
        verify=c.tls.client_context(),
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=httpx2.Timeout(30.0, read=120.0),
    )


def _run(main: Any) -> Any:
    return asyncio.run(asyncio.wait_for(main(), 180))


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def _raw(
    c: Cluster, method: str, body: bytes | None, headers: dict[str, str]
) -> tuple[int, dict[str, str], bytes]:
    """One raw HTTPS exchange through nginx (statuses and bodies exactly as a client gets them)."""
    conn = http.client.HTTPSConnection("127.0.0.1", c.front.port, timeout=60, context=c.tls.client_context())
    try:
        conn.request(method, "/mcp", body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


_POST_HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "Authorization": f"Bearer {TOKEN}",
}


# ---------------------------------------------------------------- the shipped file is the tested file
def test_the_tested_nginx_config_is_the_shipped_one_with_places_substituted(tmp_path: Path) -> None:
    shipped_text = scaleout.SHIPPED_NGINX.read_text()
    tls = scaleout.Tls(tmp_path / "c.pem", tmp_path / "k.pem")
    generated_text = scaleout.nginx_config(
        shipped_text, prefix=tmp_path, port=1234, replicas=["127.0.0.1:1", "127.0.0.1:2"], tls=tls
    )
    shipped, generated = scaleout.directives(shipped_text), scaleout.directives(generated_text)
    assert [(ctx, name) for ctx, name, _ in shipped] == [(ctx, name) for ctx, name, _ in generated]
    changed = set()
    for (ctx, name, want), (_, _, got) in zip(shipped, generated, strict=True):
        if want != got:
            assert name in scaleout.SUBSTITUTED, f"{'/'.join(ctx)} {name}: {want} became {got}"
            # Only the place changes; parameters such as max_fails and ssl stay as shipped.
            assert len(want) == len(got) and want[1:] == got[1:], (name, want, got)
            changed.add(name)
    assert {"listen", "server", "pid", "proxy_temp_path"} <= changed
    # The directives the deployment relies on are in the shipped file.
    by_name: dict[str, list[tuple[str, ...]]] = {}
    for _, name, args in shipped:
        by_name.setdefault(name, []).append(args)
    assert by_name["hash"] == [("$http_mcp_session_id", "consistent")]
    assert by_name["proxy_http_version"] == [("1.1",)]
    assert by_name["proxy_buffering"] == [("off",)] and by_name["proxy_cache"] == [("off",)]
    assert by_name["proxy_next_upstream"] == [("error", "timeout")]  # never non_idempotent
    assert by_name["proxy_set_header"] == [("Connection", '""'), ("Host", "$host")]
    # nginx's body limit is visor serve's default, so neither refuses what the other takes.
    assert by_name["client_max_body_size"] == [("16m",)] and DEFAULT_MAX_MESSAGE_BYTES == 16 * 1024 * 1024


def test_the_compose_file_runs_the_shipped_nginx_config_in_front_of_its_replicas() -> None:
    import yaml

    compose = yaml.safe_load(scaleout.SHIPPED_COMPOSE.read_text())
    services = compose["services"]
    upstream = [
        args[0] for ctx, name, args in scaleout.directives(scaleout.SHIPPED_NGINX.read_text())
        if name == "server" and ctx[-1] == "upstream"
    ]  # fmt: skip
    replicas = sorted(name for name in services if name.startswith("replica"))
    assert [u.split(":")[0] for u in upstream] == replicas == ["replica1", "replica2"]
    assert "./nginx.conf:/etc/nginx/nginx.conf:ro" in services["nginx"]["volumes"]
    assert set(services["nginx"]["depends_on"]) == set(replicas)
    for name in replicas:
        replica = services[name]
        command = replica["command"].split()
        listen = command[command.index("--listen") + 1]
        assert {f"{name}:{listen.rsplit(':', 1)[1]}"} & set(upstream), (name, listen, upstream)
        # Beyond loopback, so with a token from the env file (never on the command line) ...
        assert command[command.index("--client-token-env") + 1] == "VISOR_CLIENT_TOKEN"
        assert replica["env_file"] == "visor.env"
        # ... shared state on the compose store, an audit log per replica (its own volume) ...
        assert command[command.index("--state") + 1].startswith("redis://valkey:")
        assert "--audit-log" in command
        # ... and the health check asks /healthz.
        assert any("/healthz" in part for part in replica["healthcheck"]["test"])
    # Each replica's audit log is on a volume of its own.
    homes = [tuple(services[name]["volumes"]) for name in replicas]
    assert len(set(homes)) == len(homes), homes
    assert "valkey" in services and services["valkey"]["healthcheck"]["test"]


# ---------------------------------------------------------------- affinity
async def _session_pids(c: Cluster, tag: str, calls: int) -> tuple[set[int], list[bool]]:
    async with (
        _client(c) as hc,
        streamable_http_client(c.front.url, http_client=hc) as (r, w),
        ClientSession(r, w) as s,
    ):
        await s.initialize()
        await s.list_tools()
        results = [await s.call_tool("whoami", {"tag": tag}) for _ in range(calls)]
        return {int(_text(x)) for x in results if not x.is_error}, [bool(x.is_error) for x in results]


@needs_services
def test_sessions_keep_one_upstream_process_and_the_edge_keeps_its_checks(tmp_path: Path) -> None:
    with cluster(tmp_path, state=True) as c:
        # Sessions until both replicas have served some (the ids are random, so is the hash).
        seen: list[tuple[str, set[int]]] = []
        for k in range(24):
            pids, errors = _run(lambda k=k: _session_pids(c, f"s{k}", 4))
            assert errors == [False] * 4
            seen.append((f"s{k}", pids))
            hosts = {c.owner_of(sid).url for sid in _sids(c)}
            if len(hosts) == 2 and k >= 3:
                break
        assert len({c.owner_of(sid).url for sid in _sids(c)}) == 2, "every session hashed to one replica"
        # Within a session, every call reached one upstream process ...
        for tag, pids in seen:
            assert len(pids) == 1, (tag, pids)
            received = {call["pid"] for call in c.calls() if call["arguments"].get("tag") == tag}
            assert received == pids, (tag, received, pids)
        # ... and different sessions had different ones.
        assert len({next(iter(p)) for _, p in seen}) == len(seen)

        # The edge: another Host is refused by nginx (a rebound DNS name never reaches a replica),
        init = json.dumps(INIT).encode()
        status, _, _ = _raw(c, "POST", init, {**_POST_HEADERS, "Host": "rebound.example"})
        assert status == 421
        # Origin reaches the replicas unchanged, so their Origin check still refuses a foreign page,
        status, _, body = _raw(c, "POST", init, {**_POST_HEADERS, "Origin": "https://evil.example"})
        assert status == 403 and json.loads(body)["error"]["message"].startswith("Forbidden: this Origin")
        # so does MCP-Protocol-Version (a replica refuses one it does not serve),
        ping = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
        status, _, body = _raw(
            c,
            "POST",
            ping,
            {**_POST_HEADERS, "Mcp-Session-Id": "0" * 32, "MCP-Protocol-Version": "1999-01-01"},
        )
        assert status == 400 and "unsupported MCP-Protocol-Version" in json.loads(body)["error"]["message"], (
            body
        )
        # Authorization reaches them too, and they (not nginx) hold the token,
        status, headers, body = _raw(c, "POST", init, {**_POST_HEADERS, "Authorization": "Bearer wrong"})
        assert status == 401 and headers["www-authenticate"].startswith("Bearer")
        # and a body over the shared limit is refused by nginx as a JSON-RPC error.
        big = (
            b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"'
            + b"x" * DEFAULT_MAX_MESSAGE_BYTES
            + b'"}}'
        )
        status, _, body = _raw(c, "POST", big, _POST_HEADERS)
        assert status == 413 and json.loads(body)["error"]["code"] == -32600
        # With no replica left, nginx's 502 is a JSON-RPC error that does not claim nothing ran.
        for replica in c.replicas:
            replica.proc.send_signal(signal.SIGKILL)
            replica.proc.wait()
        status, _, body = _raw(c, "POST", init, _POST_HEADERS)
        assert status == 502, body
        assert "may or may not have been carried out" in json.loads(body)["error"]["message"], body


@needs_services
def test_without_state_a_session_hashed_to_the_other_replica_is_refused_not_mixed(tmp_path: Path) -> None:
    """What the top of nginx.conf says: an initialize (no session id, an empty hash key) goes
    round-robin, the session's next request goes where its id hashes; without --state the
    replica that did not open it answers 404, and the client starts over (never another session)."""
    with cluster(tmp_path, state=False) as c:
        init = json.dumps(INIT).encode()
        initialized = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode()
        outcomes: dict[int, list[bytes]] = {}
        for _ in range(40):
            status, headers, body = _raw(c, "POST", init, _POST_HEADERS)
            assert status == 200, body
            sid = headers["mcp-session-id"]
            status, _, body = _raw(c, "POST", initialized, {**_POST_HEADERS, "Mcp-Session-Id": sid})
            outcomes.setdefault(status, []).append(body)
            if status == 202:
                call = {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "tools/call",
                    "params": {"name": "whoami", "arguments": {"tag": sid}},
                }
                status, _, body = _raw(
                    c, "POST", json.dumps(call).encode(), {**_POST_HEADERS, "Mcp-Session-Id": sid}
                )
                assert status == 200 and json.loads(body)["result"]["isError"] is False, body
            if {202, 404} <= outcomes.keys():
                break
        assert set(outcomes) == {202, 404}, {k: len(v) for k, v in outcomes.items()}
        for body in outcomes[404]:
            assert json.loads(body)["error"]["message"].startswith("Session not found"), body


def _sids(c: Cluster) -> set[str]:
    return {
        rec["mcp_session"]
        for r in c.replicas
        for rec in r.records()
        if rec["event"] == "allow" and "mcp_session" in rec
    }


# ---------------------------------------------------------------- failover
def _verify(log: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "visor.cli", "audit", "verify", str(log)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip


def _key(tool: str, arguments: Any) -> tuple[str, str]:
    return tool, json.dumps(arguments, sort_keys=True)


@dataclass
class Live:
    """One SDK session held open through nginx, and where its replicas put it."""

    tag: str
    session: ClientSession
    sid: str = ""
    opened_on: Serve | None = None  # the replica that answered its initialize
    owner: Serve | None = None  # the replica its id hashes to, which served its calls


def _place(c: Cluster, live: Live) -> None:
    """Which replica answered the initialize (its `session_start` without `session_adopted`)
    and which served the calls (its allows)."""
    (live.sid,) = {
        rec["mcp_session"]
        for r in c.replicas
        for rec in r.records()
        if rec["event"] == "allow" and rec.get("args", {}).get("tag") == live.tag
    }
    live.owner = c.owner_of(live.sid)
    for r in c.replicas:
        events = {rec["event"] for rec in r.records() if rec.get("mcp_session") == live.sid}
        if "session_start" in events and "session_adopted" not in events:
            live.opened_on = r


def _failover(c: Cluster, *, survivor_opened_it: bool) -> None:
    """Open sessions through nginx until one is of the kind asked for, spend two of its three
    budgeted calls and read the address on the replica serving it, SIGKILL that replica, and
    go on in the same SDK session (so under the same Mcp-Session-Id) through the survivor.

    An initialize has no session id, so nginx sends it round-robin; the session's later requests
    go where its new id hashes. So a session's serving replica either opened it too (then the
    survivor has never held it, and adopts it from the store), or took it over from the survivor
    at its second request (then the survivor still holds it, from before the calls were made)."""

    async def main() -> tuple[Live, list[types.CallToolResult], types.CallToolResult]:
        async with contextlib.AsyncExitStack() as stack:
            for k in range(24):
                hc = await stack.enter_async_context(_client(c))
                r, w = await stack.enter_async_context(streamable_http_client(c.front.url, http_client=hc))
                live = Live(f"s{k}", await stack.enter_async_context(ClientSession(r, w)))
                await live.session.initialize()
                await live.session.list_tools()
                for n in (1, 2):
                    assert not (await live.session.call_tool("count", {"tag": live.tag, "n": n})).is_error
                assert MALLORY in _text(await live.session.call_tool("read_inbox", {"tag": live.tag}))
                _place(c, live)
                if (live.opened_on is not live.owner) is survivor_opened_it:
                    break
            else:
                raise AssertionError("24 sessions and none of the kind asked for")
            assert live.owner is not None
            live.owner.proc.send_signal(signal.SIGKILL)
            live.owner.proc.wait()
            after = [await live.session.call_tool("count", {"tag": live.tag, "n": n}) for n in (3, 4)]
            send = await live.session.call_tool("send_mail", {"to": MALLORY, "body": live.tag})
            return live, after, send

    live, after, send = _run(main)
    (survivor,) = [r for r in c.replicas if r is not live.owner]
    texts = [_text(x) for x in (*after, send)]
    # The budget (max_calls: 3) holds across replicas: the third call is allowed, the fourth not.
    assert [bool(x.is_error) for x in after] == [False, True], texts
    # Provenance holds: the address read on the dead replica is still untrusted output.
    assert send.is_error, texts
    denies = [
        (rec["tool"], rec["rule"])
        for rec in survivor.records()
        if rec["event"] == "deny" and rec.get("mcp_session") == live.sid
    ]
    assert denies == [("count", "budget.max_calls"), ("send_mail", "provenance.untrusted_output")], denies
    mine = [
        (call["tool"], call["arguments"].get("n"))
        for call in c.calls()
        if call["arguments"].get("tag") == live.tag
    ]
    assert mine == [("count", 1), ("count", 2), ("read_inbox", None), ("count", 3)], mine

    # Every call an upstream process received (every session's) has its allow record in one of
    # the two logs: the dead replica's were durable before it relayed them.
    received = [_key(call["tool"], call["arguments"]) for call in c.calls()]
    allowed = [
        _key(rec["tool"], rec.get("args", {}))
        for r in c.replicas
        for rec in r.records()
        if rec["event"] == "allow"
    ]
    for call in received:
        assert call in allowed, (call, allowed)
        allowed.remove(call)
    # (The replica was killed between calls, so it had relayed every call it allowed.)
    assert allowed == [], f"allowed but never received: {allowed}"
    # Both chains verify; the killed replica's ends at its last durable record.
    for replica in c.replicas:
        verify = _verify(replica.audit)
        assert verify.returncode == 0, verify.stdout + verify.stderr


@needs_services
def test_a_replica_killed_mid_session_the_survivor_adopts_it_with_budget_and_provenance(
    tmp_path: Path,
) -> None:
    with cluster(tmp_path, state=True) as c:
        _failover(c, survivor_opened_it=False)


@needs_services
@pytest.mark.xfail(
    strict=True,
    reason="visor/session.py record_allowed: a replica that still holds a session (it answered its "
    "initialize before nginx's hash sent the rest elsewhere) counts the call in the shared ledger, "
    "finds counts it did not make, and refuses the call with the ledger already incremented: the "
    "third budgeted call is denied (another replica is serving this session) and the budget is spent",
)
def test_a_replica_killed_mid_session_the_survivor_still_held_it_with_budget_and_provenance(
    tmp_path: Path,
) -> None:
    with cluster(tmp_path, state=True) as c:
        _failover(c, survivor_opened_it=True)


# ---------------------------------------------------------------- the store goes away
@needs_services
def test_a_replica_that_loses_the_store_refuses_new_sessions_and_trusts_no_send(tmp_path: Path) -> None:
    with cluster(tmp_path, state=True) as c:
        assert c.redis is not None
        store = c.redis

        async def main() -> dict[str, Any]:
            async with (
                _client(c) as hc,
                streamable_http_client(c.front.url, http_client=hc) as (r, w),
                ClientSession(r, w) as s,
            ):
                await s.initialize()
                await s.list_tools()
                # A trusted destination passes while the store can say nobody's output showed it ...
                sent = await s.call_tool("send_mail", {"to": "ops@example.org", "body": "before"})
                store.kill()
                refused = await asyncio.to_thread(_raw, c, "POST", json.dumps(INIT).encode(), _POST_HEADERS)
                # ... and not once it cannot.
                lost = await s.call_tool("send_mail", {"to": "ops@example.org", "body": "after"})
                return {"sent": sent, "refused": refused, "lost": lost}

        out = _run(main)
        assert not out["sent"].is_error and _text(out["sent"]) == "sent to ops@example.org"
        status, headers, body = out["refused"]
        assert status == 503, (status, body)
        assert headers["content-type"].startswith("application/json")
        error = json.loads(body)
        assert error["jsonrpc"] == "2.0" and error["error"]["code"] == -32603, error
        assert headers["retry-after"] == "5"
        assert out["lost"].is_error
        denied = [rec for r in c.replicas for rec in r.records() if rec["event"] == "deny"]
        assert [(rec["tool"], rec["args"]["body"]) for rec in denied] == [("send_mail", "after")], denied
        assert [call["arguments"]["body"] for call in c.calls() if call["tool"] == "send_mail"] == ["before"]
