"""The `visor init`, `visor policy` (scaffold, lint, import) and `visor doctor` subcommands."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from visor.cli import add_command

    init = add_command(
        subparsers,
        "init",
        "wrap the servers of an MCP client config in `visor run` (or undo it)",
        "Rewrite the stdio servers of an MCP client config to start through `visor run`. "
        "The original entry is kept under x-visor-upstream, so --undo restores it exactly. "
        "Run it again with --policy, --approval-dir or --absolute to change servers it wrapped before. "
        "An entry mcp-bouncer or mcp-visor wrapped is taken out of their wrapper and the server inside "
        "is wrapped (--undo gives their entry back). "
        "Each server keeps its tool pins in $VISOR_HOME/pins/NAME.json. Shows a diff and asks before "
        "writing; keeps a timestamped backup in $VISOR_HOME/backups/.",
        "visor init --config .mcp.json\n  visor init --config .mcp.json --server time --policy ~/.visor/time.yaml\n"
        "  visor init --config .mcp.json --undo",
    )
    init.add_argument("--config", metavar="FILE", help="the client config (.mcp.json, mcp.json, ...)")
    init.add_argument(
        "--server", metavar="NAME", action="append", help="only this server (repeatable; default: all)"
    )
    init.add_argument(
        "--policy", metavar="FILE", help="policy for the wrapped servers (written as an absolute path)"
    )
    init.add_argument("--yes", "-y", action="store_true", help="write without asking")
    init.add_argument("--undo", action="store_true", help="restore the entries from x-visor-upstream")
    init.add_argument(
        "--absolute",
        action="store_true",
        help="write the absolute path of the visor executable (desktop apps may not see your shell's PATH)",
    )
    init.add_argument(
        "--approval-dir",
        metavar="DIR",
        help="ask for approvals through pending files in DIR (answer with `visor approve`)",
    )
    init.add_argument(
        "--signing-key",
        metavar="FILE",
        help="sign each wrapped server's audit log with this Ed25519 private key "
        "(`visor audit keygen`; written as an absolute path)",
    )
    init.add_argument(
        "--no-pin-file",
        action="store_true",
        help="do not keep tool pins across restarts (default: $VISOR_HOME/pins/NAME.json per server)",
    )
    init.add_argument("--dry-run", action="store_true", help="show the change, write nothing")
    init.add_argument(
        "--list", action="store_true", help="find the usual client configs and list their servers"
    )
    init.set_defaults(func=_init)

    policy = add_command(
        subparsers,
        "policy",
        "policy helpers: scaffold, lint, import",
        "Helpers for writing a policy: scaffold one from a live server, lint one, import one "
        "written for mcp-bouncer or mcp-visor.",
        "visor policy scaffold --server-name time -o ~/.visor/time.yaml -- uvx mcp-server-time",
    )
    actions = policy.add_subparsers(dest="policy_action", metavar="ACTION")
    scaffold = add_command(
        actions,
        "scaffold",
        "start a server, list its tools, write a default-deny policy that allows them",
        "Start COMMAND as an MCP server, read its tools/list and write an explicit default-deny "
        "policy that allows each listed tool, with what Visor knows about it (sending, writing).",
        "visor policy scaffold --server-name time -o ~/.visor/time.yaml -- uvx mcp-server-time",
        usage="visor policy scaffold [OPTIONS] -- COMMAND [ARGS...]",
    )
    scaffold.add_argument(
        "--server-name", metavar="NAME", help="server name in the policy (default: guessed from COMMAND)"
    )
    scaffold.add_argument("-o", "--output", metavar="FILE", help="write the policy here (default: stdout)")
    scaffold.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    scaffold.add_argument(
        "--write-root",
        metavar="DIR",
        help="confine writing tools to DIR (default: the current directory)",
    )
    scaffold.add_argument(
        "--timeout", type=float, default=60.0, metavar="SECONDS", help="per request (default 60)"
    )
    scaffold.add_argument("command", nargs=argparse.REMAINDER, help="the server command, after --")
    scaffold.set_defaults(func=_scaffold)
    from visor.migrate.commands import add_import
    from visor.policy.commands import add_lint

    add_lint(actions, "lint", "visor policy lint")
    add_import(actions)
    policy.set_defaults(func=lambda args: _usage(policy))

    doctor = add_command(
        subparsers,
        "doctor",
        "check that wrapped servers start, logs verify, policies lint",
        "For each client config: every wrapped server starts through Visor and lists its tools, "
        "its policy lints, its audit log verifies, and the client can find `visor`.",
        "visor doctor\n  visor doctor --config .mcp.json --no-start\n  visor doctor --json",
    )
    doctor.add_argument(
        "--config",
        metavar="FILE",
        action="append",
        help="check this client config (repeatable; default: the usual locations)",
    )
    doctor.add_argument(
        "--timeout", type=float, default=30.0, metavar="SECONDS", help="per server start (default 30)"
    )
    doctor.add_argument("--no-start", action="store_true", help="do not start the wrapped servers")
    doctor.add_argument(
        "--json", action="store_true", help="print the checks as one JSON document (docs/clients.md)"
    )
    doctor.add_argument(
        "--progress",
        action="store_true",
        help="say on stderr what is being checked (the default on a terminal)",
    )
    doctor.set_defaults(func=_doctor)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _init(args: argparse.Namespace) -> int:
    from visor.install.init import run_init

    return run_init(args)


def _scaffold(args: argparse.Namespace) -> int:
    from visor.install.scaffold import run_scaffold

    return run_scaffold(args)


def _doctor(args: argparse.Namespace) -> int:
    from visor.install.doctor import run_doctor

    return run_doctor(args)
