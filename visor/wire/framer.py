"""Sans-I/O newline framing for the MCP stdio transport.

`Framer.feed(bytes)` returns the complete lines in the data fed so far; it
never touches a file descriptor, so every edge case is a unit test. Memory is
bounded by `max_bytes`: a line that grows past it is discarded while it
streams in, and reported once as `Oversize` when its end arrives (or at EOF).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Oversize:
    """A line longer than the limit was discarded; nothing of it is forwarded."""

    size: int


@dataclass(frozen=True, slots=True)
class Truncated:
    """The stream ended in the middle of a line; the partial line is discarded."""

    size: int


# A complete line is returned as plain `bytes` (without its `\n` and one
# trailing `\r`): the hot path allocates nothing else per message.
FrameEvent = bytes | Oversize | Truncated


class Framer:
    """Split a byte stream into lines, whatever the chunking."""

    __slots__ = ("_buf", "_discarded", "_discarding", "_max")

    def __init__(self, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError("max_bytes must be positive")
        self._max = max_bytes
        # The start of a line whose end has not arrived. It never holds a
        # b"\n", so only new data is ever searched.
        self._buf = bytearray()
        self._discarding = False
        self._discarded = 0

    def feed(self, data: bytes) -> list[FrameEvent]:
        events: list[FrameEvent] = []
        if self._discarding:
            nl = data.find(b"\n")
            if nl < 0:
                self._discarded += len(data)
                return events
            events.append(Oversize(self._discarded + nl))
            self._discarding = False
            self._discarded = 0
            data = data[nl + 1 :]
        if self._buf:
            nl = data.find(b"\n")
            if nl < 0:
                self._buf += data
                if self._too_long(self._buf):
                    self._start_discard(len(self._buf))
                return events
            # The end of a long line: one copy joins what was held and the tail.
            line = b"".join((self._buf, memoryview(data)[:nl]))
            self._buf = bytearray()
            self._emit(events, line)
            data = data[nl + 1 :]
        # Whole lines in this chunk: split without copying into the buffer first.
        start = 0
        find = data.find
        append = events.append
        limit = self._max
        while True:
            nl = find(b"\n", start)
            if nl < 0:
                break
            end = nl - 1 if nl > start and data[nl - 1] == 13 else nl
            append(data[start:end] if end - start <= limit else Oversize(end - start))
            start = nl + 1
        if start < len(data):
            rest = data[start:]
            if self._too_long(rest):
                self._start_discard(len(rest))
            else:
                self._buf = bytearray(rest)
        return events

    def eof(self) -> list[FrameEvent]:
        """End of stream: a partial line is reported, never returned as a line."""
        events: list[FrameEvent] = []
        if self._discarding:
            events.append(Oversize(self._discarded))
        elif self._buf:
            events.append(Truncated(len(self._buf)))
        self._buf = bytearray()
        self._discarding = False
        self._discarded = 0
        return events

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete line (at most the limit, plus one CR)."""
        return len(self._buf)

    def _emit(self, events: list[FrameEvent], line: bytes) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        if len(line) > self._max:
            events.append(Oversize(len(line)))
        else:
            events.append(line)

    def _too_long(self, held: bytes | bytearray) -> bool:
        # One more byte is held when it is a CR: a line of exactly the limit
        # whose CRLF is split across chunks is still a line of the limit.
        limit = self._max
        return len(held) > limit and (len(held) > limit + 1 or held[-1] != 13)

    def _start_discard(self, size: int) -> None:
        self._buf = bytearray()
        self._discarding = True
        self._discarded = size
