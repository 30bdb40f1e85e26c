"""The session ledger: what must follow one MCP session from replica to replica of a
gateway, in Redis/Valkey.

Keys, for prefix ``P`` and session id ``S`` (the braces are a Redis Cluster hash
tag: a session's keys share one slot)::

    P:s:{S}:meta     hash: initialize (the client's original request line, bytes),
                     client (a digest of its credential, or ""), owner (the replica
                     serving it), ended "0"/"1", calls (allowed calls), pins (JSON)
    P:s:{S}:tools    hash: tool -> allowed calls of that tool
    P:s:{S}:history  list: "server\\0tool" of the last allowed calls (history_cap)
    P:s:{S}:exact    set: "rule\\0digest" of the calls a human approved with "remember"
                     (an approval_required ask: the exact same call again in the session)

Every write sets the TTL of all four again (``touch`` too): a session nobody
touches expires whole. Every method is one round trip; any failure (unreachable,
timed out, an error, a reply of the wrong shape) raises ``StateUnavailable``: the
caller fails closed (a call that cannot be counted is not made). Writes are scripts
(atomic, and a session the store does not hold is never half made again); ``load``
is one MULTI/EXEC, a consistent snapshot.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from visor.logs import get_logger
from visor.state.connection import DEFAULT_TIMEOUT_S, StateConfigError, check_prefix, client_of

if TYPE_CHECKING:
    import redis

log = get_logger("visor.state")

#: A session's keys live this long after its last write: twice the default idle timeout.
DEFAULT_TTL_S = 2 * 900.0
#: An MCP session id: visible ASCII (the specification's 0x21 to 0x7E), bounded here.
_SID = re.compile(r"[\x21-\x7e]{1,256}")

# KEYS: meta tools history exact; ARGV: ttl_ms, initialize, client, owner. Answers in words no
# constant reply ("+OK", ":1") can pass for: a relay answering anything is not a success.
_CREATE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 'visor:exists' end
redis.call('HSET', KEYS[1], 'initialize', ARGV[2], 'client', ARGV[3], 'owner', ARGV[4],
           'ended', '0', 'calls', '0')
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
local ttl = tonumber(ARGV[1])
if ttl > 0 then for k = 1, #KEYS do redis.call('PEXPIRE', KEYS[k], ttl) end end
return 'visor:created'
"""

# KEYS: meta tools history exact; ARGV: ttl_ms, field, value. Sets a field of an existing
# session only (never makes half a session): {1, previous value or false}, or {0}.
_SET_FIELD_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local previous = redis.call('HGET', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
local ttl = tonumber(ARGV[1])
if ttl > 0 then for k = 1, #KEYS do redis.call('PEXPIRE', KEYS[k], ttl) end end
return {1, previous}
"""

# KEYS: meta tools history exact; ARGV: ttl_ms, entry. Adds an exact approval to an existing
# session only: 'visor:remembered', or 'visor:gone'.
_REMEMBER_EXACT_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 'visor:gone' end
redis.call('SADD', KEYS[4], ARGV[2])
local ttl = tonumber(ARGV[1])
if ttl > 0 then for k = 1, #KEYS do redis.call('PEXPIRE', KEYS[k], ttl) end end
return 'visor:remembered'
"""

# KEYS: meta tools history exact; ARGV: ttl_ms, tool, history entry, history_cap, expected total ('' for any).
# {total, tool count}, 'visor:gone' (no keys made for a session the store does not hold), or
# 'visor:stale' (the store counts other than the caller expected: nothing is counted).
# One script rather than MULTI/EXEC: as atomic, and half the cost on the path of every call.
_RECORD_CALL_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 'visor:gone' end
if ARGV[5] ~= '' and tonumber(redis.call('HGET', KEYS[1], 'calls') or '0') ~= tonumber(ARGV[5]) then
  return 'visor:stale'
end
local total = redis.call('HINCRBY', KEYS[1], 'calls', 1)
local count = redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
local cap = tonumber(ARGV[4])
if cap > 0 then
  redis.call('RPUSH', KEYS[3], ARGV[3])
  redis.call('LTRIM', KEYS[3], -cap, -1)
end
local ttl = tonumber(ARGV[1])
if ttl > 0 then for k = 1, #KEYS do redis.call('PEXPIRE', KEYS[k], ttl) end end
return {total, count}
"""


class StateUnavailable(Exception):
    """The store could not answer or record (unreachable, timed out, an error, a malformed
    reply or record): the caller fails closed."""


class SessionGone(StateUnavailable):
    """No such session in the store (it expired, or was never made here)."""


class StaleCounts(Exception):
    """The store counts calls of the session the caller did not know of (another replica served
    it meanwhile): nothing was counted; read the counts and judge again."""


class StateConflict(Exception):
    """A session with this id is already in the store."""


class BadSessionId(ValueError):
    """Not an MCP session id Visor keeps: 1 to 256 visible ASCII characters."""


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """One session, as the store holds it."""

    initialize: bytes
    client: str
    owner: str
    ended: bool
    calls_total: int
    tool_calls: dict[str, int]
    history: tuple[tuple[str, str], ...]
    pins: dict[str, Any] | None
    # (rule, arguments digest) of the calls a human approved with "remember" (approval_required)
    exact: frozenset[tuple[str, str]] = frozenset()


def check_sid(sid: str) -> str:
    if not isinstance(sid, str) or not _SID.fullmatch(sid):
        shown = sid[:40] if isinstance(sid, str) else type(sid).__name__
        raise BadSessionId(f"session id {shown!r}: expected 1 to 256 visible ASCII characters")
    return sid


def _str(value: object, what: str) -> str:
    if not isinstance(value, bytes):
        raise StateUnavailable(f"malformed session record: {what} is not a string")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StateUnavailable(f"malformed session record: {what} is not UTF-8") from exc


def _int(value: object, what: str) -> int:
    n: int | None = None
    if isinstance(value, bytes) and value.isascii() and value.isdigit():
        n = int(value)
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        n = value
    if n is None:
        raise StateUnavailable(f"malformed session record: {what} is not a count")
    return n


def _exact_entry(value: object) -> tuple[str, str]:
    rule, sep, digest = _str(value, "a remembered approval").partition("\0")
    if not sep or not rule or not digest:
        raise StateUnavailable("malformed session record: a remembered approval without its digest")
    return rule, digest


class SessionLedger:
    """The gateway's sessions in one Redis/Valkey database (shared by its replicas)."""

    def __init__(
        self,
        client_or_url: redis.Redis | str,
        *,
        prefix: str = "visor",
        ttl_seconds: float = DEFAULT_TTL_S,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int | float) or not ttl_seconds > 0:
            raise StateConfigError(f"ttl_seconds {ttl_seconds!r}: must be a positive number of seconds")
        self.prefix = check_prefix(prefix)
        self.ttl_ms = max(1, round(ttl_seconds * 1000))
        self._r: redis.Redis | None
        self._r, self._owns = client_of(client_or_url, timeout)
        self._create = self._r.register_script(_CREATE_LUA)
        self._set_field = self._r.register_script(_SET_FIELD_LUA)
        self._record_call = self._r.register_script(_RECORD_CALL_LUA)
        self._remember_exact = self._r.register_script(_REMEMBER_EXACT_LUA)

    def keys(self, sid: str) -> tuple[str, str, str, str]:
        """The session's keys: meta, tools, history, exact."""
        base = f"{self.prefix}:s:{{{check_sid(sid)}}}:"
        return base + "meta", base + "tools", base + "history", base + "exact"

    def _c(self) -> redis.Redis:
        if self._r is None:
            raise StateUnavailable("the session ledger is closed")
        return self._r

    def _script(self, script: Any, sid: str, args: tuple[Any, ...], what: str) -> Any:
        """Run one of the session's scripts on its keys: its reply, or StateUnavailable (a bad
        session id is refused before any round trip)."""
        keys = self.keys(sid)
        try:
            return script(keys=keys, args=args, client=self._c())
        except StateUnavailable:
            raise
        except Exception as exc:
            raise StateUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc

    def _transact(self, what: str, build: Sequence[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        try:
            pipe = self._c().pipeline(transaction=True)
            for name, args in build:
                getattr(pipe, name)(*args)
            replies = pipe.execute()
        except StateUnavailable:
            raise
        except Exception as exc:
            raise StateUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc
        if not isinstance(replies, list) or len(replies) != len(build):
            raise StateUnavailable(f"{what}: a malformed reply from the store")
        return replies

    def _field(self, sid: str, field: str, value: bytes, what: str) -> tuple[bool, object]:
        """Set one field of an existing session: (whether it exists, the previous value)."""
        reply = self._script(self._set_field, sid, (self.ttl_ms, field, value), what)
        if not isinstance(reply, list) or not reply or reply[0] not in (0, 1):
            raise StateUnavailable(f"{what}: a malformed reply from the store")
        if reply[0] == 0:
            return False, None
        return True, reply[1] if len(reply) > 1 else None

    # ------------------------------------------------------------- sessions

    def create(self, sid: str, *, initialize: bytes, client: str, owner: str) -> None:
        """Record a new session. Raises StateConflict if the id is taken, StateUnavailable if
        the store cannot record it."""
        if not isinstance(initialize, bytes) or not initialize:
            raise ValueError("initialize: the client's initialize request line, as non-empty bytes")
        made = self._script(
            self._create, sid, (self.ttl_ms, initialize, client.encode(), owner.encode()), "create session"
        )
        if made == b"visor:exists":
            raise StateConflict(f"session {sid[:40]!r} already exists in the state store")
        if made != b"visor:created":
            raise StateUnavailable("create session: a malformed reply from the store")

    def load(self, sid: str) -> LedgerRecord | None:
        """The session as the store holds it; None if there is none."""
        meta_k, tools_k, history_k, exact_k = self.keys(sid)
        meta, tools, history, exact = self._transact(
            "load session",
            (
                ("hgetall", (meta_k,)),
                ("hgetall", (tools_k,)),
                ("lrange", (history_k, 0, -1)),
                ("smembers", (exact_k,)),
            ),
        )
        if (
            not isinstance(meta, dict)
            or not isinstance(tools, dict)
            or not isinstance(history, list)
            or not isinstance(exact, set)
        ):
            raise StateUnavailable("load session: a malformed reply from the store")
        if not meta:
            return None
        initialize = meta.get(b"initialize")
        if not isinstance(initialize, bytes) or not initialize:
            raise StateUnavailable("malformed session record: no initialize request")
        pins: dict[str, Any] | None = None
        raw_pins = meta.get(b"pins")
        if raw_pins is not None:
            try:
                pins = orjson.loads(raw_pins)
            except (orjson.JSONDecodeError, TypeError) as exc:
                raise StateUnavailable("malformed session record: pins are not JSON") from exc
            if not isinstance(pins, dict):
                raise StateUnavailable("malformed session record: pins are not an object")
        calls: list[tuple[str, str]] = []
        for entry in history:
            server, sep, tool = _str(entry, "a history entry").partition("\0")
            if not sep:
                raise StateUnavailable("malformed session record: a history entry without a tool")
            calls.append((server, tool))
        return LedgerRecord(
            initialize=initialize,
            client=_str(meta.get(b"client", b""), "client"),
            owner=_str(meta.get(b"owner", b""), "owner"),
            ended=meta.get(b"ended") == b"1",
            calls_total=_int(meta.get(b"calls", b"0"), "calls"),
            tool_calls={_str(k, "a tool name"): _int(v, "a tool's calls") for k, v in tools.items()},
            history=tuple(calls),
            pins=pins,
            exact=frozenset(_exact_entry(e) for e in exact),
        )

    def record_call(
        self, sid: str, server: str, tool: str, history_cap: int, expect_total: int | None = None
    ) -> tuple[int, int]:
        """Count an allowed call, atomically: the session's new total and this tool's count.
        With ``expect_total``, only if the store's total is still that (else StaleCounts, and
        nothing is counted). Raises StateUnavailable (SessionGone for a session the store does
        not hold)."""
        entry = f"{server}\0{tool}".encode("utf-8", "surrogatepass")
        args = (
            self.ttl_ms,
            tool.encode("utf-8", "surrogatepass"),
            entry,
            max(0, history_cap),
            b"" if expect_total is None else str(expect_total).encode(),
        )
        reply = self._script(self._record_call, sid, args, "record call")
        if reply == b"visor:stale":
            raise StaleCounts(f"session {sid[:40]!r}: the store counts calls this replica did not make")
        if reply == b"visor:gone":
            raise SessionGone(f"session {sid[:40]!r} is not in the state store (expired or never made)")
        if (
            not isinstance(reply, list)
            or len(reply) != 2
            or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in reply)
        ):
            raise StateUnavailable("record call: a malformed reply from the store")
        return int(reply[0]), int(reply[1])

    def remember_exact(self, sid: str, rule: str, digest: str) -> None:
        """Keep a human's "remember" yes to an exact call (approval_required) with the session.
        Raises StateUnavailable (SessionGone for a session the store does not hold)."""
        entry = f"{rule}\0{digest}".encode("utf-8", "surrogatepass")
        reply = self._script(self._remember_exact, sid, (self.ttl_ms, entry), "remember approval")
        if reply == b"visor:gone":
            raise SessionGone(f"session {sid[:40]!r} is not in the state store (expired or never made)")
        if reply != b"visor:remembered":
            raise StateUnavailable("remember approval: a malformed reply from the store")

    def exact_approvals(self, sid: str) -> frozenset[tuple[str, str]]:
        """The session's remembered exact approvals: (rule, arguments digest)."""
        (members,) = self._transact("read approvals", (("smembers", (self.keys(sid)[3],)),))
        if not isinstance(members, set):
            raise StateUnavailable("read approvals: a malformed reply from the store")
        return frozenset(_exact_entry(e) for e in members)

    def save_pins(self, sid: str, data: dict[str, Any]) -> bool:
        """Keep the session's pins (``SessionState.export_pins()``). False: no such session."""
        try:
            raw = orjson.dumps(data)
        except TypeError as exc:
            raise ValueError(f"pins are not JSON: {exc}") from exc
        exists, _ = self._field(sid, "pins", raw, "save pins")
        return exists

    def claim(self, sid: str, owner: str) -> str | None:
        """Make ``owner`` the session's replica; the previous owner, or None if there is no session."""
        exists, previous = self._field(sid, "owner", owner.encode(), "claim session")
        if not exists:
            return None
        return _str(previous if previous is not None else b"", "owner")

    def end(self, sid: str) -> bool:
        """Mark the session ended (it stays, readable, until its TTL). False: no such session."""
        exists, _ = self._field(sid, "ended", b"1", "end session")
        return exists

    def touch(self, sid: str) -> bool:
        """Set the TTL of the session's keys again. False: no such session."""
        replies = self._transact("touch session", [("pexpire", (k, self.ttl_ms)) for k in self.keys(sid)])
        return bool(replies[0] == 1)

    def close(self) -> None:
        r, self._r = self._r, None
        if r is not None and self._owns:
            try:
                r.close()
            except Exception as exc:
                log.debug("state_client_close_failed", error=str(exc))
