"""Fields of structured tool output: paths into records, and reading text
content that is itself a JSON or YAML document.

Destination provenance tells apart where in a record an address stood
(docs/policy.md, "Destination provenance"): a field the service itself
asserts (``participants``, ``shared_with``) names a real correspondent, a
field a third party writes (a received mail's ``sender``) is asked about, and
free text (a body, a description) is the injection vector. A tool entry
names those fields with paths:

* ``owner``: a member named ``owner`` of any record, at any depth;
* ``participants[*]``: every item of a list member ``participants``;
* ``shared_with.*``: every value of a mapping member ``shared_with``;
* ``contacts[*].email``: the ``email`` of every record in ``contacts``.

A path may end with `` as user`` or `` as channel``: the kind of name the
field holds (``[*] as channel`` for a tool that returns a list of channel
names). Without it the innermost member name that says a kind says it, as an
argument's name does (``users[*]``, ``members``: users; ``channels[*].name``:
channels); a field whose name says neither asserts addresses, URLs and
numbers but no bare name (``destinations.field_name_read``).

A path matches the last segments of where a value stands, so it applies to
a record wherever the record is (a list of records, a record inside a
result). What a path matches counts whole: every string inside it, mapping
keys included (``shared_with: {bob@x: r}`` names bob by a key). Member
names compare as ``snake_case`` lower case (``sharedWith`` is
``shared_with``), as Visor compares argument names.

Pure functions; nothing here does I/O.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import yaml

from visor.policy.destinations import named_kind
from visor.policy.paths import snake

#: A list item in a path (``[*]``); a mapping member is its snake_case name.
ITEM = None
#: Any mapping member (``*``).
ANY = "*"

_NAME = re.compile(r"[A-Za-z0-9_\-]+")
_TOKEN = re.compile(r"\[\*\]|\*|[^.\[\]]+|\.|\[[^\]]*\]?")


@dataclass(frozen=True, slots=True)
class FieldPath:
    """One compiled path: ``text`` as written, ``segments`` to match, and
    ``kind``, the kind of bare name the field holds (``user``, ``channel``;
    None: it does not say)."""

    text: str
    segments: tuple[str | None, ...]
    kind: str | None = None


#: Kinds of name a field path may declare with `` as KIND``.
FIELD_KINDS = ("user", "channel")
_AS = re.compile(r"(?:^|\s+)as\s+(\S+)\s*$")


def compile_path(text: str) -> FieldPath:
    """``participants[*]`` -> segments (``participants``, ITEM); ``[*] as
    channel`` -> (ITEM,), kind ``channel``. Raises ValueError saying why."""
    s = text.strip()
    if not s:
        raise ValueError("a field path must not be empty")
    declared: str | None = None
    m = _AS.search(s)
    if m is not None:
        declared = m.group(1)
        if declared not in FIELD_KINDS:
            raise ValueError(f"{text!r}: a field holds names 'as user' or 'as channel', not {declared!r}")
        s = s[: m.start()].strip()
        if not s:
            raise ValueError(f"{text!r}: 'as {declared}' needs a path before it")
    fp = _compile_segments(text, s)
    if declared is None:
        # the innermost member that says a kind: channels[*].name holds channels
        for seg in reversed(fp.segments):
            if seg is not ITEM and seg != ANY:
                declared = named_kind(seg)
                if declared is not None:
                    break
    return FieldPath(text.strip(), fp.segments, declared)


def _compile_segments(text: str, s: str) -> FieldPath:
    segs: list[str | None] = []
    expect_name = True  # at the start or after "."
    for m in _TOKEN.finditer(s):
        tok = m.group(0)
        if tok == ".":
            if expect_name:
                raise ValueError(f"{text!r}: empty member name")
            expect_name = True
            continue
        if tok == "[*]":
            if expect_name and segs:
                raise ValueError(f"{text!r}: '[*]' must follow a member name, not '.'")
            segs.append(ITEM)
            expect_name = False
            continue
        if tok.startswith("["):
            raise ValueError(f"{text!r}: only '[*]' may stand in brackets (every item of a list)")
        if not expect_name:
            raise ValueError(f"{text!r}: member names are separated by '.'")
        if tok == ANY:
            segs.append(ANY)
        elif _NAME.fullmatch(tok):
            segs.append(snake(tok))
        else:
            raise ValueError(
                f"{text!r}: member name {tok!r} may hold letters, digits, '_' and '-' only (or be '*')"
            )
        expect_name = False
    if expect_name:
        raise ValueError(f"{text!r}: a path must not end with '.'")
    return FieldPath(s, tuple(segs))


@lru_cache(maxsize=8192)
def _key(name: str) -> str:
    return snake(name)


def key_segment(name: object) -> str:
    """The path segment of a mapping member (cached snake_case)."""
    return _key(name) if isinstance(name, str) and len(name) <= 128 else f"\x00{name!s:.64}"


def matches(paths: tuple[FieldPath, ...], path: tuple[str | None, ...]) -> FieldPath | None:
    """The first of ``paths`` whose segments equal the last segments of ``path``."""
    n = len(path)
    for p in paths:
        segs = p.segments
        k = len(segs)
        if k > n:
            continue
        ok = True
        for a, b in zip(segs, path[n - k :], strict=True):
            if a is ITEM:
                if b is not ITEM:
                    ok = False
                    break
            elif a == ANY:
                if b is ITEM:
                    ok = False
                    break
            elif a != b:
                ok = False
                break
        if ok:
            return p
    return None


def render(path: tuple[str | None, ...]) -> str:
    """A path as a human reads it: ``[*].participants[*]``."""
    out: list[str] = []
    for seg in path:
        if seg is ITEM:
            out.append("[*]")
        else:
            out.append(("." if out else "") + (seg or "").lstrip("\x00"))
    return "".join(out) or "(the whole result)"


# ------------------------------------------------------------- structured text


class Pairs(list[tuple[str, Any]]):
    """A mapping read from text as its (key, value) pairs in order, duplicates
    kept: a reader that keeps the last of two equal keys would hide the first."""


class _Shared(Exception):
    """A YAML alias: one node reachable twice (the first reading's class would
    decide for both); the text is read as free text instead."""


#: Documents larger than this are read as free text (never as records).
MAX_STRUCTURED_TEXT = 4 * 1024 * 1024
_MAX_DEPTH = 64

try:  # libyaml's parser when present; the pure-Python one otherwise
    _YAML_LOADER: type = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on the build
    _YAML_LOADER = yaml.SafeLoader


def read_structured(text: str) -> object | None:
    """A text that is a JSON or YAML document whose top is a mapping or a
    list, as ``Pairs``/``list``/``str`` (scalars as the string they spell);
    None for anything else: prose, a single scalar, a document with YAML
    aliases, one nested deeper than 64, one over 4 MiB, or one that does not
    parse."""
    if len(text) > MAX_STRUCTURED_TEXT:
        return None
    s = text.lstrip()
    if not s:
        return None
    if s[0] in "[{":
        try:
            doc = json.loads(s, object_pairs_hook=Pairs)
        except (ValueError, RecursionError):
            doc = None
        if isinstance(doc, list):
            return doc if _depth_ok(doc) else None
        # a "{" that is not JSON may still be YAML flow style: fall through
    if ":" not in s and not s.startswith("-"):
        return None  # neither a mapping nor a block list: prose
    try:
        node = yaml.compose(s, Loader=_YAML_LOADER)
    except (yaml.YAMLError, RecursionError, ValueError):
        return None
    if not isinstance(node, yaml.MappingNode | yaml.SequenceNode):
        return None
    try:
        return _from_node(node, set(), 0)
    except (_Shared, RecursionError):
        return None


def _depth_ok(doc: object) -> bool:
    stack: list[tuple[object, int]] = [(doc, 0)]
    while stack:
        v, d = stack.pop()
        if d > _MAX_DEPTH:
            return False
        if isinstance(v, Pairs):
            stack.extend((x, d + 1) for _k, x in v)
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return True


def _from_node(node: yaml.Node, seen: set[int], depth: int) -> object:
    if depth > _MAX_DEPTH:
        raise _Shared
    if isinstance(node, yaml.ScalarNode):
        return node.value
    if id(node) in seen:
        raise _Shared
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        return [_from_node(n, seen, depth + 1) for n in node.value]
    out = Pairs()
    for k, v in node.value:
        if not isinstance(k, yaml.ScalarNode):
            # a complex key: its text counts as free text under its own name
            out.append(("", _from_node(k, seen, depth + 1)))
            out.append(("", _from_node(v, seen, depth + 1)))
            continue
        out.append((k.value, _from_node(v, seen, depth + 1)))
    return out
