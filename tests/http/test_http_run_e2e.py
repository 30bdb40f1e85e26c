"""The real SDK stdio client -> `visor run --url` -> the real SDK server over streamable-http.

The client side, the policy, the audit log and the approvals are those of a stdio server: an
allowed call is relayed, a denied one is answered with the same tool error as on stdio, and the
audit log holds the same records.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from http_helpers import sdk_server
from mcp import ClientSession, StdioServerParameters, stdio_client

ROOT = Path(__file__).resolve().parents[2]
STDIO_SDK_SERVER = ROOT / "tests" / "servers" / "sdk_server.py"

POLICY = """\
version: "1.0"
default_action: deny
servers:
  - name: "remote"
    allowed: true
    tools:
      - name: "add"
        allowed: true
      - name: "slow_count"
        allowed: true
      - name: "confirm"
        allowed: true
      - name: "break_then_finish"
        allowed: true
      - name: "locate"
        allowed: true
"""


def dump(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


async def _elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"ok": True})


async def scenario(params: StdioServerParameters, modern: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    progress: list[float] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append(p)

    async with stdio_client(params) as (r, w), ClientSession(r, w, elicitation_callback=_elicit) as s:
        if modern:
            # 2026-07-28: no handshake; each request names its revision in _meta.
            await s.discover()
        else:
            await s.initialize()
        out["tools"] = sorted(t.name for t in (await s.list_tools()).tools)
        out["add"] = dump(await s.call_tool("add", {"a": 2, "b": 40}))
        out["fail"] = dump(await s.call_tool("fail", {"reason": "boom"}))
        out["slow_count"] = dump(await s.call_tool("slow_count", {"n": 3}, progress_callback=on_progress))
        if not modern:
            # The 2026-07-28 revision has no server-to-client requests on a stream.
            out["confirm"] = dump(await s.call_tool("confirm", {"question": "proceed?"}))
    out["progress"] = progress
    return out


def visor(tmp_path: Path, name: str, *args: str) -> tuple[StdioServerParameters, Path]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    audit = tmp_path / name / "audit.jsonl"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "visor.cli", "run", "--server-name", "remote", "--policy", str(policy),
              "--audit-log", str(audit), *args],
    )  # fmt: skip
    return params, audit


def records(audit: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in audit.read_text().splitlines()]


def test_visor_run_url_allows_denies_and_audits_as_on_stdio(tmp_path: Path) -> None:
    with sdk_server() as url:
        params, audit = visor(tmp_path, "http", "--url", url)
        over_http = anyio.run(scenario, params)
    stdio_params, stdio_audit = visor(tmp_path, "stdio", "--", sys.executable, str(STDIO_SDK_SERVER))
    over_stdio = anyio.run(scenario, stdio_params)

    assert over_http["add"]["content"][0]["text"] == "42"
    assert over_http["fail"]["isError"] is True
    assert "Visor denied this call" in over_http["fail"]["content"][0]["text"]
    # The deny is Visor's own answer, word for word the one a stdio server's client reads.
    assert over_http["fail"] == over_stdio["fail"]
    assert over_http["progress"] == [1, 2, 3]
    assert over_http["confirm"]["content"][0]["text"] == "accepted ok=True"

    got = records(audit)

    def events(rs: list[dict[str, Any]]) -> list[tuple[str, str | None, str | None]]:
        return [
            (r["event"], r.get("tool"), r.get("method"))
            for r in rs
            if r["event"] in ("allow", "deny", "result")
        ]

    assert events(got) == events(records(stdio_audit))
    tools = [(e, t) for e, t, _ in events(got) if t is not None]
    assert tools == [
        ("allow", "add"), ("result", "add"), ("deny", "fail"), ("allow", "slow_count"),
        ("result", "slow_count"), ("allow", "confirm"), ("result", "confirm"),
    ]  # fmt: skip
    assert got[-1]["event"] == "session_end"
    verify = subprocess.run(
        [sys.executable, "-m", "visor.cli", "audit", "verify", str(audit)], capture_output=True, text=True
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_visor_run_url_on_the_2026_07_28_revision(tmp_path: Path) -> None:
    with sdk_server() as url:
        params, audit = visor(tmp_path, "http", "--url", url)
        over_http = anyio.run(scenario, params, True)
    stdio_params, _ = visor(tmp_path, "stdio", "--", sys.executable, str(STDIO_SDK_SERVER))
    over_stdio = anyio.run(scenario, stdio_params, True)
    assert over_http["add"]["content"][0]["text"] == "42"
    assert over_http["add"]["resultType"] == "complete"
    assert over_http["fail"] == over_stdio["fail"] and over_http["fail"]["isError"] is True
    assert over_http["progress"] == [1, 2, 3]
    tools = [(r["event"], r.get("tool")) for r in records(audit) if r["event"] in ("allow", "deny")]
    assert tools == [("allow", "add"), ("deny", "fail"), ("allow", "slow_count")]


def test_client_eof_lets_a_call_in_flight_finish_then_deletes_the_session(tmp_path: Path) -> None:
    # As with a stdio server whose stdin closed: what was sent is still answered.
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "break_then_finish", "arguments": {"n": 1}}},
    ]  # fmt: skip
    with sdk_server() as url:
        params, audit = visor(tmp_path, "eof", "--url", url)
        p = subprocess.run(
            [params.command, *params.args], input="".join(json.dumps(m) + "\n" for m in lines),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert p.returncode == 0, p.stderr
    answers = {m["id"]: m for m in map(json.loads, p.stdout.splitlines())}
    assert answers[3]["result"]["content"][0]["text"] == "finished after the break (1)"
    assert "upstream_session_deleted" in p.stderr
    done = [
        r["event"] for r in records(audit) if r.get("tool") == "break_then_finish" and r["event"] != "pin"
    ]
    assert done == ["allow", "result"]


def test_2026_07_28_call_before_any_listing_carries_its_mcp_param_headers(tmp_path: Path) -> None:
    # Visor lists the tools itself before judging the call; that listing teaches the upstream
    # which arguments to mirror, and the SDK server refuses the call without them.
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"},
    }
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "locate", "arguments": {"region": "eu", "limit": 2}, "_meta": meta}}  # fmt: skip
    with sdk_server() as url:
        params, _ = visor(tmp_path, "param", "--url", url)
        p = subprocess.run(
            [params.command, *params.args],
            input=json.dumps(call) + "\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["result"]["content"][0]["text"] == "eu:2"


def test_bad_url_and_missing_variable_are_refused_before_anything_starts(tmp_path: Path) -> None:
    cases = {
        ("--url", "ftp://example.test/mcp"): "http:// or https://",
        ("--url", "http://127.0.0.1:9/mcp", "--header", "Authorization: Bearer ${VISOR_TEST_NO_SUCH_VAR}"):
            "environment variable VISOR_TEST_NO_SUCH_VAR is not set",
        ("--url", "http://127.0.0.1:9/mcp", "--", "server"): "not both",
        ("--header", "X-A: 1"): "only for an HTTP server given with --url",
    }  # fmt: skip
    for args, message in cases.items():
        p = subprocess.run(
            [sys.executable, "-m", "visor.cli", "run", *args],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        assert p.returncode == 2, (args, p.stderr)
        assert message in p.stderr, (args, p.stderr)
        assert p.stdout == ""


def test_a_401_upstream_ends_visor_run_with_the_reason(tmp_path: Path) -> None:
    with sdk_server("--token-env", "VISOR_TEST_TOKEN", env={"VISOR_TEST_TOKEN": "t0k"}) as url:
        policy = tmp_path / "policy.yaml"
        policy.write_text(POLICY)
        init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                           "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                      "clientInfo": {"name": "t", "version": "0"}}})  # fmt: skip
        p = subprocess.run(
            [sys.executable, "-m", "visor.cli", "run", "--server-name", "remote", "--policy", str(policy),
             "--audit-log", str(tmp_path / "a.jsonl"), "--url", url],
            input=init + "\n", capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert p.returncode == 1, p.stderr
    answer = json.loads(p.stdout.splitlines()[0])
    assert answer["id"] == 1 and "401" in answer["error"]["message"]
    assert url in p.stderr and "Authorization" in p.stderr and "WWW-Authenticate" in p.stderr
    assert "t0k" not in p.stderr


def test_sigterm_ends_visor_run_url_and_its_http_session(tmp_path: Path) -> None:
    import signal

    with sdk_server() as url:
        params, _ = visor(tmp_path, "sig", "--url", url)
        proc = subprocess.Popen(
            [params.command, *params.args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}  # fmt: skip
        proc.stdin.write(json.dumps(init).encode() + b"\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == 1
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        proc.stdin.close()
    assert proc.returncode == 0, err.decode()
    assert b"upstream_session_deleted" in err
