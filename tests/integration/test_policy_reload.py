"""SIGHUP reloads a running `visor run`'s policy: a real process, a real server, a real audit log."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import RECORDER, VisorProcess, received, sentinel
from tests.serve.serve_proc import SDK_SERVER, Reply, initialize, post, serve

POLICY = """\
version: "1.0"
default_action: deny
servers:
  - name: "rec"
    allowed: true
    tools:
      - name: "echo"
        allowed: true
"""

# send_email allowed as well
WIDER = (
    POLICY
    + """\
      - name: "send_email"
        allowed: true
"""
)

# A key the loader does not know, on line 10.
BROKEN = (
    POLICY
    + """\
      - name: "send_email"
        alowed: true
"""
)


def _start(tmp_path: Path, *options: str) -> tuple[VisorProcess, Path, Path, Path]:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY)
    log = tmp_path / "received.jsonl"
    audit = tmp_path / "audit" / "audit.jsonl"
    vp = VisorProcess(
        [sys.executable, str(RECORDER)],
        env={"RECORDER_LOG": str(log), "RECORDER_AUDIT": str(audit)},
        visor_args=[
            "--server-name",
            "rec",
            "--policy",
            str(policy_file),
            "--audit-log",
            str(audit),
            *options,
        ],
    )
    vp.request({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
    assert "tools" in vp.recv()["result"]
    log.write_bytes(b"")
    return vp, policy_file, log, audit


def _call(vp: VisorProcess, msg_id: int, tool: str) -> dict:
    vp.request(
        {"jsonrpc": "2.0", "id": msg_id, "method": "tools/call", "params": {"name": tool, "arguments": {}}}
    )
    return vp.recv()


def _hangup(vp: VisorProcess, expect: str) -> None:
    """SIGHUP, then wait until stderr says how the reload ended (`expect`, counted)."""
    before = vp.stderr.count(expect)
    vp.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 15
    while vp.stderr.count(expect) == before:
        assert vp.proc.poll() is None, f"visor run exited on SIGHUP: {vp.stderr}"
        assert time.monotonic() < deadline, f"no {expect} on stderr: {vp.stderr}"
        time.sleep(0.02)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _verify(audit: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "visor.cli", "audit", "verify", str(audit)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_sighup_puts_an_edited_policy_in_force_and_a_broken_one_leaves_it(tmp_path: Path) -> None:
    vp, policy_file, log, audit = _start(tmp_path)
    try:
        denied = _call(vp, 1, "send_email")
        assert denied["result"]["isError"] is True
        assert "Visor denied this call" in denied["result"]["content"][0]["text"]

        policy_file.write_text(WIDER)
        _hangup(vp, "policy_reloaded")
        allowed = _call(vp, 2, "send_email")
        assert allowed["result"]["structuredContent"] == {"audit_allow_present": True}, allowed
        sentinel(vp)
        assert [json.loads(line)["params"]["name"] for line in received(log) if b"tools/call" in line] == [
            "send_email"
        ]

        policy_file.write_text(BROKEN)
        _hangup(vp, "policy_reload_failed")
        # The loader's own words: file, line and key.
        assert f"{policy_file}:10: servers[0].tools[1].alowed" in vp.stderr, vp.stderr
        assert "the policy in force is unchanged" in vp.stderr
        still = _call(vp, 3, "send_email")
        assert still["result"]["isError"] is False, still
    finally:
        vp.close_stdin()
        assert vp.wait() == 0
    records = [json.loads(line) for line in audit.read_bytes().splitlines()]
    reloads = [r for r in records if r["event"] == "policy_reload"]
    assert [(r["ok"], r["previous"], r.get("policy")) for r in reloads] == [
        (True, _sha(POLICY), _sha(WIDER)),
        (False, _sha(WIDER), _sha(BROKEN)),
    ]
    assert "alowed" in reloads[1]["error"]
    verdicts = [(r["event"], r["id"], r["policy"]) for r in records if r["event"] in ("allow", "deny")]
    assert verdicts == [
        ("deny", 1, _sha(POLICY)),
        ("allow", 2, _sha(WIDER)),
        ("allow", 3, _sha(WIDER)),
    ]
    _verify(audit)


def _wait_for(vp: VisorProcess, text: str) -> None:
    deadline = time.monotonic() + 15
    while text not in vp.stderr:
        assert vp.proc.poll() is None, vp.stderr
        assert time.monotonic() < deadline, f"no {text} on stderr: {vp.stderr}"
        time.sleep(0.02)


def test_watch_policy_reloads_when_the_file_changes(tmp_path: Path) -> None:
    vp, policy_file, _log, audit = _start(tmp_path, "--watch-policy")
    try:
        assert _call(vp, 1, "send_email")["result"]["isError"] is True
        # An editor's save: a new file renamed over the old one.
        fresh = tmp_path / "policy.yaml.new"
        fresh.write_text(WIDER)
        fresh.replace(policy_file)
        _wait_for(vp, "policy_reloaded")
        assert _call(vp, 2, "send_email")["result"]["isError"] is False
    finally:
        vp.close_stdin()
        assert vp.wait() == 0
    reloads = [
        r for r in (json.loads(x) for x in audit.read_bytes().splitlines()) if r["event"] == "policy_reload"
    ]
    assert [(r["ok"], r["policy"]) for r in reloads] == [(True, _sha(WIDER))]


def test_watch_policy_without_a_policy_file_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "visor.cli", "run", "--watch-policy", "--", sys.executable, str(RECORDER)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "--watch-policy watches the --policy FILE" in proc.stderr


def _answer(reply: Reply) -> dict:
    """The JSON-RPC answer of a POST, sent as JSON or as the last event of its SSE stream."""
    assert reply.status == 200, reply
    if reply.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in reply.body.decode().splitlines() if line.startswith("data:")]
        return json.loads(data[-1])
    return reply.json()


def _serve_call(url: str, sid: str, msg_id: int, tool: str, arguments: dict) -> dict:
    message = {
        "jsonrpc": "2.0",
        "id": msg_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }
    return _answer(post(url, message, sid))


def test_sighup_reloads_every_session_of_visor_serve_and_the_next_ones(tmp_path: Path) -> None:
    policy = POLICY.replace('"rec"', '"sdk"').replace('"echo"', '"add"')
    wider = policy + '      - name: "weather"\n        allowed: true\n'
    with serve(tmp_path, [sys.executable, str(SDK_SERVER)], "--server-name", "sdk", policy=policy) as gw:
        first = initialize(gw.url)
        denied = _serve_call(gw.url, first, 1, "weather", {"city": "Oslo"})
        assert denied["result"]["isError"] is True, denied
        (tmp_path / "policy.yaml").write_text(wider)
        gw.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 15
        while "policy_reloaded" not in gw.stderr():
            assert gw.proc.poll() is None and time.monotonic() < deadline, gw.stderr()
            time.sleep(0.02)
        allowed = _serve_call(gw.url, first, 2, "weather", {"city": "Oslo"})
        assert allowed["result"].get("isError") is not True, allowed
        # A session that starts after the reload runs under the reloaded policy too.
        second = initialize(gw.url)
        assert (
            _serve_call(gw.url, second, 1, "weather", {"city": "Oslo"})["result"].get("isError") is not True
        )
    records = gw.records()
    reloads = [(r["mcp_session"], r["ok"], r["policy"]) for r in records if r["event"] == "policy_reload"]
    assert reloads == [(first, True, _sha(wider)), (second, True, _sha(wider))]
    _verify(gw.audit)
