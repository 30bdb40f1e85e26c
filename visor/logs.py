"""Logging configuration, in one place: structlog to stderr, never stdout.

Stdout of `visor run` is the protocol wire, so every log event goes to
file descriptor 2, one event per line.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal, cast

# structlog imports rich, when it is installed, at its own import (about 90 ms
# of `visor run`'s start and several MB of its peak RSS) for pretty tracebacks
# that Visor never shows: format_exc_info below renders an exception as plain
# text before any renderer sees it. So rich is hidden from that one import,
# and only from it: anything imported later gets the real package.
_hide_rich = "rich" not in sys.modules
if _hide_rich:
    cast(dict[str, Any], sys.modules)["rich"] = None
try:
    import structlog
    from structlog.typing import EventDict
finally:
    if _hide_rich and sys.modules.get("rich", sys) is None:
        del sys.modules["rich"]

from visor.display import escape  # noqa: E402 - after structlog, see above

LogFormat = Literal["json", "console"]


def _safe(value: object, keep: str = "") -> object:
    if isinstance(value, str):
        return escape(value, keep=keep)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    # Containers and objects are shown as their repr, which already escapes
    # what str.isprintable() refuses; escape() catches anything a custom repr lets through.
    return escape(repr(value))


def escape_controls(_logger: object, _name: str, event_dict: EventDict) -> EventDict:
    """Every value a log line shows, with control characters made visible.

    Values come from the agent, the client and the server (tool names,
    arguments, error text): an escape sequence in one must not reach the
    operator's terminal. A traceback keeps its own line breaks.
    """
    return {escape(str(k)): _safe(v, "\n" if k == "exception" else "") for k, v in event_dict.items()}


def configure(level: str = "info", fmt: LogFormat = "console") -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    renderer: structlog.typing.Processor
    if fmt == "json":
        # ASCII-only JSON: every control character is a \\u escape.
        renderer = structlog.processors.JSONRenderer(ensure_ascii=True)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            # JSON escapes controls itself; the console renderer prints strings raw.
            *([] if fmt == "json" else [escape_controls]),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Libraries that use the standard logging module also write to stderr.
    logging.basicConfig(stream=sys.stderr, level=max(numeric, logging.WARNING))


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    # structlog types get_logger as Any: what it gives is a lazy proxy that
    # becomes the filtering bound logger configure() sets up.
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(name)
    return logger
