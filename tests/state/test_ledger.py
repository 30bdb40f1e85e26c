"""SessionLedger against a real redis-server: one MCP session's record, for any replica."""

from __future__ import annotations

import pytest
import redis

from visor.state.ledger import (
    BadSessionId,
    LedgerRecord,
    SessionGone,
    SessionLedger,
    StaleCounts,
    StateConflict,
    StateUnavailable,
)

INIT = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}'
PINS = {"format": 1, "server": "mail", "tools": {"send": "sha256:abc"}}


def test_a_session_is_created_once_and_loaded_by_another_replica(redis_server: str) -> None:
    one = SessionLedger(redis_server, ttl_seconds=600)
    two = SessionLedger(redis_server, ttl_seconds=600)
    assert two.load("s-1") is None
    one.create("s-1", initialize=INIT, client="d1g35t", owner="host-a:1")
    with pytest.raises(StateConflict):
        two.create("s-1", initialize=b"{}", client="", owner="host-b:2")
    assert two.load("s-1") == LedgerRecord(
        initialize=INIT,
        client="d1g35t",
        owner="host-a:1",
        ended=False,
        calls_total=0,
        tool_calls={},
        history=(),
        pins=None,
    )
    one.close()
    two.close()


def test_calls_are_counted_atomically_with_a_capped_history(redis_server: str) -> None:
    one = SessionLedger(redis_server, ttl_seconds=600)
    two = SessionLedger(redis_server, ttl_seconds=600)
    one.create("s-2", initialize=INIT, client="", owner="a")
    assert one.record_call("s-2", "mail", "send", 3) == (1, 1)
    assert two.record_call("s-2", "mail", "read", 3) == (2, 1)
    assert one.record_call("s-2", "mail", "send", 3) == (3, 2)
    assert two.record_call("s-2", "web", "fetch", 3) == (4, 1)
    record = one.load("s-2")
    assert record is not None
    assert record.calls_total == 4
    assert record.tool_calls == {"send": 2, "read": 1, "fetch": 1}
    assert record.history == (("mail", "read"), ("mail", "send"), ("web", "fetch"))
    # no history kept: only the counts
    assert one.record_call("s-2", "mail", "send", 0) == (5, 3)
    assert len(one.load("s-2").history) == 3  # type: ignore[union-attr]


def test_a_replica_whose_counts_are_stale_counts_nothing(redis_server: str) -> None:
    one = SessionLedger(redis_server, ttl_seconds=600)
    two = SessionLedger(redis_server, ttl_seconds=600)
    one.create("s-stale", initialize=INIT, client="", owner="a")
    assert one.record_call("s-stale", "mail", "send", 3, expect_total=0) == (1, 1)
    assert two.record_call("s-stale", "mail", "send", 3, expect_total=1) == (2, 2)
    # one still believes a single call was made: refused, and nothing is counted.
    with pytest.raises(StaleCounts):
        one.record_call("s-stale", "mail", "send", 3, expect_total=1)
    record = one.load("s-stale")
    assert record is not None and record.calls_total == 2 and record.tool_calls == {"send": 2}
    assert len(record.history) == 2
    assert one.record_call("s-stale", "mail", "send", 3, expect_total=2) == (3, 3)


def test_a_call_for_a_session_the_store_does_not_hold_is_refused_and_leaves_nothing(
    redis_server: str,
) -> None:
    ledger = SessionLedger(redis_server, ttl_seconds=600)
    with pytest.raises(SessionGone):
        ledger.record_call("nobody", "mail", "send", 10)
    assert ledger.load("nobody") is None
    assert redis.Redis.from_url(redis_server).keys("visor:s:*") == []
    assert ledger.claim("nobody", "a") is None
    assert ledger.end("nobody") is False
    assert ledger.save_pins("nobody", PINS) is False
    assert ledger.touch("nobody") is False
    assert redis.Redis.from_url(redis_server).keys("visor:s:*") == []


def test_pins_owner_and_end(redis_server: str) -> None:
    ledger = SessionLedger(redis_server, ttl_seconds=600)
    ledger.create("s-3", initialize=INIT, client="", owner="host-a:1")
    assert ledger.save_pins("s-3", PINS) is True
    assert ledger.claim("s-3", "host-b:7") == "host-a:1"
    assert ledger.claim("s-3", "host-c:9") == "host-b:7"
    assert ledger.end("s-3") is True
    record = ledger.load("s-3")
    assert record is not None
    assert record.pins == PINS
    assert record.owner == "host-c:9"
    assert record.ended is True
    with pytest.raises(ValueError, match="not JSON"):
        ledger.save_pins("s-3", {"x": object()})


def test_every_key_of_a_session_gets_the_ttl_and_touch_renews_it(redis_server: str) -> None:
    ledger = SessionLedger(redis_server, ttl_seconds=90)
    ledger.create("s-4", initialize=INIT, client="", owner="a")
    ledger.record_call("s-4", "mail", "send", 5)
    ledger.remember_exact("s-4", "approval.required", "d" * 64)
    r = redis.Redis.from_url(redis_server)
    keys = ledger.keys("s-4")
    assert keys == (
        "visor:s:{s-4}:meta",
        "visor:s:{s-4}:tools",
        "visor:s:{s-4}:history",
        "visor:s:{s-4}:exact",
    )
    for key in keys:
        assert 60_000 < r.pttl(key) <= 90_000, key
        r.pexpire(key, 1_000)
    assert ledger.touch("s-4") is True
    assert all(r.pttl(k) > 60_000 for k in keys)
    ledger.end("s-4")
    assert all(r.pttl(k) > 60_000 for k in keys)
    # the default is twice the gateway's default idle timeout
    assert SessionLedger(redis_server).ttl_ms == 1_800_000


def test_a_remembered_exact_approval_follows_the_session_to_another_replica(redis_server: str) -> None:
    one = SessionLedger(redis_server, ttl_seconds=600)
    two = SessionLedger(redis_server, ttl_seconds=600)
    one.create("s-7", initialize=INIT, client="", owner="a")
    assert two.exact_approvals("s-7") == frozenset()
    one.remember_exact("s-7", "approval.required", "a" * 64)
    one.remember_exact("s-7", "approval.required", "a" * 64)  # a set: once
    two.remember_exact("s-7", "tool.approval_required", "b" * 64)
    expected = frozenset({("approval.required", "a" * 64), ("tool.approval_required", "b" * 64)})
    assert one.exact_approvals("s-7") == expected
    record = two.load("s-7")
    assert record is not None and record.exact == expected
    # never made for a session the store does not hold
    with pytest.raises(SessionGone):
        one.remember_exact("s-none", "approval.required", "a" * 64)
    assert redis.Redis.from_url(redis_server).keys("visor:s:{s-none}:*") == []
    # a store entry that is not one of ours is refused, not read as an approval
    redis.Redis.from_url(redis_server).sadd("visor:s:{s-7}:exact", b"no-digest-here")
    with pytest.raises(StateUnavailable, match="remembered approval"):
        two.exact_approvals("s-7")
    one.close()
    two.close()


def test_bad_input_is_refused_with_a_clear_error(redis_server: str) -> None:
    ledger = SessionLedger(redis_server)
    for sid in ("", "has space", "é", "x" * 257):
        with pytest.raises(BadSessionId, match="visible ASCII"):
            ledger.load(sid)
    with pytest.raises(ValueError, match="initialize"):
        ledger.create("s-5", initialize=b"", client="", owner="a")
    with pytest.raises(ValueError, match="ttl_seconds"):
        SessionLedger(redis_server, ttl_seconds=0)
    with pytest.raises(ValueError, match="prefix"):
        SessionLedger(redis_server, prefix="{bad}")


def test_a_record_another_program_damaged_is_not_read_as_a_session(redis_server: str) -> None:
    ledger = SessionLedger(redis_server)
    r = redis.Redis.from_url(redis_server)
    meta, tools, _, _ = ledger.keys("s-6")
    r.hset(meta, mapping={"owner": "a"})  # no initialize request
    with pytest.raises(StateUnavailable, match="initialize"):
        ledger.load("s-6")
    r.hset(meta, mapping={"initialize": INIT, "calls": "many"})
    with pytest.raises(StateUnavailable, match="calls"):
        ledger.load("s-6")
    r.hset(meta, mapping={"calls": "1", "pins": "{not json"})
    with pytest.raises(StateUnavailable, match="pins"):
        ledger.load("s-6")
    r.hdel(meta, "pins")
    r.set(tools, "a string")
    with pytest.raises(StateUnavailable, match="WRONGTYPE"):
        ledger.load("s-6")
