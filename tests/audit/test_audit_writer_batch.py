"""`AuditWriter.batch()`: the records of one batch reach the writer thread as one wake-up.

Real files and a real fsync. The writer thread sleeps without a timeout when
nothing is waiting to be synced, so it can only be woken by a record being
queued: what it writes in one go shows how it was woken.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson

from visor.audit.verify import verify_path
from visor.audit.writer import AuditWriter

from .helpers import allow, lines


def test_a_batch_is_written_and_synced_as_one_group_in_order(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"

    async def run() -> tuple[int, int, int]:
        w = AuditWriter.open(log, session="s")
        try:
            before = w.stats
            with w.batch():
                w.append(allow(0))
                # Time enough for a woken thread to take the queue as it stands:
                # without the batch, record 0 would go out in a write of its own.
                time.sleep(0.2)
                for i in range(1, 5):
                    w.append(allow(i))
                with w.batch():  # nested: only the outermost end wakes the thread
                    w.append(allow(5))
                durable = w.submit(allow(6))
            record = await asyncio.wait_for(durable, 60)
            after = w.stats
            return (
                after.write_count - before.write_count,
                after.fsync_count - before.fsync_count,
                record["seq"],
            )
        finally:
            await w.close()

    writes, fsyncs, seq = asyncio.run(run())
    assert (writes, fsyncs) == (1, 1)
    records = [orjson.loads(x) for x in lines(log)]
    assert [r["id"] for r in records if r["event"] == "allow"] == list(range(7))
    assert records[-1]["seq"] == seq
    assert verify_path(log).ok


def test_a_commit_inside_a_batch_resolves_only_after_its_fsync(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    synced: list[int] = []

    async def run() -> bool:
        w = AuditWriter.open(log, session="s")
        w.observe_fsync(lambda _s: synced.append(1))
        try:
            with w.batch():
                durable = w.submit(allow(0))
            await asyncio.wait_for(durable, 60)
            return bool(synced)
        finally:
            await w.close()

    assert asyncio.run(run())
