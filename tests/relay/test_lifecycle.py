"""Shutdown per the MCP stdio lifecycle; no child is ever left behind."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from tests.conftest import RECORDER, VisorProcess, sentinel


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes only once reaped.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.02)
    return False


def _start(tmp_path: Path, **env: str) -> tuple[VisorProcess, int]:
    pid_file = tmp_path / "server.pid"
    vp = VisorProcess(
        [sys.executable, str(RECORDER)],
        env={"RECORDER_PID_FILE": str(pid_file), **env},
        visor_args=["--shutdown-grace", "0.5"],
    )
    sentinel(vp)
    return vp, int(pid_file.read_text())


def test_client_eof_closes_server_stdin_and_exits_with_its_status(tmp_path: Path) -> None:
    vp, pid = _start(tmp_path)
    vp.request(
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {"k": 1}}}
    )
    vp.close_stdin()
    # Everything the server wrote before exiting is delivered.
    out = vp.remaining_output()
    assert any(b'"id":2' in line for line in out)
    assert vp.wait() == 0
    assert _wait_gone(pid)


def test_server_crash_ends_the_session_with_its_exit_status(tmp_path: Path) -> None:
    vp, pid = _start(tmp_path, RECORDER_EXIT_ON="crash")
    vp.request({"jsonrpc": "2.0", "method": "crash"})
    assert vp.wait() == 3
    assert _wait_gone(pid)


def test_sigterm_to_visor_stops_the_server(tmp_path: Path) -> None:
    vp, pid = _start(tmp_path)
    vp.proc.send_signal(signal.SIGTERM)
    assert vp.wait() == 0  # the server exited on stdin EOF, cleanly
    assert _wait_gone(pid)


def test_sigint_to_visor_stops_the_server(tmp_path: Path) -> None:
    vp, pid = _start(tmp_path)
    vp.proc.send_signal(signal.SIGINT)
    vp.wait()
    assert _wait_gone(pid)


def test_server_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    vp, pid = _start(tmp_path, RECORDER_IGNORE_TERM="1")
    vp.close_stdin()
    assert vp.wait(timeout=20) == 128 + signal.SIGKILL
    assert _wait_gone(pid)
    assert "server_ignored_sigterm" in vp.stderr


def test_visor_killed_outright_takes_the_server_with_it(tmp_path: Path) -> None:
    vp, pid = _start(tmp_path, RECORDER_IGNORE_TERM="1")
    vp.proc.kill()
    vp.wait()
    assert _wait_gone(pid)


def test_missing_server_command_fails_with_a_message_on_stderr() -> None:
    vp = VisorProcess(["/nonexistent/server-binary"])
    assert vp.wait() == 1
    assert vp.remaining_output(timeout=1) == []
    assert "cannot start" in vp.stderr


def test_run_help_never_touches_stdout() -> None:
    import subprocess

    for args in (["run", "--help"], ["run", "--bogus"], ["run"]):
        proc = subprocess.run([sys.executable, "-m", "visor.cli", *args], capture_output=True, timeout=30)
        assert proc.stdout == b"", args
        assert proc.stderr


def test_two_sessions_of_one_server_get_a_log_each(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {"VISOR_HOME": str(home)}
    first = VisorProcess([sys.executable, str(RECORDER)], visor_args=["--server-name", "rec"], env=env)
    second = VisorProcess([sys.executable, str(RECORDER)], visor_args=["--server-name", "rec"], env=env)
    try:
        sentinel(first)
        sentinel(second)  # both started: neither refused the other's log
    finally:
        first.kill()
        second.kill()
    logs = sorted(p.name for p in (home / "audit").glob("*.jsonl"))
    assert logs == ["rec-2.jsonl", "rec.jsonl"]


def test_what_a_server_writes_and_its_exit_before_the_client_side_is_connected_are_not_lost(
    tmp_path: Path,
) -> None:
    # A server that fails at once (a wrong argument) writes and exits while Visor is still
    # connecting the client's pipes: its output and its end reached a relay with no pipes yet,
    # and the user saw "AssertionError: the relay is not connected yet" instead of the server.
    import subprocess

    note = '{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"error","data":"bad arg"}}'
    for attempt in range(6):
        proc = subprocess.Popen(
            [sys.executable, "-m", "visor", "run", "--audit-log", str(tmp_path / f"a{attempt}.jsonl"),
             "--", "sh", "-c", f"printf '%s\\n' '{note}'"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        out, err = proc.communicate(timeout=30)
        assert b"action_failed" not in err and b"Traceback" not in err, err.decode(errors="replace")
        assert out == note.encode() + b"\n", (attempt, out)
