"""Colour only on a terminal and never with NO_COLOR; progress on stderr, never stdout."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

from tests.install.test_first_hour import _two_logs

RED = "\x1b[31m"
GREEN = "\x1b[32m"


def on_a_terminal(args: list[str], env: dict[str, str] | None = None) -> str:
    """Run `python -m visor ARGS` with stdout on a pseudo-terminal; what it printed there."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "visor", *args],
        stdout=slave,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    os.close(slave)
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(master)
    return b"".join(chunks).decode("utf-8", "replace")


def test_watch_colours_verdicts_on_a_terminal_and_still_escapes_values() -> None:
    _two_logs()
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    out = on_a_terminal(["watch", "--since", "1h", "--no-follow"], env={**env, "TERM": "xterm"})
    deny = next(ln for ln in out.splitlines() if "deny" in ln)
    allow = next(ln for ln in out.splitlines() if "get_current_time" in ln)
    assert deny.startswith(RED) and allow.startswith(GREEN)
    # the tool name's own escape sequence is shown, not obeyed
    assert "send\\x1b[2J" in deny and "\x1b[2J" not in out


def test_no_color_and_dumb_terminals_get_none() -> None:
    _two_logs()
    for extra in ({"NO_COLOR": "1"}, {"TERM": "dumb"}):
        out = on_a_terminal(["watch", "--since", "1h", "--no-follow"], env=extra)
        assert "get_current_time" in out and "\x1b[" not in out.replace("\\x1b[", "")


def test_lint_errors_are_red_on_a_terminal_only(tmp_path: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text('version: "1.0"\nservers:\n  - name: a\n')
    out = on_a_terminal(["lint", str(bad)], env={"TERM": "xterm", "NO_COLOR": ""})
    assert RED in out and "error" in out
    piped = subprocess.run([sys.executable, "-m", "visor", "lint", str(bad)], capture_output=True, text=True)
    assert "error" in piped.stdout and "\x1b" not in piped.stdout


def test_bench_progress_goes_to_stderr(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "visor",
            "bench",
            "--quick",
            "--progress",
            "--output",
            str(tmp_path / "b.json"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env={**os.environ, "VISOR_HOME": str(tmp_path / "home")},
    )
    assert result.returncode == 0, result.stderr
    # The visor runs it measured kept their group stores in its own scratch folder, not the user's.
    home = tmp_path / "home"
    assert not home.exists(), sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    steps = [ln for ln in result.stderr.splitlines() if ln.startswith("visor bench: [")]
    assert steps and steps[0].startswith("visor bench: [1/") and "direct" in steps[0], result.stderr
    done, total = steps[-1].removeprefix("visor bench: [").split("]")[0].split("/")
    assert done == total and len(steps) == int(total), result.stderr
    assert "visor bench: [" not in result.stdout and "direct" in result.stdout, result.stdout
