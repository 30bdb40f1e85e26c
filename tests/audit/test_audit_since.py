"""`--since`/`--until` on `visor audit show` and `visor report`: relative times, dates, ISO times.

The records are written by the real writer with a clock set hours apart, then
read back through the real commands (in a subprocess, as a user runs them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from visor.audit.reader import parse_time, window
from visor.audit.record import utc_timestamp
from visor.audit.writer import AuditWriter

NOW = datetime(2026, 5, 4, 12, 0, 0, tzinfo=UTC)


def test_relative_times_count_back_from_now() -> None:
    assert parse_time("30m", now=NOW) == NOW - timedelta(minutes=30)
    assert parse_time("1h", now=NOW) == NOW - timedelta(hours=1)
    assert parse_time("2d", now=NOW) == NOW - timedelta(days=2)
    assert parse_time("1w", now=NOW) == NOW - timedelta(weeks=1)
    assert parse_time("90s", now=NOW) == NOW - timedelta(seconds=90)
    assert parse_time("1h30m", now=NOW) == NOW - timedelta(minutes=90)
    assert parse_time(" 2H ", now=NOW) == NOW - timedelta(hours=2)


def test_dates_and_iso_times() -> None:
    assert parse_time("2026-05-04") == datetime(2026, 5, 4, tzinfo=UTC)
    assert parse_time("2026-05-04", end_of_day=True) == datetime(2026, 5, 5, tzinfo=UTC)
    assert parse_time("2026-05-04T09:30:00Z") == datetime(2026, 5, 4, 9, 30, tzinfo=UTC)
    assert parse_time("2026-05-04T11:30:00+02:00") == datetime(2026, 5, 4, 9, 30, tzinfo=UTC)
    assert parse_time("2026-05-04T09:30:00") == datetime(2026, 5, 4, 9, 30, tzinfo=UTC)  # no offset: UTC


@pytest.mark.parametrize("bad", ["2x", "1 hour", "yesterday", "-1h", "h", "2026-13-01", "99999999999d", ""])
def test_a_bad_value_is_refused_naming_it_and_the_forms(bad: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_time(bad, now=NOW)
    assert repr(bad.strip()) in str(info.value)
    assert "30m, 1h, 2d" in str(info.value)


def test_window_reads_both_ends_against_one_now() -> None:
    win = window("2h", "1h", now=NOW)
    assert win.since == NOW - timedelta(hours=2) and win.until == NOW - timedelta(hours=1)
    with pytest.raises(ValueError, match="--since 1h is not before --until 2h"):
        window("1h", "2h", now=NOW)
    with pytest.raises(ValueError, match="--until 'soon' is not a time"):
        window(None, "soon", now=NOW)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A log under $VISOR_HOME/audit/ with calls 3 hours, 100 minutes and 10 minutes old."""
    home = tmp_path / "home"
    now = datetime.now(UTC)
    ages = iter([timedelta(hours=3), timedelta(minutes=100), timedelta(minutes=10)])
    age = timedelta(hours=3)

    def clock() -> str:
        return utc_timestamp(now - age)

    w = AuditWriter.open(home / "audit" / "mail.jsonl", session="s", clock=clock)
    for tool in ("three-hours-ago", "hundred-minutes-ago", "ten-minutes-ago"):
        age = next(ages)
        w.append({"event": "deny", "server": "mail", "tool": tool, "id": tool, "rule": "r", "reason": "no"})
    w.close_sync()
    return home


def visor(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VISOR_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "visor", *argv], capture_output=True, text=True, env=env, timeout=60
    )


def shown(home: Path, *argv: str) -> list[str]:
    out = visor(home, "audit", "show", "--json", *argv)
    assert out.returncode == 0, out.stderr
    return [json.loads(line)["tool"] for line in out.stdout.splitlines()]


def test_show_since_relative(home: Path) -> None:
    assert shown(home, "--since", "1h") == ["ten-minutes-ago"]
    assert shown(home, "--since", "2h") == ["hundred-minutes-ago", "ten-minutes-ago"]
    assert shown(home, "--since", "2d") == ["three-hours-ago", "hundred-minutes-ago", "ten-minutes-ago"]
    assert shown(home, "--since", "2h", "--until", "30m") == ["hundred-minutes-ago"]
    assert shown(home, "--until", "2h") == ["three-hours-ago"]
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert shown(home, "--since", tomorrow) == []


@pytest.mark.parametrize("command", [["audit", "show"], ["report"]])
def test_bad_since_is_a_clear_error_with_exit_2(home: Path, command: list[str]) -> None:
    out = visor(home, *command, "--since", "2x")
    assert out.returncode == 2
    assert "--since '2x' is not a time" in out.stderr and "30m, 1h, 2d" in out.stderr
    assert out.stdout == ""


def test_report_since_relative(home: Path) -> None:
    recent = visor(home, "report", "--since", "1h")
    assert recent.returncode == 0, recent.stderr
    assert "ten-minutes-ago" in recent.stdout
    assert "three-hours-ago" not in recent.stdout and "hundred-minutes-ago" not in recent.stdout
    everything = visor(home, "report", "--since", "1d")
    assert "three-hours-ago" in everything.stdout and "ten-minutes-ago" in everything.stdout
