"""Verify a whole chain: every line, every link, the sequence, across rotated files.

The walker is shared with repair (which needs the offset of the first bad line);
start-up (writer.py) checks the last link with `link_problem`, which lives in
record.py so that opening a log does not import this module.
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from visor.audit.paths import chain_files, rotated_files
from visor.audit.record import GENESIS, Parsed, RecordError, parse_line
from visor.audit.record import link_problem as link_problem

if TYPE_CHECKING:
    from visor.audit.checkpoints import SignedSummary
    from visor.audit.signing import PublicKey

# How far ahead to look for a missing seq to tell "reordered" from "deleted".
_LOOKAHEAD = 1000


@dataclass(frozen=True, slots=True)
class Line:
    path: Path
    number: int  # 1-based within its file
    offset: int  # byte offset of the line's start
    data: bytes  # without the newline
    complete: bool  # ended with "\n"


def open_log_file(path: Path) -> int:
    """A descriptor for reading `path`, which must be a regular file; OSError otherwise.

    A FIFO (or a device) under a log's name would block the open, or the first read, for ever:
    every log after it would go unchecked and unexported, and the check would never fail. The
    open does not wait (O_NONBLOCK, which changes nothing for a regular file).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(
            errno.EINVAL, "not a regular file (Visor writes its logs as regular files only)", str(path)
        )
    return fd


def iter_lines(path: Path) -> Iterator[Line]:
    with open(open_log_file(path), "rb") as fh:
        offset = 0
        for number, raw in enumerate(fh, start=1):
            complete = raw.endswith(b"\n")
            data = raw[:-1] if complete else raw
            yield Line(path, number, offset, data, complete)
            offset += len(raw)


@dataclass(frozen=True, slots=True)
class Problem:
    path: Path
    line: int
    offset: int
    reason: str
    kind: str  # "truncated", "corrupt", "foreign", "edited", "link", "anchor", "signature", "unsigned"
    parsed: bool  # the bad line is itself a well-formed record (only its link is wrong)

    def __str__(self) -> str:
        if self.line == 0:  # about the file itself (missing, empty) or the whole chain (anchor)
            return f"{self.path}: {self.reason}"
        return f"{self.path}:{self.line}: {self.reason}"


@dataclass(frozen=True, slots=True)
class ChainReport:
    files: tuple[Path, ...]
    records: int
    first_seq: int | None
    last_seq: int | None
    head: str | None
    sessions: int
    problem: Problem | None
    notes: tuple[str, ...]
    signed: SignedSummary | None = None  # with --key: the checkpoints found

    @property
    def ok(self) -> bool:
        return self.problem is None

    def summary(self) -> str:
        if self.problem is not None:
            if self.signed is not None:
                return f"FAIL {self.problem} ({self.signed.text()})"
            return f"FAIL {self.problem}"
        names = ", ".join(p.name for p in self.files)
        if not self.records:
            return f"OK {names}: empty"
        text = (
            f"OK {self.records} records, seq {self.first_seq}..{self.last_seq}, "
            f"{self.sessions} session(s), {len(self.files)} file(s) [{names}], head {self.head}"
        )
        if self.signed is not None:
            text += f"; {self.signed.text()}"
        return text + "".join(f"; {n}" for n in self.notes)


class _Walker:
    """Feeds lines in chain order and stops at the first problem."""

    def __init__(self) -> None:
        self.last: Parsed | None = None
        self.last_path: Path | None = None
        self.first: Parsed | None = None
        self.count = 0
        self.sessions: set[str] = set()
        self.hashes_seen: set[str] = set()

    def feed(self, line: Line) -> tuple[Parsed | None, Problem | None]:
        if not line.complete:
            reason = f"truncated: the last line is incomplete ({len(line.data)} bytes without a newline)"
            return None, Problem(line.path, line.number, line.offset, reason, "truncated", False)
        try:
            cur = parse_line(line.data)
        except RecordError as exc:
            return None, Problem(line.path, line.number, line.offset, exc.reason, exc.kind, False)
        why = link_problem(self.last, cur)
        if why is None and self.last is None and cur.prev != GENESIS:
            why = _misplaced_start(line.path, cur)
        if why is None and line.number == 1 and self.last is not None:
            why = _continuation_problem(self.last_path, cur)
        elif why is not None and line.number == 1 and self.last_path is not None and self.last is not None:
            # The first line of a file must continue the last line of the file before it.
            why = (
                f"does not continue {self.last_path.name} (which ends at seq {self.last.seq}): {why}; "
                f"records were cut from the end of {self.last_path.name}, or a file between them is "
                "missing or out of place"
            )
        if why is not None:
            return cur, Problem(line.path, line.number, line.offset, why, "link", True)
        if self.first is None:
            self.first = cur
        self.last = cur
        self.last_path = line.path
        self.count += 1
        self.sessions.add(str(cur.record.get("session")))
        self.hashes_seen.add(cur.hash)
        return cur, None


def _continuation_problem(before: Path | None, cur: Parsed) -> str | None:
    """A file after the first opens with the `audit_open` that names the file before it."""
    if before is None:
        return None
    named = cur.record.get("rotated_from")
    if cur.event != "audit_open" or named != before.name:
        return (
            f"does not open with an audit_open that continues {before.name} "
            f"(rotated_from is {named!r}): files renamed or swapped"
        )
    return None


def _rotation_number(name: str) -> float:
    m = _ROTATED.search(name)
    return int(m.group(1)) if m else float("inf")  # the live file comes after every rotated one


def _misplaced_start(path: Path, cur: Parsed) -> str | None:
    """The first file present continues an older one: that one must have a smaller number."""
    named = cur.record.get("rotated_from")
    if isinstance(named, str) and _rotation_number(named) >= _rotation_number(path.name):
        return f"opens as the continuation of {named}, which is not older than it: files renamed or swapped"
    return None


_ROTATED = re.compile(r"\.([1-9][0-9]*)\Z")


def structure_problem(path: Path) -> Problem | None:
    """What is missing from the files of the chain `path` belongs to, before any line is read.

    Rotated files are numbered 1, 2, 3 ... in the order they were written,
    and the newest is always followed by the live file. Older files may have
    been removed on purpose (the check then starts at the first one present),
    but a hole in the numbers, a missing or emptied live file, or an empty
    rotated file is records deleted.
    """
    if _ROTATED.search(path.name):
        return None  # a rotated file checked on its own
    rotated = rotated_files(path)
    # rotated_files() lists only names that end in .N
    numbers = [int(p.name.rsplit(".", 1)[1]) for p in rotated]
    for prev, cur in itertools.pairwise(numbers):
        if cur != prev + 1:
            missing = path.with_name(f"{path.name}.{prev + 1}")
            reason = (
                f"missing: the rotated files go from {path.name}.{prev} to {path.name}.{cur}; "
                f"{missing.name} was deleted or renamed, and every record in it with it"
            )
            return Problem(missing, 0, 0, reason, "missing", False)
    for p in rotated:
        if p.stat().st_size == 0:
            return Problem(
                p, 0, 0, "empty: a rotated file always holds records; it was truncated", "missing", False
            )
    if rotated and not (path.exists() or path.is_symlink()):
        reason = (
            f"missing: the live file that continues {rotated[-1].name} was deleted, and every record "
            "in it with it (after a crash between rotating and the first write, the next `visor run` "
            "recreates it)"
        )
        return Problem(path, 0, 0, reason, "missing", False)
    if rotated and path.is_file() and path.stat().st_size == 0:
        reason = (
            f"empty: the live file that continues {rotated[-1].name} holds no record; it was truncated "
            "(after a crash between rotating and the first write, the next `visor run` continues it)"
        )
        return Problem(path, 0, 0, reason, "missing", False)
    return None


def _reclassify_gap(problem: Problem, expected: int, rest: Iterator[Line]) -> Problem:
    """A seq jump is a deletion unless the missing record turns up a little later."""
    for _, line in zip(range(_LOOKAHEAD), rest, strict=False):
        if not line.complete:
            break
        try:
            p = parse_line(line.data)
        except RecordError:
            continue
        if p.seq == expected:
            reason = f"reordered: seq {expected} expected here but found at {line.path.name}:{line.number}"
            return Problem(problem.path, problem.line, problem.offset, reason, "link", True)
    return problem


def _chain_lines(files: list[Path]) -> Iterator[Line]:
    for path in files:
        yield from iter_lines(path)


def verify_files(
    files: list[Path], *, head: str | None = None, keys: Sequence[PublicKey] = ()
) -> ChainReport:
    """Verify `files` as one chain, in the order given.

    With `keys`, every checkpoint must be signed by one of them for this log,
    and the chain must end signed (visor/audit/checkpoints.py).
    """
    walker = _Walker()
    notes: list[str] = []
    problem: Problem | None = None
    check = None
    if keys:
        from visor.audit.checkpoints import CheckpointCheck, live_name

        check = CheckpointCheck(keys, live_name(files[-1]) if files else "")
    lines = _chain_lines(files)
    try:
        for line in lines:
            parsed, problem = walker.feed(line)
            if problem is not None:
                if parsed is not None and walker.last is not None and parsed.seq > walker.last.seq + 1:
                    problem = _reclassify_gap(problem, walker.last.seq + 1, lines)
                break
            if check is not None and parsed is not None:
                why = check.feed(parsed)
                if why is not None:
                    problem = Problem(line.path, line.number, line.offset, why, "signature", True)
                    break
    except OSError as exc:
        where = Path(exc.filename) if exc.filename else files[-1]
        problem = Problem(where, 0, 0, f"cannot be read: {exc.strerror or exc}", "missing", False)
    if problem is None and walker.first is not None and walker.first.prev != GENESIS:
        notes.append(f"starts at seq {walker.first.seq}: earlier rotated files are not present")
    if problem is None and head is not None and head not in walker.hashes_seen:
        where = files[-1] if files else Path("-")
        reason = f"anchor {head} is not in the log: records were cut from the end or the log was rewritten"
        problem = Problem(where, 0, 0, reason, "anchor", False)
    if problem is None and check is not None and files:
        why, note = check.end_problem(files)
        if why is not None:
            problem = Problem(files[-1], 0, 0, why, "unsigned", False)
        if note is not None:
            notes.append(note)
    return ChainReport(
        files=tuple(files),
        records=walker.count,
        first_seq=walker.first.seq if walker.first else None,
        last_seq=walker.last.seq if walker.last else None,
        head=walker.last.hash if walker.last else None,
        sessions=len(walker.sessions),
        problem=problem,
        notes=tuple(notes),
        signed=check.summary() if check is not None else None,
    )


def verify_path(path: Path, *, head: str | None = None, keys: Sequence[PublicKey] = ()) -> ChainReport:
    """Verify the chain a path belongs to (a live file brings its rotated files).

    The files themselves are checked first: a rotated file missing from the
    middle of the numbering, or a live file deleted or emptied next to its
    rotated files, fails naming that file.
    """
    files = chain_files(path)
    problem = structure_problem(path)
    if problem is not None:
        return ChainReport(tuple(files), 0, None, None, None, 0, problem, ())
    return verify_files(files, head=head, keys=keys)


def first_problem(path: Path) -> Problem | None:
    """The first bad line of a single file, checked on its own (for repair)."""
    walker = _Walker()
    for line in iter_lines(path):
        _, problem = walker.feed(line)
        if problem is not None:
            return problem
    return None
