"""Micro-benchmark of the group store: what one lookup and one message's write cost.

``python -m visor.groups.bench`` prints microseconds per ``seen`` (a hit and a
miss, as point queries), per ``seen_any`` of a destination's keys, and per
``record_outputs`` of 100 new keys (one transaction), on a store in a
temporary ``$VISOR_HOME`` that already holds ``preload`` keys. The figures
are CPU time (user and system) per call.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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


def main() -> int:
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
