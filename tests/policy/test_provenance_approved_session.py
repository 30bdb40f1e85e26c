"""Approved destinations stay approved: for the session, and across restarts with "remember"."""

from __future__ import annotations

import pytest

from tests.policy.helpers import policy_from, session_for
from visor.policy.evaluate import ToolCall, evaluate
from visor.session import SessionState

POLICY = """
version: "1.0"
default_action: deny
servers:
  - name: "mail"
    allowed: true
    tools:
      - name: "send_email"
        allowed: true
        exfiltrating: true
        sink_params: ["to"]
"""


def test_remembered_destinations_round_trip_into_a_new_session() -> None:
    policy = policy_from(POLICY)
    saved: list[dict] = []
    first = session_for(policy, "mail")
    first.approvals_saver = saved.append
    call = ToolCall("mail", "send_email", {"to": "carol@partner.example"})
    asked = evaluate(policy, first, call)
    first.remember_approval(call, asked)  # a plain yes: this session only
    assert saved == []
    first.remember_approval(call, asked, persist=True)
    assert saved and saved[-1]["destinations"] == [["send_email", "to", "email:carol@partner.example"]]

    second = session_for(policy, "mail")
    second.import_approvals(saved[-1])
    second.observe_output(
        "send_email", {"content": [{"type": "text", "text": "sent to carol@partner.example"}]}
    )
    assert evaluate(policy, second, call).action == "allow"
    other = ToolCall("mail", "send_email", {"to": "carol@partner.example.evil.example"})
    assert evaluate(policy, second, other).action != "allow"


@pytest.mark.parametrize(
    "data",
    [
        {"format": 2, "server": "mail", "destinations": []},
        {"format": 1, "server": "other", "destinations": []},
        {"format": 1, "server": "mail", "destinations": [["send_email", "to"]]},
        {"format": 1, "server": "mail", "destinations": "x"},
    ],
)
def test_a_malformed_approvals_file_is_refused(data: dict) -> None:
    session = SessionState(policy_from(POLICY), "mail")
    with pytest.raises(ValueError):
        session.import_approvals(data)
