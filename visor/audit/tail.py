"""Read the end of a log without reading the whole file.

Start-up must stay fast on a large log, so the last lines are found by reading
backwards from the end in fixed chunks, and the first line (only needed to turn
sequence numbers into line numbers for messages) by reading forwards.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

CHUNK = 64 * 1024
# A record holds redacted arguments, which the wire layer caps at 16 MiB per
# message; a line far beyond that is not ours and is not worth buffering.
MAX_LINE = 64 * 1024 * 1024


class TailTooLong(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Tail:
    size: int
    lines: tuple[bytes, ...]  # last complete lines, oldest first, without "\n"
    torn: bytes  # bytes after the last "\n" ("" when the file ends cleanly)
    torn_offset: int  # where the torn bytes start
    from_start: bool  # the lines are the whole file, so their line numbers are known


def read_tail(fd: int, n: int = 2) -> Tail:
    size = os.fstat(fd).st_size
    pos, buf = size, b""
    while pos > 0:
        newlines = buf.count(b"\n")
        # With data before `pos` still unread, the first segment may be partial,
        # so n complete lines need n + 1 newlines (the torn part has none).
        if newlines >= n + 1:
            break
        if len(buf) > 2 * MAX_LINE:
            raise TailTooLong(f"no line boundary in the last {len(buf)} bytes")
        step = min(CHUNK, pos)
        pos -= step
        buf = os.pread(fd, step, pos) + buf
    parts = buf.split(b"\n")
    torn = parts.pop()
    if pos > 0:
        parts = parts[1:]
    return Tail(
        size=size,
        lines=tuple(parts[-n:]),
        torn=torn,
        torn_offset=size - len(torn),
        from_start=pos == 0 and len(parts) <= n,
    )


def read_first_line(fd: int) -> bytes | None:
    """The first complete line without "\\n", or None if there is none."""
    buf, pos = b"", 0
    while len(buf) <= MAX_LINE:
        chunk = os.pread(fd, CHUNK, pos)
        if not chunk:
            return None
        cut = chunk.find(b"\n")
        if cut >= 0:
            return buf + chunk[:cut]
        buf += chunk
        pos += len(chunk)
    return None
