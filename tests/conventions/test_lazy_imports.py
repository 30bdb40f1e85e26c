"""What a `visor run` session imports, and what it must leave alone.

Start-up time and memory are part of issue 16's targets (docs/benchmarks.md):
every module a session imports costs every client start. A real `visor run`
relays initialize, tools/list and one tools/call from the recorder server,
then sees EOF; a wrapper records `sys.modules` at its exit, so anything
imported at any point of the session counts. This is a structural test, not
a timing one: it names the modules that must stay out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import RECORDER, TESTS

# `python -m visor.cli`, with the module table written out at exit.
_RECORD_MODULES = (
    "import atexit, os, runpy, sys; "
    "atexit.register(lambda: open(os.environ['VISOR_TEST_MODULES'], 'w').write('\\n'.join(sorted(sys.modules)))); "
    "sys.argv[0] = 'visor'; runpy.run_module('visor.cli', run_name='__main__')"
)

# Never needed to relay stdio: the HTTP stack is for --url and `visor serve`,
# OpenTelemetry only when OTEL_EXPORTER_OTLP_* asks for it, rich is hidden
# from structlog (visor/logs.py), the MCP SDK is for tests and `visor doctor`,
# and the other commands' modules belong to their commands.
_NEVER = (
    "aiohttp",
    "visor.http.relay",
    "visor.serve",
    "opentelemetry",
    "rich",
    "mcp",
    "redis",
    "visor.policy.lint",
    "visor.install.commands",
    "visor.audit.report",
    "visor.watch",
)

# The group store: only for a session that joins a group (docs/groups.md).
_GROUP = ("sqlite3", "_sqlite3", "visor.groups", "visor.groups.store", "visor.groups.index")

_MESSAGES = [
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    },
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "echo", "arguments": {"a": 1}}},
]


def _session_modules(
    tmp_path: Path, options: list[str], arguments: dict[str, object] | None = None
) -> set[str]:
    """The modules a `visor run OPTIONS` session had imported when it exited."""
    out = tmp_path / "modules.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        VISOR_TEST_MODULES=str(out),
        RECORDER_LOG=str(tmp_path / "received.jsonl"),
        PYTHONPATH=os.pathsep.join(p for p in (str(TESTS.parent), env.get("PYTHONPATH")) if p),
    )
    proc = subprocess.run(
        [sys.executable, "-c", _RECORD_MODULES, "run", *options, "--", sys.executable, str(RECORDER)],
        input=b"".join(json.dumps(m).encode() + b"\n" for m in _messages(arguments)),
        capture_output=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [a.get("id") for a in answers] == [1, 2, 3], answers
    assert "tools" in answers[1]["result"] and "result" in answers[2], answers
    return set(out.read_text().split())


def _messages(arguments: dict[str, object] | None) -> list[dict[str, object]]:
    if arguments is None:
        return _MESSAGES
    call = {**_MESSAGES[-1], "params": {"name": "echo", "arguments": arguments}}
    return [*_MESSAGES[:-1], call]


def _imported(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """Which of `names` (or a module inside one of them) was imported."""
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


@pytest.mark.parametrize(
    "options",
    [["--no-group"], ["--no-checks"]],
    ids=["default-policy-no-group", "no-checks"],
)
def test_a_session_without_a_group_never_imports_the_group_store(tmp_path: Path, options: list[str]) -> None:
    modules = _session_modules(tmp_path, [*options, "--audit-log", str(tmp_path / "audit.jsonl")])
    assert "visor.relay.proxy" in modules  # the table is the session's
    assert _imported(modules, _GROUP) == []
    assert _imported(modules, _NEVER) == []


def test_a_session_in_a_group_imports_only_what_the_group_needs(tmp_path: Path) -> None:
    modules = _session_modules(tmp_path, ["--audit-log", str(tmp_path / "audit.jsonl")])
    # the group store is there when it is used: the test sees what a session imports
    assert {"sqlite3", "visor.groups.index"} <= modules
    assert _imported(modules, _NEVER) == []


def test_a_session_without_checks_never_imports_the_policy_package(tmp_path: Path) -> None:
    # --no-checks relays under the wire rules alone: nothing of the policy, its YAML or its readers.
    modules = _session_modules(tmp_path, ["--no-checks", "--audit-log", str(tmp_path / "audit.jsonl")])
    assert "visor.core.passthrough" in modules
    assert _imported(modules, ("visor.policy", "yaml", "visor.core.checks")) == []


def test_the_url_parser_is_loaded_only_when_a_url_is_read(tmp_path: Path) -> None:
    # ada_url (a cffi library, about 2 MB resident) is imported on first use (visor/policy/ada.py).
    (tmp_path / "plain").mkdir()
    plain = _session_modules(tmp_path / "plain", ["--no-group", "--audit-log", str(tmp_path / "a1.jsonl")])
    assert "visor.policy.urls" in plain  # the readers are there; the parser is not
    assert _imported(plain, ("ada_url", "_cffi_backend")) == []
    (tmp_path / "url").mkdir()
    url = _session_modules(
        tmp_path / "url",
        ["--no-group", "--audit-log", str(tmp_path / "a2.jsonl")],
        {"target": "https://bücher.example/a"},
    )
    assert "ada_url" in url


# What a plain session (no --signing-key, no approval options, a policy without time
# restrictions) has no use for: signed checkpoints, the chain walker of `visor audit verify`
# (opening a log checks its last link with visor.audit.record), the tty channel, the time
# zones, and importlib.resources (the embedded policy is read from the package's folder).
_OPTIONAL = (
    "visor.audit.signing",
    "visor.audit.verify",
    "visor.approval.tty",
    "zoneinfo",
    "importlib.resources",
)


def test_a_plain_session_leaves_the_optional_features_alone(tmp_path: Path) -> None:
    log = str(tmp_path / "audit.jsonl")
    (tmp_path / "first").mkdir()
    _session_modules(tmp_path / "first", ["--no-group", "--audit-log", log])
    # the second session opens the first one's log and checks its last link
    modules = _session_modules(tmp_path, ["--no-group", "--audit-log", log])
    assert {"visor.audit.writer", "visor.core.checks"} <= modules
    assert _imported(modules, _OPTIONAL) == []
