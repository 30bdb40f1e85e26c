"""`visor audit export`: ship records to another system, resuming where the last run stopped.

The state file holds, per log (named by its live file's absolute path), the
`seq` and `hash` of the last record delivered. A rerun finds that record
again, wherever rotation has moved it, checks that its hash is unchanged, and
delivers only what follows, checking every record's hash and its link to the
one before. Anything that would make the export skip records (the cursor's
record gone or different, a gap, a broken link) stops that log's export with
the reason, instead of guessing. The state is written (atomically, fsync'd)
only after a batch was delivered: a crash between delivery and that write
sends the batch again on the next run, so receivers may see a record twice,
never miss one; `hash` (`visor.hash` in OTLP) is the key to de-duplicate on.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from visor.audit.paths import chain_files
from visor.audit.record import Parsed, RecordError, parse_line
from visor.audit.tail import TailTooLong, read_tail
from visor.audit.verify import open_log_file

STATE_VERSION = 1
BATCH_RECORDS = 500
BATCH_BYTES = 4 * 1024 * 1024


class CursorError(Exception):
    """The saved position cannot be continued without skipping or repeating records."""


@dataclass(frozen=True, slots=True)
class Cursor:
    seq: int
    hash: str


@dataclass(frozen=True, slots=True)
class Place:
    """Just after the record `seq`/`hash`, at byte `offset` of the file (st_dev, st_ino)."""

    dev: int
    ino: int
    offset: int
    seq: int
    hash: str


@dataclass(frozen=True, slots=True)
class Item:
    """A record to deliver: its parsed fields, its stored line (no newline), its log's name."""

    record: dict[str, Any]
    line: bytes
    log: str
    seq: int
    hash: str
    place: Place


# --------------------------------------------------------------------- state


def log_key(live: Path) -> str:
    """The identity of a log in the state file: its live file's absolute path."""
    return str(Path(os.path.abspath(live.parent)).resolve() / live.name)


class State:
    """The state file: per log, the last record delivered. Locked while an export runs."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.cursors: dict[str, Cursor] = {}
        self.places: dict[str, Place] = {}  # this process's read positions (never saved)
        self._lock_fd: int | None = None
        if path is None:
            return
        _ensure_parent(path)
        lock = path.with_name(path.name + ".lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CursorError(
                f"{path}: another `visor audit export` is using this state file; two would send records twice"
            ) from None
        self._lock_fd = fd
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            self.close()
            raise CursorError(f"{path}: cannot read the state file: {exc.strerror or exc}") from None
        try:
            data = json.loads(raw)
            if data.get("version") != STATE_VERSION or not isinstance(data.get("logs"), dict):
                raise ValueError("unknown version or layout")
            for key, entry in data["logs"].items():
                seq, digest = entry["seq"], entry["hash"]
                if not isinstance(seq, int) or not isinstance(digest, str) or len(digest) != 64:
                    raise ValueError(f"bad entry for {key}")
                self.cursors[key] = Cursor(seq, digest)
        except (ValueError, AttributeError, KeyError, TypeError) as exc:
            self.close()
            raise CursorError(
                f"{path}: not a Visor export state file ({exc}); give another --state, or move this one away"
            ) from None

    def save(self) -> None:
        if self.path is None:
            return
        data = {
            "version": STATE_VERSION,
            "logs": {k: {"seq": c.seq, "hash": c.hash} for k, c in sorted(self.cursors.items())},
        }
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, json.dumps(data, indent=1, sort_keys=True).encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _ensure_parent(path: Path) -> None:
    """Folders under $VISOR_HOME are made 0700 (visor/userfiles.py), like the logs'."""
    from visor.userfiles import ensure_parent

    ensure_parent(path)


# ------------------------------------------------------------------- reading


def _last_record(path: Path) -> Parsed | None:
    try:
        fd = open_log_file(path)
    except OSError as exc:
        raise CursorError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    try:
        tail = read_tail(fd, 1)
    except TailTooLong:
        return None
    finally:
        os.close(fd)
    if not tail.lines:
        return None
    try:
        return parse_line(tail.lines[-1])
    except RecordError:
        return None


def new_records(live: Path, cursor: Cursor | None, place: Place | None = None) -> Iterator[Item]:
    """Every complete record of the chain `live` after `cursor`, checked, in chain order.

    `place`, where the previous pass of this process left off, lets a follow
    seek straight to the record after the cursor instead of reading the file
    from its start again; it is used only while it names the cursor's record
    and the very file (device and inode) it was read from, wherever rotation
    moved it. Raises CursorError when continuing would skip a record or repeat
    a changed one.
    """
    files = [f for f in chain_files(live) if f.exists()]
    name = live.name
    last: tuple[int, str] | None = None  # seq and hash of the record before the next one to yield
    seen = -1  # the highest seq read, for the message when the cursor's record is not there
    found = cursor is None
    if place is not None and (cursor is None or (place.seq, place.hash) != (cursor.seq, cursor.hash)):
        place = None
    for index, path in enumerate(files):
        is_live = index == len(files) - 1
        if cursor is not None and not found and not is_live:
            # A rotated file wholly at or before the cursor: its last record is enough.
            tail = _last_record(path)
            if tail is not None and tail.seq < cursor.seq:
                continue
        try:
            fd = open_log_file(path)
        except OSError as exc:
            raise CursorError(f"{path}: cannot be read: {exc.strerror or exc}") from None
        with open(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            offset, number = 0, 0
            if (
                place is not None
                and cursor is not None
                and not found
                and (st.st_dev, st.st_ino) == (place.dev, place.ino)
                and st.st_size >= place.offset
            ):
                fh.seek(place.offset)
                offset, number = place.offset, -1  # line numbers unknown from here: messages give bytes
                found, last = True, (cursor.seq, cursor.hash)
            for raw in fh:
                where = f"{path}:{number + 1}" if number >= 0 else f"{path} at byte {offset}"
                offset += len(raw)
                if number >= 0:
                    number += 1
                if not raw.endswith(b"\n"):
                    if is_live:
                        return  # still being written: the next run takes it
                    raise CursorError(f"{where}: truncated line in a rotated file (run `visor audit verify`)")
                data = raw[:-1]
                try:
                    cur = parse_line(data)
                except RecordError as exc:
                    raise CursorError(f"{where}: {exc.reason} (run `visor audit verify`)") from None
                seen = max(seen, cur.seq)
                if not found:
                    assert cursor is not None
                    if cur.seq < cursor.seq:
                        continue
                    if cur.seq == cursor.seq:
                        if cur.hash != cursor.hash:
                            raise CursorError(
                                f"{where}: seq {cur.seq} is not the record exported last (its hash "
                                f"differs from the state's {cursor.hash[:16]}): the log was rewritten or "
                                "replaced since; verify it, then export to a new --state"
                            )
                        found, last = True, (cur.seq, cur.hash)
                        continue
                    raise CursorError(
                        f"{where}: the log continues at seq {cur.seq}, but the last record exported was "
                        f"seq {cursor.seq}: records between them are gone (rotated files deleted before they "
                        "were exported?)"
                    )
                if last is not None and (cur.seq != last[0] + 1 or cur.prev != last[1]):
                    raise CursorError(
                        f"{where}: seq {cur.seq} does not follow seq {last[0]} in the chain "
                        "(run `visor audit verify`)"
                    )
                last = (cur.seq, cur.hash)
                yield Item(
                    cur.record,
                    data,
                    name,
                    cur.seq,
                    cur.hash,
                    Place(st.st_dev, st.st_ino, offset, cur.seq, cur.hash),
                )
    if not found:
        assert cursor is not None
        end = f"ends at seq {seen}" if seen >= 0 else "holds no record"
        raise CursorError(
            f"{live}: the log {end}, before the last record exported (seq {cursor.seq}): it was cut or "
            "replaced since the last export"
        )


# -------------------------------------------------------------------- export


Sink = Callable[[Sequence[Item]], None]


@dataclass(frozen=True, slots=True)
class Outcome:
    exported: int
    errors: tuple[str, ...]


def export_once(targets: Sequence[Path], state: State, sink: Sink) -> Outcome:
    """Deliver what is new in every log, batch by batch, saving the position after each."""
    exported = 0
    errors: list[str] = []
    for live in targets:
        key = log_key(live)
        batch: list[Item] = []
        size = 0

        def flush(batch: list[Item], key: str = key) -> None:
            sink(batch)
            state.cursors[key] = Cursor(batch[-1].seq, batch[-1].hash)
            state.places[key] = batch[-1].place
            state.save()

        try:
            for item in new_records(live, state.cursors.get(key), state.places.get(key)):
                batch.append(item)
                size += len(item.line)
                if len(batch) >= BATCH_RECORDS or size >= BATCH_BYTES:
                    flush(batch)
                    exported += len(batch)
                    batch, size = [], 0
        except CursorError as exc:
            errors.append(str(exc))
        if batch:
            # Records before a problem are still good: they go out, and the cursor stops before it.
            flush(batch)
            exported += len(batch)
    return Outcome(exported, tuple(errors))
