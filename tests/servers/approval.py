"""A raw-pipe server for approval tests: records what it receives, never echoes arguments.

The shared recorder echoes a call's arguments, so a recipient it was sent to
shows up in tool output, and provenance then (rightly) refuses that
recipient for the rest of the session. These tests need results that name
no destination. Env: APPROVAL_SERVER_LOG (received lines), APPROVAL_SERVER_AUDIT
(the audit log, read when a call arrives), tool `collide` sends a request
whose id uses Visor's reserved prefix.
"""

import json
import os

from stdio_loop import open_log, read_line, reply, requests

log = open_log("APPROVAL_SERVER_LOG")
TOOLS = [
    {"name": n, "description": n, "inputSchema": {"type": "object"}}
    for n in ("echo", "send_email", "collide")
]


for msg in requests(log):
    mid, method, params = msg.id, msg.method, msg.params
    modern = bool((params.get("_meta") or {}).get("io.modelcontextprotocol/protocolVersion"))
    if method == "initialize":
        result = {
            "protocolVersion": params.get("protocolVersion", "2025-11-25"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "approval-server", "version": "1"},
        }
        reply({"jsonrpc": "2.0", "id": mid, "result": result})
    elif method == "server/discover":
        meta = {"io.modelcontextprotocol/serverInfo": {"name": "approval-server", "version": "1"}}
        result = {
            "supportedVersions": ["2026-07-28"],
            "capabilities": {"tools": {}},
            "_meta": meta,
            "resultType": "complete",
        }
        reply({"jsonrpc": "2.0", "id": mid, "result": result})
    elif method == "tools/list":
        listing: dict = {"tools": TOOLS}
        if modern:
            listing.update(resultType="complete", ttlMs=0, cacheScope="private")
        reply({"jsonrpc": "2.0", "id": mid, "result": listing})
    elif method == "tools/call":
        if params.get("name") == "collide":
            reply({"jsonrpc": "2.0", "id": "visor-0", "method": "ping"})
            answer = read_line()
            if log:
                log.write(answer)
        seen = False
        audit = os.environ.get("APPROVAL_SERVER_AUDIT")
        if audit:
            with open(audit, "rb") as fh:
                recs = [json.loads(x) for x in fh.read().splitlines() if x.strip()]
            seen = any(r.get("event") == "allow" and r.get("id") == mid for r in recs)
        result = {
            "content": [{"type": "text", "text": f"done {params.get('name')}"}],
            "structuredContent": {"audit_allow_present": seen},
            "isError": False,
        }
        if modern:
            result["resultType"] = "complete"
        reply({"jsonrpc": "2.0", "id": mid, "result": result})
    else:
        reply({"jsonrpc": "2.0", "id": mid, "result": {"resultType": "complete"} if modern else {}})
