"""`visor approve` and `visor deny`: answer the pending requests in an approval directory."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from visor import display
from visor.approval import directory, model

#: Fewest hex digits of an approval id `visor approve`/`deny` resolve as a prefix.
MIN_PREFIX = 6


def _printable(value: object) -> str:
    # Arguments come from the agent: no terminal control sequence reaches the screen.
    return display.escape_value(value)


def _focus(rec: Mapping[str, object]) -> list[str]:
    focus = rec.get("focus")
    return [f for f in focus if type(f) is str] if type(focus) is list else []


def _live(path: Path, now: float) -> list[directory.Pending]:
    out = []
    for p in directory.list_pending(path):
        expires = model.expiry(p.record)
        if expires is not None and expires < now:
            continue  # its Visor has already denied the call (or is gone)
        out.append(p)
    return out


def _header(rec: Mapping[str, object]) -> None:
    print(f"  server: {_printable(rec.get('server') or '-')}  tool: {_printable(rec.get('tool'))}")
    if rec.get("destination"):
        print(
            f"  destination: {_printable(rec['destination'])} (argument {display.json_text(rec.get('argument'))})"
        )
    elif rec.get("argument"):
        print(f"  argument in question: {display.json_text(rec.get('argument'))}")
    print(f"  why: {_printable(rec.get('reason'))} (rule: {_printable(rec.get('rule'))})")


def _show(path: Path, approval_id: str, as_json: bool) -> int:
    """Everything one pending request holds: every argument, whole, escaped."""
    if not model.valid_id(approval_id):
        raise directory.AnswerError(f"{approval_id!r} is not an approval id (32 hex digits)")
    found = next((p for p in _live(path, time.time()) if p.id == approval_id), None)
    if found is None:
        raise directory.AnswerError(
            f"no pending request {approval_id} in {path} (answered, withdrawn or expired)"
        )
    rec = found.record
    if as_json:
        # ASCII-escaped: no raw control character reaches the terminal.
        print(json.dumps({**rec, "answered": found.answered}, ensure_ascii=True, sort_keys=True))
        return 0
    print(f"{found.id}  {'answered, waiting for Visor' if found.answered else 'pending'}")
    _header(rec)
    print(
        f"  request id: {display.json_text(rec.get('request_id'))}  session: {_printable(rec.get('session'))}"
    )
    print(f"  call hash: {_printable(rec.get('call_hash'))}")
    lines, _ = model.render_arguments(rec.get("arguments"), _focus(rec), full=True)
    print("  arguments, in full (JSON strings; control characters shown as escapes):")
    for line in lines or ["  (none)"]:
        print(f"  {line}")
    return 0


def _list(path: Path, as_json: bool) -> int:
    now = time.time()
    live = _live(path, now)
    if as_json:
        # ASCII-escaped: no raw control character reaches the terminal.
        print(json.dumps([{**p.record, "answered": p.answered} for p in live], ensure_ascii=True))
        return 0
    for p in live:
        rec = p.record
        expires = model.expiry(rec)
        state = "answered, waiting for Visor" if p.answered else "pending"
        print(f"{p.id}  {state}")
        _header(rec)
        lines, hidden = model.render_arguments(rec.get("arguments"), _focus(rec))
        print("  arguments (the ones the policy checks first):" if _focus(rec) else "  arguments:")
        for line in lines:
            print(f"  {line}")
        if hidden:
            print(f"  NOT SHOWN: {hidden} characters hidden; see everything: visor approve --show {p.id}")
        if expires is not None:
            print(f"  expires in {max(0, int(expires - now))} s")
        if rec.get("rememberable"):
            if rec.get("destination"):
                print(
                    "  (a yes places this destination for the rest of that session; "
                    "--remember keeps it across restarts too)"
                )
            else:
                print("  (approve with --remember to allow the exact same call again in that session)")
    if not live:
        print(f"no pending approval requests in {path}")
    return 0


def _dirs(args: argparse.Namespace) -> list[Path]:
    """The directory given, else the default one and every one a running `visor run` uses."""
    from visor.watch import approval_dirs

    return approval_dirs(args.approval_dir)


def _resolve(args: argparse.Namespace, prefix: str) -> tuple[Path, str]:
    """The directory and full id of the one pending request whose id starts with `prefix`."""
    if not prefix or any(c not in "0123456789abcdef" for c in prefix.lower()):
        raise directory.AnswerError(f"{prefix!r} is not an approval id (hex digits, or a unique prefix)")
    prefix = prefix.lower()
    dirs = _dirs(args)
    matches: list[tuple[Path, str]] = []
    for d in dirs:
        if not d.is_dir():
            continue
        matches += [(d, p.id) for p in _live(d, time.time()) if p.id.startswith(prefix)]
    if matches and len(prefix) < MIN_PREFIX:
        # A prefix is resolved among the requests pending when this runs, not the ones the
        # human looked at: a request created since (the client cancels the one shown and
        # cycles others) could take a short one. 24 bits leave it no practical chance.
        raise directory.AnswerError(
            f"{prefix!r} is too short: give at least {MIN_PREFIX} hex digits of the approval id"
        )
    if len(matches) == 1:
        path, full = matches[0]
        directory.check(path)
        return path, full
    if not matches:
        where = ", ".join(str(d) for d in dirs)
        raise directory.AnswerError(
            f"no pending request {prefix} in {where} (answered, withdrawn or expired); "
            "`visor approve` lists the pending ones"
        )
    ids = ", ".join(i for _, i in matches)
    raise directory.AnswerError(f"{prefix!r} matches {len(matches)} requests ({ids}); give more digits")


def cmd_approve(args: argparse.Namespace) -> int:
    try:
        if args.show:
            if not args.id:
                raise directory.AnswerError("--show needs the ID of a pending request")
            path, full = _resolve(args, args.id)
            return _show(path, full, args.json)
        if not args.id:
            return _list_all(args)
        path, full = _resolve(args, args.id)
        rec = directory.answer(path, full, True, args.remember)
    except (directory.DirectoryError, directory.AnswerError) as exc:
        print(f"visor approve: {exc}", file=sys.stderr)
        return 1
    if args.remember and not rec.get("rememberable"):
        print("note: this request cannot be remembered; only this one call is approved", file=sys.stderr)
    print(f"approved {full} ({_printable(rec.get('tool'))})")
    return 0


def _list_all(args: argparse.Namespace) -> int:
    dirs = [d for d in _dirs(args) if d.is_dir() or args.approval_dir]
    if not dirs:
        print(
            f"no pending approval requests (no approval directory in use; default {directory.default_dir()})"
        )
        return 0
    if args.json and len(dirs) > 1:
        now = time.time()
        live = []
        for d in dirs:
            directory.check(d)
            live += [{**p.record, "answered": p.answered, "approval_dir": str(d)} for p in _live(d, now)]
        print(json.dumps(live, ensure_ascii=True))
        return 0
    for d in dirs:
        directory.check(d)
        if len(dirs) > 1:
            print(f"# {d}")
        _list(d, args.json)
    return 0


def cmd_deny(args: argparse.Namespace) -> int:
    try:
        path, full = _resolve(args, args.id)
        directory.answer(path, full, False, False)
    except (directory.DirectoryError, directory.AnswerError) as exc:
        print(f"visor deny: {exc}", file=sys.stderr)
        return 1
    print(f"denied {full}")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from visor.cli import add_command

    dir_help = (
        "the directory given to `visor run --approval-dir` (default: $VISOR_HOME/approvals and "
        "every directory a running `visor run` uses)"
    )
    approve = add_command(
        subparsers,
        "approve",
        "list pending approval requests, or approve one by id",
        "Without ID, list the calls waiting for a human in every approval directory in use. "
        "With ID (or a unique prefix of it, at least 6 digits), approve that call.",
        "visor approve\n  visor approve 3f9a1c",
    )
    # -approval-dir: mcp-visor's spelling (Go flags), so its users' scripts keep working
    approve.add_argument("--approval-dir", "-approval-dir", metavar="DIR", help=dir_help)
    approve.add_argument(
        "--remember",
        action="store_true",
        help="a destination: keep it approved across restarts too (any yes places it for the session); "
        "an approval_required call: allow the exact same call again in that session",
    )
    approve.add_argument(
        "--show",
        action="store_true",
        help="print one pending request in full (every argument, control characters escaped); answers nothing",
    )
    approve.add_argument(
        "--json", action="store_true", help="list pending requests (or --show one) as JSON, ASCII-escaped"
    )
    approve.add_argument(
        "id",
        nargs="?",
        metavar="ID",
        help="the request (or a unique prefix of its id, at least 6 digits) to approve; none lists them",
    )
    approve.set_defaults(func=cmd_approve)

    deny = add_command(
        subparsers,
        "deny",
        "deny one pending approval request",
        "Deny the waiting call with this ID (or a unique prefix of it, at least 6 digits); "
        "Visor answers the client with an error.",
        "visor deny 3f9a1c",
    )
    deny.add_argument("--approval-dir", "-approval-dir", metavar="DIR", help=dir_help)
    deny.add_argument("id", metavar="ID")
    deny.set_defaults(func=cmd_deny)
