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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from visor import display

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
    # argument names shown first to a human (focus_arguments); not part of the hash
    focus: tuple[str, ...] = ()

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
    focus: tuple[str, ...] | None = None,
    shown_arguments: dict[str, Any] | None = None,
) -> ApprovalRequest:
    """`shown_arguments`: what the human (and the pending file) sees, secrets redacted; the
    hash an answer must carry is always of the real `arguments`."""
    return ApprovalRequest(
        id=approval_id or new_approval_id(),
        call_hash=call_hash(server, tool, arguments, request_id, session),
        server=server,
        tool=tool,
        arguments=arguments if shown_arguments is None else shown_arguments,
        request_id=request_id,
        session=session,
        rule=rule,
        reason=reason,
        destination=destination,
        argument=argument,
        created=now,
        timeout=timeout,
        focus=focus if focus is not None else focus_arguments(arguments, argument),
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
    # True when the answer is only what the MCP client says (elicitation):
    # its code may accept without any person seeing the question.
    client_reported: bool = False


#: Characters shown of one argument the deciding rule read (the command, the
#: path, the recipient): in full up to this, then visibly cut.
FOCUS_LIMIT = 8000
#: Characters shown of any other one argument, and of all of them together.
OTHER_EACH_LIMIT = 300
OTHER_TOTAL_LIMIT = 1500
#: Characters shown of an argument's name.
NAME_LIMIT = 120

SHOW_HINT = "visor approve --show {id}"


def focus_arguments(
    arguments: dict[str, Any], argument: str | None, extra: tuple[str, ...] | list[str] = ()
) -> tuple[str, ...]:
    """The argument names a human must see first, in order.

    First the argument the deciding rule read (``Decision.argument``, or the
    top-level argument it sits in), then the tool's declared write and sink
    parameters (``extra``), then every argument a path, command, query,
    recipient, repository or destination check reads by its name. A padding
    argument that sorts first (``a...``) cannot push any of them out of view.
    """
    from visor.policy import destinations, paths, rules

    checked = rules.COMMAND_ARGS | rules.QUERY_ARGS | rules.RECIPIENT_ARGS | rules.REPO_ARGS
    order: dict[str, None] = {}

    def add(name: str) -> None:
        if name in arguments:
            order.setdefault(name, None)

    if argument:
        add(argument)
        add(re.split(r"[.\[/]", argument, maxsplit=1)[0])
    for name in extra:
        add(name)
    for name in sorted(arguments):
        try:
            if (
                name in checked
                or paths.snake(name) in checked
                or paths.is_path_name(name)
                or destinations.is_destination_name(name)
            ):
                add(name)
        except Exception:  # a name no check can read still has to be shown
            continue
    return tuple(order)


def render_arguments(
    arguments: Any,
    focus: tuple[str, ...] | list[str] = (),
    *,
    full: bool = False,
    focus_limit: int = FOCUS_LIMIT,
    each_limit: int = OTHER_EACH_LIMIT,
    total_limit: int = OTHER_TOTAL_LIMIT,
) -> tuple[list[str], int]:
    """One line per argument, the focus first, every value escaped; and how many characters are hidden.

    Nothing is cut silently: a shortened value ends with a mark that says how
    many of its characters are hidden, and arguments past the total are
    listed by name and size. With ``full`` every argument is shown whole.
    """
    if type(arguments) is not dict:
        text = display.json_text(arguments)
        if full or len(text) <= focus_limit:
            return [f"  {text}"], 0
        hidden = len(text) - focus_limit
        return [f"  {text[:focus_limit]}\u2026 [{hidden} of {len(text)} characters hidden]"], hidden
    first = list(dict.fromkeys(n for n in focus if type(n) is str and n in arguments))
    focused = set(first)
    names = first + sorted(n for n in arguments if n not in focused)
    lines: list[str] = []
    hidden_total = 0
    budget = total_limit
    for name in names:
        key = display.json_text(name)
        if not full and len(key) > NAME_LIMIT:
            hidden_total += len(key) - NAME_LIMIT
            key = f"{key[:NAME_LIMIT]}\u2026 [name: {len(key) - NAME_LIMIT} more characters hidden]"
        value = display.json_text(arguments[name])
        mark = " (checked by the policy)" if name in focused else ""
        if full:
            lines.append(f"  {key}{mark}: {value}")
            continue
        limit = focus_limit if name in focused else min(each_limit, budget)
        if len(value) <= limit:
            lines.append(f"  {key}{mark}: {value}")
        elif limit <= 0:
            lines.append(f"  {key}: [all {len(value)} characters hidden]")
        else:
            lines.append(
                f"  {key}{mark}: {value[:limit]}\u2026 [{len(value) - limit} of {len(value)} characters hidden]"
            )
        shown = min(len(value), max(limit, 0))
        hidden_total += len(value) - shown
        if name not in focused:
            budget -= shown
    return lines, hidden_total


def _provenance_line(rule: str) -> str:
    """Where the destination came from, as the deciding rule knows it: never a
    claim the rule did not check (the reason names the tool and field)."""
    if rule == "provenance.untrusted_output_ask":
        return (
            "Where it came from: this session's tool output showed it (see Why). An address that "
            "output shows may have been planted there: approve only if you know this recipient."
        )
    if rule == "provenance.third_party_output":
        return (
            "Where it came from: a field of the tool output that whoever wrote the record fills in "
            "(such as a mail's sender). Approve only if you know this recipient."
        )
    if rule == "provenance.index_full":
        return (
            "Where it came from: it is trusted by domain or prefix, but Visor's record of this "
            "session's output is full and cannot tell whether output showed it."
        )
    if rule.startswith("provenance."):
        return (
            "Where it came from: the agent's request. It is not a trusted destination, was not approved "
            "before, and has not appeared in this session's tool output (Visor denies those outright)."
        )
    return "Where it came from: the agent's request."


def describe(
    req: ApprovalRequest,
    *,
    more: str | None = None,
    focus_limit: int = FOCUS_LIMIT,
    each_limit: int = OTHER_EACH_LIMIT,
    total_limit: int = OTHER_TOTAL_LIMIT,
) -> str:
    """What is asked and why, for a human: tool, the destination or argument, the rule, the arguments.

    Every value from the call is escaped (visor/display.py). The arguments the
    deciding rule read come first and whole (up to `focus_limit`); anything
    cut is marked with how much is hidden and `more`, how to see it all.
    """
    esc = display.escape
    tool = display.json_text(req.tool)
    lines = [
        f"Visor: allow the tool call {tool}"
        + (f" on server {display.json_text(req.server)}?" if req.server else "?")
    ]
    argument = display.json_text(req.argument) if req.argument is not None else None
    if req.destination is not None:
        kind, _, value = req.destination.partition(":")
        lines.append(f"Destination: {esc(value or req.destination)} ({esc(kind)}) in argument {argument}.")
        lines.append(_provenance_line(req.rule))
    elif argument is not None:
        lines.append(f"Argument in question: {argument}.")
    lines.append(f"Why: {esc(req.reason)} (rule: {esc(req.rule)}).")
    arg_lines, hidden = render_arguments(
        req.arguments, req.focus, focus_limit=focus_limit, each_limit=each_limit, total_limit=total_limit
    )
    lines.append("Arguments (the ones the policy checks first):" if req.focus else "Arguments:")
    lines.extend(arg_lines or ["  (none)"])
    if hidden:
        how = more or SHOW_HINT.format(id=req.id)
        lines.append(
            f"NOT SHOWN: {hidden} characters of the arguments are hidden above. To see everything: {how}"
        )
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
            "focus": list(req.focus),
            "pid": pid,
        }
    )


def expiry(record: Mapping[str, object]) -> float | None:
    """A pending record's expiry time; None when it has none that is a number."""
    expires = record.get("expires")
    # bool is an int to Python, not a time to us
    return expires if isinstance(expires, int | float) and not isinstance(expires, bool) else None


def parse_pending(data: bytes) -> dict[str, object] | None:
    """A pending file's record; only its format, id and call hash are checked."""
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
    record: dict[str, object] = obj
    return record


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
