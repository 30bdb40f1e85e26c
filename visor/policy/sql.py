"""How a database reads a query string: its statements under every reading of quotes and comments.

Databases disagree on what starts a comment and what ends a string. `--` and `/* */` are comments
to all of them, and a quote inside a comment quotes nothing: `SELECT 1 -- it's` then `; DROP
TABLE t` on the next line is two statements to every database. `#` starts a comment in MySQL and
is an operator in PostgreSQL; to MySQL `--` is a comment only before a blank (`1--1` is 2); `\\'` escapes a quote inside a MySQL string and ends a standard one;
`/*! ... */` (and `/*!50000 ... */`) is code to MySQL and a comment to the rest; PostgreSQL nests
block comments and has dollar quotes (`$$ ... $$`, `$tag$ ... $tag$`) and `E'...'` strings with
backslash escapes; SQLite and SQL Server quote a name in brackets (`[x';]`, where the quote quotes
nothing).

Visor does not know which database a tool talks to, so a query is read under each of these
readings (`READINGS`), and a rule holds for all of them: a deny pattern must match no statement
and no text of any reading, an allow pattern must admit every statement of every reading. A query
that is unambiguous reads the same under all of them and costs one scan per reading.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

__all__ = ["READINGS", "Dialect", "QueryReading", "read_query"]


@dataclass(frozen=True, slots=True)
class Dialect:
    """One database's rules for quotes and comments."""

    name: str
    hash_comments: bool = False  # `#` to the end of the line (MySQL)
    # `--` starts a comment only before a blank or control character: `1--1` is 2 (MySQL)
    dash_needs_blank: bool = False
    cr_ends_line_comments: bool = False  # a carriage return ends `--` and `#` comments (MySQL)
    backslash_escapes: bool = False  # `\\x` inside '...' and "..." is one escaped character (MySQL)
    executable_comments: bool = False  # `/*! ... */` is code (MySQL)
    nested_comments: bool = False  # `/* /* */ */` is one comment (PostgreSQL)
    dollar_quotes: bool = False  # `$tag$ ... $tag$` (PostgreSQL)
    e_strings: bool = False  # `E'...'` with backslash escapes (PostgreSQL)
    bracket_identifiers: bool = False  # `[a';b]` is one name (SQLite, SQL Server)


READINGS = (
    Dialect("standard"),
    Dialect(
        "mysql",
        hash_comments=True,
        dash_needs_blank=True,
        cr_ends_line_comments=True,
        backslash_escapes=True,
        executable_comments=True,
    ),
    Dialect("postgresql", nested_comments=True, dollar_quotes=True, e_strings=True),
    Dialect("sqlite", bracket_identifiers=True),
    Dialect("sqlserver", bracket_identifiers=True, nested_comments=True),
)


@dataclass(frozen=True, slots=True)
class QueryReading:
    """A query as every reading sees it."""

    # every statement of every reading (comments removed, `;` removed, blanks trimmed), each once
    statements: tuple[str, ...]
    # each reading's code: the query with its comments replaced by a blank, strings kept
    codes: tuple[str, ...]
    # each reading's code with every string and quoted name emptied too (`''`, `[]`): where a
    # keyword is code and not text (`LIMIT` in `SELECT 'no limit 5'` is none)
    blanked: tuple[str, ...]


def read_query(query: str) -> QueryReading:
    statements: dict[str, None] = {}
    codes: dict[str, None] = {}
    blanked: dict[str, None] = {}
    for dialect in READINGS:
        code, blank, parts = _read(query, dialect)
        codes[code] = None
        blanked[blank] = None
        for part in parts:
            statements[part] = None
    return QueryReading(tuple(statements), tuple(codes), tuple(blanked))


_read_query_lru = lru_cache(maxsize=1024)(read_query)
# Only short queries are cached: a reading holds several copies of its query, and a thousand
# huge ones kept would pin memory a client chose.
_CACHED_QUERY_CHARS = 4096


def read_query_cached(query: str) -> QueryReading:
    return _read_query_lru(query) if len(query) <= _CACHED_QUERY_CHARS else read_query(query)


def _read(q: str, d: Dialect) -> tuple[str, str, list[str]]:
    """(the code of ``q`` under ``d``, the same with its strings emptied, its statements)."""
    out: list[str] = []  # code characters, comments replaced by a blank
    blank: list[str] = []  # the same, each string and quoted name emptied
    statements: list[str] = []
    start = 0  # where the current statement begins in ``out``
    i, n = 0, len(q)
    in_code_comment = False  # inside MySQL's `/*! ... */`: code until the `*/`
    while i < n:
        c = q[i]
        nx = q[i + 1] if i + 1 < n else ""
        dash = c == "-" and nx == "-" and not (d.dash_needs_blank and i + 2 < n and q[i + 2] > " ")
        if dash or (c == "#" and d.hash_comments):  # a comment to the end of the line
            ends = [
                j for j in (q.find("\n", i), q.find("\r", i) if d.cr_ends_line_comments else -1) if j >= 0
            ]
            i = min(ends) if ends else n
            out.append(" ")
            blank.append(" ")
        elif c == "/" and nx == "*":
            if d.executable_comments and q.startswith("!", i + 2) and not in_code_comment:
                i += 3
                while i < n and q[i].isdigit():  # the version: /*!50000
                    i += 1
                in_code_comment = True
                out.append(" ")
                blank.append(" ")
                continue
            i = _block_comment_end(q, i + 2, d.nested_comments)
            out.append(" ")
            blank.append(" ")
        elif c == "*" and nx == "/" and in_code_comment:
            in_code_comment = False
            i += 2
            out.append(" ")
            blank.append(" ")
        elif c in "'\"`":
            escapes = d.backslash_escapes and c != "`"
            j = _quote_end(q, i + 1, c, escapes)
            out.append(q[i:j])
            blank.append(c + c)
            i = j
        elif c == "[" and d.bracket_identifiers:
            j = _quote_end(q, i + 1, "]", False)
            out.append(q[i:j])
            blank.append("[]")
            i = j
        elif d.e_strings and c in "Ee" and nx == "'" and (i == 0 or not _word_char(q[i - 1])):
            j = _quote_end(q, i + 2, "'", True)
            out.append(q[i:j])
            blank.append("''")
            i = j
        elif d.dollar_quotes and c == "$" and (i == 0 or not _word_char(q[i - 1])):
            tag_end = _dollar_tag_end(q, i)
            if tag_end is None:
                out.append(c)
                blank.append(c)
                i += 1
                continue
            tag = q[i:tag_end]
            close = q.find(tag, tag_end)
            j = n if close == -1 else close + len(tag)
            out.append(q[i:j])
            blank.append("''")
            i = j
        elif c == ";":
            statements.append("".join(out[start:]).strip())
            out.append(";")
            blank.append(";")
            start = len(out)
            i += 1
        else:
            out.append(c)
            blank.append(c)
            i += 1
    statements.append("".join(out[start:]).strip())
    return "".join(out), "".join(blank), [s for s in statements if s]


def _block_comment_end(q: str, i: int, nested: bool) -> int:
    """The index after the `*/` that closes a comment whose body starts at ``i`` (the end of
    ``q`` when none does: the rest is comment)."""
    depth = 1
    n = len(q)
    while i < n:
        if q.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0 or not nested:
                return i
        elif nested and q.startswith("/*", i):
            depth += 1
            i += 2
        else:
            i += 1
    return n


def _quote_end(q: str, i: int, quote: str, escapes: bool) -> int:
    """The index after the quote that closes a string whose body starts at ``i``: a doubled quote
    is one quote character, and with ``escapes`` so is a backslash and what follows it. The end of
    ``q`` when nothing closes it."""
    n = len(q)
    while i < n:
        c = q[i]
        if escapes and c == "\\":
            i += 2
        elif c == quote:
            if q.startswith(quote, i + 1):
                i += 2
            else:
                return i + 1
        else:
            i += 1
    return n


def _dollar_tag_end(q: str, i: int) -> int | None:
    """The index after a dollar-quote tag at ``i`` (`$$`, `$tag$`), or None if there is none."""
    j = i + 1
    n = len(q)
    if j < n and (q[j].isalpha() or q[j] == "_"):
        while j < n and (_word_char(q[j])):
            j += 1
    if j < n and q[j] == "$":
        return j + 1
    return None


def _word_char(c: str) -> bool:
    return c.isalnum() or c == "_"
