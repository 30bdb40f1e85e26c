"""Sans-I/O reader of a `text/event-stream` body (the HTML standard's event stream rules).

`EventReader.feed(bytes)` returns the events completed by the bytes fed so far,
whatever the chunking; it never touches a socket, so every rule is a unit test:

- lines end with CRLF, LF or CR (a CRLF split across two chunks is one line end);
- one UTF-8 byte order mark at the very start of the stream is skipped;
- a line starting with ``:`` is a comment; ``field: value`` loses one space after the colon;
  a line without a colon is a field with an empty value;
- ``data`` lines are joined with LF; ``event`` sets the type (default ``message``);
  ``id`` sets the last event id unless it holds NUL; ``retry`` is taken only when it is
  all ASCII digits; any other field is ignored;
- a blank line dispatches the event; an event with no data is not dispatched, but its id still
  becomes the last event id (MCP servers prime a stream with exactly such an event);
- bytes after the last blank line at the end of the stream are an incomplete event: dropped.

Memory is bounded by `max_event_bytes`: an event (its field lines; a comment line only if it alone passes the cap) that
grows past it is discarded while it streams in, and reported once as `EventTooLarge` when
its blank line arrives. Data stays bytes: the JSON-RPC layer refuses what is not UTF-8
rather than reading a replacement character the server never sent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The default cap on one event: the same as one stdio message (visor/wire/framer.py).
DEFAULT_MAX_EVENT_BYTES = 16 * 1024 * 1024

_BOM = b"\xef\xbb\xbf"
_EOL = re.compile(rb"\r\n?|\n")


@dataclass(frozen=True, slots=True)
class Event:
    """One dispatched event. `id` is the stream's last event id when it was dispatched."""

    data: bytes
    event: str = "message"
    id: str = ""


@dataclass(frozen=True, slots=True)
class EventTooLarge:
    """An event longer than the cap was discarded; nothing of it is handed on."""

    size: int


SseItem = Event | EventTooLarge


class EventReader:
    """Turn the bytes of one event stream into events."""

    __slots__ = (
        "_at_start",
        "_data",
        "_event_size",
        "_id_buffer",
        "_line",
        "_line_overflow",
        "_max",
        "_skip_lf",
        "_too_large",
        "_type",
        "last_event_id",
        "retry",
    )

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        if max_event_bytes < 1:
            raise ValueError("max_event_bytes must be positive")
        self._max = max_event_bytes
        self._at_start = True  # no byte seen yet: a BOM may still come
        self._skip_lf = False  # the last chunk ended with CR: an LF now ends nothing
        self._line = bytearray()  # a line whose end has not arrived (never holds CR or LF)
        self._line_overflow = 0  # >0: the current line passed the cap; this many bytes dropped
        self._data: list[bytes] = []
        self._type = ""
        self._id_buffer = ""
        self._event_size = 0
        self._too_large = False
        #: The id to send as ``Last-Event-ID`` when reconnecting ("" when the server gave none).
        self.last_event_id = ""
        #: The server's reconnection time in milliseconds, once it sent a valid ``retry``.
        self.retry: int | None = None

    def feed(self, data: bytes) -> list[SseItem]:
        out: list[SseItem] = []
        if not data:
            return out
        if self._at_start:
            # The BOM may arrive split across chunks: hold bytes until it is decided.
            self._line += data
            head = bytes(self._line[:3])
            if len(head) < 3 and _BOM.startswith(head):
                return out
            self._at_start = False
            data = bytes(self._line[3:] if head == _BOM else self._line)
            self._line = bytearray()
        if self._skip_lf:
            self._skip_lf = False
            if data[:1] == b"\n":
                data = data[1:]
        pos = 0
        for m in _EOL.finditer(data):
            start = m.start()
            if self._line_overflow:
                self._overlong_line(self._line_overflow + start - pos)
            elif self._line:
                self._line += data[pos:start]
                line = bytes(self._line)
                self._line = bytearray()
                self._take(line, out)
            else:
                self._take(data[pos:start], out)
            pos = m.end()
        if data.endswith(b"\r"):
            self._skip_lf = True
        rest = len(data) - pos
        if rest:
            if self._line_overflow:
                self._line_overflow += rest
            elif len(self._line) + rest > self._max:
                self._line_overflow = len(self._line) + rest
                self._line = bytearray()
            else:
                self._line += data[pos:]
        return out

    def eof(self) -> int:
        """The stream ended: the size of an incomplete event dropped (0 when it ended cleanly)."""
        pending = self._event_size + len(self._line) + self._line_overflow
        if self._at_start:
            pending = len(self._line)
        self._line = bytearray()
        self._line_overflow = 0
        self._reset_event()
        return pending

    def _overlong_line(self, size: int) -> None:
        self._line_overflow = 0
        self._event_size += size + 1
        self._too_large = True
        self._data = []

    def _take(self, line: bytes, out: list[SseItem]) -> None:
        if not line:
            self._dispatch(out)
            return
        if len(line) > self._max:
            # Whether it arrived in one read or many: the same verdict, comment or not.
            self._overlong_line(len(line))
            return
        if line[0] == 0x3A:  # ":" a comment: kept nowhere, so not counted (keep-alives never end)
            return
        self._event_size += len(line) + 1
        if self._too_large or self._event_size > self._max:
            self._too_large = True
            self._data = []
            return
        colon = line.find(b":")
        if colon < 0:
            field, value = line, b""
        else:
            field = line[:colon]
            value = line[colon + 2 :] if line[colon + 1 : colon + 2] == b" " else line[colon + 1 :]
        if field == b"data":
            self._data.append(value)
        elif field == b"event":
            self._type = value.decode("utf-8", "replace")
        elif field == b"id":
            if b"\x00" not in value:
                self._id_buffer = value.decode("utf-8", "replace")
        elif field == b"retry" and value.isdigit():  # bytes.isdigit(): ASCII digits, never empty
            self.retry = int(value)

    def _dispatch(self, out: list[SseItem]) -> None:
        self.last_event_id = self._id_buffer
        if self._too_large:
            out.append(EventTooLarge(self._event_size))
        elif self._data:
            out.append(Event(b"\n".join(self._data), self._type or "message", self._id_buffer))
        self._reset_event()

    def _reset_event(self) -> None:
        self._data = []
        self._type = ""
        self._event_size = 0
        self._too_large = False
