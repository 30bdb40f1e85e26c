"""Finding 1: the client must not be able to answer every ask.

Each test runs a real `visor run` behind a client that declares elicitation
and accepts every elicitation the moment it arrives (tests/approval/raw_client.py).
"""

from __future__ import annotations

from pathlib import Path

from tests.approval.helpers import events_for, records, wait_gone
from tests.approval.raw_client import AutoAcceptClient, answer, text
from tests.conftest import received

META_CAPS = "io.modelcontextprotocol/clientCapabilities"


def _calls(log: Path) -> list[bytes]:
    return [x for x in received(log) if b"tools/call" in x]


def test_with_an_approval_dir_the_auto_accepting_client_is_never_asked(tmp_path: Path) -> None:
    adir = tmp_path / "approvals"
    c = AutoAcceptClient(tmp_path, visor_args=["--approval-dir", str(adir)])
    try:
        c.call(1, "send_email", {"to": "new@example.org", "body": "hi"})
        # wait_pending fails if the call is answered before the directory is
        pid, _ = c.wait_pending(adir, 1)
        assert _calls(c.log) == []
        answer(adir, "approve", pid)
        resp = c.wait_response(1)
        assert resp["result"]["isError"] is False
        assert len(_calls(c.log)) == 1

        c.call(2, "send_email", {"to": "other@example.org", "body": "hi"})
        pid2, _ = c.wait_pending(adir, 2)
        answer(adir, "deny", pid2)
        resp = c.wait_response(2)
        assert resp["result"]["isError"] is True and "approval.declined" in text(resp)
        wait_gone(adir / f"{pid2}.pending")
    finally:
        c.close()
    assert c.elicited == []  # the client was never given the question
    assert len(_calls(c.log)) == 1
    answers = [r for r in records(c.audit) if r["event"] in ("approve", "decline")]
    assert [(r["event"], r["channel"], r["client_reported"]) for r in answers] == [
        ("approve", "directory", False),
        ("decline", "directory", False),
    ]


def test_approval_elicitation_flag_lets_the_client_answer_and_marks_it_client_reported(
    tmp_path: Path,
) -> None:
    adir = tmp_path / "approvals"
    c = AutoAcceptClient(tmp_path, visor_args=["--approval-dir", str(adir), "--approval-elicitation"])
    try:
        c.call(1, "send_email", {"to": "new@example.org", "body": "hi"})
        resp = c.wait_response(1)
        assert resp["result"]["isError"] is False
    finally:
        c.close()
    assert len(c.elicited) == 1
    assert list(adir.glob("*.pending")) == []  # the directory's question was withdrawn
    assert events_for(c.audit, 1) == ["ask", "approve", "allow"]
    approve = next(r for r in records(c.audit) if r["event"] == "approve")
    assert approve["channel"] == "elicitation" and approve["client_reported"] is True
    assert approve["answered_by"] == "client-reported:autoclicker"
    assert "who" not in approve  # the client's name is not presented as a person


def test_elicitation_alone_still_works_and_is_client_reported(tmp_path: Path) -> None:
    """No out-of-band channel: elicitation is the operator's only channel, as before."""
    c = AutoAcceptClient(tmp_path)
    try:
        c.call(1, "send_email", {"to": "new@example.org"})
        assert c.wait_response(1)["result"]["isError"] is False
    finally:
        c.close()
    assert len(c.elicited) == 1
    approve = next(r for r in records(c.audit) if r["event"] == "approve")
    assert approve["channel"] == "elicitation" and approve["client_reported"] is True


def test_out_of_band_policy_with_only_elicitation_is_denied_never_elicited(tmp_path: Path) -> None:
    c = AutoAcceptClient(tmp_path, out_of_band=True)
    try:
        c.call(1, "echo", {"text": "hi"})
        resp = c.wait_response(1)
    finally:
        c.close()
    assert resp["result"]["isError"] is True
    assert "approval.unavailable" in text(resp) and "approval: out_of_band" in text(resp)
    assert c.elicited == [] and _calls(c.log) == []
    deny = next(r for r in records(c.audit) if r["event"] == "deny")
    assert deny["rule"] == "approval.unavailable"


def test_out_of_band_policy_beats_the_elicitation_flag(tmp_path: Path) -> None:
    adir = tmp_path / "approvals"
    c = AutoAcceptClient(
        tmp_path, out_of_band=True, visor_args=["--approval-dir", str(adir), "--approval-elicitation"]
    )
    try:
        c.call(1, "echo", {"text": "hi"})
        pid, _ = c.wait_pending(adir, 1)
        answer(adir, "approve", pid)
        assert c.wait_response(1)["result"]["isError"] is False
        # another tool, without the key, may still be elicited under the flag
        c.call(2, "send_email", {"to": "new@example.org"})
        assert c.wait_response(2)["result"]["isError"] is False
    finally:
        c.close()
    assert len(c.elicited) == 1 and "send_email" in c.elicited[0]["params"]["message"]
    channels = [(r["tool"], r["channel"]) for r in records(c.audit) if r["event"] == "approve"]
    assert channels == [("echo", "directory"), ("send_email", "elicitation")]


def test_elicitation_declared_only_in_meta_is_not_used(tmp_path: Path) -> None:
    c = AutoAcceptClient(tmp_path, declare_elicitation=False)
    try:
        c.call(1, "send_email", {"to": "new@example.org"}, meta={META_CAPS: {"elicitation": {}}})
        resp = c.wait_response(1)
    finally:
        c.close()
    assert resp["result"]["isError"] is True and "approval.unavailable" in text(resp)
    assert c.elicited == [] and _calls(c.log) == []


def test_elicitation_declared_only_in_meta_is_not_used_even_with_the_flag(tmp_path: Path) -> None:
    adir = tmp_path / "approvals"
    c = AutoAcceptClient(
        tmp_path,
        declare_elicitation=False,
        visor_args=["--approval-dir", str(adir), "--approval-elicitation"],
    )
    try:
        c.call(1, "send_email", {"to": "new@example.org"}, meta={META_CAPS: {"elicitation": {}}})
        pid, _ = c.wait_pending(adir, 1)
        answer(adir, "deny", pid)
        resp = c.wait_response(1)
    finally:
        c.close()
    assert resp["result"]["isError"] is True and "approval.declined" in text(resp)
    assert c.elicited == [] and _calls(c.log) == []
