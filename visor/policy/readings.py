"""Every reading a real server could take of a call's arguments. Pure.

Visor must judge the call the server will run, and servers read the same
bytes differently:

* Go's ``encoding/json`` (mcp-go, most hand-written Go servers) matches
  object member names to struct fields case-insensitively, with Unicode
  simple case folding: ``Path``, ``PATH`` and ``paTH`` all fill ``path``,
  and so do ``ſ`` for ``s`` and the Kelvin sign for ``k``. ``go_fold`` is
  that folding; a member name that folds onto a name the tool's schema or
  the policy reads, without being exactly it, is refused
  (``case_variant``), because Visor cannot know whether the server reads it.
* The MCP Python SDK decodes a JSON string given for a parameter not typed
  ``str`` (``pre_parse_json``): ``"[\\"/srv/.env\\"]"`` becomes a list.
  ``decoded_reading`` builds the arguments as such a server sees them; the
  evaluator judges both readings and the stricter verdict wins.
* pydantic's lax mode reads ``"+1_000"``, ``" 1e5 "`` and the like as
  numbers: ``lax_number`` gives the largest number any lax reader could take.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from visor.wire.folding import go_fold

# ---------------------------------------------------------------- schemas


@dataclass(frozen=True, slots=True)
class ArgumentNames:
    """The member names a call's arguments are read by, exact and folded."""

    exact: frozenset[str]
    folded: dict[str, str]  # go_fold(name) -> name

    @classmethod
    def of(cls, names: Iterable[str]) -> ArgumentNames:
        exact = frozenset(n for n in names if n)
        return cls(exact, {go_fold(n): n for n in sorted(exact)})


def schema_property_names(schema: object, limit: int = 4096) -> set[str]:
    """Every member name declared anywhere in a JSON Schema (nested
    ``properties`` included): a Go server folds names at every depth."""
    out: set[str] = set()
    stack = [schema]
    seen = 0
    while stack and seen < limit:
        node = stack.pop()
        seen += 1
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict):
                out.update(k for k in props if isinstance(k, str))
            stack.extend(v for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, dict | list))
    return out


def _types(spec: object) -> frozenset[str] | None:
    t = spec.get("type") if isinstance(spec, dict) else None
    if isinstance(t, str):
        return frozenset((t,))
    if isinstance(t, list) and all(isinstance(x, str) for x in t):
        return frozenset(t)
    return None  # no type, or a type given by anyOf/oneOf/$ref: anything goes


def typed_properties(schema: object) -> tuple[frozenset[str], frozenset[str]]:
    """Top-level properties whose schema type is exactly ``"string"``, and
    those whose type admits no string at all (arrays, objects, numbers).

    The SDK decodes a JSON string for any parameter not typed plain ``str``;
    no server takes a string as the value of a parameter that admits no
    string (it decodes it or refuses it). Everything else may be read either way.
    """
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return frozenset(), frozenset()
    plain: set[str] = set()
    never: set[str] = set()
    for k, spec in props.items():
        types = _types(spec)
        if types is None:
            continue
        if types == {"string"}:
            plain.add(k)
        elif "string" not in types:
            never.add(k)
    return frozenset(plain), frozenset(never)


@dataclass(frozen=True, slots=True)
class ArgumentShape:
    """What a tool's schema and the policy say about how its arguments are read."""

    names: ArgumentNames
    plain_strings: frozenset[str] = frozenset()  # never JSON-decoded
    no_strings: frozenset[str] = frozenset()  # a string there is only ever read decoded


def case_variant(arguments: dict[str, Any], names: ArgumentNames) -> tuple[str, str] | None:
    """``(member, the name it folds onto)`` for the first member of the
    arguments (at any depth) that a case-insensitive decoder would read as a
    known name it is not exactly; else None."""
    if not names.folded:
        return None
    stack: list[Any] = [arguments]
    exact, folded = names.exact, names.folded
    while stack:
        node = stack.pop()
        if type(node) is dict:
            for k, v in node.items():
                if k not in exact:
                    hit = folded.get(go_fold(k))
                    if hit is not None:
                        return k, hit
                if type(v) is dict or type(v) is list:
                    stack.append(v)
        elif type(node) is list:
            stack.extend(v for v in node if type(v) is dict or type(v) is list)
    return None


# ---------------------------------------------------------------- JSON in strings


class AmbiguousJson(ValueError):
    """A string argument that decodes to JSON that parsers read differently."""


def _pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for k, _ in items:
        f = go_fold(k)
        if f in seen:
            # stdlib keeps the last duplicate, other decoders the first, a Go
            # decoder either under folding: no single reading exists
            raise AmbiguousJson(f"duplicate member {k!r}")
        seen.add(f)
    return dict(items)


def _constant(name: str) -> Any:
    # The SDK's json.loads takes NaN and Infinity; the numeric limits then
    # see an unbounded number, which is what a lax reader could make of it.
    return math.inf


def decode_json_string(text: str) -> Any:
    """The value the SDK's ``json.loads`` gives for a string, or the string
    itself when it is not JSON. Raises ``AmbiguousJson`` for duplicate keys."""
    try:
        return json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant)
    except AmbiguousJson:
        raise
    except (ValueError, RecursionError):
        return text


def decoded_reading(arguments: dict[str, Any], keep: frozenset[str] = frozenset()) -> dict[str, Any] | None:
    """The arguments as a server that JSON-decodes string parameters reads
    them (the MCP Python SDK's ``pre_parse_json``), or None when that
    reading is the same as the literal one.

    ``keep`` names the parameters the schema types as plain strings, which
    no such server decodes. Raises ``AmbiguousJson``.
    """
    out: dict[str, Any] | None = None
    for k, v in arguments.items():
        if type(v) is not str or k in keep:
            continue
        s = v.lstrip(" \t\n\r")
        if not s or s[0] not in "[{":
            continue  # only a list or an object replaces the string in the SDK's reading
        value = decode_json_string(v)
        if type(value) is not list and type(value) is not dict:
            continue  # the SDK keeps the string when it does not decode to a container
        if out is None:
            out = dict(arguments)
        out[k] = value
    return out


# ---------------------------------------------------------------- numbers

_MAX_DIGITS = 4300  # CPython's int-from-string limit; longer is unbounded for us


def lax_number(value: object) -> float | None:
    """The largest number a lax validator could read ``value`` as, or None.

    Booleans are not numbers. Strings are read as pydantic's lax mode and
    Python's ``int``/``float`` do: surrounding whitespace, a sign, ``_``
    between digits, exponents, Unicode decimal digits, ``0x``/``0o``/``0b``
    prefixes, ``inf`` and ``nan`` (both unbounded).
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return float(value) if abs(value) < 2**1000 else math.inf
    if isinstance(value, float):
        return math.inf if value != value else value
    if not isinstance(value, str):
        return None
    s = value.strip()
    if not s or len(s) > _MAX_DIGITS:
        return math.inf if s else None
    best: float | None = None
    for reading in _number_readings(s):
        if best is None or reading > best or reading != reading:
            best = math.inf if reading != reading else reading
    return best


def lax_number_least(value: object) -> float | None:
    """The smallest number a lax validator could read ``value`` as (``"0-5"`` is -5 to
    pydantic), or None; booleans are not numbers, NaN is None (no certain reading)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return float(value) if abs(value) < 2**1000 else (math.inf if value > 0 else -math.inf)
    if isinstance(value, float):
        return None if value != value else value
    if not isinstance(value, str):
        return None
    s = value.strip()
    if not s or len(s) > _MAX_DIGITS:
        return None
    found = _number_readings(s)
    if not found or any(x != x for x in found):
        return None
    return min(found)


def _int_any_base(s: str) -> float:
    return float(int(s, 0))


def _float_no_underscores(s: str) -> float:
    return float(s.replace("_", ""))


def _float_without_leading_zeros(s: str) -> float:
    # pydantic's integer parser drops leading zeros first: it reads "0-5" as -5
    return float(s.lstrip("0").replace("_", "") or "0")


def _number_readings(s: str) -> list[float]:
    out: list[float] = []
    for parse in (float, _int_any_base, _float_no_underscores, _float_without_leading_zeros):
        try:
            out.append(parse(s))
        except (ValueError, OverflowError):
            continue
    return out


def every_decoding(value: Any, depth: int = 4) -> Any | None:
    """``value`` with every string at any depth that decodes to a JSON list
    or object replaced by that value (recursively, ``depth`` levels of JSON
    inside JSON), or None when nothing decodes.

    For the checks that stand above the policy (Visor's own files): they
    assume the widest reading any server could take, schema or not. A string
    whose JSON is ambiguous is kept as it is here; the evaluator denies it.
    Raises ``AmbiguousJson`` for a value nested too deeply to walk.
    """
    changed = False

    def walk(v: Any, left: int) -> Any:
        nonlocal changed
        t = type(v)
        if t is str:
            s = v.lstrip(" \t\n\r")
            if left and s and s[0] in "[{":
                try:
                    d = decode_json_string(v)
                except AmbiguousJson:
                    return v
                if type(d) is list or type(d) is dict:
                    changed = True
                    return walk(d, left - 1)
            return v
        if t is dict:
            return {k: walk(x, left) for k, x in v.items()}
        if t is list:
            return [walk(x, left) for x in v]
        return v

    try:
        out = walk(value, depth)
    except RecursionError:
        # deeper than can be walked: no reading can be vouched for
        raise AmbiguousJson("nested too deeply to read") from None
    return out if changed else None
