"""A store that dies, comes back empty, or answers garbage: every read None (never
"not seen"), every write raised, the ledger unavailable, and a restarted store still
refusing "not seen" for a group it may have lost."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.state.garbage import GarbageRelay
from tests.state.redis_server import RedisServer
from visor.groups.identity import GroupIdentity
from visor.groups.index import GroupIndex
from visor.groups.store import GroupStoreError, StoreCorrupt, StoreIOError
from visor.policy import destinations as dst
from visor.policy.destinations import OUTPUT
from visor.state.ledger import SessionLedger, StateUnavailable
from visor.state.redis_store import RedisGroupStore, StoreForgotten

INIT = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}'


def _d(s: str) -> dst.Dest:
    return dst.parse(s)[0]


def _assert_cannot_tell(store: RedisGroupStore) -> None:
    assert store.seen("email:emma@corp.example") is None
    assert store.seen_any(["email:emma@corp.example", "host:corp.example"]) is None
    assert store.taints() is None
    assert store.taint_sources() is None
    assert store.approved("email:bob@corp.example") is None
    assert store.approvals() is None
    assert store.where(["email:mallory@evil.example"]) is None
    assert store.count() is None
    assert store.saturated is None
    assert store.lost is True


def _assert_writes_raise(store: RedisGroupStore) -> None:
    with pytest.raises(GroupStoreError):
        store.record({OUTPUT: ["host:new.example"]})
    with pytest.raises(GroupStoreError):
        store.raise_taint("private_data")
    with pytest.raises(GroupStoreError):
        store.approve("email:bob@corp.example", tool="send", argument="to")


def test_a_store_killed_mid_session_fails_closed_and_stays_closed_after_a_restart(
    redis_process: RedisServer,
) -> None:
    url = redis_process.url
    store = RedisGroupStore(url, "team", "mail", ttl_seconds=600)
    index = GroupIndex(
        GroupIdentity("team", "mcp-session"), RedisGroupStore(url, "team", "chat", ttl_seconds=600)
    )
    ledger = SessionLedger(url)
    ledger.create("s-1", initialize=INIT, client="", owner="a")
    store.record({OUTPUT: ["email:mallory@evil.example"]})
    assert index.seen(_d("mallory@evil.example")) is True
    assert index.seen(_d("emma@corp.example")) is False

    redis_process.kill()
    _assert_cannot_tell(store)
    with pytest.raises(StoreIOError):
        store.record({OUTPUT: ["host:new.example"]})
    _assert_writes_raise(store)
    assert index.seen(_d("emma@corp.example")) is None
    assert index.taints() is None
    assert index.approved("email:bob@corp.example") is None
    with pytest.raises(StateUnavailable):
        ledger.load("s-1")
    with pytest.raises(StateUnavailable):
        ledger.record_call("s-1", "mail", "send", 10)
    with pytest.raises(StateUnavailable):
        ledger.create("s-2", initialize=INIT, client="", owner="a")
    with pytest.raises(StateUnavailable):
        ledger.end("s-1")
    with pytest.raises(GroupStoreError):
        RedisGroupStore(url, "team", "web")

    # Back, empty (no persistence): what the group held is gone, and nobody says "not seen".
    redis_process.start()
    assert index.seen(_d("emma@corp.example")) is None
    assert store.seen("email:emma@corp.example") is None
    with pytest.raises(StoreForgotten):
        RedisGroupStore(url, "team", "web", create=False)
    # the store that lost a write told the group once it could (the lost key)
    assert redis.Redis.from_url(url).get(store.k_lost) is not None
    late = RedisGroupStore(url, "team", "web", ttl_seconds=600)
    assert late.seen("email:emma@corp.example") is None
    assert late.taints() is None
    assert ledger.load("s-1") is None  # the session is gone: the gateway starts over or refuses
    for s in (store, late):
        s.close()
    index.close()
    ledger.close()


def test_the_lost_mark_survives_a_restart_of_a_persisting_store(redis_process: RedisServer) -> None:
    url = redis_process.url
    store = RedisGroupStore(url, "team", "mail", ttl_seconds=600)
    store.record({OUTPUT: ["email:mallory@evil.example"]})
    r = redis.Redis.from_url(url)
    r.set(store.k_approvals, b"clobbered")
    with pytest.raises(StoreCorrupt):
        store.approve("email:bob@corp.example", tool="send", argument="to")
    r.save()  # an operator's persistence: the store comes back with what it held
    redis_process.kill()
    redis_process.start()
    other = RedisGroupStore(url, "team", "chat", ttl_seconds=600)
    assert other.seen("email:mallory@evil.example") is True
    assert other.seen("email:emma@corp.example") is None
    assert other.taints() is None
    assert other.lost is True
    store.close()
    other.close()


@pytest.fixture
def relay(redis_server: str) -> Iterator[GarbageRelay]:
    port = int(redis_server.rsplit(":", 1)[1].split("/")[0])
    r = GarbageRelay(port)
    try:
        yield r
    finally:
        r.close()


@pytest.mark.parametrize("reply", [b"-ERR garbage\r\n", b"+OK\r\n", b":1\r\n"])
def test_a_store_that_answers_garbage_fails_closed(relay: GarbageRelay, reply: bytes) -> None:
    store = RedisGroupStore(relay.url, "team", "mail", ttl_seconds=600)
    index = GroupIndex(GroupIdentity("team", "mcp-session"), RedisGroupStore(relay.url, "team", "chat"))
    ledger = SessionLedger(relay.url)
    ledger.create("s-1", initialize=INIT, client="", owner="a")
    store.record({OUTPUT: ["email:mallory@evil.example"]})

    relay.reply = reply
    _assert_cannot_tell(store)
    _assert_writes_raise(store)
    assert index.seen(_d("emma@corp.example")) is None
    assert index.taints() is None
    with pytest.raises(StateUnavailable):
        ledger.load("s-1")
    with pytest.raises(StateUnavailable):
        ledger.record_call("s-1", "mail", "send", 10)
    with pytest.raises(StateUnavailable):
        ledger.create("s-2", initialize=INIT, client="", owner="a")
    with pytest.raises(StateUnavailable):
        ledger.claim("s-1", "b")
    # joining a group through it fails too
    with pytest.raises(GroupStoreError):
        RedisGroupStore(relay.url, "fresh", "mail")
    store.close()
    index.close()
    ledger.close()
