"""The MCP conformance suite's server scenarios, served by the Python SDK over stdio.

`@modelcontextprotocol/conformance server` names the tools, resources and
prompts a server under test must offer (its reference server is not
published); this offers exactly those, for tests/conformance/. It speaks
stdio: supergateway bridges it to Streamable HTTP, directly or through
`visor run`.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import mcp.types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import AssistantMessage, UserMessage
from mcp.server.mcpserver.resources import FunctionResource

# A 1x1 PNG and a minimal WAV, base64 (the contents the scenarios check the types of).
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
WAV = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="

app = MCPServer("visor-conformance-server", version="1.0.0")


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


# ----------------------------------------------------------------- tools
@app.tool(description="Tests simple text content response")
def test_simple_text() -> types.CallToolResult:
    return types.CallToolResult(content=[_text("This is a simple text response for testing.")])


@app.tool(description="Tests image content response")
def test_image_content() -> types.CallToolResult:
    return types.CallToolResult(content=[types.ImageContent(type="image", data=PNG, mime_type="image/png")])


@app.tool(description="Tests audio content response")
def test_audio_content() -> types.CallToolResult:
    return types.CallToolResult(content=[types.AudioContent(type="audio", data=WAV, mime_type="audio/wav")])


def _embedded(uri: str, text: str, mime: str = "text/plain") -> types.EmbeddedResource:
    return types.EmbeddedResource(
        type="resource", resource=types.TextResourceContents(uri=uri, mime_type=mime, text=text)
    )


@app.tool(description="Tests embedded resource content response")
def test_embedded_resource() -> types.CallToolResult:
    return types.CallToolResult(
        content=[_embedded("test://embedded-resource", "This is an embedded resource content.")]
    )


@app.tool(description="Tests response with multiple content types (text, image, resource)")
def test_multiple_content_types() -> types.CallToolResult:
    return types.CallToolResult(
        content=[
            _text("Multiple content types test:"),
            types.ImageContent(type="image", data=PNG, mime_type="image/png"),
            _embedded(
                "test://mixed-content-resource",
                json.dumps({"test": "data", "value": 123}),
                "application/json",
            ),
        ]
    )


@app.tool(description="Tests tool that emits log messages during execution")
async def test_tool_with_logging(ctx: Context) -> types.CallToolResult:
    for text in ("Tool execution started", "Tool processing data", "Tool execution completed"):
        await ctx.info(text)
        await asyncio.sleep(0.05)
    return types.CallToolResult(content=[_text("Tool with logging executed successfully")])


@app.tool(description="Tests tool that reports progress notifications")
async def test_tool_with_progress(ctx: Context) -> types.CallToolResult:
    for step in (0, 50, 100):
        await ctx.report_progress(step, 100, f"Completed step {step} of 100")
        await asyncio.sleep(0.05)
    return types.CallToolResult(content=[_text("Progress reported")])


@app.tool(description="Tests error response handling")
def test_error_handling() -> str:
    raise ValueError("This tool intentionally returns an error for testing")


@app.tool(description="Tests server-initiated sampling (LLM completion request)")
async def test_sampling(prompt: str, ctx: Context) -> types.CallToolResult:
    try:
        result = await ctx.session.create_message(
            messages=[types.SamplingMessage(role="user", content=_text(prompt))], max_tokens=100
        )
        content = result.content
        text = getattr(content, "text", None) or "No response"
        return types.CallToolResult(content=[_text(f"LLM response: {text}")])
    except Exception as exc:
        return types.CallToolResult(content=[_text(f"Sampling not supported or error: {exc}")])


async def _elicit(ctx: Context, message: str, schema: dict[str, Any]) -> types.CallToolResult:
    try:
        result = await ctx.session.elicit_form(message=message, requested_schema=schema)
        content = json.dumps(result.content or {})
        return types.CallToolResult(
            content=[_text(f"User response: action={result.action}, content={content}")]
        )
    except Exception as exc:
        return types.CallToolResult(content=[_text(f"Elicitation not supported or error: {exc}")])


@app.tool(description="Tests server-initiated elicitation (user input request)")
async def test_elicitation(message: str, ctx: Context) -> types.CallToolResult:
    schema = {
        "type": "object",
        "properties": {"response": {"type": "string", "description": "User's response"}},
        "required": ["response"],
    }
    return await _elicit(ctx, message, schema)


@app.tool(description="Tests elicitation with default values per SEP-1034")
async def test_elicitation_sep1034_defaults(ctx: Context) -> types.CallToolResult:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "User name", "default": "John Doe"},
            "age": {"type": "integer", "description": "User age", "default": 30},
            "score": {"type": "number", "description": "User score", "default": 95.5},
            "status": {
                "type": "string",
                "description": "User status",
                "enum": ["active", "inactive", "pending"],
                "default": "active",
            },
            "verified": {"type": "boolean", "description": "Verification status", "default": True},
        },
        "required": [],
    }
    return await _elicit(ctx, "Please review and update the form fields with defaults", schema)


@app.tool(description="Tests elicitation with enum schema improvements per SEP-1330")
async def test_elicitation_sep1330_enums(ctx: Context) -> types.CallToolResult:
    options = ["option1", "option2", "option3"]
    titled = [{"const": v, "title": f"Option {v[-1]}"} for v in ("value1", "value2", "value3")]
    schema = {
        "type": "object",
        "properties": {
            "untitledSingle": {"type": "string", "description": "Select one option", "enum": options},
            "titledSingle": {"type": "string", "description": "Select one option", "oneOf": titled},
            "legacyEnum": {
                "type": "string",
                "description": "Select one option (legacy)",
                "enum": options,
                "enumNames": ["Option One", "Option Two", "Option Three"],
            },
            "untitledMulti": {
                "type": "array",
                "description": "Select multiple options",
                "items": {"type": "string", "enum": options},
            },
            "titledMulti": {
                "type": "array",
                "description": "Select multiple options",
                "items": {"anyOf": titled},
            },
        },
        "required": [],
    }
    return await _elicit(ctx, "Please select options from the enum fields", schema)


@app.tool(name="json_schema_2020_12_tool", description="Tool with JSON Schema 2020-12 features")
def json_schema_2020_12_tool(name: str | None = None, address: dict[str, Any] | None = None) -> str:
    return f"name={name}, address={json.dumps(address)}"


# Its input schema as written: $schema, $defs and additionalProperties kept.
app._tool_manager.get_tool("json_schema_2020_12_tool").parameters = {  # type: ignore[union-attr]
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}


# ------------------------------------------------------------- resources
@app.resource(
    "test://static-text", name="static-text", mime_type="text/plain", description="A static text resource"
)
def static_text() -> str:
    return "This is the content of the static text resource."


app.add_resource(
    FunctionResource(
        uri="test://static-binary",
        name="static-binary",
        mime_type="image/png",
        description="A static binary resource (a PNG)",
        fn=lambda: base64.b64decode(PNG),
    )
)


@app.resource("test://template/{id}/data", name="template", mime_type="application/json")
def template(id: str) -> str:
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})


@app.resource("test://watched-resource", name="watched-resource", mime_type="text/plain")
def watched() -> str:
    return "Watched resource content"


async def _subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
    return types.EmptyResult()


async def _unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    return types.EmptyResult()


async def _set_level(ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
    return types.EmptyResult()


_low = app._lowlevel_server
_low.add_request_handler("resources/subscribe", types.SubscribeRequestParams, _subscribe)
_low.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, _unsubscribe)
_low.add_request_handler("logging/setLevel", types.SetLevelRequestParams, _set_level)


# --------------------------------------------------------------- prompts
@app.prompt(name="test_simple_prompt", description="A simple prompt without arguments")
def simple_prompt() -> list[Any]:
    return [UserMessage("This is a simple prompt for testing.")]


@app.prompt(name="test_prompt_with_arguments", description="A prompt with required arguments")
def prompt_with_arguments(arg1: str, arg2: str) -> list[Any]:
    return [UserMessage(f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'")]


@app.prompt(
    name="test_prompt_with_embedded_resource", description="A prompt that includes an embedded resource"
)
def prompt_with_embedded_resource(resourceUri: str) -> list[Any]:
    return [
        UserMessage(_embedded(resourceUri, "Embedded resource content for testing.")),
        UserMessage("Please process the embedded resource above."),
    ]


@app.prompt(name="test_prompt_with_image", description="A prompt that includes image content")
def prompt_with_image() -> list[Any]:
    return [
        UserMessage(types.ImageContent(type="image", data=PNG, mime_type="image/png")),
        UserMessage("Please analyze the image above."),
    ]


@app.completion()
async def complete(ref: Any, argument: types.CompletionArgument, context: Any) -> types.Completion:
    values = [v for v in ("paris", "park", "party") if v.startswith(argument.value)]
    return types.Completion(values=values, total=len(values), has_more=False)


_ = AssistantMessage  # the prompt message kinds the SDK offers; the scenarios use user messages

if __name__ == "__main__":
    app.run()
