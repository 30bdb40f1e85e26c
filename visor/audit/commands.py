"""CLI subcommands `visor audit verify|show|repair` and `visor report`.

`register(subparsers)` is called by visor/cli.py; every leaf sets
`func=(args) -> int`.  These commands print to stdout: they are not the proxy.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from visor.audit.paths import chain_files, default_audit_path


def _audit_path(value: str | None) -> Path:
    return Path(value) if value else default_audit_path()


def cmd_verify(args: argparse.Namespace) -> int:
    from visor.audit.paths import default_audit_chains
    from visor.audit.verify import verify_path

    targets = [Path(f) for f in args.files] or default_audit_chains() or [default_audit_path()]
    status = 0
    for target in targets:
        files = chain_files(target)
        if not any(f.exists() for f in files):
            print(f"FAIL {target}: no such file")
            status = max(status, 2)
            continue
        # A live file deleted next to its rotated files, or a rotated file missing
        # from the middle, fails here by name (verify_path checks the files first).
        report = verify_path(target, head=args.head)
        print(report.summary())
        if not report.ok:
            status = max(status, 1)
    return status


def cmd_show(args: argparse.Namespace) -> int:
    from visor.audit.reader import load, window
    from visor.audit.show import Filter, render

    files = chain_files(_audit_path(args.file))
    try:
        win = window(args.since, args.until)
    except ValueError as exc:
        print(f"visor audit show: bad --since/--until: {exc}", file=sys.stderr)
        return 2
    loaded = load(files, win)
    if loaded.missing and len(loaded.missing) == len(files):
        print(f"visor audit show: {loaded.missing[0]}: no such file", file=sys.stderr)
        return 2
    events = frozenset(v for item in args.verdict for v in item.split(",") if v) if args.verdict else None
    keep = Filter(session=args.session, events=events, tool=args.tool, all_events=args.all)
    try:
        shown = render((r for r in loaded.records if keep.keep(r)), sys.stdout, as_json=args.json)
        sys.stdout.flush()
    except BrokenPipeError:  # `visor audit show | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if not args.json:
        note = f"{shown} record(s)"
        if loaded.malformed:
            note += f"; {loaded.malformed} malformed line(s) skipped (run `visor audit verify`)"
        print(note, file=sys.stderr)
    return 0


def cmd_repair(args: argparse.Namespace) -> int:
    from visor.audit.repair import repair
    from visor.audit.writer import AuditError

    try:
        result = repair(Path(args.file), force=args.force)
    except AuditError as exc:
        print(f"visor audit repair: {exc}", file=sys.stderr)
        return 1
    print(result.message)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from visor.audit.reader import window
    from visor.audit.report import build_report

    try:
        win = window(args.since, args.until)
    except ValueError as exc:
        print(f"visor report: bad --since/--until: {exc}", file=sys.stderr)
        return 2
    files = chain_files(_audit_path(args.audit))
    text = build_report(files, policy_path=Path(args.policy) if args.policy else None, win=win)
    if args.output in (None, "-"):
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    audit = subparsers.add_parser("audit", help="verify, show or repair the audit log")
    actions = audit.add_subparsers(dest="audit_action", metavar="ACTION", required=True)

    verify = actions.add_parser("verify", help="check every line, link and sequence number")
    verify.add_argument(
        "files", nargs="*", metavar="FILE", help="log files (default: $VISOR_HOME/audit.jsonl)"
    )
    verify.add_argument(
        "--head", metavar="HASH", help="a hash recorded earlier that must still be in the chain"
    )
    verify.set_defaults(func=cmd_verify)

    show = actions.add_parser("show", help="a table of verdicts")
    show.add_argument("--file", metavar="FILE", help="log file (default: $VISOR_HOME/audit.jsonl)")
    show.add_argument("--session", metavar="S", help="session id or its prefix")
    show.add_argument(
        "--verdict", metavar="V", action="append", help="event(s) to show, e.g. deny or allow,ask"
    )
    show.add_argument("--tool", metavar="T")
    show.add_argument("--since", metavar="WHEN", help="YYYY-MM-DD or ISO date-time (UTC if no offset)")
    show.add_argument("--until", metavar="WHEN", help="YYYY-MM-DD (inclusive) or ISO date-time")
    show.add_argument("--all", action="store_true", help="every event, not only verdicts")
    show.add_argument("--json", action="store_true", help="full records as JSON lines (includes arguments)")
    show.set_defaults(func=cmd_show)

    repair = actions.add_parser("repair", help="move a torn tail aside and continue the chain")
    repair.add_argument("file", metavar="FILE")
    repair.add_argument("--force", action="store_true", help="also move lines that look edited, not torn")
    repair.set_defaults(func=cmd_repair)

    report = subparsers.add_parser("report", help="write a Markdown review pack")
    report.add_argument("--audit", metavar="FILE", help="log file (default: $VISOR_HOME/audit.jsonl)")
    report.add_argument("--policy", metavar="FILE")
    report.add_argument("--since", metavar="WHEN")
    report.add_argument("--until", metavar="WHEN")
    report.add_argument("-o", "--output", metavar="FILE.md", help="output file (default: stdout)")
    report.set_defaults(func=cmd_report)
