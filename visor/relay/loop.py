"""The event loop `visor run` and `visor serve` run on: uvloop where it can be imported, else asyncio's.

uvloop is the faster loop (docs/benchmarks.md) and is installed with Visor where it builds; on a
platform without it (or an install that lacks it) the standard loop runs the same code, and one
info line on stderr says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from visor.logs import get_logger

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to completion on a new event loop, as `asyncio.run` does."""
    try:
        import uvloop
    except ImportError as exc:
        get_logger("visor.loop").info(
            "uvloop_unavailable", detail="running on the standard asyncio event loop", error=str(exc)
        )
        return asyncio.run(main)
    return uvloop.run(main)
