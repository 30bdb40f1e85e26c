"""atheris target: what the gateway does to 2026-07-28 requests without a session
(visor/serve/sessionless.py), on arbitrary bytes.

Byte 0 picks the check:
- even: a mirrored header value. Encoding then decoding gives the text back; decoding any value
  never raises, never reads it otherwise than the MCP SDK's reader does (it may refuse more), and a value it accepts in the
  base64 form re-encodes to exactly those bytes.
- odd: a server's line answering a renamed request. Putting the client's id back changes that
  member only: the result, read by the standard library (which keeps every integer exact), is
  the server's message with the client's id, and any other id is left alone.

Run through `make fuzz` (target "sessionless"), or by hand:
    python -m tests.fuzz.fuzz_sessionless WORK_CORPUS tests/fuzz/corpus/sessionless -max_total_time=60
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

import orjson

try:
    import atheris
except ImportError:  # the hypothesis fallback imports check() without it
    atheris = None

if atheris is not None:
    with atheris.instrument_imports(include=["visor"]):
        from visor.http.headers import encode_header_value
        from visor.serve.sessionless import Renamer, decode_header_value
else:
    from visor.http.headers import encode_header_value
    from visor.serve.sessionless import Renamer, decode_header_value

try:  # the MCP SDK's own reader of mirrored values: Visor must read them exactly as it does
    from mcp.shared.inbound import decode_header_value as sdk_decode_header_value
except ImportError:  # pragma: no cover - the SDK is a test dependency
    sdk_decode_header_value = None

CLIENT_IDS: tuple[Any, ...] = (0, 7, -1, "a", "", "visor-c1", 2**63 - 1, "é\u2028")


def check(data: bytes) -> set[str]:
    if not data:
        return set()
    if data[0] % 2 == 0:
        _check_header(data[1:])
    else:
        _check_restore(data[0], data[1:])
    return set()


def _check_header(raw: bytes) -> None:
    text = raw.decode("utf-8", "replace")
    assert decode_header_value(encode_header_value(text)) == text
    value = raw.decode("latin-1")
    decoded = decode_header_value(value)
    if sdk_decode_header_value is not None:
        try:
            theirs = sdk_decode_header_value(value)
        except ValueError:
            # The SDK's reader raises on a non-ASCII payload (its server then fails the request):
            # refused either way, as Visor's None is.
            theirs = None
        # Visor may refuse what the SDK reads (a newline no header can carry makes the SDK's
        # pattern take the value as plain), never read it otherwise.
        assert decoded is None or decoded == theirs, (value, decoded, theirs)
    if decoded is not None and len(value) >= 11 and value.startswith("=?base64?") and value.endswith("?="):
        again = "=?base64?" + base64.b64encode(decoded.encode("utf-8")).decode("ascii") + "?="
        assert again == value, (value, decoded)


def _check_restore(selector: int, raw: bytes) -> None:
    try:
        orjson.loads(raw)
        server = json.loads(raw)
    except (orjson.JSONDecodeError, ValueError, RecursionError):
        return
    if not isinstance(server, dict):
        return
    client_id = CLIENT_IDS[(selector >> 1) % len(CLIENT_IDS)]
    renamed = Renamer().rename({"jsonrpc": "2.0", "id": client_id, "method": "tools/call", "params": {}})
    server.pop("method", None)
    server["id"] = renamed.internal_id
    for line in (
        json.dumps(server, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"),
        json.dumps(server).encode(),
    ):
        try:
            orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # a line the relay's framer (orjson) refuses never reaches the gateway
        back = json.loads(renamed.restore(line))
        want = dict(server, id=client_id)
        assert back == want and type(back["id"]) is type(client_id), (line, back)
    other = dict(server, id="visor-c999")
    line = json.dumps(other, separators=(",", ":")).encode()
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return
    assert renamed.restore(line) == line


def test_one_input(data: bytes) -> None:
    check(data)


def main() -> None:
    assert atheris is not None, "atheris is not installed (pip install -e '.[fuzz]')"
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
