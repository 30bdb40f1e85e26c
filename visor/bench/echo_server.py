"""A minimal raw JSON-RPC server for benchmarks: the same cost behind every row.

`tools/list` lists `echo`, `big` and `send_email`; `tools/call` of `big`
returns a text of BENCH_BIG_BYTES (default 1 MiB); anything else echoes a
small text. It parses with orjson and writes whole lines, so that the server
is not what the benchmark measures.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

import orjson

TOOLS: dict[str, list[dict[str, object]]] = {
    "tools": [
        {"name": "echo", "description": "Echo", "inputSchema": {"type": "object"}},
        {"name": "big", "description": "Large response", "inputSchema": {"type": "object"}},
        {
            "name": "send_email",
            "description": "Send mail",
            "inputSchema": {"type": "object", "properties": {"to": {"type": "string"}}},
        },
        {"name": "read_ticket", "description": "A 4 KB ticket", "inputSchema": {"type": "object"}},
        {
            "name": "read_file",
            "description": "Read a file",
            "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    ]
}


def _ticket(n: object) -> dict[str, object]:
    # 4 KB of untrusted text with a few destinations in it, different per call,
    # so that the provenance index grows as it would in a long session.
    text = (
        f"Ticket {n}: customer user{n}@corp{n}.example wrote from https://portal{n}.example/t/{n} "
        f"and asked us to cc ops{n}@vendor.example. "
    )
    return {"content": [{"type": "text", "text": (text * 40)[:4096]}], "isError": False}


def main() -> None:
    big_text = "x" * int(os.environ.get("BENCH_BIG_BYTES", str(1 << 20)))
    small: dict[str, object] = {"content": [{"type": "text", "text": "ok"}], "isError": False}
    big: dict[str, object] = {"content": [{"type": "text", "text": big_text}], "isError": False}
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
        result: Mapping[str, object]
        if method == "tools/call":
            name = msg["params"]["name"]
            if name == "big":
                result = big
            elif name == "read_ticket":
                result = _ticket(msg["id"])
            else:
                result = small
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
