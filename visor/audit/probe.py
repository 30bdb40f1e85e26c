"""fsync latency of the disk under a directory, for the benchmark table."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

_fdatasync = getattr(os, "fdatasync", os.fsync)


def fsync_latency_probe(directory: str | os.PathLike[str], samples: int = 20) -> float:
    """Median seconds of `samples` (append 64 bytes + fdatasync) on a temporary file.

    Same syscall pattern as one group commit, so the bench can put the audit
    cost next to the raw cost of the disk.
    """
    fd, name = tempfile.mkstemp(prefix=".visor-fsync-probe-", dir=Path(directory))
    try:
        times: list[float] = []
        for _ in range(max(1, samples)):
            start = time.perf_counter()
            os.write(fd, b"x" * 63 + b"\n")
            _fdatasync(fd)
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    finally:
        os.close(fd)
        os.unlink(name)
