"""Helpers for the policy tests: build a policy from text, a session that has
seen a tools/list, and a call."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime

from visor.policy.evaluate import Decision, ToolCall, evaluate
from visor.policy.loader import load_policy_text
from visor.policy.schema import Policy
from visor.session import SessionState


def policy_from(text: str, source: str = "test.yaml") -> Policy:
    return load_policy_text(textwrap.dedent(text), source)


def session_for(policy: Policy, server: str, tools: list[str] | None = None) -> SessionState:
    s = SessionState(policy, server)
    names = tools if tools is not None else _all_tools(policy, server)
    s.observe_tools_list({"tools": [{"name": t, "inputSchema": {"type": "object"}} for t in names]})
    return s


def _all_tools(policy: Policy, server: str) -> list[str]:
    entry = policy.server(server)
    return [t for t in (entry.tools if entry else {}) if t != "*"]


# A Wednesday, 11:00 in Berlin: inside every office-hours window of the test policies.
NOW = datetime(2026, 6, 3, 9, 0, tzinfo=UTC)


def decide(
    policy: Policy, session: SessionState, tool: str, now: datetime = NOW, **arguments: object
) -> Decision:
    return evaluate(policy, session, ToolCall(session.server, tool, dict(arguments)), now)


def allow_call(session: SessionState, tool: str, **arguments: object) -> None:
    """Record a call as allowed (what the gate does after committing an allow)."""
    session.record_allowed(ToolCall(session.server, tool, dict(arguments)))
