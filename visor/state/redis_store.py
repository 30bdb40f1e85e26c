"""The group store on Redis/Valkey: ``GroupStore``'s contract (visor/groups/store.py)
for every replica of a gateway at once.

Keys, for prefix ``P`` and group ``G`` (the braces are a Redis Cluster hash tag:
a group's keys share one slot, as the script that records keys needs)::

    P:g:{G}:secret     32 random bytes, made once (SET NX) by the first member
    P:g:{G}:keys       hash: keyed BLAKE2b digest (kind included) -> the server that first showed it
    P:g:{G}:saturated  "1" once a key was not kept at the bound (max_keys)
    P:g:{G}:lost       why a write of the group failed; never removed while the group lives
    P:g:{G}:taints     hash: "name\\0server" -> tool
    P:g:{G}:approvals  hash: JSON [dest, server, tool, argument] -> "1" remembered, "0" not

Every write sets the TTL of all six again, so they expire together once the
group is idle. Failing closed, as the SQLite store:

- a read that cannot be answered (unreachable, timed out, an error or a reply
  of the wrong shape) returns None, never "not seen";
- a failed write raises the matching ``GroupStoreError`` and sets the ``lost``
  key when Redis still takes it, after which no replica answers "not seen" or
  "no taints" for the group;
- every read also reads the secret: if it is gone or another one (expired,
  flushed, a restart without persistence), what the group held is gone too,
  and the answer is None (and the group is marked lost), never "not seen".

Every read and every write is one round trip: a pipeline (reads), a MULTI/EXEC
(writes), or one script (``record``). Not thread-safe, as ``GroupStore``.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from visor.groups import identity
from visor.groups.store import (
    DEFAULT_MAX_KEYS,
    STALE_AFTER_S,
    Approval,
    GroupStoreError,
    RecordResult,
    StoreBusy,
    StoreClosed,
    StoreCorrupt,
    StoreFull,
    StoreIOError,
    StoreReadOnly,
    StoreRefused,
)
from visor.logs import get_logger
from visor.policy.destinations import KINDS, OUTPUT
from visor.state.connection import DEFAULT_TIMEOUT_S, StateConfigError, check_prefix, client_of

if TYPE_CHECKING:
    import redis

log = get_logger("visor.state")

#: A group's keys expire this long after its last write, as the SQLite store prunes an idle group.
DEFAULT_TTL_S = STALE_AFTER_S
_SECRET_SIZE = 32
_DIGEST_SIZE = 16
#: Digests per script call: a script blocks Redis while it runs; a huge message is split.
_RECORD_CHUNK = 8192
_FORGOTTEN = "VISORFORGOTTEN"

# KEYS: secret keys saturated lost taints approvals
# ARGV: secret, max_keys, server, ttl_ms (0: none), digest...
# Returns {added, saturated}. One script: the count, the bound and the writes are atomic,
# as GroupStore's transaction, in one round trip.
_RECORD_LUA = f"""
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('{_FORGOTTEN} the group secret is gone or replaced')
end
local room = tonumber(ARGV[2]) - redis.call('HLEN', KEYS[2])
local added, saturated = 0, 0
for i = 5, #ARGV do
  if added < room then
    added = added + redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[3])
  elseif redis.call('HEXISTS', KEYS[2], ARGV[i]) == 0 then
    saturated = 1
    break
  end
end
if saturated == 1 then redis.call('SET', KEYS[3], '1') end
local ttl = tonumber(ARGV[4])
if ttl > 0 then
  for k = 1, #KEYS do redis.call('PEXPIRE', KEYS[k], ttl) end
end
return {{added, saturated}}
"""


class StoreForgotten(GroupStoreError):
    """The group's record is no longer in the store (its keys expired, the database was
    flushed, or the server restarted without persistence): absence proves nothing."""


class _BadReply(Exception):
    """A reply of the wrong shape: the other end is not the Redis we expect."""


def _map_error(exc: BaseException, what: str) -> GroupStoreError:
    if isinstance(exc, GroupStoreError):
        return exc
    from redis import exceptions as rx

    text = f"{what}: {type(exc).__name__}: {exc}"
    if isinstance(exc, rx.TimeoutError | rx.BusyLoadingError | rx.TryAgainError):
        return StoreBusy(text)
    if isinstance(exc, rx.AuthenticationError | rx.AuthorizationError | rx.NoPermissionError):
        return StoreRefused(text)
    if isinstance(exc, rx.ConnectionError | OSError):
        return StoreIOError(text)
    if isinstance(exc, rx.OutOfMemoryError):
        return StoreFull(text)
    if isinstance(exc, rx.ReadOnlyError):
        return StoreReadOnly(text)
    if isinstance(exc, rx.ResponseError):
        message = str(exc)
        if message.startswith(_FORGOTTEN):
            return StoreForgotten(text)
        if message.startswith(("BUSY", "LOADING", "MASTERDOWN")):
            return StoreBusy(text)
        if message.startswith(("NOAUTH", "WRONGPASS", "NOPERM")):
            return StoreRefused(text)
        return StoreCorrupt(text)  # WRONGTYPE and the like: the keys are not what Visor wrote
    return StoreCorrupt(text)  # a reply of the wrong shape


def _as_bytes(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise _BadReply(f"expected a string reply, got {type(value).__name__}")
    return value


def _as_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _BadReply(f"expected an integer reply, got {type(value).__name__}")
    return value


def _as_list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise _BadReply(f"expected an array reply, got {type(value).__name__}")
    return value


def _as_dict(value: object) -> dict[bytes, bytes]:
    if not isinstance(value, dict):
        raise _BadReply(f"expected a map reply, got {type(value).__name__}")
    return value


class RedisGroupStore:
    """One replica's connection to one group's keys in Redis/Valkey.

    ``client_or_url``: a ``redis.Redis`` replying in bytes (shared by the gateway's
    sessions), or a URL (a client of our own, see ``connection.connect``).
    ``create=False`` joins only a group whose secret is still there (a session
    continued on another replica): a forgotten group raises ``StoreForgotten``
    instead of starting an empty record that would answer "not seen".
    """

    def __init__(
        self,
        client_or_url: redis.Redis | str,
        group: str,
        server: str,
        *,
        prefix: str = "visor",
        max_keys: int = DEFAULT_MAX_KEYS,
        ttl_seconds: float | None = DEFAULT_TTL_S,
        timeout: float = DEFAULT_TIMEOUT_S,
        create: bool = True,
    ) -> None:
        self.group = identity.validate_name(group)
        self.server = server
        if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
            raise StateConfigError(f"max_keys {max_keys!r}: must be a positive integer")
        if ttl_seconds is not None and not ttl_seconds > 0:
            raise StateConfigError(f"ttl_seconds {ttl_seconds!r}: must be positive seconds, or None")
        self.max_keys = max_keys
        self.ttl_ms = 0 if ttl_seconds is None else max(1, round(ttl_seconds * 1000))
        base = f"{check_prefix(prefix)}:g:{{{self.group}}}:"
        self.k_secret = base + "secret"
        self.k_keys = base + "keys"
        self.k_saturated = base + "saturated"
        self.k_lost = base + "lost"
        self.k_taints = base + "taints"
        self.k_approvals = base + "approvals"
        #: every key of the group, in the order the record script takes them
        self.all_keys = (
            self.k_secret,
            self.k_keys,
            self.k_saturated,
            self.k_lost,
            self.k_taints,
            self.k_approvals,
        )
        self._r: redis.Redis | None
        self._r, self._owns = client_of(client_or_url, timeout)
        self._lost = False
        self._unmarked: str | None = None  # why we lost a write, while the lost key could not be set
        self._read_warned = False
        try:
            self._secret = self._join(create)
        except BaseException as exc:
            err = _map_error(exc, f"cannot join group {self.group} in the state store")
            if not isinstance(err, StoreForgotten | StoreIOError | StoreBusy):
                # Redis answered, wrongly: the other members must not read our
                # absence as "not seen" (as GroupIndex.join marks a SQLite group).
                self._mark_lost(str(err))
            self.close()
            raise err from exc
        self._record_script = self._c().register_script(_RECORD_LUA)
        self._hashers = {
            kind: hashlib.blake2b(
                key=self._secret, digest_size=_DIGEST_SIZE, person=b"visor-group\0" + bytes((kind,))
            )
            for kind in KINDS
        }

    # ------------------------------------------------------------- helpers

    def _c(self) -> redis.Redis:
        if self._r is None:
            raise StoreClosed(f"group {self.group}: closed")
        return self._r

    def _join(self, create: bool) -> bytes:
        pipe = self._c().pipeline(transaction=True)
        if create:
            pipe.set(self.k_secret, secrets.token_bytes(_SECRET_SIZE), nx=True, px=self.ttl_ms or None)
        pipe.get(self.k_secret)
        secret = pipe.execute()[-1]
        if secret is None:
            raise StoreForgotten(f"group {self.group}: no record in the state store (expired or never made)")
        if not isinstance(secret, bytes) or len(secret) != _SECRET_SIZE:
            raise StoreCorrupt(f"group {self.group}: the secret in the state store is malformed")
        return secret

    def digest(self, key: str, kind: int = OUTPUT) -> bytes:
        """The keyed digest ``key`` is stored as (kind is part of the input)."""
        h = self._hashers[kind].copy()
        h.update(key.encode("utf-8", "surrogatepass"))
        return h.digest()

    def _mark_lost(self, reason: str) -> bool:
        """Set the ``lost`` key when Redis still takes it; True if it was set. Until it is
        set, every later read that reaches the store tries again (``_unmarked``)."""
        self._lost = True
        r = self._r
        if r is None:
            return False
        try:
            r.set(
                self.k_lost,
                f"{self.server}: {reason[:500]}".encode("utf-8", "replace"),
                px=self.ttl_ms or None,
            )
        except Exception:
            self._unmarked = reason
            return False
        self._unmarked = None
        return True

    def _fail_write(self, exc: BaseException, what: str) -> GroupStoreError:
        err = _map_error(exc, what)
        marked = self._mark_lost(str(err))
        log.error("group_store_write_failed", group=self.group, error=str(err), marked=marked)
        return err

    def _read(self, build: Sequence[tuple[str, tuple[Any, ...]]]) -> list[Any] | None:
        """Run ``build`` (command name, arguments) and then GET secret in one pipeline;
        the replies of ``build``, or None when the store cannot answer or forgot the group.

        No MULTI/EXEC (it cost a third of a lookup): Redis runs one connection's commands
        in order, and the secret is read last, so data read before a flush or expiry
        is never trusted (the secret is then gone or new); a lost or saturated mark set
        in between only makes the answer None."""
        try:
            pipe = self._c().pipeline(transaction=False)
            for name, args in build:
                getattr(pipe, name)(*args)
            pipe.get(self.k_secret)
            replies = _as_list(pipe.execute())
            if len(replies) != len(build) + 1:
                raise _BadReply(f"{len(replies)} replies to {len(build) + 1} commands")
        except Exception as exc:
            if not self._read_warned:  # once: a dead store would say it on every lookup
                self._read_warned = True
                log.warning("group_store_read_failed", group=self.group, error=str(_map_error(exc, "read")))
            return None
        if self._unmarked is not None:
            # the store answers again: tell the other replicas what we could not write
            self._mark_lost(self._unmarked)
        if replies[-1] != self._secret:
            # Checked after the data, in the same transaction: the data belongs to our secret.
            if not self._lost:
                log.error("group_store_forgotten", group=self.group)
                self._mark_lost("the group's secret is gone or replaced: its record was lost")
            return None
        return replies[:-1]

    def _transact(self, build: Sequence[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        """One MULTI/EXEC: ``build``, the TTL of every key, and GET secret (a group whose
        record was forgotten takes the write, and raises StoreForgotten)."""
        pipe = self._c().pipeline(transaction=True)
        for name, args in build:
            getattr(pipe, name)(*args)
        if self.ttl_ms:
            for key in self.all_keys:
                pipe.pexpire(key, self.ttl_ms)
        pipe.get(self.k_secret)
        replies = _as_list(pipe.execute())
        if len(replies) != len(build) + (len(self.all_keys) if self.ttl_ms else 0) + 1:
            raise _BadReply(f"{len(replies)} replies to a transaction")
        if replies[-1] != self._secret:
            raise StoreForgotten(f"group {self.group}: its secret is gone or replaced")
        return replies[: len(build)]

    def _write(self, what: str, build: Sequence[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        try:
            return self._transact(build)
        except Exception as exc:
            raise self._fail_write(exc, f"{what} in group {self.group}") from exc

    # ------------------------------------------------------------- keys

    def record(self, batch: Mapping[int, Iterable[str]]) -> RecordResult:
        """Add keys of each kind, in one script call. Raises GroupStoreError (and marks the group lost)."""
        digests: dict[bytes, None] = {}
        for kind, keys in batch.items():
            if kind not in KINDS:
                raise ValueError(f"unknown key kind {kind!r}")
            for k in keys:
                digests[self.digest(k, kind)] = None
        if not digests:
            return RecordResult(0, False)
        rows = list(digests)
        added = 0
        saturated = False
        try:
            for start in range(0, len(rows), _RECORD_CHUNK):
                reply = _as_list(
                    self._record_script(
                        keys=self.all_keys,
                        args=(
                            self._secret,
                            self.max_keys,
                            self.server.encode("utf-8", "surrogatepass"),
                            self.ttl_ms,
                            *rows[start : start + _RECORD_CHUNK],
                        ),
                        client=self._c(),
                    )
                )
                if len(reply) != 2:
                    raise _BadReply(f"the record script answered {reply!r}")
                added += _as_int(reply[0])
                if _as_int(reply[1]):
                    saturated = True
                    break
        except Exception as exc:
            raise self._fail_write(exc, f"record keys in group {self.group}") from exc
        return RecordResult(added, saturated)

    def record_outputs(self, keys: Iterable[str], kind: int = OUTPUT) -> RecordResult:
        return self.record({kind: keys})

    def seen(self, key: str, kind: int = OUTPUT) -> bool | None:
        """True: some member's output showed ``key``. False: none did. None: the
        store cannot tell (unreachable, saturated, forgotten, or a write was lost): ask."""
        return self.seen_any((key,), kind)

    def seen_any(self, keys: Iterable[str], kind: int = OUTPUT) -> bool | None:
        """``seen`` for any of ``keys`` (a destination's keys), in one round trip."""
        ds = tuple(self.digest(k, kind) for k in keys)
        if not ds:
            return False
        replies = self._read(
            (("hmget", (self.k_keys, list(ds))), ("exists", (self.k_saturated, self.k_lost)))
        )
        if replies is None:
            return None
        try:
            found = _as_list(replies[0])
            flags = _as_int(replies[1])
        except _BadReply:
            return None
        if len(found) != len(ds):
            return None
        if any(v is not None for v in found):
            return True
        if flags or self._lost:
            return None
        return False

    def where(self, keys: Iterable[str], kind: int = OUTPUT) -> str | None:
        """The server whose output first showed one of ``keys``, if any and readable."""
        ds = [self.digest(k, kind) for k in keys]
        if not ds:
            return None
        replies = self._read((("hmget", (self.k_keys, ds)),))
        if replies is None or not isinstance(replies[0], list):
            return None
        for v in replies[0]:
            if isinstance(v, bytes):
                return v.decode("utf-8", "replace")
        return None

    @property
    def saturated(self) -> bool | None:
        replies = self._read((("exists", (self.k_saturated,)),))
        if replies is None or not isinstance(replies[0], int):
            return None
        return bool(replies[0])

    def count(self) -> int | None:
        replies = self._read((("hlen", (self.k_keys,)),))
        if replies is None or not isinstance(replies[0], int):
            return None
        return int(replies[0])

    @property
    def lost(self) -> bool:
        """Some write of the group failed (here or in another replica), or its record was
        forgotten: absence proves nothing. True also while the store cannot be read."""
        if self._lost:
            return True
        replies = self._read((("exists", (self.k_lost,)),))
        if replies is None or not isinstance(replies[0], int):
            return True  # cannot tell: not remembered, the next read may answer
        if replies[0]:
            self._lost = True  # the key is never removed while the group lives
        return self._lost

    # ------------------------------------------------------------- taints

    def raise_taint(self, name: str, tool: str | None = None) -> None:
        """Record that this server raised ``name``. Raises GroupStoreError (and marks the group lost)."""
        field = f"{name}\0{self.server}".encode("utf-8", "surrogatepass")
        self._write(
            "raise taint",
            (("hsetnx", (self.k_taints, field, (tool or "").encode("utf-8", "surrogatepass"))),),
        )

    def _taint_fields(self) -> list[tuple[str, str]] | None:
        replies = self._read((("hkeys", (self.k_taints,)), ("exists", (self.k_lost,))))
        if replies is None or not isinstance(replies[0], list) or not isinstance(replies[1], int):
            return None
        if replies[1]:
            self._lost = True
        out: list[tuple[str, str]] = []
        for field in replies[0]:
            if not isinstance(field, bytes) or b"\0" not in field:
                return None
            name, _, server = field.decode("utf-8", "surrogatepass").partition("\0")
            out.append((name, server))
        return out

    def taints(self) -> frozenset[str] | None:
        """Every taint any member raised; None when the store cannot tell (a lost write included)."""
        fields = self._taint_fields()
        if fields is None or self._lost:
            return None
        return frozenset(name for name, _ in fields)

    def taint_sources(self) -> dict[str, tuple[str, ...]] | None:
        fields = self._taint_fields()
        if fields is None:
            return None
        out: dict[str, list[str]] = {}
        for name, server in sorted(fields):
            out.setdefault(name, []).append(server)
        return {k: tuple(v) for k, v in out.items()}

    # ------------------------------------------------------------- approvals

    def approve(self, dest: str, *, tool: str, argument: str, remember: bool = False) -> None:
        """A human approved ``dest`` (a destination key) for this server's ``tool`` and ``argument``."""
        field = json.dumps([dest, self.server, tool, argument])  # ASCII: any lone surrogate survives
        # "remember" only ever goes up, as GroupStore's max(remember, ...)
        command = (
            ("hset", (self.k_approvals, field, "1"))
            if remember
            else ("hsetnx", (self.k_approvals, field, "0"))
        )
        self._write("approve", (command,))

    def approvals(self) -> list[Approval] | None:
        replies = self._read((("hgetall", (self.k_approvals,)),))
        if replies is None:
            return None
        try:
            out: list[Approval] = []
            for field, value in _as_dict(replies[0]).items():
                parts = json.loads(_as_bytes(field))
                if not (
                    isinstance(parts, list) and len(parts) == 4 and all(isinstance(p, str) for p in parts)
                ):
                    raise _BadReply("an approval field is not [dest, server, tool, argument]")
                out.append(Approval(parts[0], parts[1], parts[2], parts[3], _as_bytes(value) == b"1"))
        except (_BadReply, ValueError):
            return None
        return sorted(out, key=lambda a: (a.dest, a.server, a.tool, a.argument))

    def approved(self, dest: str, *, tool: str | None = None, argument: str | None = None) -> bool | None:
        """Whether a human of this group approved ``dest`` (for ``tool``/``argument``
        when given, through any server); None when the store cannot tell."""
        every = self.approvals()
        if every is None:
            return None
        return any(
            a.dest == dest
            and (tool is None or a.tool == tool)
            and (argument is None or a.argument == argument)
            for a in every
        )

    # ------------------------------------------------------------- life

    def touch(self) -> bool:
        """Set the TTL of every key of the group again (a session alive but quiet).
        False when the store cannot be written or forgot the group."""
        if not self.ttl_ms:
            return True
        try:
            self._transact(())
        except Exception as exc:
            # nothing was lost: only the expiry could not be pushed back
            log.warning("group_store_touch_failed", group=self.group, error=str(_map_error(exc, "touch")))
            return False
        return True

    def close(self) -> None:
        r, self._r = self._r, None
        if r is not None and self._owns:
            try:
                r.close()
            except Exception as exc:
                log.debug("state_client_close_failed", error=str(exc))

    def __enter__(self) -> RedisGroupStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
