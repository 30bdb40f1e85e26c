"""`visor serve --state URL`: what must follow an MCP session from replica to replica.

One Redis/Valkey database (visor/state/) holds, per MCP session: the client's original
`initialize` (so another replica can start its own upstream and continue the session), the
pins of its first listing, the calls it was allowed (budgets and the history tool chains read),
and, through a group store named after the session, the untrusted output it has seen, the
taints it raised and the destinations a human approved. A replica that receives a request for
a session it does not hold loads this record and continues the session under the same
`Mcp-Session-Id` ("adoption", visor/serve/gateway.py).

What does not follow: the upstream process itself (and whatever it keeps in memory), requests
in flight on a replica that died, and an approval question that was open there. Every store
failure fails closed: a call that cannot be counted is denied, provenance that cannot be read
is unknown (asked or denied, never trusted), and a session that cannot be read is a 503.
"""

from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from visor.logs import get_logger
from visor.session import SharedCounts, SharedStateConflict, SharedStateError

if TYPE_CHECKING:
    from visor.groups.index import GroupIndex
    from visor.state.ledger import LedgerRecord, SessionLedger

log = get_logger("visor.serve")

#: What a 2026-07-28 conversation records where a session records its client's `initialize`
#: (that revision has none): nothing to replay to a new upstream.
CONVERSATION_MARK = b'{"visor":"conversation without initialize (2026-07-28)"}'
#: A session's keys live this long after its last write (twice the default idle timeout).
DEFAULT_TTL_SECONDS = 1800.0


class StateOptionError(ValueError):
    """`--state` names something Visor cannot use: the message says what."""


def replica_name() -> str:
    """This process, as the ledger's owner of the sessions it serves (host and pid)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def client_digest(authorization: str | None) -> str:
    """What a session remembers of the credential that opened it: a digest, never the token."""
    if not authorization:
        return ""
    return hashlib.sha256(authorization.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True, slots=True)
class Adoption:
    """A session started on another replica, as the store holds it."""

    record: LedgerRecord
    previous_owner: str | None


class SharedState:
    """The store connection of one gateway process, and what it makes for each session."""

    def __init__(self, url: str, *, ttl_seconds: float = DEFAULT_TTL_SECONDS, prefix: str = "visor") -> None:
        from visor.state.connection import StateConfigError, connect
        from visor.state.ledger import SessionLedger

        self.url = url
        self.prefix = prefix
        self.ttl_seconds = ttl_seconds
        self.owner = replica_name()
        # Short timeouts and no retries: a store that does not answer fails a request in about a
        # second, never hangs it for a client library's backoff.
        try:
            self.client = connect(url)
        except StateConfigError as exc:
            raise StateOptionError(f"--state: {exc}") from exc
        self.ledger: SessionLedger = SessionLedger(self.client, prefix=prefix, ttl_seconds=ttl_seconds)

    def ping(self) -> None:
        """Raise StateOptionError naming the store when it cannot be reached now."""
        try:
            self.client.ping()
        except Exception as exc:
            raise StateOptionError(
                f"--state: the store at {self.display} does not answer ({type(exc).__name__}: {exc})"
            ) from exc

    @property
    def display(self) -> str:
        """The URL without its password, for messages."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{host}{port}{parts.path}"

    def group(self, sid: str, server: str, max_keys: int, *, adopted: bool = False) -> GroupIndex:
        """The session's group store: its untrusted output, taints and approvals, on the store.
        A session continued from another replica must find its group there (`adopted`): a group
        that expired or was flushed while the session's record lived on is lost, not empty."""
        from visor.groups.identity import GroupIdentity
        from visor.groups.index import GroupIndex
        from visor.groups.store import GroupStoreError
        from visor.state.redis_store import RedisGroupStore

        ident = GroupIdentity(group_name(sid), "mcp-session")
        try:
            store = RedisGroupStore(
                self.client,
                ident.name,
                server,
                prefix=self.prefix,
                max_keys=max_keys,
                ttl_seconds=self.ttl_seconds,
                create=not adopted,
            )
        except (GroupStoreError, OSError) as exc:
            # As a group that cannot be joined: every destination unseen-and-asked, every taint raised.
            log.error("state_group_unavailable", mcp_session=sid, error=str(exc))
            return GroupIndex(ident, None, f"{type(exc).__name__}: {exc}")
        return GroupIndex(ident, store)

    def link(self, sid: str) -> SessionLink:
        return SessionLink(self.ledger, sid)

    def close(self) -> None:
        self.client.close()


def group_name(sid: str) -> str:
    """The group store's name for one MCP session (a session id is visible ASCII, 1 to 64 safe
    characters once hashed; the raw id is not used, so no id can name another's keys)."""
    return "mcp-" + hashlib.sha256(sid.encode("utf-8", "surrogateescape")).hexdigest()[:40]


class SessionLink:
    """One session's entry in the ledger, as the session state counts calls through it."""

    __slots__ = ("_ledger", "sid")

    def __init__(self, ledger: SessionLedger, sid: str) -> None:
        self._ledger = ledger
        self.sid = sid

    def record_call(self, server: str, tool: str, history_cap: int, expect_total: int) -> tuple[int, int]:
        from visor.state.ledger import StaleCounts, StateUnavailable

        try:
            return self._ledger.record_call(self.sid, server, tool, history_cap, expect_total)
        except StaleCounts as exc:
            raise SharedStateConflict(str(exc)) from exc
        except StateUnavailable as exc:
            raise SharedStateError(f"the shared session state cannot count the call ({exc})") from exc

    def counts(self) -> SharedCounts:
        from visor.state.ledger import StateUnavailable

        try:
            record = self._ledger.load(self.sid)
        except StateUnavailable as exc:
            raise SharedStateError(f"the shared session state cannot be read ({exc})") from exc
        if record is None:
            raise SharedStateError("the session is gone from the shared state (expired or ended)")
        return counts_of(record)

    def remember_exact(self, rule: str, digest: str) -> None:
        from visor.state.ledger import StateUnavailable

        try:
            self._ledger.remember_exact(self.sid, rule, digest)
        except StateUnavailable as exc:
            raise SharedStateError(f"the shared session state cannot keep the approval ({exc})") from exc

    def exact_approvals(self) -> frozenset[tuple[str, str]]:
        from visor.state.ledger import StateUnavailable

        try:
            return self._ledger.exact_approvals(self.sid)
        except StateUnavailable as exc:
            raise SharedStateError(f"the shared session state cannot be read ({exc})") from exc

    def save_pins(self, data: dict[str, Any]) -> None:
        from visor.state.ledger import StateUnavailable

        try:
            self._ledger.save_pins(self.sid, data)
        except StateUnavailable as exc:
            # The pins still hold here; a replica adopting the session would pin afresh, so say so.
            log.error("state_pins_not_saved", mcp_session=self.sid, error=str(exc))


def counts_of(record: LedgerRecord) -> SharedCounts:
    return SharedCounts(record.calls_total, dict(record.tool_calls), tuple(record.history))
