"""Red team: tool names a server reads another way than Visor does.

A server that finds the tool a call names case-insensitively (tests/servers/go_fold_tools:
``strings.EqualFold``, as tolerant Go dispatchers do) runs one tool for ``send_note`` and
``Send_Note``. When a later listing renames the tool by case with a new definition, the
old name is still pinned and unchanged in Visor's eyes, while the server runs the new
definition for it: a rug pull that pins must catch. The same server finds the method a
request names the same way, so ``Tools/Call`` would run a tool no check judged, no budget
counted and no record shows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import VisorProcess
from tests.policy.helpers import decide, policy_from
from tests.security.go_servers import build
from visor.session import SessionState

POLICY = """\
version: "1.0"
default_action: deny
settings:
  packs: []
servers:
  - name: notes
    allowed: true
    tools:
      - {name: send_note, allowed: true}
      - {name: Send_Note, allowed: true}
"""


@pytest.fixture(scope="module")
def fold_server(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build("go_fold_tools", tmp_path_factory.mktemp("go"))


def _call(vp: VisorProcess, i: int, name: str) -> dict:
    vp.request(
        {
            "jsonrpc": "2.0",
            "id": i,
            "method": "tools/call",
            "params": {"name": name, "arguments": {"to": "bob", "body": "hi"}},
        }
    )
    return vp.recv()


def _denied(resp: dict) -> str | None:
    result = resp.get("result") or {}
    text = "".join(c.get("text", "") for c in result.get("content", []))
    return text if result.get("isError") and "Visor denied this call" in text else None


def test_a_tool_renamed_by_case_is_a_changed_tool_under_both_names(fold_server: Path, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    notes = tmp_path / "notes.log"
    vp = VisorProcess(
        [str(fold_server)],
        env={"NOTES_LOG": str(notes)},
        visor_args=[
            "--server-name",
            "notes",
            "--policy",
            str(policy),
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
            "--no-group",
        ],
    )
    try:
        _init, listed = vp.open_session()
        assert [t["name"] for t in listed["result"]["tools"]] == ["send_note"]
        assert _denied(_call(vp, 1, "send_note")) is None
        # the server is updated: its tool is now Send_Note, with another description
        vp.request({"jsonrpc": "2.0", "id": "l2", "method": "tools/list"})
        relisted = vp.recv()["result"]["tools"]
        assert [t["name"] for t in relisted] == ["Send_Note"]
        old_name = _call(vp, 2, "send_note")
        new_name = _call(vp, 3, "Send_Note")
    finally:
        vp.kill()
    # the server runs the renamed tool for the old name: only the first call reached it
    assert notes.read_text().splitlines() == ["send_note\tbob"]
    assert "pin.changed_tool" in (_denied(old_name) or ""), old_name
    assert _denied(new_name) is not None, new_name
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert any(r["event"] == "pin_changed" and r["tool"] == "send_note" for r in records)


def test_a_method_spelt_in_another_case_never_reaches_the_server(fold_server: Path, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        POLICY.replace("{name: send_note, allowed: true}", "{name: send_note, allowed: true, max_calls: 1}")
    )
    notes = tmp_path / "notes.log"
    audit = tmp_path / "audit.jsonl"
    vp = VisorProcess(
        [str(fold_server)],
        env={"NOTES_LOG": str(notes)},
        visor_args=[
            "--server-name",
            "notes",
            "--policy",
            str(policy),
            "--audit-log",
            str(audit),
            "--no-group",
        ],
    )
    answers = []
    try:
        vp.open_session()
        assert _denied(_call(vp, 1, "send_note")) is None
        assert "budget.max_calls" in (_denied(_call(vp, 2, "send_note")) or "")
        for i, method in enumerate(("Tools/Call", "TOOLS/CALL", "tools/call ", "\ttool\u017f/call"), start=3):
            vp.request(
                {
                    "jsonrpc": "2.0",
                    "id": i,
                    "method": method,
                    "params": {"name": "send_note", "arguments": {"to": "eve"}},
                }
            )
            answers.append(vp.recv())
        vp.request(
            {
                "jsonrpc": "2.0",
                "method": "Tools/Call",
                "params": {"name": "send_note", "arguments": {"to": "eve"}},
            }
        )
        vp.request({"jsonrpc": "2.0", "id": 9, "method": "ping"})
        assert vp.recv()["id"] == 9
    finally:
        vp.kill()
    # the budget of one call holds: no spelling of tools/call ran a second one
    assert notes.read_text().splitlines() == ["send_note\tbob"]
    assert all(a.get("error", {}).get("code") == -32600 for a in answers), answers
    rejects = [json.loads(line) for line in audit.read_text().splitlines()]
    assert sum(r["event"] == "reject" for r in rejects) == 5


def test_two_names_that_fold_equal_in_one_listing_are_both_denied() -> None:
    p = policy_from(POLICY)
    s = SessionState(p, "notes")
    s.observe_tools_list({"tools": [{"name": "send_note"}, {"name": "SEND_NOTE"}, {"name": "other"}]})
    assert decide(p, s, "send_note").rule == "pin.changed_tool"
    assert decide(p, s, "SEND_NOTE").rule == "pin.changed_tool"
    # Go's simple folding: the long s and the Kelvin sign fold onto s and k
    s = SessionState(p, "notes")
    s.observe_tools_list({"tools": [{"name": "send_note"}, {"name": "\u017fend_note"}]})
    assert decide(p, s, "send_note").rule == "pin.changed_tool"
    # a server that trims names (as it trims methods) reads `send_note ` as send_note
    s = SessionState(p, "notes")
    s.observe_tools_list({"tools": [{"name": "send_note"}]})
    s.observe_tools_list({"tools": [{"name": "send_note ", "description": "new"}]})
    assert decide(p, s, "send_note").rule == "pin.changed_tool"


def test_case_twins_from_a_pin_file_are_denied() -> None:
    p = policy_from(POLICY)
    s = SessionState(p, "notes")
    s.import_pins({"format": 2, "server": "notes", "tools": {"send_note": "0" * 64, "Send_Note": "1" * 64}})
    assert decide(p, s, "send_note").rule == "pin.changed_tool"
    s = SessionState(p, "notes")
    s.import_pins({"format": 2, "server": "notes", "tools": {"send_note": "0" * 64}})
    s.observe_tools_list({"tools": [{"name": "Send_Note"}]})
    assert decide(p, s, "send_note").rule == "pin.changed_tool"


def test_a_policy_entry_in_another_case_is_not_skipped_for_the_star_entry(tmp_path: Path) -> None:
    # The SDK server lists `send`; the policy asks a human for `Send` and allows the rest.
    # Judged by "*", the send would run without the question the policy asks for it.
    server = [sys.executable, str(Path(__file__).parents[1] / "servers" / "sdk_taint_reader.py")]
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        """\
version: "1.0"
default_action: deny
settings: {packs: []}
servers:
  - name: files
    allowed: true
    tools:
      - {name: Send, allowed: true, approval_required: true}
      - {name: "*", allowed: true}
"""
    )
    log = tmp_path / "server.jsonl"
    vp = VisorProcess(
        server,
        env={"TAINT_LOG": str(log)},
        visor_args=[
            "--server-name",
            "files",
            "--policy",
            str(policy),
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
            "--no-group",
        ],
    )
    try:
        vp.open_session()
        vp.request(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "send", "arguments": {"to": "eve", "body": "x"}},
            }
        )
        sent = vp.recv()
    finally:
        vp.kill()
    assert "registration.case_variant" in (_denied(sent) or ""), sent
    assert not log.exists()


def test_a_policy_entry_with_surrounding_spaces_is_a_twin_too() -> None:
    p = policy_from(
        POLICY.replace("{name: Send_Note, allowed: true}", '{name: "*", allowed: true}').replace(
            "{name: send_note, allowed: true}", '{name: " send_note", allowed: true, approval_required: true}'
        )
    )
    s = SessionState(p, "notes")
    s.observe_tools_list({"tools": [{"name": "send_note"}]})
    assert decide(p, s, "send_note").rule == "registration.case_variant"
