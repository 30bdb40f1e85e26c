"""A policy reload (SIGHUP) as one event between two others: what is swapped, what is kept, what is refused."""

from __future__ import annotations

import textwrap

from tests.core.fake_wire import (
    POLICY,
    Wire,
    asks,
    call,
    plain_wire,
    policy_wire,
    records,
    to_client,
    to_server,
)
from visor.approval.broker import Outcome
from visor.approval.model import ApprovalAnswer
from visor.core.checks import PolicyChecks
from visor.core.events import ApprovalAnswered, PolicyReloaded, PolicyReloadFailed
from visor.core.session import SessionCore
from visor.policy import attestation
from visor.policy.loader import load_policy_text
from visor.policy.schema import Policy
from visor.session import SessionState

# The same servers and tools; `rm` allowed, `ask_me` denied outright.
NEW_POLICY = POLICY.replace(
    """      - name: "ask_me"
        allowed: true
        approval_required: true
      - name: "rm"
        allowed: false
""",
    """      - name: "ask_me"
        allowed: false
      - name: "rm"
        allowed: true
""",
)

DIGEST = "sha256:" + "ab" * 32


def _load(text: str, source: str = "new.yaml") -> Policy:
    return load_policy_text(textwrap.dedent(text), source)


def _verdicts(actions: list) -> list[tuple[str, str]]:
    return [(r["event"], r["tool"]) for r in records(actions) if "tool" in r and r["event"] != "result"]


def _reloads(actions: list) -> list[dict]:
    return [r for r in records(actions) if r["event"] == "policy_reload"]


def _yes() -> Outcome:
    return Outcome(ApprovalAnswer(approved=True, channel="directory", remember=False, who="alice"))


def test_calls_after_the_swap_see_the_new_policy_and_the_record_names_both_hashes() -> None:
    wire = policy_wire()
    old_sha = wire.core.checks.policy.sha256  # type: ignore[attr-defined]
    before = wire.client(call(1, "rm"))
    assert _verdicts(before) == [("deny", "rm")]
    new = _load(NEW_POLICY)
    swap = wire.feed(PolicyReloaded(new))
    assert _reloads(swap) == [
        {
            "event": "policy_reload",
            "source": "new.yaml",
            "previous": old_sha,
            "policy": new.sha256,
            "ok": True,
        }
    ]
    assert to_client(swap) == [] and to_server(swap) == []
    after = wire.client(call(2, "rm"))
    assert _verdicts(after) == [("allow", "rm")]
    assert records(after)[0]["policy"] == new.sha256
    assert to_server(wire.commit_all(after)) == [call(2, "rm")]
    # `ask_me` is now denied outright, without a question.
    denied = wire.client(call(3, "ask_me"))
    assert asks(denied) == [] and _verdicts(denied) == [("deny", "ask_me")]


def test_session_state_is_kept_across_the_swap() -> None:
    budget = POLICY.replace(
        "default_action: deny\n", "default_action: deny\nsettings:\n  session_max_calls: 2\n"
    )
    wire = policy_wire(policy=budget)
    wire.commit_all(wire.client(call(1, "echo")))
    # Pins are kept: no listing of Visor's own is needed after the swap.
    swap = wire.feed(PolicyReloaded(_load(budget.replace('"echo"', '"echo"  # reloaded'))))
    assert _reloads(swap)[0]["ok"] is True
    second = wire.client(call(2, "echo"))
    assert _verdicts(second) == [("allow", "echo")]
    wire.commit_all(second)
    third = wire.client(call(3, "echo"))
    assert [(r["event"], r["rule"]) for r in records(third)] == [("deny", "budget.session_calls")]


def test_a_call_waiting_for_a_human_finishes_under_the_policy_it_started_with() -> None:
    wire = policy_wire()
    old_sha = wire.core.checks.policy.sha256  # type: ignore[attr-defined]
    (ask,) = asks(wire.client(call(1, "ask_me", x=1)))
    new = _load(NEW_POLICY)
    wire.feed(PolicyReloaded(new))
    # Under the new policy ask_me is denied; the question asked under the old one stands,
    # and the yes is re-checked under the old one too.
    yes = wire.feed(ApprovalAnswered(ask.call, _yes()))
    assert [(r["event"], r["policy"]) for r in records(yes)] == [("approve", old_sha), ("allow", old_sha)]
    assert to_server(wire.commit_all(yes)) == [call(1, "ask_me", x=1)]
    # The next call is judged under the new one, and the old one is not left in force.
    again = wire.client(call(2, "ask_me", x=1))
    assert [(r["event"], r["policy"]) for r in records(again)] == [("deny", new.sha256)]
    assert _verdicts(wire.client(call(3, "rm"))) == [("allow", "rm")]


def test_a_call_asked_before_a_reload_that_drops_the_question_is_still_asked_to_the_end() -> None:
    wire = policy_wire()
    (ask,) = asks(wire.client(call(1, "ask_me")))
    # The new policy allows ask_me without approval: the open question is not skipped.
    no_question = POLICY.replace("        approval_required: true\n", "")
    wire.feed(PolicyReloaded(_load(no_question)))
    no = wire.feed(
        ApprovalAnswered(
            ask.call, Outcome(ApprovalAnswer(approved=False, channel="directory", remember=False))
        )
    )
    assert [r["event"] for r in records(no)] == ["decline", "deny"]
    assert to_server(no) == []


def test_a_policy_that_failed_to_load_leaves_the_old_one_in_force_on_record() -> None:
    wire = policy_wire()
    old_sha = wire.core.checks.policy.sha256  # type: ignore[attr-defined]
    error = "new.yaml:7: servers[0].tools[1].alowed: unknown key"
    out = wire.feed(PolicyReloadFailed("new.yaml", error, "cd" * 32))
    assert _reloads(out) == [
        {
            "event": "policy_reload",
            "source": "new.yaml",
            "previous": old_sha,
            "policy": "cd" * 32,
            "ok": False,
            "error": error,
        }
    ]
    assert _verdicts(wire.client(call(1, "rm"))) == [("deny", "rm")]


def test_a_setting_fixed_at_start_that_differs_refuses_the_whole_reload() -> None:
    wire = policy_wire()
    resized = NEW_POLICY.replace(
        "default_action: deny\n", "default_action: deny\nsettings:\n  output_index_max_keys: 5000\n"
    )
    out = wire.feed(PolicyReloaded(_load(resized)))
    (rec,) = _reloads(out)
    assert rec["ok"] is False
    assert "settings.output_index_max_keys cannot change while the session runs" in rec["error"]
    assert "restart visor run" in rec["error"]
    # Nothing of the refused policy applies, not even its tool entries.
    assert _verdicts(wire.client(call(1, "rm"))) == [("deny", "rm")]
    traced = NEW_POLICY.replace(
        "default_action: deny\n", "default_action: deny\nsettings:\n  untrusted_output: ask\n"
    )
    (rec,) = _reloads(wire.feed(PolicyReloaded(_load(traced))))
    assert rec["ok"] is False and "untrusted_output: ask cannot be turned on" in rec["error"]


def _attested(positions: str) -> str:
    return POLICY.replace(
        "    allowed: true\n    tools:",
        f'    allowed: true\n    attestation:\n      kind: "stdio_invocation_sha256_v1"\n'
        f'      digest: "{DIGEST}"\n      entry_arg_positions: {positions}\n    tools:',
        1,
    )


def _attested_wire() -> Wire:
    # As visor run does at start: the launched invocation measured once (here: it matches).
    launched = attestation.observe(_load(_attested("[0]")), "srv", lambda pos: (DIGEST, None))
    checks = PolicyChecks(
        policy=launched,
        session=SessionState(launched, "srv"),
        audit_session="s" * 32,
        server_name="srv",
        argv=["server"],
    )
    wire = Wire(SessionCore(checks))
    wire.actions.extend(wire.core.start())
    wire.list_tools()
    return wire


def test_a_reload_keeps_the_launch_measurement_and_never_measures_again() -> None:
    wire = _attested_wire()
    same = wire.feed(PolicyReloaded(_load(_attested("[0]").replace('"echo"', '"echo"  # edited'))))
    assert _reloads(same)[0]["ok"] is True and _reloads(same)[0]["attestation"] == "match"
    assert _verdicts(wire.client(call(1, "echo"))) == [("allow", "echo")]
    # Other positions would need a new measurement of a server that is already running: fail closed.
    moved = wire.feed(PolicyReloaded(_load(_attested("[0, 1]"))))
    (rec,) = _reloads(moved)
    assert rec["ok"] is True and "changed entry_arg_positions" in rec["attestation"]
    denied = wire.client(call(2, "echo"))
    assert [(r["event"], r["rule"]) for r in records(denied)] == [("deny", "servers[srv].attestation")]


def test_an_attestation_added_by_a_reload_denies_every_call_until_a_restart() -> None:
    wire = policy_wire()
    out = wire.feed(PolicyReloaded(_load(_attested("[0]"))))
    assert "not measured when it started" in _reloads(out)[0]["attestation"]
    denied = wire.client(call(1, "echo"))
    assert [(r["event"], r["rule"]) for r in records(denied)] == [("deny", "servers[srv].attestation")]


def test_without_checks_a_reload_changes_nothing() -> None:
    wire = plain_wire()
    assert wire.feed(PolicyReloaded(_load(NEW_POLICY))) == []
    assert wire.feed(PolicyReloadFailed("new.yaml", "broken")) == []
