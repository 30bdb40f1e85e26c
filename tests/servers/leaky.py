"""A raw-pipe server that leaks secrets in every place MCP carries data, for redaction tests.

Records every received line to LEAKY_LOG (like the recorder), so tests can
assert what reached the server. Answers with fixed results that hold secrets
next to fields that must survive a rewrite untouched (`_meta`, unknown
members, annotations, `isError`).
"""

import json
import os
import sys

GITHUB = "ghp_" + "A1b2C3d4" * 5  # 40 chars after the prefix
AWS_ID = "AKIAIOSFODNN7EXAMPLE"
PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7\nabcdef\n-----END RSA PRIVATE KEY-----"
ANTHROPIC = "sk-ant-api03-" + "z" * 30

STRUCT_SCHEMA = {
    "type": "object",
    "properties": {
        "token": {"type": "string"},
        "nested": {"type": "object", "properties": {"list": {"type": "array", "items": {"type": "string"}}}},
        "n": {"type": "integer"},
    },
    "required": ["token", "nested", "n"],
}
TOOLS = [
    {"name": "echo", "description": "Echo the arguments", "inputSchema": {"type": "object"}},
    {
        "name": "leak",
        "description": "Leaks",
        "inputSchema": {"type": "object"},
        "outputSchema": STRUCT_SCHEMA,
    },
    {
        "name": "strict",
        "description": "Leaks into a constrained string",
        "inputSchema": {"type": "object"},
        "outputSchema": {
            "type": "object",
            "properties": {"token": {"type": "string", "pattern": "^ghp_[A-Za-z0-9]+$"}},
        },
    },
    {"name": "utf8", "description": "Multi-byte text", "inputSchema": {"type": "object"}},
    {"name": "forbidden", "description": "Never allowed", "inputSchema": {"type": "object"}},
    {"name": "sample", "description": "Asks the client's model", "inputSchema": {"type": "object"}},
]


def reply(obj: dict) -> None:
    sys.stdout.buffer.write(json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n")
    sys.stdout.buffer.flush()


def main() -> None:
    log_path = os.environ.get("LEAKY_LOG")
    log = open(log_path, "ab", buffering=0) if log_path else None  # noqa: SIM115
    for raw in sys.stdin.buffer:
        if log:
            log.write(raw)
        msg = json.loads(raw)
        if "method" not in msg or "id" not in msg:
            continue
        mid, method, params = msg["id"], msg["method"], msg.get("params") or {}
        if method == "tools/list":
            reply({"jsonrpc": "2.0", "id": mid, "result": {"tools": TOOLS}})
        elif method == "tools/call":
            name = params.get("name")
            meta = {
                "progressToken": (params.get("_meta") or {}).get("progressToken"),
                "example.org/n": 2**60 + 1,
            }
            if name == "leak":
                result = {
                    "content": [
                        {"type": "text", "text": f"key {AWS_ID} ok", "annotations": {"audience": ["user"]}},
                        {
                            "type": "resource",
                            "resource": {"uri": "memo://k", "mimeType": "text/plain", "text": PEM},
                        },
                    ],
                    "structuredContent": {
                        "token": GITHUB,
                        "nested": {"list": ["ok", "postgres://app:hunter2@db/x"]},
                        "n": 5,
                    },
                    "isError": False,
                    "_meta": meta,
                    "futureField": {"kept": [1, 2.5, None]},
                }
            elif name == "strict":
                result = {"content": [{"type": "text", "text": "{}"}], "structuredContent": {"token": GITHUB}}
            elif name == "utf8":
                result = {
                    "content": [{"type": "text", "text": "€" * int(params["arguments"]["n"])}],
                    "_meta": meta,
                }
            elif name == "sample":
                reply({"jsonrpc": "2.0", "id": "s-1", "method": "sampling/createMessage",
                       "params": {"messages": [], "maxTokens": 5}})  # fmt: skip
                answer = sys.stdin.buffer.readline()
                if log:
                    log.write(answer)
                result = {"content": [{"type": "text", "text": answer.decode().strip()}]}
            else:
                result = {
                    "content": [{"type": "text", "text": json.dumps(params.get("arguments"))}],
                    "_meta": meta,
                }
            reply({"jsonrpc": "2.0", "id": mid, "result": result})
        elif method == "resources/read":
            text = f"DB=postgres://app:s3cret@db/x\nTOKEN={GITHUB}\n"
            reply(
                {
                    "jsonrpc": "2.0",
                    "id": mid,
                    "result": {"contents": [{"uri": params["uri"], "text": text}], "_meta": {"k": 1}},
                }
            )
        elif method == "prompts/get":
            reply({"jsonrpc": "2.0", "id": mid, "result": {"description": "p", "messages": [
                {"role": "user", "content": {"type": "text", "text": f"use {ANTHROPIC} " + json.dumps(params.get("arguments"))}}
            ]}})  # fmt: skip
        else:
            reply({"jsonrpc": "2.0", "id": mid, "result": {}})


if __name__ == "__main__":
    main()
