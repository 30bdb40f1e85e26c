"""The `make eval` harness on one task pair (visor/eval/); the real evidence is `make eval` itself.

AgentDojo is installed only by `make eval` (the `eval` extra), which runs this file first;
`make test` leaves it out (`--ignore=tests/eval`).
"""

from __future__ import annotations

import pytest

pytest.importorskip(
    "agentdojo", reason="AgentDojo is not installed (only `make eval` installs the eval extra)"
)

from visor.eval import agentdojo_replay as replay

POLICY = str(replay.DEFAULT_POLICY)


@pytest.fixture(scope="module")
def suite():
    replay._SUITE = replay.load_suite()
    return replay._SUITE


def test_fast_environment_loader_matches_agentdojo(suite) -> None:
    goal = suite.get_injection_task_by_id("injection_task_13").GOAL
    injections = {
        v: goal for v in replay.injection_candidates(suite, suite.get_user_task_by_id("user_task_1"))
    }
    assert injections
    assert replay.load_environment(suite, injections) == suite.load_and_inject_default_environment(injections)


def test_server_lists_the_suites_tools_and_a_clean_run_keeps_utility(suite) -> None:
    r = replay.run_one(("user_task_0", None, "direct", POLICY))
    assert r["error"] is None and r["utility"] is True
    assert [c["function"] for c in r["calls"]] == ["search_calendar_events"] and r["calls"][0]["ran"]


def test_an_exfiltration_succeeds_without_visor_and_is_denied_through_it(suite) -> None:
    job = ("user_task_13", "injection_task_3", "direct", POLICY)
    direct = replay.run_one(job)
    assert direct["error"] is None and direct["security"] is True
    through = replay.run_one(("user_task_13", "injection_task_3", "none", POLICY))
    assert through["error"] is None and through["security"] is False
    attack_sends = [c for c in through["calls"] if c["phase"] == "attack" and c["function"] == "send_email"]
    assert attack_sends and not any(c["ran"] for c in attack_sends)
    assert attack_sends[0]["rule"] == "provenance.untrusted_output"
