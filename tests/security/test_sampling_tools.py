"""A sampling request that offers tools is refused unless the policy allows it.

With tools in `sampling/createMessage`, the client's model chooses calls the server then runs
itself: they never pass Visor as tools/call, so no argument rule, budget or provenance check sees
them. Through a real `visor run` between the real SDK client (with a sampling callback that picks
the tool) and a real SDK server: by default the server never gets the model's choice; with
`server_requests: sampling_tools: allow` it does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

SERVER = Path(__file__).parents[1] / "servers" / "sdk_sampling_tools.py"

POLICY = """\
version: "1.0"
default_action: deny
settings:
  packs: []
servers:
  - name: "agentic"
    allowed: true
{requests}
    tools:
      - name: "plan"
        allowed: true
"""


_WITH_TOOLS = types.SamplingCapability(tools=types.SamplingToolsCapability())


async def _pick_the_tool(ctx: Any, params: types.CreateMessageRequestParams) -> Any:
    assert params.tools, params
    return types.CreateMessageResultWithTools(
        role="assistant",
        content=[types.ToolUseContent(type="tool_use", id="u1", name=params.tools[0].name, input={})],
        model="scripted",
        stop_reason="toolUse",
    )


def _run(tmp_path: Path, requests: str) -> tuple[str, list[dict]]:
    log = tmp_path / "ran.jsonl"
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(requests=requests))
    visor = [
        "-m", "visor", "run", "--server-name", "agentic", "--policy", str(policy),
        "--audit-log", str(tmp_path / "audit.jsonl"), "--", sys.executable, str(SERVER),
    ]  # fmt: skip
    params = StdioServerParameters(command=sys.executable, args=visor, env={"SAMPLING_LOG": str(log)})

    async def main() -> str:
        async with (
            stdio_client(params) as (r, w),
            ClientSession(r, w, sampling_callback=_pick_the_tool, sampling_capabilities=_WITH_TOOLS) as s,
        ):
            await s.initialize()
            try:
                result = await s.call_tool("plan", {"goal": "free some space"})
            except MCPError as exc:  # the server's tool failed: its sampling request was refused
                return str(exc)
            block = result.content[0]
            assert isinstance(block, types.TextContent)
            return block.text

    text = anyio.run(main)
    ran = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return text, ran


def test_a_sampling_request_offering_tools_is_refused_by_default(tmp_path: Path) -> None:
    text, ran = _run(tmp_path, "")
    assert ran == []
    assert "Visor denied sampling/createMessage" in text, text
    audit = (tmp_path / "audit.jsonl").read_text()
    assert "server_requests.sampling_tools" in audit


def test_the_policy_can_allow_it(tmp_path: Path) -> None:
    text, ran = _run(tmp_path, "    server_requests: {sampling_tools: allow}")
    assert ran == [{"ran": "wipe_disk"}], text


def test_tools_in_any_case_count_and_an_empty_list_does_not() -> None:
    from tests.policy.helpers import policy_from
    from visor.policy.requests import sampling_tools_decision

    policy = policy_from(POLICY.format(requests=""))
    tool = {"name": "wipe_disk", "inputSchema": {"type": "object"}}
    for params in ({"tools": [tool]}, {"Tools": [tool]}, {"toolChoice": {"mode": "auto"}, "tools": [tool]}):
        decision = sampling_tools_decision(policy, "agentic", {"messages": [], **params})
        assert decision is not None and decision.action == "deny", params
    for params in ({}, {"tools": []}, {"tools": None}):
        assert sampling_tools_decision(policy, "agentic", {"messages": [], **params}) is None, params
