"""Records nobody waits for (denies, results) are written by the caller, not the thread.

Real files and a real fsync (or a counting wrapper around it). What is asserted: such a record is
in the file before `append` returns (so a crash of the process right after, which would lose
whatever the thread had not written yet, cannot lose it), on the caller's thread, in seq order
with everything queued for the thread; it is still made durable within IDLE_SYNC_SECONDS, or by
the next group; a write made while the thread's fsync runs is not counted as covered by it; a
write that fails poisons the writer, as a failure on the thread does.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import orjson
import pytest

from visor.audit import writer as writer_mod
from visor.audit.verify import verify_path
from visor.audit.writer import AuditUnhealthy, AuditWriter

from .helpers import allow, lines


def deny(i: int) -> dict[str, object]:
    return {"event": "deny", "server": "fs", "tool": "rm", "id": i}


class Recorder:
    """os.write and fdatasync with a note of which thread made each call."""

    def __init__(self) -> None:
        self.writes: list[int] = []
        self.fsyncs = 0
        self.fail_writes = False
        self.during_fsync: threading.Event | None = None
        self.release: threading.Event | None = None

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if self.fail_writes:
            raise OSError(28, "No space left on device")
        self.writes.append(threading.get_ident())
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        if self.during_fsync is not None and self.release is not None:
            self.during_fsync.set()
            self.release.wait(10)
        os.fdatasync(fd)
        self.fsyncs += 1


def test_an_append_is_in_the_file_before_it_returns_written_by_the_caller(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    rec = Recorder()
    w = AuditWriter.open(log, session="s", write=rec.write, fsync=rec.fsync)
    try:
        me = threading.get_ident()
        for i in range(3):
            record = w.append(deny(i))
            # No wait of any kind: the line is already there.
            assert orjson.loads(lines(log)[-1])["hash"] == record["hash"]
        assert rec.writes[-3:] == [me, me, me]
    finally:
        w.close_sync()
    assert verify_path(log).ok


def test_a_batch_of_appends_is_one_write_by_the_caller(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    rec = Recorder()
    w = AuditWriter.open(log, session="s", write=rec.write, fsync=rec.fsync)
    try:
        before = len(rec.writes)
        with w.batch():
            for i in range(10):
                w.append(deny(i))
            assert len(lines(log)) == 1  # held until the batch ends: only audit_open so far
        assert len(lines(log)) == 11
        assert rec.writes[before:] == [threading.get_ident()]
    finally:
        w.close_sync()


def test_appended_records_become_durable_without_a_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_mod, "IDLE_SYNC_SECONDS", 0.05)
    log = tmp_path / "audit.jsonl"
    rec = Recorder()
    w = AuditWriter.open(log, session="s", write=rec.write, fsync=rec.fsync)
    try:
        opened = rec.fsyncs
        w.append(deny(1))
        for _ in range(200):
            if rec.fsyncs > opened:
                break
            threading.Event().wait(0.01)
        assert rec.fsyncs == opened + 1
    finally:
        w.close_sync()


def test_appends_and_commits_from_many_tasks_keep_one_chain(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"

    async def run() -> None:
        w = AuditWriter.open(log, session="s")

        async def one(i: int) -> None:
            w.append(deny(i))
            await w.commit(allow(i))
            with w.batch():
                w.append(deny(1000 + i))
                w.append(deny(2000 + i))

        await asyncio.gather(*(one(i) for i in range(100)))
        await w.close()

    asyncio.run(run())
    seqs = [orjson.loads(x)["seq"] for x in lines(log)]
    assert seqs == list(range(len(seqs))) and len(seqs) == 1 + 400
    assert verify_path(log).ok


def test_a_write_made_during_the_threads_fsync_is_not_taken_as_covered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_mod, "IDLE_SYNC_SECONDS", 0.05)
    log = tmp_path / "audit.jsonl"
    rec = Recorder()
    w = AuditWriter.open(log, session="s", write=rec.write, fsync=rec.fsync)
    try:
        rec.during_fsync, rec.release = threading.Event(), threading.Event()
        w.append(deny(1))  # written by the caller; the thread's idle fsync comes for it
        assert rec.during_fsync.wait(10)
        # The thread is inside that fsync, which was asked before this write: it may not cover it.
        w.append(deny(2))
        release = rec.release
        rec.during_fsync = rec.release = None
        before = rec.fsyncs
        release.set()
        for _ in range(300):
            if rec.fsyncs >= before + 2:
                break
            threading.Event().wait(0.01)
        assert rec.fsyncs == before + 2  # the one that was running, and one more for deny 2
    finally:
        w.close_sync()
    assert [orjson.loads(x)["event"] for x in lines(log)][-2:] == ["deny", "deny"]


def test_a_failed_write_by_the_caller_poisons_the_writer(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    rec = Recorder()

    async def run() -> None:
        w = AuditWriter.open(log, session="s", write=rec.write, fsync=rec.fsync)
        rec.fail_writes = True
        with pytest.raises(AuditUnhealthy, match="No space left"):
            w.append(deny(1))
        assert not w.healthy
        rec.fail_writes = False
        with pytest.raises(AuditUnhealthy):
            w.append(deny(2))
        with pytest.raises(AuditUnhealthy):
            await w.commit(allow(3))
        await w.close()

    asyncio.run(run())
    assert [orjson.loads(x)["event"] for x in lines(log)] == ["audit_open"]


def test_a_failed_write_at_the_end_of_a_batch_fails_the_next_commit_closed(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    rec = Recorder()

    async def run() -> None:
        w = AuditWriter.open(log, session="s", write=rec.write, fsync=rec.fsync)
        rec.fail_writes = True
        with w.batch():
            w.append(deny(1))  # accepted; written (and failing) as the batch ends, which does not raise
        rec.fail_writes = False
        assert not w.healthy
        with pytest.raises(AuditUnhealthy):
            await w.commit(allow(2))
        await w.close()

    asyncio.run(run())
