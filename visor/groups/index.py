"""The session's view of its group: membership "seen anywhere in the group",
keys added as the session indexes output, taints and approvals shared.

``GroupIndex.join`` never raises: a store that cannot be opened gives an
index that is ``available == False``, whose every group answer is None (the
caller asks), while what this process saw itself is still answered from its
own tables. Every answer about the group is three-valued:

- ``True``: some server of the group showed it (deny, as for local output);
- ``False``: no server did, and the store vouches for that;
- ``None``: the store cannot tell (unreachable, corrupt, locked, saturated,
  a write lost anywhere in the group): the evaluator must ask, never trust.

Keys reach the store in one transaction per server message (``flush``),
which the gate calls after observing a message and before relaying it to the
client: the client, and so the model, never reads output that the rest of
the group could not yet see.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path

from visor.groups import identity
from visor.groups.store import (
    DEFAULT_MAX_KEYS,
    JOIN_TIMEOUT_S,
    GroupBackend,
    GroupStore,
    GroupStoreError,
    mark_lost,
    store_path,
)
from visor.logs import get_logger
from visor.policy import destinations as dst
from visor.policy.destinations import ASSERTED, ATTRIBUTED, KINDS, OUTPUT

log = get_logger("visor.groups")

__all__ = ["ASSERTED", "ATTRIBUTED", "OUTPUT", "GroupIndex", "GroupTable"]

#: Keys waiting for the next flush, at most (a single huge message): past it
#: the flush happens at once, inside the message (still before it is relayed).
PENDING_MAX = 65_536

#: Destination kinds that are names in one service's namespace: GitHub's user
#: ``mallory7`` and the chat service's ``mallory7`` are two people, and a
#: channel ``ops`` on one service is not the one on another. What a server's
#: trusted field asserted, or a human approved through it, places such a name
#: for that server only (its own session); the group never places it for
#: another. (Seen in output, a name still denies group-wide: more denies only.)
SERVICE_LOCAL_KINDS = frozenset({"user", "channel"})
_SERVICE_LOCAL_PREFIXES = tuple(f"{k}:" for k in sorted(SERVICE_LOCAL_KINDS))


class GroupTable(dst.TracingTable):
    """A drop-in for the session's local ``DigestTable``/``TracingTable``
    (``OutputIndex``'s key table, the ``asserted`` table) that also queues every
    key new to this process for the group store.

    Membership (``in``) stays local and exact as before; the group is asked
    through ``GroupIndex.seen``. A key the local table drops at its own bound
    is still queued: the group has a bound of its own.
    """

    __slots__ = ("_group", "_kind", "_trace")

    def __init__(self, max_keys: int, group: GroupIndex, kind: int, trace: bool = False) -> None:
        super().__init__(max_keys)
        self._group = group
        self._kind = kind
        self._trace = trace

    def add(self, key: str) -> None:
        before = self.count
        if self._trace:
            dst.TracingTable.add(self, key)
        else:
            dst.DigestTable.add(self, key)
        # new here, or dropped at the local bound (the group keeps its own count)
        if self.count != before or (self.saturated and key not in self):
            self._group._queue(self._kind, key)

    def update(self, keys: Iterable[str]) -> None:
        for k in keys:
            self.add(k)


class GroupIndex:
    """One session's membership of its group."""

    def __init__(
        self,
        ident: identity.GroupIdentity,
        store: GroupBackend | None,
        failure: str | None = None,
    ) -> None:
        self.identity = ident
        self.store = store
        self.failure = failure
        self._pending: dict[int, list[str]] = {k: [] for k in KINDS}
        self._npending = 0
        self._tables: dict[int, GroupTable] = {}

    @classmethod
    def join(
        cls,
        ident: identity.GroupIdentity,
        server: str,
        *,
        max_keys: int = DEFAULT_MAX_KEYS,
        home: Path | None = None,
        join_timeout: float = JOIN_TIMEOUT_S,
    ) -> GroupIndex:
        """Open (or create) the group's store and register as a member. Never raises."""
        try:
            store = GroupStore(
                ident.name, server, max_keys=max_keys, client=ident, home=home, join_timeout=join_timeout
            )
        except (GroupStoreError, OSError, sqlite3.Error) as exc:
            # OSError: the folder cannot even be made ($VISOR_HOME under a file,
            # a read-only mount); never a reason to stop the server starting
            reason = f"{type(exc).__name__}: {exc}"
            # The other members must not read our absence as "not seen": tell
            # them the group's record is incomplete (a plain file beside it).
            try:
                path = store_path(ident.name, home)
                marked = mark_lost(path, f"{server} could not join: {reason}")
            except (OSError, identity.GroupNameError):
                marked = False
            log.error("group_unavailable", group=ident.name, error=reason, marked=marked)
            return cls(ident, None, reason)
        return cls(ident, store)

    # ------------------------------------------------------------- state

    @property
    def name(self) -> str:
        return self.identity.name

    @property
    def available(self) -> bool:
        return self.store is not None and self.failure is None

    def audit(self) -> dict[str, object]:
        """What the audit log records of this group (in ``session_start``)."""
        out = self.identity.audit()
        out["group_store"] = "ok" if self.available else f"unavailable: {self.failure}"
        return out

    def table(self, kind: int, max_keys: int, trace: bool = False) -> GroupTable:
        """The local key table of ``kind`` for the session (one per kind)."""
        if kind not in KINDS:
            raise ValueError(f"unknown key kind {kind!r}")
        t = GroupTable(max_keys, self, kind, trace)
        self._tables[kind] = t
        return t

    # ------------------------------------------------------------- keys

    def _queue(self, kind: int, key: str) -> None:
        if self.store is None:
            return
        self._pending[kind].append(key)
        self._npending += 1
        if self._npending >= PENDING_MAX:
            self.flush()

    def flush(self) -> bool:
        """Write every queued key in one transaction. False if the store failed
        (the group is then marked lost: every member asks about what it has not seen)."""
        if self._npending == 0:
            return self.available
        batch = {k: v for k, v in self._pending.items() if v}
        self._pending = {k: [] for k in KINDS}
        self._npending = 0
        if self.store is None:
            return False
        try:
            self.store.record(batch)
        except GroupStoreError as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
            return False
        return True

    def record_outputs(self, keys: Iterable[str], kind: int = OUTPUT) -> None:
        """Queue keys indexed elsewhere (a session not using ``table``)."""
        for k in keys:
            self._queue(kind, k)

    def seen(self, d: dst.Dest, kind: int = OUTPUT) -> bool | None:
        """Whether any server of the group showed ``d`` in output of ``kind``."""
        local = self._tables.get(kind)
        if local is not None and any(k in local for k in d.keys):
            return True
        if self.store is None:
            return None
        if self._npending:
            self.flush()  # never answer "not seen" past our own queued keys
        answer = self.store.seen_any(d.keys, kind)
        if answer is False and self.failure is not None:
            return None
        return answer

    def asserted(self, d: dst.Dest) -> bool | None:
        """Whether a server of the group asserted exactly ``d`` in a trusted field."""
        if d.kind == "opaque":
            return False
        local = self._tables.get(ASSERTED)
        if local is not None and d.key in local:
            return True
        if d.kind in SERVICE_LOCAL_KINDS:
            # a name another service asserted names someone of that service
            return False
        if self.store is None:
            return None
        if self._npending:
            self.flush()
        return self.store.seen(d.key, ASSERTED)

    def where(self, d: dst.Dest, kind: int = OUTPUT) -> str | None:
        """The server whose output first showed ``d``, for the text of a question."""
        if self.store is None:
            return None
        return self.store.where(d.keys, kind)

    # ------------------------------------------------------------- taints

    def raise_taint(self, name: str, tool: str | None = None) -> bool:
        if self.store is None:
            return False
        try:
            self.store.raise_taint(name, tool)
        except GroupStoreError as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
            return False
        return True

    def taints(self) -> frozenset[str] | None:
        """Every taint raised in the group; None: cannot tell (assume every taint)."""
        if self.store is None or self.failure is not None:
            return None
        return self.store.taints()

    # ------------------------------------------------------------- approvals

    def approve(self, tool: str, argument: str, dest: str, remember: bool = False) -> bool:
        """Share a human's yes to ``dest``; False if it could not be shared (it still holds locally)."""
        if self.store is None:
            return False
        try:
            self.store.approve(dest, tool=tool, argument=argument, remember=remember)
        except GroupStoreError as exc:
            log.warning("group_approval_not_shared", group=self.name, error=str(exc))
            return False
        return True

    def approved(self, dest: str) -> bool | None:
        """Whether a human approved ``dest`` through any server of the group.

        A user or channel name (``user:x``, ``channel:x``) is never placed by the
        group: a yes to a name on one service is no yes to that name on another
        (the session's own approvals still place it for its server)."""
        if dest.startswith(_SERVICE_LOCAL_PREFIXES):
            return False
        if self.store is None:
            return None
        return self.store.approved(dest)

    def close(self) -> None:
        if self.store is not None:
            self.flush()
            self.store.close()
