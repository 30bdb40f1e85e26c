"""Small pure models of how real MCP servers read what Visor forwards.

Each reader takes the bytes Visor writes to the server (one or more lines,
each ending in b"\\n") and returns the messages it would act on, as `Read`
tuples; `None` stands for a line it could not parse (a server answers that
with a parse error, or drops it). A differential is a forwarded line that a
reader reads as a different method, tool, arguments or id than Visor did, or
as a different number of messages.
"""

from __future__ import annotations

import io
import json
from typing import Any, NamedTuple

import orjson


class Read(NamedTuple):
    method: Any
    tool: Any
    arguments: Any
    id: Any


def _read(obj: Any) -> Read | None:
    if type(obj) is not dict:
        return None
    params = obj.get("params")
    tool = arguments = None
    if obj.get("method") == "tools/call" and type(params) is dict:
        tool = params.get("name")
        arguments = params.get("arguments", {})
    return Read(obj.get("method"), tool, arguments, obj.get("id"))


def _lines_lf(data: bytes) -> list[bytes]:
    # How every stdio transport we know frames: split on LF, drop one CR.
    out = []
    for line in data.split(b"\n")[:-1]:
        out.append(line[:-1] if line.endswith(b"\r") else line)
    return [x for x in out if x.strip()]


def _parse_or_none(text: bytes | str, **kw: Any) -> Any:
    try:
        return json.loads(text, **kw)
    except (ValueError, RecursionError):
        return _UNPARSED


_UNPARSED = object()


def _reads(values: list[Any]) -> list[Read | None]:
    return [None if v is _UNPARSED else _read(v) for v in values]


# --------------------------------------------------------------- readers


def stdlib_reader(data: bytes) -> list[Read | None]:
    """A Python server: LF framing, `json.loads` (last duplicate wins, NaN
    and Infinity accepted, integers exact)."""
    return _reads([_parse_or_none(line) for line in _lines_lf(data)])


def first_key_reader(data: bytes) -> list[Read | None]:
    """A parser that keeps the first of duplicate keys."""

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            out.setdefault(k, v)
        return out

    return _reads([_parse_or_none(line, object_pairs_hook=hook) for line in _lines_lf(data)])


def splitlines_reader(data: bytes) -> list[Read | None]:
    """A server that decodes its input and splits it with `str.splitlines()`
    (\\n, \\r, \\r\\n, \\x0b, \\x0c, \\x1c-\\x1e, \\x85, \\u2028, \\u2029)."""
    text = data.decode("utf-8", "replace")
    return _reads([_parse_or_none(line) for line in text.splitlines() if line.strip()])


def universal_newlines_reader(data: bytes) -> list[Read | None]:
    """A server reading stdin in text mode (`io.TextIOWrapper`, newline=None):
    lines end at \\n, \\r or \\r\\n, as the MCP Python SDK's stdio server reads."""
    stream = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace", newline=None)
    return _reads([_parse_or_none(line) for line in stream if line.strip()])


def orjson_reader(data: bytes) -> list[Read | None]:
    """What Visor's own parser (and so its policy) reads: orjson, integers
    beyond 64 bits as floats."""
    out: list[Any] = []
    for line in _lines_lf(data):
        try:
            out.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            out.append(_UNPARSED)
    return _reads(out)


# --------------------------------------------------------------- Go


# Go's unicode.caseOrbit (src/unicode/tables.go): the fold orbits with more
# than two members, and the Turkic i's that are their own orbit.
_CASE_ORBIT = {
    0x004B: 0x006B, 0x0053: 0x0073, 0x006B: 0x212A, 0x0073: 0x017F, 0x00B5: 0x039C, 0x00C5: 0x00E5,
    0x00DF: 0x1E9E, 0x00E5: 0x212B, 0x0130: 0x0130, 0x0131: 0x0131, 0x017F: 0x0053, 0x01C4: 0x01C5,
    0x01C5: 0x01C6, 0x01C6: 0x01C4, 0x01C7: 0x01C8, 0x01C8: 0x01C9, 0x01C9: 0x01C7, 0x01CA: 0x01CB,
    0x01CB: 0x01CC, 0x01CC: 0x01CA, 0x01F1: 0x01F2, 0x01F2: 0x01F3, 0x01F3: 0x01F1, 0x0345: 0x0399,
    0x0392: 0x03B2, 0x0395: 0x03B5, 0x0398: 0x03B8, 0x0399: 0x03B9, 0x039A: 0x03BA, 0x039C: 0x03BC,
    0x03A0: 0x03C0, 0x03A1: 0x03C1, 0x03A3: 0x03C2, 0x03A6: 0x03C6, 0x03A9: 0x03C9, 0x03B2: 0x03D0,
    0x03B5: 0x03F5, 0x03B8: 0x03D1, 0x03B9: 0x1FBE, 0x03BA: 0x03F0, 0x03BC: 0x00B5, 0x03C0: 0x03D6,
    0x03C1: 0x03F1, 0x03C2: 0x03C3, 0x03C3: 0x03A3, 0x03C6: 0x03D5, 0x03C9: 0x2126, 0x03D0: 0x0392,
    0x03D1: 0x03F4, 0x03D5: 0x03A6, 0x03D6: 0x03A0, 0x03F0: 0x039A, 0x03F1: 0x03A1, 0x03F4: 0x0398,
    0x03F5: 0x0395, 0x0412: 0x0432, 0x0414: 0x0434, 0x041E: 0x043E, 0x0421: 0x0441, 0x0422: 0x0442,
    0x042A: 0x044A, 0x0432: 0x1C80, 0x0434: 0x1C81, 0x043E: 0x1C82, 0x0441: 0x1C83, 0x0442: 0x1C84,
    0x044A: 0x1C86, 0x0462: 0x0463, 0x0463: 0x1C87, 0x1C80: 0x0412, 0x1C81: 0x0414, 0x1C82: 0x041E,
    0x1C83: 0x0421, 0x1C84: 0x1C85, 0x1C85: 0x0422, 0x1C86: 0x042A, 0x1C87: 0x0462, 0x1C88: 0xA64A,
    0x1E60: 0x1E61, 0x1E61: 0x1E9B, 0x1E9B: 0x1E60, 0x1E9E: 0x00DF, 0x1FBE: 0x0345, 0x2126: 0x03A9,
    0x212A: 0x004B, 0x212B: 0x00C5, 0xA64A: 0xA64B, 0xA64B: 0x1C88,
}  # fmt: skip


def go_simple_fold(r: int) -> int:
    """unicode.SimpleFold, with Python's single-character case mappings
    standing in for Go's CaseRanges (Unicode versions may differ slightly)."""
    if r in _CASE_ORBIT:
        return _CASE_ORBIT[r]
    if r < 0x80:
        c = chr(r)
        return ord(c.lower()) if c.isupper() else ord(c.upper()) if c.islower() else r
    c = chr(r)
    lower = c.lower()
    if len(lower) == 1 and lower != c:
        return ord(lower)
    upper = c.upper()
    return ord(upper) if len(upper) == 1 else r


def go_fold_rune(r: int) -> int:
    """encoding/json's foldRune: the smallest rune of r's fold orbit."""
    while True:
        r2 = go_simple_fold(r)
        if r2 <= r:
            return r2
        r = r2


def go_fold_name(name: str) -> str:
    """encoding/json's foldName (Go 1.21+): ASCII upper-cased, the rest folded."""
    return "".join(chr(go_fold_rune(ord(c))) for c in name)


def _go_struct(pairs: list[tuple[str, Any]], fields: tuple[str, ...]) -> dict[str, Any]:
    """Decode an object into a struct with these JSON field names: a key
    matches a field exactly, else by folded name; every match assigns, so
    the last matching key wins; other keys are ignored."""
    folded = {go_fold_name(f): f for f in fields}
    out: dict[str, Any] = {}
    for k, v in pairs:
        field = k if k in fields else folded.get(go_fold_name(k))
        if field is not None:
            out[field] = v
    return out


_ENVELOPE = ("jsonrpc", "id", "method", "params")
_CALL_PARAMS = ("name", "arguments", "_meta")


def go_reader(data: bytes, argument_fields: tuple[str, ...] = ()) -> list[Read | None]:
    """A Go server using encoding/json with structs for the envelope and the
    tools/call params (as the Go MCP SDKs do), and for the arguments when
    `argument_fields` names a typed argument struct; otherwise arguments are
    a map (exact keys, last wins). Numbers are kept exact (a typed field or
    UseNumber), so this reader isolates key matching."""
    out: list[Read | None] = []
    for line in _lines_lf(data):
        pairs = _parse_or_none(line, object_pairs_hook=_Pairs)
        if pairs is _UNPARSED or type(pairs) is not _Pairs:
            out.append(None)
            continue
        env = _go_struct(pairs, _ENVELOPE)
        method = env.get("method")
        tool = arguments = None
        if method == "tools/call" and type(env.get("params")) is _Pairs:
            params = _go_struct(env["params"], _CALL_PARAMS)
            tool = params.get("name")
            raw_args = params.get("arguments", _Pairs())
            if type(raw_args) is _Pairs:
                arguments = _go_struct(raw_args, argument_fields) if argument_fields else _plain(raw_args)
            else:
                arguments = _plain(raw_args)
        out.append(Read(_plain(method), _plain(tool), arguments, _plain(env.get("id"))))
    return out


def _plain(value: Any) -> Any:
    """Pairs back to dicts (last key wins), recursively."""
    if type(value) is _Pairs:
        return {k: _plain(v) for k, v in value}
    if type(value) is list:
        return [_plain(v) for v in value]
    return value


class _Pairs(list):
    """An object's members in order, as encoding/json sees them."""


READERS = {
    "stdlib": stdlib_reader,
    "first-key": first_key_reader,
    "splitlines": splitlines_reader,
    "universal-newlines": universal_newlines_reader,
    "go": go_reader,
}
