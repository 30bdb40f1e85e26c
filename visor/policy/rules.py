"""The checks of the mcp-visor rule language, one small function per rule type.

An argument check takes the compiled rule and the call's arguments (a
``CallView``) and returns a reason string when the rule denies, else ``None``;
a path check takes the rule and the call's path readings. The argument names
each rule reads are a superset of the ones mcp-visor reads for it. Which
check belongs to which rule type, with its keys and its reader, is said once,
in visor/policy/ruletypes.py.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

from visor.policy import destinations as dst
from visor.policy import readings, rowcount, shell, sql, urls
from visor.policy.paths import snake
from visor.policy.schema import Rule

COMMAND_ARGS = frozenset({"command", "cmd", "exec", "script", "shell_command", "command_line", "commandline"})
QUERY_ARGS = frozenset({"query", "sql", "statement", "sql_query"})
RECIPIENT_ARGS = frozenset({"recipient", "to", "email", "domain"})  # plus every destination-shaped name
REPO_ARGS = frozenset({"repo", "repository", "repo_name", "repository_name", "full_name", "owner/repo"})
SIZE_ARGS = frozenset({"size", "file_size", "bytes", "length", "content_length", "size_bytes"})
CONTENT_ARGS = frozenset({"content", "contents", "data", "text", "body", "file_content"})
ROW_ARGS = frozenset(
    {"limit", "rows", "max_rows", "row_limit", "max_results", "top", "count", "per_page", "page_size", "n"}
)


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        # an argv list is one command: join it so patterns see what runs
        if value and all(isinstance(v, str) for v in value):
            yield " ".join(value)
        else:
            for v in value:
                yield from _strings(v)


#: Longer member names are no parameter of any server (and cost a snake_case form each).
_MAX_NAME = 1024
_snake = lru_cache(maxsize=8192)(snake)


def _is_named(key: object, names: frozenset[str]) -> bool:
    return isinstance(key, str) and len(key) <= _MAX_NAME and (key in names or _snake(key) in names)


def _mappings(arguments: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The arguments and every mapping inside them, at any depth, shallowest
    first. A server whose parameter is a model (a pydantic model of the MCP
    Python SDK, a Go struct) reads the members of that model as surely as a
    top-level argument: ``{"req": {"sql": "DROP ..."}}`` runs the SQL."""
    queue: list[Any] = [arguments]
    i = 0
    while i < len(queue):
        node = queue[i]
        i += 1
        if type(node) is dict:
            yield node
            queue.extend(v for v in node.values() if type(v) is dict or type(v) is list)
        else:
            queue.extend(v for v in node if type(v) is dict or type(v) is list)


#: ``(name, snake_case name, value)`` of every member at any depth, shallowest first.
Members = list[tuple[str, str, Any]]


def members(arguments: dict[str, Any]) -> Members:
    """Every member of the arguments at any depth whose name could be one a rule reads."""
    return [
        (k, k if k.isascii() and _SNAKE_CHANGES.search(k) is None else _snake(k), v)
        for m in _mappings(arguments)
        for k, v in m.items()
        if isinstance(k, str) and len(k) <= _MAX_NAME
    ]


# An ASCII name without these is its own snake_case form.
_SNAKE_CHANGES = re.compile(r"[A-Z-]")


def _select(found: Members, names: frozenset[str]) -> list[tuple[str, Any]]:
    return [(k, v) for k, s, v in found if k in names or s in names]


def _named_strings(found: list[tuple[str, Any]]) -> list[str]:
    out: list[str] = []
    for _k, v in found:
        out.extend(_strings(v))
    return out


# ------------------------------------------------------------ shell splitting


def split_command(cmd: str) -> list[str]:
    """The simple commands bash would run for ``cmd``, as written, in the order
    bash starts them (a substitution's body before the command that uses it).

    Read by visor.policy.shell, which follows bash's own rules and refuses what
    it cannot read with certainty: then this returns the commands read before
    the doubt, and ``read_command(cmd).unreadable`` says why.
    """
    return [c.text for c in shell.read_command_cached(cmd).commands]


_QUOTES = re.compile(r"[\"'\\]")


def _variants(s: str) -> tuple[str, ...]:
    """The string and its form with shell quoting removed (``r''m`` runs ``rm``)."""
    d = _QUOTES.sub("", s)
    return (s,) if d == s else (s, d)


def split_sql(query: str) -> list[str]:
    """A rough split at every `;` outside quotes, comments or not: more texts for deny patterns
    only (a database's own statements are visor.policy.sql's)."""
    parts: list[str] = []
    cur: list[str] = []
    quote: str | None = None
    for c in query:
        if quote:
            cur.append(c)
            if c == quote:
                quote = None
        elif c in "'\"`":
            quote = c
            cur.append(c)
        elif c == ";":
            parts.append("".join(cur).strip())
            cur.clear()
        else:
            cur.append(c)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


_SQL_COMMENT = re.compile(r"/\*.*?\*/|--[^\n]*", re.S)


# ------------------------------------------------------------ per-call view


class CallView:
    """The call's arguments with the expensive splits done once per call,
    however many rules read them."""

    __slots__ = ("_commands", "_members", "_parsed", "_queries", "_readings", "_recipients", "args")

    def __init__(self, args: dict[str, Any]) -> None:
        self.args = args
        self._members: Members | None = None
        self._commands: list[Split] | None = None
        self._readings: list[CommandReading] | None = None
        self._queries: list[Split] | None = None
        self._recipients: list[str] | None = None
        self._parsed: dict[str, tuple[dst.Dest, ...]] = {}

    def parse(self, value: str) -> tuple[dst.Dest, ...]:
        """``destinations.parse``, memoised for this call (several checks read the same value)."""
        hit = self._parsed.get(value)
        if hit is None:
            hit = dst.parse_cached(value)
            self._parsed[value] = hit
        return hit

    def _all(self) -> Members:
        """Every member of the arguments at any depth: the walk done once per call."""
        if self._members is None:
            self._members = members(self.args)
        return self._members

    def named(self, names: frozenset[str]) -> list[tuple[str, Any]]:
        """``(name, value)`` of every member, at any depth, named one of ``names`` (as written
        or in snake_case)."""
        return _select(self._all(), names)

    def strings(self, names: frozenset[str]) -> list[str]:
        return _named_strings(self.named(names))

    def recipients(self) -> list[str]:
        if self._recipients is None:
            self._recipients = _recipient_values(self._all())
        return self._recipients

    def readings(self) -> list[CommandReading]:
        """How each command argument reads (see ``_command_split``)."""
        if self._readings is None:
            self._readings = [_command_reading(cmd) for cmd in self.strings(COMMAND_ARGS)]
        return self._readings

    def commands(self) -> list[Split]:
        """``(command, parts, texts a deny pattern must not match)`` per command argument."""
        if self._commands is None:
            self._commands = [r.split for r in self.readings()]
        return self._commands

    def unreadable(self) -> str | None:
        """Why the first command argument that cannot be read with certainty cannot, else None."""
        for r in self.readings():
            if r.unreadable is not None:
                return r.unreadable
        return None

    def runtime(self) -> str | None:
        """The first argument of a command argument whose value bash makes only when it runs."""
        for r in self.readings():
            if r.runtime is not None:
                return r.runtime
        return None

    def queries(self) -> list[Split]:
        if self._queries is None:
            self._queries = [_query_reading(q) for q in self.strings(QUERY_ARGS)]
        return self._queries


Split = tuple[str, tuple[str, ...], tuple[str, ...]]


class CommandReading(NamedTuple):
    command: str
    parts: tuple[str, ...]  # each simple command as written
    forms: tuple[tuple[str, ...], ...]  # per part: the texts an allow pattern may admit it by
    texts: tuple[str, ...]  # everything a deny pattern must not match
    unreadable: str | None  # why the command cannot be read with certainty
    split: Split  # (command, parts, texts): the shape the evaluator's screens read
    writes: tuple[str, ...] = ()  # files its redirections open for writing
    runtime: str | None = None  # an argument whose value exists only at run time (shell.Reading)


# Used only to give deny patterns more to look at when a command is unreadable
# (never to allow): the pieces between anything that may separate commands.
_ROUGH = re.compile(r"[;&|\n\r()`{}]|\$\(|[<>]\(")


def _command_split(cmd: str) -> CommandReading:
    reading = shell.read_command(cmd)
    parts = tuple(c.text for c in reading.commands)
    forms = tuple(tuple(dict.fromkeys((c.text, c.unquoted))) for c in reading.commands)
    pieces = [cmd, *parts, *(c.unquoted for c in reading.commands)]
    if reading.unreadable is not None:
        pieces.extend(p.strip() for p in _ROUGH.split(cmd) if p.strip())
    texts = tuple(dict.fromkeys(v for piece in pieces for v in _variants(piece)))
    return CommandReading(
        cmd, parts, forms, texts, reading.unreadable, (cmd, parts, texts), reading.writes, reading.runtime
    )


def _query_split(q: str) -> Split:
    """``(query, its statements under every reading, every text a deny pattern must not match)``
    (visor/policy/sql.py). The texts keep the old rough split too: a deny list only gets stricter."""
    reading = sql.read_query_cached(q)  # (the LIMIT reader reads the same query)
    stripped = _SQL_COMMENT.sub(" ", q)
    texts = dict.fromkeys(
        [q, *reading.codes, *reading.statements, stripped, *split_sql(q), *split_sql(stripped)]
    )
    return q, reading.statements, tuple(texts)


_cached_command_split = lru_cache(maxsize=1024)(_command_split)
_cached_query_split = lru_cache(maxsize=1024)(_query_split)

# Memoised for texts up to 1 KB: a split is a pure function of the text, and
# an agent sends the same commands and queries again.


def _command_reading(cmd: str) -> CommandReading:
    return _cached_command_split(cmd) if len(cmd) <= 1024 else _command_split(cmd)


def _query_reading(q: str) -> Split:
    return _cached_query_split(q) if len(q) <= 1024 else _query_split(q)


# ------------------------------------------------------------ checks


def deny_command_pattern(rule: Rule, view: CallView) -> str | None:
    for _cmd, _parts, texts in view.commands():
        for v in texts:
            for rx in rule.regexes:
                if rx.search(v):
                    return f"command matches deny pattern {rx.pattern!r}"
    return None


def allow_command_pattern(rule: Rule, view: CallView) -> str | None:
    for r in view.readings():
        if r.unreadable is not None:
            return f"command cannot be read with certainty: {r.unreadable}"
        if not r.parts:
            return "command is empty"
        for part, forms in zip(r.parts, r.forms, strict=True):
            # the part as written, or with quoting removed ('l's runs ls)
            if not any(rx.search(f) for f in forms for rx in rule.regexes):
                return f"command part {part[:80]!r} is not admitted by any allow pattern"
        for target in r.writes:
            # A pattern written for a command (`^echo\s`) admits it with any
            # redirection after it; writing a file is a second action, so it needs
            # a pattern of its own, matched against `> TARGET`.
            if target in _HARMLESS_WRITES:
                continue
            if not any(rx.search(f"> {target}") for rx in rule.regexes):
                return (
                    f"command writes {target[:80]!r} through a redirection, and no allow pattern "
                    f"admits '> {target[:80]}'"
                )
    return None


# Writing to these opens no file of the user's.
_HARMLESS_WRITES = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})


def deny_command_keyword(rule: Rule, view: CallView) -> str | None:
    for _cmd, _parts, texts in view.commands():
        for text in texts:
            folded = text.casefold()
            collapsed = " ".join(_QUOTES.sub("", folded).split())
            for kw in rule.keywords:
                if kw in folded or kw in collapsed:
                    return f"command contains denied keyword {kw!r}"
    return None


def deny_query_pattern(rule: Rule, view: CallView) -> str | None:
    for _q, _statements, texts in view.queries():
        for piece in texts:
            for rx in rule.regexes:
                if rx.search(piece):
                    return f"query matches deny pattern {rx.pattern!r}"
    return None


def allow_query_pattern(rule: Rule, view: CallView) -> str | None:
    for _q, statements, _texts in view.queries():
        if not statements:
            return "query is empty"
        for st in statements:
            if not any(rx.search(st) for rx in rule.regexes):
                return f"statement {st[:80]!r} is not admitted by any allow pattern"
    return None


def _recipient_values(found: Members) -> list[str]:
    out: list[str] = []
    for k, s, v in found:  # a recipient inside a model parameter is one too
        if k in RECIPIENT_ARGS or s in RECIPIENT_ARGS or dst.is_destination_name(k):
            out.extend(dst.iter_values(v))
    return out


def deny_recipient_domain(rule: Rule, view: CallView) -> str | None:
    for value in view.recipients():
        for d in view.parse(value):
            if d.domain and any(dst.domain_within(d.domain, p) for p in rule.domains):
                return f"recipient domain {d.domain!r} is denied"
            if d.kind == "opaque" and ("@" in d.value or (d.domain is None and urls.looks_like_url(d.value))):
                # an address, or a URL with no host any reader finds: what it reaches is unknown
                return f"recipient {d.value[:80]!r} cannot be parsed"
    return None


def allow_recipient_domain(rule: Rule, view: CallView) -> str | None:
    for value in view.recipients():
        for d in view.parse(value):
            if d.kind == "opaque" and ("@" in d.value or "." in d.value):
                return f"recipient {d.value[:80]!r} cannot be parsed"
            if d.domain and not any(dst.domain_matches(d.domain, p) for p in rule.domains):
                return f"recipient domain {d.domain!r} is not in the allowed list"
    return None


_REPO_URL = re.compile(r"^(?:https?://|git@|ssh://git@)[^/:]+[/:]", re.I)


OWNER_ARGS = frozenset({"owner", "org", "organization"})


def repo_names(args: dict[str, Any]) -> list[str]:
    """Every repository the call may name, ``owner/name`` (or a bare name when
    no owner is given). A bare repository name is read with every owner-like
    member of its own mapping: a server taking ``org`` ignores an ``owner``
    sent beside it, so ``{owner: me, org: evil, repo: x}`` names ``evil/x`` too."""
    out: list[str] = []
    for m in _mappings(args):
        owners = [
            o.strip().casefold()
            for k, o in m.items()
            if _is_named(k, OWNER_ARGS) and isinstance(o, str) and o.strip()
        ]
        for k, value in m.items():
            if not _is_named(k, REPO_ARGS):
                continue
            for text in _strings(value):
                v = _REPO_URL.sub("", text.strip()).removesuffix(".git").strip("/").casefold()
                if "/" not in v and owners:
                    out.extend(f"{o}/{v}" for o in owners)
                else:
                    out.append(v)
    return out


def allowed_repos(rule: Rule, view: CallView) -> str | None:
    args = view.args
    names = repo_names(args)
    if not names:
        return "no repository argument to check against allowed_repos"
    for name in names:
        if "/" not in name:
            return f"repository {name!r} has no owner; cannot check it against allowed_repos"
        if not any(rx.fullmatch(name) for rx in rule.repo_regexes):
            return f"repository {name!r} is not in allowed_repos"
    return None


def _number(v: object) -> int | float | None:
    """The largest number a lax server-side validator could read (``"+1_000"``, ``"1e5"``)."""
    n = readings.lax_number(v)
    if n is None or math.isinf(n):
        return n
    return int(n) if n == int(n) else n


def _content_size(v: object) -> int | float:
    """The bytes a server may write for a content argument: the UTF-8 length
    of a string; for anything else (a list of lines, an object, numbers) the
    length of its JSON text, which is no shorter than the strings and items
    in it; unbounded when it cannot be measured."""
    if isinstance(v, str):
        return len(v.encode("utf-8", "surrogatepass"))
    try:
        return len(json.dumps(v, ensure_ascii=True, separators=(",", ":")))
    except (TypeError, ValueError, RecursionError):
        return math.inf


def max_file_size(rule: Rule, view: CallView) -> str | None:
    assert rule.limit is not None
    for k, v in view.named(_SIZED_ARGS):
        size = _number(v) if (k in SIZE_ARGS or _snake(k) in SIZE_ARGS) else _content_size(v)
        if size is not None and size > rule.limit:
            return f"{k} is {size} bytes, over the limit of {rule.limit}"
    return None


_SIZED_ARGS = SIZE_ARGS | CONTENT_ARGS


def max_result_rows(rule: Rule, view: CallView) -> str | None:
    assert rule.limit is not None
    for k, v in view.named(ROW_ARGS):
        reason = _row_count_problem(k, v, rule.limit)
        if reason is not None:
            return reason
    for q in view.strings(QUERY_ARGS):
        reason = rowcount.query_rows_problem(q, rule.limit)
        if reason is not None:
            return reason
    return None


def _row_count_problem(name: str, value: object, limit: int) -> str | None:
    """Why a row-count argument may ask for more than ``limit`` rows. Many APIs read a null,
    zero or negative count, or a word such as ``"all"``, as no limit at all (a Python tool's
    ``limit: int | None = 100`` given ``null``; SQLite's ``LIMIT -1``)."""
    if isinstance(value, bool):
        return None  # a flag (`"count": true`), or one row to a lax validator
    if value is None:
        return f"{name} is null, which a server may read as no row limit"
    least = readings.lax_number_least(value)
    most = _number(value)
    if least is None or most is None:
        return f"{name} is not a row count that can be read with certainty"
    if least <= 0:
        return f"{name} may be read as {least:g} rows, which a server may read as no row limit"
    if most > limit:
        return f"{name} asks for {most} rows, over the limit of {limit}"
    return None


def max_export_rows(rule: Rule, view: CallView) -> str | None:
    """mcp-visor's ``max_export_rows``: the same check as ``max_result_rows``
    (internal/policy/engine.go evaluates both types in one case), named for
    its own rule in the reason."""
    reason = max_result_rows(rule, view)
    return None if reason is None else f"{reason} (max_export_rows)"


# ------------------------------------------------------------ path checks

#: ``(argument, raw value, normalised forms)`` of one path-like argument.
PathValue = tuple[str, str, tuple[str, ...]]


def deny_path(rule: Rule, found: Sequence[PathValue]) -> str | None:
    for name, raw, forms in found:
        # any reading, compared as a case- and NFC/NFD-insensitive file system would
        for candidate in (raw.strip(), *forms):
            if any(g.match_folded(candidate) for g in rule.globs):
                return f"argument {name!r} ({forms[0]}) matches a deny_path pattern"
    return None


def allow_path(rule: Rule, found: Sequence[PathValue]) -> str | None:
    for name, _raw, forms in found:
        for form in forms:
            if not any(g.match(form) for g in rule.globs):
                return f"argument {name!r} ({form}) is outside every allow_path pattern"
    return None
