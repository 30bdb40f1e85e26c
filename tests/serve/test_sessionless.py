"""visor/serve/sessionless.py without sockets: the header-against-body rule, the strict reading of
mirrored header values, and ids renamed and restored without changing anything else."""

from __future__ import annotations

import json
from typing import Any

import pytest

from visor.serve.sessionless import (
    HEADER_MISMATCH,
    Renamer,
    check_request,
    conversation_key,
    decode_header_value,
)

META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def _call(name: str = "send") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "_meta": dict(META)}}


GOOD = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "send"}


def test_headers_that_say_what_the_body_says_pass() -> None:
    assert check_request(GOOD, _call()) is None
    assert check_request({**GOOD, "Mcp-Name": "=?base64?c2VuZA==?="}, _call()) is None
    # Non-ASCII names travel base64-encoded.
    named = _call("envoyé")
    assert check_request({**GOOD, "Mcp-Name": "=?base64?ZW52b3nDqQ==?="}, named) is None


@pytest.mark.parametrize(
    "headers",
    [
        {**GOOD, "Mcp-Name": "read"},
        {**GOOD, "Mcp-Name": "SEND"},
        {**GOOD, "Mcp-Method": "tools/list"},
        {**GOOD, "MCP-Protocol-Version": "2025-11-25"},
        {k: v for k, v in GOOD.items() if k != "Mcp-Method"},
        {k: v for k, v in GOOD.items() if k != "Mcp-Name"},
        {**GOOD, "Mcp-Name": "=?base64?c2VuZA?="},  # unpadded: not what an encoder writes
        {**GOOD, "Mcp-Name": "=?base64?c2VuZA=\\n=?="},
    ],
)
def test_headers_that_disagree_with_the_body_are_refused(headers: dict[str, str]) -> None:
    refusal = check_request(headers, _call())
    assert refusal is not None and refusal.code == HEADER_MISMATCH


def test_a_body_without_its_envelope_is_refused() -> None:
    body = _call()
    del body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
    refusal = check_request(GOOD, body)
    assert refusal is not None and refusal.code == -32602


def test_decoding_is_strict() -> None:
    assert decode_header_value("plain") == "plain"
    assert decode_header_value("=?base64?//79?=") is None  # not UTF-8
    assert decode_header_value("=?base64?!!!!?=") is None
    assert decode_header_value(None) is None
    # Head and tail overlap: a plain value, as the SDK's reader takes it (found by make fuzz).
    assert decode_header_value("=?base64?=") == "=?base64?="
    assert decode_header_value("=?base64??=") == ""


def test_conversations_are_named_by_a_digest_of_the_credential() -> None:
    assert conversation_key(None) == conversation_key("") == "conversation-anonymous"
    one, two = conversation_key("Bearer a" * 3), conversation_key("Bearer b" * 3)
    assert one != two and "Bearer" not in one and one.startswith("conversation-")


def test_ids_and_tokens_are_renamed_and_restored_leaving_every_other_byte() -> None:
    renamer = Renamer()
    first = renamer.rename({**_call(), "id": 1, "params": {"name": "x", "_meta": {"progressToken": 5}}})
    second = renamer.rename({**_call(), "id": 1})
    assert first.internal_id != second.internal_id
    sent = json.loads(first.line)
    assert (
        sent["id"] == first.internal_id and sent["params"]["_meta"]["progressToken"] == first.internal_token
    )
    # An integer no double holds, and the server's own escapes, come back untouched.
    line = b'{"jsonrpc":"2.0","id":"%s","result":{"n":123456789012345678901234567890,"s":"\\u00e9"}}'
    back = first.restore(line % first.internal_id.encode())
    assert back == b'{"jsonrpc":"2.0","id":1,"result":{"n":123456789012345678901234567890,"s":"\\u00e9"}}'
    progress = (
        b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"%s","progress":1}}'
    )
    assert json.loads(first.restore(progress % first.internal_token.encode()))["params"]["progressToken"] == 5
    # The id written with an escape at the top and plainly inside the result: the top one changes.
    tricky = b'{"jsonrpc":"2.0","result":{"x":{"id":"%s"}},"id":"%s"}' % (
        first.internal_id.encode(),
        first.internal_id.replace("-", "\\u002d").encode(),
    )
    restored = json.loads(first.restore(tricky))
    assert restored["id"] == 1 and restored["result"]["x"]["id"] == first.internal_id
    # Someone else's response is not touched.
    other = b'{"jsonrpc":"2.0","id":"visor-c999","result":{}}'
    assert first.restore(other) == other
