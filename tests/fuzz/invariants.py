"""The invariants every fuzz input is held to, shared by the atheris targets,
the hypothesis fallback driver and the regression tests.

`check_stream(data)` frames `data` (the first two bytes choose the size limit
and the chunking) and classifies every line; `check_line(line)` holds one line
to the validator's promises; `check_policy(text)` holds the policy loader to
"loads or raises PolicyError". A broken invariant raises `InvariantViolation`.

Some differentials are known and open (each has an ``xfail(strict=True)``
test in test_regressions.py). They are returned as issue ids instead of
raised, so a fuzz run keeps searching for new ones; set FUZZ_STRICT=1 to make
them crash like anything else.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
from typing import Any

import orjson

from tests.differential.readers import go_fold_name
from visor.policy import readings
from visor.policy.loader import PolicyError, load_policy_text
from visor.wire import errors
from visor.wire.framer import DEFAULT_MAX_MESSAGE_BYTES, Framer, Oversize, Truncated
from visor.wire.message import PARAMS_MEMBERS, Kind, Message, Rejected, classify, is_valid_id

STRICT = os.environ.get("FUZZ_STRICT") == "1"

# Raw bytes that str.splitlines() treats as line boundaries and JSON allows
# unescaped inside a string (U+0085, U+2028, U+2029).
UNICODE_LINE_BREAKS = (b"\xc2\x85", b"\xe2\x80\xa8", b"\xe2\x80\xa9")

# The limits the first input byte chooses from: tiny ones reach Oversize and
# the discard path, 9000 lets a line pass the 8192-byte fast path of the
# duplicate check, the default is what `visor run` uses.
LIMITS = (DEFAULT_MAX_MESSAGE_BYTES, 16, 64, 300, 9000)

_CODES = {errors.PARSE_ERROR, errors.INVALID_REQUEST, errors.INVALID_PARAMS}


class InvariantViolation(AssertionError):
    pass


class _Differential(Exception):
    pass


# --------------------------------------------------------------- reference


def _no_constant(name: str) -> Any:
    raise _Differential(f"the standard library would read the constant {name}")


def strict_stdlib(line: bytes, fold_case: bool) -> Any:
    """The standard library as a strict parser: UTF-8 only, no NaN/Infinity,
    duplicate keys (case-folded when asked) refused."""

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for k, _ in pairs:
            key = k.casefold() if fold_case else k
            if key in seen:
                raise _Differential(f"duplicate key {k!r}")
            seen.add(key)
        return dict(pairs)

    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Differential(f"not UTF-8: {e}") from None
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=hook)
    except RecursionError:
        raise
    except ValueError as e:
        raise _Differential(f"the standard library refuses it: {e}") from None


def first_difference(a: Any, b: Any, path: str = "$") -> tuple[str, Any, Any] | None:
    """Where two parsed values differ, comparing types too (1 != 1.0 here)."""
    stack = [(a, b, path)]
    while stack:
        x, y, p = stack.pop()
        if type(x) is not type(y):
            return p, x, y
        if type(x) is dict:
            if list(x) != list(y):
                return p, list(x), list(y)
            stack.extend((x[k], y[k], f"{p}.{k}") for k in x)
        elif type(x) is list:
            if len(x) != len(y):
                return p, len(x), len(y)
            stack.extend((u, v, f"{p}[{i}]") for i, (u, v) in enumerate(zip(x, y, strict=True)))
        elif type(x) is float:
            if x != y or math.copysign(1.0, x) != math.copysign(1.0, y):
                return p, x, y
        elif x != y:
            return p, x, y
    return None


def _fail(message: str, line: bytes) -> InvariantViolation:
    return InvariantViolation(f"{message}\n  line: {line[:400]!r}{' ...' if len(line) > 400 else ''}")


# --------------------------------------------------------------- the line


def check_line(line: bytes) -> set[str]:
    """Classify `line` both ways; raise on a broken invariant; return the
    ids of known open issues it shows."""
    known: set[str] = set()
    results: dict[bool, Message | Rejected] = {}
    for fold in (True, False):
        try:
            r = classify(line, fold_case=fold)
        except Exception as e:
            raise _fail(f"classify(fold_case={fold}) raised {type(e).__name__}: {e}", line) from e
        results[fold] = r
        if type(r) is Rejected:
            _check_rejected(r, line)
        elif type(r) is Message:
            known |= _check_message(r, line, fold)
        else:
            raise _fail(f"classify returned {type(r).__name__}", line)
    if type(results[True]) is Message:
        # Folding only ever refuses more: what the client may send, the
        # server direction accepts as the same message.
        other = results[False]
        if type(other) is not Message or other != results[True]:
            raise _fail(f"accepted with case folding but not without: {other!r}", line)
    return known


def _check_rejected(r: Rejected, line: bytes) -> None:
    if r.code not in _CODES:
        raise _fail(f"unexpected error code {r.code}", line)
    for i in r.reply_ids:
        if not is_valid_id(i):
            raise _fail(f"a rejection answers an invalid id {i!r}", line)
    if r.reply_null and r.reply_ids:
        raise _fail("a rejection answers both null and ids", line)


def _check_message(m: Message, line: bytes, fold: bool) -> set[str]:
    known: set[str] = set()
    if m.raw is not line and m.raw != line:
        raise _fail("Message.raw is not the input line", line)
    if b"\r" in line or b"\n" in line or line.startswith(b"\xef\xbb\xbf"):
        raise _fail("accepted a line with CR, LF or a BOM", line)
    # In the server direction these pass on purpose: the client reads them,
    # and no policy check reads a number or splits a line of server output.
    if fold and any(s in line for s in UNICODE_LINE_BREAKS):
        known.add("unicode-line-separator")
    try:
        std = strict_stdlib(line, fold)
    except _Differential as e:
        raise _fail(f"accepted, but {e}", line) from None
    except RecursionError:
        std = None  # deeper than the standard library reads; orjson's value stands alone
    if std is not None:
        diff = first_difference(m.obj, std)
        if diff is not None:
            path, ours, theirs = diff
            if type(ours) is float and type(theirs) is int and not (-(2**63) <= theirs < 2**64):
                if fold:
                    known.add("integer-beyond-64-bits")
            else:
                raise _fail(f"orjson and json read {path} differently: {ours!r} vs {theirs!r}", line)
        again = orjson.loads(line)
        if first_difference(again, m.obj) is not None:
            raise _fail("orjson reads the line differently on a second parse", line)
    obj = m.obj
    if type(obj) is not dict or obj.get("jsonrpc") != "2.0":
        raise _fail("accepted without jsonrpc 2.0", line)
    if m.kind is Kind.REQUEST:
        if not is_valid_id(m.id) or obj.get("id") != m.id or type(obj.get("id")) is not type(m.id):
            raise _fail(f"request with invalid id {m.id!r}", line)
    elif m.kind is Kind.NOTIFICATION:
        if "id" in obj:
            raise _fail("a notification with an id", line)
    elif m.id is not None and not is_valid_id(m.id):
        raise _fail(f"response with invalid id {m.id!r}", line)
    if m.kind is not Kind.RESPONSE:
        if type(m.method) is not str or obj.get("method") != m.method:
            raise _fail("method does not match the object", line)
        extra = set(obj) - {"jsonrpc", "id", "method", "params"}
        if extra:
            raise _fail(f"accepted a request with extra members {extra}", line)
        if "params" in obj and type(obj["params"]) is not dict:
            raise _fail("params is not an object", line)
    if m.method == "tools/call":
        params = obj["params"]
        if m.kind is not Kind.REQUEST:
            raise _fail("tools/call accepted without an id", line)
        if m.tool != params.get("name") or type(m.tool) is not str or not m.tool:
            raise _fail("tool name does not match params.name", line)
        if m.arguments != params.get("arguments", {}) or type(m.arguments) is not dict:
            raise _fail("arguments do not match params.arguments", line)
    elif m.tool is not None or m.arguments is not None:
        raise _fail("tool fields set on a message that is not tools/call", line)
    if fold and m.kind is not Kind.RESPONSE:
        _check_go_reading(obj, line)
    if m.arguments is not None:
        _check_argument_readings(m.arguments, line)
    return known


# The Go model in tests/differential/readers.py folds from Go's own orbit
# table, independently of visor.wire.folding: the two must agree.
_GO_MEMBERS = {go_fold_name(p): p for p in PARAMS_MEMBERS}
_ARGUMENT_NAMES = ("path", "content", "to", "url", "paths", "source", "key")
_GO_ARGUMENTS = {go_fold_name(p): p for p in _ARGUMENT_NAMES}


def _check_go_reading(obj: dict[str, Any], line: bytes) -> None:
    """An accepted client message has no params member that a Go server
    would read as a protocol member it is not."""
    params = obj.get("params")
    if type(params) is not dict:
        return
    for node in (params, params.get("_meta")):
        if type(node) is dict:
            for k in node:
                hit = _GO_MEMBERS.get(go_fold_name(k))
                if hit is not None and hit != k:
                    raise _fail(f"accepted {k!r}, which a Go server reads as {hit!r}", line)


def _check_argument_readings(arguments: dict[str, Any], line: bytes) -> None:
    """The argument readings never raise (but for ambiguous JSON), and every
    member a Go server would read as a known argument name is caught."""
    names = readings.ArgumentNames.of(_ARGUMENT_NAMES)
    found = readings.case_variant(arguments, names)
    for reading in (arguments, _decoded_or_none(arguments, line)):
        if reading is None:
            continue
        stack: list[Any] = [reading]
        while stack:
            node = stack.pop()
            if type(node) is dict:
                for k, v in node.items():
                    hit = _GO_ARGUMENTS.get(go_fold_name(k))
                    if reading is arguments and hit is not None and hit != k and found is None:
                        raise _fail(f"argument {k!r} reads as {hit!r} in Go, not refused", line)
                    stack.append(v)
            elif type(node) is list:
                stack.extend(node)
    with contextlib.suppress(readings.AmbiguousJson):  # too deep to walk: the gate refuses the call
        readings.every_decoding(arguments)
    for v in arguments.values():
        readings.lax_number(v)


def _decoded_or_none(arguments: dict[str, Any], line: bytes) -> dict[str, Any] | None:
    try:
        return readings.decoded_reading(arguments)
    except readings.AmbiguousJson:
        return None


# --------------------------------------------------------------- the stream


def reference_frames(stream: bytes, limit: int) -> list[bytes | type]:
    """What framing must give for `stream`, whatever the chunking."""
    *complete, tail = stream.split(b"\n")
    out: list[bytes | type] = []
    for part in complete:
        if part.endswith(b"\r"):
            part = part[:-1]
        out.append(part if len(part) <= limit else Oversize)
    if tail:
        fits = len(tail) <= limit or (len(tail) == limit + 1 and tail.endswith(b"\r"))
        out.append(Truncated if fits else Oversize)
    return out


def chunks_of(stream: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    style = seed % 4
    if style == 0 or not stream:
        return [stream]
    if style == 1:
        return [stream[i : i + 1] for i in range(len(stream))]
    cuts = sorted(rng.randrange(len(stream) + 1) for _ in range(rng.randrange(1, 12)))
    if style == 3:
        # Cut right after every CR as well: CRLF split across reads.
        cuts = sorted({*cuts, *(m.end() for m in re.finditer(b"\r", stream))})
    out, prev = [], 0
    for c in [*cuts, len(stream)]:
        out.append(stream[prev:c])
        prev = c
    return out


def check_stream(data: bytes) -> set[str]:
    if len(data) < 2:
        return set()
    limit = LIMITS[data[0] % len(LIMITS)]
    stream = data[2:]
    framer = Framer(max_bytes=limit)
    events: list[Any] = []
    for chunk in chunks_of(stream, data[1]):
        events.extend(framer.feed(chunk))
        if framer.buffered > limit + 1:
            raise _fail(f"framer holds {framer.buffered} bytes, limit {limit}", stream)
    events.extend(framer.eof())
    if framer.buffered:
        raise _fail("framer holds bytes after eof", stream)
    got = [e if type(e) is bytes else type(e) for e in events]
    want = reference_frames(stream, limit)
    if got != want:
        raise _fail(f"framing with limit {limit}, chunking {data[1]}: got {got!r}, want {want!r}", stream)
    known: set[str] = set()
    for e in events:
        if type(e) is bytes:
            known |= check_line(e)
    return known


# --------------------------------------------------------------- the policy

# Open loader bugs (see test_regressions.py): exception type name and a
# fragment of the traceback's innermost visor frame or message.
_LOADER_KNOWN = (
    ("loader-nul-in-path-prefix", "PathError", ""),
    ("loader-re-error-in-allowed_repos", "error", ""),
    ("loader-nul-in-glob", "ValueError", "embedded null byte"),
    ("loader-recursion", "RecursionError", ""),
    ("loader-timezone-oserror", "OSError", ""),
    ("loader-timezone-oserror", "IsADirectoryError", ""),
    ("loader-timezone-oserror", "NotADirectoryError", ""),
    ("loader-timezone-oserror", "PermissionError", ""),
    ("loader-regex-overflow", "OverflowError", ""),
    ("loader-surrogate", "UnicodeEncodeError", ""),
)


def check_policy(text: str) -> set[str]:
    try:
        load_policy_text(text, "fuzz.yaml")
    except PolicyError as e:
        if not str(e).startswith("fuzz.yaml"):
            raise InvariantViolation(f"PolicyError does not name the file: {e}") from e
    except Exception as e:
        name = type(e).__name__
        for issue, exc_name, fragment in _LOADER_KNOWN:
            if name == exc_name and fragment in str(e):
                if STRICT:
                    raise
                return {issue}
        raise
    return set()


def record_known(issues: set[str], data: bytes) -> None:
    """Keep one example of each known issue for the run summary."""
    if not issues:
        return
    if STRICT:
        raise InvariantViolation(f"known open issues: {sorted(issues)}")
    folder = os.environ.get("FUZZ_KNOWN_DIR")
    if not folder:
        return
    for issue in issues:
        path = os.path.join(folder, issue)
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(data)
