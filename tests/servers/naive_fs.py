"""A naive filesystem MCP server: it opens the raw path it is given with open().

No normalisation, no root, no symlink check: the kernel resolves the path
(symlinks followed before ".."; "\\" an ordinary name character; a relative
path against this process's working directory). This is the reading Visor
must judge for a server written the obvious way. Every tools/call it
receives is appended to NAIVE_LOG (when set), so a test can tell whether a
call reached it at all.

Tools: write_file {path, content}, read_file {path}.
"""

import json
import os

from stdio_loop import reply, requests

log_path = os.environ.get("NAIVE_LOG")

TOOLS = [
    {
        "name": "write_file",
        "description": "Write a file",
        "inputSchema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
    {
        "name": "read_file",
        "description": "Read a file",
        "inputSchema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
]


def text(mid: object, body: str, error: bool = False) -> None:
    reply(
        {
            "jsonrpc": "2.0",
            "id": mid,
            "result": {"content": [{"type": "text", "text": body}], "isError": error},
        }
    )


for msg in requests():
    mid, method, params = msg.id, msg.method, msg.params
    if method == "initialize":
        reply(
            {
                "jsonrpc": "2.0",
                "id": mid,
                "result": {
                    "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "naive-fs", "version": "1"},
                },
            }
        )
    elif method == "tools/list":
        reply({"jsonrpc": "2.0", "id": mid, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        if log_path:
            with open(log_path, "a") as fh:
                fh.write(json.dumps(params) + "\n")
        args = params.get("arguments") or {}
        try:
            if params.get("name") == "write_file":
                with open(args["path"], "w") as fh:
                    fh.write(args["content"])
                text(mid, f"wrote {os.path.realpath(args['path'])}")
            else:
                with open(args["path"]) as fh:
                    text(mid, fh.read())
        except OSError as e:
            text(mid, f"error: {e}", error=True)
    elif method == "ping":
        reply({"jsonrpc": "2.0", "id": mid, "result": {}})
    else:
        reply({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "method not found"}})
