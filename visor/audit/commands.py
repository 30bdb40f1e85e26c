"""CLI subcommands `visor audit verify|show|repair|keygen|export` and `visor report`.

Also the `visor run` options of the audit writer's signed checkpoints
(`--signing-key`, `--checkpoint-every`, `--checkpoint-seconds`), registered on
the run parser here so that the audit package owns them.

`register(subparsers)` is called by visor/cli.py; every leaf sets
`func=(args) -> int`.  These commands print to stdout: they are not the proxy.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from visor.audit.paths import audit_dir, chain_files
from visor.display import escape


def _targets(args: argparse.Namespace, legacy: str) -> list[Path]:
    """The chains to read: FILE... (and the old flag), else every log under $VISOR_HOME/audit/."""
    from visor.audit.paths import default_audit_chains

    given = [*(getattr(args, "files", None) or []), *(getattr(args, legacy, None) or [])]
    return [Path(os.path.expanduser(f)) for f in given] if given else default_audit_chains()


def _no_logs(command: str) -> None:
    print(
        f"{command}: no audit logs in {audit_dir()} yet: `visor run` writes one per server "
        f"(<server-name>.jsonl) when a client starts it; or name files: {command} FILE...",
        file=sys.stderr,
    )


def cmd_verify(args: argparse.Namespace) -> int:
    from visor.audit.verify import verify_path

    keys = []
    if args.key:
        from visor.audit.signing import SigningError, load_public_key

        try:
            keys = [load_public_key(k) for k in args.key]
        except SigningError as exc:
            print(f"visor audit verify: {exc}", file=sys.stderr)
            return 2
    targets = _targets(args, "legacy_files")
    if not targets:
        _no_logs("visor audit verify")
        # Asked to vouch for signed evidence and there is none: that is not a pass.
        return 1 if keys else 0
    status = 0
    for target in targets:
        files = chain_files(target)
        if not any(f.exists() for f in files):
            print(escape(f"FAIL {target}: no such file"))
            status = max(status, 2)
            continue
        # A live file deleted next to its rotated files, or a rotated file missing
        # from the middle, fails here by name (verify_path checks the files first).
        report = verify_path(target, head=args.head, keys=keys)
        # The log and its file names are written by whoever the check is meant to catch: a
        # FAIL that quotes them must not carry the bytes that would repaint it as an OK.
        print(escape(report.summary()))
        if not report.ok:
            status = max(status, 1)
    return status


def _ts(rec: Mapping[str, object]) -> str:
    return str(rec.get("ts", ""))


def cmd_show(args: argparse.Namespace) -> int:
    from visor.audit.reader import load, window
    from visor.audit.show import Filter, render

    targets = _targets(args, "legacy_files")
    if not targets:
        _no_logs("visor audit show")
        return 0
    try:
        win = window(args.since, args.until)
    except ValueError as exc:
        print(f"visor audit show: {exc}", file=sys.stderr)
        return 2
    records: list[dict[str, Any]] = []
    malformed = 0
    for target in targets:
        files = chain_files(target)
        loaded = load(files, win)
        if loaded.missing and len(loaded.missing) == len(files):
            if not any(p.exists() for p in loaded.missing):
                print(escape(f"visor audit show: {loaded.missing[0]}: no such file"), file=sys.stderr)
                return 2
            # There, but not readable as a log (a FIFO, no permission): the other logs are still shown.
            why = f"visor audit show: {loaded.missing[0]}: cannot be read (`visor audit verify` says why)"
            print(escape(why), file=sys.stderr)
        records.extend(loaded.records)
        malformed += loaded.malformed
    if len(targets) > 1:
        records.sort(key=_ts)  # one timeline across servers (stable within a log)
    events = frozenset(v for item in args.verdict for v in item.split(",") if v) if args.verdict else None
    keep = Filter(session=args.session, events=events, tool=args.tool, all_events=args.all)
    try:
        shown = render((r for r in records if keep.keep(r)), sys.stdout, as_json=args.json)
        sys.stdout.flush()
    except BrokenPipeError:  # `visor audit show | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if not args.json:
        note = f"{shown} record(s) from {len(targets)} log(s)"
        if malformed:
            note += f"; {malformed} malformed line(s) skipped (run `visor audit verify`)"
        print(note, file=sys.stderr)
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    from visor.audit.signing import SigningError, generate

    try:
        pair = generate(args.out, args.name)
    except SigningError as exc:
        print(f"visor audit keygen: {exc}", file=sys.stderr)
        return 1
    print(f"private key: {pair.private}  (mode 0600: only `visor run --signing-key` reads it)")
    print(f"public key:  {pair.public}")
    print(f"fingerprint: {pair.key_id}")
    print(pair.public_pem, end="")
    print(
        f"Sign with:   visor run --signing-key {pair.private} ...\n"
        f"Verify with: visor audit verify --key {pair.public}\n"
        "Keep a copy of the public key where the agent cannot write (a ticket, a repository, another machine).",
        file=sys.stderr,
    )
    return 0


_OTLP_FROM_ENV = "\0env"


def cmd_export(args: argparse.Namespace) -> int:
    import signal
    import threading
    from collections.abc import Sequence

    from visor.audit.export import CursorError, Item, State, export_once
    from visor.audit.otlp import ExportError, config_from_env, send

    if args.interval <= 0:
        print("visor audit export: --interval must be above 0 seconds", file=sys.stderr)
        return 2
    if args.otlp is not None:
        try:
            config = config_from_env(None if args.otlp == _OTLP_FROM_ENV else args.otlp)
        except ExportError as exc:
            print(escape(f"visor audit export: {exc}"), file=sys.stderr)
            return 2

        def sink(batch: Sequence[Item]) -> None:
            send(config, [(i.record, i.line, i.log) for i in batch])

    else:
        out = sys.stdout.buffer

        def sink(batch: Sequence[Item]) -> None:
            out.write(b"".join(i.line + b"\n" for i in batch))
            out.flush()

    try:
        state = State(Path(os.path.expanduser(args.state)) if args.state else None)
    except (CursorError, OSError) as exc:
        print(f"visor audit export: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    if args.follow:
        # SIGTERM ends a follow after the batch in flight, its position saved.
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    status = 0
    total = 0
    reported: set[str] = set()
    try:
        while True:
            targets = _targets(args, "legacy_files")
            if not targets and not args.follow:
                _no_logs("visor audit export")
                return 0
            try:
                outcome = export_once(targets, state, sink)
            except ExportError as exc:  # it quotes the collector's answer
                print(escape(f"visor audit export: {exc}"), file=sys.stderr)
                return 1
            except BrokenPipeError:  # `visor audit export | head`: that batch is not counted as exported
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return 0
            total += outcome.exported
            for error in outcome.errors:
                if error not in reported:  # once per problem, not once per poll
                    print(escape(f"visor audit export: {error}"), file=sys.stderr)
                    reported.add(error)
                status = 1
            if not args.follow or stop.wait(args.interval):
                break
    except KeyboardInterrupt:
        return 130
    finally:
        state.close()
    if args.otlp is not None or args.state:
        print(f"exported {total} record(s)", file=sys.stderr)
    return status


def cmd_repair(args: argparse.Namespace) -> int:
    from visor.audit.repair import repair
    from visor.audit.writer import AuditError

    try:
        result = repair(Path(args.file), force=args.force)
    except AuditError as exc:
        print(escape(f"visor audit repair: {exc}"), file=sys.stderr)
        return 1
    print(escape(result.message))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from visor.audit.reader import window
    from visor.audit.report import build_report

    try:
        win = window(args.since, args.until)
    except ValueError as exc:
        print(f"visor report: {exc}", file=sys.stderr)
        return 2
    keys = []
    if args.key:
        from visor.audit.signing import SigningError, load_public_key

        try:
            keys = [load_public_key(k) for k in args.key]
        except SigningError as exc:
            print(f"visor report: {exc}", file=sys.stderr)
            return 2
    targets = _targets(args, "legacy_files")
    if not targets:
        _no_logs("visor report")
    text = build_report(
        [],
        logs=targets,
        policy_path=Path(args.policy) if args.policy else None,
        win=win,
        policy_from_log=True,
        keys=keys,
    )
    if args.output in (None, "-"):
        sys.stdout.write(text)
    else:
        from visor.userfiles import ensure_parent

        try:
            ensure_parent(args.output)
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            print(f"visor report: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        print(f"wrote {args.output}")
    return 0


_SINCE_HELP = "from this time on: 30m, 1h, 2d, 1w ago, YYYY-MM-DD, or an ISO date-time (UTC if no offset)"
_UNTIL_HELP = "before this time: 30m, 1h, 2d ago, YYYY-MM-DD (that day included), or an ISO date-time"
_FILES_HELP = "audit logs (default: every log under $VISOR_HOME/audit/, one per server)"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from visor.cli import add_command

    audit = add_command(
        subparsers,
        "audit",
        "verify, show or repair the audit logs",
        "Read the hash-chained audit logs `visor run` writes under $VISOR_HOME/audit/ (one per server).",
        "visor audit verify\n  visor audit show --verdict deny --since 1h\n  visor audit show ~/.visor/audit/time.jsonl",
    )
    actions = audit.add_subparsers(dest="audit_action", metavar="ACTION", required=True)

    verify = add_command(
        actions,
        "verify",
        "check every line, link and sequence number",
        "Check every line, link and sequence number of each log (rotated files included); "
        "exit 1 names the first bad line.",
        "visor audit verify\n  visor audit verify ~/.visor/audit/time.jsonl --head HASH",
    )
    verify.add_argument("files", nargs="*", metavar="FILE", help=_FILES_HELP)
    verify.add_argument("--file", dest="legacy_files", action="append", help=argparse.SUPPRESS)
    verify.add_argument(
        "--head", metavar="HASH", help="a hash recorded earlier that must still be in the chain"
    )
    verify.add_argument(
        "--key",
        metavar="PUB",
        action="append",
        help="public key (.pub from `visor audit keygen`): every checkpoint must be signed by it (or by "
        "another --key) and the log must end signed; prints the last signed position",
    )
    verify.set_defaults(func=cmd_verify)

    keygen = add_command(
        actions,
        "keygen",
        "make an Ed25519 key pair for signed checkpoints",
        "Write a private key (mode 0600, in a 0700 folder) for `visor run --signing-key` and its public "
        "key for `visor audit verify --key`. Never overwrites a key. Needs the 'sign' extra.",
        "visor audit keygen\n  visor audit keygen --out ~/.visor/keys --name laptop",
    )
    keygen.add_argument("--out", metavar="DIR", help="folder for the key pair (default: $VISOR_HOME/keys)")
    keygen.add_argument(
        "--name", metavar="NAME", default="audit-signing", help="file name stem: NAME.key and NAME.pub"
    )
    keygen.set_defaults(func=cmd_keygen)

    export = add_command(
        actions,
        "export",
        "ship records as JSON lines or OTLP logs, resuming where the last run stopped",
        "Send the records of every log, in chain order, as JSON lines on stdout (each line exactly as "
        "stored, hash included) or as OTLP logs over HTTP (JSON encoding). With --state, a rerun sends "
        "only records after the last one delivered, across rotation; a record is never skipped, and "
        "its hash (visor.hash) de-duplicates the batch a crash may send twice.",
        "visor audit export --state ~/.visor/export.state | my-shipper\n"
        "  visor audit export --otlp http://collector:4318 --state ~/.visor/otlp.state --follow",
    )
    export.add_argument("files", nargs="*", metavar="FILE", help=_FILES_HELP)
    export.add_argument(
        "--otlp",
        metavar="URL",
        nargs="?",
        const=_OTLP_FROM_ENV,
        help="send OTLP logs over HTTP to URL (/v1/logs is added to a URL without a path); without URL, "
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT; OTEL_EXPORTER_OTLP_HEADERS, "
        "_TIMEOUT and OTEL_SERVICE_NAME apply",
    )
    export.add_argument(
        "--state", metavar="FILE", help="where the position is kept between runs (default: export everything)"
    )
    export.add_argument("--follow", action="store_true", help="keep sending new records until stopped")
    export.add_argument(
        "--interval", metavar="S", type=float, default=1.0, help="with --follow: seconds between looks"
    )
    export.set_defaults(func=cmd_export)

    show = add_command(
        actions,
        "show",
        "a table of verdicts",
        "Print the verdicts of every log as one table, oldest first; every value is escaped.",
        "visor audit show --verdict deny\n  visor audit show --since 1h --tool send_email",
    )
    show.add_argument("files", nargs="*", metavar="FILE", help=_FILES_HELP)
    show.add_argument("--file", dest="legacy_files", action="append", help=argparse.SUPPRESS)
    show.add_argument("--session", metavar="S", help="session id or its prefix")
    show.add_argument(
        "--verdict", metavar="V", action="append", help="event(s) to show, e.g. deny or allow,ask"
    )
    show.add_argument("--tool", metavar="T")
    show.add_argument("--since", metavar="WHEN", help=_SINCE_HELP)
    show.add_argument("--until", metavar="WHEN", help=_UNTIL_HELP)
    show.add_argument("--all", action="store_true", help="every event, not only verdicts")
    show.add_argument("--json", action="store_true", help="full records as JSON lines (includes arguments)")
    show.set_defaults(func=cmd_show)

    repair = add_command(
        actions,
        "repair",
        "move a torn tail aside and continue the chain",
        "After a crash, move a torn last line aside (kept next to the log) and continue the chain.",
        "visor audit repair ~/.visor/audit/time.jsonl",
    )
    repair.add_argument("file", metavar="FILE")
    repair.add_argument("--force", action="store_true", help="also move lines that look edited, not torn")
    repair.set_defaults(func=cmd_repair)

    report = add_command(
        subparsers,
        "report",
        "write a Markdown review pack",
        "Write one Markdown review pack for a security reviewer across every log: evidence, the "
        "controls the policy applies to each tool, findings, verdicts. Without --policy it describes "
        "the policy the sessions ran under (the embedded default included), when the log names one.",
        "visor report -o review.md\n  visor report ~/.visor/audit/time.jsonl --policy ~/.visor/time.yaml",
    )
    report.add_argument("files", nargs="*", metavar="FILE", help=_FILES_HELP)
    report.add_argument("--audit", dest="legacy_files", action="append", help=argparse.SUPPRESS)
    report.add_argument("--policy", metavar="FILE", help="the policy to describe (default: from the log)")
    report.add_argument("--since", metavar="WHEN", help=_SINCE_HELP)
    report.add_argument("--until", metavar="WHEN", help=_UNTIL_HELP)
    report.add_argument("-o", "--output", metavar="FILE.md", help="output file (default: stdout)")
    report.add_argument(
        "--key",
        metavar="PUB",
        action="append",
        help="public key: the integrity line also checks the signed checkpoints (as audit verify --key)",
    )
    report.set_defaults(func=cmd_report)

    register_run(subparsers)


def register_run(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The options of `visor run` this package owns, alone: what `visor run` builds (start-up time)."""
    run = subparsers.choices.get("run")
    if run is not None:
        _add_run_signing(run)


def _add_run_signing(run: argparse.ArgumentParser) -> None:
    # From the writer, not visor.audit.signing: `visor run` without a key never imports signing.
    from visor.audit.writer import DEFAULT_EVERY, DEFAULT_SECONDS

    group = run.add_argument_group("signed checkpoints (the 'sign' extra)")
    group.add_argument(
        "--signing-key",
        metavar="KEY",
        default=os.environ.get("VISOR_SIGNING_KEY") or None,
        help="sign checkpoint records with this Ed25519 private key (`visor audit keygen`); "
        "default: $VISOR_SIGNING_KEY. Visor refuses to start if it cannot use it",
    )
    group.add_argument(
        "--checkpoint-every",
        metavar="N",
        type=_count,
        default=DEFAULT_EVERY,
        help=f"a checkpoint after every N records (default {DEFAULT_EVERY}; 0: only by time)",
    )
    group.add_argument(
        "--checkpoint-seconds",
        metavar="S",
        type=_seconds,
        default=DEFAULT_SECONDS,
        help=f"a checkpoint S seconds after the first unsigned record (default {DEFAULT_SECONDS:g}; "
        "0: only by count); one more at every rotation and clean exit",
    )


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value <= 86400:
        raise argparse.ArgumentTypeError("must be between 0 and 86400 seconds")
    return value
