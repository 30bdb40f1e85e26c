"""Lenient reading of records for display (`show`, `report`).

Unlike verify.py this never stops: a line that is not a record is counted as
malformed and skipped, so a damaged log can still be reviewed.  Integrity is
verify's job; the report states verify's result next to the numbers.
"""

from __future__ import annotations

import re
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


# `30m`, `1h`, `2d`, `1w`, `90s`, or several together (`1h30m`): that long before now.
_RELATIVE = re.compile(r"(?:\d+[smhdw])+")
_PART = re.compile(r"(\d+)([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_FORMS = "a duration before now (30m, 1h, 2d, 1w, 1h30m), a date (2026-05-04) or an ISO date-time (2026-05-04T09:30:00Z)"


def parse_time(text: str, *, end_of_day: bool = False, now: datetime | None = None) -> datetime:
    """A relative time (`30m`, `1h`, `2d`: that long before `now`), `YYYY-MM-DD` or an ISO 8601 date-time.

    A date-time without an offset means UTC. With `end_of_day`, a bare date
    means the whole day is included (used for --until). Anything else raises
    ValueError naming the value and the accepted forms.
    """
    text = text.strip()
    compact = text.replace(" ", "").lower()
    try:
        if _RELATIVE.fullmatch(compact):
            delta = timedelta()
            for amount, unit in _PART.findall(compact):
                delta += timedelta(**{_UNITS[unit]: int(amount)})
            return (now or datetime.now(UTC)) - delta
        if len(text) == 10:
            day = datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=UTC)
            return day + timedelta(days=1) if end_of_day else day
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (ValueError, OverflowError):
        raise ValueError(f"{text!r} is not a time: use {_FORMS}") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def window(since: str | None, until: str | None, *, now: datetime | None = None) -> Window:
    """The records between `since` (inclusive) and `until` (exclusive); either may be absent.

    Both are read against one `now`, so `--since 2h --until 1h` is exactly an hour.
    """
    now = now or datetime.now(UTC)
    start = _named("--since", since, now=now) if since else None
    end = _named("--until", until, now=now, end_of_day=True) if until else None
    if start is not None and end is not None and start >= end:
        raise ValueError(f"--since {since} is not before --until {until}: no record could match")
    return Window(start, end)


def _named(option: str, text: str, *, now: datetime, end_of_day: bool = False) -> datetime:
    try:
        return parse_time(text, end_of_day=end_of_day, now=now)
    except ValueError as exc:
        raise ValueError(f"{option} {exc}") from None


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
        try:
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
        except OSError:  # unreadable, or not a regular file: verify says which (the report quotes it)
            missing.append(path)
    return Loaded(tuple(files), tuple(records), malformed, tuple(missing))
