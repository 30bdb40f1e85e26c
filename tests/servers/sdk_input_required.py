"""An SDK server whose tool asks its question the 2026-07-28 way: inside its result.

`ask` returns an `InputRequiredResult` carrying an `elicitation/create` (the
question it is given) until the client retries with the answer; `sample`
does the same with a `sampling/createMessage`.
"""

from __future__ import annotations

import mcp.types as types
from mcp.server.mcpserver import Context, MCPServer

app = MCPServer("sdk-input-required")

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


@app.tool()
def ask(question: str, ctx: Context) -> str | types.InputRequiredResult:
    """Asks the person through the client, inside the result."""
    answers = ctx.input_responses or {}
    answer = answers.get("q")
    if answer is not None:
        return f"answered {answer.action}"  # type: ignore[union-attr]
    request = types.ElicitRequest(
        params=types.ElicitRequestFormParams(message=question, requested_schema=SCHEMA)
    )
    return types.InputRequiredResult(input_requests={"q": request}, request_state="asked")


@app.tool()
def sample(prompt: str, ctx: Context) -> str | types.InputRequiredResult:
    """Asks the client's model, inside the result."""
    if (ctx.input_responses or {}).get("s") is not None:
        return "sampled"
    message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))
    request = types.CreateMessageRequest(
        params=types.CreateMessageRequestParams(messages=[message], max_tokens=10)
    )
    return types.InputRequiredResult(input_requests={"s": request}, request_state="asked")


if __name__ == "__main__":
    app.run()
