"""Red team: numbers, types and argument shapes, against the real MCP Python SDK.

Each call below is first sent to the SDK server directly (tests/servers/sdk_numbers.py),
which shows what the server actually reads and does: a row count, a write size, a
query, a command, a recipient or a repository the policy forbids. The same call then
goes through a real ``visor run`` and must be denied, with nothing reaching the server.

* A parameter typed as a pydantic model is an object whose members the server reads as
  surely as top-level arguments: ``{"params": {"limit": 100000}}``, ``{"req": {"sql":
  "DROP TABLE t"}}``, ``{"message": {"to": "eve@evil.example"}}``. Every argument rule
  reads the members it names at any depth.
* ``content`` typed ``list[str]`` is written as lines: its size is not 0.
* SQLite reads ``LIMIT 10, 4000`` (offset, count), ``LIMIT 0xfff``, ``LIMIT/**/4000``,
  ``LIMIT (4000)``, ``LIMIT 40*100``, ``LIMIT "4000"`` and ``LIMIT -1`` (no limit).
* A server taking ``org`` ignores an ``owner`` sent beside it.
* A query bounded only inside a subquery, a CTE or a comment returns every row; a row count of
  null, zero or below lists every row to a server that reads it as no limit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import INITIALIZED, VisorProcess, initialize

SERVER = [sys.executable, str(Path(__file__).parents[1] / "servers" / "sdk_numbers.py")]

POLICY = """\
version: "1.0"
default_action: deny
settings:
  packs: []
servers:
  - name: "numbers"
    allowed: true
    tools:
      - name: "search"
        allowed: true
        rules: [{type: max_result_rows, rows: 100}]
      - name: "run_sql"
        allowed: true
        rules: [{type: max_result_rows, rows: 100}]
      - name: "list_rows"
        allowed: true
        rules: [{type: max_result_rows, rows: 100}]
      - name: "run_sql_model"
        allowed: true
        rules:
          - {type: max_result_rows, rows: 100}
          - {type: deny_query_pattern, patterns: ["\\\\bdrop\\\\b"]}
      - name: "write_lines"
        allowed: true
        rules: [{type: max_file_size, bytes: 1000}]
      - name: "run_command"
        allowed: true
        rules: [{type: allow_command_pattern, patterns: ["^ls\\\\s"]}]
      - name: "send_message"
        allowed: true
        rules: [{type: allow_recipient_domain, domains: ["corp.example"]}]
      - name: "open_issue"
        allowed: true
        rules: [{type: allowed_repos, repos: ["me/*"]}]
"""


LINES = ["A" * 700, "B" * 700]

# (tool, arguments, what the server records when it runs the call)
ATTACKS: list[tuple[str, dict, dict]] = [
    ("search", {"params": {"term": "x", "limit": 100000}}, {"tool": "search", "limit": 100000}),
    ("search", {"params": json.dumps({"limit": 100000})}, {"tool": "search", "limit": 100000}),
    ("search", {"params": {"limit": "1_000_00"}}, {"tool": "search", "limit": 100000}),
    ("run_sql", {"query": "SELECT * FROM t LIMIT 10, 4000"}, {"tool": "run_sql", "rows": 4000}),
    ("run_sql", {"query": "SELECT * FROM t LIMIT 0xfff"}, {"tool": "run_sql", "rows": 4095}),
    ("run_sql", {"query": "SELECT * FROM t LIMIT/**/4000"}, {"tool": "run_sql", "rows": 4000}),
    ("run_sql", {"query": "SELECT * FROM t LIMIT (4000)"}, {"tool": "run_sql", "rows": 4000}),
    ("run_sql", {"query": "SELECT * FROM t LIMIT +4000"}, {"tool": "run_sql", "rows": 4000}),
    ("run_sql", {"query": "SELECT * FROM t LIMIT 40*100"}, {"tool": "run_sql", "rows": 4000}),
    ("run_sql", {"query": 'SELECT * FROM t LIMIT "4000"'}, {"tool": "run_sql", "rows": 4000}),
    ("run_sql", {"query": "SELECT * FROM t LIMIT -1"}, {"tool": "run_sql", "rows": 5000}),
    ("run_sql", {"query": "SELECT * FROM t LIMIT abs(-4000)"}, {"tool": "run_sql", "rows": 4000}),
    ("run_sql", {"query": "SELECT * FROM t"}, {"tool": "run_sql", "rows": 5000}),
    ("run_sql", {"query": "SELECT * FROM t -- LIMIT 5"}, {"tool": "run_sql", "rows": 5000}),
    (
        "run_sql",
        {"query": "SELECT * FROM t WHERE EXISTS (SELECT 1 LIMIT 5)"},
        {"tool": "run_sql", "rows": 5000},
    ),
    (
        "run_sql",
        {"query": "WITH a AS (SELECT 1 LIMIT 1) SELECT * FROM t, a"},
        {"tool": "run_sql", "rows": 5000},
    ),
    (
        "run_sql",
        {"query": "SELECT * FROM (SELECT * FROM t LIMIT 5) UNION ALL SELECT * FROM t"},
        {"tool": "run_sql", "rows": 5005},
    ),
    ("list_rows", {"limit": None}, {"tool": "list_rows", "rows": 5000}),
    ("list_rows", {"limit": 0}, {"tool": "list_rows", "rows": 5000}),
    ("list_rows", {"limit": -1}, {"tool": "list_rows", "rows": 5000}),
    ("list_rows", {"limit": "-5"}, {"tool": "list_rows", "rows": 5000}),
    (
        "run_sql_model",
        {"req": {"sql": "SELECT * FROM t LIMIT 4000"}},
        {"tool": "run_sql_model", "rows": 4000, "sql": "SELECT * FROM t LIMIT 4000"},
    ),
    (
        "run_sql_model",
        {"req": {"sql": "DROP TABLE t"}},
        {"tool": "run_sql_model", "rows": 0, "sql": "DROP TABLE t"},
    ),
    ("write_lines", {"path": "/tmp/out.txt", "content": LINES}, {"tool": "write_lines", "size": 1401}),
    ("run_command", {"req": {"command": "rm -rf /"}}, {"tool": "run_command", "command": "rm -rf /"}),
    (
        "send_message",
        {"message": {"to": "eve@evil.example", "body": "hi"}},
        {"tool": "send_message", "to": "eve@evil.example"},
    ),
    (
        "open_issue",
        {"owner": "me", "org": "evil", "repo": "x", "title": "t"},
        {"tool": "open_issue", "repository": "evil/x"},
    ),
]

# Calls the same policy must still allow (what the fixes must not break).
ALLOWED: list[tuple[str, dict, dict]] = [
    ("search", {"params": {"term": "x", "limit": 50}}, {"tool": "search", "limit": 50}),
    ("run_sql", {"query": "SELECT * FROM t LIMIT 10, 90"}, {"tool": "run_sql", "rows": 90}),
    ("run_sql", {"query": "SELECT * FROM t LIMIT 50 OFFSET 4000"}, {"tool": "run_sql", "rows": 50}),
    (
        "run_sql",
        {"query": "SELECT * FROM t UNION ALL SELECT * FROM t LIMIT 100"},
        {"tool": "run_sql", "rows": 100},
    ),
    ("list_rows", {"limit": 50}, {"tool": "list_rows", "rows": 50}),
    (
        "run_sql",
        {"query": "SELECT * FROM t WHERE x < 3 LIMIT 100 -- rate limit 4000"},
        {"tool": "run_sql", "rows": 3},
    ),
    ("write_lines", {"path": "/tmp/out.txt", "content": ["a", "b"]}, {"tool": "write_lines", "size": 3}),
    ("run_command", {"req": {"command": "ls -l docs"}}, {"tool": "run_command", "command": "ls -l docs"}),
    (
        "send_message",
        {"message": {"to": "bob@corp.example"}},
        {"tool": "send_message", "to": "bob@corp.example"},
    ),
    ("open_issue", {"owner": "me", "org": "me", "repo": "x"}, {"tool": "open_issue", "repository": "me/x"}),
]


def _call(msg_id: int, tool: str, arguments: dict) -> dict:
    return {
        "jsonrpc": "2.0",
        "id": msg_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }


def _records(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def direct(tool: str, arguments: dict, log: Path) -> list[dict]:
    """What the server records for the call, with no Visor in between."""
    lines = [initialize(), INITIALIZED, _call(1, tool, arguments)]
    proc = subprocess.Popen(
        SERVER,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "NUMBERS_LOG": str(log)},
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in lines))
    proc.stdin.flush()
    while True:  # the answer to the call, then stdin's end (an early end cancels the call)
        line = proc.stdout.readline()
        assert line, "the server closed its stdout"
        if json.loads(line).get("id") == 1:
            break
    proc.stdin.close()
    proc.wait(10)
    return _records(log)


def _visor(tmp_path: Path, log: Path) -> VisorProcess:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    vp = VisorProcess(
        SERVER,
        env={"NUMBERS_LOG": str(log)},
        visor_args=[
            "--server-name",
            "numbers",
            "--policy",
            str(policy),
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
        ],
    )
    init, listed = vp.open_session()
    assert "serverInfo" in init["result"]
    assert len(listed["result"]["tools"]) == 8
    return vp


def _through_visor(tmp_path: Path, calls: list[tuple[str, dict, dict]]) -> tuple[list[dict], list[dict]]:
    log = tmp_path / "through-visor.jsonl"
    vp = _visor(tmp_path, log)
    answers = []
    try:
        for i, (tool, arguments, _want) in enumerate(calls, 1):
            vp.request(_call(i, tool, arguments))
            resp = vp.recv()
            assert resp["id"] == i, resp
            answers.append(resp)
    finally:
        vp.kill()
    return answers, _records(log)


def _denied(resp: dict) -> bool:
    result = resp.get("result") or {}
    text = "".join(c.get("text", "") for c in result.get("content", []))
    return bool(result.get("isError")) and "Visor denied this call" in text


@pytest.mark.parametrize(
    ("tool", "arguments", "want"), ATTACKS, ids=[f"{t}-{i}" for i, (t, _a, _w) in enumerate(ATTACKS)]
)
def test_the_server_acts_on_the_attack(tmp_path: Path, tool: str, arguments: dict, want: dict) -> None:
    assert direct(tool, arguments, tmp_path / "direct.jsonl") == [want]


def test_visor_denies_every_attack_and_the_server_reads_none(tmp_path: Path) -> None:
    answers, received = _through_visor(tmp_path, ATTACKS)
    allowed = [(ATTACKS[i][0], ATTACKS[i][1]) for i, a in enumerate(answers) if not _denied(a)]
    assert allowed == []
    assert received == []


def test_visor_still_allows_the_calls_within_the_policy(tmp_path: Path) -> None:
    for tool, arguments, want in ALLOWED:
        assert direct(tool, arguments, tmp_path / f"direct-{tool}.jsonl")[-1] == want
    answers, received = _through_visor(tmp_path, ALLOWED)
    assert [a for a in answers if _denied(a)] == []
    assert received == [want for _t, _a, want in ALLOWED]


def test_arg_patterns_hold_for_a_member_of_that_name_at_any_depth() -> None:
    # A model parameter's member is read by its server as surely as an argument: the pattern an
    # argument of that name must match holds for it too (it held for top-level names only).
    from tests.policy.helpers import decide, policy_from, session_for

    policy = policy_from(
        """
version: "1.0"
default_action: deny
settings: {session_max_calls: 0, session_timeout_seconds: 0}
servers:
  - name: git
    allowed: true
    tools:
      - name: push
        allowed: true
        arg_patterns: {branch: "feature/[a-z0-9-]+"}
"""
    )
    s = session_for(policy, "git")
    assert decide(policy, s, "push", branch="feature/x").action == "allow"
    assert decide(policy, s, "push", branch="main").action == "deny"
    assert decide(policy, s, "push", req={"branch": "main"}).action == "deny"
    assert decide(policy, s, "push", req={"opts": [{"branch": "main"}]}).action == "deny"
    assert decide(policy, s, "push", req={"branch": "feature/y"}).action == "allow"
