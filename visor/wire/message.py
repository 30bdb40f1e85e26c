"""Strict JSON-RPC 2.0 classification of one framed line.

`classify(line)` parses once (orjson) and returns a `Message` or a
`Rejected`. It is pure: the relay decides what to do with a rejection in each
direction. Everything that is not unambiguous JSON-RPC is refused, because a
message that two parsers read differently is a message that can say one thing
to Visor and another to the server.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeGuard

import orjson

from visor.wire import errors
from visor.wire.folding import go_fold

JsonId = str | int

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_BOM = b"\xef\xbb\xbf"
_ABSENT: Any = object()
_LINE_SEPARATORS = (b"\xc2\x85", b"\xe2\x80\xa8", b"\xe2\x80\xa9")
# An integer outside [-2**63, 2**64) has at least 19 digits. Mapping every
# digit to "0" and looking for 19 zeros is a C-speed scan; a regex for a
# digit run costs several times more on every message.
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_NINETEEN_ZEROS = b"0" * 19
_REQUEST_KEYS = frozenset(("jsonrpc", "id", "method", "params"))
_NOTIFICATION_KEYS = frozenset(("jsonrpc", "method", "params"))
_RESPONSE_KEYS = frozenset(("jsonrpc", "id", "result", "error"))
# Every member name MCP defines inside a client message's ``params`` (and
# its ``_meta``). A Go server decodes params case-insensitively, with Unicode
# simple folding: ``Arguments`` or ``argumentſ`` fills ``arguments`` there,
# while Visor would see no arguments at all. A member that folds onto one of
# these without being exactly it has two readings, and is refused.
PARAMS_MEMBERS = frozenset(
    (
        "_meta", "name", "arguments", "uri", "cursor", "task", "ttl", "taskId", "ref", "argument",
        "context", "value", "level", "requestId", "reason", "progressToken", "progress", "total",
        "message", "protocolVersion", "capabilities", "clientInfo", "roots", "action", "content",
        "type", "title", "description", "mimeType", "size", "icons", "annotations", "inputSchema",
        "outputSchema", "structuredContent", "isError", "resultType",
    )
)  # fmt: skip
_FOLDED_MEMBERS = {go_fold(m): m for m in PARAMS_MEMBERS}


class Kind(enum.Enum):
    REQUEST = "request"
    NOTIFICATION = "notification"
    RESPONSE = "response"


class Message(NamedTuple):
    """A valid JSON-RPC message. `raw` is the exact line it came from.

    A NamedTuple rather than a frozen dataclass: one is built for every
    message in both directions, and a tuple is built several times faster.
    """

    kind: Kind
    raw: bytes
    obj: dict[str, Any]
    id: JsonId | None = None
    method: str | None = None
    # For tools/call requests only, already checked for shape.
    tool: str | None = None
    arguments: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Rejected:
    """A line that must not be forwarded.

    `reply_ids` are the ids to answer with an error; `reply_null` asks for a
    single error with id null (JSON-RPC's answer when no id can be trusted).
    Neither means the line is dropped without an answer.
    """

    code: int
    reason: str
    reply_ids: tuple[JsonId, ...] = ()
    reply_null: bool = False
    method: str | None = None
    tool: str | None = None

    @property
    def answered(self) -> bool:
        return bool(self.reply_ids) or self.reply_null


def is_valid_id(value: object) -> TypeGuard[JsonId]:
    # bool is a subclass of int in Python; JSON true/false is never an id.
    if type(value) is str:
        return True
    return type(value) is int and INT64_MIN <= value <= INT64_MAX


def classify(line: bytes, *, fold_case: bool = True) -> Message | Rejected:
    """Classify one line (without its newline). Never raises.

    `fold_case` is the strictness the relay asks for on everything the
    client sends: keys equal after case folding are refused (a Go server
    matches struct fields case-insensitively), and so are raw Unicode line
    separators and integers that orjson cannot read exactly (below).
    """
    if b"\r" in line:
        # A peer that splits lines on CR (universal newlines) would read
        # different messages from the same bytes.
        return Rejected(errors.PARSE_ERROR, "raw carriage return inside a line", reply_null=True)
    if line.startswith(_BOM):
        return Rejected(errors.PARSE_ERROR, "byte order mark before the message", reply_null=True)
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return Rejected(errors.PARSE_ERROR, f"not valid JSON: {exc}", reply_null=True)
    if type(obj) is list:
        return _reject_batch(obj)
    if type(obj) is not dict:
        return Rejected(errors.INVALID_REQUEST, "a message must be a JSON object", reply_null=True)
    problem = duplicate_key_problem(obj, line, fold_case)
    if problem is not None:
        return _reject_duplicates(line, problem)
    if fold_case:
        if not line.isascii() and any(sep in line for sep in _LINE_SEPARATORS):
            # Valid JSON inside a string, but a server that splits lines with
            # str.splitlines() would read several messages from this one.
            return _reject_with_id(obj, "raw Unicode line separator (U+0085, U+2028 or U+2029) in a message")
        if _NINETEEN_ZEROS in line.translate(_DIGITS_TO_ZERO) and _inexact_integer(line):
            # orjson reads these as floats; the server reads the exact
            # integer. The policy must never judge a number the server does not see.
            return _reject_with_id(obj, "an integer outside the 64-bit range")
        if line.count(b"{") + line.count(b"[") > MAX_DEPTH and _depth_over(obj, MAX_DEPTH):
            # Readers stop at different depths (Python's json near 1000, orjson
            # writes 254, servers have their own limits): past a depth no real
            # call needs, no single reading can be vouched for.
            return _reject_with_id(obj, f"nested deeper than {MAX_DEPTH} levels")
        msg = _classify_object(obj, line)
        if type(msg) is Message and msg.kind is not Kind.RESPONSE:
            params = obj.get("params")
            if type(params) is dict:
                variant = member_variant(params)
                if variant is not None:
                    return _reject_variant(msg, variant)
        return msg
    return _classify_object(obj, line)


#: The deepest a client message may nest (objects and arrays, the envelope included).
MAX_DEPTH = 64


def _depth_over(obj: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if type(node) is dict else node
        for v in children:
            if type(v) is dict or type(v) is list:
                stack.append((v, depth + 1))
    return False


def member_variant(params: dict[str, Any]) -> tuple[str, str] | None:
    """``(member, protocol name)`` for a member of ``params`` or its ``_meta``
    that a case-insensitive decoder reads as a protocol member it is not."""
    folded = _FOLDED_MEMBERS
    for node in (params, params.get("_meta")):
        if type(node) is not dict or node.keys() <= PARAMS_MEMBERS:
            continue  # every member exactly a protocol name: the usual case, one C-level check
        for k in node:
            if k not in PARAMS_MEMBERS:
                hit = folded.get(go_fold(k))
                if hit is not None:
                    return k, hit
    return None


def _reject_variant(msg: Message, variant: tuple[str, str]) -> Rejected:
    member, name = variant
    reason = f"params member {member!r} is a case variant of {name!r}: a case-insensitive server would read it as {name!r}"
    if msg.kind is Kind.REQUEST and msg.id is not None:  # a request's id is never None
        return Rejected(errors.INVALID_PARAMS, reason, (msg.id,), method=msg.method, tool=msg.tool)
    return Rejected(errors.INVALID_PARAMS, reason, method=msg.method)


def _reject_with_id(obj: dict[str, Any], reason: str) -> Rejected:
    msg_id = obj.get("id", _ABSENT)
    method = obj.get("method")
    method = method if type(method) is str else None
    if msg_id is not _ABSENT and is_valid_id(msg_id) and method is not None:
        return Rejected(errors.INVALID_REQUEST, reason, (msg_id,), method=method)
    return Rejected(errors.INVALID_REQUEST, reason, reply_null=method is not None, method=method)


class _Inexact(Exception):
    pass


def _check_int(text: str) -> int:
    value = int(text)
    if not INT64_MIN <= value < 2**64:
        raise _Inexact(text)
    return value


def _inexact_integer(line: bytes) -> bool:
    try:
        json.loads(line, parse_int=_check_int)
    except _Inexact:
        return True
    except (ValueError, RecursionError):
        # The standard library refuses what orjson read: refuse it too.
        return True
    return False


def _classify_object(obj: dict[str, Any], line: bytes) -> Message | Rejected:
    # Fast path for the shapes nearly every message has; anything else takes
    # the full path below, which also says precisely what is wrong.
    if obj.get("jsonrpc") == "2.0":
        n = len(obj)
        params = obj.get("params", _ABSENT)
        if params is _ABSENT or type(params) is dict:
            method = obj.get("method")
            msg_id = obj.get("id", _ABSENT)
            if type(method) is str and method != "tools/call":
                if msg_id is _ABSENT:
                    if n == (2 if params is _ABSENT else 3):
                        return Message(Kind.NOTIFICATION, line, obj, None, method)
                elif n == (3 if params is _ABSENT else 4) and is_valid_id(msg_id):
                    return Message(Kind.REQUEST, line, obj, msg_id, method)
            elif method == "tools/call" and params is not _ABSENT and n == 4 and is_valid_id(msg_id):
                name = params.get("name")
                arguments = params.get("arguments", _ABSENT)
                if arguments is _ABSENT:
                    arguments = {}
                if type(name) is str and name and type(arguments) is dict:
                    return Message(Kind.REQUEST, line, obj, msg_id, method, name, arguments)
            elif method is None and n == 3 and type(obj.get("result")) is dict and is_valid_id(msg_id):
                return Message(Kind.RESPONSE, line, obj, msg_id)
    return _classify_object_fully(obj, line)


def _classify_object_fully(obj: dict[str, Any], line: bytes) -> Message | Rejected:
    has_id = "id" in obj
    msg_id = obj.get("id")
    reply: tuple[JsonId, ...] = ()
    if has_id and is_valid_id(msg_id):
        reply = (msg_id,)
    id_ok = bool(reply)
    method = obj.get("method")

    if obj.get("jsonrpc") != "2.0":
        return Rejected(
            errors.INVALID_REQUEST, 'jsonrpc must be exactly "2.0"', reply, not id_ok, _str_or_none(method)
        )

    if "method" in obj:
        if type(method) is not str:
            return Rejected(errors.INVALID_REQUEST, "method must be a string", reply, not id_ok)
        if has_id and not id_ok:
            return Rejected(errors.INVALID_REQUEST, _bad_id_reason(msg_id), (), True, method)
        allowed = _REQUEST_KEYS if has_id else _NOTIFICATION_KEYS
        extra = obj.keys() - allowed
        if extra:
            return Rejected(
                errors.INVALID_REQUEST, f"unexpected member {sorted(extra)[0]!r}", reply, not id_ok, method
            )
        params = obj.get("params")
        if "params" in obj and type(params) is not dict:
            return Rejected(errors.INVALID_REQUEST, "params must be an object", reply, not id_ok, method)
        if method == "tools/call":
            return _classify_tool_call(obj, line, params, msg_id if has_id else None, has_id)
        kind = Kind.REQUEST if has_id else Kind.NOTIFICATION
        return Message(kind, line, obj, msg_id, method)

    # No method: a response.
    if not has_id:
        return Rejected(errors.INVALID_REQUEST, "neither a request nor a response", reply_null=True)
    if msg_id is not None and not id_ok:
        return Rejected(errors.INVALID_REQUEST, _bad_id_reason(msg_id), reply_null=True)
    extra = obj.keys() - _RESPONSE_KEYS
    if extra:
        return Rejected(errors.INVALID_REQUEST, f"unexpected member {sorted(extra)[0]!r}")
    has_result = "result" in obj
    has_error = "error" in obj
    if has_result == has_error:
        return Rejected(errors.INVALID_REQUEST, "a response needs exactly one of result and error")
    if has_result and type(obj["result"]) is not dict:
        return Rejected(errors.INVALID_REQUEST, "result must be an object")
    if has_error:
        err = obj["error"]
        if type(err) is not dict or type(err.get("code")) is not int or type(err.get("message")) is not str:
            return Rejected(
                errors.INVALID_REQUEST, "error must be an object with an integer code and a message"
            )
    elif msg_id is None:
        return Rejected(errors.INVALID_REQUEST, "a result needs a request id")
    return Message(Kind.RESPONSE, line, obj, msg_id)


def _classify_tool_call(
    obj: dict[str, Any], line: bytes, params: Any, msg_id: Any, has_id: bool
) -> Message | Rejected:
    if not has_id:
        # A notification gets no answer, so a tool call in that form would run
        # with nobody told the verdict: never relayed, never answered.
        return Rejected(errors.INVALID_REQUEST, "tools/call sent as a notification", method="tools/call")
    name = params.get("name") if type(params) is dict else None
    if type(name) is not str or not name:
        return Rejected(
            errors.INVALID_PARAMS, "params.name must be a non-empty string", (msg_id,), method="tools/call"
        )
    arguments = params.get("arguments", {})
    if type(arguments) is not dict:
        return Rejected(
            errors.INVALID_PARAMS,
            "params.arguments must be an object",
            (msg_id,),
            method="tools/call",
            tool=name,
        )
    return Message(Kind.REQUEST, line, obj, msg_id, "tools/call", name, arguments)


def _reject_batch(items: list[Any]) -> Rejected:
    ids: list[JsonId] = []
    for item in items:
        if type(item) is dict and "method" in item and is_valid_id(item.get("id")):
            ids.append(item["id"])
    return Rejected(
        errors.INVALID_REQUEST,
        "batches are not accepted",
        tuple(ids),
        reply_null=not ids,
    )


def _reject_duplicates(line: bytes, problem: str) -> Rejected:
    top = _top_level_pairs(line)
    id_values = [v for k, v in top if k.casefold() == "id"]
    methods = [v for k, v in top if k.casefold() == "method"]
    method = methods[0] if len(methods) == 1 and type(methods[0]) is str else None
    if len(id_values) == 1 and is_valid_id(id_values[0]) and methods:
        return Rejected(errors.INVALID_REQUEST, problem, (id_values[0],), method=method)
    # The id itself is in doubt: answering it could answer the wrong request.
    return Rejected(errors.INVALID_REQUEST, problem, method=method)


def _top_level_pairs(line: bytes) -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = []

    def hook(items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        return items

    try:
        top = json.loads(line, object_pairs_hook=hook)
    except (ValueError, RecursionError):
        return pairs
    if isinstance(top, list):
        pairs = [p for p in top if isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)]
    return pairs


# Up to this size an ASCII line is checked with a few passes of C code over
# its bytes; past it, a walk over the parsed tree costs less.
_SMALL_LINE = 8192


def duplicate_key_problem(obj: Any, line: bytes, fold_case: bool = True) -> str | None:
    """Say why `obj` (parsed from `line`) has duplicate keys, or None.

    orjson keeps the last of duplicate keys, so duplicates are invisible in
    `obj`. Without `\\u` escapes in the line every ':' in the text is either a
    member separator or a literal ':' inside a string, and re-encoding `obj`
    writes the same literal ':' again; so any dropped duplicate member makes
    the re-encoded text have fewer ':' than the line. With escapes that count
    is not exact, so those lines take a slower, exact path.
    """
    # A one-byte search is a memchr; most lines hold no backslash at all.
    if b"\\" in line and b"\\u" in line:
        return _duplicate_key_problem_exact(line, fold_case)
    if len(line) <= _SMALL_LINE and line.isascii():
        colons = line.count(b":")
        try:
            if fold_case:
                # ASCII keys that differ only in case are duplicates once the line
                # is lowered, and lowering never changes whether ASCII JSON is
                # valid: one check covers both kinds of duplicate.
                lowered = line.lower()
                folded = obj if lowered == line else orjson.loads(lowered)
                if orjson.dumps(folded).count(b":") == colons:
                    return None
                if orjson.dumps(obj).count(b":") != colons:
                    return "duplicate keys"
                return "duplicate keys (equal after case folding)"
            if orjson.dumps(obj).count(b":") != colons:
                return "duplicate keys"
            return None
        except orjson.JSONEncodeError:
            # orjson reads 1024 levels of nesting but writes only 254: a
            # deeper line is checked by the walk, which has no depth limit.
            pass
    return _duplicate_key_problem_walk(obj, line, fold_case)


def _duplicate_key_problem_walk(obj: Any, line: bytes, fold_case: bool) -> str | None:
    keys = 0
    colons = 0
    stack = [obj]
    pop = stack.pop
    push = stack.append
    while stack:
        node = pop()
        if type(node) is dict:
            n = len(node)
            keys += n
            if fold_case and n > 1 and len({k.casefold() for k in node}) != n:
                return "duplicate keys (equal after case folding)"
            for k, v in node.items():
                if ":" in k:
                    colons += k.count(":")
                tv = type(v)
                if tv is str:
                    if ":" in v:
                        colons += v.count(":")
                elif tv is dict or tv is list:
                    push(v)
        else:
            for v in node:
                tv = type(v)
                if tv is str:
                    if ":" in v:
                        colons += v.count(":")
                elif tv is dict or tv is list:
                    push(v)
    if line.count(b":") - colons != keys:
        return "duplicate keys"
    return None


class _Duplicate(Exception):
    pass


def _duplicate_key_problem_exact(line: bytes, fold_case: bool) -> str | None:
    def hook(items: list[tuple[str, Any]]) -> dict[str, Any]:
        exact: set[str] = set()
        seen: set[str] = set()
        for k, _ in items:
            if k in exact:
                raise _Duplicate("duplicate keys")
            exact.add(k)
            folded = k.casefold() if fold_case else k
            if folded in seen:
                raise _Duplicate("duplicate keys (equal after case folding)")
            seen.add(folded)
        return dict(items)

    try:
        json.loads(line, object_pairs_hook=hook)
    except _Duplicate as dup:
        return str(dup)
    except RecursionError:
        # orjson reads 1024 levels; the standard library stops near the
        # interpreter's recursion limit. Unchecked is not accepted.
        return "nested too deeply to check for duplicate keys"
    except ValueError:
        # orjson accepted what the standard library refuses: the two parsers
        # disagree, which is reason enough to refuse the message.
        return "the message parses differently in different JSON parsers"
    return None


def _bad_id_reason(value: object) -> str:
    if type(value) is int:
        return "id is outside the signed 64-bit range"
    return f"id must be a string or an integer, not {_json_type(value)}"


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if type(value) is bool:
        return "a boolean"
    if type(value) is float:
        return "a number with a fraction or exponent"
    if type(value) is dict:
        return "an object"
    if type(value) is list:
        return "an array"
    return type(value).__name__


def _str_or_none(value: object) -> str | None:
    return value if type(value) is str else None
