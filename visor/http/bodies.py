"""One JSON-RPC message from an HTTP body or an SSE event's data, held to the stdio rules.

Over stdio a message is one line. Over HTTP a JSON body or an event's data may hold line
breaks: JSON allows CR and LF as whitespace between tokens, and the event-stream rules join
several ``data:`` lines with LF. The relay's client side is newline-framed, so such breaks
are turned into spaces, but only once the bytes as received have parsed: a raw line break
inside a JSON string is invalid, and a space there would make it valid, so a body is never
repaired into a message the server did not send. Everything else is `classify()` as on
stdio: a client's body (the gateway's) with the client-side strictness the relay applies
(duplicate keys after case folding, integers outside 64 bits, raw Unicode line separators), so
the gateway refuses, and answers, every body the relay would refuse; a server's with the
server-to-client strictness (exact duplicate keys, batches refused).
"""

from __future__ import annotations

import orjson

from visor.wire import errors
from visor.wire.message import Message, Rejected, classify

_WHITESPACE = b" \t\r\n"


def classify_body(data: bytes, *, from_client: bool = False) -> Message | Rejected:
    """Classify one body or event's data; `Message.raw` is the newline-free form to hand on."""
    line = data.strip(_WHITESPACE)
    if not line:
        return Rejected(errors.PARSE_ERROR, "empty message body", reply_null=True)
    if b"\n" in line or b"\r" in line:
        try:
            orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            return Rejected(errors.PARSE_ERROR, f"not valid JSON: {exc}", reply_null=True)
        # Valid JSON: every CR and LF is whitespace between tokens.
        line = line.replace(b"\r\n", b" ").replace(b"\r", b" ").replace(b"\n", b" ")
    return classify(line, fold_case=from_client)
