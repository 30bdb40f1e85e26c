"""The policy is compiled once, at load, into the plan the evaluator runs:
the checks that can fire for it, in the decision order, and its own memo."""

from __future__ import annotations

from dataclasses import replace

from tests.policy.helpers import allow_call, decide, policy_from, session_for
from visor.policy.evaluate import CHECKS, compile_policy
from visor.policy.loader import load_default_policy
from visor.policy.schema import Policy

ORDER = [name for name, _check in CHECKS]

CHAINS = """
version: "1.0"
default_action: deny
settings:
  session_max_calls: 0
  session_timeout_seconds: 0
servers:
  - name: "s"
    allowed: true
    tools:
      - name: "read_secret"
        allowed: true
      - name: "send"
        allowed: true
      - name: "run"
        allowed: true
        rules:
          - type: deny_path
            patterns: ["/etc/**"]
          - type: deny_command_pattern
            patterns: ["rm -rf"]
tool_chains:
  - name: "read-then-send"
    sources: [{tool_pattern: "read_.*"}]
    sinks: [{tool_pattern: "send"}]
    action: deny
"""


def _names(policy: Policy) -> list[str]:
    assert policy.compiled is not None
    by_check = {check: name for name, check in CHECKS}
    return [by_check[c] for c in policy.compiled.checks]


def test_a_loaded_policy_carries_the_checks_that_can_fire_in_the_decision_order() -> None:
    names = _names(policy_from(CHAINS))
    assert names == [n for n in ORDER if n in names]  # the documented order
    assert {"tool_chains", "rules.paths", "rules.arguments"} <= set(names)
    # nothing in this policy could make these fire
    assert not {"budget.session_calls", "limits.session_timeout", "egress_controls", "identities"} & set(
        names
    )


def test_the_default_policy_skips_what_it_has_no_rules_for() -> None:
    names = _names(load_default_policy())
    assert "tool_chains" not in names and "rules.arguments" not in names
    assert names[:4] == ["visor.protected_path", "pin.server", "pin.tool", "limits.argument_size"]


def test_each_policy_has_its_own_memo_and_the_chain_fires_through_it() -> None:
    first, second = policy_from(CHAINS), policy_from(CHAINS)
    assert first.compiled is not None and second.compiled is not None
    assert first.compiled.memo is not second.compiled.memo
    session = session_for(first, "s")
    allow_call(session, "read_secret")
    d = decide(first, session, "send")
    assert (d.action, d.rule) == ("deny", "tool_chains[read-then-send]")
    assert first.compiled.memo.sink_chains and not second.compiled.memo.sink_chains


def test_a_policy_built_by_hand_is_compiled_for_the_call() -> None:
    policy = Policy(source="<hand>", sha256="")
    assert policy.compiled is None
    d = decide(policy, session_for(policy, "nowhere", tools=["t"]), "t")
    assert (d.action, d.rule) == ("deny", "registration.unknown_server")
    plan = compile_policy(policy)
    assert "registration" in [n for n, c in CHECKS if c in plan.checks]


def test_a_copy_keeps_the_plan_it_was_made_with() -> None:
    # visor run copies the policy to record what it measured of a server
    # (policy/attestation.py): the copy evaluates with the same plan.
    policy = policy_from(CHAINS)
    copy = replace(policy, description="measured")
    assert copy.compiled is policy.compiled
