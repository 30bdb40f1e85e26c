"""A JSON (and JSON-with-comments) parser that remembers where every value is.

`visor init` edits a client config by splicing text: only the server entries
it wraps or unwraps are replaced, so everything else in the file (comments,
key order, blank lines, odd spacing, the trailing newline) stays byte for
byte. For that it needs the start and end offset of each value, which the
stdlib parser does not give; this small recursive-descent parser does.

It accepts ``//`` and ``/* */`` comments and trailing commas (VS Code's
``mcp.json`` allows both) and reports each one it meets, so that the caller
can refuse them in files whose client would not accept them. Duplicate keys
are an error: JavaScript's ``JSON.parse`` keeps the last one silently, and
wrapping one of two entries with the same name would be a guess.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

_MAX_DEPTH = 200
_WS = " \t\n\r"
_LINE_END = re.compile(r"[\n\r]")
_OTHER_LINE_ENDS = re.compile("[\x0b\x0c\x85\u2028\u2029]")


class JsoncError(Exception):
    """Not parseable. ``line`` and ``column`` are 1-based."""

    def __init__(self, message: str, line: int, column: int, offset: int) -> None:
        self.message = message
        self.line = line
        self.column = column
        self.offset = offset
        super().__init__(f"line {line} column {column}: {message}")


@dataclass(frozen=True, slots=True)
class Extension:
    """A comment or trailing comma: fine in JSONC, an error in strict JSON."""

    kind: str  # "comment" | "trailing comma"
    line: int
    column: int


@dataclass(frozen=True, slots=True)
class Member:
    key: str
    key_start: int  # offset of the key's opening quote
    value: Node


@dataclass(frozen=True, slots=True)
class Node:
    """One JSON value: its Python value and its span ``text[start:end]``."""

    start: int
    end: int
    value: object  # what json.loads gives for this span
    members: tuple[Member, ...] = ()  # objects only, in document order

    def member(self, key: str) -> Member | None:
        for m in self.members:
            if m.key == key:
                return m
        return None


@dataclass(frozen=True, slots=True)
class Document:
    text: str
    root: Node
    extensions: tuple[Extension, ...] = field(default=())


def position(text: str, offset: int) -> tuple[int, int]:
    """1-based (line, column) of an offset."""
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return line, column


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.extensions: list[Extension] = []

    def fail(self, message: str, offset: int | None = None) -> JsoncError:
        at = self.pos if offset is None else offset
        if at >= len(self.text) and not message.startswith("unexpected end"):
            message = f"unexpected end of file ({message})"
        line, column = position(self.text, at)
        return JsoncError(message, line, column, at)

    def note(self, kind: str, offset: int) -> None:
        line, column = position(self.text, offset)
        self.extensions.append(Extension(kind, line, column))

    def skip(self) -> None:
        text, n = self.text, len(self.text)
        while self.pos < n:
            c = text[self.pos]
            if c in _WS:
                self.pos += 1
            elif text.startswith("//", self.pos):
                self.note("comment", self.pos)
                # jsonc-parser (VS Code) ends a line comment at CR as well as LF: what
                # follows a lone CR is read by the client, so it is read here too.
                m = _LINE_END.search(text, self.pos)
                end = n if m is None else m.start()
                odd = _OTHER_LINE_ENDS.search(text, self.pos, end)
                if odd is not None:
                    # Other JSONC readers (older jsonc-parser, JavaScript's own rules) end it
                    # here, and would read the rest of the line as entries.
                    raise self.fail(
                        f"a line comment holds {odd.group()!r}, where some readers end it; "
                        "replace it with a line feed",
                        odd.start(),
                    )
                self.pos = end
            elif text.startswith("/*", self.pos):
                self.note("comment", self.pos)
                end = text.find("*/", self.pos + 2)
                if end < 0:
                    raise self.fail("unterminated /* comment")
                self.pos = end + 2
            else:
                return

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def value(self, depth: int) -> Node:
        if depth > _MAX_DEPTH:
            raise self.fail("nested too deeply")
        self.skip()
        c = self.peek()
        if c == "{":
            return self.obj(depth)
        if c == "[":
            return self.arr(depth)
        if c == '"':
            start = self.pos
            text = self.string()
            return Node(start, self.pos, text)
        for word, val in (("true", True), ("false", False), ("null", None)):
            if self.text.startswith(word, self.pos):
                start = self.pos
                self.pos += len(word)
                return Node(start, self.pos, val)
        if c == "-" or c.isdigit():
            return self.number()
        if not c:
            raise self.fail("unexpected end of file, expected a value")
        raise self.fail(f"unexpected character {c!r}, expected a value")

    def string(self) -> str:
        start = self.pos
        i = start + 1
        text, n = self.text, len(self.text)
        while i < n:
            c = text[i]
            if c == '"':
                self.pos = i + 1
                try:
                    decoded: str = json.loads(text[start : i + 1])
                except json.JSONDecodeError as e:
                    raise self.fail(f"bad string: {e.msg}", start + e.pos) from None
                return decoded
            if c == "\\":
                i += 2
                continue
            if c == "\n":
                break
            i += 1
        raise self.fail("unterminated string", start)

    def number(self) -> Node:
        start = self.pos
        text, n = self.text, len(self.text)
        i = start
        while i < n and text[i] in "+-0123456789.eE":
            i += 1
        token = text[start:i]
        try:
            value = json.loads(token)
        except json.JSONDecodeError:
            raise self.fail(f"bad number {token!r}", start) from None
        self.pos = i
        return Node(start, i, value)

    def obj(self, depth: int) -> Node:
        start = self.pos
        self.pos += 1
        members: list[Member] = []
        seen: set[str] = set()
        self.skip()
        if self.peek() == "}":
            self.pos += 1
            return Node(start, self.pos, {}, ())
        comma = 0
        while True:
            self.skip()
            if self.peek() != '"':
                if self.peek() == "}" and members:
                    self.note("trailing comma", comma)
                    self.pos += 1
                    break
                raise self.fail("expected a string key in double quotes")
            key_start = self.pos
            key = self.string()
            if key in seen:
                raise self.fail(f"duplicate key {key!r}", key_start)
            seen.add(key)
            self.skip()
            if self.peek() != ":":
                raise self.fail(f"expected ':' after the key {key!r}")
            self.pos += 1
            members.append(Member(key, key_start, self.value(depth + 1)))
            self.skip()
            c = self.peek()
            if c == ",":
                comma = self.pos
                self.pos += 1
                continue
            if c == "}":
                self.pos += 1
                break
            raise self.fail("expected ',' or '}' after an object member")
        return Node(start, self.pos, {m.key: m.value.value for m in members}, tuple(members))

    def arr(self, depth: int) -> Node:
        start = self.pos
        self.pos += 1
        items: list[object] = []
        self.skip()
        if self.peek() == "]":
            self.pos += 1
            return Node(start, self.pos, [])
        comma = 0
        while True:
            self.skip()
            if self.peek() == "]" and items:
                self.note("trailing comma", comma)
                self.pos += 1
                break
            items.append(self.value(depth + 1).value)
            self.skip()
            c = self.peek()
            if c == ",":
                comma = self.pos
                self.pos += 1
                continue
            if c == "]":
                self.pos += 1
                break
            raise self.fail("expected ',' or ']' after an array item")
        return Node(start, self.pos, items)


def parse(text: str) -> Document:
    """Parse JSON or JSONC; raises JsoncError with the line and column."""
    p = _Parser(text)
    if text.startswith("\ufeff"):
        p.pos = 1
    root = p.value(0)
    p.skip()
    if p.pos != len(text):
        raise p.fail("unexpected data after the end of the document")
    return Document(text, root, tuple(p.extensions))
