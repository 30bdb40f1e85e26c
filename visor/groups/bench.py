"""Micro-benchmark of the group store: what one lookup and one message's write cost.

``python -m visor.groups.bench`` prints microseconds per ``seen`` (a hit and a
miss, as point queries), per ``seen_any`` of a destination's keys, and per
``record_outputs`` of 100 new keys (one transaction), on a store in a
temporary ``$VISOR_HOME`` that already holds ``preload`` keys. The figures
are CPU time (user and system) per call.

``python -m visor.groups.bench --evaluator [OUTPUTS]`` prints what the
evaluator costs for an allowed send on the 30-rule bench policy, without a
group and with one, to an exactly trusted address and to one trusted by
domain, after 0 and OUTPUTS indexed 4 KB outputs.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from visor.groups.store import GroupStore


@dataclass(frozen=True, slots=True)
class StoreFigures:
    preload: int
    seen_hit_us: float
    seen_miss_us: float
    seen_any3_us: float
    record100_us: float


def _per_call(fn: Callable[[int], object], n: int) -> float:
    # CPU time of this process (user and system: the SQLite system calls
    # count): on a shared machine, wall time mostly measures the neighbours.
    start = time.process_time()
    for i in range(n):
        fn(i)
    return (time.process_time() - start) / n * 1e6


def measure(preload: int = 100_000, rounds: int = 20_000, home: Path | None = None) -> StoreFigures:
    with tempfile.TemporaryDirectory() as tmp:
        root = home or Path(tmp)
        store = GroupStore("bench", "bench", home=root, max_keys=2 * preload + 10 * rounds)
        try:
            for start in range(0, preload, 10_000):
                store.record_outputs(
                    f"email:user{i}@example.com" for i in range(start, min(preload, start + 10_000))
                )
            hit = _per_call(lambda i: store.seen(f"email:user{i % preload}@example.com"), rounds)
            miss = _per_call(lambda i: store.seen(f"email:nobody{i}@example.com"), rounds)
            any3 = _per_call(
                lambda i: store.seen_any(
                    (f"email:nobody{i}@example.com", f"host:h{i}.example.com", f"token:n{i}")
                ),
                rounds,
            )
            batches = max(50, rounds // 100)
            record = _per_call(
                lambda i: store.record_outputs(f"token:batch{i}-{j}" for j in range(100)), batches
            )
        finally:
            store.close()
    return StoreFigures(preload, hit, miss, any3, record)


def _evaluate_once(policy: Any, session: Any, call: Any, _i: int) -> object:
    from visor.policy.evaluate import evaluate

    return evaluate(policy, session, call)


def evaluator_rows(outputs: int = 1000, rounds: int = 2000) -> dict[str, float]:
    """Microseconds (CPU) per ``evaluate`` of an allowed send, with and without a group."""
    from visor.bench.echo_server import TOOLS
    from visor.bench.micro import BENCH_POLICY, _extra_tools, ticket
    from visor.groups.identity import GroupIdentity
    from visor.groups.index import GroupIndex
    from visor.policy.evaluate import ToolCall, evaluate
    from visor.policy.loader import load_policy_text
    from visor.session import SessionState

    text = BENCH_POLICY.read_text(encoding="utf-8")
    exact_trust = 'trusted_destinations: ["boss@example.com", "team@example.com"]'
    if exact_trust not in text:
        raise SystemExit(f"{BENCH_POLICY} no longer says {exact_trust}: update this benchmark")
    # the same policy with a domain in the trust list: such a send needs the group's "not seen"
    policy = load_policy_text(text.replace(exact_trust, exact_trust[:-1] + ', "@example.org"]'), "bench")
    calls = {
        "exact trust": ToolCall("bench", "send_email", {"to": "boss@example.com", "body": "numbers"}),
        "trusted by domain": ToolCall("bench", "send_email", {"to": "carol@example.org", "body": "numbers"}),
    }
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (0, outputs):
            for grouped in (False, True):
                group = (
                    GroupIndex.join(GroupIdentity(f"bench-{n}", "option"), "bench", home=Path(tmp))
                    if grouped
                    else None
                )
                session = SessionState(policy, "bench", group=group)
                session.observe_tools_list({"tools": [*TOOLS["tools"], *_extra_tools()]})
                for i in range(n):
                    session.observe_output("read_ticket", ticket(i))
                for what, call in calls.items():
                    decision = evaluate(policy, session, call)
                    if decision.action != "allow":
                        raise SystemExit(f"bench send ({what}) was not allowed: {decision}")
                    label = f"{'group   ' if grouped else 'no group'} {n:6} outputs, {what}"
                    out[label] = _per_call(partial(_evaluate_once, policy, session, call), rounds)
                if group is not None:
                    group.close()
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--evaluator":
        rows = evaluator_rows(int(sys.argv[2]) if len(sys.argv) > 2 else 1000)
        print("evaluator, allowed send, CPU time per call:", file=sys.stderr)
        for label, us in rows.items():
            print(f"  {label:42} {us:8.1f} us", file=sys.stderr)
        return 0
    preload = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    f = measure(preload)
    print(
        f"group store, {f.preload} keys held, CPU time per call (pid {os.getpid()}):\n"
        f"  seen (hit)               {f.seen_hit_us:8.1f} us\n"
        f"  seen (miss)              {f.seen_miss_us:8.1f} us\n"
        f"  seen_any (3 keys, miss)  {f.seen_any3_us:8.1f} us\n"
        f"  record_outputs(100 keys) {f.record100_us:8.1f} us per transaction",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
