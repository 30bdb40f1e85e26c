"""`visor audit show`: a readable table of verdicts.

Values in a log can come from a hostile model or server (tool names, reasons),
so every control character printed to a terminal is made visible first
(visor/display.py): an escape sequence in a tool name must not repaint the
operator's screen.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TextIO

import orjson

from visor.audit.record import VERDICTS
from visor.display import escape

_COLUMNS: tuple[tuple[str, int], ...] = (
    ("seq", 7),
    ("time", 19),
    ("session", 8),
    ("event", 11),
    ("server", 14),
    ("tool", 22),
    ("id", 10),
    ("rule", 24),
    ("reason", 60),
)


def printable(value: Any, width: int | None = None) -> str:
    """One safe line: control and format characters as visible escapes, optionally cut to `width`."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    out = escape(text)
    if width is not None and len(out) > width:
        out = out[: max(0, width - 1)] + "…"
    return out


@dataclass(frozen=True, slots=True)
class Filter:
    session: str | None = None
    events: frozenset[str] | None = None  # None: verdicts only
    tool: str | None = None
    all_events: bool = False

    def keep(self, rec: dict[str, Any]) -> bool:
        event = rec.get("event")
        if self.events is not None:
            if event not in self.events:
                return False
        elif not self.all_events and event not in VERDICTS:
            return False
        if self.session is not None and not str(rec.get("session", "")).startswith(self.session):
            return False
        return self.tool is None or rec.get("tool") == self.tool


def _cell(rec: dict[str, Any], name: str) -> Any:
    if name == "time":
        return str(rec.get("ts", ""))[:19].replace("T", " ")
    if name == "session":
        return str(rec.get("session", ""))[:8]
    return rec.get(name)


def render(records: Iterable[dict[str, Any]], out: TextIO = sys.stdout, *, as_json: bool = False) -> int:
    """Print `records`; returns how many were printed."""
    count = 0
    if not as_json:
        out.write("  ".join(name.upper().ljust(w) for name, w in _COLUMNS).rstrip() + "\n")
    for rec in records:
        count += 1
        if as_json:
            # ASCII-escaped so that no raw control character (C1 included) reaches a terminal.
            out.write(json.dumps(rec, sort_keys=True, ensure_ascii=True, separators=(",", ":")) + "\n")
            continue
        cells = [printable(_cell(rec, name), w).ljust(w) for name, w in _COLUMNS]
        out.write("  ".join(cells).rstrip() + "\n")
    return count
