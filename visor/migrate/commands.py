"""`visor policy import`: convert a seed project's policy file into a Visor policy."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from visor.migrate.result import Imported, MigrationError

FORMATS = ("bouncer", "mcp-visor")


def add_import(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from visor.cli import add_command

    imp = add_command(
        actions,
        "import",
        "convert an mcp-bouncer policy, or check and normalise an mcp-visor one",
        "Convert a policy written for mcp-bouncer (tool names at the top level) into a Visor policy, "
        "or check an mcp-visor policy and drop the keys mcp-visor ignores. What cannot be carried over "
        "is named on stderr, and never made broader than the original: a trusted destination Visor "
        "would read more widely is left out (a human is asked), a tool whose path prefix cannot be "
        "placed is denied. The result loads and lints; see docs/migration.md.",
        "visor policy import --from bouncer bouncer.yaml -o ~/.visor/policy.yaml\n"
        "  visor policy import --from mcp-visor policy.yaml -o ~/.visor/policy.yaml",
    )
    imp.add_argument(
        "--from", dest="source_format", required=True, choices=FORMATS, help="the input's format"
    )
    imp.add_argument("file", metavar="FILE", help="the policy file to convert")
    imp.add_argument("-o", "--output", metavar="OUT", help="write the Visor policy here (default: stdout)")
    imp.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    imp.add_argument(
        "--server-name",
        metavar="NAME",
        default="*",
        help="bouncer: the server entry's name (default '*': whatever server runs with it)",
    )
    imp.add_argument(
        "--base-dir",
        metavar="DIR",
        help="bouncer: resolve relative allowed_path_prefixes against DIR (the directory the client "
        "started bouncer in); without it such a tool is denied",
    )
    imp.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 if anything was left out or narrowed (the file is still written)",
    )
    imp.set_defaults(func=run_import)


def _convert(args: argparse.Namespace, text: str) -> Imported:
    if args.source_format == "bouncer":
        from visor.migrate.bouncer import convert

        return convert(text, args.file, server_name=args.server_name, base_dir=args.base_dir)
    from visor.migrate.mcp_visor import normalise

    return normalise(text, args.file)


def _write(path: str, text: str, force: bool) -> None:
    from visor.userfiles import ensure_parent

    target = Path(os.path.expanduser(path))
    ensure_parent(target)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    fd = os.open(target, flags, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def run_import(args: argparse.Namespace) -> int:
    from visor.policy.lint import lint_policy
    from visor.policy.loader import PolicyError, load_policy_text

    prog = "visor policy import"
    try:
        data = Path(args.file).read_bytes()
    except OSError as e:
        print(f"{prog}: {args.file}: cannot read: {e.strerror or e}", file=sys.stderr)
        return 1
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        print(f"{prog}: {args.file}: not UTF-8 (byte {e.start})", file=sys.stderr)
        return 1
    try:
        result = _convert(args, text)
    except MigrationError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    # The promise is a policy that loads: checked here, not assumed.
    try:
        policy = load_policy_text(result.text, args.output or "<import>")
    except PolicyError as e:
        print(f"{prog}: the converted policy does not load ({e}); nothing written", file=sys.stderr)
        return 1
    errors = [f for f in lint_policy(policy) if f.level == "error"]
    if errors:
        print(
            f"{prog}: the converted policy does not lint: {errors[0].message}; nothing written",
            file=sys.stderr,
        )
        return 1
    for note in result.notes:
        print(f"{prog}: {note.render(args.file)}", file=sys.stderr)
    if args.output:
        try:
            _write(args.output, result.text, args.force)
        except FileExistsError:
            print(f"{prog}: {args.output} exists; give --force to overwrite it", file=sys.stderr)
            return 1
        except OSError as e:
            print(f"{prog}: cannot write {args.output}: {e.strerror or e}", file=sys.stderr)
            return 1
        left = sum(1 for n in result.notes if n.narrowed)
        print(
            f"{prog}: wrote {args.output} ({len(result.notes)} note(s), {left} narrowed); "
            f"check it with `visor policy lint {args.output}`",
            file=sys.stderr,
        )
    else:
        sys.stdout.write(result.text)
    return 1 if args.strict and result.notes else 0
