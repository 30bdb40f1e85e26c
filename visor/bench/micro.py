"""Micro-benchmarks of the hot functions, in process: nanoseconds per call."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

BENCH_POLICY = Path(__file__).with_name("policy-30-rules.yaml")

REQUEST = orjson.dumps(
    {
        "jsonrpc": "2.0",
        "id": 12345,
        "method": "tools/call",
        "params": {
            "name": "send_email",
            "arguments": {"to": "boss@example.com", "body": "Quarterly numbers attached."},
        },
    }
)
RESPONSE = orjson.dumps(
    {
        "jsonrpc": "2.0",
        "id": 12345,
        "result": {"content": [{"type": "text", "text": "sent"}], "isError": False},
    }
)


def per_call_ns(fn: Callable[[], object], *, repeat: int = 7, number: int = 2000) -> float:
    """Median over `repeat` runs of the mean time of `number` calls."""
    fn()
    runs = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter_ns() - start) / number)
    return statistics.median(runs)


def ticket(n: int) -> dict[str, Any]:
    text = (
        f"Ticket {n}: customer user{n}@corp{n}.example wrote from https://portal{n}.example/t/{n} "
        f"and asked us to cc ops{n}@vendor.example. "
    )
    return {"content": [{"type": "text", "text": (text * 40)[:4096]}], "isError": False}


def bench_session(outputs: int) -> tuple[Any, Any]:
    """A session on the 30-rule policy that has seen `outputs` 4 KB tool outputs."""
    from visor.bench.echo_server import TOOLS
    from visor.policy.loader import load_policy
    from visor.session import SessionState

    policy = load_policy(BENCH_POLICY)
    session = SessionState(policy, "bench")
    session.observe_tools_list({"tools": [*TOOLS["tools"], *_extra_tools()]})
    for n in range(outputs):
        session.observe_output("read_ticket", ticket(n))
    return policy, session


def _extra_tools() -> list[dict[str, Any]]:
    names = [
        "write_file",
        "shell_exec",
        "database_query",
        "github_create_pr",
        "github_merge_pr",
        "slack_post",
        "fetch_url",
    ]
    return [{"name": n, "description": n, "inputSchema": {"type": "object"}} for n in names]


def _fresh_rows(policy: Any, session: Any) -> dict[str, float]:
    """Evaluator rows where every call is new (the calls are freed afterwards,
    so that they do not weigh on the garbage collector in later rows)."""
    from visor.policy.evaluate import ToolCall, evaluate

    out: dict[str, float] = {}
    n = 2000 * 6 + 1
    shells = iter(
        [ToolCall("bench", "shell_exec", {"command": f"git status && ls /srv/d{i}"}) for i in range(n)]
    )
    out["evaluator: 30-rule policy, shell command, a new command every call"] = per_call_ns(
        lambda: evaluate(policy, session, next(shells)), repeat=5, number=2000
    )
    sends = iter(
        [ToolCall("bench", "send_email", {"to": f"boss{i}@example.com", "body": "x"}) for i in range(n)]
    )
    out["evaluator: 30-rule policy, send to a new address every call (ask)"] = per_call_ns(
        lambda: evaluate(policy, session, next(sends)), repeat=5, number=2000
    )
    return out


def run_micro(outputs: int = 10_000) -> dict[str, float]:
    from visor.audit import record
    from visor.policy import destinations
    from visor.policy.evaluate import ToolCall, evaluate
    from visor.wire.framer import Framer
    from visor.wire.message import classify

    results: dict[str, float] = {}
    batch = b"\n".join([REQUEST] * 64) + b"\n"
    framer = Framer()
    results["framer: one 120-byte line (in a 64-line chunk)"] = (
        per_call_ns(lambda: framer.feed(batch), number=200) / 64
    )
    results["validator: tools/call request (with duplicate-key check)"] = per_call_ns(
        lambda: classify(REQUEST)
    )
    results["validator: response, exact duplicates only"] = per_call_ns(
        lambda: classify(RESPONSE, fold_case=False)
    )

    policy, session = bench_session(0)
    allowed = ToolCall(
        "bench", "send_email", {"to": "boss@example.com", "body": "Quarterly numbers attached."}
    )
    results["evaluator: 30-rule policy, allowed send, fresh session"] = per_call_ns(
        lambda: evaluate(policy, session, allowed)
    )
    shell = ToolCall("bench", "shell_exec", {"command": "git status && ls /srv"})
    results["evaluator: 30-rule policy, shell command split and matched"] = per_call_ns(
        lambda: evaluate(policy, session, shell)
    )
    # The rows above repeat one call, so per-text memos always hit; these do not.
    results.update(_fresh_rows(policy, session))
    start = time.perf_counter()
    policy, session = bench_session(outputs)
    results[f"provenance: indexing one 4 KB output (mean of {outputs})"] = (
        (time.perf_counter() - start) / max(1, outputs) * 1e9
    )
    results[f"evaluator: 30-rule policy, allowed send after {outputs} outputs"] = per_call_ns(
        lambda: evaluate(policy, session, allowed)
    )
    tainted = ToolCall("bench", "send_email", {"to": "user77@corp77.example", "body": "x"})
    results[f"evaluator: send to an address seen in output #77 of {outputs} (deny)"] = per_call_ns(
        lambda: evaluate(policy, session, tainted)
    )
    big = "x" * (1 << 20)
    results["provenance: indexing a 1 MiB text of one letter"] = per_call_ns(
        lambda: destinations.OutputIndex().add(big), repeat=5, number=5
    )
    prose = (
        "The quarterly report for 2025-Q3 lists 1,234 open items; see section 4.2 and the notes. " * 12_000
    )[: 1 << 20]
    results["provenance: indexing a 1 MiB text of prose with numbers"] = per_call_ns(
        lambda: destinations.OutputIndex().add(prose), repeat=5, number=5
    )
    small = {"content": [{"type": "text", "text": "ok"}], "isError": False}
    results["provenance: observe_output of a small result"] = per_call_ns(
        lambda: session.observe_output("echo", small)
    )
    from visor import redact

    screen = redact.DEFAULT_REDACTOR.outputs
    big_line = orjson.dumps(
        {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": big}]}}
    )
    results["redaction pre-check: 1 MiB result line, no secret"] = per_call_ns(
        lambda: screen.may_match(big_line), repeat=5, number=20
    )
    results["redaction pre-check: small result line"] = per_call_ns(lambda: screen.may_match(RESPONSE))
    dest = destinations.parse("Mallory <user9999@corp9999.example>")[0]
    results[f"provenance lookup alone after {outputs} outputs"] = per_call_ns(
        lambda: session.output.seen(dest)
    )
    event = {
        "event": "allow",
        "server": "bench",
        "tool": "send_email",
        "id": 12345,
        "args": {"to": "boss@example.com", "body": "Quarterly numbers attached."},
        "rule": "servers[bench].tools[send_email]",
        "reason": "allowed by policy",
        "policy": "0" * 64,
    }
    results["audit: build and hash one allow record"] = per_call_ns(
        lambda: record.build(event, session="s" * 16, seq=1, prev="0" * 64, ts="2026-01-01T00:00:00.000000Z")
    )
    return results
