"""Lenient reading of records for display (`show`, `report`).

Unlike verify.py this never stops: a line that is not a record is counted as
malformed and skipped, so a damaged log can still be reviewed.  Integrity is
verify's job; the report states verify's result next to the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from visor.audit.verify import iter_lines


@dataclass(frozen=True, slots=True)
class Window:
    since: datetime | None = None  # inclusive
    until: datetime | None = None  # exclusive

    def contains(self, ts: str) -> bool:
        if self.since is None and self.until is None:
            return True
        try:
            when = parse_time(ts)
        except ValueError:
            return False
        return (self.since is None or when >= self.since) and (self.until is None or when < self.until)


def parse_time(text: str, *, end_of_day: bool = False) -> datetime:
    """`YYYY-MM-DD` or an ISO 8601 date-time; naive means UTC.

    With `end_of_day`, a bare date means the whole day is included (used for --until).
    """
    text = text.strip()
    if len(text) == 10:
        day = datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=UTC)
        return day + timedelta(days=1) if end_of_day else day
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def window(since: str | None, until: str | None) -> Window:
    return Window(
        parse_time(since) if since else None,
        parse_time(until, end_of_day=True) if until else None,
    )


@dataclass(frozen=True, slots=True)
class Loaded:
    files: tuple[Path, ...]
    records: tuple[dict[str, Any], ...]
    malformed: int
    missing: tuple[Path, ...]


def load(files: list[Path], win: Window = Window()) -> Loaded:
    records: list[dict[str, Any]] = []
    malformed = 0
    missing: list[Path] = []
    for path in files:
        if not path.exists():
            missing.append(path)
            continue
        for line in iter_lines(path):
            try:
                obj = orjson.loads(line.data) if line.complete else None
            except orjson.JSONDecodeError:
                obj = None
            if not isinstance(obj, dict) or not isinstance(obj.get("event"), str) or "seq" not in obj:
                malformed += 1
                continue
            if win.contains(str(obj.get("ts", ""))):
                records.append(obj)
    return Loaded(tuple(files), tuple(records), malformed, tuple(missing))
