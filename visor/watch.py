"""Seeing decisions as they happen.

* `announce`: the one line per deny and per approval question `visor run`
  prints on stderr (called from the gate's audit-record path), with the
  approval id and the exact command that answers it.
* The run registry: a `visor run` with an approval directory leaves a small
  file ``$VISOR_HOME/run/<pid>.json`` naming it, removed at exit, so that
  `visor approve` finds every directory in use. Entries of processes that are
  gone are ignored.
* `visor watch`: a live view of the decisions in every log under
  ``$VISOR_HOME/audit/``.

Everything shown comes from the agent or the server and is escaped first.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from visor.userfiles import ensure_dir, run_dir

# ------------------------------------------------------------------ run registry


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def register_approval_dir(path: Path, server: str = "") -> Path | None:
    """Record that this process answers approvals through `path`; removed at exit."""
    try:
        folder = ensure_dir(run_dir())
        entry = folder / f"{os.getpid()}.json"
        data = {
            "pid": os.getpid(),
            "approval_dir": os.path.abspath(path),
            "server": server,
            "started": time.time(),
        }
        tmp = entry.with_name(entry.name + ".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, entry)
    except OSError as exc:
        from visor.logs import get_logger

        get_logger("visor.run").warning("run_registry_unwritable", error=str(exc))
        return None

    def remove() -> None:
        with contextlib.suppress(OSError):
            entry.unlink()

    atexit.register(remove)
    return entry


def registered_approval_dirs() -> list[Path]:
    """The approval directories of the `visor run` processes alive now."""
    out: list[Path] = []
    try:
        names = sorted(os.listdir(run_dir()))
    except OSError:
        return out
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            data = json.loads((run_dir() / name).read_text(encoding="utf-8"))
            pid = int(data["pid"])
            folder = Path(str(data["approval_dir"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a torn or foreign file: not ours to trust
        if _alive(pid) and folder not in out:
            out.append(folder)
    return out


def approval_dirs(given: str | None) -> list[Path]:
    """Where `visor approve` looks: the directory given, else the default and every registered one."""
    from visor.approval.directory import default_dir

    if given:
        return [Path(given)]
    found: list[Path] = []
    seen: set[str] = set()
    for d in [default_dir(), *registered_approval_dirs()]:
        key = os.path.realpath(d)
        if key not in seen:
            seen.add(key)
            found.append(d)
    return found


# ------------------------------------------------------------------ stderr notices


def _answer_hint(directory: Path | None, approval_id: str | None) -> str:
    from visor.approval.directory import default_dir

    flag = ""
    if directory is not None and os.path.realpath(directory) != os.path.realpath(default_dir()):
        import shlex

        flag = f" --approval-dir {shlex.quote(str(directory))}"
    if approval_id is None:
        return f"list it: visor approve{flag}"
    return f"answer: visor approve{flag} {approval_id}  or  visor deny{flag} {approval_id}"


def _channel_names(broker: Any) -> list[str]:
    names = [str(getattr(c, "name", type(c).__name__)) for c in getattr(broker, "channels", ()) or ()]
    if getattr(broker, "elicitation", False):
        names.append("client elicitation")
    return names


def announce(gate: Any, event: dict[str, Any], log: Any) -> None:
    """One line on stderr for a deny or an ask record (never raises)."""
    try:
        kind = event.get("event")
        common = {
            "server": event.get("server") or "-",
            # The model names the tool: a megabyte of name is a megabyte of the client's log per call.
            "tool": _short(event.get("tool") or event.get("method")),
            "rule": event.get("rule"),
            "reason": _short(event.get("reason")),
        }
        if kind == "deny":
            log.info("deny", **common)
            return
        if kind != "ask":
            return
        broker = getattr(gate, "approvals", None)
        directory = next(
            (c for c in getattr(broker, "channels", ()) or () if getattr(c, "name", "") == "directory"), None
        )
        if directory is None:
            log.info("ask", **common, waiting_on=", ".join(_channel_names(broker)) or "no channel")
            return
        session = getattr(getattr(gate, "audit", None), "session", None)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            log.info("ask", **common, answer=_answer_hint(directory.path, None))
            return
        task = loop.create_task(_announce_pending(log, common, directory.path, session, event.get("id")))
        _TASKS.add(task)
        task.add_done_callback(_TASKS.discard)
    except Exception:  # a notice must never break a decision
        return


_TASKS: set[asyncio.Task[None]] = set()


def _short(text: object, limit: int = 160) -> object:
    if isinstance(text, str) and len(text) > limit:
        return text[: limit - 1] + "…"
    return text


async def _announce_pending(
    log: Any, common: dict[str, Any], path: Path, session: Any, request_id: Any
) -> None:
    """The ask line, once the approval directory holds this call's pending file (its id is in it)."""
    from visor.approval.directory import list_pending

    approval_id = None
    # The pending file is written by the approval channel a few loop turns
    # after the ask record; the question stays open for its timeout anyway.
    for attempt in range(200):
        for p in list_pending(path):
            rec = p.record
            if rec.get("session") == session and rec.get("request_id") == request_id:
                approval_id = p.id
        if approval_id is not None:
            break
        await asyncio.sleep(0.01 if attempt < 100 else 0.05)
    log.info("ask", **common, answer=_answer_hint(path, approval_id))


# ------------------------------------------------------------------ visor watch

_SHOWN = frozenset({"allow", "deny", "ask", "approve", "decline", "reject"})


def format_event(rec: dict[str, Any]) -> str:
    from visor.audit.show import printable

    ts = str(rec.get("ts", ""))[:19].replace("T", " ")
    parts = [
        ts,
        printable(rec.get("event"), 8).ljust(8),
        printable(rec.get("server") or "-", 20),
        printable(rec.get("tool") or "-", 30),
    ]
    if rec.get("event") != "allow":
        parts.append(printable(rec.get("rule"), 40))
        if rec.get("reason"):
            parts.append(printable(rec.get("reason"), 100))
    if rec.get("approval"):
        parts.append(f"approval {printable(rec.get('approval'), 40)}")
    return "  ".join(p for p in parts if p)


class _Follower:
    """New complete lines of every log in a directory, across rotation and new files."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.files: dict[str, tuple[BinaryIO, int]] = {}  # name -> (handle, inode)
        self.partial: dict[str, bytes] = {}

    def _open(self, name: str) -> None:
        path = self.folder / name
        try:
            fh = open(path, "rb")  # noqa: SIM115 - kept open across polls
        except OSError:
            return
        self.files[name] = (fh, os.fstat(fh.fileno()).st_ino)

    def poll(self) -> list[bytes]:
        out: list[bytes] = []
        try:
            names = sorted(n for n in os.listdir(self.folder) if n.endswith(".jsonl"))
        except OSError:
            names = []
        for name in names:
            if name not in self.files:
                self._open(name)
        for name, (fh, ino) in list(self.files.items()):
            out += self._drain(name, fh)
            try:
                current = os.stat(self.folder / name).st_ino
            except OSError:
                current = None
            if current != ino:  # rotated: the old file was drained, read the new one from its start
                fh.close()
                del self.files[name]
                self.partial.pop(name, None)
                if current is not None:
                    self._open(name)
                    out += self._drain(name, self.files[name][0]) if name in self.files else []
        return out

    def _drain(self, name: str, fh: BinaryIO) -> list[bytes]:
        data = self.partial.pop(name, b"") + fh.read()
        lines = data.split(b"\n")
        if lines[-1]:
            self.partial[name] = lines[-1]
        return [ln for ln in lines[:-1] if ln]

    def close(self) -> None:
        for fh, _ in self.files.values():
            fh.close()


def _decode(line: bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


def watch(
    folder: Path,
    out: TextIO,
    *,
    since: datetime | None,
    follow: bool,
    events: frozenset[str] = _SHOWN,
    interval: float = 0.2,
    on_ready: Callable[[], None] | None = None,
) -> int:
    """`on_ready` is called once the logs' current ends are known: a record written after it is
    shown when following (one written between a "watching" line and that point would be taken
    for history and, without `since`, skipped)."""
    from visor import display

    follower = _Follower(folder)
    shown = 0
    # deny red, ask yellow, allow green: on a colour terminal only (never a pipe, never NO_COLOR)
    colour = display.use_colour(out)

    def emit(lines: list[bytes], history: bool) -> None:
        nonlocal shown
        recs = [r for r in (_decode(ln) for ln in lines) if r is not None and r.get("event") in events]
        if history:
            recs = [r for r in recs if since is None or _after(r, since)]
            recs.sort(key=lambda r: str(r.get("ts", "")))
        for rec in recs:
            event = str(rec.get("event"))
            out.write(display.paint(format_event(rec), display.LEVEL_COLOURS.get(event), colour) + "\n")
            shown += 1
        out.flush()

    try:
        first = follower.poll()
        if on_ready is not None:
            on_ready()
        if since is not None or not follow:
            emit(first, history=True)
        while follow:
            time.sleep(interval)
            emit(follower.poll(), history=False)
    finally:
        follower.close()
    return shown


def _after(rec: dict[str, Any], since: datetime) -> bool:
    try:
        when = datetime.fromisoformat(str(rec.get("ts", "")).replace("Z", "+00:00"))
    except ValueError:
        return False
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when >= since


def cmd_watch(args: argparse.Namespace) -> int:
    from visor.audit.paths import audit_dir
    from visor.audit.reader import parse_time

    since = None
    if args.since:
        try:
            since = parse_time(args.since)
        except ValueError as exc:
            print(
                f"visor watch: bad --since {args.since!r}: {exc} (use 1h, 30m, 2d or a date)", file=sys.stderr
            )
            return 2
    folder = audit_dir()

    def ready() -> None:
        if args.follow:
            print(f"watching {folder} (Ctrl-C to stop)", file=sys.stderr, flush=True)

    events = (
        _SHOWN if not args.verdict else frozenset(v for item in args.verdict for v in item.split(",") if v)
    )
    try:
        watch(folder, sys.stdout, since=since, follow=args.follow, events=events, on_ready=ready)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from visor.cli import add_command

    w = add_command(
        subparsers,
        "watch",
        "follow the decisions of every server live",
        "Print each decision (allow, deny, ask, approve, decline, reject) of every log under "
        "$VISOR_HOME/audit/ as it is written; every value is escaped. Without --since, only new ones.",
        "visor watch --since 1h\n  visor watch --since 1d --no-follow --verdict deny",
    )
    w.add_argument(
        "--since", metavar="WHEN", help="first show the decisions since then: 1h, 30m, 2d or a date"
    )
    w.add_argument("--verdict", metavar="V", action="append", help="only these events, e.g. deny,ask")
    w.add_argument("--no-follow", dest="follow", action="store_false", help="print what is there and stop")
    w.set_defaults(func=cmd_watch)
