"""Approval through MCP elicitation: the request Visor sends and how it reads the reply. Pure.

Visor asks the client (not the server) with its own `elicitation/create`
request. The reply is read strictly: only `accept` with `decision: approve`
approves. `decline` and `cancel` are a human's no. An error response or a
malformed result is a failed channel (it never approves).
"""

from __future__ import annotations

from typing import Any

from visor.approval.model import ApprovalAnswer, ApprovalRequest, describe, parse_choice


def client_supports_form(capabilities: dict[str, Any] | None) -> bool:
    """True if the client declared form-mode elicitation.

    An empty `elicitation` object means form mode (2025-06-18); from
    2025-11-25 a client may list `form` and/or `url`, and one that lists only
    `url` cannot show a form.
    """
    if type(capabilities) is not dict:
        return False
    el = capabilities.get("elicitation")
    if type(el) is not dict:
        return False
    return "form" in el or "url" not in el


def request_params(req: ApprovalRequest) -> dict[str, Any]:
    """`elicitation/create` params: a flat object of primitive properties, as the spec requires."""
    properties: dict[str, Any] = {
        "decision": {
            "type": "string",
            "title": "Decision",
            "description": "approve runs this one call; deny refuses it",
            "enum": ["approve", "deny"],
        }
    }
    if req.scope is not None:
        scope = (
            f"tool {req.tool!r}, argument {req.argument!r}, destination {req.destination}"
            if req.scope == "destination"
            else f"tool {req.tool!r} with exactly these arguments"
        )
        properties["remember"] = {
            "type": "boolean",
            "title": "Remember for this session",
            "description": f"approve later calls of {scope} without asking, until this session ends",
            "default": False,
        }
    return {
        "mode": "form",
        "message": describe(req),
        "requestedSchema": {"type": "object", "properties": properties, "required": ["decision"]},
    }


def parse_response(response: dict[str, Any], req: ApprovalRequest, who: str | None) -> ApprovalAnswer | None:
    """An answer from the client's JSON-RPC response; None if the channel failed."""
    result = response.get("result")
    if type(result) is not dict:
        return None  # an error response, or no result at all
    action = result.get("action")
    if action in ("decline", "cancel"):
        return ApprovalAnswer(False, False, "elicitation", who, action)
    if action != "accept":
        return None
    choice = parse_choice(result.get("content"), req.scope is not None)
    if choice is None:
        return None
    approved, remember = choice
    return ApprovalAnswer(approved, remember, "elicitation", who, "accept")
