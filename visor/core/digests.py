"""SHA-256 and size of the client lines the framer drops, for their reject records."""

from __future__ import annotations

import collections
import hashlib
from typing import TypedDict


class Evidence(TypedDict):
    """What a reject record says about a line that is gone: its size and SHA-256 (None: unknown)."""

    size: int
    digest: str | None


class LineDigests:
    """SHA-256 and size of every client line the framer drops, fed the same chunks.

    The framer discards a line over the limit as it streams in, so its bytes
    are gone by the time it is reported. This hashes the line that is still
    open at the end of each chunk (complete lines inside a chunk are never
    hashed unless the chunk itself is over the limit), and keeps a
    ``(size, sha256)`` for each line that ends over the limit, and for the
    partial line at EOF, in the order the framer reports them.
    Sizes and digests cover the line without its newline, a CR included.
    """

    __slots__ = ("_cr", "_hasher", "_held", "_limit", "found")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._hasher: hashlib._Hash | None = None
        self._held = 0  # bytes of the open line so far
        self._cr = False  # the open line's last byte is a CR
        self.found: collections.deque[Evidence] = collections.deque()

    def feed(self, data: bytes) -> None:
        first = data.find(b"\n")
        if first < 0:
            self._extend(data)
            return
        view = memoryview(data)
        if self._held:
            self._extend(view[:first])
            self._finish()
        elif first:
            self._whole(view[:first])
        if len(data) > self._limit + 1:
            # Only a chunk longer than the limit can hold a whole line over it.
            start = first + 1
            while True:
                nl = data.find(b"\n", start)
                if nl < 0:
                    break
                self._whole(view[start:nl])
                start = nl + 1
        else:
            start = data.rfind(b"\n") + 1
        if start < len(data):
            self._extend(view[start:])

    def eof(self) -> None:
        if self._held:
            self.found.append(self._evidence())
        self._reset()

    def _over(self, size: int, ends_with_cr: bool) -> bool:
        # The framer's rule: one trailing CR is not part of the line.
        return size - ends_with_cr > self._limit

    def _whole(self, line: memoryview) -> None:
        size = len(line)
        if size > self._limit and self._over(size, line[-1] == 13):
            self.found.append(Evidence(size=size, digest=hashlib.sha256(line).hexdigest()))

    def _extend(self, part: bytes | memoryview) -> None:
        if not part:
            return
        if self._hasher is None:
            self._hasher = hashlib.sha256()
        self._hasher.update(part)
        self._held += len(part)
        self._cr = part[-1] == 13

    def _finish(self) -> None:
        if self._over(self._held, self._cr):
            self.found.append(self._evidence())
        self._reset()

    def _evidence(self) -> Evidence:
        assert self._hasher is not None
        return Evidence(size=self._held, digest=self._hasher.hexdigest())

    def _reset(self) -> None:
        self._hasher = None
        self._held = 0
        self._cr = False
