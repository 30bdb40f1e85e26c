"""Check the signed checkpoints of a chain while verify walks it (`visor audit verify --key`).

The chain walk (verify.py) has already checked each record's hash and link;
this checks what the hash chain cannot: that every checkpoint was signed by a
key the reviewer trusts, for this log, at the position it stands at; and how
the log ends. A log a clean shutdown closed ends with a `close` checkpoint, a
rotated file with a `rotate` one. Anything after the last checkpoint is
unsigned: still being written when a Visor holds the log, and otherwise cut,
rewritten or left by a crash, which verification cannot tell apart and so
refuses.
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from visor.audit.paths import lock_path
from visor.audit.record import Parsed
from visor.audit.signing import REASONS, PublicKey, checkpoint_message

_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_HEX128 = re.compile(r"[0-9a-f]{128}\Z")
_ROTATED = re.compile(r"\.[1-9][0-9]*\Z")


def live_name(path: Path) -> str:
    """The log name checkpoints carry: the live file's, also in its rotated files."""
    return _ROTATED.sub("", path.name)


def in_use(live: Path) -> bool:
    """Whether a Visor holds the log's lock right now (its writer appends to it)."""
    try:
        # O_NONBLOCK: a FIFO planted as the lock must not hold verification up for ever.
        fd = os.open(lock_path(live), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False  # Visor's lock is a regular file: this is something else
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases a lock taken here
    return False


@dataclass(frozen=True, slots=True)
class SignedSummary:
    checkpoints: int
    last_seq: int | None
    last_ts: str | None
    last_reason: str | None
    last_hash: str | None
    unsigned: int  # records after the last checkpoint
    key_ids: tuple[str, ...]
    late: int  # records left unsigned by a session that did not close, signed by a later one

    def text(self) -> str:
        keys = ", ".join(k[:16] for k in self.key_ids)
        if self.last_seq is None:
            return f"no checkpoint signed by key {keys}"
        out = (
            f"signed: {self.checkpoints} checkpoint(s) by key {keys}, last at seq {self.last_seq} "
            f"({self.last_ts}, {self.last_reason}, hash {self.last_hash}); "
            f"{self.unsigned} record(s) after it unsigned"
        )
        if self.late:
            out += (
                f"; {self.late} record(s) written by sessions that did not close cleanly were signed "
                "only by a later session"
            )
        return out


class CheckpointCheck:
    """Fed every record in chain order; says why a checkpoint is not good."""

    def __init__(self, keys: Sequence[PublicKey], log: str) -> None:
        self._keys = {k.key_id: k for k in keys}
        self._log = log
        self.count = 0
        self.last: Parsed | None = None
        self.unsigned = 0
        self.late = 0
        self._previous: Parsed | None = None

    def feed(self, cur: Parsed) -> str | None:
        if cur.event == "checkpoint":
            why = self._check(cur)
            if why is not None:
                return why
            self.count += 1
            self.last = cur
            self.unsigned = 0
        else:
            before = self._previous
            if (
                cur.event == "audit_open"
                and before is not None
                and before.record.get("session") != cur.record.get("session")
                and self.last is not None
            ):
                # A new session after one that stopped without its close checkpoint:
                # what that one wrote after its last checkpoint is signed from here on.
                self.late += self.unsigned
            self.unsigned += 1
        self._previous = cur
        return None

    def _check(self, cur: Parsed) -> str | None:
        r = cur.record
        key, log, reason, sig = r.get("key"), r.get("log"), r.get("reason"), r.get("sig")
        if not isinstance(key, str) or not _HEX64.match(key):
            return "checkpoint without a valid key fingerprint (edited)"
        if not isinstance(sig, str) or not _HEX128.match(sig):
            return "checkpoint without a valid signature (128 hex digits) (edited)"
        if reason not in REASONS:
            return f"checkpoint with an unknown reason {reason!r} (edited)"
        public = self._keys.get(key)
        if public is None:
            given = ", ".join(k[:16] for k in self._keys)
            return (
                f"checkpoint signed by key {key[:16]}, not by the key given ({given}): verify with that "
                "key's .pub if it is yours; otherwise the checkpoint was made with someone else's key"
            )
        if not public.verifies(bytes.fromhex(sig), checkpoint_message(r)):
            return (
                "checkpoint signature does not match: this record or a record before it was rewritten "
                "(hashes recomputed), or the signature was replaced"
            )
        if log != self._log:
            return (
                f"checkpoint signed for the log {log!r}, but this log is {self._log!r}: "
                "the file was renamed or swapped with another log signed by the same key"
            )
        return None

    def end_problem(self, files: Sequence[Path]) -> tuple[str | None, str | None]:
        """(why the end of the chain fails, a note) once every record was fed."""
        if self.last is None:
            return (
                "no checkpoint signed by the key given: nothing in this log is signed "
                "(was `visor run` given --signing-key?)",
                None,
            )
        last_file = files[-1] if files else None
        rotated_alone = last_file is not None and _ROTATED.search(last_file.name) is not None
        closed = self.unsigned == 0 and (
            self.last.record.get("reason") == "close"
            or (rotated_alone and self.last.record.get("reason") == "rotate")
        )
        if closed:
            return None, None
        live = last_file if last_file is not None and not rotated_alone else None
        if live is not None and in_use(live):
            return None, f"{self.unsigned} record(s) not signed yet: a Visor is writing this log"
        if self.unsigned:
            return (
                f"{self.unsigned} record(s) after the last checkpoint (seq {self.last.seq}) are unsigned and "
                "no Visor is writing this log: records were cut from the end or rewritten after it, or "
                "its last session crashed (the next `visor run` with the key signs them)",
                None,
            )
        return (
            f"the log ends at the checkpoint at seq {self.last.seq} ({self.last.record.get('reason')}), not "
            "at the close checkpoint a clean shutdown writes, and no Visor is writing it: records were cut "
            "from the end, or its last session crashed",
            None,
        )

    def summary(self) -> SignedSummary:
        last = self.last
        return SignedSummary(
            checkpoints=self.count,
            last_seq=last.seq if last else None,
            last_ts=str(last.record.get("ts")) if last else None,
            last_reason=str(last.record.get("reason")) if last else None,
            last_hash=last.hash if last else None,
            unsigned=self.unsigned,
            key_ids=tuple(self._keys),
            late=self.late,
        )
