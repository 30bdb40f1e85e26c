"""A server for security tests: `tools/call` of `emit` writes `arguments.lines` raw to stdout first.

Every other request is answered with an empty-ish result, so a test can put any
bytes on the server's stdout at a moment it chooses and then check that the
session still works.
"""

import json
import sys

out = sys.stdout.buffer
TOOLS = [{"name": "emit", "description": "Write raw lines", "inputSchema": {"type": "object"}}]


def reply(obj: dict) -> None:
    out.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
    out.flush()


for raw in sys.stdin.buffer:
    try:
        msg = json.loads(raw)
    except ValueError:
        continue
    if not isinstance(msg, dict) or "id" not in msg or "method" not in msg:
        continue
    mid = msg["id"]
    if msg["method"] == "tools/list":
        reply({"jsonrpc": "2.0", "id": mid, "result": {"tools": TOOLS}})
    elif msg["method"] == "tools/call":
        for line in msg.get("params", {}).get("arguments", {}).get("lines", []):
            out.write(line.encode() + b"\n")
        reply({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": "done"}]}})
    else:
        reply({"jsonrpc": "2.0", "id": mid, "result": {}})
