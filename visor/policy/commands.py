"""The `visor lint` (also `visor policy lint`), `visor pins` and `visor attest` subcommands. Results go to stdout,
problems to stderr; the CLI calls ``register`` to add them."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from visor.pinfile import read_pins, write_pins
from visor.policy.lint import findings_json, lint_file


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from visor.cli import add_command

    add_lint(subparsers, "lint", "visor lint")

    pins = add_command(
        subparsers,
        "pins",
        "show or reset the tool pins saved in a pin file",
        "Show the tool pins `visor run --pin-file` keeps, or forget them after a server update you trust.",
        "visor pins --pin-file ~/.visor/pins/time.json --reset get_current_time",
    )
    pins.add_argument("--pin-file", required=True, help="the JSON pin file written by `visor run --pin-file`")
    pins.add_argument(
        "--reset", nargs="?", const="", default=None, metavar="TOOL", help="forget every pin, or only TOOL's"
    )
    pins.set_defaults(func=run_pins)

    add_attest(subparsers, "attest", "visor attest")


def add_lint(subparsers: argparse._SubParsersAction[argparse.ArgumentParser], name: str, prog: str) -> None:
    """The lint command (`visor lint`, and `visor policy lint` in the policy group)."""
    from visor.cli import add_command

    lint = add_command(
        subparsers,
        name,
        "check a policy file: errors, then what loads but is probably wrong",
        "Check a policy: errors (file, line and key) first, then what loads but is probably wrong. "
        "--no-warnings and --no-info take mcp-visor's lint options: they hide findings, never errors.",
        f"{prog} ~/.visor/time.yaml\n  {prog} --no-warnings policy.yaml",
    )
    lint.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    lint.add_argument("--json", action="store_true", help="print findings as JSON")
    lint.add_argument(
        "--no-warnings", action="store_true", help="show errors only (not with --strict, as in mcp-visor)"
    )
    lint.add_argument(
        "--no-info",
        action="store_true",
        help="hide informational findings (as in mcp-visor; Visor's lint has none today, so this changes nothing)",
    )
    lint.add_argument("file", help="the policy YAML file")
    lint.set_defaults(func=run_lint, lint_prog=prog)


def add_attest(subparsers: argparse._SubParsersAction[argparse.ArgumentParser], name: str, prog: str) -> None:
    """The attest command (`visor attest`); another group can add it under its own name."""
    from visor.cli import add_command

    attest = add_command(
        subparsers,
        name,
        "print the attestation digest (stdio_invocation_sha256_v1) of a server command, to pin in a policy",
        "Measure COMMAND ARGS exactly as `visor run -- COMMAND ARGS` measures it at "
        "start-up (run it from the same directory, with the same PATH) and print the attestation "
        "block for the server's policy entry.",
        f"{prog} -- /usr/local/bin/my-server --stdio",
        usage=f"{prog} [--entry-arg-position N]... -- COMMAND [ARGS...]",
    )
    attest.add_argument(
        "--entry-arg-position",
        metavar="N",
        type=int,
        action="append",
        default=[],
        help="bind the content of the file named by argument N (0 = the first argument after "
        "COMMAND); repeatable",
    )
    attest.add_argument("command", nargs=argparse.REMAINDER, help="the server command, after --")
    attest.set_defaults(func=run_attest)


def run_lint(args: argparse.Namespace) -> int:
    prog = getattr(args, "lint_prog", "visor lint")
    if args.strict and args.no_warnings:
        # --strict fails on warnings that --no-warnings would hide: which one is meant is unclear
        print(f"{prog}: --strict and --no-warnings contradict each other; give one", file=sys.stderr)
        return 2
    _policy, findings = lint_file(args.file)
    if _policy is None:
        from visor.migrate.detect import bouncer_hint

        hint = bouncer_hint(args.file)
        if hint is not None:
            print(f"{prog}: {hint}", file=sys.stderr)
    errors = [f for f in findings if f.level == "error"]
    warnings = [f for f in findings if f.level == "warning"]
    if args.no_warnings:
        findings = errors
    if args.json:
        print(json.dumps(findings_json(args.file, findings), indent=2))
    else:
        from visor.display import colour_level

        for f in findings:
            print(colour_level(f.render(args.file), f.level))
        if not findings:
            hidden = f" ({len(warnings)} warning(s) hidden by --no-warnings)" if warnings else ""
            print(f"{args.file}: ok{hidden}")
    if errors or (args.strict and warnings):
        return 1
    return 0


def run_attest(args: argparse.Namespace) -> int:
    from visor.policy.attestation import KIND
    from visor.run import measure_invocation

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("visor attest: no command given; usage: visor attest -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    positions = sorted(set(args.entry_arg_position))
    if any(p < 0 for p in positions):
        print("visor attest: --entry-arg-position must be >= 0", file=sys.stderr)
        return 2
    digest, why = measure_invocation(command, tuple(positions))
    if digest is None:
        print(f"visor attest: cannot measure {command[0]!r}: {why}", file=sys.stderr)
        return 1
    print("attestation:")
    print(f'  kind: "{KIND}"')
    print(f'  digest: "{digest}"')
    if positions:
        print(f"  entry_arg_positions: [{', '.join(str(p) for p in positions)}]")
    return 0


def run_pins(args: argparse.Namespace) -> int:
    try:
        data = read_pins(args.pin_file)
    except FileNotFoundError:
        print(f"visor pins: {args.pin_file}: no such pin file", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"visor pins: {args.pin_file}: {e}", file=sys.stderr)
        return 1
    tools: dict[str, Any] = data["tools"]
    if args.reset is None:
        print(json.dumps(data, indent=2, sort_keys=True))
        return 0
    if args.reset == "":
        count = len(tools)
        tools.clear()
        data.pop("server_info", None)
        message = f"reset {count} pins"
    else:
        if args.reset not in tools:
            print(f"visor pins: no pin for tool {args.reset!r}", file=sys.stderr)
            return 1
        del tools[args.reset]
        message = f"reset the pin of {args.reset!r}"
    try:
        write_pins(args.pin_file, data)
    except OSError as e:
        print(f"visor pins: cannot write {args.pin_file}: {e}", file=sys.stderr)
        return 1
    print(message)
    return 0
