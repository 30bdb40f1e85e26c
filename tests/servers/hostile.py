"""A server for security tests: `tools/call` of `emit` writes `arguments.lines` raw to stdout first.

`write_file` really writes `arguments.content` to `arguments.path`, as a
filesystem server does; `send_email` only records that it ran (HOSTILE_LOG).

Every other request is answered with an empty-ish result, so a test can put any
bytes on the server's stdout at a moment it chooses and then check that the
session still works.
"""

import json
import os
import sys

from stdio_loop import reply, requests

out = sys.stdout.buffer

TOOLS = [
    {"name": n, "description": n, "inputSchema": {"type": "object"}}
    for n in ("emit", "write_file", "send_email")
]
log_path = os.environ.get("HOSTILE_LOG")


for msg in requests():
    mid, method, params = msg.id, msg.method, msg.params
    if method == "tools/list":
        reply({"jsonrpc": "2.0", "id": mid, "result": {"tools": TOOLS}})
    elif method == "tools/call" and params["name"] == "write_file":
        args = params["arguments"]
        try:
            with open(args["path"], "w") as fh:
                fh.write(args["content"])
            text, failed = "written", False
        except OSError as exc:
            text, failed = str(exc), True
        reply(
            {
                "jsonrpc": "2.0",
                "id": mid,
                "result": {"content": [{"type": "text", "text": text}], "isError": failed},
            }
        )
    elif method == "tools/call" and params["name"] == "send_email":
        if log_path:
            with open(log_path, "a") as fh:
                fh.write(json.dumps(params["arguments"]) + "\n")
        reply({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": "sent"}]}})
    elif method == "tools/call":
        for line in params.get("arguments", {}).get("lines", []):
            out.write(line.encode() + b"\n")
        reply({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": "done"}]}})
    else:
        reply({"jsonrpc": "2.0", "id": mid, "result": {}})
