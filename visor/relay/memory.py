"""A pipe's writing end inside one process: what the relay's in-memory links write to.

The gateway's sessions (`ClientPort`, visor/serve/session.py) and `visor run --url`
(`ServerPort`, visor/http/relay.py) each put a reader in the relay's own process where a pipe's
other end used to be. The relay still writes to a `WriteTransport` and still hears
`pause_writing` / `resume_writing` / `connection_lost` on its protocol, so its flow control is
unchanged; this is that transport, with the reader's three hooks in place of the pipe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class MemoryWriteTransport(asyncio.WriteTransport):
    """Writes go to `take` at once. The reader calls `pause` / `resume` as it falls behind and
    catches up (the protocol hears `pause_writing` / `resume_writing`); `queued` is what waits
    with the reader (the "buffer"). `close` tells the reader (`closed`), then the protocol
    hears `connection_lost` on the next turn of the loop, as from a pipe transport."""

    def __init__(
        self, take: Callable[[bytes], None], queued: Callable[[], int], closed: Callable[[], None]
    ) -> None:
        super().__init__()
        self._take = take
        self._queued = queued
        self._closed = closed
        self._protocol: asyncio.BaseProtocol | None = None
        self._closing = False
        self._paused = False

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._closing:
            self._take(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        if not self._closing:
            self._take(b"".join(list_of_data))

    def is_closing(self) -> bool:
        return self._closing

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self._queued()

    def pause(self) -> None:
        if not self._paused and not self._closing and isinstance(self._protocol, asyncio.Protocol):
            self._paused = True
            self._protocol.pause_writing()

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            if not self._closing and isinstance(self._protocol, asyncio.Protocol):
                self._protocol.resume_writing()

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._closed()
        if self._protocol is not None:
            asyncio.get_running_loop().call_soon(self._protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()
