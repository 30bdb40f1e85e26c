"""A raw stdio MCP server for the listing Visor fetches itself before a call.

Records every line it receives (LISTER_LOG). LISTER_MODE decides how it
answers tools/list: ``ok`` (one page), ``paged`` (two pages, the second
behind a nextCursor), ``silent`` (never), ``error`` (a JSON-RPC error).
A tools/call of a listed tool answers with its name and arguments.
"""

import json
import os
import sys

MODE = os.environ.get("LISTER_MODE", "ok")
log_path = os.environ.get("LISTER_LOG")
log = open(log_path, "ab", buffering=0) if log_path else None  # noqa: SIM115
out = sys.stdout.buffer

PAGE_1 = [{"name": "echo", "description": "Echo the arguments", "inputSchema": {"type": "object"}}]
PAGE_2 = [{"name": "second_page", "description": "Listed on page 2", "inputSchema": {"type": "object"}}]


def reply(obj: dict) -> None:
    out.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
    out.flush()


for raw in sys.stdin.buffer:
    if log:
        log.write(raw)
    try:
        msg = json.loads(raw)
    except ValueError:
        continue
    if not isinstance(msg, dict) or "id" not in msg or "method" not in msg:
        continue
    mid, method, params = msg["id"], msg["method"], msg.get("params") or {}
    if method == "initialize":
        result = {
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "late-lister", "version": "1"},
        }
        reply({"jsonrpc": "2.0", "id": mid, "result": result})
    elif method == "tools/list":
        if MODE == "silent":
            continue
        if MODE == "error":
            reply({"jsonrpc": "2.0", "id": mid, "error": {"code": -32603, "message": "listing is broken"}})
            continue
        if MODE == "paged" and params.get("cursor") != "page-2":
            reply({"jsonrpc": "2.0", "id": mid, "result": {"tools": PAGE_1, "nextCursor": "page-2"}})
        elif MODE == "paged":
            reply({"jsonrpc": "2.0", "id": mid, "result": {"tools": PAGE_2}})
        else:
            reply({"jsonrpc": "2.0", "id": mid, "result": {"tools": PAGE_1 + PAGE_2}})
    elif method == "tools/call":
        text = json.dumps({"tool": params.get("name"), "arguments": params.get("arguments")})
        reply({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": text}]}})
    else:
        reply({"jsonrpc": "2.0", "id": mid, "result": {}})
