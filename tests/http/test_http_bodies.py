"""One JSON-RPC message per HTTP body or SSE event, held to the stdio wire rules."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.fuzz.fuzz_sse import check
from visor.http.bodies import classify_body
from visor.wire.message import Kind, Message, Rejected

SEEDS = sorted((Path(__file__).resolve().parents[1] / "fuzz" / "corpus" / "sse").iterdir())


def test_a_compact_response_passes_byte_for_byte() -> None:
    body = b'{"jsonrpc":"2.0","id":7,"result":{"content":[]}}'
    msg = classify_body(body)
    assert type(msg) is Message and msg.kind is Kind.RESPONSE and msg.raw == body


def test_line_breaks_between_tokens_become_spaces_and_the_value_is_unchanged() -> None:
    body = b'{\r\n  "jsonrpc": "2.0",\n  "method": "notifications/progress",\r  "params": {"p": "a:b"}\n}\n'
    msg = classify_body(body)
    assert type(msg) is Message and msg.kind is Kind.NOTIFICATION
    assert b"\n" not in msg.raw and b"\r" not in msg.raw
    assert orjson.loads(msg.raw) == orjson.loads(body)


def test_a_raw_line_break_inside_a_string_is_refused_not_repaired() -> None:
    # A space there would turn invalid JSON into a message the server never sent.
    result = classify_body(b'{"jsonrpc":"2.0","method":"x","params":{"t":"a\nb"}}')
    assert type(result) is Rejected and "not valid JSON" in result.reason


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"jsonrpc":"2.0","id":1,"id":2,"result":{}}', "duplicate keys"),
        (b'[{"jsonrpc":"2.0","id":1,"result":{}}]', "batches are not accepted"),
        (b'{"jsonrpc":"2.0","id":true,"result":{}}', "not a boolean"),
        (b'{"jsonrpc":"2.0","id":1.5,"method":"x"}', "id must be a string or an integer"),
        (b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"result":{}}', "byte order mark"),
        (b'{"jsonrpc":"2.0","id":1,"result":{"t":"\xff"}}', "not valid JSON"),
        (b"", "empty message body"),
        (b"\n\r\n", "empty message body"),
        (b'{"jsonrpc":"2.0","id":1,"result":{}}{"jsonrpc":"2.0","id":2,"result":{}}', "not valid JSON"),
    ],
)
def test_what_stdio_refuses_http_refuses(body: bytes, reason: str) -> None:
    result = classify_body(body)
    assert type(result) is Rejected
    assert reason in result.reason


def test_the_fuzz_seeds_hold_the_invariants() -> None:
    assert len(SEEDS) >= 4
    for seed in SEEDS:
        assert check(seed.read_bytes()) == set()
