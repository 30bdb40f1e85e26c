"""Switching a new group store to WAL while another member holds the file (visor/groups/store.py)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from visor.groups.store import enter_wal


def _held(path: Path) -> sqlite3.Connection:
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE IF NOT EXISTS t (a)")
    holder.execute("BEGIN")
    holder.execute("SELECT * FROM t").fetchall()  # a reader's lock, as a member reading the new file
    return holder


def test_the_switch_waits_for_the_member_holding_the_file(tmp_path: Path) -> None:
    path = tmp_path / "group.sqlite"
    holder = _held(path)
    joiner = sqlite3.connect(path, isolation_level=None, timeout=0.05, check_same_thread=False)
    # SQLite's own wait is not enough: a short one ends in "locked", as members created at once saw.
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        joiner.execute("PRAGMA journal_mode = WAL")
    result: dict[str, object] = {}
    worker = threading.Thread(target=lambda: result.update(mode=enter_wal(joiner, time.monotonic() + 30)))
    worker.start()
    time.sleep(0.3)
    assert worker.is_alive()  # still trying, not failed
    holder.execute("COMMIT")
    worker.join(30)
    assert result["mode"] == ("wal",)
    holder.close()
    joiner.close()


def test_the_switch_gives_up_at_its_deadline(tmp_path: Path) -> None:
    path = tmp_path / "group.sqlite"
    holder = _held(path)
    joiner = sqlite3.connect(path, isolation_level=None, timeout=0.05)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        enter_wal(joiner, time.monotonic() + 0.2)
    holder.close()
    joiner.close()
