"""A real child process is killed with SIGKILL right after `commit` returns.

The child "relays" (writes the record's seq and hash to its stdout) only after
`await commit()` returns, exactly as the gate does; the parent kills it the
moment it sees the first relay.  Every relayed allow must be in the file.
(SIGKILL leaves the page cache intact, so this proves ordering -- written
before relay -- not survival of a power cut, which is what the fsync is for.)
"""

import os
import signal
import subprocess
import sys
import textwrap

from visor.audit.record import parse_line
from visor.audit.verify import iter_lines

CHILD = textwrap.dedent(
    """
    import asyncio, os, sys
    from visor.audit.writer import AuditWriter

    async def main():
        w = AuditWriter.open(sys.argv[1], session="crash")

        async def call(i):
            rec = await w.commit({"event": "allow", "server": "fs", "tool": "t", "id": i, "args": {}})
            os.write(1, f"{rec['seq']} {rec['hash']}\\n".encode())  # the relay
            await asyncio.sleep(3600)

        await asyncio.gather(*(call(i) for i in range(int(sys.argv[2]))))

    asyncio.run(main())
    """
)


def run_and_kill(log, calls):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(log), str(calls)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        first = child.stdout.readline()
        os.kill(child.pid, signal.SIGKILL)
        rest = child.stdout.read()
    finally:
        child.kill()
        child.wait(timeout=10)
    assert first, child.stderr.read().decode()
    assert child.returncode == -signal.SIGKILL
    relayed = [line.split() for line in (first + rest).decode().splitlines()]
    on_disk = {}
    for line in iter_lines(log):
        if line.complete:
            p = parse_line(line.data)
            on_disk[p.seq] = p.hash
    return relayed, on_disk


def test_single_allow_survives_kill_after_commit(tmp_path):
    relayed, on_disk = run_and_kill(tmp_path / "audit.jsonl", 1)
    assert len(relayed) == 1
    seq, digest = relayed[0]
    assert on_disk[int(seq)] == digest


def test_no_relayed_allow_is_lost_under_concurrency(tmp_path):
    relayed, on_disk = run_and_kill(tmp_path / "audit.jsonl", 50)
    assert relayed
    for seq, digest in relayed:
        assert on_disk.get(int(seq)) == digest
