"""A new user's first hour: decisions visible, approvals findable, one way to read logs, conventions."""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.approval.helpers import call, start, wait_pending
from tests.install.helpers import VISOR_EXE, visor
from visor.audit.writer import AuditWriter


def _stderr_until(vp, pattern: str, timeout: float = 20.0) -> str:
    """Wait for a line on visor run's stderr (an event, not a speed assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = b"".join(vp.stderr_chunks).decode(errors="replace")
        if re.search(pattern, text):
            return text
        time.sleep(0.02)
    raise AssertionError(f"no {pattern!r} on stderr:\n{b''.join(vp.stderr_chunks).decode(errors='replace')}")


# ------------------------------------------------------------------ item 3: decisions are visible


def test_ask_prints_the_id_and_the_answering_command_and_approve_finds_the_directory(tmp_path: Path) -> None:
    adir = tmp_path / "answers"  # not the default directory: the hint must carry --approval-dir
    vp, _log, _audit = start(tmp_path, echo_approval=True, approval_dir=adir)
    try:
        call(vp, 7, "echo", {"text": "hello \x1b[31m"})
        [approval_id] = wait_pending(adir)
        err = _stderr_until(vp, approval_id)
        line = next(ln for ln in err.splitlines() if approval_id in ln)
        assert "ask" in line and "echo" in line
        assert f"visor approve --approval-dir {shlex.quote(str(adir))} {approval_id}" in line
        assert f"visor deny --approval-dir {shlex.quote(str(adir))} {approval_id}" in line
        assert "\x1b" not in err
        # `visor approve` with no --approval-dir lists it: the run registered its directory
        env = {**os.environ}
        listed = visor("approve", env=env)
        assert listed.returncode == 0, listed.stderr
        assert approval_id in listed.stdout
        # a unique prefix answers it
        done = visor("approve", approval_id[:6], env=env)
        assert done.returncode == 0, done.stderr
        assert f"approved {approval_id}" in done.stdout
        answer = vp.recv()
        assert answer["id"] == 7 and "result" in answer
        # a denied call is announced too
        call(vp, 8, "not_listed", {})
        assert vp.recv()["id"] == 8
        err = _stderr_until(vp, r"deny.*not_listed|not_listed.*deny")
        vp.close_stdin()
        assert vp.wait() == 0
    finally:
        vp.kill()
    # the registry entry goes with the process
    assert not list((Path(os.environ["VISOR_HOME"]) / "run").glob("*.json"))


def test_approve_prefix_errors_are_clear(tmp_path: Path) -> None:
    bad = visor("deny", "zz")
    assert bad.returncode == 1 and "not an approval id" in bad.stderr
    none = visor("deny", "abc")
    assert none.returncode == 1 and "no pending request abc" in none.stderr


def test_registry_ignores_entries_of_dead_processes(tmp_path: Path) -> None:
    from visor.watch import registered_approval_dirs

    run = Path(os.environ["VISOR_HOME"]) / "run"
    run.mkdir(parents=True)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    (run / f"{dead.stdout.strip()}.json").write_text(
        json.dumps({"pid": int(dead.stdout), "approval_dir": str(tmp_path / "gone")})
    )
    (run / "torn.json").write_text("{")
    (run / f"{os.getpid()}.json").write_text(json.dumps({"pid": os.getpid(), "approval_dir": str(tmp_path)}))
    assert registered_approval_dirs() == [tmp_path]


def _log(path: Path, server: str, events: list[dict]) -> Path:
    w = AuditWriter.open(path, session="s-" + server)
    w.append({"event": "session_start", "server": server, "argv0": "x", "policy": "p"})
    for e in events:
        w.append({"server": server, **e})
    w.close_sync()
    return path


def _two_logs() -> tuple[Path, Path]:
    d = Path(os.environ["VISOR_HOME"]) / "audit"
    a = _log(d / "mail.jsonl", "mail", [{"event": "deny", "tool": "send\x1b[2J", "id": 1, "rule": "r"}])
    b = _log(d / "time.jsonl", "time", [{"event": "allow", "tool": "get_current_time", "id": 1, "rule": "r"}])
    return a, b


def test_watch_prints_decisions_of_every_log_escaped() -> None:
    _two_logs()
    out = visor("watch", "--since", "1h", "--no-follow")
    assert out.returncode == 0, out.stderr
    assert "get_current_time" in out.stdout and "send\\x1b[2J" in out.stdout
    assert "\x1b" not in out.stdout
    assert "session_start" not in out.stdout
    old = visor("watch", "--since", "2000-01-01", "--no-follow", "--verdict", "deny")
    assert "get_current_time" not in old.stdout and "send" in old.stdout


def test_watch_reads_since_as_the_audit_commands_do() -> None:
    # One reader of times (visor.audit.reader.parse_time): combined durations
    # and spaces work here as in `visor audit show`, and a bad or overflowing
    # value is a usage error naming the accepted forms, never a traceback.
    _two_logs()
    for since in ("1h30m", " 2 h ", "1W"):
        out = visor("watch", "--since", since, "--no-follow")
        assert out.returncode == 0 and "get_current_time" in out.stdout, (since, out.stderr)
    for bad in ("1x", "99999999999999d", "yesterday"):
        out = visor("watch", "--since", bad, "--no-follow")
        assert out.returncode == 2 and out.stdout == "", bad
        assert "bad --since" in out.stderr and "a duration before now" in out.stderr, bad
        assert "Traceback" not in out.stderr


def test_watch_follows_new_records(tmp_path: Path) -> None:
    a, _ = _two_logs()
    env = {**os.environ, "PATH": f"{VISOR_EXE.parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "visor", "watch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stderr is not None and "watching" in proc.stderr.readline()
        # without --since, only what is written from now on
        w = AuditWriter.open(a, session="s2")
        w.append({"event": "deny", "server": "mail", "tool": "late_tool", "id": 2, "rule": "r"})
        w.close_sync()
        assert proc.stdout is not None
        # Bounded: a record the watcher missed must fail the test, not hang the suite.
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "visor watch showed nothing within 30 s of the record"
        line = proc.stdout.readline()
        assert "late_tool" in line and "deny" in line
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------ item 4: one way to read logs


def test_audit_commands_default_to_every_log_and_take_files() -> None:
    a, b = _two_logs()
    verify = visor("audit", "verify")
    assert verify.returncode == 0 and "mail.jsonl" in verify.stdout and "time.jsonl" in verify.stdout
    show = visor("audit", "show")
    assert show.returncode == 0, show.stderr
    assert "get_current_time" in show.stdout and "mail" in show.stdout
    one = visor("audit", "show", str(b))
    assert "get_current_time" in one.stdout and "send" not in one.stdout
    legacy = visor("audit", "show", "--file", str(a))
    assert "send" in legacy.stdout and "get_current_time" not in legacy.stdout
    report = visor("report")
    assert report.returncode == 0, report.stderr
    assert "mail.jsonl" in report.stdout and "time.jsonl" in report.stdout
    legacy_report = visor("report", "--audit", str(b))
    assert "time.jsonl" in legacy_report.stdout and "mail.jsonl" not in legacy_report.stdout
    for cmd in (["audit", "verify", "--help"], ["audit", "show", "--help"], ["report", "--help"]):
        text = visor(*cmd).stdout
        assert "$VISOR_HOME/audit/" in text and "audit.jsonl" not in text and "--file" not in text


@pytest.mark.parametrize("command", ["run", "serve"])
def test_a_pin_file_that_cannot_be_written_is_refused_at_start(tmp_path: Path, command: str) -> None:
    # A typo'd --pin-file (a folder that is a file) ran, saved nothing (a traceback on stderr),
    # and the next start trusted on first use again whatever the server listed then.
    (tmp_path / "pins").write_text("not a folder\n")
    pin = tmp_path / "pins" / "sdk.json"
    from tests.install.helpers import SDK_SERVER

    started = tmp_path / "started"
    listen = ["--listen", "127.0.0.1:0"] if command == "serve" else []
    out = subprocess.run(
        [str(VISOR_EXE), command, *listen, "--pin-file", str(pin), "--", "sh", "-c",
         f'touch {shlex.quote(str(started))}; exec "$0" "$1"', sys.executable, str(SDK_SERVER)],
        input=b"", capture_output=True, timeout=60,
    )  # fmt: skip
    err = out.stderr.decode(errors="replace")
    assert out.returncode != 0, err
    assert f"visor {command}: pin file {pin} refused: {tmp_path / 'pins'} is not a directory" in err, err
    assert not started.exists()


def test_no_logs_yet_is_explained_not_an_error() -> None:
    for cmd in (["audit", "verify"], ["audit", "show"]):
        out = visor(*cmd)
        assert out.returncode == 0, out.stderr
        assert "no audit logs in" in out.stderr
        # the command to name files with, as the user types it
        assert f"or name files: visor {' '.join(cmd)} FILE..." in out.stderr, out.stderr


def test_report_describes_the_embedded_default_policy(tmp_path: Path) -> None:
    from visor.policy.loader import load_default_policy

    sha = load_default_policy().sha256
    d = Path(os.environ["VISOR_HOME"]) / "audit"
    _log(
        d / "time.jsonl",
        "time",
        [
            {"event": "policy_load", "source": "<default>", "policy": sha},
            {"event": "allow", "tool": "get_current_time", "id": 1, "rule": "r"},
        ],
    )
    out = visor("report", "-o", str(tmp_path / "deep" / "er" / "pack.md"))
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "deep" / "er" / "pack.md").read_text()
    assert "embedded default policy" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| time | get\\_current\\_time |"))
    assert "| yes |" in row and "by default action" not in row
    assert "pinned" in row and "sensitive files" in row and "destination provenance" in row


# ------------------------------------------------------------------ item 1: parents are created


def test_scaffold_creates_the_folder_of_its_output(tmp_path: Path) -> None:
    from tests.install.helpers import SDK_SERVER

    home = Path(os.environ["VISOR_HOME"])
    target = home / "policies" / "sdk.yaml"
    out = visor("policy", "scaffold", "-o", str(target), "--", sys.executable, str(SDK_SERVER))
    assert out.returncode == 0, out.stderr
    assert target.is_file()
    assert oct(home.stat().st_mode & 0o777) == "0o700"
    assert oct(target.parent.stat().st_mode & 0o777) == "0o700"


# ------------------------------------------------------------------ item 6: conventions


def test_conventions() -> None:
    for flag in ("-V", "--version"):
        out = visor(flag)
        assert out.returncode == 0 and out.stdout.startswith("visor ")
    m = subprocess.run([sys.executable, "-m", "visor", "--version"], capture_output=True, text=True)
    assert m.returncode == 0 and m.stdout.startswith("visor ")
    typo = visor("aprove")
    assert typo.returncode == 2 and "did you mean 'approve'" in typo.stderr
    for cmd in ("init", "doctor", "audit", "report", "approve", "deny", "watch", "lint", "pins", "run"):
        shown = visor(cmd, "--help")
        help_text = shown.stdout + shown.stderr
        assert "example:" in help_text, cmd
        assert "usage:" in help_text


def test_a_typo_in_an_option_names_the_command_and_the_option_it_meant() -> None:
    # argparse blamed the top level ("usage: visor [-h] ... COMMAND"), which has no such option.
    for argv, command, typo, meant in (
        (("run", "--polcy", "p.yaml", "--", "true"), "visor run", "--polcy", "--policy"),
        (("init", "--confg", ".mcp.json"), "visor init", "--confg", "--config"),
        (("audit", "verify", "--kye", "k.pub"), "visor audit verify", "--kye", "--key"),
        (("-q", "doctor", "--jsn"), "visor doctor", "--jsn", "--json"),
    ):
        out = visor(*argv)
        assert out.returncode == 2, argv
        assert f"{command}: unknown option '{typo}'; did you mean '{meant}'" in out.stderr, out.stderr
        assert f"`{command} --help`" in out.stderr and "usage: visor [-h]" not in out.stderr


def test_run_help_goes_to_stderr_even_before_the_wire_is_protected(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # `visor run` moves fd 1 away before parsing; its parser does not count on that.
    from visor.cli import build_parser

    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["run", "--help"])
    assert exit_info.value.code == 0
    out, err = capsys.readouterr()
    assert out == "" and "usage: visor run [OPTIONS] -- COMMAND [ARGS...]" in err and "--policy" in err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["version", "--help"])
    assert "usage: visor version" in capsys.readouterr().out  # the other commands' help stays on stdout


def test_ctrl_c_exits_130(tmp_path: Path) -> None:
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "visor", "watch"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None and "watching" in proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    assert "Traceback" not in proc.stderr.read()


def test_a_policy_with_no_entry_for_the_server_name_is_named_at_start(tmp_path: Path) -> None:
    # A typo in --server-name (or in the entry's name) refused every call with no word at start.
    policy = tmp_path / "policy.yaml"
    policy.write_text('version: "1.0"\ndefault_action: deny\nservers: [{name: filesystem, allowed: true}]\n')
    out = subprocess.run(
        [str(VISOR_EXE), "run", "--server-name", "filesytem", "--policy", str(policy),
         "--audit-log", str(tmp_path / "a.jsonl"), "--", sys.executable, "-c", "pass"],
        input=b"", capture_output=True, timeout=60,
    )  # fmt: skip
    err = out.stderr.decode(errors="replace")
    assert "policy_has_no_entry_for_server" in err and "filesytem" in err and "filesystem" in err, err
    assert out.stdout == b""
