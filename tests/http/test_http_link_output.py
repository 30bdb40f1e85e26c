"""The `--url` link's output (where the server's stdout pipe was): its end comes after every message
a pause was holding, as a pipe's EOF comes after the bytes written before it; a message the
upstream sends after its end is not handed on; and the relay's own close drops what waits.

The transport is driven as the relay drives it: a protocol set on it, pause and resume, and the
upstream's `deliver` / `end` from tasks of its own.
"""

from __future__ import annotations

import asyncio

from visor.http.relay import _UpstreamOutput


class Recorder(asyncio.Protocol):
    def __init__(self) -> None:
        self.seen: list[bytes | str] = []

    def data_received(self, data: bytes) -> None:
        self.seen.append(data)

    def eof_received(self) -> bool:
        self.seen.append("EOF")
        return False


def test_the_end_waits_for_the_messages_a_pause_holds() -> None:
    async def main() -> list[bytes | str]:
        out = _UpstreamOutput()
        rec = Recorder()
        out.set_protocol(rec)
        await out.deliver(b"1")
        out.pause_reading()  # the relay's client reads slowly
        held = [asyncio.create_task(out.deliver(b"2")), asyncio.create_task(out.deliver(b"3"))]
        await asyncio.sleep(0)
        out.end()  # the upstream ended while two messages wait
        await asyncio.sleep(0)
        assert rec.seen == [b"1\n"], "nothing passes a pause, the end included"
        out.resume_reading()
        await asyncio.gather(*held)
        await out.deliver(b"4")  # after the end: not handed on
        out.end()
        return rec.seen

    assert asyncio.run(main()) == [b"1\n", b"2\n", b"3\n", "EOF"]


def test_the_relays_close_drops_what_waits_and_ends_nothing() -> None:
    async def main() -> list[bytes | str]:
        out = _UpstreamOutput()
        rec = Recorder()
        out.set_protocol(rec)
        out.pause_reading()
        held = asyncio.create_task(out.deliver(b"late"))
        await asyncio.sleep(0)
        out.close()
        await held
        out.end()
        return rec.seen

    assert asyncio.run(main()) == []
