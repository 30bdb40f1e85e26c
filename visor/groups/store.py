"""The group store: one SQLite file (WAL mode) per group under ``$VISOR_HOME/groups``.

What it holds, for every server of the group:

- ``keys``: the provenance keys the sessions' output indexes hold (the same
  strings, ``email:a@b.c``, ``host:h``, ...), as keyed BLAKE2b digests with a
  per-group random key kept in the file. Python's ``hash()`` (what
  ``DigestTable`` uses) is seeded per process and cannot be shared; a keyed
  digest can, and server output cannot be crafted to collide without the key.
  The kind of place (free text, asserted field, attributed field) is part of
  the digested input.
- ``taints``: taint names raised by any server of the group.
- ``approvals``: destinations a human approved, by which server, tool and
  argument, and whether "remember" was chosen.

Reads are point queries on a primary key, outside any write lock (WAL:
readers never wait for the writer). Writes take one transaction per server
message. Nothing is ever fsync'd (``synchronous=OFF``, checkpoints included):
the store must survive a process crash, which WAL gives without fsync, not a
power loss, which ends every client and so every group named after one (an
explicit ``VISOR_GROUP`` outlives it: a file torn by a power loss is refused
as corrupt, which fails closed). With fsync'd checkpoints, one write in ten
paid two fsyncs on the path of a server's answer.

Failing closed: a read that cannot be answered returns None, never "not
seen"; a write that fails raises ``GroupStoreError`` and leaves a ``-lost``
marker beside the file, after which no member of the group answers "not
seen" or "no taints" again (its record may be missing what the failed write
held). At the bound (``max_keys``) the store is ``saturated``: an absent key
proves nothing, and ``seen`` answers None.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import os
import secrets
import sqlite3
import stat
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from visor.audit.paths import visor_home
from visor.groups import identity
from visor.logs import get_logger

# The kinds of place a key was seen in are the session's (re-exported here).
from visor.policy.destinations import ASSERTED as ASSERTED
from visor.policy.destinations import ATTRIBUTED as ATTRIBUTED
from visor.policy.destinations import KINDS, OUTPUT
from visor.userfiles import ensure_dir

log = get_logger("visor.groups")

STORE_FORMAT = 1
#: Keys the store holds at most (all kinds together), as ``output_index_max_keys``.
DEFAULT_MAX_KEYS = 1_000_000
#: How long a per-message read or write waits for a lock before failing closed.
#: A write holds the lock for a millisecond or two; a second of waiting means a
#: member is stuck, and a failed write marks the group lost for good.
BUSY_TIMEOUT_S = 1.0
#: Joining writes the schema and a member row: it may wait longer than a message.
JOIN_TIMEOUT_S = 5.0
#: Groups whose processes are all gone and whose file is older than this are pruned.
STALE_AFTER_S = 6 * 3600.0

_DIGEST_SIZE = 16
#: What SQLite stores and gives back: its five storage classes.
SqlValue = int | float | str | bytes | None
_SUFFIXES = ("-wal", "-shm", "-journal")
LOST_SUFFIX = "-lost"

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS keys (d BLOB PRIMARY KEY, member INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS members (id INTEGER PRIMARY KEY, pid INTEGER NOT NULL,"
    " start TEXT NOT NULL, server TEXT NOT NULL, joined REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS taints (name TEXT NOT NULL, server TEXT NOT NULL, tool TEXT,"
    " at REAL NOT NULL, PRIMARY KEY (name, server)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS approvals (dest TEXT NOT NULL, server TEXT NOT NULL, tool TEXT NOT NULL,"
    " argument TEXT NOT NULL, remember INTEGER NOT NULL, at REAL NOT NULL,"
    " PRIMARY KEY (dest, server, tool, argument)) WITHOUT ROWID",
)


# ------------------------------------------------------------------ errors


class GroupStoreError(Exception):
    """The store could not do what was asked: the caller fails closed."""


class StoreRefused(GroupStoreError):
    """The file or folder is not one Visor may trust (a link, another user's, not a regular file)."""


class StoreCorrupt(GroupStoreError):
    """The file is not a group store SQLite can read."""


class StoreBusy(GroupStoreError):
    """Another process held the lock beyond the busy timeout."""


class StoreFull(GroupStoreError):
    """The disk is full (SQLITE_FULL, ENOSPC, a quota)."""


class StoreIOError(GroupStoreError):
    """The operating system refused a read or write of the file (EIO, a file size limit)."""


class StoreReadOnly(GroupStoreError):
    """The file cannot be written (permissions, a read-only mount)."""


class StoreClosed(GroupStoreError):
    """The store was closed."""


def _map_error(exc: BaseException, what: str) -> GroupStoreError:
    if isinstance(exc, GroupStoreError):
        return exc
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = f"{what}: {exc}"
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return StoreBusy(text)
    if name == "SQLITE_FULL":
        return StoreFull(text)
    if name.startswith("SQLITE_IOERR"):
        # a failed write or read (a file size limit gives SQLITE_IOERR_WRITE, not FULL)
        return StoreIOError(text)
    if name.startswith(("SQLITE_READONLY", "SQLITE_PERM", "SQLITE_CANTOPEN", "SQLITE_AUTH")):
        return StoreReadOnly(text)
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return StoreCorrupt(text)
    if isinstance(exc, OSError) and exc.errno is not None:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return StoreFull(text)
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return StoreReadOnly(text)
    if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
        return StoreCorrupt(text)
    return GroupStoreError(text)


# ------------------------------------------------------------------ files


def groups_dir() -> Path:
    return visor_home() / "groups"


def store_path(group: str, home: Path | None = None) -> Path:
    folder = (home / "groups") if home is not None else groups_dir()
    return folder / f"{identity.validate_name(group)}.sqlite"


def _check_dir(folder: Path) -> None:
    ensure_dir(folder)
    try:
        st = os.lstat(folder)
    except OSError as exc:
        raise StoreRefused(f"{folder}: {exc}") from exc
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise StoreRefused(f"{folder}: not a directory (a symbolic link is refused)")
    if st.st_uid != os.geteuid():
        raise StoreRefused(f"{folder}: owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})")
    if stat.S_IMODE(st.st_mode) & 0o077:
        # Ours, with loose permissions (made by hand): made private again.
        os.chmod(folder, 0o700)


def _check_file(path: Path, create: bool) -> os.stat_result | None:
    """lstat ``path`` and refuse what Visor did not make; a file of ours readable by
    others is made 0600 (the audit log does the same). Creates it with ``create``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            return None
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return _check_file(path, create=False)  # another member created it meanwhile
        except OSError as exc:
            raise _map_error(exc, f"cannot create {path}") from exc
        os.close(fd)
        st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise StoreRefused(f"{path}: is a symbolic link; the group store is never followed through one")
    if not stat.S_ISREG(st.st_mode):
        raise StoreRefused(f"{path}: not a regular file")
    if st.st_uid != os.geteuid():
        raise StoreRefused(f"{path}: owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})")
    if stat.S_IMODE(st.st_mode) & 0o077:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fchmod(fd, 0o600)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StoreRefused(
                f"{path}: mode {stat.S_IMODE(st.st_mode):o} and cannot be made 0600: {exc}"
            ) from exc
        log.warning("group_store_mode_fixed", path=str(path), mode=f"{stat.S_IMODE(st.st_mode):o}")
    return st


LOCK_NAME = ".lock"


@contextlib.contextmanager
def _folder_lock(folder: Path, *, exclusive: bool, wait: bool) -> Iterator[bool]:
    """flock on ``<folder>/.lock``: shared for joining, exclusive for pruning.
    Yields whether the lock is held (only ``wait=False`` can yield False)."""
    try:
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise _map_error(exc, f"cannot open the groups lock in {folder}") from exc
    try:
        flags = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB)
        try:
            fcntl.flock(fd, flags)
        except BlockingIOError:
            yield False
            return
        except OSError as exc:
            raise _map_error(exc, f"cannot lock {folder / LOCK_NAME}") from exc
        yield True
    finally:
        os.close(fd)  # releases the lock


def _lost_path(path: Path) -> Path:
    return path.with_name(path.name + LOST_SUFFIX)


def mark_lost(path: Path, reason: str) -> bool:
    """Leave the marker that says the group's record may miss something; True if it exists now.

    A plain file beside the database: it can be made when SQLite cannot be
    written (locked, corrupt), and every member checks it before answering
    "not seen".
    """
    marker = _lost_path(path)
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return os.path.lexists(marker)
    try:
        os.write(fd, f"{time.time():.3f} pid {os.getpid()}: {reason[:500]}\n".encode())
    except OSError:
        pass
    finally:
        os.close(fd)
    return True


# ------------------------------------------------------------------ the store


@functools.lru_cache(maxsize=64)
def _seen_sql(n: int) -> str:
    # One statement: whether any of n digests is held, and whether absence can be trusted.
    marks = ",".join("?" * n)
    return (
        f"SELECT EXISTS (SELECT 1 FROM keys WHERE d IN ({marks})), (SELECT v FROM meta WHERE k = 'saturated')"
    )


@dataclass(frozen=True, slots=True)
class RecordResult:
    added: int  # keys new to the group
    saturated: bool  # the bound was reached: some key was not kept


@dataclass(frozen=True, slots=True)
class Approval:
    dest: str
    server: str
    tool: str
    argument: str
    remember: bool


class GroupBackend(Protocol):
    """What ``GroupIndex`` asks of a group store: ``GroupStore`` (SQLite, one machine) and
    ``visor.state.redis_store.RedisGroupStore`` (Redis/Valkey, replicas of a gateway).
    Reads answer None when they cannot tell; writes raise ``GroupStoreError``."""

    def record(self, batch: Mapping[int, Iterable[str]]) -> RecordResult: ...

    def seen(self, key: str, kind: int = OUTPUT) -> bool | None: ...

    def seen_any(self, keys: Iterable[str], kind: int = OUTPUT) -> bool | None: ...

    def where(self, keys: Iterable[str], kind: int = OUTPUT) -> str | None: ...

    def raise_taint(self, name: str, tool: str | None = None) -> None: ...

    def taints(self) -> frozenset[str] | None: ...

    def approve(self, dest: str, *, tool: str, argument: str, remember: bool = False) -> None: ...

    def approved(self, dest: str, *, tool: str | None = None, argument: str | None = None) -> bool | None: ...

    def close(self) -> None: ...


def enter_wal(conn: sqlite3.Connection, deadline: float) -> Any:
    """``PRAGMA journal_mode = WAL``, tried again until `deadline` while the file is locked.

    Servers a client starts at once create and join one store together. Switching a new file
    to WAL takes its exclusive lock, and SQLite answers "database is locked" at once, without
    waiting out the busy timeout, where waiting could deadlock two connections that both read
    the file first; the switch succeeds once the other has made it."""
    while True:
        try:
            return conn.execute("PRAGMA journal_mode = WAL").fetchone()
        except sqlite3.OperationalError as exc:
            text = str(exc).lower()
            if ("locked" not in text and "busy" not in text) or time.monotonic() >= deadline:
                raise
        time.sleep(0.005)


class GroupStore:
    """One member's connection to its group's store.

    Not thread-safe: one ``visor run`` uses it from its event loop thread.
    """

    def __init__(
        self,
        group: str,
        server: str,
        *,
        max_keys: int = DEFAULT_MAX_KEYS,
        client: identity.GroupIdentity | None = None,
        home: Path | None = None,
        busy_timeout: float = BUSY_TIMEOUT_S,
        join_timeout: float = JOIN_TIMEOUT_S,
    ) -> None:
        self.group = identity.validate_name(group)
        self.server = server
        self.path = store_path(group, home)
        self._lost_marker = _lost_path(self.path)
        self._conn: sqlite3.Connection | None = None
        self._lost = False
        self._read_warned = False
        self.member_id = 0
        # A file pruned between our open and our join: open again, once.
        for attempt in range(2):
            try:
                self._open(max_keys, client, busy_timeout, join_timeout)
                return
            except _Replaced:
                if attempt:
                    raise StoreBusy(f"{self.path}: the group file was replaced twice while joining") from None

    # ------------------------------------------------------------- opening

    def _open(
        self,
        max_keys: int,
        client: identity.GroupIdentity | None,
        busy_timeout: float,
        join_timeout: float,
    ) -> None:
        _check_dir(self.path.parent)
        # Shared: members join at once; prune_stale takes it exclusively, so a
        # group is never removed between a member's check of its file and its
        # registration as a live member.
        with _folder_lock(self.path.parent, exclusive=False, wait=True):
            self._join(max_keys, client, busy_timeout, join_timeout)

    def _join(
        self,
        max_keys: int,
        client: identity.GroupIdentity | None,
        busy_timeout: float,
        join_timeout: float,
    ) -> None:
        before = _check_file(self.path, create=True)
        assert before is not None
        for suffix in _SUFFIXES:
            _check_file(self.path.with_name(self.path.name + suffix), create=False)
        try:
            conn = sqlite3.connect(
                f"file:{self.path}?mode=rw",
                uri=True,
                timeout=join_timeout,
                isolation_level=None,
                cached_statements=64,
            )
        except sqlite3.Error as exc:
            raise _map_error(exc, f"cannot open {self.path}") from exc
        try:
            self._init(conn, max_keys, client, time.monotonic() + join_timeout)
            after = os.lstat(self.path)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, FileNotFoundError):
                raise _Replaced from None
            if isinstance(exc, sqlite3.Error | OSError):
                raise _map_error(exc, f"cannot join group store {self.path}") from exc
            raise
        if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino) or stat.S_ISLNK(after.st_mode):
            # replaced between our check and our join (by hand, or by a Visor
            # without the folder lock): our row went to a dead file
            conn.close()
            raise _Replaced
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        self._conn = conn

    def _init(
        self, conn: sqlite3.Connection, max_keys: int, client: identity.GroupIdentity | None, deadline: float
    ) -> None:
        mode = enter_wal(conn, deadline)
        if mode is None or str(mode[0]).lower() != "wal":
            raise StoreReadOnly(f"{self.path}: WAL mode refused (journal_mode {mode and mode[0]!r})")
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("BEGIN IMMEDIATE")
        try:
            for sql in _SCHEMA:
                conn.execute(sql)
            fmt = conn.execute("SELECT v FROM meta WHERE k = 'format'").fetchone()
            if fmt is None:
                now = time.time()
                conn.executemany(
                    "INSERT INTO meta (k, v) VALUES (?, ?)",
                    [
                        ("format", STORE_FORMAT),
                        ("secret", secrets.token_bytes(32)),
                        ("count", 0),
                        ("saturated", 0),
                        ("max_keys", int(max_keys)),
                        ("created", now),
                        ("client_pid", client.client_pid if client is not None else None),
                        ("client_start", client.client_start if client is not None else None),
                    ],
                )
            elif fmt[0] != STORE_FORMAT:
                raise StoreCorrupt(f"{self.path}: group store format {fmt[0]!r}, expected {STORE_FORMAT}")
            me = identity.process_info(os.getpid())
            cur = conn.execute(
                "INSERT INTO members (pid, start, server, joined) VALUES (?, ?, ?, ?)",
                (os.getpid(), me.start if me is not None else "", self.server, time.time()),
            )
            self.member_id = int(cur.lastrowid or 0)
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        secret = conn.execute("SELECT v FROM meta WHERE k = 'secret'").fetchone()
        bound = conn.execute("SELECT v FROM meta WHERE k = 'max_keys'").fetchone()
        if secret is None or not isinstance(secret[0], bytes) or len(secret[0]) != 32 or bound is None:
            raise StoreCorrupt(f"{self.path}: the group store's key or bound is missing or malformed")
        self._secret = secret[0]
        self._hashers = {
            kind: hashlib.blake2b(
                key=self._secret, digest_size=_DIGEST_SIZE, person=b"visor-group\0" + bytes((kind,))
            )
            for kind in KINDS
        }
        self.max_keys = int(bound[0])

    # ------------------------------------------------------------- helpers

    def _c(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreClosed(f"{self.path}: closed")
        return self._conn

    def digest(self, key: str, kind: int = OUTPUT) -> bytes:
        """The keyed digest ``key`` is stored as (kind is part of the input)."""
        h = self._hashers[kind].copy()  # a copy skips the key block: half the cost
        h.update(key.encode("utf-8", "surrogatepass"))
        return h.digest()

    @property
    def lost(self) -> bool:
        """Some write of the group failed (here or in another member): absence proves nothing."""
        if self._lost:
            return True
        if os.path.lexists(self._lost_marker):
            self._lost = True  # a marker is never removed while the group lives
        return self._lost

    def _fail_write(self, exc: BaseException, what: str) -> GroupStoreError:
        err = _map_error(exc, what)
        self._lost = True
        mark_lost(self.path, f"{self.server}: {err}")
        log.error("group_store_write_failed", group=self.group, path=str(self.path), error=str(err))
        return err

    @contextlib.contextmanager
    def _write(self, what: str) -> Iterator[sqlite3.Connection]:
        conn = self._c()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise self._fail_write(exc, what) from exc
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error | OSError | GroupStoreError):
                raise self._fail_write(exc, what) from exc
            raise

    def _read(self, sql: str, params: tuple[SqlValue, ...] = ()) -> list[tuple[SqlValue, ...]] | None:
        try:
            return self._c().execute(sql, params).fetchall()
        except (sqlite3.Error, GroupStoreError) as exc:
            if not self._read_warned:  # once: a broken store would say it on every lookup
                self._read_warned = True
                log.warning("group_store_read_failed", group=self.group, error=str(_map_error(exc, "read")))
            return None

    # ------------------------------------------------------------- keys

    def record(self, batch: Mapping[int, Iterable[str]]) -> RecordResult:
        """Add keys of each kind, in one transaction. Raises GroupStoreError (and marks the group lost)."""
        rows: list[tuple[bytes, int]] = []
        member = self.member_id
        for kind, keys in batch.items():
            if kind not in KINDS:
                raise ValueError(f"unknown key kind {kind!r}")
            rows.extend((self.digest(k, kind), member) for k in keys)
        if not rows:
            return RecordResult(0, False)
        # each digest once (the count below must be exact), in key order (B-tree locality)
        rows = sorted(dict(rows).items())
        with self._write("record keys") as conn:
            count = int(conn.execute("SELECT v FROM meta WHERE k = 'count'").fetchone()[0])
            room = self.max_keys - count
            saturated = False
            if len(rows) <= room:
                added = conn.executemany(
                    "INSERT OR IGNORE INTO keys (d, member) VALUES (?, ?)", rows
                ).rowcount
            else:
                added = 0
                for row in rows:
                    if added < room:
                        added += conn.execute(
                            "INSERT OR IGNORE INTO keys (d, member) VALUES (?, ?)", row
                        ).rowcount
                    elif conn.execute("SELECT 1 FROM keys WHERE d = ?", (row[0],)).fetchone() is None:
                        saturated = True
                        break
            if added:
                conn.execute("UPDATE meta SET v = v + ? WHERE k = 'count'", (added,))
            if saturated:
                conn.execute("UPDATE meta SET v = 1 WHERE k = 'saturated'")
        return RecordResult(added, saturated)

    def record_outputs(self, keys: Iterable[str], kind: int = OUTPUT) -> RecordResult:
        return self.record({kind: keys})

    def seen(self, key: str, kind: int = OUTPUT) -> bool | None:
        """True: some member's output showed ``key``. False: none did. None: the
        store cannot tell (unreadable, saturated, or a write was lost): ask."""
        return self.seen_any((key,), kind)

    def seen_any(self, keys: Iterable[str], kind: int = OUTPUT) -> bool | None:
        """``seen`` for any of ``keys`` (a destination's keys), in one query."""
        ds = tuple(self.digest(k, kind) for k in keys)
        if not ds:
            return False
        rows = self._read(_seen_sql(len(ds)), ds)
        if not rows:
            return None
        found, saturated = rows[0]
        if found:
            return True
        if saturated or self.lost:
            return None
        return False

    def where(self, keys: Iterable[str], kind: int = OUTPUT) -> str | None:
        """The server whose output first showed one of ``keys``, if any and readable."""
        for k in keys:
            rows = self._read(
                "SELECT m.server FROM keys k JOIN members m ON m.id = k.member WHERE k.d = ?",
                (self.digest(k, kind),),
            )
            if rows:
                return str(rows[0][0])
        return None

    @property
    def saturated(self) -> bool | None:
        rows = self._read("SELECT v FROM meta WHERE k = 'saturated'")
        return None if not rows else bool(rows[0][0])

    def count(self) -> int | None:
        rows = self._read("SELECT v FROM meta WHERE k = 'count'")
        value = rows[0][0] if rows else None
        return None if value is None else int(value)

    # ------------------------------------------------------------- taints

    def raise_taint(self, name: str, tool: str | None = None) -> None:
        """Record that this server raised ``name``. Raises GroupStoreError (and marks the group lost)."""
        with self._write("raise taint") as conn:
            conn.execute(
                "INSERT OR IGNORE INTO taints (name, server, tool, at) VALUES (?, ?, ?, ?)",
                (name, self.server, tool, time.time()),
            )

    def taints(self) -> frozenset[str] | None:
        """Every taint any member raised; None when the store cannot tell (a lost write included)."""
        rows = self._read("SELECT DISTINCT name FROM taints")
        if rows is None or self.lost:
            return None
        return frozenset(str(r[0]) for r in rows)

    def taint_sources(self) -> dict[str, tuple[str, ...]] | None:
        rows = self._read("SELECT name, server FROM taints ORDER BY name, server")
        if rows is None:
            return None
        out: dict[str, list[str]] = {}
        for name, server in rows:
            out.setdefault(str(name), []).append(str(server))
        return {k: tuple(v) for k, v in out.items()}

    # ------------------------------------------------------------- approvals

    def approve(self, dest: str, *, tool: str, argument: str, remember: bool = False) -> None:
        """A human approved ``dest`` (a destination key) for this server's ``tool`` and ``argument``."""
        with self._write("approve") as conn:
            conn.execute(
                "INSERT INTO approvals (dest, server, tool, argument, remember, at) VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (dest, server, tool, argument)"
                " DO UPDATE SET remember = max(remember, excluded.remember), at = excluded.at",
                (dest, self.server, tool, argument, int(remember), time.time()),
            )

    def approved(self, dest: str, *, tool: str | None = None, argument: str | None = None) -> bool | None:
        """Whether a human of this group approved ``dest`` (for ``tool``/``argument``
        when given, through any server); None when the store cannot tell."""
        sql = "SELECT EXISTS (SELECT 1 FROM approvals WHERE dest = ?"
        params: tuple[SqlValue, ...] = (dest,)
        if tool is not None:
            sql += " AND tool = ?"
            params += (tool,)
        if argument is not None:
            sql += " AND argument = ?"
            params += (argument,)
        rows = self._read(sql + ")", params)
        return None if not rows else bool(rows[0][0])

    def approvals(self) -> list[Approval] | None:
        rows = self._read(
            "SELECT dest, server, tool, argument, remember FROM approvals ORDER BY dest, server"
        )
        if rows is None:
            return None
        return [Approval(str(d), str(s), str(t), str(a), bool(r)) for d, s, t, a, r in rows]

    # ------------------------------------------------------------- life

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def __enter__(self) -> GroupStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Replaced(Exception):
    """The file was pruned or replaced while we joined: open it afresh."""


# ------------------------------------------------------------------ pruning


def _files_of(db: Path) -> list[Path]:
    return [db, *(db.with_name(db.name + s) for s in (*_SUFFIXES, LOST_SUFFIX))]


def _newest_mtime(db: Path) -> float:
    newest = 0.0
    for p in _files_of(db):
        with contextlib.suppress(OSError):
            newest = max(newest, os.lstat(p).st_mtime)
    return newest


def prune_stale(
    max_age: float = STALE_AFTER_S, *, home: Path | None = None, now: float | None = None
) -> list[str]:
    """Remove the stores of groups that are over: no member and no client process
    alive, and no file touched for ``max_age`` seconds. Returns the groups removed.

    A store that cannot be read (corrupt, another user's, a link) is left alone:
    what cannot be read cannot be shown to be over.
    """
    folder = (home / "groups") if home is not None else groups_dir()
    now = time.time() if now is None else now
    removed: list[str] = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return removed
    for fname in names:
        if not fname.endswith(".sqlite"):
            continue
        group = fname[: -len(".sqlite")]
        db = folder / fname
        try:
            identity.validate_name(group)
            st = os.lstat(db)
        except (identity.GroupNameError, OSError):
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            continue
        if now - _newest_mtime(db) < max_age:
            continue
        try:
            if _prune_one(db):
                removed.append(group)
        except (sqlite3.Error, OSError, GroupStoreError) as exc:
            log.warning("group_prune_skipped", group=group, error=str(exc))
    return removed


def _prune_one(db: Path) -> bool:
    with _folder_lock(db.parent, exclusive=True, wait=False) as locked:
        if not locked:
            return False  # a member is joining right now: not over, try next time
        if os.lstat(db).st_size == 0:
            # created by a member that died before it wrote the schema, hours ago
            _unlink_all(db)
            return True
        conn = sqlite3.connect(f"file:{db}?mode=rw", uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            meta = dict(conn.execute("SELECT k, v FROM meta WHERE k IN ('client_pid', 'client_start')"))
            members = conn.execute("SELECT pid, start FROM members").fetchall()
        finally:
            # Closed before the files go: SQLite removes the "-wal" by name when
            # its last connection closes, which must never hit a newer group's.
            conn.close()
        pid, start = meta.get("client_pid"), meta.get("client_start")
        if isinstance(pid, int) and identity.alive(pid, str(start or "")):
            return False
        if any(identity.alive(int(p), str(s)) for p, s in members):
            return False
        # No member is alive and none can join while the lock is held.
        _unlink_all(db)
        return True


def _unlink_all(db: Path) -> None:
    for p in _files_of(db):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
