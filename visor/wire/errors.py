"""JSON-RPC error responses and the answers Visor writes itself."""

from __future__ import annotations

from typing import Any

import orjson

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

# Protocol revisions that use the per-request envelope and require every
# result to say what kind of result it is.
MODERN_PROTOCOL_VERSIONS = frozenset(("2026-07-28",))


def error_response(msg_id: Any, code: int, message: str, data: Any = None) -> bytes:
    """One compact line (no newline) answering `msg_id` with an error."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return orjson.dumps({"jsonrpc": "2.0", "id": msg_id, "error": error})


def tool_error_result(msg_id: Any, text: str, *, modern: bool) -> bytes:
    """A tools/call result the model reads: the call did not run, and why."""
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": True}
    if modern:
        result["resultType"] = "complete"
    return orjson.dumps({"jsonrpc": "2.0", "id": msg_id, "result": result})
