"""Where the bench cannot make its scratch folder (visor/bench/scratch.py): a clear refusal, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

# /proc takes no new folder, not even from root (who may write anywhere else).
COMMANDS = [
    [sys.executable, "-m", "visor.cli", "bench", "--quick"],
    [sys.executable, "-m", "visor.bench.http_rows", "--quick"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=["visor bench", "http rows"])
def test_a_working_directory_that_takes_no_folder_is_named_with_what_to_do(command: list[str]) -> None:
    done = subprocess.run(command, cwd="/proc", capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "cannot make a scratch folder in the working directory /proc" in done.stderr
    assert "run it from a folder you can write" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
