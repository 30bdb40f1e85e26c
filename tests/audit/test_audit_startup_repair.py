import os

import orjson
import pytest

from visor.audit.record import GENESIS
from visor.audit.repair import repair
from visor.audit.verify import verify_path
from visor.audit.writer import AuditError, AuditWriter

from .helpers import lines, write_log


def test_torn_tail_stops_startup_and_repair_fixes_it(tmp_path):
    log = tmp_path / "audit.jsonl"
    records = write_log(log, 4)
    good = log.read_bytes()
    torn = b'{"hash":"0123","event":"al'
    with open(log, "ab") as f:
        f.write(torn)
    with pytest.raises(AuditError) as info:
        AuditWriter.open(log, session="s2")
    msg = str(info.value)
    assert str(log) in msg and "line 6" in msg and "incomplete" in msg
    assert f"visor audit repair {log}" in msg
    assert log.read_bytes() == good + torn  # refused, untouched

    result = repair(log)
    assert result.repaired and result.torn_file == tmp_path / "audit.jsonl.torn"
    assert (tmp_path / "audit.jsonl.torn").read_bytes() == torn
    assert os.stat(tmp_path / "audit.jsonl.torn").st_mode & 0o777 == 0o600
    assert log.read_bytes().startswith(good)
    tail = [orjson.loads(x) for x in lines(log)[-2:]]
    assert [t["event"] for t in tail] == ["audit_open", "audit_repair"]
    assert tail[1]["torn_bytes"] == len(torn) and tail[1]["line"] == 6
    assert tail[0]["prev"] == records[-1]["hash"]
    assert verify_path(log).ok
    write_log(log, 1)  # starts again


def test_garbage_line_after_crash_is_repaired(tmp_path):
    log = tmp_path / "audit.jsonl"
    write_log(log, 2)
    with open(log, "ab") as f:
        f.write(b"\x00" * 40 + b"\n" + b"\x00" * 10)
    with pytest.raises(AuditError, match="incomplete"):
        AuditWriter.open(log, session="s")
    assert repair(log).repaired
    assert verify_path(log).ok


@pytest.mark.parametrize("damage", ["edit_last", "bad_link"])
def test_edited_tail_stops_startup_and_needs_force(tmp_path, damage):
    log = tmp_path / "audit.jsonl"
    write_log(log, 3)
    data = lines(log)
    if damage == "edit_last":
        data[-1] = data[-1].replace(b'"id":2', b'"id":3')
        expect, where = "hash does not match", "line 4"
    else:
        del data[-2]
        expect, where = "seq jumps", "line 3"
    log.write_bytes(b"".join(data))
    with pytest.raises(AuditError) as info:
        AuditWriter.open(log, session="s")
    assert expect in str(info.value) and str(log) in str(info.value) and where in str(info.value)
    with pytest.raises(AuditError, match="--force"):
        repair(log)
    result = repair(log, force=True)
    assert result.repaired
    assert verify_path(log).ok


def test_foreign_log_is_refused_not_overwritten(tmp_path):
    log = tmp_path / "audit.jsonl"
    content = b'{"time":"2026-01-01","verdict":"allow","tool":"x"}\n'
    log.write_bytes(content)
    with pytest.raises(AuditError) as info:
        AuditWriter.open(log, session="s")
    assert "not a Visor audit record" in str(info.value) and "line 1" in str(info.value)
    assert "neither append" in str(info.value)
    with pytest.raises(AuditError):
        repair(log)
    assert log.read_bytes() == content


def test_unknown_format_version_is_refused(tmp_path):
    from visor.audit import record as rec

    log = tmp_path / "audit.jsonl"
    fields = {"event": "audit_open", "prev": GENESIS, "seq": 0, "session": "x", "ts": "t", "v": 9}
    body = rec.canonical_body(fields)
    line = b'{"hash":"' + rec.chain_hash(GENESIS, body).encode() + b'",' + body[1:] + b"\n"
    log.write_bytes(line)
    with pytest.raises(AuditError, match="unknown audit format version 9"):
        AuditWriter.open(log, session="s")
    assert log.read_bytes() == line


def test_repair_of_a_healthy_log_does_nothing(tmp_path):
    log = tmp_path / "audit.jsonl"
    write_log(log, 2)
    before = log.read_bytes()
    assert not repair(log).repaired
    assert log.read_bytes() == before
