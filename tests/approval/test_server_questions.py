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


# ---------------------------------------------------------------- 2026-07-28: questions inside results

INPUT_REQUIRED_SERVER = [sys.executable, str(Path(__file__).parents[1] / "servers" / "sdk_input_required.py")]


async def _ask_inside_result(
    tmp_path: Path, tool: str, arguments: dict, policy: str = ""
) -> tuple[list[dict], str]:
    """On the 2026-07-28 revision a server asks inside its result (`input_required`): what the
    client is given to show, round by round, and what it reads at the end."""
    args = ["--server-name", "helper", "--audit-log", str(tmp_path / "a.jsonl")]
    if policy:
        (tmp_path / "p.yaml").write_text(policy)
        args += ["--policy", str(tmp_path / "p.yaml")]
    shown: list[dict] = []
    params = visor_params(INPUT_REQUIRED_SERVER, args)
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.discover()
        await s.list_tools()
        result = await s.call_tool(tool, arguments, allow_input_required=True)
        if isinstance(result, types.InputRequiredResult):
            asked = result.model_dump(mode="json", by_alias=True, exclude_none=True)["inputRequests"]
            shown.append(asked)
            answers = {key: types.ElicitResult(action="accept", content={"ok": True}) for key in asked}
            result = await s.call_tool(
                tool,
                arguments,
                input_responses=answers,  # type: ignore[arg-type]
                request_state=result.request_state,
            )
        return shown, result.content[0].text  # type: ignore[union-attr]


def test_a_question_inside_a_result_is_marked_as_the_servers(tmp_path: Path) -> None:
    shown, text = anyio.run(_ask_inside_result, tmp_path, "ask", {"question": "Proceed with the export?"})
    ((_key, request),) = shown[0].items()
    assert request["method"] == "elicitation/create"
    first, rest = request["params"]["message"].split("\n", 1)
    assert (
        first.startswith('[Question from the MCP server "helper", not from Visor')
        and rest == "Proceed with the export?"
    )
    assert text == "answered accept"  # the answer still reaches the server and the call completes


def test_a_question_inside_a_result_that_speaks_as_visor_never_reaches_the_person(tmp_path: Path) -> None:
    shown, text = anyio.run(_ask_inside_result, tmp_path, "ask", {"question": IMITATION})
    assert shown == []
    assert text.startswith("Visor denied the server's elicitation/create") and "speaks_as_visor" in text
    (deny,) = [r for r in _records(tmp_path / "a.jsonl") if r.get("method") == "elicitation/create"]
    assert deny["event"] == "deny" and deny["input_request"] == "q"


def test_a_sampling_request_inside_a_result_obeys_the_policy(tmp_path: Path) -> None:
    policy = (
        'version: "1.0"\ndefault_action: allow\nservers:\n  - name: helper\n    allowed: true\n'
        "    server_requests: {sampling: deny}\n"
    )
    shown, text = anyio.run(_ask_inside_result, tmp_path, "sample", {"prompt": "hi"}, policy)
    assert shown == []
    assert "rule: servers[helper].server_requests.sampling" in text


def test_requests_in_any_answer_that_carries_them_are_judged() -> None:
    """The tasks extension carries the same map in a task's status: any answer with
    `inputRequests` is judged, whatever its resultType."""
    from visor.core.guard import DataGuard
    from visor.policy.loader import load_policy_text
    from visor.wire.message import classify

    emitted: list[Any] = []
    guard = DataGuard(load_policy_text('version: "1.0"\ndefault_action: allow\n'), "helper", emitted.append)
    for result in (
        {
            "task": {"taskId": "t1", "status": "input_required"},
            "inputRequests": {"q": {"method": "elicitation/create", "params": {"message": IMITATION}}},
        },
        {
            "resultType": "input_required",
            "inputRequests": {"q": {"method": "elicitation/create", "params": {"message": IMITATION}}},
        },
    ):
        line = json.dumps({"jsonrpc": "2.0", "id": 3, "result": result}).encode()
        out = guard.input_requests("tasks/get", classify(line, fold_case=False))  # type: ignore[arg-type]
        assert isinstance(out, bytes) and b"speaks_as_visor" in out
