"""The audit events Visor writes, one constructor each.

Every record a session appends is built here, so that the fields of each
event (docs/audit-format.md) are named in one place. The writer adds its own
fields (``v``, ``ts``, ``session``, ``seq``, ``prev``, ``hash``) and sorts
the keys, so the order in which a constructor lists them does not matter.
Optional fields are left out when they are None, as the format says.
"""

from __future__ import annotations

from typing import Any, Protocol

Event = dict[str, Any]

# A reason or a member name quoted in a reject record is cut to this many characters.
_REASON_CHARS = 200


class _Decision(Protocol):
    """What a call record reads from a decision (visor.policy.evaluate.Decision)."""

    @property
    def rule(self) -> str: ...

    @property
    def reason(self) -> str: ...

    @property
    def destination(self) -> str | None: ...

    @property
    def argument(self) -> str | None: ...


def bounded(text: str) -> str:
    """At most _REASON_CHARS characters of ``text``, saying how long it was."""
    if len(text) <= _REASON_CHARS:
        return text
    return f"{text[:_REASON_CHARS]}... ({len(text)} characters)"


def session_start(server: str, argv0: str, policy: str, group: dict[str, object] | None = None) -> Event:
    """``group``: the fields naming the client's group of servers (docs/groups.md), when in one."""
    event: Event = {"event": "session_start", "server": server, "argv0": argv0, "policy": policy}
    if group:
        event.update(group)
    return event


def policy_load(source: str, policy: str) -> Event:
    return {"event": "policy_load", "source": source, "policy": policy}


def policy_reload(
    *,
    source: str,
    previous: str,
    policy: str | None,
    ok: bool,
    error: str | None = None,
    attestation: str | None = None,
) -> Event:
    """A reload attempt (SIGHUP): ``previous`` was in force before it, ``policy`` is the new
    file's SHA-256 (absent when it could not be read); ``ok`` false: ``previous`` stays, ``error``
    says why. ``attestation``: "match", or why calls to an attested server are denied after it."""
    event: Event = {"event": "policy_reload", "source": source, "previous": previous, "ok": ok}
    if policy is not None:
        event["policy"] = policy
    if error is not None:
        event["error"] = error
    if attestation is not None:
        event["attestation"] = attestation
    return event


def session_end(server: str) -> Event:
    return {"event": "session_end", "server": server}


def session_adopted(
    *, server: str, owner: str, previous_owner: str | None, calls_total: int, pins: int
) -> Event:
    """A gateway replica continues an MCP session another replica started (`visor serve --state`):
    the counts and pins it took from the shared store, and who held the session before."""
    event: Event = {
        "event": "session_adopted",
        "server": server,
        "owner": owner,
        "calls_total": calls_total,
        "pins": pins,
    }
    if previous_owner is not None:
        event["previous_owner"] = previous_owner
    return event


def call_verdict(
    kind: str,
    *,
    server: str,
    tool: str | None,
    request_id: Any,
    arguments: Any,
    decision: _Decision,
    policy: str,
) -> Event:
    """An ``allow``, ``deny``, ``ask``, ``approve`` or ``decline`` of one tools/call."""
    event: Event = {
        "event": kind,
        "server": server,
        "tool": tool,
        "id": request_id,
        "args": arguments,
        "rule": decision.rule,
        "reason": decision.reason,
        "policy": policy,
    }
    if decision.destination is not None:
        event["destination"] = decision.destination
    if decision.argument is not None:
        event["argument"] = decision.argument
    return event


def request_verdict(
    kind: str,
    *,
    server: str,
    method: str | None,
    request_id: Any,
    rule: str,
    reason: str,
    policy: str,
    **detail: Any,
) -> Event:
    """An ``allow`` or ``deny`` of a request other than tools/call (a resource read, a
    prompt, a server's request); ``detail`` members that are None are left out."""
    event: Event = {
        "event": kind,
        "server": server,
        "method": method,
        "id": request_id,
        "rule": rule,
        "reason": reason,
        "policy": policy,
    }
    event.update({k: v for k, v in detail.items() if v is not None})
    return event


def result(
    *,
    server: str,
    tool: str | None,
    request_id: Any,
    outcome: str,
    size: int | None = None,
    allow_seq: int | None = None,
    duration_ms: float | None = None,
) -> Event:
    """What became of an allowed call: the server's answer (``ok``, ``error``,
    ``tool_error``), or ``cancelled_before_relay``."""
    event: Event = {"event": "result", "server": server, "tool": tool, "id": request_id, "outcome": outcome}
    if size is not None:
        event["bytes"] = size
    if allow_seq is not None:
        event["allow_seq"] = allow_seq
    if duration_ms is not None:
        event["duration_ms"] = duration_ms
    return event


def reject(
    *,
    server: str,
    direction: str,
    reason: str,
    size: int | None = None,
    digest: str | None = None,
    code: int | None = None,
    method: str | None = None,
    tool: str | None = None,
    request_id: Any = None,
    has_id: bool = False,
) -> Event:
    """A wire-level refusal: the refused line is never recorded, only its size and SHA-256.
    Reasons and names can quote the line, so they are cut short."""
    event: Event = {"event": "reject", "server": server, "direction": direction, "reason": bounded(reason)}
    if size is not None:
        event["bytes"] = size
    if digest is not None:
        event["sha256"] = digest
    if code is not None:
        event["code"] = code
    if method:
        event["method"] = bounded(method)
    if tool:
        event["tool"] = bounded(tool)
    if has_id:
        # A string id of any length would otherwise be copied whole; the record
        # builder replaces one over its bound by a digest.
        event["id"] = request_id
    return event


def session_change(kind: str, server: str, tool: str | None, detail: dict[str, Any]) -> Event:
    """A pin, a changed pin, a late tool or a taint (visor.session.SessionEvent)."""
    event: Event = {"event": kind, "server": server, **detail}
    if tool is not None:
        event["tool"] = tool
    return event


def redaction(*, server: str, direction: str, request_id: Any, fields: list[Any], **detail: Any) -> Event:
    """Secrets replaced in one message; ``detail`` members that are None are left out."""
    event: Event = {
        "event": "redact",
        "server": server,
        "direction": direction,
        "id": request_id,
        "fields": fields,
    }
    event.update({k: v for k, v in detail.items() if v is not None})
    return event
