"""The approval request/answer model: pure, no I/O.

One `ApprovalRequest` is made for one ask about one call. Its `id` is random
and unguessable (128 bits from `secrets`), and its `call_hash` binds it to the
exact call: server, tool, canonical arguments, the client's request id and the
audit session. Every channel answers a request by id, and an answer counts
only if it carries that request's hash, so an answer can never be moved from
one call to another. The channels (elicitation, directory, tty) turn their
replies into an `ApprovalAnswer` through the parsers here.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from dataclasses import dataclass
from typing import Any, Literal

import orjson

#: Prefix of every JSON-RPC id Visor itself uses towards the client. The relay
#: refuses server requests whose id starts with it, so the two cannot collide.
VISOR_ID_PREFIX = "visor-"

_ID_RE = re.compile(r"[0-9a-f]{32}\Z")
_HASH_RE = re.compile(r"[0-9a-f]{64}\Z")

#: Rules whose ask has no destination but can be remembered exactly (same tool,
#: same canonical arguments): nothing else about the session changes their answer.
_EXACT_RULE_SUFFIXES = (".approval_required", ".require_approval_always")

Scope = Literal["destination", "exact"]


def new_approval_id() -> str:
    """128 random bits, hex: unguessable, so no answer can exist for it in advance."""
    return secrets.token_hex(16)


def valid_id(text: str) -> bool:
    return bool(_ID_RE.match(text))


def new_rpc_id() -> str:
    """An id for a request Visor sends to the client (elicitation)."""
    return VISOR_ID_PREFIX + secrets.token_hex(16)


def is_visor_rpc_id(value: Any) -> bool:
    return type(value) is str and value.startswith(VISOR_ID_PREFIX)


def canonical_json(value: Any) -> bytes:
    """Sorted keys, compact, UTF-8: the same call always gives the same bytes."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        # integers beyond 64 bits: orjson refuses them, json does not
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def call_hash(server: str, tool: str, arguments: dict[str, Any], request_id: Any, session: str) -> str:
    body = canonical_json(
        {"server": server, "tool": tool, "arguments": arguments, "request_id": request_id, "session": session}
    )
    return hashlib.sha256(b"visor-approval-v1\n" + body).hexdigest()


def arguments_digest(tool: str, arguments: dict[str, Any]) -> str:
    """The exact scope of a remembered approval that has no destination."""
    return hashlib.sha256(tool.encode() + b"\n" + canonical_json(arguments)).hexdigest()


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    id: str
    call_hash: str
    server: str
    tool: str
    arguments: dict[str, Any]
    request_id: Any
    session: str
    rule: str
    reason: str
    destination: str | None
    argument: str | None
    created: float  # unix time
    timeout: float  # seconds

    @property
    def expires(self) -> float:
        return self.created + self.timeout

    @property
    def scope(self) -> Scope | None:
        return remember_scope(self.rule, self.argument, self.destination)


def make_request(
    *,
    server: str,
    tool: str,
    arguments: dict[str, Any],
    request_id: Any,
    session: str,
    rule: str,
    reason: str,
    destination: str | None,
    argument: str | None,
    now: float,
    timeout: float,
    approval_id: str | None = None,
) -> ApprovalRequest:
    return ApprovalRequest(
        id=approval_id or new_approval_id(),
        call_hash=call_hash(server, tool, arguments, request_id, session),
        server=server,
        tool=tool,
        arguments=arguments,
        request_id=request_id,
        session=session,
        rule=rule,
        reason=reason,
        destination=destination,
        argument=argument,
        created=now,
        timeout=timeout,
    )


def remember_scope(rule: str, argument: str | None, destination: str | None) -> Scope | None:
    """What a "remember for this session" answer may cover, or None (this call only).

    A destination ask is remembered as (tool, argument, destination) and no
    wider. An explicit approval_required ask is remembered only for the exact
    same arguments. Taint, chain, time and pin asks depend on the session's
    history, so one answer covers one call.
    """
    if destination is not None and argument is not None:
        return "destination"
    if destination is None and rule.endswith(_EXACT_RULE_SUFFIXES):
        return "exact"
    return None


@dataclass(frozen=True, slots=True)
class ApprovalAnswer:
    approved: bool
    remember: bool
    channel: str  # "elicitation", "directory", "tty", "session"
    who: str | None = None
    detail: str | None = None


def describe(req: ApprovalRequest, *, max_args: int = 600) -> str:
    """What is asked and why, for a human: tool, the destination or argument, the rule."""
    lines = [
        f"Visor: allow the tool call {req.tool!r}" + (f" on server {req.server!r}?" if req.server else "?")
    ]
    if req.destination is not None:
        kind, _, value = req.destination.partition(":")
        lines.append(f"Destination: {value or req.destination} ({kind}) in argument {req.argument!r}.")
        lines.append(
            "Where it came from: the agent's request. It is not a trusted destination, was not approved "
            "before, and has not appeared in this session's tool output (Visor denies those outright)."
        )
    elif req.argument is not None:
        lines.append(f"Argument in question: {req.argument!r}.")
    lines.append(f"Why: {req.reason} (rule: {req.rule}).")
    args = canonical_json(req.arguments).decode(errors="replace")
    if len(args) > max_args:
        args = args[:max_args] + f"... ({len(args)} characters)"
    lines.append(f"Arguments: {args}")
    lines.append(f"Approval id: {req.id}")
    return "\n".join(lines)


# ------------------------------------------------------------------ answers by channel


def parse_choice(content: Any, rememberable: bool) -> tuple[bool, bool] | None:
    """(approved, remember) from an elicitation's `content`; None when malformed."""
    if type(content) is not dict:
        return None
    decision = content.get("decision")
    if decision not in ("approve", "deny"):
        return None
    remember = content.get("remember", False)
    if type(remember) is not bool:
        return None
    approved = decision == "approve"
    return approved, approved and remember and rememberable


def parse_tty_line(line: str, rememberable: bool) -> tuple[bool, bool]:
    """A typed answer: only an explicit yes approves; anything else, empty included, denies."""
    word = line.strip().lower()
    if word in ("y", "yes"):
        return True, False
    if word in ("r", "remember") and rememberable:
        return True, True
    return False, False


def pending_record(req: ApprovalRequest, pid: int) -> bytes:
    """The pending file: everything a human needs to decide, and the hash an answer must carry."""
    return canonical_json(
        {
            "format": "visor-approval-request-1",
            "id": req.id,
            "call_hash": req.call_hash,
            "server": req.server,
            "tool": req.tool,
            "arguments": req.arguments,
            "request_id": req.request_id,
            "session": req.session,
            "rule": req.rule,
            "reason": req.reason,
            "destination": req.destination,
            "argument": req.argument,
            "created": req.created,
            "expires": req.expires,
            "rememberable": req.scope is not None,
            "pid": pid,
        }
    )


def parse_pending(data: bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    if (
        type(obj) is not dict
        or obj.get("format") != "visor-approval-request-1"
        or type(obj.get("id")) is not str
        or not valid_id(obj["id"])
        or type(obj.get("call_hash")) is not str
        or not _HASH_RE.match(obj["call_hash"])
    ):
        return None
    return obj


def answer_record(approval_id: str, hash_: str, approved: bool, remember: bool) -> bytes:
    return canonical_json(
        {
            "format": "visor-approval-answer-1",
            "id": approval_id,
            "call_hash": hash_,
            "decision": "approve" if approved else "deny",
            "remember": bool(remember and approved),
        }
    )


def parse_answer(data: bytes, req: ApprovalRequest) -> tuple[bool, bool] | None:
    """(approved, remember) if `data` answers exactly `req`; None for anything else."""
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    if type(obj) is not dict or obj.get("format") != "visor-approval-answer-1":
        return None
    if obj.get("id") != req.id or obj.get("call_hash") != req.call_hash:
        return None
    decision = obj.get("decision")
    remember = obj.get("remember", False)
    if decision not in ("approve", "deny") or type(remember) is not bool:
        return None
    approved = decision == "approve"
    return approved, approved and remember and req.scope is not None
