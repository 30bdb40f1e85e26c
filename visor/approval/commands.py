"""`visor approve` and `visor deny`: answer the pending requests in an approval directory."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from visor.approval import directory


def _dir(args: argparse.Namespace) -> Path:
    path = Path(args.approval_dir) if args.approval_dir else directory.default_dir()
    # The same rule as `visor run`: an answer written into a directory others
    # can write to proves nothing, so do not write one there.
    directory.check(path)
    return path


def _printable(text: str) -> str:
    # Arguments come from the agent: no terminal control sequences reach the screen.
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _live(path: Path, now: float) -> list[directory.Pending]:
    out = []
    for p in directory.list_pending(path):
        expires = p.record.get("expires")
        if type(expires) in (int, float) and expires < now:
            continue  # its Visor has already denied the call (or is gone)
        out.append(p)
    return out


def _list(path: Path, as_json: bool) -> int:
    now = time.time()
    live = _live(path, now)
    if as_json:
        print(json.dumps([{**p.record, "answered": p.answered} for p in live], ensure_ascii=False))
        return 0
    for p in live:
        rec = p.record
        expires = rec.get("expires")
        state = "answered, waiting for Visor" if p.answered else "pending"
        print(f"{p.id}  {state}")
        print(
            f"  server: {_printable(str(rec.get('server') or '-'))}  tool: {_printable(str(rec.get('tool')))}"
        )
        if rec.get("destination"):
            print(f"  destination: {_printable(str(rec['destination']))} (argument {rec.get('argument')!r})")
        print(f"  why: {_printable(str(rec.get('reason')))} (rule: {_printable(str(rec.get('rule')))})")
        args = json.dumps(rec.get("arguments"), ensure_ascii=False, sort_keys=True)
        if len(args) > 400:
            args = args[:400] + f"... ({len(args)} characters)"
        print(f"  arguments: {_printable(args)}")
        if type(expires) in (int, float):
            print(f"  expires in {max(0, int(expires - now))} s")
        if rec.get("rememberable"):
            print("  (approve with --remember to allow the same again for the rest of that session)")
    if not live:
        print(f"no pending approval requests in {path}")
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    try:
        path = _dir(args)
        if not args.id:
            return _list(path, args.json)
        rec = directory.answer(path, args.id, True, args.remember)
    except (directory.DirectoryError, directory.AnswerError) as exc:
        print(f"visor approve: {exc}", file=sys.stderr)
        return 1
    if args.remember and not rec.get("rememberable"):
        print("note: this request cannot be remembered; only this one call is approved", file=sys.stderr)
    print(f"approved {args.id} ({rec.get('tool')})")
    return 0


def cmd_deny(args: argparse.Namespace) -> int:
    try:
        path = _dir(args)
        directory.answer(path, args.id, False, False)
    except (directory.DirectoryError, directory.AnswerError) as exc:
        print(f"visor deny: {exc}", file=sys.stderr)
        return 1
    print(f"denied {args.id}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    dir_help = "the directory given to `visor run --approval-dir` (default: $VISOR_HOME/approvals)"
    approve = subparsers.add_parser(
        "approve", help="list pending approval requests, or approve one by id", description=None
    )
    approve.add_argument("--approval-dir", metavar="DIR", help=dir_help)
    approve.add_argument(
        "--remember",
        action="store_true",
        help="also approve the same destination (or the exact same call) for the rest of that session",
    )
    approve.add_argument("--json", action="store_true", help="list pending requests as a JSON array")
    approve.add_argument("id", nargs="?", metavar="ID", help="the request to approve; none lists them")
    approve.set_defaults(func=cmd_approve)

    deny = subparsers.add_parser("deny", help="deny one pending approval request")
    deny.add_argument("--approval-dir", metavar="DIR", help=dir_help)
    deny.add_argument("id", metavar="ID")
    deny.set_defaults(func=cmd_deny)
