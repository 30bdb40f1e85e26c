"""``Mcp-Param-*`` headers (2026-07-28): tool arguments a server asks to see mirrored into headers.

A tool's ``inputSchema`` may mark a property with ``x-mcp-header: Name``; a client calling that
tool over HTTP must then send the argument's value as ``Mcp-Param-Name`` too (servers compare it
with the body). The marks are learned from the ``tools/list`` answers that pass through the
upstream, so the headers follow the listing the client itself saw.

An annotation counts only on a property reached from the root through ``properties`` alone, on
a ``string``, ``integer`` or ``boolean`` property, as a non-empty header token unique without
regard to case. A schema with any other annotation is invalid as a whole: its tool gets no
mirrored headers (the specification has clients drop such a tool from the listing; Visor relays
the listing unchanged, so the server refuses the call instead).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from visor.http.headers import encode_header_value

ANNOTATION = "x-mcp-header"
PREFIX = "Mcp-Param-"
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TYPES = frozenset(("string", "integer", "boolean"))
# JSON Schema keywords whose values are schemas (entered, but off the pure `properties` chain).
# Keywords whose values are instance data (default, examples, const, enum) are never entered,
# so data that looks like an annotation is not one.
_ONE = frozenset(
    ("items", "contains", "unevaluatedItems", "additionalProperties", "propertyNames",
     "unevaluatedProperties", "not", "if", "then", "else", "contentSchema")
)  # fmt: skip
_MANY = frozenset(("allOf", "anyOf", "oneOf", "prefixItems"))
_NAMED = frozenset(("patternProperties", "dependentSchemas", "$defs", "definitions"))

HeaderMap = dict[tuple[str, ...], str]


def _positions(root: Any) -> Iterator[tuple[tuple[str, ...] | None, dict[str, Any]]]:
    """Every schema position with its ``properties`` path (None once off that chain)."""
    stack: list[tuple[tuple[str, ...] | None, Any]] = [((), root)]
    while stack:
        path, node = stack.pop()
        if type(node) is not dict:
            continue
        yield path, node
        for key, value in node.items():
            if key == "properties" and type(value) is dict:
                stack.extend(((*path, k) if path is not None else None, v) for k, v in value.items())
            elif key in _ONE:
                stack.append((None, value))
            elif key in _MANY and type(value) is list:
                stack.extend((None, v) for v in value)
            elif key in _NAMED and type(value) is dict:
                stack.extend((None, v) for v in value.values())


def header_map(input_schema: Any) -> HeaderMap | str:
    """The annotated property paths and their header names, or why the schema's marks are invalid."""
    found: HeaderMap = {}
    seen: dict[str, str] = {}
    for path, schema in _positions(input_schema):
        if ANNOTATION not in schema:
            continue
        if not path:
            return f"{ANNOTATION} outside a chain of properties from the schema's root"
        where = ".".join(path)
        token = schema[ANNOTATION]
        if type(token) is not str or not _TOKEN.fullmatch(token):
            return f"property {where!r}: {ANNOTATION} is not a header name token"
        if schema.get("type") not in _TYPES:
            return (
                f"property {where!r}: {ANNOTATION} is only allowed on string, integer and boolean properties"
            )
        if token.lower() in seen:
            return f"property {where!r}: {ANNOTATION} {token!r} repeats that of {seen[token.lower()]!r}"
        seen[token.lower()] = where
        found[path] = token
    return found


def param_headers(marks: HeaderMap, arguments: Mapping[str, Any]) -> dict[str, str]:
    """``Mcp-Param-*`` headers for a call's arguments: absent and null values send none."""
    out: dict[str, str] = {}
    for path, token in marks.items():
        node: Any = arguments
        for key in path:
            node = node.get(key) if type(node) is dict else None
        if type(node) is bool:
            text = "true" if node else "false"
        elif type(node) in (int, float, str):
            text = str(node)
        else:
            continue
        out[PREFIX + token] = encode_header_value(text)
    return out
