"""What the evaluator is asked and what it answers: a call in, a verdict out.

The two types every judging module shares (the evaluator, the resource and
request decisions, the gate, the audit writer), kept apart from the checks so
that reading a verdict never imports the machinery that produced it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Verdict = Literal["allow", "deny", "ask"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    server: str  # the --server-name given to `visor run` ("" when none)
    tool: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Decision:
    action: Verdict
    rule: str
    reason: str
    destination: str | None = None
    argument: str | None = None


def deny(rule: str, reason: str, *, destination: str | None = None, argument: str | None = None) -> Decision:
    return Decision("deny", rule, reason, destination, argument)


def ask(rule: str, reason: str, *, destination: str | None = None, argument: str | None = None) -> Decision:
    return Decision("ask", rule, reason, destination, argument)


_RANK = {"allow": 0, "ask": 1, "deny": 2}


def stricter(a: Decision, b: Decision) -> Decision:
    """The stricter of two verdicts on readings of one call (the first on a tie)."""
    return b if _RANK[b.action] > _RANK[a.action] else a
