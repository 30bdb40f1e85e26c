"""The `visor lint` and `visor pins` subcommands. Results go to stdout,
problems to stderr; the CLI calls ``register`` to add them."""

from __future__ import annotations

import argparse
import json
import sys

from visor.pinfile import read_pins, write_pins
from visor.policy.lint import findings_json, lint_file


def register(subparsers: argparse._SubParsersAction) -> None:
    lint = subparsers.add_parser(
        "lint", help="check a policy file: errors, then what loads but is probably wrong"
    )
    lint.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    lint.add_argument("--json", action="store_true", help="print findings as JSON")
    lint.add_argument("file", help="the policy YAML file")
    lint.set_defaults(func=run_lint)

    pins = subparsers.add_parser("pins", help="show or reset the tool pins saved in a pin file")
    pins.add_argument("--pin-file", required=True, help="the JSON pin file written by `visor run --pin-file`")
    pins.add_argument(
        "--reset", nargs="?", const="", default=None, metavar="TOOL", help="forget every pin, or only TOOL's"
    )
    pins.set_defaults(func=run_pins)


def run_lint(args: argparse.Namespace) -> int:
    _policy, findings = lint_file(args.file)
    errors = [f for f in findings if f.level == "error"]
    warnings = [f for f in findings if f.level == "warning"]
    if args.json:
        print(json.dumps(findings_json(args.file, findings), indent=2))
    else:
        for f in findings:
            print(f.render(args.file))
        if not findings:
            print(f"{args.file}: ok")
    if errors or (args.strict and warnings):
        return 1
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
    tools: dict = data["tools"]
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
