"""Append records to the audit log with group commit.

One dedicated thread makes the fsyncs.  Callers stamp and hash their record
under a lock (so queue order is seq order and `append` can return the finished
record at once), then the thread takes everything queued, writes it with one
`write` and covers it with one `fdatasync`.  While that fsync is in flight new
records pile up and go out together in the next round: that is the group
commit, and it is why many concurrent allows cost few fsyncs.  Results go back
to each caller's event loop with `call_soon_threadsafe`, so the loop never
waits on the disk.

Records nobody waits for (`append`: a deny, a result) are written by the
caller itself, under the lock, when nothing else is queued and the thread is
not writing (at the end of a `batch()`, all of the batch's with one `write`):
they are then in the file (the kernel's page cache) before the caller goes on,
and no thread is woken for them. Waking the thread for each such record
made it contend for the GIL with the loop, which was then taking the next
request; the allow that followed waited for that write before its own. The
thread fsyncs such records with the next group, or within IDLE_SYNC_SECONDS.

A failed write or fsync poisons the writer for good: after a failed fsync the
kernel may already have dropped the dirty pages, so nothing written since the
last good fsync can be trusted to be on disk, and a retry would lie.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from visor import __version__
from visor.audit import record as rec
from visor.audit.paths import lock_path, next_rotated_name, rotated_files
from visor.audit.tail import TailTooLong, read_first_line, read_tail

if TYPE_CHECKING:
    from visor.audit.signing import Signer

__all__ = [
    "AuditError",
    "AuditStats",
    "AuditUnhealthy",
    "AuditWriter",
    "new_session_id",
]

# With nothing but non-durable records (denies, results) written, fsync them
# after this much quiet so they do not wait indefinitely for the next allow.
IDLE_SYNC_SECONDS = 1.0

# A sole caller's allow is made durable on its own thread only when no other caller wrote for this
# long (another session is active: group commit serves it better) ...
QUIET_SECONDS = 0.005
# ... and when the last fsync was at least this quick: the caller's loop waits for it.
CALLER_FSYNC_MAX_SECONDS = 0.002

# Signed checkpoints (visor/audit/signing.py, which re-exports these): one every this many
# records, or this long after the first record it would cover, whichever comes first; and
# one at every clean close and rotation. Here, so that `visor run` offers its options
# (visor/audit/commands.py) without importing the signing module when no key is given.
DEFAULT_EVERY = 1000
DEFAULT_SECONDS = 60.0

_LOG_FLAGS = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
_default_fsync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


class AuditError(Exception):
    """The log cannot be opened; the message names the file, the line and the fix."""


class AuditLogBusy(AuditError):
    """Another Visor process appends to this log."""


class AuditUnhealthy(Exception):
    """A write or fsync failed (or the writer is closed); nothing more is committed."""


@dataclass(frozen=True, slots=True)
class AuditStats:
    records_written: int
    commits: int  # durable commits resolved successfully
    write_count: int
    fsync_count: int
    largest_group: int  # most commits covered by one fsync
    bytes_written: int
    rotations: int
    caller_fsyncs: int = 0  # fsyncs made on a sole caller's thread (module docstring)


@dataclass(frozen=True, slots=True)
class _Pending:
    line: bytes
    record: dict[str, Any]
    future: asyncio.Future[dict[str, Any]] | None
    loop: asyncio.AbstractEventLoop | None


class _Batch:
    """`AuditWriter.batch()`: a class, not a generator, as the relay enters one per event."""

    __slots__ = ("_writer",)

    def __init__(self, writer: AuditWriter) -> None:
        self._writer = writer

    def __enter__(self) -> None:
        self._writer._hold()

    def __exit__(self, *exc: object) -> None:
        self._writer._release()


class _Rotate:
    """Queue marker: close this file and continue the chain in a new one."""

    __slots__ = ("target",)

    def __init__(self, target: Path) -> None:
        self.target = target


def new_session_id() -> str:
    return uuid.uuid4().hex


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _ensure_dir(directory: Path) -> None:
    """Create missing directories 0700 and make their entries durable."""
    missing: list[Path] = []
    probe = directory
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o700)
        os.chmod(d, 0o700)  # the umask may have narrowed it further; be exact
        fsync_dir(d.parent)


def acquire_lock(path: Path) -> int:
    """Exclusive lock for one chain: two appenders would fork it."""
    lp = lock_path(path)
    try:
        fd = os.open(lp, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise AuditError(f"{path}: cannot open the lock file {lp}: {exc.strerror}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise AuditLogBusy(
            f"{path}: the audit log is in use by another Visor process (pid {holder}). "
            "Only one process may append to a log; give each `visor run` its own audit path."
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _open_log(path: Path) -> tuple[int, bool]:
    created = False
    try:
        try:
            # O_NONBLOCK so that a FIFO planted at the path cannot hang start-up.
            fd = os.open(path, _LOG_FLAGS | os.O_NONBLOCK)
        except FileNotFoundError:
            fd = os.open(path, _LOG_FLAGS | os.O_NONBLOCK | os.O_CREAT | os.O_EXCL, 0o600)
            created = True
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise AuditError(
                f"{path}: is a symbolic link; the audit log is opened with O_NOFOLLOW and a link "
                "is refused. Point the audit path at a regular file."
            ) from exc
        raise AuditError(f"{path}: cannot open the audit log: {exc.strerror}") from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise AuditError(f"{path}: is not a regular file; refusing to use it as the audit log")
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    if stat.S_IMODE(st.st_mode) != 0o600:
        os.fchmod(fd, 0o600)  # arguments are sensitive even after redaction
    if created:
        fsync_dir(path.parent)
    return fd, created


def _repair_hint(path: Path) -> str:
    return (
        f"Visor will not append to a damaged log. Inspect it with `visor audit verify {path}`; "
        f"if only the end is damaged (a write cut short by a crash), `visor audit repair {path}` "
        f"moves the damaged tail into {path.name}.torn, records an audit_repair event and "
        "continues the chain."
    )


def _foreign_hint(path: Path) -> str:
    return (
        "This file was not written by this version of Visor, so Visor will neither append to it "
        "nor overwrite it. Use another audit path or move the file away."
    )


def check_tail(path: Path, fd: int) -> rec.Parsed | None:
    """Check the last line and its link to the one before; None for an empty file.

    Raises AuditError naming the file and line.  Reads only the ends of the file.
    """
    try:
        tail = read_tail(fd, 2)
    except TailTooLong as exc:
        raise AuditError(
            f"{path}: the last line is not a Visor record ({exc}). {_foreign_hint(path)}"
        ) from exc
    if tail.size == 0:
        return None

    first_seq: int | None = None
    first = read_first_line(fd)
    if first is not None:
        with contextlib.suppress(rec.RecordError):
            first_seq = rec.parse_line(first).seq

    parsed: list[rec.Parsed | rec.RecordError] = []
    for raw in tail.lines:
        try:
            parsed.append(rec.parse_line(raw))
        except rec.RecordError as exc:
            parsed.append(exc)

    def line_no(index: int) -> str:
        """Name line `index` of the (lines + torn) window by its number in the file."""
        if tail.from_start:
            return f"line {index + 1}"
        if first_seq is not None:
            for i, p in enumerate(parsed):
                if isinstance(p, rec.Parsed):
                    return f"line {p.seq - first_seq + 1 + (index - i)}"
        return (
            "the last line" if index >= len(tail.lines) - (0 if tail.torn else 1) else "the line before last"
        )

    if tail.torn:
        raise AuditError(
            f"{path}: {line_no(len(tail.lines))}: the last line is incomplete ({len(tail.torn)} bytes at "
            f"offset {tail.torn_offset} without a newline). {_repair_hint(path)}"
        )
    last_i = len(parsed) - 1
    last = parsed[last_i]
    if isinstance(last, rec.RecordError):
        hint = _foreign_hint(path) if last.kind == "foreign" else _repair_hint(path)
        raise AuditError(f"{path}: {line_no(last_i)}: {last.reason}. {hint}")
    before: rec.Parsed | None = None
    if last_i >= 1:
        prior = parsed[last_i - 1]
        if isinstance(prior, rec.RecordError):
            hint = _foreign_hint(path) if prior.kind == "foreign" else _repair_hint(path)
            raise AuditError(f"{path}: {line_no(last_i - 1)}: {prior.reason}. {hint}")
        before = prior
    why = rec.link_problem(before, last)
    if why is not None:
        raise AuditError(f"{path}: {line_no(last_i)}: {why}. {_repair_hint(path)}")
    return last


class AuditWriter:
    """Hash-chained, append-only audit log with group commit. Use `AuditWriter.open`."""

    def __init__(
        self,
        *,
        path: Path,
        fd: int,
        lock_fd: int,
        session: str,
        seq: int,
        prev: str,
        size: int,
        max_bytes: int | None,
        durable: bool,
        fsync: Callable[[int], None],
        write: Callable[[int, bytes | memoryview], int],
        clock: Callable[[], str],
        signer: Signer | None = None,
    ) -> None:
        self._path = path
        self._fd = fd
        self._lock_fd = lock_fd
        self._session = session
        self._seq = seq
        self._prev = prev
        self._size = size
        self._max_bytes = max_bytes
        self._durable = durable
        self._fsync = fsync
        self._write = write
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: list[_Pending | _Rotate] = []
        self._closing = False
        self._healthy = True
        self._failure = ""
        # Writes made (by the thread, or by a caller directly), and how many of them the last good
        # fsync covered: the difference is what is written but not yet durable.
        self._written = 0
        self._synced = 0
        # The thread is writing a batch it took from the queue (outside the lock): a caller
        # must queue its record behind it, never write around it.
        self._writing = False
        # Inside `batch()`: records queued without waking the thread yet.
        self._held = 0
        self._wake_pending = False
        self._batch = _Batch(self)
        self._records = self._commits = self._writes = self._fsyncs = 0
        self._caller_fsyncs = 0
        # Who wrote last (a `sole` key; None for callers that name none), since when only they
        # have, and how long the last fsync took: what a sole caller's own commit depends on.
        self._writer_key: object = None
        self._writer_key_since = 0.0
        self._last_fsync_seconds = float("inf")
        self._largest = self._bytes = self._rotations = 0
        self._next_rotation = int(next_rotated_name(path).name.rsplit(".", 1)[1])
        # Signed checkpoints (visor/audit/signing.py): records stamped since the
        # last one, and when the time trigger falls due (time.monotonic()).
        self._signer = signer
        self._unsigned = 0
        self._checkpoint_due = float("inf")
        self._checkpoints = 0
        self._thread = threading.Thread(target=self._run, name=f"visor-audit:{path.name}", daemon=True)

    # ---------------------------------------------------------------- opening

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        session: str,
        max_bytes: int | None = None,
        durable: bool = True,
        fsync: Callable[[int], None] | None = None,
        write: Callable[[int, bytes | memoryview], int] | None = None,
        clock: Callable[[], str] | None = None,
        signer: Signer | None = None,
        _lock_fd: int | None = None,
    ) -> AuditWriter:
        """Open (or create) the log, check its tail, continue its chain, write `audit_open`.

        `fsync` and `write` replace os.fdatasync / os.write for fault-injection tests.
        With a `signer`, a signed `checkpoint` record follows every `signer.every`
        records, `signer.seconds` after the first record it would cover, before
        each rotation, and at close.
        """
        path = Path(path)
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        try:
            _ensure_dir(path.parent)
        except OSError as exc:
            raise AuditError(f"{path}: cannot create the directory {path.parent}: {exc.strerror}") from exc
        lock_fd = _lock_fd if _lock_fd is not None else acquire_lock(path)
        fd = -1
        try:
            fd, _ = _open_log(path)
            last = check_tail(path, fd)
            rotated_from: str | None = None
            if last is None:
                # An empty live file: continue from the newest rotated file, if any
                # (a crash between rotating and the first write leaves exactly this).
                older = rotated_files(path)
                if older:
                    last = _tail_of(older[-1])
                    rotated_from = older[-1].name
            size = os.fstat(fd).st_size
            writer = cls(
                path=path,
                fd=fd,
                lock_fd=lock_fd,
                session=session,
                seq=last.seq + 1 if last else 0,
                prev=last.hash if last else rec.GENESIS,
                size=size,
                max_bytes=max_bytes,
                durable=durable,
                fsync=fsync or _default_fsync,
                write=write or os.write,
                clock=clock or rec.utc_timestamp,
                signer=signer,
            )
            writer._write_open_record(rotated_from)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            if _lock_fd is None:
                os.close(lock_fd)
            raise
        writer._thread.start()
        return writer

    def _open_event(self, rotated_from: str | None) -> dict[str, Any]:
        event: dict[str, Any] = {
            "event": "audit_open",
            "durable": self._durable,
            "file": self._path.name,
            "pid": os.getpid(),
            "visor": __version__,
        }
        if rotated_from:
            event["rotated_from"] = rotated_from
        return event

    def _write_open_record(self, rotated_from: str | None) -> None:
        """Synchronously, before any traffic: proves at start-up that we can write and fsync."""
        enc = self._stamp(self._open_event(rotated_from))
        try:
            self._write_all(enc.line)
            if self._durable:
                began = time.perf_counter()
                self._fsync(self._fd)
                self._last_fsync_seconds = time.perf_counter() - began
                self._fsyncs += 1
        except OSError as exc:
            raise AuditError(f"{self._path}: cannot write the audit log: {exc.strerror or exc}") from exc
        self._records += 1

    # -------------------------------------------------------------- public API

    @property
    def healthy(self) -> bool:
        return self._healthy

    @property
    def path(self) -> Path:
        return self._path

    @property
    def session(self) -> str:
        return self._session

    @property
    def checkpoints(self) -> int:
        """Signed checkpoints stamped by this writer."""
        with self._cond:
            return self._checkpoints

    def observe_fsync(self, report: Callable[[float], None]) -> None:
        """Call `report(seconds)` after every fsync, on the writer's thread (telemetry).

        Set before traffic starts. A report that raises is dropped: an
        observer's failure must never read as a failed fsync, which would
        poison the log.
        """
        inner = self._fsync

        def timed(fd: int) -> None:
            began = time.perf_counter()
            inner(fd)
            with contextlib.suppress(Exception):
                report(time.perf_counter() - began)

        self._fsync = timed

    @property
    def stats(self) -> AuditStats:
        with self._cond:
            return AuditStats(
                records_written=self._records,
                commits=self._commits,
                write_count=self._writes,
                fsync_count=self._fsyncs,
                largest_group=self._largest,
                bytes_written=self._bytes,
                rotations=self._rotations,
                caller_fsyncs=self._caller_fsyncs,
            )

    async def commit(self, event: dict[str, Any]) -> dict[str, Any]:
        """Append `event` and return its record once an fsync covering it has returned."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._enqueue(event, future, loop)
        # If the caller is cancelled the record is still written: cancellation
        # withdraws the wait, never the evidence.
        return await future

    def submit(
        self, event: dict[str, Any], *, key: object = None, sole: bool = False
    ) -> asyncio.Future[dict[str, Any]]:
        """`commit` without a coroutine: the record takes its place in the log now.

        The returned future resolves once an fsync covering the record has
        returned. The gate uses this so that records it appends right after an
        allow (taints) follow the allow in the chain, and no task is created
        per call. `key` names the caller (an MCP session of the gateway);
        `sole` says it has no other call in flight, which lets the writer make
        the record durable on this thread when nothing else is going on (the
        module's docstring): the future is then already done on return.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._enqueue(event, future, loop, key, sole)
        return future

    def append(self, event: dict[str, Any], *, key: object = None) -> dict[str, Any]:
        """Append `event` without waiting; it is fsync'd with the next group."""
        return self._enqueue(event, None, None, key)

    def batch(self) -> AbstractContextManager[None]:
        """Queue several records with one wake-up of the writer thread, at the end.

        Otherwise the first record of a batch wakes the thread, which takes the
        queue as it stands: one read's worth of allows would be split over
        several groups (more fsyncs), and the thread would compete for the GIL
        with the loop that is still queueing them. Records are stamped, chained
        and ordered exactly as without it; only the wake-up is deferred.
        """
        return self._batch

    def _hold(self) -> None:
        with self._cond:
            self._held += 1

    def _release(self) -> None:
        with self._cond:
            self._held -= 1
            if not self._held and self._wake_pending:
                self._wake_pending = False
                if self._queue:
                    # A write that fails here poisons the writer: the next commit fails
                    # closed. The batch's caller is not the one to hear of it (its records
                    # were accepted; the thread losing them would not tell it either).
                    with contextlib.suppress(AuditUnhealthy):
                        self._hand_on()

    async def close(self) -> None:
        """Write and fsync everything queued, then stop the thread. Writes no record."""
        self._begin_close()
        await asyncio.to_thread(self._thread.join)

    def close_sync(self) -> None:
        """`close` for callers without an event loop (CLI commands, tests)."""
        self._begin_close()
        self._thread.join()

    # --------------------------------------------------------------- queueing

    def _stamp(self, event: dict[str, Any]) -> rec.Encoded:
        """Assign seq/prev/ts and hash; caller holds the lock (or runs before the thread)."""
        enc = rec.build(event, session=self._session, seq=self._seq, prev=self._prev, ts=self._clock())
        self._seq += 1
        self._prev = enc.record["hash"]
        self._size += len(enc.line)
        if self._signer is not None:
            self._unsigned += 1
            if self._unsigned == 1 and self._signer.seconds:
                self._checkpoint_due = time.monotonic() + self._signer.seconds
        return enc

    def _queue_checkpoint(self, reason: str) -> None:
        """Sign the position reached and queue the checkpoint; caller holds the lock.

        The signature covers this record's own seq, prev and ts, so those are
        fixed here, under the lock that orders the chain, and then stamped.
        """
        assert self._signer is not None
        ts = self._clock()
        event = self._signer.checkpoint(
            log=self._path.name, seq=self._seq, prev=self._prev, ts=ts, reason=reason
        )
        enc = rec.build(event, session=self._session, seq=self._seq, prev=self._prev, ts=ts)
        self._seq += 1
        self._prev = enc.record["hash"]
        self._size += len(enc.line)
        self._unsigned = 0
        self._checkpoint_due = float("inf")
        self._checkpoints += 1
        self._queue.append(_Pending(enc.line, enc.record, None, None))

    def _enqueue(
        self,
        event: dict[str, Any],
        future: asyncio.Future[dict[str, Any]] | None,
        loop: asyncio.AbstractEventLoop | None,
        key: object = None,
        sole: bool = False,
    ) -> dict[str, Any]:
        with self._cond:
            if not self._healthy:
                raise AuditUnhealthy(self._failure)
            if self._closing:
                raise AuditUnhealthy(f"{self._path}: the audit writer is closed")
            now = time.monotonic()
            if key != self._writer_key:
                self._writer_key = key
                self._writer_key_since = now
                here = False
            else:
                here = (
                    sole
                    and not self._writing
                    and now - self._writer_key_since >= QUIET_SECONDS
                    and self._last_fsync_seconds <= CALLER_FSYNC_MAX_SECONDS
                    and loop is asyncio.get_running_loop()
                    and all(type(p) is _Pending and p.future is None for p in self._queue)
                )
            enc = self._stamp(event)
            self._queue.append(_Pending(enc.line, enc.record, future, loop))
            if here:
                self._commit_here()
            if self._signer is not None and self._signer.every and self._unsigned >= self._signer.every:
                self._queue_checkpoint("interval")
            if self._max_bytes is not None and self._size >= self._max_bytes:
                self._queue_rotation()
            if self._queue:
                if self._held:
                    self._wake_pending = True
                else:
                    self._hand_on()
        return enc.record

    def _hand_on(self) -> None:
        """What is queued goes out: written here when nobody waits for it, else by the thread.

        Caller holds the lock. Records nobody waits for (denies, results), with nothing
        before them still unwritten, are written at once with one `write`, in seq order; the
        thread fsyncs them with its next group or within IDLE_SYNC_SECONDS. Anything else (an
        allow to make durable, a rotation, a checkpoint) wakes the thread, which takes them all.
        """
        queue = self._queue
        if self._writing or not all(type(p) is _Pending and p.future is None for p in queue):
            self._cond.notify()
            return
        self._queue = []
        try:
            self._write_all(b"".join(p.line for p in queue if type(p) is _Pending))
        except OSError as exc:
            self._poison(
                f"{self._path}: audit write failed: {exc.strerror or exc}; no further call is allowed"
            )
            raise AuditUnhealthy(self._failure) from exc
        self._records += len(queue)

    def _commit_here(self) -> None:
        """Write what is queued and fsync it on the caller's thread, then settle its waiter here.

        Caller holds the lock, so the thread cannot take a batch meanwhile, and has checked that
        the thread is not writing and that only the sole caller's record is waited for: the file
        stays in seq order. A failure poisons the writer and reaches the waiter, as from the thread.
        """
        queue, self._queue = self._queue, []
        segment = [p for p in queue if type(p) is _Pending]
        failure: str | None = None
        try:
            self._write_all(b"".join(p.line for p in segment))
            covered = self._written
            if self._durable:
                began = time.perf_counter()
                self._fsync(self._fd)
                self._last_fsync_seconds = time.perf_counter() - began
                self._fsyncs += 1
                self._caller_fsyncs += 1
            self._synced = max(self._synced, covered)
        except OSError as exc:
            self._poison(
                f"{self._path}: audit write failed: {exc.strerror or exc}; no further call is allowed"
            )
            failure = self._failure
        else:
            self._records += len(segment)
            self._commits += 1
            self._largest = max(self._largest, 1)
        for p in segment:
            if p.future is not None:
                _settle(p.future, p.record, AuditUnhealthy(failure) if failure is not None else None)

    def _queue_rotation(self) -> None:
        # Numbers are handed out here, in queue order, so a rotation still waiting
        # in the queue and the next one can never be promised the same name.
        if self._signer is not None:
            # Every rotated file ends with this, even right after an interval one:
            # checked on its own, a rotated file must end the way rotation ends it.
            self._queue_checkpoint("rotate")
        target = self._path.with_name(f"{self._path.name}.{self._next_rotation}")
        self._next_rotation += 1
        self._queue.append(_Rotate(target))
        self._size = 0
        enc = self._stamp(self._open_event(target.name))
        self._queue.append(_Pending(enc.line, enc.record, None, None))

    def _begin_close(self) -> None:
        with self._cond:
            if self._signer is not None and self._healthy and not self._closing:
                # A clean end is signed: a log that stops anywhere else was cut,
                # or its writer died (docs/audit-format.md, "Signed checkpoints").
                self._queue_checkpoint("close")
            self._closing = True
            self._cond.notify()

    # ----------------------------------------------------------- writer thread

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    if not self._queue and not self._closing:
                        self._cond.wait(timeout=self._wait_timeout())
                    if time.monotonic() >= self._checkpoint_due and self._healthy and not self._closing:
                        self._queue_checkpoint("time")
                    batch, self._queue = self._queue, []
                    closing = self._closing
                    dirty = self._written != self._synced
                    self._writing = bool(batch)
                try:
                    if batch:
                        self._process(batch)
                    elif dirty:
                        self._flush([], force_sync=True)
                finally:
                    with self._cond:
                        self._writing = False
                if closing and not batch:
                    break
        finally:
            os.close(self._fd)
            os.close(self._lock_fd)  # releases the flock

    def _wait_timeout(self) -> float:
        """How long the idle thread may sleep: until an fsync or a checkpoint falls due.

        Never longer than IDLE_SYNC_SECONDS, clean or not: a caller's own write makes the log
        dirty without waking the thread (that wake-up is what it saves), so the thread looks.
        """
        timeout = IDLE_SYNC_SECONDS
        if self._checkpoint_due != float("inf"):
            timeout = min(timeout, max(0.0, self._checkpoint_due - time.monotonic()))
        return timeout

    def _process(self, batch: list[_Pending | _Rotate]) -> None:
        segment: list[_Pending] = []
        for item in batch:
            if isinstance(item, _Rotate):
                self._flush(segment, force_sync=True)
                segment = []
                self._rotate(item.target)
            else:
                segment.append(item)
        self._flush(segment, force_sync=False)

    def _flush(self, segment: list[_Pending], *, force_sync: bool) -> None:
        if not self._healthy:
            self._settle_all(segment, self._failure)
            return
        try:
            if segment:
                self._write_all(b"".join(p.line for p in segment))
            waiting = sum(1 for p in segment if p.future is not None)
            with self._cond:
                covered = self._written
                dirty = covered != self._synced
            if dirty and (waiting or force_sync):
                if self._durable:
                    began = time.perf_counter()
                    self._fsync(self._fd)
                    took = time.perf_counter() - began
                with self._cond:
                    if self._durable:
                        self._fsyncs += 1
                        self._last_fsync_seconds = took
                    # Writes a caller made during the fsync may not be covered: they stay dirty.
                    self._synced = max(self._synced, covered)
        except OSError as exc:
            self._poison(
                f"{self._path}: audit write failed: {exc.strerror or exc}; no further call is allowed"
            )
            self._settle_all(segment, self._failure)
            return
        with self._cond:
            self._records += len(segment)
            self._commits += waiting
            self._largest = max(self._largest, waiting)
        self._settle_all(segment, None)

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = self._write(self._fd, view)
            if n <= 0:
                raise OSError(errno.EIO, "short write")
            view = view[n:]
        with self._cond:
            self._writes += 1
            self._written += 1
            self._bytes += len(data)

    def _rotate(self, target: Path) -> None:
        if not self._healthy:
            return
        try:
            if target.exists() or target.is_symlink():
                raise OSError(errno.EEXIST, f"{target.name} already exists")
            os.rename(self._path, target)
            moved, ours = os.stat(target, follow_symlinks=False), os.fstat(self._fd)
            if (moved.st_dev, moved.st_ino) != (ours.st_dev, ours.st_ino):
                raise OSError(errno.ESTALE, "the live log was replaced by another file")
            fd = os.open(self._path, _LOG_FLAGS | os.O_CREAT | os.O_EXCL, 0o600)
            os.fchmod(fd, 0o600)
            fsync_dir(self._path.parent)
        except OSError as exc:
            self._poison(
                f"{self._path}: audit rotation failed: {exc.strerror or exc}; no further call is allowed"
            )
            return
        os.close(self._fd)
        self._fd = fd
        with self._cond:
            self._rotations += 1

    def _poison(self, message: str) -> None:
        with self._cond:
            self._healthy = False
            self._failure = message

    @staticmethod
    def _settle_all(segment: list[_Pending], failure: str | None) -> None:
        # One wake-up of each event loop per group, not one per record: every
        # call_soon_threadsafe writes to the loop's wake-up pipe, and under
        # pipelined load that system call per allow cost more than the rest.
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Any, dict[str, Any], BaseException | None]]] = {}
        for p in segment:
            if p.future is None or p.loop is None:
                continue
            # A fresh exception per waiter: one shared instance would collect every
            # waiter's traceback.
            error = AuditUnhealthy(failure) if failure is not None else None
            by_loop.setdefault(p.loop, []).append((p.future, p.record, error))
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the caller's loop is already closed
                loop.call_soon_threadsafe(_settle_group, items)


def _settle_group(items: list[tuple[Any, dict[str, Any], BaseException | None]]) -> None:
    for future, record, error in items:
        _settle(future, record, error)


def _settle(
    future: asyncio.Future[dict[str, Any]], record: dict[str, Any], error: BaseException | None
) -> None:
    if future.done():  # the awaiting task was cancelled
        return
    if error is None:
        future.set_result(record)
    else:
        future.set_exception(error)


def _tail_of(path: Path) -> rec.Parsed | None:
    try:
        # O_NONBLOCK: a FIFO planted as the rotated file must not hang start-up (check_tail refuses it).
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise AuditError(f"{path}: cannot read the previous audit file: {exc.strerror}") from exc
    try:
        return check_tail(path, fd)
    finally:
        os.close(fd)
