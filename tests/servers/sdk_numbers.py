"""An SDK server whose tools take model-typed, list-typed and SQL parameters.

The real reader for tests/security/test_redteam_numbers.py: the MCP Python
SDK validates a parameter typed as a pydantic model from a nested object (or
from a JSON string, ``pre_parse_json``), a ``list[str]`` content from a list,
and runs SQL as SQLite reads it. Every tool appends what it actually did to
the file named by ``NUMBERS_LOG`` (one JSON object a line), so a test can
tell what the server received.
"""

from __future__ import annotations

import json
import os
import sqlite3

from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel

app = MCPServer("visor-numbers-server")

_db = sqlite3.connect(":memory:", check_same_thread=False)
_db.execute("CREATE TABLE t (x INTEGER)")
_db.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(5000)])


def _record(tool: str, **fields: object) -> None:
    with open(os.environ["NUMBERS_LOG"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"tool": tool, **fields}) + "\n")


class Search(BaseModel):
    term: str = ""
    limit: int = 10


class Query(BaseModel):
    sql: str


class Command(BaseModel):
    command: str


class Message(BaseModel):
    to: str
    body: str = ""


@app.tool()
def search(params: Search) -> str:
    """Search; params.limit rows."""
    _record("search", limit=params.limit)
    return f"rows={params.limit}"


@app.tool()
def run_sql(query: str) -> str:
    """Run a query; say how many rows it returned."""
    rows = len(_db.execute(query).fetchall())
    _record("run_sql", rows=rows)
    return f"rows={rows}"


@app.tool()
def list_rows(limit: int | None = 100) -> str:
    """List rows of t; a limit of null or below one lists them all, as many APIs read it."""
    rows = len(
        _db.execute("SELECT * FROM t LIMIT ?", (-1 if limit is None or limit < 1 else limit,)).fetchall()
    )
    _record("list_rows", rows=rows)
    return f"rows={rows}"


@app.tool()
def run_sql_model(req: Query) -> str:
    """Run req.sql; say how many rows it returned."""
    rows = len(_db.execute(req.sql).fetchall())
    _record("run_sql_model", rows=rows, sql=req.sql)
    return f"rows={rows}"


@app.tool()
def write_lines(path: str, content: list[str]) -> str:
    """Write the lines (not really: say how many bytes)."""
    size = len("\n".join(content).encode())
    _record("write_lines", size=size)
    return f"size={size}"


@app.tool()
def run_command(req: Command) -> str:
    """Run req.command (not really: record it)."""
    _record("run_command", command=req.command)
    return f"ran {req.command}"


@app.tool()
def send_message(message: Message) -> str:
    """Send message.body to message.to (not really: record it)."""
    _record("send_message", to=message.to)
    return f"sent to {message.to}"


@app.tool()
def open_issue(org: str, repo: str, title: str = "") -> str:
    """Open an issue in org/repo (not really: record it)."""
    _record("open_issue", repository=f"{org}/{repo}")
    return f"opened in {org}/{repo}"


if __name__ == "__main__":
    app.run()
