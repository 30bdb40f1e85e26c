"""`visor run` with every kind of stdin and stdout: it runs or refuses cleanly, never aborts.

uvloop aborts the whole process (SIGABRT, exit 134) when it is handed a
descriptor epoll refuses, such as /dev/null or a regular file; the server was
then left behind as a zombie. Each case here starts a real `visor run` from a
small launcher that makes itself the child subreaper: a server that Visor did
not reap is then reparented to the launcher and seen as a zombie, whatever
the machine's init does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import RECORDER

PING = b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n'

_LAUNCHER = r"""
import ctypes, json, os, subprocess, sys, threading, time

ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
spec = json.loads(sys.argv[1])
closing = [n for n, kind in ((0, spec["stdin"]), (1, spec["stdout"])) if kind == "closed"]


def close_fds():
    for n in closing:
        os.close(n)


def stdin_arg(kind):
    if kind == "devnull":
        return subprocess.DEVNULL
    if kind == "file":
        return open(spec["in_file"], "rb")
    if kind == "pipe":
        return subprocess.PIPE
    if kind == "write_only":
        return open(spec["in_file"], "ab")
    return subprocess.DEVNULL  # closed in the child before exec


def stdout_arg(kind):
    if kind == "devnull":
        return subprocess.DEVNULL
    if kind == "file":
        return open(spec["out_file"], "wb")
    if kind == "pipe":
        return subprocess.PIPE
    if kind == "read_only":
        return open(os.devnull, "rb")
    return subprocess.DEVNULL


err = open(spec["err_file"], "wb")
proc = subprocess.Popen(
    spec["argv"], stdin=stdin_arg(spec["stdin"]), stdout=stdout_arg(spec["stdout"]), stderr=err,
    preexec_fn=close_fds if closing else None, env=dict(os.environ, **spec["env"]),
)
piped = b""
if proc.stdout is not None:
    chunks = []
    reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read()))
    reader.start()
if proc.stdin is not None:
    proc.stdin.write(spec["send"].encode())
    proc.stdin.close()
rc = proc.wait(timeout=60)
if proc.stdout is not None:
    reader.join(30)
    piped = b"".join(chunks)
state = None
pid_file = spec["pid_file"]
server = int(open(pid_file).read()) if os.path.exists(pid_file) and open(pid_file).read() else None
if server is not None:
    try:
        fields = open(f"/proc/{server}/stat").read().rsplit(")", 1)[1].split()
        state = fields[0]  # R, S, Z, ...
    except FileNotFoundError:
        state = "gone"
print(json.dumps({"rc": rc, "server": server, "state": state, "piped": piped.decode(errors="replace")}))
# Leave nothing behind whatever happened.
if server is not None and state not in ("gone", None):
    try:
        os.kill(server, 9)
    except ProcessLookupError:
        pass
while True:
    try:
        if os.waitpid(-1, 0)[0] == 0:
            break
    except ChildProcessError:
        break
"""


def _launch(tmp_path: Path, stdin: str, stdout: str, **env: str) -> dict:
    # The recorder exits at its stdin's end; the grace is only how long Visor waits for that before
    # SIGTERM, and at 0.5 s a loaded machine once ran past it (exit status 143 for a clean run).
    spec = {
        "argv": [
            sys.executable, "-m", "visor.cli", "run", "--shutdown-grace", "10", "--",
            sys.executable, str(RECORDER),
        ],
        "stdin": stdin,
        "stdout": stdout,
        "in_file": str(tmp_path / "in.jsonl"),
        "out_file": str(tmp_path / "out.jsonl"),
        "err_file": str(tmp_path / "err.txt"),
        "pid_file": str(tmp_path / "server.pid"),
        "send": PING.decode(),
        "env": {"RECORDER_PID_FILE": str(tmp_path / "server.pid"), **env},
    }  # fmt: skip
    (tmp_path / "in.jsonl").write_bytes(PING)
    done = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, json.dumps(spec)], capture_output=True, timeout=120, check=True
    )
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    result["stderr"] = (tmp_path / "err.txt").read_text(errors="replace")
    result["out_file"] = (tmp_path / "out.jsonl").read_bytes() if (tmp_path / "out.jsonl").exists() else b""
    return result


KINDS_IN = ("devnull", "file", "pipe", "closed")
KINDS_OUT = ("devnull", "file", "pipe", "closed")


@pytest.mark.parametrize("stdout", KINDS_OUT)
@pytest.mark.parametrize("stdin", KINDS_IN)
def test_any_stdin_and_stdout_runs_or_refuses_cleanly_and_the_server_is_reaped(
    tmp_path: Path, stdin: str, stdout: str
) -> None:
    r = _launch(tmp_path, stdin, stdout)
    rc, err = r["rc"], r["stderr"]
    assert rc != 134 and rc >= 0, (rc, err)
    assert "Traceback" not in err and "Aborted" not in err, err
    if "closed" in (stdin, stdout):
        # Refused before the server starts, with the reason on stderr.
        assert rc == 2, (rc, err)
        which = (
            "stdin (file descriptor 0) is closed"
            if stdin == "closed"
            else "stdout (file descriptor 1) is closed"
        )
        assert which in err
        assert r["server"] is None, "no server may start when the wire is unusable"
        return
    # It ran: the server started, ended with the client's EOF, and Visor reaped it.
    assert rc == 0, (rc, err)
    assert r["server"] is not None
    assert r["state"] == "gone", f"server {r['server']} left behind in state {r['state']}"
    answer = b'{"jsonrpc":"2.0","id":1,"result":{"method":"ping"}}'
    expected = b"" if stdin == "devnull" else answer  # /dev/null sends nothing
    if stdout == "file":
        assert r["out_file"].strip() == expected
    elif stdout == "pipe":
        assert r["piped"].strip() == expected.decode()
    if "pipe" not in (stdin, stdout) or stdin != stdout:
        # /dev/null and files are neither pipes nor sockets: the log says how they were read.
        assert "not_a_pipe" in err


@pytest.mark.parametrize(("stdin", "stdout", "why"), [
    ("write_only", "pipe", "stdin (file descriptor 0) is open for writing only"),
    ("pipe", "read_only", "stdout (file descriptor 1) is open for reading only"),
])  # fmt: skip
def test_a_descriptor_open_the_wrong_way_is_refused_with_the_reason(
    tmp_path: Path, stdin: str, stdout: str, why: str
) -> None:
    r = _launch(tmp_path, stdin, stdout)
    assert r["rc"] == 2, r
    assert why in r["stderr"]
    assert r["server"] is None


def test_a_server_that_ignores_sigterm_behind_dev_null_is_killed_and_reaped(tmp_path: Path) -> None:
    r = _launch(tmp_path, "devnull", "devnull", RECORDER_IGNORE_TERM="1")
    assert r["rc"] == 128 + 9, r
    assert r["state"] == "gone", r
    assert "server_ignored_sigterm" in r["stderr"]
