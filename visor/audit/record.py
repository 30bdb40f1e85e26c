"""Audit record schema, canonical encoding and the chain hash.

A stored line is ``{"hash":"<64 hex>",`` followed by the rest of the record's
canonical JSON body (everything after its opening ``{``), then ``\\n``.  The
body is the record without ``hash``: sorted keys, compact separators, raw UTF-8.
``hash = sha256(prev_hex_ascii + body_bytes)``.

Putting ``hash`` first, outside the sorted body, means a verifier never has to
re-serialise JSON (float formatting and key ordering differ between languages):
it slices the line at a fixed offset and hashes the bytes exactly as stored.
docs/audit-format.md is the normative description; keep the two in step.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

import orjson

FORMAT_VERSION = 1
GENESIS = "0" * 64

# Every event Visor writes.  Validation is strict so that a typo in the gate is
# a loud failure in tests instead of a silently unreportable record.
EVENTS: frozenset[str] = frozenset(
    {
        "allow",
        "deny",
        "ask",
        "approve",
        "decline",
        "reject",
        "taint",
        "pin",
        "pin_changed",
        "redact",
        "session_start",
        "session_end",
        "session_adopted",
        "policy_load",
        "policy_reload",
        "audit_open",
        "result",
        "audit_repair",
        "checkpoint",
    }
)
# Events that are a verdict on a call; `show` lists these by default.
VERDICTS: frozenset[str] = frozenset({"allow", "deny", "ask", "approve", "decline", "reject"})

# Fields the writer owns.  A caller that sets one of them is a bug, not data.
RESERVED: frozenset[str] = frozenset({"v", "ts", "session", "seq", "prev", "hash"})
REQUIRED: tuple[str, ...] = ("v", "event", "ts", "session", "seq", "prev", "hash")

_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_PREFIX = b'{"hash":"'
# len('{"hash":"') + 64 hex + '",'  -> the body continues right after this.
HASH_START = len(_PREFIX)
BODY_START = HASH_START + 64 + 2

# Bounds on what one record may carry (docs/audit-format.md, "Bounded fields").
# Arguments, tool names, ids and reasons come from the client or the server and
# have no size of their own: a field over these bounds is replaced by its
# SHA-256 and size under ``omitted``, never written, not even in part.
MAX_STRING_BYTES = 4096  # a string field, UTF-8 encoded
MAX_FIELD_BYTES = 16 * 1024  # an object or array field, as canonical JSON
MAX_ALLOW_FIELD_BYTES = 64 * 1024  # the same in `allow` and `approve`: what reaches the server
MAX_DEPTH = 32  # levels of nesting inside one field
_LARGE_FIELDS_EVENTS = frozenset({"allow", "approve"})

# orjson would otherwise serialise dataclasses and datetimes in its own way;
# passing them through makes them an encoding error, so only JSON types land
# in the log.
_DUMP_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


class RecordError(ValueError):
    """A line or an event that is not a valid audit record.

    ``kind`` lets callers tell damage from someone else's file: "corrupt" (not
    JSON: torn or garbled), "foreign" (JSON, but not our format or version:
    never overwrite), "edited" (our format, content changed), "event" (the
    caller handed the writer something unencodable).
    """

    def __init__(self, reason: str, kind: str = "edited") -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


class Encoded(NamedTuple):
    """One record ready to append: the dict returned to callers and its line.

    Immutable like a frozen dataclass, and built in a third of the time (two
    per allowed call)."""

    record: dict[str, Any]
    line: bytes


_second_cache: tuple[int, str] = (-1, "")


def utc_timestamp(now: datetime | None = None) -> str:
    """RFC 3339 UTC with microseconds and a literal Z (fixed width, sorts as text)."""
    if now is not None:
        return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    # Every record needs one; formatting the date part once per second keeps
    # this off the per-call profile.
    global _second_cache
    ns = time.time_ns()
    second, micros = divmod(ns // 1000, 1_000_000)
    if _second_cache[0] != second:
        _second_cache = (second, datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S"))
    return f"{_second_cache[1]}.{micros:06d}Z"


def canonical_body(fields: dict[str, Any]) -> bytes:
    """Canonical JSON of a record without its hash."""
    if "hash" in fields:
        raise RecordError("the canonical body never contains 'hash'", "event")
    try:
        return orjson.dumps(fields, option=_DUMP_OPTS)
    except TypeError as exc:  # non-str keys, ints beyond 64 bits, non-JSON objects
        raise RecordError(f"event is not encodable as audit JSON: {exc}", "event") from exc


def _deeper_than(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        node, depth = pop()
        if depth > limit:
            return True
        for child in node.values() if type(node) is dict else node:
            if type(child) is dict or type(child) is list:
                push((child, depth + 1))
    return False


def canonical_digest(value: Any) -> tuple[str, int]:
    """SHA-256 and length of `value`'s canonical JSON, at any depth.

    orjson writes at most 254 levels but reads 1024; a value parsed from a
    message can be deeper than anything orjson will encode. This walks the
    value with an explicit stack and hashes the same bytes ``canonical_body``
    would produce, so both paths give the same digest.
    """
    try:
        data = orjson.dumps(value, option=_DUMP_OPTS)
    except orjson.JSONEncodeError:
        pass
    else:
        return hashlib.sha256(data).hexdigest(), len(data)
    h = hashlib.sha256()
    size = 0
    stack: list[Any] = [value]
    pop, extend = stack.pop, stack.extend
    while stack:
        item = pop()
        t = type(item)
        if t is bytes:
            token = item
        elif t is dict:
            keys = sorted(item)
            parts: list[Any] = [b"}"]
            for i in range(len(keys) - 1, -1, -1):
                parts.append(item[keys[i]])
                parts.append(orjson.dumps(keys[i]) + b":")
                if i:
                    parts.append(b",")
            extend(parts)
            token = b"{"
        elif t is list:
            parts = [b"]"]
            for i in range(len(item) - 1, -1, -1):
                parts.append(item[i])
                if i:
                    parts.append(b",")
            extend(parts)
            token = b"["
        else:
            try:
                token = orjson.dumps(item, option=_DUMP_OPTS)
            except TypeError as exc:
                raise RecordError(f"event is not encodable as audit JSON: {exc}", "event") from exc
        h.update(token)
        size += len(token)
    return h.hexdigest(), size


def _omission(digest: str, size: int, why: str) -> dict[str, Any]:
    return {"sha256": digest, "bytes": size, "why": why}


def bound_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` with every over-bound field moved to ``omitted`` as its digest and size.

    A string is measured as UTF-8 (its digest is of those bytes); an object or
    array as canonical JSON (its digest is of that text), and it is also
    omitted when nested deeper than MAX_DEPTH. Never raises for a value that
    is merely too large or too deep.
    """
    cap = MAX_ALLOW_FIELD_BYTES if fields.get("event") in _LARGE_FIELDS_EVENTS else MAX_FIELD_BYTES
    out: dict[str, Any] = {}
    omitted: dict[str, Any] = {}
    for key, value in fields.items():
        t = type(value)
        if t is str and len(value) > MAX_STRING_BYTES // 4:
            raw = value.encode("utf-8", "surrogatepass")
            if len(raw) > MAX_STRING_BYTES:
                why = f"longer than {MAX_STRING_BYTES} bytes"
                omitted[key] = _omission(hashlib.sha256(raw).hexdigest(), len(raw), why)
                continue
        elif t is dict or t is list:
            try:
                data = orjson.dumps(value, option=_DUMP_OPTS)
            except orjson.JSONEncodeError as exc:
                if "ecursion" not in str(exc):
                    raise RecordError(f"event is not encodable as audit JSON: {exc}", "event") from exc
                digest, size = canonical_digest(value)
                omitted[key] = _omission(digest, size, f"nested deeper than {MAX_DEPTH} levels")
                continue
            if len(data) > cap:
                why = f"larger than {cap} bytes"
                omitted[key] = _omission(hashlib.sha256(data).hexdigest(), len(data), why)
                continue
            if _deeper_than(value, MAX_DEPTH):
                why = f"nested deeper than {MAX_DEPTH} levels"
                omitted[key] = _omission(hashlib.sha256(data).hexdigest(), len(data), why)
                continue
        out[key] = value
    if omitted:
        out["omitted"] = omitted
    return out


def chain_hash(prev: str, body: bytes) -> str:
    return hashlib.sha256(prev.encode("ascii") + body).hexdigest()


def build(event: dict[str, Any], *, session: str, seq: int, prev: str, ts: str | None = None) -> Encoded:
    """Stamp a caller's event with the writer's fields, hash it and encode its line."""
    name = event.get("event")
    if name not in EVENTS:
        raise RecordError(f"unknown audit event {name!r}; known: {', '.join(sorted(EVENTS))}", "event")
    if not RESERVED.isdisjoint(event):
        clash = RESERVED.intersection(event)
        raise RecordError(f"event sets writer-owned fields: {', '.join(sorted(clash))}", "event")
    global _last_digest
    # A writer chains each record to the hash the previous build returned:
    # that one is known to be well formed, anything else is checked.
    if prev != _last_digest and not _HEX64.match(prev):
        raise RecordError("prev must be 64 lowercase hex digits", "event")
    fields = {
        **event,
        "v": FORMAT_VERSION,
        "ts": ts or utc_timestamp(),
        "session": session,
        "seq": seq,
        "prev": prev,
    }
    try:
        body = orjson.dumps(fields, option=_DUMP_OPTS)
    except TypeError:
        body = b""
    # A small body with few brackets holds no field over the bounds: the usual
    # record is encoded once. Anything else is measured field by field.
    if not body or len(body) > MAX_STRING_BYTES or body.count(b"{") + body.count(b"[") > MAX_DEPTH:
        fields = bound_fields(fields)
        body = canonical_body(fields)
    digest = hashlib.sha256(prev.encode("ascii") + body).hexdigest()
    line = b"".join((_PREFIX, digest.encode("ascii"), b'",', body[1:], b"\n"))
    fields["hash"] = digest
    _last_digest = digest
    return Encoded(fields, line)


# The digest the last ``build`` computed (sha256 hexdigest: 64 lowercase hex digits).
_last_digest = GENESIS


@dataclass(frozen=True, slots=True)
class Parsed:
    """A stored line that is well formed and whose hash matches its own content.

    Whether it links to its predecessor is the chain walker's job (verify.py).
    """

    record: dict[str, Any]
    hash: str
    prev: str
    seq: int
    event: str


def parse_line(line: bytes) -> Parsed:
    """Check one complete line (without its newline) on its own.

    Raises RecordError with a reason a human can act on.
    """
    if (
        not line.startswith(_PREFIX)
        or len(line) < BODY_START + 1
        or line[BODY_START - 2 : BODY_START] != b'",'
    ):
        # Not our layout: decide between "not JSON" and "JSON but foreign" for the message.
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise RecordError("not valid JSON (edited or corrupted)", "corrupt") from None
        if isinstance(obj, dict) and all(k in obj for k in REQUIRED):
            raise RecordError("fields are not in Visor's stored order (edited)")
        raise RecordError("not a Visor audit record (unknown format)", "foreign")
    digest = line[HASH_START : HASH_START + 64].decode("ascii", "replace")
    body = b"{" + line[BODY_START:]
    try:
        fields = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise RecordError("not valid JSON (edited or corrupted)", "corrupt") from None
    if not isinstance(fields, dict):
        raise RecordError("not a JSON object", "foreign")
    missing = [k for k in REQUIRED if k != "hash" and k not in fields]
    if missing or "hash" in fields:
        raise RecordError(f"not a Visor audit record (missing: {', '.join(missing) or 'none'})")
    if fields["v"] != FORMAT_VERSION:
        raise RecordError(
            f"unknown audit format version {fields['v']!r} (this Visor writes {FORMAT_VERSION})", "foreign"
        )
    prev, seq = fields["prev"], fields["seq"]
    if not isinstance(prev, str) or not _HEX64.match(prev):
        raise RecordError("prev is not 64 lowercase hex digits (edited)")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise RecordError("seq is not a non-negative integer (edited)")
    if not _HEX64.match(digest):
        raise RecordError("hash is not 64 lowercase hex digits (edited)")
    if chain_hash(prev, body) != digest:
        raise RecordError("hash does not match the line's content (edited)")
    fields["hash"] = digest
    return Parsed(record=fields, hash=digest, prev=prev, seq=seq, event=str(fields["event"]))


def link_problem(before: Parsed | None, cur: Parsed) -> str | None:
    """Why `cur` cannot follow `before` (None when `cur` opens the chain)."""
    if before is None:
        if cur.prev == GENESIS:
            if cur.seq == 0:
                return None
            return f"the chain starts at seq {cur.seq}, not 0: records before it were deleted"
        if cur.event == "audit_open" and cur.record.get("rotated_from"):
            return None  # continues a rotated file that is not part of this check
        return "the first record links to a predecessor that is not here: lines before it were deleted"
    if cur.seq == before.seq + 1 and cur.prev == before.hash:
        return None
    if cur.seq <= before.seq:
        return f"seq {cur.seq} follows seq {before.seq}: records reordered or duplicated"
    if cur.seq > before.seq + 1:
        gap = cur.seq - before.seq - 1
        return f"seq jumps from {before.seq} to {cur.seq}: {gap} record(s) deleted"
    return "prev does not match the hash of the line before: a line was replaced or inserted"
