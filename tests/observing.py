"""Waiting for a state another process reaches, not for a duration: shared by the flow-control
tests that read what a real server did from the files it writes."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def until(predicate: Callable[[], Any], what: str, limit: float = 120.0) -> None:
    """Waits for a state, not a duration: the limit only ends a test that would hang."""
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


def settled(read: Callable[[], Any], what: str) -> Any:
    """The value `read` gives once it stopped changing (a stalled writer), for two seconds."""
    last, same = read(), 0

    def still() -> bool:
        nonlocal last, same
        now = read()
        same = same + 1 if now == last else 0
        last = now
        return same >= 40

    until(still, what)
    return last


def read_note(state: Path, name: str) -> str | None:
    """What a test server wrote to `state / name`, or None before it wrote it."""
    try:
        return (state / name).read_text()
    except FileNotFoundError:
        return None


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")
