"""One client's servers as a group, through two real `visor run` processes.

Both are started by this test process (their client), each in front of the
workspace server (tests/servers/workspace.py) under its own server name:
``mail``, whose received mail names ``mallory@evil.example`` in its body
(free text a third party wrote), and ``chat``. The policy trusts
``@evil.example`` and ``@corp.example`` by domain, so that a send through
``chat`` is allowed unless the group says otherwise: what one server's
output showed, a taint it raised and a human's yes in it reach the other.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.approval.helpers import call, cli, records, recv_id, wait_pending
from tests.conftest import TESTS, VisorProcess

SERVER = TESTS / "servers" / "workspace.py"

SENDING = """
      - name: "send_email"
        allowed: true
        exfiltrating: true
        sink_params: ["recipients"]
        trusted_destinations: ["@corp.example", "@evil.example"]
      - name: "share_file"
        allowed: true
        exfiltrating: false
"""

POLICY = f"""\
version: "1.0"
default_action: allow
settings:
  approval_timeout_seconds: 60
taints:
  - name: "inbox_read"
    source_tools: ["get_received_emails"]
    source_servers: ["mail"]
egress_controls:
  - name: "no_sharing_after_the_inbox"
    when_tainted: "inbox_read"
    sink_tools: ["share_file"]
    sink_servers: ["chat"]
    action: deny
servers:
  - name: "mail"
    allowed: true
    packs: []
    tools:{SENDING}
  - name: "chat"
    allowed: true
    packs: []
    tools:{SENDING}
"""


class Pair:
    """The two sessions of one test, and what they leave behind."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.policy = tmp_path / "policy.yaml"
        self.policy.write_text(POLICY)
        self.procs: list[VisorProcess] = []

    def start(self, server: str, *extra: str, env: dict[str, str] | None = None) -> VisorProcess:
        args = [
            "--server-name", server,
            "--policy", str(self.policy),
            "--audit-log", str(self.audit(server)),
            *extra,
        ]  # fmt: skip
        vp = VisorProcess(
            [sys.executable, str(SERVER)],
            env={"WORKSPACE_LOG": str(self.sent_log(server)), **(env or {})},
            visor_args=args,
        )
        self.procs.append(vp)
        vp.request({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
        assert "tools" in vp.recv()["result"], vp.stderr
        return vp

    def audit(self, server: str) -> Path:
        return self.tmp / f"{server}.jsonl"

    def sent_log(self, server: str) -> Path:
        return self.tmp / f"{server}-sent.jsonl"

    def sent(self, server: str) -> list[dict]:
        log = self.sent_log(server)
        return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []

    def records(self, server: str, event: str) -> list[dict]:
        """Records of ``event`` in a server's log, read once every session has
        ended: records that need no fsync (ask, deny, taint) are on disk by then."""
        self.close()
        return [r for r in records(self.audit(server)) if r["event"] == event]

    def close(self) -> None:
        for vp in self.procs:
            vp.kill()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    p = Pair(tmp_path)
    try:
        yield p
    finally:
        p.close()


def _read_inbox(vp: VisorProcess) -> None:
    call(vp, "inbox", "get_received_emails", {"query": "x"})
    resp = recv_id(vp, "inbox")
    assert "mallory@evil.example" in resp["result"]["content"][0]["text"]


def _send(vp: VisorProcess, msg_id: object, to: str) -> dict:
    call(vp, msg_id, "send_email", {"recipients": [to], "subject": "s", "body": "b"})
    return recv_id(vp, msg_id)


def _text(resp: dict) -> str:
    return resp["result"]["content"][0]["text"]


def test_an_address_one_server_showed_is_denied_through_the_other(pair: Pair) -> None:
    mail = pair.start("mail")
    chat = pair.start("chat")
    # The domain is trusted: an address no server showed is sent.
    assert _send(chat, 1, "carol@evil.example")["result"]["isError"] is False
    _read_inbox(mail)
    resp = _send(chat, 2, "mallory@evil.example")
    assert resp["result"]["isError"] is True
    assert "provenance.untrusted_output" in _text(resp)
    # the reason names the server whose output showed it
    assert "'mail'" in _text(resp), _text(resp)
    assert len(pair.sent("chat")) == 1
    (deny,) = pair.records("chat", "deny")
    assert deny["rule"] == "provenance.untrusted_output"
    assert deny["destination"] == "email:mallory@evil.example"
    # both sessions' audit logs name the one group, after this test process
    (start_chat,) = pair.records("chat", "session_start")
    (start_mail,) = pair.records("mail", "session_start")
    assert start_chat["group"] == start_mail["group"]
    assert start_chat["group_source"] == "parent"
    assert start_chat["group_client_pid"] == os.getpid()
    assert start_chat["group_store"] == "ok"


def test_a_taint_raised_in_one_session_blocks_egress_in_the_other(pair: Pair) -> None:
    mail = pair.start("mail")
    chat = pair.start("chat")
    call(chat, 1, "share_file", {"file_id": "3", "email": "alex.m@corp.example", "permission": "r"})
    assert recv_id(chat, 1)["result"]["isError"] is False
    _read_inbox(mail)  # raises inbox_read in the mail server's session
    call(chat, 2, "share_file", {"file_id": "3", "email": "alex.m@corp.example", "permission": "r"})
    resp = recv_id(chat, 2)
    assert resp["result"]["isError"] is True
    assert "egress_controls[no_sharing_after_the_inbox]" in _text(resp)
    assert "another server of this client's group" in _text(resp)
    assert len(pair.sent("chat")) == 1
    assert [r["taint"] for r in pair.records("mail", "taint")] == ["inbox_read"]
    assert pair.records("chat", "taint") == []


def test_a_humans_yes_in_one_session_places_the_destination_in_the_other(pair: Pair) -> None:
    adir = pair.tmp / "approvals"
    mail = pair.start("mail", "--approval-dir", str(adir))
    chat = pair.start("chat")
    # unknown to both: asked, and chat has no channel to ask
    resp = _send(chat, 1, "new.person@partner2.example")
    assert resp["result"]["isError"] is True and "approval.unavailable" in _text(resp)
    call(mail, 2, "send_email", {"recipients": ["new.person@partner2.example"], "body": "b"})
    ((pid, rec),) = wait_pending(adir).items()
    assert rec["rule"] == "provenance.unknown_destination"
    assert cli("approve", "--approval-dir", str(adir), pid).returncode == 0
    assert recv_id(mail, 2)["result"]["isError"] is False
    # placed for the whole group: chat sends with nobody asked, though the
    # mail server's answer ("Email sent to new.person@...") showed it since
    resp = _send(chat, 3, "new.person@partner2.example")
    assert resp["result"]["isError"] is False, _text(resp)
    assert [s["arguments"]["recipients"] for s in pair.sent("chat")] == [["new.person@partner2.example"]]
    # nothing was remembered across restarts: the human did not choose "remember"
    assert not (Path(os.environ["VISOR_HOME"]) / "approved").exists()


@pytest.mark.parametrize(
    "options",
    [("--no-group",), ("--group", "other-client")],
    ids=["no-group", "another-group"],
)
def test_outside_the_group_the_other_servers_output_is_not_seen(pair: Pair, options: tuple[str, ...]) -> None:
    mail = pair.start("mail")
    chat = pair.start("chat", *options)
    _read_inbox(mail)
    resp = _send(chat, 1, "mallory@evil.example")
    assert resp["result"]["isError"] is False, _text(resp)
    call(chat, 2, "share_file", {"file_id": "3", "email": "alex.m@corp.example", "permission": "r"})
    assert recv_id(chat, 2)["result"]["isError"] is False
    (start,) = pair.records("chat", "session_start")
    if options == ("--no-group",):
        assert "group" not in start and "group_store" not in start
    else:
        assert (start["group"], start["group_source"]) == ("other-client", "option")


def test_a_group_named_by_option_or_environment_is_one_group(pair: Pair) -> None:
    mail = pair.start("mail", "--group", "team")
    chat = pair.start("chat", env={"VISOR_GROUP": "team"})
    _read_inbox(mail)
    resp = _send(chat, 1, "mallory@evil.example")
    assert "provenance.untrusted_output" in _text(resp)
    (start,) = pair.records("chat", "session_start")
    assert (start["group"], start["group_source"]) == ("team", "env")


def test_a_group_name_that_is_not_a_file_name_is_refused_at_start(tmp_path: Path) -> None:
    for bad in ("../escape", "-dash", ""):
        proc = cli("run", f"--group={bad}", "--", sys.executable, str(SERVER))
        assert proc.returncode == 1, proc.stderr
        assert "refused" in proc.stderr and "group name" in proc.stderr
    both = cli("run", "--group", "a", "--no-group", "--", sys.executable, str(SERVER))
    assert both.returncode == 1 and "contradict" in both.stderr


@pytest.mark.parametrize("damage", ["corrupt", "symlink"])
def test_a_group_store_that_cannot_be_reached_asks_never_trusts(pair: Pair, damage: str) -> None:
    groups = Path(os.environ["VISOR_HOME"]) / "groups"
    groups.mkdir(parents=True, mode=0o700)
    store = groups / "broken.sqlite"
    if damage == "corrupt":
        store.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)
        store.chmod(0o600)
    else:
        elsewhere = pair.tmp / "elsewhere.sqlite"
        elsewhere.write_bytes(b"")
        store.symlink_to(elsewhere)
    chat = pair.start("chat", "--group", "broken")
    # trusted by domain and seen by nobody: allowed without a group (below),
    # asked here (no channel: denied), because the group cannot vouch for it
    resp = _send(chat, 1, "carol@corp.example")
    assert resp["result"]["isError"] is True
    assert "provenance.group_unavailable" in _text(resp) or "approval.unavailable" in _text(resp)
    assert pair.sent("chat") == []
    # the same call with no group at all is allowed: only the group's silence asked
    alone = pair.start("mail", "--no-group")
    assert _send(alone, 2, "carol@corp.example")["result"]["isError"] is False
    (ask,) = pair.records("chat", "ask")
    assert ask["rule"] == "provenance.group_unavailable"
    assert ask["destination"] == "email:carol@corp.example"
    (start,) = pair.records("chat", "session_start")
    assert start["group"] == "broken"
    assert start["group_store"].startswith("unavailable: ")


def test_a_tool_call_naming_the_group_store_is_denied(pair: Pair) -> None:
    chat = pair.start("chat")
    (db,) = (Path(os.environ["VISOR_HOME"]) / "groups").glob("*.sqlite")  # this session's group
    for i, path in enumerate([str(db), str(db) + "-wal", str(db.parent / "anything")]):
        call(chat, i, "share_file", {"file_id": path, "email": "alex.m@corp.example"})
        resp = recv_id(chat, i)
        assert resp["result"]["isError"] is True
        assert "visor.protected_path" in _text(resp)
    assert pair.sent("chat") == []
