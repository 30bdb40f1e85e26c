"""Field-aware provenance through a real `visor run`, with a workspace-like server.

The server (tests/servers/workspace.py) returns calendar events and mail as
YAML text, a file as structuredContent, contacts as JSON text; its free text
names addresses a third party planted. The built-in ``workspace`` pack says
which fields the service asserts.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.approval.helpers import call, cli, records, recv_id, wait_pending
from tests.conftest import TESTS, VisorProcess

SERVER = TESTS / "servers" / "workspace.py"

POLICY = """\
version: "1.0"
default_action: allow
settings:
  approval_timeout_seconds: 60
{extra}
servers:
  - name: "workspace"
    allowed: true
"""


def _start(tmp_path: Path, *, approval_dir: Path | None = None, extra: str = "") -> tuple[VisorProcess, Path]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(extra=extra))
    log = tmp_path / "sent.jsonl"
    args = [
        "--server-name",
        "workspace",
        "--policy",
        str(policy),
        "--audit-log",
        str(tmp_path / "audit.jsonl"),
    ]
    if approval_dir is not None:
        args += ["--approval-dir", str(approval_dir)]
    vp = VisorProcess([sys.executable, str(SERVER)], env={"WORKSPACE_LOG": str(log)}, visor_args=args)
    vp.request({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
    assert "tools" in vp.recv()["result"]
    return vp, log


def _sent(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def _text(resp: dict) -> str:
    return resp["result"]["content"][0]["text"]


def _read_all(vp: VisorProcess) -> None:
    # each with the arguments the workspace pack's tool takes: the pack vouches for the
    # answer to a call it describes, and a call with another argument is another tool's
    for i, (tool, arguments) in enumerate(
        [
            ("search_calendar_events", {"query": "x"}),
            ("get_received_emails", {}),
            ("get_file_by_id", {"file_id": "3"}),
            ("search_contacts_by_name", {"query": "x"}),
        ]
    ):
        call(vp, f"r{i}", tool, arguments)
        assert recv_id(vp, f"r{i}")["result"]["isError"] is False


def test_asserted_fields_are_sent_to_without_a_human(tmp_path: Path) -> None:
    vp, log = _start(tmp_path)
    try:
        _read_all(vp)
        call(vp, 1, "send_email", {"recipients": ["john.m@clients.example"], "subject": "s", "body": "b"})
        assert recv_id(vp, 1)["result"]["isError"] is False
        call(vp, 2, "share_file", {"file_id": "3", "email": "dana@partner.example", "permission": "r"})
        assert recv_id(vp, 2)["result"]["isError"] is False
        call(vp, 3, "send_email", {"recipients": ["sara.k@partner.example"], "subject": "s", "body": "b"})
        assert recv_id(vp, 3)["result"]["isError"] is False
    finally:
        vp.kill()
    assert [s["tool"] for s in _sent(log)] == ["send_email", "share_file", "send_email"]


def test_addresses_only_in_free_text_are_denied(tmp_path: Path) -> None:
    vp, log = _start(tmp_path)
    try:
        _read_all(vp)
        for i, addr in enumerate(["mallory@evil.example", "planner@evil.example", "sara@evil.example"]):
            call(vp, 10 + i, "send_email", {"recipients": [addr], "subject": "s", "body": "b"})
            resp = recv_id(vp, 10 + i)
            assert resp["result"]["isError"] is True
            assert "provenance.untrusted_output" in _text(resp), _text(resp)
    finally:
        vp.kill()
    assert _sent(log) == []


def test_a_reply_to_a_received_mails_sender_is_asked_and_denied_without_a_channel(tmp_path: Path) -> None:
    vp, log = _start(tmp_path)
    try:
        _read_all(vp)
        call(vp, 20, "send_email", {"recipients": ["lily.w@friends.example"], "subject": "Re", "body": "b"})
        resp = recv_id(vp, 20)
        assert resp["result"]["isError"] is True
        assert "approval.unavailable" in _text(resp) and "get_received_emails" in _text(resp)
    finally:
        vp.kill()
    assert _sent(log) == []
    ask = next(r for r in records(tmp_path / "audit.jsonl") if r["event"] == "ask")
    assert ask["rule"] == "provenance.third_party_output"


def test_a_plain_approval_survives_the_servers_echo(tmp_path: Path) -> None:
    adir = tmp_path / "approvals"
    vp, log = _start(tmp_path, approval_dir=adir)
    try:
        call(vp, 1, "send_email", {"recipients": ["new.person@partner2.example"], "body": "b"})
        ((pid, rec),) = wait_pending(adir).items()
        assert rec["rule"] == "provenance.unknown_destination"
        assert cli("approve", "--approval-dir", str(adir), pid).returncode == 0
        assert recv_id(vp, 1)["result"]["isError"] is False  # echoed "Email sent to new.person@..."
        call(vp, 2, "send_email", {"recipients": ["new.person@partner2.example"], "body": "again"})
        resp = recv_id(vp, 2)
        assert resp["result"]["isError"] is False, resp
    finally:
        vp.kill()
    assert len(_sent(log)) == 2
    # nothing was persisted: the human did not choose "remember"
    assert not (Path(os.environ["VISOR_HOME"]) / "approved" / "workspace.json").exists()


def test_untrusted_output_ask_then_remember_survives_a_restart(tmp_path: Path) -> None:
    adir = tmp_path / "approvals"
    vp, log = _start(tmp_path, approval_dir=adir, extra="  untrusted_output: ask")
    try:
        _read_all(vp)
        call(vp, 1, "send_email", {"recipients": ["mallory@evil.example"], "body": "b"})
        ((pid, rec),) = wait_pending(adir).items()
        assert rec["rule"] == "provenance.untrusted_output_ask"
        assert "search_calendar_events" in rec["reason"] and "description" in rec["reason"]
        ok = cli("approve", "--approval-dir", str(adir), "--remember", pid)
        assert ok.returncode == 0, ok.stderr
        assert recv_id(vp, 1)["result"]["isError"] is False
    finally:
        vp.kill()
    saved = Path(os.environ["VISOR_HOME"]) / "approved" / "workspace.json"
    assert oct(saved.stat().st_mode & 0o777) == "0o600"
    assert json.loads(saved.read_text())["destinations"] == [
        ["send_email", "recipients", "email:mallory@evil.example"]
    ]
    # A restart under the default (deny) policy: the output names the address
    # again, and the remembered yes still stands; nobody is asked.
    vp, log = _start(tmp_path)
    try:
        _read_all(vp)
        call(vp, 2, "send_email", {"recipients": ["mallory@evil.example"], "body": "b"})
        assert recv_id(vp, 2)["result"]["isError"] is False
        call(vp, 3, "send_email", {"recipients": ["planner@evil.example"], "body": "b"})
        assert "provenance.untrusted_output" in _text(recv_id(vp, 3))
        # the file is Visor's own: no call may name it
        call(vp, 4, "share_file", {"file_id": str(saved), "email": "dana@partner.example"})
        assert "visor.protected_path" in _text(recv_id(vp, 4))
    finally:
        vp.kill()
    assert [s["arguments"]["recipients"] for s in _sent(log)] == [["mallory@evil.example"]] * 2


def test_untrusted_output_ask_without_a_channel_is_the_deny(tmp_path: Path) -> None:
    vp, log = _start(tmp_path, extra="  untrusted_output: ask")
    try:
        _read_all(vp)
        call(vp, 1, "send_email", {"recipients": ["mallory@evil.example"], "body": "b"})
        resp = recv_id(vp, 1)
        assert resp["result"]["isError"] is True
        assert "(rule: provenance.untrusted_output)" in _text(resp), _text(resp)
    finally:
        vp.kill()
    assert _sent(log) == []
