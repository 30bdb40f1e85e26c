"""A call that needs a human: asked, answered, cancelled, withdrawn at the end; nothing held meanwhile."""

from __future__ import annotations

from tests.core.fake_wire import (
    asks,
    call,
    cancel,
    commits,
    policy_wire,
    records,
    request,
    to_client,
    to_server,
)
from visor.approval.broker import Outcome
from visor.approval.model import ApprovalAnswer
from visor.core.events import ApprovalAnswered, Closing, WithdrawApproval


def _answer(approved: bool, remember: bool = False) -> Outcome:
    return Outcome(ApprovalAnswer(approved=approved, channel="directory", remember=remember, who="alice"))


def test_a_question_holds_nothing_back_and_a_yes_commits_then_relays() -> None:
    wire = policy_wire()
    out = wire.client(call(1, "ask_me", x=1), request(2, "ping"))
    (ask,) = asks(out)
    assert ask.request.tool == "ask_me" and ask.request.request_id == 1
    assert to_server(out) == [request(2, "ping")]  # not behind the human
    assert [r["event"] for r in records(out)] == ["ask"]
    yes = wire.feed(ApprovalAnswered(ask.call, _answer(True)))
    assert [r["event"] for r in records(yes)] == ["approve", "allow"]
    assert records(yes)[1]["approval"] == ask.request.id
    assert to_server(yes) == []
    assert to_server(wire.commit_all(yes)) == [call(1, "ask_me", x=1)]


def test_an_approved_call_takes_its_place_behind_what_came_meanwhile() -> None:
    wire = policy_wire()
    (ask,) = asks(wire.client(call(1, "ask_me")))
    held = wire.client(call(2, "echo"))  # waits for its own commit
    yes = wire.feed(ApprovalAnswered(ask.call, _answer(True)))
    released = wire.commit_all(held) + wire.commit_all(yes)
    assert [m["id"] for m in to_server(released)] == [2, 1]


def test_a_no_is_a_deny_the_client_reads() -> None:
    wire = policy_wire()
    (ask,) = asks(wire.client(call(1, "ask_me")))
    no = wire.feed(ApprovalAnswered(ask.call, _answer(False)))
    assert [(r["event"], r["rule"].rsplit(".", 1)[-1]) for r in records(no)] == [
        ("decline", "approval_required"),
        ("deny", "declined"),
    ]
    assert to_client(no)[0]["result"]["isError"] is True
    assert to_server(no) == []


def test_no_answer_in_time_is_a_timeout_deny() -> None:
    wire = policy_wire()
    (ask,) = asks(wire.client(call(1, "ask_me")))
    out = wire.feed(ApprovalAnswered(ask.call, Outcome(None, "timeout")))
    assert [r["rule"] for r in records(out)] == ["approval.timeout"]


def test_a_failed_approval_step_denies_the_call() -> None:
    wire = policy_wire()
    (ask,) = asks(wire.client(call(1, "ask_me")))
    out = wire.feed(ApprovalAnswered(ask.call, None))
    assert [(r["event"], r["rule"], r["reason"]) for r in records(out)] == [
        ("deny", "internal.error", "the approval step failed")
    ]


def test_without_a_channel_the_question_is_a_deny_with_setup_advice() -> None:
    wire = policy_wire(approvals=False)
    out = wire.client(call(1, "ask_me"))
    assert asks(out) == []
    assert [(r["event"], r["rule"].rsplit(".", 1)[-1]) for r in records(out)] == [
        ("ask", "approval_required"),
        ("deny", "unavailable"),
    ]


def test_a_cancelled_question_is_withdrawn_recorded_and_a_late_answer_ignored() -> None:
    wire = policy_wire()
    (ask,) = asks(wire.client(call(1, "ask_me")))
    out = wire.client(cancel(1))
    assert WithdrawApproval(ask.call) in out
    assert [(r["event"], r["rule"], r["reason"]) for r in records(out)] == [
        ("deny", "approval.cancelled", "the client cancelled the call while it waited for approval")
    ]
    assert to_client(out) == [] and to_server(out) == []
    assert wire.feed(ApprovalAnswered(ask.call, _answer(True))) == []


def test_remember_covers_the_exact_arguments_for_the_rest_of_the_session() -> None:
    wire = policy_wire()
    (ask,) = asks(wire.client(call(1, "ask_me", x=1)))
    wire.commit_all(wire.feed(ApprovalAnswered(ask.call, _answer(True, remember=True))))
    again = wire.client(call(2, "ask_me", x=1))
    assert asks(again) == []
    assert [(r["event"], r.get("channel")) for r in records(again)] == [
        ("ask", None),
        ("approve", "session"),
        ("allow", None),
    ]
    other = wire.client(call(3, "ask_me", x=2))
    assert len(asks(other)) == 1


def test_questions_open_at_the_end_are_withdrawn_before_the_last_record() -> None:
    wire = policy_wire()
    (ask,) = asks(wire.client(call(1, "ask_me")))
    out = wire.feed(Closing())
    assert WithdrawApproval(ask.call) in out
    assert [(r["event"], r.get("reason")) for r in records(out)] == [
        ("deny", "the session ended while the call waited for approval"),
        ("session_end", None),
    ]


def test_a_yes_denied_by_the_recheck_never_runs() -> None:
    wire = policy_wire(
        listed=False,
        policy="""\
        version: "1.0"
        default_action: deny
        servers:
          - name: "srv"
            allowed: true
            tools:
              - name: "ask_me"
                allowed: true
                approval_required: true
                max_calls: 1
        """,
    )
    wire.client(request("l", "tools/list"))
    wire.server({"jsonrpc": "2.0", "id": "l", "result": {"tools": [{"name": "ask_me", "inputSchema": {}}]}})
    (first,) = asks(wire.client(call(1, "ask_me")))
    (second,) = asks(wire.client(call(2, "ask_me")))
    wire.commit_all(wire.feed(ApprovalAnswered(first.call, _answer(True))))
    out = wire.feed(ApprovalAnswered(second.call, _answer(True)))
    assert commits(out) == []
    assert records(out)[-1]["event"] == "deny"
