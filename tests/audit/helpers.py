"""Shared helpers for the audit tests: real files, real fsync."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from visor.audit.writer import AuditWriter


def allow(i: int, **extra: Any) -> dict[str, Any]:
    event = {
        "event": "allow",
        "server": "fs",
        "tool": "write_file",
        "id": i,
        "args": {"path": f"/work/out/{i}.txt", "content": "secret-value-do-not-print"},
        "rule": "fs.write_file",
        "reason": "path under /work/out",
        "policy": "ab" * 32,
    }
    event.update(extra)
    return event


def write_log(path: Path, n: int, *, session: str = "s1", **open_kwargs: Any) -> list[dict[str, Any]]:
    """Open a writer, commit `n` allows, close it; returns the committed records."""

    async def run() -> list[dict[str, Any]]:
        w = AuditWriter.open(path, session=session, **open_kwargs)
        try:
            return [await w.commit(allow(i)) for i in range(n)]
        finally:
            await w.close()

    return asyncio.run(run())


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)
