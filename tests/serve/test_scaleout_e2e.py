"""Two `visor serve` replicas behind a real nginx (the shipped docs/deploy/nginx.conf), each with
its `--replica-id`, driven by the real `mcp` SDK Streamable HTTP client over TLS; with `--state`,
sharing state on a real redis-server.

What is shown: nginx sends every request of a session to the replica that minted its id, so a
session keeps one upstream process with no shared store at all; a replica killed mid-session
loses no allowed call's record, and the survivor continues the session with its budget and
provenance intact (with `--state`) or answers 404 (without); a replica that loses the store
refuses rather than trusts.
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
import time
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
from tests.serve.serve_proc import http as plain_http
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

REPLICA_IDS = ["r1", "r2"]

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

    def minted_by(self, sid: str) -> Serve:
        """The replica whose `--replica-id` begins the session id (where nginx sends it)."""
        prefix, dot, _ = sid.partition(".")
        assert dot and prefix in REPLICA_IDS, f"session id {sid!r} has no replica's prefix"
        return self.replicas[REPLICA_IDS.index(prefix)]

    def access_statuses(self) -> list[int]:
        """The status of every request nginx answered, from its access log (combined format)."""
        log = self.front.prefix / "access.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return [int(line.split('" ', 1)[1].split()[0]) for line in lines]

    def upstream_pids(self) -> list[int]:
        """Every upstream process started, by any replica, in order."""
        pids = self.tmp / "upstream.pids"
        return [int(p) for p in pids.read_text().split()] if pids.exists() else []

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
    """redis-server (with `state`), two replicas on loopback with their own audit logs and replica
    ids, the same policy and client token, each in front of the recording stdio server; nginx in
    front. Every upstream process's pid is appended to `upstream.pids` as it starts."""
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
        # replicaN is `--replica-id rN`: the shipped map sends `rN.` ids to the Nth address.
        replicas = [
            stack.enter_context(
                serve(
                    tmp / f"replica{i}",
                    upstream,
                    *options,
                    "--replica-id",
                    rid,
                    env={"SCALEOUT_TOKEN": TOKEN},
                )
            )
            for i, rid in enumerate(REPLICA_IDS, 1)
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
    # Routing on the id's replica prefix, not a hash of the id (which cannot know where it was
    # minted); the variable names an upstream block, so no resolver is configured or needed.
    assert "resolver" not in by_name
    assert scaleout.session_routes(shipped_text) == {
        r"~^r1\.": "visor_r1",
        r"~^r2\.": "visor_r2",
        ":2026-07-28": "visor_conversation",
        "default": "visor_any",
    }
    # The one hash left: a sessionless conversation is one per client credential.
    assert by_name["hash"] == [("$http_authorization", "consistent")]
    assert by_name["proxy_pass"] == [("http://$visor_pool",)]
    # Each replica's block: that replica first, every other one a backup; visor_any: all alike.
    for ups, first_address in (
        (scaleout.upstreams(shipped_text), "replica"),
        (scaleout.upstreams(generated_text), "127.0.0.1:"),
    ):
        assert set(ups) == {"visor_r1", "visor_r2", "visor_conversation", "visor_any"}
        everyone = [args[0] for args in ups["visor_any"]]
        assert all("backup" not in args for args in ups["visor_any"]) and len(everyone) == 2
        assert ups["visor_conversation"] == ups["visor_any"]
        for n, block in ((1, "visor_r1"), (2, "visor_r2")):
            (primary, *backups) = ups[block]
            assert primary[0] == everyone[n - 1] and primary[0].startswith(first_address), (block, primary)
            assert "backup" not in primary and all("backup" in b for b in backups), (block, ups[block])
            assert sorted(args[0] for args in ups[block]) == sorted(everyone), (block, ups[block])
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
    nginx_text = scaleout.SHIPPED_NGINX.read_text()
    ups = scaleout.upstreams(nginx_text)
    routes = scaleout.session_routes(nginx_text)
    upstream = sorted({args[0] for servers in ups.values() for args in servers})
    replicas = sorted(name for name in services if name.startswith("replica"))
    assert sorted({u.split(":")[0] for u in upstream}) == replicas == ["replica1", "replica2"]
    assert "./nginx.conf:/etc/nginx/nginx.conf:ro" in services["nginx"]["volumes"]
    assert set(services["nginx"]["depends_on"]) == set(replicas)
    ids = []
    for name in replicas:
        replica = services[name]
        command = replica["command"].split()
        listen = command[command.index("--listen") + 1]
        address = f"{name}:{listen.rsplit(':', 1)[1]}"
        assert address in upstream, (name, listen, upstream)
        # The replica's id and the map agree: its sessions' ids route to its own block, whose
        # first server is this replica.
        rid = command[command.index("--replica-id") + 1]
        ids.append(rid)
        block = routes[f"~^{rid}\\."]
        assert ups[block][0][0] == address and "backup" not in ups[block][0], (name, rid, ups[block])
        # Beyond loopback, so with a token from the env file (never on the command line) ...
        assert command[command.index("--client-token-env") + 1] == "VISOR_CLIENT_TOKEN"
        assert replica["env_file"] == "visor.env"
        # ... shared state on the compose store, an audit log per replica (its own volume) ...
        assert command[command.index("--state") + 1].startswith("redis://valkey:")
        assert "--audit-log" in command
        # ... and the health check asks /healthz.
        assert any("/healthz" in part for part in replica["healthcheck"]["test"])
    assert len(set(ids)) == len(ids), ids
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


def _sid_of(c: Cluster, tag: str) -> str:
    """The session whose allowed calls carry this tag, from every replica's log."""
    (sid,) = {
        rec["mcp_session"]
        for r in c.replicas
        for rec in r.records()
        if rec["event"] == "allow" and rec.get("args", {}).get("tag") == tag
    }
    return sid


def _events(replica: Serve, sid: str) -> list[str]:
    return [rec["event"] for rec in replica.records() if rec.get("mcp_session") == sid]


def _until(done: Any, what: str) -> None:
    """Wait (with a deadline, not an assertion about speed) until `done()`."""
    deadline = time.monotonic() + 30
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within 30 s: {what}")
        time.sleep(0.05)


@needs_services
def test_each_session_stays_on_the_replica_that_minted_its_id_with_no_shared_store(tmp_path: Path) -> None:
    """No `--state`: an initialize goes to any replica, and every later request of the session
    goes to the replica whose id begins its session id. Nothing moves: no 404, no adoption, one
    upstream process per session, and the client's DELETE ends it (none is left idle)."""
    with cluster(tmp_path, state=False) as c:
        # Sessions until both replicas have opened some (initializes go round-robin).
        seen: dict[str, set[int]] = {}
        for k in range(16):
            tag = f"s{k}"
            pids, errors = _run(lambda tag=tag: _session_pids(c, tag, 4))
            assert errors == [False] * 4, (tag, errors)
            seen[tag] = pids
            if k >= 3 and len({c.minted_by(_sid_of(c, t)).url for t in seen}) == 2:
                break
        sids = {tag: _sid_of(c, tag) for tag in seen}
        assert {c.minted_by(sid).url for sid in sids.values()} == {r.url for r in c.replicas}, sids
        # Each session lived on the replica that minted its id, and only there ...
        for tag, sid in sids.items():
            minter = c.minted_by(sid)
            assert c.owner_of(sid) is minter, (tag, sid)
            assert "session_start" in _events(minter, sid), (tag, sid)
            for other in c.replicas:
                if other is not minter:
                    assert _events(other, sid) == [], (tag, sid, _events(other, sid))
        assert not [rec for r in c.replicas for rec in r.records() if rec["event"] == "session_adopted"]
        # ... every call of a session reached one upstream process, different sessions had
        # different ones, and no session started a second one.
        for tag, pids in seen.items():
            assert len(pids) == 1, (tag, pids)
            received = {call["pid"] for call in c.calls() if call["arguments"].get("tag") == tag}
            assert received == pids, (tag, received, pids)
        assert len({next(iter(p)) for p in seen.values()}) == len(seen)
        assert sorted(c.upstream_pids()) == sorted(next(iter(p)) for p in seen.values())
        # No request was refused or lost on the way: initialize, initialized, the GET stream,
        # every call and the DELETE, all answered by the replica holding the session.
        statuses = c.access_statuses()
        assert statuses and set(statuses) <= {200, 202}, sorted(statuses)
        # The DELETE reached that replica, which ended the upstream: none is left idle.
        _until(lambda: not any(alive(pid) for pid in c.upstream_pids()), "every upstream process ended")

        # An id with no replica's prefix goes to any replica, which does not know it.
        ping = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
        for sid in ("r9." + "0" * 32, "0" * 32):
            status, _, body = _raw(c, "POST", ping, {**_POST_HEADERS, "Mcp-Session-Id": sid})
            assert status == 404 and json.loads(body)["error"]["message"].startswith("Session not found"), (
                body
            )

        # The edge: another Host is refused by nginx (a rebound DNS name never reaches a replica),
        init = json.dumps(INIT).encode()
        status, _, _ = _raw(c, "POST", init, {**_POST_HEADERS, "Host": "rebound.example"})
        assert status == 421
        # Origin reaches the replicas unchanged, so their Origin check still refuses a foreign page,
        status, _, body = _raw(c, "POST", init, {**_POST_HEADERS, "Origin": "https://evil.example"})
        assert status == 403 and json.loads(body)["error"]["message"].startswith("Forbidden: this Origin")
        # so does MCP-Protocol-Version (a replica refuses one it does not serve),
        status, _, body = _raw(
            c,
            "POST",
            ping,
            {**_POST_HEADERS, "Mcp-Session-Id": "r1." + "0" * 32, "MCP-Protocol-Version": "1999-01-01"},
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


def _whoami(c: Cluster, sid: str, tag: str) -> tuple[int, bytes]:
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "whoami", "arguments": {"tag": tag}},
    }
    status, _, body = _raw(c, "POST", json.dumps(call).encode(), {**_POST_HEADERS, "Mcp-Session-Id": sid})
    return status, body


@needs_services
def test_without_state_a_killed_replicas_session_is_refused_by_the_survivor_not_mixed(tmp_path: Path) -> None:
    """The replica holding a session dies: nginx sends its requests to the other replica (its
    block's `backup`), which never saw the session and has no store to continue it from: 404,
    and the client starts a new session there (never someone else's)."""
    with cluster(tmp_path, state=False) as c:
        init = json.dumps(INIT).encode()
        initialized = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode()
        status, headers, body = _raw(c, "POST", init, _POST_HEADERS)
        assert status == 200, body
        sid = headers["mcp-session-id"]
        status, _, body = _raw(c, "POST", initialized, {**_POST_HEADERS, "Mcp-Session-Id": sid})
        assert status == 202, body
        status, body = _whoami(c, sid, "before")
        assert status == 200 and json.loads(body)["result"]["isError"] is False, body
        holder = c.minted_by(sid)
        (survivor,) = [r for r in c.replicas if r is not holder]
        holder.proc.send_signal(signal.SIGKILL)
        holder.proc.wait()

        status, body = _whoami(c, sid, "after")
        assert status == 404 and json.loads(body)["error"]["message"].startswith("Session not found"), body
        assert [call["arguments"]["tag"] for call in c.calls()] == ["before"]
        assert _events(survivor, sid) == []
        # A new session opens on the survivor (the dead replica's connection is refused, so
        # nginx passes the initialize on) and works.
        status, headers, body = _raw(c, "POST", init, _POST_HEADERS)
        assert status == 200, body
        fresh = headers["mcp-session-id"]
        assert c.minted_by(fresh) is survivor, fresh
        assert _raw(c, "POST", initialized, {**_POST_HEADERS, "Mcp-Session-Id": fresh})[0] == 202
        status, body = _whoami(c, fresh, "fresh")
        assert status == 200 and json.loads(body)["result"]["isError"] is False, body


# ---------------------------------------------------------------- failover
def _verify(log: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "visor.cli", "audit", "verify", str(log)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip


def _key(tool: str, arguments: Any) -> tuple[str, str]:
    return tool, json.dumps(arguments, sort_keys=True)


def _direct_count(replica: Serve, sid: str, tag: str, n: int) -> Any:
    """A budgeted call sent to one replica directly, as nginx sends a session's request to its
    block's backup while the first replica cannot be reached. The answer's JSON-RPC message."""
    call = {
        "jsonrpc": "2.0",
        "id": "direct",
        "method": "tools/call",
        "params": {"name": "count", "arguments": {"tag": tag, "n": n}},
    }
    reply = plain_http(
        "POST",
        replica.url,
        json.dumps(call).encode(),
        {**_POST_HEADERS, "Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-11-25"},
    )
    assert reply.status == 200, reply
    if reply.headers["content-type"].startswith("text/event-stream"):
        data = [line[5:].strip() for line in reply.body.decode().splitlines() if line.startswith("data:")]
        return json.loads(data[-1])
    return reply.json()


def _failover(c: Cluster, *, survivor_held_it: bool) -> None:
    """Open a session through nginx, spend two of its three budgeted calls and read the address
    on the replica that holds it, SIGKILL that replica, and go on in the same SDK session (so
    under the same Mcp-Session-Id) through the survivor (its block's backup).

    `survivor_held_it`: the second call reaches the survivor instead (as it does while the
    holder cannot be reached for a moment), so the survivor continues the session from the store
    and keeps it, the holder then goes on with counts it did not make, and when the holder dies
    the survivor goes on with counts it did not make either: each judges the call on the store's
    counts, none refuses it as a conflict."""

    async def main() -> tuple[str, list[types.CallToolResult], types.CallToolResult]:
        tag = "s0"
        async with (
            _client(c) as hc,
            streamable_http_client(c.front.url, http_client=hc) as (r, w),
            ClientSession(r, w) as s,
        ):
            await s.initialize()
            await s.list_tools()
            assert not (await s.call_tool("count", {"tag": tag, "n": 1})).is_error
            sid = await asyncio.to_thread(_sid_of, c, tag)
            holder = c.minted_by(sid)
            (survivor,) = [x for x in c.replicas if x is not holder]
            if survivor_held_it:
                answer = await asyncio.to_thread(_direct_count, survivor, sid, tag, 2)
                assert answer["result"]["isError"] is False, answer
            else:
                assert not (await s.call_tool("count", {"tag": tag, "n": 2})).is_error
            assert MALLORY in _text(await s.call_tool("read_inbox", {"tag": tag}))
            holder.proc.send_signal(signal.SIGKILL)
            holder.proc.wait()
            after = [await s.call_tool("count", {"tag": tag, "n": n}) for n in (3, 4)]
            send = await s.call_tool("send_mail", {"to": MALLORY, "body": tag})
            return sid, after, send

    sid, after, send = _run(main)
    holder = c.minted_by(sid)
    (survivor,) = [r for r in c.replicas if r is not holder]
    texts = [_text(x) for x in (*after, send)]
    # The budget (max_calls: 3) holds across replicas: the third call is allowed, the fourth not.
    assert [bool(x.is_error) for x in after] == [False, True], texts
    # Provenance holds: the address read on the dead replica is still untrusted output.
    assert send.is_error, texts
    denies = [
        (rec["tool"], rec["rule"])
        for r in c.replicas
        for rec in r.records()
        if rec["event"] == "deny" and rec.get("mcp_session") == sid
    ]
    assert denies == [("count", "budget.max_calls"), ("send_mail", "provenance.untrusted_output")], denies
    # Both on the survivor, after the kill (nothing was refused as a conflict anywhere).
    assert sum(rec["event"] == "deny" for rec in survivor.records()) == 2
    mine = [
        (call["tool"], call["arguments"].get("n"))
        for call in c.calls()
        if call["arguments"].get("tag") == "s0"
    ]
    assert mine == [("count", 1), ("count", 2), ("read_inbox", None), ("count", 3)], mine
    # The holder opened the session; the survivor continued it from the store, once.
    assert "session_start" in _events(holder, sid) and "session_adopted" not in _events(holder, sid)
    assert _events(survivor, sid).count("session_adopted") == 1, _events(survivor, sid)
    # Where each call ran: the survivor served the direct call (if any) and everything after the kill.
    on_survivor = [
        (rec["tool"], rec["args"].get("n")) for rec in survivor.records() if rec["event"] == "allow"
    ]
    assert on_survivor == ([("count", 2)] if survivor_held_it else []) + [("count", 3)], on_survivor

    # Every call an upstream process received has its allow record in one of the two logs:
    # the dead replica's were durable before it relayed them.
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
def test_a_replica_killed_mid_session_the_survivor_continues_it_with_budget_and_provenance(
    tmp_path: Path,
) -> None:
    with cluster(tmp_path, state=True) as c:
        _failover(c, survivor_held_it=False)


@needs_services
def test_a_session_that_went_back_and_forth_between_replicas_keeps_its_budget_and_provenance(
    tmp_path: Path,
) -> None:
    with cluster(tmp_path, state=True) as c:
        _failover(c, survivor_held_it=True)


# ---------------------------------------------------------------- 2026-07-28: no session id
def _conversation(c: Cluster, *, state: bool) -> None:
    """A 2026-07-28 client sends no Mcp-Session-Id; a replica keeps one conversation per client
    credential, and nginx sends every request made with one credential to one replica (a hash of
    Authorization). So the conversation's budget and provenance hold without a store. With
    `--state`, that replica is then killed, and the other continues the conversation."""

    async def main() -> tuple[list[types.CallToolResult], str, types.CallToolResult, list[Any]]:
        async with (
            _client(c) as hc,
            streamable_http_client(c.front.url, http_client=hc) as (r, w),
            ClientSession(r, w) as s,
        ):
            await s.discover()
            counts = [await s.call_tool("count", {"tag": "modern", "n": n}) for n in (1, 2, 3, 4)]
            inbox = _text(await s.call_tool("read_inbox", {"tag": "modern"}))
            send = await s.call_tool("send_mail", {"to": MALLORY, "body": "modern"})
            after: list[Any] = []
            if state:
                (holder,) = {r.url for r in c.replicas for rec in r.records() if rec["event"] == "allow"}
                (dead,) = [r for r in c.replicas if r.url == holder]
                dead.proc.send_signal(signal.SIGKILL)
                dead.proc.wait()
                after = [
                    await s.call_tool("count", {"tag": "modern", "n": 5}),
                    await s.call_tool("send_mail", {"to": MALLORY, "body": "after"}),
                    await s.call_tool("whoami", {"tag": "after"}),
                ]
            return counts, inbox, send, after

    counts, inbox, send, after = _run(main)
    assert [bool(x.is_error) for x in counts] == [False, False, False, True], [_text(x) for x in counts]
    assert MALLORY in inbox and send.is_error, _text(send)
    # A deny is answered at once and written by the audit thread just after (only an allow waits
    # for its record to be durable): read the logs of the living replicas once the denies the
    # client saw there are all written. A replica killed just after answering may have lost its
    # last deny records; its allows are all there (they were durable before they ran).
    living = [r for r in c.replicas if r.proc.poll() is None]
    want = 2
    deadline = time.monotonic() + 30
    while True:
        records = [(r, rec) for r in c.replicas for rec in r.records() if rec["event"] in ("allow", "deny")]
        live_denies = sum(rec["event"] == "deny" for r, rec in records if r in living)
        if live_denies >= want or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    # One conversation (no session id); before any kill, every call of it on one replica.
    assert len({rec["mcp_session"] for _, rec in records}) == 1, records
    rules = [rec["rule"] for _, rec in records if rec["event"] == "deny"]
    received = [(call["tool"], call["arguments"].get("n")) for call in c.calls()]
    if not state:
        assert len({r.url for r, _ in records}) == 1, records
        assert rules == ["budget.max_calls", "provenance.untrusted_output"], rules
        assert received == [("count", 1), ("count", 2), ("count", 3), ("read_inbox", None)], received
        return
    # The survivor continued it: the budget is still spent, the address still untrusted.
    assert [bool(x.is_error) for x in after] == [True, True, False], [_text(x) for x in after]
    assert len({r.url for r, _ in records}) == 2, records
    survivor_rules = [rec["rule"] for r, rec in records if rec["event"] == "deny" and r in living]
    assert survivor_rules == ["budget.max_calls", "provenance.untrusted_output"], rules
    dead_rules = [rec["rule"] for r, rec in records if rec["event"] == "deny" and r not in living]
    assert dead_rules == ["budget.max_calls", "provenance.untrusted_output"][: len(dead_rules)], rules
    assert received[-1] == ("whoami", None) and len(received) == 5, received
    # Every call an upstream received was allowed on record first, the dead replica's included.
    assert len([rec for _, rec in records if rec["event"] == "allow"]) == len(received), records


@needs_services
def test_a_sessionless_conversation_stays_on_one_replica_and_its_budget_holds_without_state(
    tmp_path: Path,
) -> None:
    with cluster(tmp_path, state=False) as c:
        _conversation(c, state=False)


@needs_services
def test_a_sessionless_conversation_continues_on_the_survivor_with_state(tmp_path: Path) -> None:
    with cluster(tmp_path, state=True) as c:
        _conversation(c, state=True)


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
