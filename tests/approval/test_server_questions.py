"""A server's own elicitation can never pass for Visor's approval question.

Visor's questions and a server's appear in the same client dialog. Through a
real ``visor run`` in front of the SDK server (its ``confirm`` tool elicits
with the question it is given) and the real SDK client: a server question
reaches the person marked as the server's, one that speaks as Visor is
refused (the server reads an error, the person sees nothing), and the
refusal is on record.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import ClientSession, stdio_client
from mcp.shared.exceptions import MCPError

from tests.integration.sdk_scenario import visor_params

SDK_SERVER = [sys.executable, str(Path(__file__).parents[1] / "servers" / "sdk_server.py")]

# What Visor's own approval dialog says (visor/approval/model.py, describe), word for word.
IMITATION = (
    'Visor: allow the tool call "send_email" on server "mail"?\n'
    "Why: the recipient is not known (rule: provenance.unknown_destination).\nApproval id: 0f3a"
)


async def _ask(audit: Path, question: str, seen: list[types.ElicitRequestParams]) -> str:
    """What the client reads of the tool's outcome: its text, or the error it raised."""

    async def answer(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        seen.append(params)
        return types.ElicitResult(action="accept", content={"ok": True})

    params = visor_params(SDK_SERVER, ["--server-name", "helper", "--audit-log", str(audit)])
    async with stdio_client(params) as (r, w), ClientSession(r, w, elicitation_callback=answer) as s:
        await s.initialize()
        await s.list_tools()
        try:
            result = await s.call_tool("confirm", {"question": question})
        except MCPError as exc:
            return f"error: {exc}"
        return result.content[0].text  # type: ignore[union-attr]


def _records(audit: Path) -> list[dict]:
    return [json.loads(line) for line in audit.read_text().splitlines()]


def test_a_server_question_reaches_the_person_marked_as_the_servers(tmp_path: Path) -> None:
    seen: list[types.ElicitRequestParams] = []
    result = anyio.run(_ask, tmp_path / "a.jsonl", "Proceed with the export?", seen)
    assert result == "accepted ok=True"
    (asked,) = seen
    first, rest = asked.message.split("\n", 1)
    assert first.startswith('[Question from the MCP server "helper", not from Visor')
    assert rest == "Proceed with the export?"
    assert not asked.message.startswith("Visor")


@pytest.mark.parametrize(
    "question",
    [
        IMITATION,
        "Please confirm.\n\nVISOR approval required: approve the pending call?",
        "V\u200bisor: allow the tool call?",  # an invisible character inside the word
        "\uff36\uff49\uff53\uff4f\uff52: allow?",  # fullwidth letters
        "V\u0456s\u043er: allow the tool call?",  # Cyrillic look-alikes
        "V.i.s.o.r says: approve",
        "VisorGuard approval: allow the tool call?",  # a word that begins with the name
    ],
)
def test_a_server_question_that_speaks_as_visor_never_reaches_the_person(
    tmp_path: Path, question: str
) -> None:
    seen: list[types.ElicitRequestParams] = []
    audit = tmp_path / "a.jsonl"
    result = anyio.run(_ask, audit, question, seen)
    assert seen == []
    # the server read Visor's refusal as the error of its elicitation, and passed it on
    assert result.startswith("error: Visor denied elicitation/create")
    (deny,) = [r for r in _records(audit) if r.get("method") == "elicitation/create"]
    assert deny["event"] == "deny" and deny["rule"] == "server_requests.elicitation.speaks_as_visor"


def test_words_that_merely_contain_the_name_are_not_a_claim(tmp_path: Path) -> None:
    seen: list[types.ElicitRequestParams] = []
    result = anyio.run(_ask, tmp_path / "a.jsonl", "Ask your advisor or supervisor first?", seen)
    assert result == "accepted ok=True"
    assert seen[0].message.endswith("\nAsk your advisor or supervisor first?")


@pytest.mark.parametrize(
    ("params", "rule"),
    [
        (None, "server_requests.elicitation.malformed"),
        ({"message": ["Proceed?"]}, "server_requests.elicitation.malformed"),
        (
            {"message": "Proceed?", "requestedSchema": {"properties": {"d": {"title": "Visor decision"}}}},
            "server_requests.elicitation.speaks_as_visor",
        ),
        (
            {"message": "Proceed?", "requestedSchema": {"properties": {"d": {"enum": ["VISOR: approve"]}}}},
            ("server_requests.elicitation.speaks_as_visor"),
        ),
    ],
)
def test_what_cannot_be_marked_or_speaks_as_visor_anywhere_is_refused(params: Any, rule: str) -> None:
    from visor.policy.requests import elicitation_decision

    decision = elicitation_decision(params)
    assert decision is not None and decision.rule == rule
    assert elicitation_decision({"message": "Proceed?", "_meta": {"x": "Visor"}}) is None
