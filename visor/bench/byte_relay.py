"""The floor: a relay that copies bytes both ways and does nothing else.

Any proxy between two pipes pays at least this (two extra pipe hops and a
process); Visor's rows are compared with it as well as with a direct
connection.
"""

from __future__ import annotations

import asyncio
import os
import sys

import uvloop


class _Copy(asyncio.Protocol):
    def __init__(self, target: asyncio.WriteTransport, done: asyncio.Future[None]) -> None:
        self._target = target
        self._done = done

    def data_received(self, data: bytes) -> None:
        self._target.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._target.close()
        if not self._done.done():
            self._done.set_result(None)


async def _main(argv: list[str]) -> int:
    loop = asyncio.get_running_loop()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None
    client_out, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(1, "wb", 0))
    up_done: asyncio.Future[None] = loop.create_future()
    down_done: asyncio.Future[None] = loop.create_future()
    server_in = proc.stdin.transport
    server_out = proc.stdout
    await loop.connect_read_pipe(lambda: _Copy(server_in, up_done), os.fdopen(0, "rb", 0))

    async def pump_down() -> None:
        while chunk := await server_out.read(256 * 1024):
            client_out.write(chunk)
        down_done.set_result(None)

    await asyncio.gather(pump_down(), up_done)
    return await proc.wait()


def main() -> None:
    sys.exit(uvloop.run(_main(sys.argv[1:])))


if __name__ == "__main__":
    main()
