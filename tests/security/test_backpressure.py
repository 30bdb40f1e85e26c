"""A client that writes but never reads its stdout cannot make Visor buffer without bound.

Every rejected message is answered by Visor itself. Reading from the client
used to pause only when the server's stdin was full, so the answers to a
stream of bad messages piled up in Visor's memory for a client that does not
read them. Now a full client stdout pauses reading from the client too, and
the client's own writes block, as they would against any server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import RECORDER

# "unexpected member" names the key: Visor's answer is as long as the line.
_LINE = b'{"jsonrpc":"2.0","id":1,"method":"m","' + b"k" * 4000 + b'":1}\n'
_CAP = 24 * 1024 * 1024


def test_unread_answers_pause_reading_from_the_client(tmp_path: Path) -> None:
    # Nobody ever reads this Visor's stdout.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "visor.cli",
            "run",
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
            "--log-level",
            "error",
            "--",
            sys.executable,
            str(RECORDER),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None
    fd = proc.stdin.fileno()
    os.set_blocking(fd, False)
    try:
        written = 0
        stalled_since: float | None = None
        chunk = _LINE * 16
        while written < _CAP:
            try:
                n = os.write(fd, chunk)
            except BlockingIOError:
                now = time.monotonic()
                stalled_since = stalled_since or now
                if now - stalled_since > 3.0:
                    break  # Visor stopped reading: bounded
                time.sleep(0.05)
                continue
            stalled_since = None
            written += n
            chunk = chunk[n:] or _LINE * 16
        assert written < _CAP, f"Visor kept reading {written} bytes from a client that never reads"
    finally:
        proc.kill()
        proc.wait(10)
