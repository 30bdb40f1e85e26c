"""Approval through MCP elicitation: the request Visor sends and how it reads the reply. Pure.

Visor asks the client (not the server) with its own `elicitation/create`
request. The reply is read strictly: only `accept` with `decision: approve`
approves. `decline` and `cancel` are a human's no. An error response or a
malformed result is a failed channel (it never approves).
"""

from __future__ import annotations

from typing import Any

from visor import display
from visor.approval.model import ApprovalAnswer, ApprovalRequest, describe, parse_choice

#: Where the whole request can be read when the dialog cuts arguments short.
MORE_HINT = (
    "the ask record in Visor's audit log (visor audit show --verdict ask --json), "
    "or visor approve --show {id} when Visor also has --approval-dir"
)


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
        tool = display.json_text(req.tool)
        scope = (
            f"tool {tool}, argument {display.json_text(req.argument)}, "
            f"destination {display.escape_value(req.destination)}"
            if req.scope == "destination"
            else f"tool {tool} with exactly these arguments"
        )
        properties["remember"] = {
            "type": "boolean",
            "title": "Remember for this session",
            "description": f"approve later calls of {scope} without asking, until this session ends",
            "default": False,
        }
    return {
        "mode": "form",
        "message": describe(req, more=MORE_HINT.format(id=req.id)),
        "requestedSchema": {"type": "object", "properties": properties, "required": ["decision"]},
    }


def server_question(server: str, message: str) -> str:
    """A server's elicitation message as the client shows it: marked as the server's.

    Visor's own questions (`request_params`) begin "Visor: allow the tool
    call"; every question a server asks through Visor begins with this mark
    instead, which the server cannot remove, so a person can always tell whom
    a yes answers (a server question that speaks as Visor is refused outright:
    visor/policy/requests.py).
    """
    return (
        f"[Question from the MCP server {display.json_text(server)}, not from Visor: "
        f"your answer goes to that server and approves nothing in Visor.]\n{message}"
    )


def answered_by(client_name: str | None) -> str:
    """Who answered, as far as Visor can know: only what the client says about itself."""
    return f"client-reported:{client_name if client_name else 'unknown'}"


def parse_response(
    response: dict[str, Any], req: ApprovalRequest, client_name: str | None
) -> ApprovalAnswer | None:
    """An answer from the client's JSON-RPC response; None if the channel failed.

    The client's code decides what it returns (a human's click, or an
    automatic accept): the answer is marked client-reported, never a person.
    """
    who = answered_by(client_name)
    result = response.get("result")
    if type(result) is not dict:
        return None  # an error response, or no result at all
    action = result.get("action")
    if action in ("decline", "cancel"):
        return ApprovalAnswer(False, False, "elicitation", who, action, client_reported=True)
    if action != "accept":
        return None
    choice = parse_choice(result.get("content"), req.scope is not None)
    if choice is None:
        return None
    approved, remember = choice
    return ApprovalAnswer(approved, remember, "elicitation", who, "accept", client_reported=True)
