"""Which group a ``visor run`` belongs to: the client process that started it.

The group is named after the first ancestor that is not a launcher (a shell
running ``-c`` or a script, ``env``, ``npx``/``npm exec``, ``uv``/``uvx``, ``pipx``),
identified by its process id *and its start time*, so that a client that
exits and whose pid is reused by another process names a different group.
``VISOR_GROUP`` (or the caller's option) names a group outright.

Walking past launchers is sound because it never makes a group smaller than
the client's own: a launcher is started by the client for one server and
serves nothing else. A group larger than one client shares more seen output
(more denies and asks) and also the approvals its humans gave. An
interactive shell (options only, no command or script) is not walked past: a
person who starts servers from a terminal is that shell's client.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

GROUP_ENV = "VISOR_GROUP"

# A file name on every platform: no separators, no leading dot, bounded.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

# Ancestors walked past at most: a launcher chain is short (npx -> sh -> visor).
_MAX_WALK = 8

_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox"})
_NODES = frozenset({"node", "nodejs", "bun"})
_NPM_SCRIPTS = frozenset({"npx", "npm", "npx-cli.js", "npm-cli.js"})
_PYTHONS = re.compile(r"python(?:\d+(?:\.\d+)?)?\Z")


class GroupNameError(ValueError):
    """A group name that cannot be a file name under ``$VISOR_HOME/groups``."""


@dataclass(frozen=True, slots=True)
class ProcInfo:
    """One process, as far as grouping needs it."""

    pid: int
    ppid: int
    # Opaque token naming when the process started ("" when unknown): Linux,
    # boot id and start time in clock ticks; elsewhere, ps's lstart.
    start: str
    argv: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GroupIdentity:
    name: str
    source: str  # "option", "env" or "parent"
    client_pid: int | None = None
    client_start: str | None = None
    # argv[0] of each launcher walked past, nearest first (for the audit record)
    skipped: tuple[str, ...] = ()

    def audit(self) -> dict[str, object]:
        out: dict[str, object] = {"group": self.name, "group_source": self.source}
        if self.client_pid is not None:
            out["group_client_pid"] = self.client_pid
        if self.skipped:
            out["group_skipped"] = list(self.skipped)
        return out


def validate_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise GroupNameError(
            f"group name {name!r} is not allowed: 1 to 64 letters, digits, '.', '_' or '-', "
            "not starting with '.', '_' or '-'"
        )
    return name


# ------------------------------------------------------------------ processes


@functools.cache
def boot_id() -> str:
    """This boot's id (Linux): a start time in ticks since boot names a process only within one boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return f.read().decode("ascii", "replace").strip()
    except OSError:
        return ""


def _linux_info(pid: int) -> ProcInfo | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("utf-8", "replace")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces
    # and parentheses: the fields that follow start after the last ")".
    close = stat.rfind(")")
    if close < 0:
        return None
    rest = stat[close + 1 :].split()
    try:
        ppid = int(rest[1])  # field 4
        start = rest[19]  # field 22: start time, clock ticks after boot
    except (IndexError, ValueError):
        return None
    argv = tuple(a.decode("utf-8", "replace") for a in cmdline.split(b"\0") if a)
    return ProcInfo(pid, ppid, f"{boot_id()}:{start}", argv)


def _ps_info(pid: int) -> ProcInfo | None:
    # macOS and other systems without /proc: lstart has one-second resolution,
    # so a pid reused within the second its owner started goes unnoticed.
    try:
        out = subprocess.run(
            ["ps", "-o", "ppid=", "-o", "lstart=", "-o", "args=", "-p", str(pid)],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    parts = out.split(None, 6)  # ppid, then lstart's five words, then args
    if len(parts) < 6:
        return None
    try:
        ppid = int(parts[0])
    except ValueError:
        return None
    args = tuple(parts[6].split()) if len(parts) > 6 else ()
    return ProcInfo(pid, ppid, " ".join(parts[1:6]), args)


def process_info(pid: int) -> ProcInfo | None:
    """What grouping needs to know of ``pid``, or None if there is no such process."""
    if pid <= 0:
        return None
    if sys.platform.startswith("linux"):
        return _linux_info(pid)
    return _ps_info(pid)


def alive(pid: int, start: str) -> bool:
    """Whether the process ``pid`` that started at ``start`` is still running
    (a process that merely reuses the pid is not it)."""
    info = process_info(pid)
    return info is not None and (not start or info.start == start)


def _base(arg: str) -> str:
    return os.path.basename(arg).lstrip("-")


def is_launcher(info: ProcInfo) -> bool:
    """A process that started ``visor run`` on the client's behalf and serves nothing else."""
    argv = info.argv
    if not argv:
        return False
    # npm sets its process title: /proc shows "npm exec pkg" as one string
    first = argv[0].split()[0] if argv[0].strip() else ""
    prog = _base(first)
    if prog in _SHELLS:
        # "sh -c 'visor run ...'" or "bash start-server.sh" runs one command or
        # script; a shell with options only (or none: "-bash", "zsh -i") is
        # interactive, a person's client.
        return any(
            (a.startswith("-") and not a.startswith("--") and "c" in a) or not a.startswith(("-", "+"))
            for a in argv[1:]
        )
    if prog in ("env", "npx", "npm", "uv", "uvx", "pipx"):
        return True
    if len(argv) > 1 and (prog in _NODES or _PYTHONS.match(prog)):
        # node .../npx-cli.js, python .../pipx: the script decides
        script = _base(argv[1])
        return script in _NPM_SCRIPTS or script == "pipx"
    return False


def client_process(
    start_pid: int | None = None, info: Callable[[int], ProcInfo | None] = process_info
) -> tuple[ProcInfo | None, tuple[str, ...]]:
    """The first ancestor (from ``start_pid``, default the parent) that is not a
    launcher, and the launchers walked past. The walk stops at pid 1 and after
    a few steps: a group is never named after more than the client."""
    pid = os.getppid() if start_pid is None else start_pid
    skipped: list[str] = []
    cur = info(pid)
    while cur is not None and len(skipped) < _MAX_WALK and cur.pid > 1 and is_launcher(cur):
        parent = info(cur.ppid)
        if parent is None:
            break
        skipped.append(cur.argv[0] if cur.argv else str(cur.pid))
        cur = parent
    return cur, tuple(skipped)


def auto_name(pid: int, start: str) -> str:
    """The group of client ``pid`` started at ``start``: a reused pid names another group."""
    digest = hashlib.blake2b(f"{pid}\0{start}".encode(), digest_size=8).hexdigest()
    return f"p{pid}-{digest}"


def resolve(
    option: str | None = None,
    env: Mapping[str, str] | None = None,
    start_pid: int | None = None,
    info: Callable[[int], ProcInfo | None] = process_info,
) -> GroupIdentity:
    """This ``visor run``'s group: the option, else ``VISOR_GROUP``, else the client process.

    Raises GroupNameError for an explicit name that is not a safe file name.
    """
    if option is not None:
        return GroupIdentity(validate_name(option), "option")
    environ = os.environ if env is None else env
    named = environ.get(GROUP_ENV)
    if named is not None and named != "":
        return GroupIdentity(validate_name(named), "env")
    client, skipped = client_process(start_pid, info)
    if client is None:
        # The parent is already gone (the client exited while we started): a
        # group of our own, named after the pid we were given, shares nothing.
        pid = os.getppid() if start_pid is None else start_pid
        return GroupIdentity(auto_name(pid, f"gone:{os.getpid()}"), "parent", pid, None, skipped)
    return GroupIdentity(auto_name(client.pid, client.start), "parent", client.pid, client.start, skipped)
