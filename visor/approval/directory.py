"""Approval through a directory of pending files. The file I/O; the formats are in model.py.

Layout, one pair per request, named by the request's random id:

    DIR/<id>.pending   written by `visor run` (0600): the call and its hash
    DIR/<id>.answer    written by `visor approve|deny ID`: must carry that hash

The directory is the trust boundary: whoever can write into it can answer.
So it must be a real directory (not a symlink), owned by this user, and
writable by nobody else; Visor refuses to start otherwise. Answers are read
with O_NOFOLLOW, used once, and deleted with their request.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from visor.approval import model
from visor.approval.model import ApprovalAnswer, ApprovalRequest

POLL_SECONDS = 0.1
_MAX_FILE = 1 << 20


class DirectoryError(Exception):
    """The approval directory is unusable or unsafe; the message says why."""


def default_dir() -> Path:
    from visor.audit.paths import visor_home

    return visor_home() / "approvals"


def prepare(path: Path, *, create: bool = True) -> Path:
    """Create DIR 0700 if missing, then refuse it unless it is ours and private."""
    if create:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise DirectoryError(f"cannot create {path}: {exc.strerror or exc}") from exc
    check(path)
    return path


def check(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise DirectoryError(f"{path} does not exist") from None
    except OSError as exc:
        raise DirectoryError(f"cannot inspect {path}: {exc.strerror or exc}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise DirectoryError(f"{path} is a symbolic link; give the real directory")
    if not stat.S_ISDIR(st.st_mode):
        raise DirectoryError(f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise DirectoryError(f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})")
    if st.st_mode & 0o022:
        raise DirectoryError(
            f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
            f"anyone who can write there could approve calls: chmod 700 {path}"
        )


def _write_new(path: Path, data: bytes, dir_fd: int | None = None) -> None:
    """Write `data` to a new file at `path`, all or nothing, never replacing one that exists.

    With `dir_fd`, `path` is a bare name inside that open directory.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{model.new_approval_id()[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        # link() fails if the name exists: the first answer wins, none is overwritten.
        os.link(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)


def _read_small(path: Path, dir_fd: int | None = None) -> tuple[bytes, int] | None:
    """(content, owner uid) of a regular file, never following a symlink; None if absent/unusable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_FILE:
            return None
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks), st.st_uid
    finally:
        os.close(fd)


def _identity(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_dev, st.st_ino


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


# ------------------------------------------------------------------ the visor run side


@dataclass(slots=True)
class _Waiting:
    req: ApprovalRequest
    future: asyncio.Future[ApprovalAnswer | None]


class DirectoryChannel:
    """Pending files for the calls that wait, and one poller for all of them."""

    name = "directory"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._waiting: dict[str, _Waiting] = {}
        self._poller: asyncio.Task[None] | None = None
        # The directory checked at start-up, held open: every file is made and
        # read relative to it, so renaming it or putting another directory (or
        # a symlink) at its path later redirects nothing.
        try:
            self._dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise DirectoryError(f"cannot open {path}: {exc.strerror or exc}") from exc
        st = os.fstat(self._dir_fd)
        if (st.st_dev, st.st_ino) != _identity(path):
            os.close(self._dir_fd)
            raise DirectoryError(f"{path} changed while it was being checked")
        self._sweep_expired()

    def _sweep_expired(self) -> None:
        """Remove requests that expired (a Visor killed while a call waited leaves them).

        An expired request was denied when it timed out, so its files can only
        mislead a human reading the directory; an answer to it would be refused anyway.
        """
        now = time.time()
        for name in os.listdir(self._dir_fd):
            if not name.endswith(".pending") or not model.valid_id(name[: -len(".pending")]):
                continue
            found = _read_small(Path(name), self._dir_fd)
            record = model.parse_pending(found[0]) if found else None
            expires = model.expiry(record) if record else None
            if expires is not None and expires < now:
                stem = name[: -len(".pending")]
                for leftover in (name, f"{stem}.answer"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(leftover, dir_fd=self._dir_fd)

    def _pending_path(self, approval_id: str) -> Path:
        return Path(f"{approval_id}.pending")

    def _answer_path(self, approval_id: str) -> Path:
        return Path(f"{approval_id}.answer")

    async def ask(self, req: ApprovalRequest) -> ApprovalAnswer | None:
        """Publish `req` and wait for its answer; the pending file goes when the wait ends."""
        loop = asyncio.get_running_loop()
        try:
            _write_new(self._pending_path(req.id), model.pending_record(req, os.getpid()), self._dir_fd)
        except OSError as exc:
            from visor.logs import get_logger

            get_logger("visor.approval").error("approval_dir_write_failed", error=str(exc))
            return None
        waiting = _Waiting(req, loop.create_future())
        self._waiting[req.id] = waiting
        if self._poller is None or self._poller.done():
            self._poller = loop.create_task(self._poll())
        try:
            return await waiting.future
        finally:
            self._waiting.pop(req.id, None)
            self._withdraw(req.id)

    def _withdraw(self, approval_id: str) -> None:
        for p in (self._pending_path(approval_id), self._answer_path(approval_id)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p, dir_fd=self._dir_fd)

    async def _poll(self) -> None:
        # One task for every waiting call, not a thread per call: a stat-sized
        # open attempt per pending id every 100 ms.
        while self._waiting:
            await asyncio.sleep(POLL_SECONDS)
            for waiting in list(self._waiting.values()):
                if waiting.future.done():
                    continue
                answer = self._check(waiting.req)
                if answer is not None:
                    waiting.future.set_result(answer)

    def _check(self, req: ApprovalRequest) -> ApprovalAnswer | None:
        path = self._answer_path(req.id)
        found = _read_small(path, self._dir_fd)
        if found is None:
            return None
        data, uid = found
        choice = model.parse_answer(data, req)
        if choice is None:
            # Not an answer to this call (wrong hash, garbage): it approves
            # nothing; removing it lets a real answer be written.
            from visor.logs import get_logger

            get_logger("visor.approval").warning("approval_answer_refused", id=req.id, owner_uid=uid)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path, dir_fd=self._dir_fd)
            return None
        approved, remember = choice
        return ApprovalAnswer(approved, remember, "directory", _user(uid), f"{req.id}.answer")


# ------------------------------------------------------------------ the `visor approve` side


@dataclass(frozen=True, slots=True)
class Pending:
    id: str
    record: dict[str, object]
    answered: bool


def list_pending(path: Path) -> Iterator[Pending]:
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        return
    for name in names:
        stem, _, ext = name.partition(".")
        if ext != "pending" or not model.valid_id(stem):
            continue
        found = _read_small(path / name)
        record = model.parse_pending(found[0]) if found else None
        if record is None or record["id"] != stem:
            continue
        yield Pending(stem, record, os.path.lexists(path / f"{stem}.answer"))


class AnswerError(Exception):
    pass


def answer(path: Path, approval_id: str, approved: bool, remember: bool) -> dict[str, object]:
    """Write the answer file for one pending request; returns its pending record."""
    if not model.valid_id(approval_id):
        raise AnswerError(f"{approval_id!r} is not an approval id (32 hex digits)")
    found = _read_small(path / f"{approval_id}.pending")
    record = model.parse_pending(found[0]) if found else None
    if record is None or record["id"] != approval_id:
        raise AnswerError(f"no pending request {approval_id} in {path} (answered, withdrawn or expired)")
    expires = model.expiry(record)
    if expires is not None and expires < time.time():
        raise AnswerError(f"request {approval_id} has expired; the call was denied")
    body = model.answer_record(approval_id, str(record["call_hash"]), approved, remember)
    try:
        _write_new(path / f"{approval_id}.answer", body)
    except FileExistsError:
        raise AnswerError(f"request {approval_id} already has an answer") from None
    return record
