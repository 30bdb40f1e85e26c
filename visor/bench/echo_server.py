"""A minimal raw JSON-RPC server for benchmarks: the same cost behind every row.

`tools/list` lists `echo`, `big` and `send_email`; `tools/call` of `big`
returns a text of BENCH_BIG_BYTES (default 1 MiB); anything else echoes a
small text. It parses with orjson and writes whole lines, so that the server
is not what the benchmark measures.
"""

from __future__ import annotations

import os
import sys

import orjson

TOOLS = {
    "tools": [
        {"name": "echo", "description": "Echo", "inputSchema": {"type": "object"}},
        {"name": "big", "description": "Large response", "inputSchema": {"type": "object"}},
        {
            "name": "send_email",
            "description": "Send mail",
            "inputSchema": {"type": "object", "properties": {"to": {"type": "string"}}},
        },
        {
            "name": "read_file",
            "description": "Read a file",
            "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    ]
}


def main() -> None:
    big_text = "x" * int(os.environ.get("BENCH_BIG_BYTES", str(1 << 20)))
    small = {"content": [{"type": "text", "text": "ok"}], "isError": False}
    big = {"content": [{"type": "text", "text": big_text}], "isError": False}
    out = sys.stdout.buffer
    inp = sys.stdin.buffer
    while True:
        line = inp.readline()
        if not line:
            return
        msg = orjson.loads(line)
        if "id" not in msg or "method" not in msg:
            continue
        method = msg["method"]
        if method == "tools/call":
            result = big if msg["params"]["name"] == "big" else small
        elif method == "tools/list":
            result = TOOLS
        elif method == "initialize":
            result = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "bench"},
            }
        else:
            result = {}
        out.write(
            orjson.dumps(
                {"jsonrpc": "2.0", "id": msg["id"], "result": result}, option=orjson.OPT_APPEND_NEWLINE
            )
        )
        out.flush()


if __name__ == "__main__":
    main()
