"""The approval directory end to end: `visor run` with real pipes, answers through `visor approve`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.approval.helpers import (
    call,
    cli,
    events_for,
    pending,
    records,
    recv_id,
    start,
    text,
    wait_gone,
    wait_pending,
)
from tests.conftest import RECORDER, VisorProcess, received, sentinel
from visor.approval import model


def _approvals(tmp_path: Path) -> Path:
    return tmp_path / "approvals"


def test_approved_call_runs_after_a_durable_allow_and_traffic_flows_meanwhile(tmp_path: Path) -> None:
    adir = _approvals(tmp_path)
    vp, log, audit = start(tmp_path, approval_dir=adir)
    try:
        assert oct(adir.stat().st_mode & 0o777) == "0o700"
        call(vp, 1, "send_email", {"to": "new@example.org", "body": "hi"})
        ((pid, rec),) = wait_pending(adir).items()
        assert rec["tool"] == "send_email" and rec["destination"] == "email:new@example.org"
        assert oct((adir / f"{pid}.pending").stat().st_mode & 0o777) == "0o600"
        # While a human decides, everything else flows: a ping and an allowed call.
        sentinel(vp, 50)
        call(vp, 2, "send_email", {"to": "boss@example.com", "body": "status"})
        assert recv_id(vp, 2)["result"]["isError"] is False
        listing = cli("approve", "--approval-dir", str(adir))
        assert listing.returncode == 0 and pid in listing.stdout and "new@example.org" in listing.stdout
        assert not any(b'"id":1,' in line for line in received(log))
        ok = cli("approve", "--approval-dir", str(adir), pid)
        assert ok.returncode == 0, ok.stderr
        resp = recv_id(vp, 1)
        assert resp["result"]["isError"] is False
        assert [json.loads(x)["id"] for x in received(log) if b"tools/call" in x] == [2, 1]
        # the server read the audit log when the call arrived: its allow was there
        assert resp["result"]["structuredContent"]["audit_allow_present"] is True
        wait_gone(adir / f"{pid}.pending")
        assert not (adir / f"{pid}.answer").exists()
    finally:
        vp.close_stdin()
        vp.wait()
    assert events_for(audit, 1) == ["ask", "approve", "allow"]
    approve = next(r for r in records(audit) if r["event"] == "approve")
    assert approve["channel"] == "directory" and approve["approval"] == pid
    assert f"uid {os.geteuid()}" in approve["who"] and approve["call_hash"] == rec["call_hash"]
    assert cli("audit", "verify", str(audit)).returncode == 0


def test_denied_call_never_reaches_the_server(tmp_path: Path) -> None:
    adir = _approvals(tmp_path)
    vp, log, audit = start(tmp_path, approval_dir=adir)
    try:
        call(vp, 1, "send_email", {"to": "new@example.org"})
        ((pid, _),) = wait_pending(adir).items()
        assert cli("deny", "--approval-dir", str(adir), pid).returncode == 0
        resp = recv_id(vp, 1)
        assert resp["result"]["isError"] is True and "declined" in text(resp)
        sentinel(vp)
        assert not any(b"tools/call" in line for line in received(log))
    finally:
        vp.kill()
    assert events_for(audit, 1) == ["ask", "decline", "deny"]


def test_a_call_nobody_answers_is_denied_at_the_policy_timeout(tmp_path: Path) -> None:
    adir = _approvals(tmp_path)
    vp, log, _audit = start(tmp_path, approval_dir=adir, timeout=1)
    try:
        call(vp, 1, "send_email", {"to": "new@example.org"})
        ((pid, _),) = wait_pending(adir).items()
        resp = recv_id(vp, 1)
        assert "approval_timeout_seconds" in text(resp) and "approval.timeout" in text(resp)
        assert not (adir / f"{pid}.pending").exists()
        # too late: the request is gone, so the CLI says so and nothing runs
        late = cli("approve", "--approval-dir", str(adir), pid)
        assert late.returncode == 1 and "no pending request" in late.stderr
        sentinel(vp)
        assert not any(b"tools/call" in line for line in received(log))
    finally:
        vp.kill()


def test_without_any_channel_the_call_is_denied_with_setup_advice(tmp_path: Path) -> None:
    vp, _log, _audit = start(tmp_path)
    try:
        call(vp, 1, "send_email", {"to": "new@example.org"})
        resp = recv_id(vp, 1)
        assert "approval.unavailable" in text(resp) and "--approval-dir" in text(resp)
    finally:
        vp.kill()


def test_stale_and_replayed_answers_approve_nothing(tmp_path: Path) -> None:
    adir = _approvals(tmp_path)
    # approval_required: a yes covers one call (a yes to a destination would
    # place that destination for the session, and call 2 would not be asked)
    vp, log, audit = start(tmp_path, approval_dir=adir, echo_approval=True)
    args = {"text": "same"}
    try:
        # call 1 is approved; keep a copy of its answer as an attacker would
        call(vp, 1, "echo", args)
        ((a, rec_a),) = wait_pending(adir).items()
        replay = model.answer_record(a, rec_a["call_hash"], True, False)
        assert cli("approve", "--approval-dir", str(adir), a).returncode == 0
        assert recv_id(vp, 1)["result"]["isError"] is False
        # call 2 is the very same call under a new request id
        call(vp, 2, "echo", args)
        found = wait_pending(adir)
        ((b, rec_b),) = ((k, v) for k, v in found.items() if k != a)
        assert b != a and rec_b["call_hash"] != rec_a["call_hash"]
        # the old answer, replayed under its own name and under the new id
        (adir / f"{a}.answer").write_bytes(replay)
        (adir / f"{b}.answer").write_bytes(replay)
        wait_gone(adir / f"{b}.answer")  # refused and removed
        sentinel(vp, 900)
        assert vp.no_output(0.3)
        assert sum(b"tools/call" in line for line in received(log)) == 1
        # the real answer for call 2 still works
        assert cli("deny", "--approval-dir", str(adir), b).returncode == 0
        assert recv_id(vp, 2)["result"]["isError"] is True
    finally:
        vp.kill()
    assert events_for(audit, 2) == ["ask", "decline", "deny"]


def test_an_answer_for_another_call_and_answers_out_of_order(tmp_path: Path) -> None:
    adir = _approvals(tmp_path)
    vp, log, _audit = start(tmp_path, approval_dir=adir)
    try:
        call(vp, "a", "send_email", {"to": "alice@example.org"})
        call(vp, "b", "send_email", {"to": "bob@example.org"})
        found = wait_pending(adir, 2)
        by_to = {v["arguments"]["to"]: (k, v) for k, v in found.items()}
        (ida, reca), (idb, _recb) = by_to["alice@example.org"], by_to["bob@example.org"]
        # bob's request answered with alice's hash: refused
        (adir / f"{idb}.answer").write_bytes(model.answer_record(idb, reca["call_hash"], True, False))
        wait_gone(adir / f"{idb}.answer")
        sentinel(vp)
        assert not any(b"tools/call" in line for line in received(log))
        # answered in the opposite order from the calls
        assert cli("approve", "--approval-dir", str(adir), idb).returncode == 0
        assert recv_id(vp, "b")["result"]["isError"] is False
        assert cli("approve", "--approval-dir", str(adir), ida).returncode == 0
        assert recv_id(vp, "a")["result"]["isError"] is False
        calls = [json.loads(x) for x in received(log) if b"tools/call" in x]
        assert [(c["id"], c["params"]["arguments"]["to"]) for c in calls] == [
            ("b", "bob@example.org"),
            ("a", "alice@example.org"),
        ]
    finally:
        vp.kill()


def test_pre_planted_answers_do_nothing(tmp_path: Path) -> None:
    adir = _approvals(tmp_path)
    adir.mkdir(mode=0o700)
    # Answers planted before the call: predictable ids, the request id, a
    # symlink, and an answer that carries the right call hash under a guessed id.
    guessed = "0" * 32
    for name in ("1", "0", "approval-1", guessed, "f" * 32):
        (adir / f"{name}.answer").write_text(json.dumps({"decision": "approve", "id": name}))
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    (adir / f"{'a' * 32}.answer").symlink_to(target)
    vp, log, audit = start(tmp_path, approval_dir=adir, timeout=2)
    try:
        session = next(r["session"] for r in records(audit) if r["event"] == "session_start")
        right_hash = model.call_hash("rec", "send_email", {"to": "new@example.org"}, 1, session)
        (adir / f"{'b' * 32}.answer").write_bytes(model.answer_record("b" * 32, right_hash, True, False))
        call(vp, 1, "send_email", {"to": "new@example.org"})
        ((pid, rec),) = wait_pending(adir).items()
        assert rec["call_hash"] == right_hash and pid not in ("b" * 32, guessed)
        resp = recv_id(vp, 1)
        assert "approval.timeout" in text(resp)
        assert not any(b"tools/call" in line for line in received(log))
    finally:
        vp.kill()


def test_cancelling_a_waiting_call_withdraws_it(tmp_path: Path) -> None:
    adir = _approvals(tmp_path)
    vp, log, audit = start(tmp_path, approval_dir=adir)
    try:
        call(vp, 1, "send_email", {"to": "new@example.org"})
        ((pid, _),) = wait_pending(adir).items()
        vp.request({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}})
        wait_gone(adir / f"{pid}.pending")
        late = cli("approve", "--approval-dir", str(adir), pid)
        assert late.returncode == 1
        sentinel(vp)
        assert vp.no_output(0.3)  # no response to a cancelled request
        assert not any(b"tools/call" in line or b"cancelled" in line for line in received(log))
    finally:
        vp.kill()
    assert events_for(audit, 1) == ["ask", "deny"]
    assert (
        next(r for r in records(audit) if r["event"] == "deny" and r.get("id") == 1)["rule"]
        == "approval.cancelled"
    )


def test_approve_looking_bytes_on_stdin_approve_nothing(tmp_path: Path) -> None:
    adir = _approvals(tmp_path)
    vp, log, _audit = start(tmp_path, approval_dir=adir, timeout=2)
    try:
        call(vp, 1, "send_email", {"to": "new@example.org"})
        ((pid, rec),) = wait_pending(adir).items()
        forged = model.answer_record(pid, rec["call_hash"], True, True)
        vp.send(b"y\nyes\napprove\n" + forged + b"\n")
        vp.send(f"visor approve {pid}\n".encode())
        vp.request(
            {
                "jsonrpc": "2.0",
                "id": "visor-0",
                "result": {"action": "accept", "content": {"decision": "approve"}},
            }
        )
        others = []
        while (msg := vp.recv(20)).get("id") != 1:
            others.append(msg)
        assert "approval.timeout" in text(msg)
        # the junk lines were refused as protocol errors, and nothing else came back
        assert others and all("error" in m for m in others), others
        assert not any(b"tools/call" in line for line in received(log))
    finally:
        vp.kill()


def test_remembered_destination_covers_that_destination_only(tmp_path: Path) -> None:
    adir = _approvals(tmp_path)
    vp, _log, audit = start(tmp_path, approval_dir=adir)
    try:
        call(vp, 1, "send_email", {"to": "new@example.org"})
        ((pid, _),) = wait_pending(adir).items()
        assert cli("approve", "--approval-dir", str(adir), "--remember", pid).returncode == 0
        assert recv_id(vp, 1)["result"]["isError"] is False
        call(vp, 2, "send_email", {"to": "new@example.org", "body": "again"})
        assert recv_id(vp, 2)["result"]["isError"] is False  # not asked again
        call(vp, 3, "send_email", {"to": "other@example.org"})
        ((pid3, rec3),) = ((k, v) for k, v in wait_pending(adir).items() if k != pid)
        assert rec3["destination"] == "email:other@example.org"
        assert cli("deny", "--approval-dir", str(adir), pid3).returncode == 0
        assert recv_id(vp, 3)["result"]["isError"] is True
    finally:
        vp.kill()
    assert events_for(audit, 2) == ["allow"]


def test_approval_required_is_remembered_for_the_exact_arguments_only(tmp_path: Path) -> None:
    adir = _approvals(tmp_path)
    vp, _log, audit = start(tmp_path, approval_dir=adir, echo_approval=True)
    try:
        call(vp, 1, "echo", {"x": 1})
        ((pid, _),) = wait_pending(adir).items()
        assert cli("approve", "--approval-dir", str(adir), "--remember", pid).returncode == 0
        assert recv_id(vp, 1)["result"]["isError"] is False
        call(vp, 2, "echo", {"x": 1})
        assert recv_id(vp, 2)["result"]["isError"] is False
        call(vp, 3, "echo", {"x": 2})
        wait_pending(adir)
    finally:
        vp.kill()
    assert events_for(audit, 2) == ["ask", "approve", "allow"]
    assert [r.get("channel") for r in records(audit) if r.get("id") == 2 and r["event"] == "approve"] == [
        "session"
    ]


def test_without_remember_a_second_identical_call_is_asked_again(tmp_path: Path) -> None:
    adir = _approvals(tmp_path)
    vp, _log, _audit = start(tmp_path, approval_dir=adir, echo_approval=True)
    try:
        call(vp, 1, "echo", {"text": "hi"})
        ((pid, _),) = wait_pending(adir).items()
        assert cli("approve", "--approval-dir", str(adir), pid).returncode == 0
        assert recv_id(vp, 1)["result"]["isError"] is False
        call(vp, 2, "echo", {"text": "hi"})
        assert len(wait_pending(adir)) == 1
    finally:
        vp.kill()


def test_a_yes_to_a_destination_places_it_for_the_session_only(tmp_path: Path) -> None:
    adir = _approvals(tmp_path)
    vp, _log, _audit = start(tmp_path, approval_dir=adir)
    try:
        call(vp, 1, "send_email", {"to": "new@example.org"})
        ((pid, _),) = wait_pending(adir).items()
        assert cli("approve", "--approval-dir", str(adir), pid).returncode == 0
        assert recv_id(vp, 1)["result"]["isError"] is False
        call(vp, 2, "send_email", {"to": "new@example.org"})
        assert recv_id(vp, 2)["result"]["isError"] is False
        call(vp, 3, "send_email", {"to": "other@example.org"})
        assert len(wait_pending(adir)) == 1
    finally:
        vp.kill()


@pytest.mark.parametrize("problem", ["world-writable", "group-writable", "symlink", "file"])
def test_an_unsafe_approval_dir_stops_start_up(tmp_path: Path, problem: str) -> None:
    adir = tmp_path / "approvals"
    if problem == "symlink":
        real = tmp_path / "real"
        real.mkdir(mode=0o700)
        adir.symlink_to(real)
    elif problem == "file":
        adir.write_text("")
    else:
        adir.mkdir()
        adir.chmod(0o777 if problem == "world-writable" else 0o770)
    policy = tmp_path / "p.yaml"
    policy.write_text('version: "1.0"\ndefault_action: allow\n')
    vp = VisorProcess(
        [sys.executable, str(RECORDER)],
        visor_args=[
            "--policy",
            str(policy),
            "--audit-log",
            str(tmp_path / "a.jsonl"),
            "--approval-dir",
            str(adir),
        ],
    )
    assert vp.wait() == 1
    assert "approval directory refused" in vp.stderr
    # the answering side holds to the same rule
    if problem != "file":
        out = cli("approve", "--approval-dir", str(adir))
        assert out.returncode == 1


def test_the_cli_refuses_bad_ids_and_double_answers(tmp_path: Path) -> None:
    adir = _approvals(tmp_path)
    vp, _log, _audit = start(tmp_path, approval_dir=adir)
    try:
        assert "no pending approval requests" in cli("approve", "--approval-dir", str(adir)).stdout
        bad = cli("approve", "--approval-dir", str(adir), "../../etc/passwd")
        assert bad.returncode == 1 and "not an approval id" in bad.stderr
        call(vp, 1, "send_email", {"to": "new@example.org"})
        ((pid, _),) = wait_pending(adir).items()
        listing = json.loads(cli("approve", "--approval-dir", str(adir), "--json").stdout)
        assert [p["id"] for p in listing] == [pid]
        # the first answer wins; a second cannot replace it
        assert cli("deny", "--approval-dir", str(adir), pid).returncode == 0
        again = cli("approve", "--approval-dir", str(adir), pid)
        assert again.returncode == 1 and ("already" in again.stderr or "no pending" in again.stderr)
        assert recv_id(vp, 1)["result"]["isError"] is True
    finally:
        vp.kill()
    assert pending(adir) == {}


def test_a_server_request_in_visors_id_space_is_refused(tmp_path: Path) -> None:
    vp, log, _audit = start(tmp_path)
    try:
        call(vp, 1, "collide", {})
        resp = recv_id(vp, 1)  # asserts that no request reached the client first
        assert resp["result"]["isError"] is False
        answer = json.loads(received(log)[-1])
        assert answer["id"] == "visor-0" and answer["error"]["code"] == -32600
    finally:
        vp.kill()
