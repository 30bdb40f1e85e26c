"""How many rows a query may return, as far as that can be read with certainty.

`max_result_rows` holds a query to a number of rows. Databases spell the bound four ways:
`LIMIT n` (and MySQL's and SQLite's `LIMIT offset, n`), SQL Server's `SELECT TOP n`, the
standard's `FETCH FIRST n ROWS ONLY`, and Informix's and Firebird's `SELECT FIRST n`. Every count
of every spelling, at any depth, must be a plain number within the limit: one that a database
computes (`LIMIT 0x10`, `TOP (@n)`, `LIMIT -1`, `LIMIT ALL`, `TOP 5 PERCENT`, `WITH TIES`) is
not certain.

A count deep inside a query bounds nothing the client receives: `SELECT * FROM t WHERE id IN
(SELECT id FROM u LIMIT 5)` returns every row of `t`. So a statement that returns rows (it starts
with `SELECT`, `WITH`, `VALUES`, `TABLE`, `(`, `CALL`, `EXEC`, `COPY` or `FETCH`, or has a
`RETURNING` or `OUTPUT` clause) must carry a bound at its own top level, outside every
parenthesis: a `LIMIT` or `FETCH` after its last `UNION`, `INTERSECT` or `EXCEPT`, or a `TOP` or
`FIRST` on its only top-level `SELECT`. Statements that return no rows (`INSERT`, `UPDATE`,
`CREATE`, ...) and those that return a schema's own rows (`EXPLAIN`, `SHOW`, `DESCRIBE`,
`PRAGMA`) need none; a text whose first word is none of these is not read as SQL (a search
tool's `query` of words). Every reading of quotes and comments (`visor.policy.sql`) is checked.

Pure: no I/O.
"""

from __future__ import annotations

import re
from functools import lru_cache

from visor.policy import sql

__all__ = ["query_rows_problem", "sql_limits"]

_SQL_LIMIT = re.compile(r"\blimit\b", re.I)
# A count as a DB reads it: decimal digits, a second one after a comma (MySQL's and
# SQLite's `LIMIT offset, count`), then the end, `;`, `)` or a word (OFFSET).
_SQL_COUNT = re.compile(r"\s+(\d+)(?![\w.])(?:\s*,\s*(\d+)(?![\w.]))?(?=\s*(?:$|[;)]|[A-Za-z]))")
# A plain word after `limit` in text that is not SQL ("the speed limit signs"); a word that
# starts an expression (`ALL`, `NULL`, `CASE`, a function call, `x'..'`) is not one.
_SQL_WORD = re.compile(r"\s+([A-Za-z_]\w*)(?!\s*[('\".:\[]|\w)")
# What cannot start a count: the end, or punctuation no expression starts with (`.5e4` can).
_SQL_NOT_CLAUSE = re.compile(r"\s*(?:$|[,!\]}]|\.(?!\d))")
_SQL_EXPRESSION_WORDS = frozenset(
    {"all", "null", "case", "cast", "not", "exists", "select", "values", "with", "true", "false", "interval"}
)


def sql_limits(query: str) -> list[int | None]:
    """The row counts of every ``LIMIT`` in ``query`` under every reading of
    its quoting and comments; None for a ``LIMIT`` whose count is not a plain
    number (``LIMIT 0x1000``, ``LIMIT -1``, ``LIMIT (4000)``, ``LIMIT 40*100``,
    ``LIMIT ALL``): a DB computes it, Visor cannot read it with certainty."""
    out: list[int | None] = []
    for code in sql.read_query_cached(query).blanked:
        for m in _SQL_LIMIT.finditer(code):
            count = _SQL_COUNT.match(code, m.end())
            if count is not None:
                out.extend(int(g) for g in count.groups() if g is not None)
                continue
            word = _SQL_WORD.match(code, m.end())
            if word is not None and word.group(1).casefold() not in _SQL_EXPRESSION_WORDS:
                continue  # "limit" as a word, not a clause
            if _SQL_NOT_CLAUSE.match(code, m.end()):
                continue  # "limit" at the end or before punctuation: no count, no clause
            out.append(None)
    return out


# A statement's tokens: a word or number, or one other character (strings are already emptied).
_TOKEN = re.compile(r"[A-Za-z0-9_$@#.]+|[^\sA-Za-z0-9_$@#.]")
_NUMBER = re.compile(r"\d+")

_RETURNS_NO_ROWS = frozenset(
    {
        "insert", "update", "delete", "merge", "replace", "upsert", "create", "drop", "alter",
        "truncate", "rename", "grant", "revoke", "begin", "start", "commit", "rollback", "end",
        "savepoint", "release", "set", "use", "analyze", "vacuum", "reindex", "comment", "lock",
        "attach", "detach", "refresh", "cluster", "discard", "reset", "deallocate", "listen",
        "notify", "unlisten", "checkpoint", "do", "declare", "prepare",
    }
)  # fmt: skip
_RETURNING = frozenset({"returning", "output"})
_SET_OPERATORS = frozenset({"union", "intersect", "except", "minus"})


class _Uncertain(Exception):
    """A row count a database computes, or a clause Visor cannot read."""


def query_rows_problem(query: str, limit: int) -> str | None:
    """Why ``query`` may return more than ``limit`` rows, or None when every statement of every
    reading is bounded within it (or returns no rows). Short queries are answered from a cache
    (a long one must not pin memory)."""
    return _problem_cached(query, limit) if len(query) <= 4096 else _problem(query, limit)


def _problem(query: str, limit: int) -> str | None:
    for count in sql_limits(query):
        if count is None:
            return "query has a LIMIT whose row count cannot be read with certainty"
        if count > limit:
            return f"query LIMIT {count} is over the limit of {limit} rows"
    for code in sql.read_query_cached(query).blanked:
        for statement in code.split(";"):
            tokens = [(t.casefold(), d) for t, d in _depths(_TOKEN.findall(statement))]
            if not tokens:
                continue
            try:
                counts, bounded = _bounds(tokens)
            except _Uncertain as exc:
                return f"query has a {exc} whose row count cannot be read with certainty"
            for clause, count in counts:
                if count > limit:
                    return f"query {clause} {count} is over the limit of {limit} rows"
            if not bounded and _returns_rows(tokens):
                return (
                    f"query statement {tokens[0][0].upper()!s} ... has no row limit of its own "
                    f"(LIMIT, FETCH FIRST, TOP) outside its parentheses; add one of at most {limit} rows"
                )
    return None


def _depths(tokens: list[str]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    depth = 0
    for t in tokens:
        if t == ")":
            depth = max(depth - 1, 0)
        out.append((t, depth))
        if t == "(":
            depth += 1
    return out


def _returns_rows(tokens: list[tuple[str, int]]) -> bool:
    """Whether the statement is SQL that returns rows. Words that also start sentences are read
    as SQL only in SQL's shape (`WITH x AS (`, `VALUES (`, `CALL p(`, `FETCH ... FROM c`), so a
    search tool's `with love` is not held to a row limit it cannot carry."""
    first = tokens[0][0]
    nxt = _word(tokens, 1)
    words = [t for t, d in tokens if d == 0]
    if first in ("select", "(", "exec", "execute", "copy"):
        return True
    if first == "with":
        return nxt == "recursive" or _word(tokens, 2) in ("as", "(")
    if first == "values":
        return nxt == "("
    if first == "table":  # PostgreSQL's `TABLE t`, alone or before its LIMIT
        return len(tokens) == 2 or _word(tokens, 2) in ("limit", "offset", "order", "fetch")
    if first == "call":
        return _word(tokens, 2) == "("
    if first == "fetch":
        return "from" in words or "in" in words
    return first in _RETURNS_NO_ROWS and any(t in _RETURNING and d == 0 for t, d in tokens)


def _bounds(tokens: list[tuple[str, int]]) -> tuple[list[tuple[str, int]], bool]:
    """Every TOP, FIRST and FETCH count in the statement (raising `_Uncertain` for one that is
    not a plain number), and whether a bound holds at its top level."""
    counts: list[tuple[str, int]] = []
    top_level_selects = sum(1 for t, d in tokens if t == "select" and d == 0)
    last_set_operator = max(
        (i for i, (t, d) in enumerate(tokens) if t in _SET_OPERATORS and d == 0), default=-1
    )
    bounded = False
    for i, (t, d) in enumerate(tokens):
        if t == "limit" and d == 0 and i > last_set_operator and _plain_after(tokens, i + 1):
            bounded = True  # its count is read (and held to the limit) by sql_limits
        elif t == "fetch" and _word(tokens, i + 1) in ("first", "next"):
            counts.append(("FETCH FIRST", _fetch_count(tokens, i + 2)))
            bounded = bounded or (d == 0 and i > last_set_operator)
        elif t in ("top", "first") and _after_select(tokens, i):
            selected = _select_count(tokens, i + 1, t)
            if selected is None:
                continue  # a column named `top` or `first`, not a clause
            counts.append((t.upper(), selected))
            bounded = bounded or (d == 0 and top_level_selects == 1 and last_set_operator < 0)
    return counts, bounded


def _word(tokens: list[tuple[str, int]], i: int) -> str | None:
    return tokens[i][0] if i < len(tokens) else None


def _plain_after(tokens: list[tuple[str, int]], i: int) -> bool:
    word = _word(tokens, i)
    return word is not None and _NUMBER.fullmatch(word) is not None


def _after_select(tokens: list[tuple[str, int]], i: int) -> bool:
    """Whether the word at ``i`` directly follows a SELECT (past DISTINCT, ALL, or Informix's
    `SKIP n`)."""
    j = i - 1
    while j >= 0 and tokens[j][0] in ("distinct", "all"):
        j -= 1
    if j >= 1 and tokens[j - 1][0] == "skip":
        j -= 2
    return j >= 0 and tokens[j][0] == "select"


def _select_count(tokens: list[tuple[str, int]], i: int, clause: str) -> int | None:
    """The count of `TOP n`, `TOP (n)` or `FIRST n`; None where the word is a column's name."""
    word = _word(tokens, i)
    after = i + 1
    if word == "(" and clause == "top":
        word, after = _word(tokens, i + 1), i + 2
        if word is None or not _NUMBER.fullmatch(word) or _word(tokens, after) != ")":
            raise _Uncertain("TOP (...)")
        after += 1
    elif word is None or not _NUMBER.fullmatch(word):
        return None  # `SELECT top FROM t`: a column; a count a DB computes is never bare here
    if _word(tokens, after) == "percent":
        raise _Uncertain(f"{clause.upper()} {word} PERCENT")
    if _word(tokens, after) == "with":
        raise _Uncertain(f"{clause.upper()} {word} WITH TIES")
    return int(word)


def _fetch_count(tokens: list[tuple[str, int]], i: int) -> int:
    """The count of `FETCH FIRST [n] ROW[S] ONLY` (none written is one row)."""
    word = _word(tokens, i)
    if word in ("row", "rows"):
        count, after = 1, i + 1
    elif word is not None and _NUMBER.fullmatch(word) and _word(tokens, i + 1) in ("row", "rows"):
        count, after = int(word), i + 2
    else:
        raise _Uncertain("FETCH FIRST")
    if _word(tokens, after) != "only":
        raise _Uncertain("FETCH FIRST ... WITH TIES")
    return count


_problem_cached = lru_cache(maxsize=1024)(_problem)
