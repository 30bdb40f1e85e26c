"""`visor audit repair FILE`: move a torn tail aside and continue the chain.

Only damage a crash can cause is repaired without `--force`: an incomplete last
line, or complete lines after the last good record that are not JSON at all
(e.g. zero-filled blocks after a power loss).  A well-formed record that fails
to link, an edited record, or someone else's JSON is evidence of editing, and
moving it out of the log must be a deliberate act.  Nothing is deleted: the
moved bytes go to ``FILE.torn`` (or ``FILE.torn.N``) and the `audit_repair`
record names that file and the SHA-256 of its content.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from visor.audit.verify import Problem, first_problem, iter_lines
from visor.audit.writer import AuditError, AuditWriter, acquire_lock, fsync_dir, new_session_id


@dataclass(frozen=True, slots=True)
class RepairResult:
    repaired: bool
    message: str
    torn_file: Path | None = None
    torn_bytes: int = 0


def live_path_of(path: Path) -> Path:
    """The live file of the chain `path` belongs to (strip a rotation number)."""
    m = re.fullmatch(r"(.+)\.[1-9][0-9]*", path.name)
    return path.with_name(m.group(1)) if m else path


def _needs_force(path: Path, problem: Problem) -> str | None:
    """Why the damage does not look like a crash, or None if it does."""
    if problem.parsed:
        return f"line {problem.line} is a well-formed record that does not link ({problem.reason})"
    if problem.kind in ("foreign", "edited"):
        return f"line {problem.line}: {problem.reason}"
    for line in iter_lines(path):
        if line.offset < problem.offset or not line.complete:
            continue
        if line.data.lstrip().startswith(b"{"):
            return f"line {line.number} is a complete JSON-like line; a torn write leaves none"
    return None


def _torn_name(path: Path) -> Path:
    candidate = path.with_name(path.name + ".torn")
    n = 0
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = path.with_name(f"{path.name}.torn.{n}")
    return candidate


def repair(path: Path, *, force: bool = False) -> RepairResult:
    live = live_path_of(path)
    lock_fd = acquire_lock(live)
    try:
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise AuditError(f"{path}: cannot open: {exc.strerror}") from exc
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise AuditError(f"{path}: not a regular file (Visor writes its logs as regular files only)")
            problem = first_problem(path)
            if problem is None:
                return RepairResult(False, f"{path}: nothing to repair")
            why = _needs_force(path, problem)
            if why is not None and not force:
                raise AuditError(
                    f"{path}: {why}. That looks like editing, not a crash, so repair will not move it "
                    "without --force (it would still only be moved, never deleted)."
                )
            size = os.fstat(fd).st_size
            tail = os.pread(fd, size - problem.offset, problem.offset)
            torn = _torn_name(path)
            tfd = os.open(torn, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(tail)
                while view:
                    view = view[os.write(tfd, view) :]
                os.fsync(tfd)
            finally:
                os.close(tfd)
            fsync_dir(path.parent)
            # Only now, with the bytes safe elsewhere, shorten the log.
            os.ftruncate(fd, problem.offset)
            os.fsync(fd)
        finally:
            os.close(fd)
        event = {
            "event": "audit_repair",
            "file": path.name,
            "line": problem.line,
            "reason": problem.reason,
            "forced": force,
            "torn_file": torn.name,
            "torn_bytes": len(tail),
            "torn_sha256": hashlib.sha256(tail).hexdigest(),
        }
        writer = AuditWriter.open(live, session=new_session_id(), _lock_fd=lock_fd)
        lock_fd = -1  # the writer owns and releases it now
        writer.append(event)
        writer.close_sync()
        if not writer.healthy:
            raise AuditError(f"{live}: the repair record could not be written")
    finally:
        if lock_fd >= 0:
            os.close(lock_fd)
    return RepairResult(
        True,
        f"{path}: moved {len(tail)} bytes from line {problem.line} ({problem.reason}) to {torn.name}; "
        f"chain continued in {live.name}",
        torn,
        len(tail),
    )
