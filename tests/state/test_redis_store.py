"""RedisGroupStore against a real redis-server: GroupStore's contract, shared by replicas."""

from __future__ import annotations

import redis

from visor.groups.store import Approval, GroupStoreError, RecordResult
from visor.policy.destinations import ASSERTED, ATTRIBUTED, OUTPUT
from visor.state.redis_store import RedisGroupStore


def raw(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def test_keys_are_recorded_seen_by_kind_and_counted(redis_server: str) -> None:
    with RedisGroupStore(redis_server, "g1", "mail", ttl_seconds=600) as store:
        assert store.seen("email:mallory@evil.example") is False
        assert store.record({OUTPUT: ["email:mallory@evil.example", "host:evil.example"]}) == RecordResult(
            2, False
        )
        # the same key again adds nothing; a kind is a place of its own
        assert store.record({OUTPUT: ["host:evil.example"], ASSERTED: ["host:evil.example"]}) == RecordResult(
            1, False
        )
        assert store.seen("email:mallory@evil.example") is True
        assert store.seen("host:evil.example", ASSERTED) is True
        assert store.seen("email:mallory@evil.example", ASSERTED) is False
        assert store.seen("email:mallory@evil.example", ATTRIBUTED) is False
        assert store.seen_any(["host:other.example", "host:evil.example"]) is True
        assert store.seen_any(["host:other.example"]) is False
        assert store.seen_any([]) is False
        assert store.count() == 3
        assert store.saturated is False
        assert store.lost is False
        assert store.where(["host:nothere.example", "host:evil.example"]) == "mail"
        assert store.where(["host:nothere.example"]) is None
        assert store.record({}) == RecordResult(0, False)


def test_keys_are_stored_as_keyed_digests_with_one_secret_per_group(redis_server: str) -> None:
    a = RedisGroupStore(redis_server, "g1", "mail", ttl_seconds=600)
    b = RedisGroupStore(redis_server, "g1", "chat", ttl_seconds=600)
    other = RedisGroupStore(redis_server, "g2", "mail", ttl_seconds=600)
    a.record({OUTPUT: ["email:mallory@evil.example"]})
    other.record({OUTPUT: ["email:mallory@evil.example"]})
    r = raw(redis_server)
    fields_g1 = r.hkeys("visor:g:{g1}:keys")
    fields_g2 = r.hkeys("visor:g:{g2}:keys")
    assert len(fields_g1) == len(fields_g2) == 1
    assert all(len(f) == 16 and b"mallory" not in f for f in fields_g1 + fields_g2)
    # the second member read the secret the first made; another group has its own
    assert a.digest("email:x") == b.digest("email:x") != other.digest("email:x")
    assert fields_g1 != fields_g2
    assert a.digest("email:x", OUTPUT) != a.digest("email:x", ASSERTED)
    assert r.get("visor:g:{g1}:secret") != r.get("visor:g:{g2}:secret")
    # what one group saw is not seen in another
    other.record({OUTPUT: ["host:only-in-g2.example"]})
    assert a.seen("host:only-in-g2.example") is False
    for s in (a, b, other):
        s.close()


def test_two_replicas_share_keys_taints_and_approvals(redis_server: str) -> None:
    one = RedisGroupStore(redis_server, "team", "calendar", ttl_seconds=600)
    two = RedisGroupStore(redis_server, "team", "chat", ttl_seconds=600)
    one.record({OUTPUT: ["email:mallory@evil.example"]})
    two.record({OUTPUT: ["email:mallory@evil.example", "email:emma@corp.example"]})
    assert two.seen("email:mallory@evil.example") is True
    assert one.seen("email:emma@corp.example") is True
    # the first server that showed a key stays its source
    assert two.where(["email:mallory@evil.example"]) == "calendar"
    assert one.where(["email:emma@corp.example"]) == "chat"
    assert one.count() == two.count() == 2

    assert two.taints() == frozenset()
    one.raise_taint("private_data", "get_events")
    two.raise_taint("private_data", None)
    two.raise_taint("untrusted_web")
    assert one.taints() == frozenset({"private_data", "untrusted_web"})
    assert two.taint_sources() == {"private_data": ("calendar", "chat"), "untrusted_web": ("chat",)}

    assert two.approved("email:bob@corp.example") is False
    one.approve("email:bob@corp.example", tool="send", argument="to")
    assert two.approved("email:bob@corp.example") is True
    assert two.approved("email:bob@corp.example", tool="send", argument="to") is True
    assert two.approved("email:bob@corp.example", tool="post") is False
    assert two.approved("email:bob@corp.example", argument="cc") is False
    # "remember" only goes up
    one.approve("email:bob@corp.example", tool="send", argument="to", remember=True)
    one.approve("email:bob@corp.example", tool="send", argument="to", remember=False)
    two.approve("host:x.example", tool="fetch", argument="url")
    assert one.approvals() == [
        Approval("email:bob@corp.example", "calendar", "send", "to", True),
        Approval("host:x.example", "chat", "fetch", "url", False),
    ]
    one.close()
    two.close()


def test_the_bound_saturates_and_then_absence_proves_nothing(redis_server: str) -> None:
    store = RedisGroupStore(redis_server, "small", "mail", max_keys=3, ttl_seconds=600)
    result = store.record({OUTPUT: [f"host:h{i}.example" for i in range(5)]})
    assert result == RecordResult(3, True)
    assert store.count() == 3
    assert store.saturated is True
    kept = [i for i in range(5) if store.seen(f"host:h{i}.example") is True]
    assert len(kept) == 3
    # a key that is absent may be one that was not kept: the store cannot tell
    assert store.seen("host:never.example") is None
    # a key already held is no reason to saturate a later batch
    again = RedisGroupStore(redis_server, "small2", "mail", max_keys=2, ttl_seconds=600)
    assert again.record({OUTPUT: ["host:a", "host:b"]}) == RecordResult(2, False)
    assert again.record({OUTPUT: ["host:a"]}) == RecordResult(0, False)
    assert again.saturated is False
    assert again.record({OUTPUT: ["host:c"]}) == RecordResult(0, True)
    store.close()
    again.close()


def test_every_key_of_a_group_gets_the_ttl_again_on_each_write(redis_server: str) -> None:
    store = RedisGroupStore(redis_server, "ttl", "mail", max_keys=1, ttl_seconds=120)
    store.record({OUTPUT: ["host:a", "host:b"]})  # saturates: the saturated key exists too
    store.raise_taint("t")
    store.approve("host:a", tool="fetch", argument="url")
    r = raw(redis_server)
    r.set(store.k_lost, b"test")  # a lost key made elsewhere
    r.pexpire(store.k_keys, 5_000)
    store.raise_taint("t2")
    for key in store.all_keys:
        assert 100_000 < r.pttl(key) <= 120_000, key
    # a quiet session can push its expiry back without writing
    r.pexpire(store.k_taints, 5_000)
    assert store.touch() is True
    assert r.pttl(store.k_taints) > 100_000
    store.close()
    forever = RedisGroupStore(redis_server, "forever", "mail", ttl_seconds=None)
    forever.record({OUTPUT: ["host:a"]})
    assert r.pttl(forever.k_keys) == -1
    assert r.pttl(forever.k_secret) == -1
    forever.close()


def test_a_failed_write_marks_the_group_lost_for_every_replica(redis_server: str) -> None:
    one = RedisGroupStore(redis_server, "team", "mail", ttl_seconds=600)
    two = RedisGroupStore(redis_server, "team", "chat", ttl_seconds=600)
    r = raw(redis_server)
    # something else wrote the taints key with another type: the write fails
    r.set(one.k_taints, b"not a hash")
    try:
        one.raise_taint("private_data")
    except GroupStoreError as exc:
        assert "WRONGTYPE" in str(exc)
    else:
        raise AssertionError("the write did not fail")
    assert r.get(one.k_lost) is not None
    assert two.lost is True
    assert two.seen("host:unseen.example") is None
    assert two.taints() is None
    # what is held is still held
    two.record({OUTPUT: ["host:seen.example"]})
    assert one.seen("host:seen.example") is True
    one.close()
    two.close()


def test_a_client_given_in_text_mode_is_refused(redis_server: str) -> None:
    from visor.state.connection import StateConfigError

    text = redis.Redis.from_url(redis_server, decode_responses=True)
    try:
        RedisGroupStore(text, "g1", "mail")
    except StateConfigError as exc:
        assert "bytes" in str(exc)
    else:
        raise AssertionError("a decoding client was taken")
    for bad in ("http://127.0.0.1/", "127.0.0.1:6379"):
        try:
            RedisGroupStore(bad, "g1", "mail")
        except StateConfigError as exc:
            assert "redis://" in str(exc)
        else:
            raise AssertionError(f"{bad} was taken")


def test_a_gateways_shared_client_is_used_and_left_open(redis_server: str) -> None:
    from visor.state.connection import connect

    client = connect(redis_server)
    first = RedisGroupStore(client, "shared", "mail", ttl_seconds=600)
    first.record({OUTPUT: ["host:a.example"]})
    first.close()
    # a session continued elsewhere joins only a group that still exists
    second = RedisGroupStore(client, "shared", "chat", ttl_seconds=600, create=False)
    assert second.seen("host:a.example") is True
    second.close()
    assert client.ping() is True  # closing a store does not close the gateway's client
    from visor.state.redis_store import StoreForgotten

    try:
        RedisGroupStore(client, "never-made", "chat", create=False)
    except StoreForgotten as exc:
        assert "never-made" in str(exc)
    else:
        raise AssertionError("a group with no record was joined")
    assert client.exists("visor:g:{never-made}:secret") == 0
    client.close()
