import asyncio
import errno
import os
import stat
import threading
import time

import orjson
import pytest

from visor.audit import record as rec
from visor.audit import tail as tail_mod
from visor.audit.verify import verify_path
from visor.audit.writer import AuditError, AuditUnhealthy, AuditWriter

from .helpers import allow, lines, write_log


def test_creates_directory_0700_and_file_0600(tmp_path):
    log = tmp_path / "home" / "visor" / "audit.jsonl"
    write_log(log, 1)
    assert stat.S_IMODE(os.stat(log.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(log.parent.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(log).st_mode) == 0o600
    first, second = (orjson.loads(x) for x in lines(log))
    assert first["event"] == "audit_open" and first["durable"] is True and first["prev"] == rec.GENESIS
    assert second["event"] == "allow" and second["seq"] == 1


def test_existing_wide_mode_is_narrowed(tmp_path):
    log = tmp_path / "audit.jsonl"
    log.touch(mode=0o644)
    os.chmod(log, 0o644)
    write_log(log, 1)
    assert stat.S_IMODE(os.stat(log).st_mode) == 0o600


def test_symlinked_log_is_refused(tmp_path):
    target = tmp_path / "elsewhere.jsonl"
    target.write_bytes(b"")
    log = tmp_path / "audit.jsonl"
    log.symlink_to(target)
    with pytest.raises(AuditError, match="symbolic link"):
        AuditWriter.open(log, session="s")
    assert target.read_bytes() == b""


def test_fifo_is_refused(tmp_path):
    log = tmp_path / "audit.jsonl"
    os.mkfifo(log)
    with pytest.raises(AuditError, match="not a regular file"):
        AuditWriter.open(log, session="s")


def test_reopen_continues_the_chain(tmp_path):
    log = tmp_path / "audit.jsonl"
    first = write_log(log, 3, session="a")
    second = write_log(log, 2, session="b")
    assert second[0]["seq"] == first[-1]["seq"] + 2  # an audit_open sits between
    report = verify_path(log)
    assert report.ok, report.summary()
    assert report.records == 3 + 2 + 2 and report.sessions == 2


def test_second_writer_on_same_log_is_refused(tmp_path):
    log = tmp_path / "audit.jsonl"
    w = AuditWriter.open(log, session="a")
    try:
        with pytest.raises(AuditError, match="in use by another Visor process"):
            AuditWriter.open(log, session="b")
    finally:
        w.close_sync()
    write_log(log, 1)  # the lock is released on close


class SlowCountingFsync:
    """Real fdatasync, slowed down and recorded, to observe grouping and ordering."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.lock = threading.Lock()
        self.durable_size = 0  # file size covered by the last fsync that returned
        self.in_flight = False

    def __call__(self, fd: int) -> None:
        size = os.fstat(fd).st_size
        with self.lock:
            self.in_flight = True
        time.sleep(self.delay)
        os.fdatasync(fd)
        with self.lock:
            self.durable_size = size
            self.in_flight = False


def test_group_commit_shares_fsyncs_and_no_commit_returns_early(tmp_path):
    log = tmp_path / "audit.jsonl"
    fsync = SlowCountingFsync(0.005)
    n = 200

    async def run():
        w = AuditWriter.open(log, session="s", fsync=fsync)
        before = w.stats.fsync_count
        violations = []

        async def one(i):
            record = await w.commit(allow(i))
            # The record's line must lie inside what a returned fsync covered.
            data = log.read_bytes()
            end = data.index(f'"hash":"{record["hash"]}"'.encode())
            end = data.index(b"\n", end) + 1
            if end > fsync.durable_size:
                violations.append(i)
            return record

        records = await asyncio.gather(*(one(i) for i in range(n)))
        stats = w.stats
        await w.close()
        return before, stats, records, violations

    before, stats, records, violations = asyncio.run(run())
    assert violations == []
    used = stats.fsync_count - before
    assert 1 <= used <= n // 4, used  # far fewer fsyncs than commits
    assert stats.largest_group > 1
    assert stats.commits == n
    assert sorted(r["seq"] for r in records) == list(range(1, n + 1))
    assert verify_path(log).ok


def test_event_loop_keeps_running_during_fsync(tmp_path):
    log = tmp_path / "audit.jsonl"
    fsync = SlowCountingFsync(0.0)

    async def run():
        w = AuditWriter.open(log, session="s", fsync=fsync)
        fsync.delay = 0.3
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.create_task(ticker())
        await w.commit(allow(1))
        t.cancel()
        fsync.delay = 0.0
        await w.close()
        return ticks

    assert asyncio.run(run()) >= 5


def test_append_is_ordered_and_rides_on_the_next_fsync(tmp_path):
    log = tmp_path / "audit.jsonl"

    async def run():
        w = AuditWriter.open(log, session="s")
        base = w.stats.fsync_count
        appended = [w.append({"event": "deny", "server": "fs", "tool": "rm", "id": i}) for i in range(5)]
        await asyncio.sleep(0.1)
        mid = w.stats
        committed = await w.commit(allow(9))
        after = w.stats
        await w.close()
        return base, appended, mid, committed, after

    base, appended, mid, committed, after = asyncio.run(run())
    assert [r["seq"] for r in appended] == [1, 2, 3, 4, 5] and committed["seq"] == 6
    assert mid.records_written == 6 and mid.fsync_count == base  # written, not yet fsync'd
    assert after.fsync_count == base + 1
    assert [orjson.loads(x)["seq"] for x in lines(log)] == list(range(7))


class FailingFsync:
    def __init__(self) -> None:
        self.armed = False
        self.calls = 0

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.armed:
            raise OSError(errno.EIO, "Input/output error")
        os.fdatasync(fd)


def test_fsync_failure_denies_this_and_every_later_commit(tmp_path):
    log = tmp_path / "audit.jsonl"
    fsync = FailingFsync()

    async def run():
        w = AuditWriter.open(log, session="s", fsync=fsync)
        ok = await w.commit(allow(1))
        fsync.armed = True
        with pytest.raises(AuditUnhealthy, match="audit write failed"):
            await w.commit(allow(2))
        assert not w.healthy
        fsync.armed = False  # even if the disk recovers, the writer stays poisoned
        with pytest.raises(AuditUnhealthy):
            await w.commit(allow(3))
        with pytest.raises(AuditUnhealthy):
            w.append({"event": "deny"})
        results = await asyncio.gather(*(w.commit(allow(i)) for i in range(5)), return_exceptions=True)
        assert all(isinstance(r, AuditUnhealthy) for r in results)
        await w.close()
        return ok

    ok = asyncio.run(run())
    assert ok["seq"] == 1


def test_write_failure_poisons_concurrent_commits(tmp_path):
    log = tmp_path / "audit.jsonl"
    state = {"fail": False}

    def write(fd, data):
        if state["fail"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)

    async def run():
        w = AuditWriter.open(log, session="s", write=write)
        state["fail"] = True
        results = await asyncio.gather(*(w.commit(allow(i)) for i in range(20)), return_exceptions=True)
        await w.close()
        return results

    results = asyncio.run(run())
    assert all(isinstance(r, AuditUnhealthy) for r in results)
    assert "No space left" in str(results[0])


def test_open_fails_closed_when_first_fsync_fails(tmp_path):
    def fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(AuditError, match="cannot write"):
        AuditWriter.open(tmp_path / "audit.jsonl", session="s", fsync=fsync)


def test_tail_check_reads_only_the_end(tmp_path, monkeypatch):
    log = tmp_path / "audit.jsonl"
    write_log(log, 2000)
    size = log.stat().st_size
    read = []
    real = os.pread

    def counting(fd, n, off):
        data = real(fd, n, off)
        read.append(len(data))
        return data

    monkeypatch.setattr(tail_mod.os, "pread", counting)
    w = AuditWriter.open(log, session="s")
    w.close_sync()
    assert size > 500_000 and sum(read) < size // 4


def test_durability_off_is_labelled_and_skips_fsync(tmp_path):
    log = tmp_path / "audit.jsonl"
    calls = []

    async def run():
        w = AuditWriter.open(log, session="s", durable=False, fsync=calls.append)
        await w.commit(allow(1))
        await w.close()
        return w.stats

    stats = asyncio.run(run())
    assert calls == [] and stats.fsync_count == 0
    assert orjson.loads(lines(log)[0])["durable"] is False
