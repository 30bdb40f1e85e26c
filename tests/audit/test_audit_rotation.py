import itertools
import os

import orjson

from visor.audit.paths import chain_files
from visor.audit.verify import verify_files, verify_path
from visor.audit.writer import AuditWriter

from .helpers import lines, write_log


def test_rotation_keeps_the_chain(tmp_path):
    log = tmp_path / "audit.jsonl"
    write_log(log, 60, max_bytes=4096)
    files = chain_files(log)
    assert [f.name for f in files[:3]] == ["audit.jsonl.1", "audit.jsonl.2", "audit.jsonl.3"]
    assert files[-1] == log and len(files) >= 4
    for older, newer in itertools.pairwise(files):
        last = orjson.loads(lines(older)[-1])
        first = orjson.loads(lines(newer)[0])
        assert first["event"] == "audit_open" and first["rotated_from"] == older.name
        assert first["prev"] == last["hash"] and first["seq"] == last["seq"] + 1
        assert older.stat().st_size >= 4096
        assert os.stat(older).st_mode & 0o777 == 0o600
    report = verify_path(log)
    assert report.ok, report.summary()
    assert report.records == sum(len(lines(f)) for f in files)


def test_reopen_after_rotation_and_crash_between_rename_and_create(tmp_path):
    log = tmp_path / "audit.jsonl"
    write_log(log, 30, max_bytes=4096)
    n = len(chain_files(log))
    # Simulate a crash right after the rename: the live file is gone.
    os.rename(log, tmp_path / f"audit.jsonl.{n}")
    write_log(log, 2, max_bytes=4096)
    first = orjson.loads(lines(log)[0])
    assert first["rotated_from"] == f"audit.jsonl.{n}"
    assert verify_path(log).ok


def test_missing_rotated_file_in_the_middle_fails(tmp_path):
    log = tmp_path / "audit.jsonl"
    write_log(log, 60, max_bytes=4096)
    files = chain_files(log)
    report = verify_files([files[0], *files[2:]])
    assert not report.ok and "deleted" in report.problem.reason


def test_oldest_rotated_files_removed_on_purpose_is_noted(tmp_path):
    log = tmp_path / "audit.jsonl"
    write_log(log, 60, max_bytes=4096)
    (tmp_path / "audit.jsonl.1").unlink()
    report = verify_path(log)
    assert report.ok and "earlier rotated files are not present" in report.summary()


def test_rotation_with_concurrent_commits(tmp_path):
    import asyncio

    from .helpers import allow

    log = tmp_path / "audit.jsonl"

    async def run():
        w = AuditWriter.open(log, session="s", max_bytes=2048)
        await asyncio.gather(*(w.commit(allow(i)) for i in range(100)))
        await w.close()
        return w.stats

    stats = asyncio.run(run())
    assert stats.rotations >= 5
    assert verify_path(log).ok
