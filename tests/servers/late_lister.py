"""A raw stdio MCP server for the listing Visor fetches itself before a call.

Records every line it receives (LISTER_LOG). LISTER_MODE decides how it
answers tools/list: ``ok`` (one page), ``paged`` (two pages, the second
behind a nextCursor), ``silent`` (never), ``error`` (a JSON-RPC error).
A tools/call of a listed tool answers with its name and arguments.
"""

import json
import os

from stdio_loop import open_log, reply, requests

MODE = os.environ.get("LISTER_MODE", "ok")
log = open_log("LISTER_LOG")

PAGE_1 = [{"name": "echo", "description": "Echo the arguments", "inputSchema": {"type": "object"}}]
PAGE_2 = [{"name": "second_page", "description": "Listed on page 2", "inputSchema": {"type": "object"}}]


for msg in requests(log):
    mid, method, params = msg.id, msg.method, msg.params
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
