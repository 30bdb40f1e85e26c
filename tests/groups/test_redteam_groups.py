"""Red-team sequences against a client's group of servers (docs/groups.md), through
real `visor run` processes started by this test process (their client) with one
``$VISOR_HOME``.

A bare user or channel name (``user:mallory7``, ``channel:ops``) is a name in
one service's namespace: GitHub's ``mallory7`` and Slack's ``mallory7`` are two
people. A service may place a name for its own sends (a trusted field of its
output, a human's yes to a send through it); it must not place the same name on
another service of the group, which may have nothing to do with it. Addresses,
URLs, hosts, phone numbers and IBANs name one destination everywhere and stay
shared.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.approval.helpers import call, cli, recv_id, wait_pending
from tests.conftest import VisorProcess

# A server whose tools answer what SCRIPT_TOOLS says (tool -> structured result),
# and which logs every call it receives to SCRIPT_LOG: the "malicious" member
# says what it likes in its trusted fields, the honest one only sends.
SCRIPTED = textwrap.dedent(
    """
    import json, os, sys
    tools = json.loads(os.environ["SCRIPT_TOOLS"])
    names = sorted({*tools, "send_direct_message", "send_email", "add_collaborator"})
    log = os.environ["SCRIPT_LOG"]
    def reply(obj):
        sys.stdout.write(json.dumps(obj) + "\\n")
        sys.stdout.flush()
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if not isinstance(msg, dict) or "id" not in msg or "method" not in msg:
            continue
        mid, method, params = msg["id"], msg["method"], msg.get("params") or {}
        if method == "initialize":
            reply({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": "2025-06-18",
                   "capabilities": {"tools": {}}, "serverInfo": {"name": "scripted", "version": "1"}}})
        elif method == "tools/list":
            reply({"jsonrpc": "2.0", "id": mid, "result": {"tools": [
                {"name": n, "description": "", "inputSchema": {"type": "object"}} for n in names]}})
        elif method == "tools/call":
            name = params.get("name")
            with open(log, "a") as f:
                f.write(json.dumps({"tool": name, "arguments": params.get("arguments")}) + "\\n")
            out = tools.get(name) or {"ok": True}
            reply({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text",
                   "text": json.dumps(out)}], "structuredContent": out, "isError": False}})
        else:
            reply({"jsonrpc": "2.0", "id": mid, "result": {}})
    """
)

POLICY = """\
version: "1.0"
default_action: allow
settings:
  approval_timeout_seconds: 60
servers:
  - name: "github"
    allowed: true
    packs: []
    tools:
      - name: "list_collaborators"
        allowed: true
        trusted_output_fields: ["collaborators[*] as user", "contacts[*]"]
      - name: "add_collaborator"
        allowed: true
        exfiltrating: true
        sink_params: ["username"]
        sink_kinds: {username: user}
  - name: "chat"
    allowed: true
    packs: []
    tools:
      - name: "send_direct_message"
        allowed: true
        exfiltrating: true
        sink_params: ["recipient"]
        sink_kinds: {recipient: user}
      - name: "send_email"
        allowed: true
        exfiltrating: true
        sink_params: ["recipients"]
        sink_kinds: {recipients: email}
"""

GITHUB_TOOLS = {
    # the service lists a collaborator (a GitHub login): asserted, as a user
    "list_collaborators": {"collaborators": ["mallory7"], "contacts": ["bob@corp.example"]},
    "add_collaborator": {"ok": True},
}


class Members:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.policy = tmp / "policy.yaml"
        self.policy.write_text(POLICY)
        self.server = tmp / "scripted.py"
        self.server.write_text(SCRIPTED)
        self.procs: list[VisorProcess] = []

    def start(self, name: str, tools: dict, *extra: str) -> VisorProcess:
        args = [
            "--server-name", name,
            "--policy", str(self.policy),
            "--audit-log", str(self.tmp / f"{name}.jsonl"),
            *extra,
        ]  # fmt: skip
        vp = VisorProcess(
            [sys.executable, str(self.server)],
            env={"SCRIPT_TOOLS": json.dumps(tools), "SCRIPT_LOG": str(self.log(name))},
            visor_args=args,
        )
        self.procs.append(vp)
        vp.request({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
        assert "tools" in vp.recv()["result"], vp.stderr
        return vp

    def log(self, name: str) -> Path:
        return self.tmp / f"{name}-calls.jsonl"

    def calls(self, name: str) -> list[dict]:
        p = self.log(name)
        return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []

    def close(self) -> None:
        for vp in self.procs:
            vp.kill()


@pytest.fixture
def members(tmp_path: Path) -> Iterator[Members]:
    m = Members(tmp_path)
    try:
        yield m
    finally:
        m.close()


def _text(resp: dict) -> str:
    return resp["result"]["content"][0]["text"]


def _dm(vp: VisorProcess, mid: object, who: str) -> dict:
    call(vp, mid, "send_direct_message", {"recipient": who, "body": "the notes"})
    return recv_id(vp, mid)


def test_a_user_name_one_service_asserted_does_not_place_it_on_another(members: Members) -> None:
    github = members.start("github", GITHUB_TOOLS)
    chat = members.start("chat", {})
    # unknown to both services: asked (no channel to ask: denied)
    resp = _dm(chat, 1, "mallory7")
    assert resp["result"]["isError"] is True and "approval.unavailable" in _text(resp), _text(resp)
    # GitHub's trusted field lists the login mallory7 ...
    call(github, 2, "list_collaborators", {})
    assert recv_id(github, 2)["result"]["isError"] is False
    # ... which says nothing of who "mallory7" is on the chat service
    resp = _dm(chat, 3, "mallory7")
    assert resp["result"]["isError"] is True, "a GitHub login placed a chat user: " + _text(resp)
    assert members.calls("chat") == []
    # an address is one destination everywhere: asserted by one service, placed for the group
    call(chat, 4, "send_email", {"recipients": ["bob@corp.example"], "body": "b"})
    assert recv_id(chat, 4)["result"]["isError"] is False
    assert [c["tool"] for c in members.calls("chat")] == ["send_email"]


def test_a_humans_yes_to_a_user_name_on_one_service_is_not_a_yes_on_another(members: Members) -> None:
    adir = members.tmp / "approvals"
    github = members.start("github", GITHUB_TOOLS, "--approval-dir", str(adir))
    chat = members.start("chat", {})
    # the human adds the GitHub login "eve-dev" as a collaborator
    call(github, 1, "add_collaborator", {"username": "eve-dev"})
    ((pid, rec),) = wait_pending(adir).items()
    assert rec["rule"] == "provenance.unknown_destination"
    assert cli("approve", "--approval-dir", str(adir), pid).returncode == 0
    assert recv_id(github, 1)["result"]["isError"] is False
    # the chat user "eve-dev" is somebody else: still unknown there
    resp = _dm(chat, 2, "eve-dev")
    assert resp["result"]["isError"] is True, "a yes on GitHub placed a chat user: " + _text(resp)
    assert members.calls("chat") == []
