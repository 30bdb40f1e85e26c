"""`max_result_rows` against the real SQLite: a query Visor lets through returns no more rows
than the limit, however its bound is spelled, nested, commented or left out.

Queries are composed from pieces (subqueries, CTEs, unions, joins, comments, bounds of every
spelling SQLite reads) and run on a 5,000-row table; whatever Visor allows under a limit of 100
must come back with at most 100 rows. Spellings SQLite does not read (TOP, FETCH FIRST) are held
to their counts by the pure tests below.
"""

from __future__ import annotations

import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from visor.policy.rowcount import query_rows_problem

LIMIT = 100


@pytest.fixture(scope="module")
def db() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (x INTEGER, s TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"row {i}") for i in range(5000)])
    return conn


def rows(db: sqlite3.Connection, query: str) -> int | None:
    try:
        return len(db.execute(query).fetchall())
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError):
        return None  # SQLite refused it: no rows reach anybody


_BOUNDS = st.sampled_from(
    [
        "",
        " LIMIT 5",
        " LIMIT 100",
        " LIMIT 101",
        " LIMIT 4000",
        " LIMIT 10, 90",
        " LIMIT 10, 4000",
        " LIMIT 50 OFFSET 10",
        " LIMIT -1",
        " LIMIT 0x10",
        " LIMIT (50)",
        " LIMIT 40*100",
        " LIMIT/**/50",
        " LIMIT '50'",
        " -- LIMIT 5",
        " /* LIMIT 5 */",
        " LIMIT 5 -- ",
        "\nLIMIT 5",
        " limit\t5",
        " LIMIT 5;",
        " LIMIT 5; SELECT 1",
    ]
)
_SOURCES = st.sampled_from(
    [
        "t",
        "t AS a",
        "(SELECT * FROM t LIMIT 5)",
        "(SELECT * FROM t)",
        "t, (SELECT 1 LIMIT 1)",
        "t JOIN t AS u ON u.x = t.x",
        "[t]",
        '"t"',
    ]
)
_FILTERS = st.sampled_from(
    [
        "",
        " WHERE x < 3",
        " WHERE EXISTS (SELECT 1 LIMIT 5)",
        " WHERE x IN (SELECT x FROM t LIMIT 5)",
        " WHERE s <> 'LIMIT 5'",
        " WHERE s <> '; LIMIT 5'",
        " ORDER BY x",
    ]
)


@st.composite
def queries(draw: st.DrawFn) -> str:
    body = f"SELECT * FROM {draw(_SOURCES)}{draw(_FILTERS)}"
    shape = draw(st.sampled_from(["plain", "union", "cte", "nested"]))
    if shape == "union":
        body = f"{body} UNION ALL SELECT * FROM {draw(_SOURCES)}"
    elif shape == "cte":
        body = f"WITH c AS (SELECT * FROM t{draw(_BOUNDS).rstrip(';')}) SELECT * FROM c{draw(_FILTERS)}"
    elif shape == "nested":
        body = f"SELECT * FROM ({body}{draw(_BOUNDS).split(';')[0]})"
    return body + draw(_BOUNDS)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=queries())
def test_what_visor_allows_returns_at_most_the_limit(db: sqlite3.Connection, query: str) -> None:
    if query_rows_problem(query, LIMIT) is None:
        got = rows(db, query)
        assert got is None or got <= LIMIT, (query, got)


@pytest.mark.parametrize(
    "query",
    [
        "SELECT * FROM t LIMIT 100",
        "SELECT * FROM t WHERE x < 3 LIMIT 5",
        "SELECT * FROM t LIMIT 10, 90",
        "SELECT * FROM t LIMIT 50 OFFSET 4000",
        "SELECT * FROM t UNION ALL SELECT * FROM t LIMIT 100",
        "WITH c AS (SELECT * FROM t) SELECT * FROM c LIMIT 100",
        "SELECT * FROM (SELECT * FROM t) LIMIT 7",
        "SELECT * FROM t WHERE s = 'a;b' LIMIT 3",
        "select x from t order by x desc limit 1",
        "INSERT INTO t VALUES (1, 'x')",
        "EXPLAIN SELECT * FROM t",
    ],
)
def test_bounded_queries_pass_and_sqlite_agrees(db: sqlite3.Connection, query: str) -> None:
    assert query_rows_problem(query, LIMIT) is None
    got = rows(db, query)
    assert got is not None and got <= LIMIT, (query, got)


@pytest.mark.parametrize(
    "query",
    [
        "SELECT * FROM t",
        "SELECT * FROM t -- LIMIT 5",
        "SELECT * FROM t WHERE x IN (SELECT x FROM t LIMIT 5000)",
        "SELECT * FROM t WHERE EXISTS (SELECT 1 LIMIT 5)",
        "WITH c AS (SELECT 1 LIMIT 1) SELECT * FROM t, c",
        "SELECT * FROM (SELECT * FROM t LIMIT 5) UNION ALL SELECT * FROM t",
        "SELECT * FROM t WHERE s <> 'LIMIT 5'",
        "SELECT * FROM t LIMIT 5; SELECT * FROM t",
        "INSERT INTO t SELECT * FROM t RETURNING *",
        "VALUES (1), (2)",
    ],
)
def test_unbounded_queries_are_denied(query: str) -> None:
    assert query_rows_problem(query, LIMIT) is not None


@pytest.mark.parametrize(
    ("query", "denied"),
    [
        ("SELECT TOP 100 * FROM t", False),
        ("SELECT TOP (100) * FROM t", False),
        ("SELECT DISTINCT TOP 5 x FROM t", False),
        ("SELECT TOP 101 * FROM t", True),
        ("SELECT TOP (@n) * FROM t", True),
        ("SELECT TOP 5 PERCENT * FROM t", True),
        ("SELECT TOP 5 WITH TIES * FROM t ORDER BY x", True),
        ("SELECT TOP 5 * FROM t UNION ALL SELECT * FROM t", True),
        ("SELECT * FROM t ORDER BY x OFFSET 0 ROWS FETCH NEXT 100 ROWS ONLY", False),
        ("SELECT * FROM t FETCH FIRST ROW ONLY", False),
        ("SELECT * FROM t FETCH FIRST 101 ROWS ONLY", True),
        ("SELECT * FROM t FETCH FIRST 5 ROWS WITH TIES", True),
        ("SELECT * FROM t FETCH FIRST (5) ROWS ONLY", True),
        ("SELECT * FROM t WHERE x IN (SELECT TOP 5 x FROM t)", True),
        ("SELECT FIRST 10 * FROM t", False),
        ("SELECT SKIP 5 FIRST 500 * FROM t", True),
        ("SELECT first, top FROM t LIMIT 5", False),
        ("SELECT first FROM t", True),
        ("FETCH ALL FROM c", True),
        ("EXEC dbo.export", True),
        ("COPY t TO STDOUT", True),
        ("TABLE t", True),
        ("TABLE t LIMIT 5", False),
        # MySQL's executable comment is code to MySQL only: the other readings have no bound
        ("SELECT * FROM t /*!LIMIT 5*/", True),
        ("SELECT * FROM t LIMIT 5 /*!0, 4000*/", True),
    ],
)
def test_every_spelling_of_a_bound_is_held_to_its_count(query: str, denied: bool) -> None:
    assert (query_rows_problem(query, LIMIT) is not None) is denied, query_rows_problem(query, LIMIT)


@pytest.mark.parametrize(
    "text",
    ["best restaurants near me", "with love", "call me maybe", "fetch the weather", "table tennis results"],
)
def test_a_search_query_of_words_is_not_read_as_sql(text: str) -> None:
    assert query_rows_problem(text, LIMIT) is None


def test_a_long_query_is_read_as_a_short_one_is() -> None:
    # past the cached length (a huge query is read afresh, never kept)
    padding = " " * 5000
    assert query_rows_problem("SELECT * FROM t" + padding, LIMIT) is not None
    assert query_rows_problem("SELECT * FROM t LIMIT 5" + padding, LIMIT) is None
