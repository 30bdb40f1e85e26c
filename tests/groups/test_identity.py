"""Group identity: the client process (pid and start time), launchers walked past, explicit names."""

from __future__ import annotations

import os
import shlex
import shutil
import sys

import pytest

from tests.groups.helpers import child_env, run_py
from visor.groups import identity
from visor.groups.identity import GroupNameError, ProcInfo

RESOLVE = """
import json
from visor.groups import identity
g = identity.resolve()
print(json.dumps([g.name, g.source, g.client_pid, list(g.skipped)]))
"""


def _no_group_env() -> dict[str, str]:
    env = child_env()
    env.pop(identity.GROUP_ENV, None)
    return env


def test_two_servers_of_one_client_share_a_group() -> None:
    env = _no_group_env()
    a = run_py(RESOLVE, env=env)
    b = run_py(RESOLVE, env=env)
    assert a[0] == b[0]
    assert a[1] == "parent"
    assert a[2] == os.getpid()


def test_a_shell_running_one_command_is_walked_past() -> None:
    # "sh -c 'python ...; true'": sh stays the parent (no exec of the last command)
    cmd = f"{shlex.quote(sys.executable)} -c {shlex.quote(RESOLVE)}; true"
    shell = f"""
import json, os, subprocess
out = subprocess.run(["sh", "-c", {cmd!r}], capture_output=True, text=True, check=True).stdout
print(json.dumps([*json.loads(out.strip().splitlines()[-1]), os.getpid()]))
"""
    via_shell = run_py(shell, env=_no_group_env())
    direct = run_py(RESOLVE, env=_no_group_env())
    # The shell's parent is an interpreter started by this test, not this test:
    # the walk stops at that interpreter (a real client), past the shell.
    assert via_shell[3] and os.path.basename(via_shell[3][0]) == "sh"
    assert via_shell[2] == via_shell[4]  # the interpreter that ran sh is the client
    assert via_shell[0] != direct[0]


def test_a_different_client_is_a_different_group() -> None:
    # A child interpreter (not a launcher) is itself the client of its children.
    nested = f"""
import json, subprocess, sys
out = subprocess.run([sys.executable, "-c", {RESOLVE!r}], capture_output=True, text=True, check=True).stdout
print(out.strip().splitlines()[-1])
"""
    inner = run_py(nested, env=_no_group_env())
    outer = run_py(RESOLVE, env=_no_group_env())
    assert inner[0] != outer[0]
    assert inner[2] != os.getpid()


def test_a_reused_pid_is_a_different_group() -> None:
    # The same pid, started at another time: another process, another group.
    procs = {
        10: ProcInfo(10, 1, "boot:100", ("claude",)),
    }
    first = identity.resolve(env={}, start_pid=10, info=procs.get)
    procs[10] = ProcInfo(10, 1, "boot:999", ("claude",))
    second = identity.resolve(env={}, start_pid=10, info=procs.get)
    assert first.name != second.name
    assert first.client_pid == second.client_pid == 10


def test_a_real_pid_with_another_start_is_not_alive() -> None:
    me = identity.process_info(os.getpid())
    assert me is not None and me.start
    assert identity.alive(os.getpid(), me.start)
    assert not identity.alive(os.getpid(), me.start + "0")
    # our own start time is read from /proc on Linux: boot id and field 22
    if sys.platform.startswith("linux"):
        assert me.start.startswith(identity.boot_id() + ":")
        assert me.ppid == os.getppid()


def test_launchers_are_walked_past_up_to_the_client() -> None:
    procs = {
        40: ProcInfo(40, 30, "s40", ("sh", "-c", "visor run -- x")),
        30: ProcInfo(30, 20, "s30", ("npm exec visor-mcp-proxy",)),
        20: ProcInfo(20, 10, "s20", ("/usr/bin/node", "/opt/ide/extension-host.js")),
        10: ProcInfo(10, 1, "s10", ("-bash",)),
    }
    g = identity.resolve(env={}, start_pid=40, info=procs.get)
    assert g.client_pid == 20  # node running something other than npx is the client
    assert g.skipped == ("sh", "npm exec visor-mcp-proxy")


@pytest.mark.parametrize(
    ("argv", "launcher"),
    [
        (("sh", "-c", "x"), True),
        (("/bin/bash", "-lc", "x"), True),
        (("-bash",), False),  # a login shell: a person at a terminal
        (("zsh", "-i"), False),
        (("bash", "-l"), False),
        (("bash", "/home/me/bin/start-mail-server.sh"), True),
        (("sh", "-e", "-c", "x"), True),
        (("bash", "--norc", "-c", "x"), True),
        (("/usr/bin/env", "visor"), True),
        (("node", "/usr/lib/node_modules/npm/bin/npx-cli.js", "visor"), True),
        (("node", "/home/me/.claude/cli.js"), False),
        (("uvx", "visor-mcp-proxy"), True),
        (("/usr/bin/python3", "/usr/bin/pipx", "run", "x"), True),
        (("/usr/bin/python3", "/opt/client.py"), False),
        ((), False),
    ],
)
def test_which_processes_are_launchers(argv: tuple[str, ...], launcher: bool) -> None:
    assert identity.is_launcher(ProcInfo(5, 1, "", argv)) is launcher


def test_the_walk_stops_at_init_and_is_bounded() -> None:
    chain = {i: ProcInfo(i, i - 1, f"s{i}", ("sh", "-c", "x")) for i in range(1, 30)}
    g = identity.resolve(env={}, start_pid=29, info=chain.get)
    assert len(g.skipped) == 8
    assert g.client_pid == 21


def test_explicit_group_wins_and_is_validated() -> None:
    assert identity.resolve(env={"VISOR_GROUP": "work-1"}).name == "work-1"
    assert identity.resolve(env={"VISOR_GROUP": "work-1"}).source == "env"
    assert identity.resolve("opt.2", env={"VISOR_GROUP": "work-1"}).name == "opt.2"
    for bad in ("../x", ".hidden", "a/b", "", "x" * 65, "a b", "-rf", "é"):
        with pytest.raises(GroupNameError, match="not allowed"):
            identity.validate_name(bad)
    with pytest.raises(GroupNameError):
        identity.resolve(env={"VISOR_GROUP": "../../etc"})


def test_a_parent_that_is_gone_gives_a_group_of_its_own() -> None:
    g = identity.resolve(env={}, start_pid=12345, info=lambda pid: None)
    h = identity.resolve(env={}, start_pid=12345, info=lambda pid: None)
    assert g.client_start is None
    assert g.name == h.name  # one process, one name; never another client's group
    identity.validate_name(g.name)


@pytest.mark.skipif(shutil.which("ps") is None, reason="no ps on this machine")
def test_the_ps_reading_used_without_proc() -> None:
    # macOS has no /proc: the same facts come from ps (lstart, one-second resolution)
    me = identity._ps_info(os.getpid())
    assert me is not None
    assert me.ppid == os.getppid()
    assert len(me.start.split()) == 5  # "Wed Dec  2 07:12:26 2026"
    assert me.argv and os.path.basename(me.argv[0]).startswith("python")
    parent = identity._ps_info(os.getppid())
    assert parent is not None and parent.pid == os.getppid()
    assert identity._ps_info(2**22 + 12345) is None  # above pid_max: no such process
