"""Verify a whole chain: every line, every link, the sequence, across rotated files.

The walker is shared with start-up (writer.py checks the last link with
`link_problem`) and with repair (which needs the offset of the first bad line).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from visor.audit.paths import chain_files
from visor.audit.record import GENESIS, Parsed, RecordError, parse_line

# How far ahead to look for a missing seq to tell "reordered" from "deleted".
_LOOKAHEAD = 1000


def link_problem(before: Parsed | None, cur: Parsed) -> str | None:
    """Why `cur` cannot follow `before` (None when `cur` opens the chain)."""
    if before is None:
        if cur.prev == GENESIS:
            if cur.seq == 0:
                return None
            return f"the chain starts at seq {cur.seq}, not 0: records before it were deleted"
        if cur.event == "audit_open" and cur.record.get("rotated_from"):
            return None  # continues a rotated file that is not part of this check
        return "the first record links to a predecessor that is not here: lines before it were deleted"
    if cur.seq == before.seq + 1 and cur.prev == before.hash:
        return None
    if cur.seq <= before.seq:
        return f"seq {cur.seq} follows seq {before.seq}: records reordered or duplicated"
    if cur.seq > before.seq + 1:
        gap = cur.seq - before.seq - 1
        return f"seq jumps from {before.seq} to {cur.seq}: {gap} record(s) deleted"
    return "prev does not match the hash of the line before: a line was replaced or inserted"


@dataclass(frozen=True, slots=True)
class Line:
    path: Path
    number: int  # 1-based within its file
    offset: int  # byte offset of the line's start
    data: bytes  # without the newline
    complete: bool  # ended with "\n"


def iter_lines(path: Path) -> Iterator[Line]:
    with open(path, "rb") as fh:
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
    kind: str  # "truncated", "corrupt", "foreign", "edited", "link", "anchor"
    parsed: bool  # the bad line is itself a well-formed record (only its link is wrong)

    def __str__(self) -> str:
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

    @property
    def ok(self) -> bool:
        return self.problem is None

    def summary(self) -> str:
        if self.problem is not None:
            return f"FAIL {self.problem}"
        names = ", ".join(p.name for p in self.files)
        if not self.records:
            return f"OK {names}: empty"
        text = (
            f"OK {self.records} records, seq {self.first_seq}..{self.last_seq}, "
            f"{self.sessions} session(s), {len(self.files)} file(s) [{names}], head {self.head}"
        )
        return text + "".join(f"; {n}" for n in self.notes)


class _Walker:
    """Feeds lines in chain order and stops at the first problem."""

    def __init__(self) -> None:
        self.last: Parsed | None = None
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
        if why is not None:
            return cur, Problem(line.path, line.number, line.offset, why, "link", True)
        if self.first is None:
            self.first = cur
        self.last = cur
        self.count += 1
        self.sessions.add(str(cur.record.get("session")))
        self.hashes_seen.add(cur.hash)
        return cur, None


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


def verify_files(files: list[Path], *, head: str | None = None) -> ChainReport:
    """Verify `files` as one chain, in the order given."""
    walker = _Walker()
    notes: list[str] = []
    problem: Problem | None = None
    lines = _chain_lines(files)
    for line in lines:
        parsed, problem = walker.feed(line)
        if problem is not None:
            if parsed is not None and walker.last is not None and parsed.seq > walker.last.seq + 1:
                problem = _reclassify_gap(problem, walker.last.seq + 1, lines)
            break
    if problem is None and walker.first is not None and walker.first.prev != GENESIS:
        notes.append(f"starts at seq {walker.first.seq}: earlier rotated files are not present")
    if problem is None and head is not None and head not in walker.hashes_seen:
        where = files[-1] if files else Path("-")
        reason = f"anchor {head} is not in the log: records were cut from the end or the log was rewritten"
        problem = Problem(where, 0, 0, reason, "anchor", False)
    return ChainReport(
        files=tuple(files),
        records=walker.count,
        first_seq=walker.first.seq if walker.first else None,
        last_seq=walker.last.seq if walker.last else None,
        head=walker.last.hash if walker.last else None,
        sessions=len(walker.sessions),
        problem=problem,
        notes=tuple(notes),
    )


def verify_path(path: Path, *, head: str | None = None) -> ChainReport:
    """Verify the chain a path belongs to (a live file brings its rotated files)."""
    return verify_files(chain_files(path), head=head)


def first_problem(path: Path) -> Problem | None:
    """The first bad line of a single file, checked on its own (for repair)."""
    walker = _Walker()
    for line in iter_lines(path):
        _, problem = walker.feed(line)
        if problem is not None:
            return problem
    return None
