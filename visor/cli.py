"""Command-line entry point: parse arguments, call one function per subcommand."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from visor import __version__
from visor.wire.framer import DEFAULT_MAX_MESSAGE_BYTES


class _HelpToStderr(argparse.Action):
    """-h/--help for `visor run`, which owns stdout for the protocol: its help goes to stderr."""

    def __init__(
        self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: object
    ) -> None:
        super().__init__(
            option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="show this help message and exit"
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[object] | None,
        option_string: str | None = None,
    ) -> None:
        parser.print_help(sys.stderr)
        parser.exit()


def add_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help: str,
    description: str,
    example: str,
    *,
    usage: str | None = None,
    help_to_stderr: bool = False,
) -> argparse.ArgumentParser:
    """A subcommand with a one-line help, a description and an example in its --help."""
    parser = subparsers.add_parser(
        name,
        help=help,
        description=description,
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage=usage,
        add_help=not help_to_stderr,
    )
    if help_to_stderr:
        parser.add_argument("-h", "--help", action=_HelpToStderr)
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = add_command(
        sub,
        "run",
        "run an MCP server behind Visor (stdio)",
        "Start COMMAND as an MCP server and relay its stdio through Visor's checks. Stdout is the "
        "protocol wire: help, logs and one line per denied call or approval question go to stderr.",
        "visor run --server-name time --pin-file ~/.visor/pins/time.json -- uvx mcp-server-time",
        usage="visor run [OPTIONS] -- COMMAND [ARGS...]",
        help_to_stderr=True,
    )
    run.add_argument("--policy", metavar="FILE", help="policy YAML (default: the embedded default policy)")
    run.add_argument(
        "--watch-policy", action="store_true",
        help="reload the --policy file when it changes (checked every second), as SIGHUP does",
    )  # fmt: skip
    run.add_argument(
        "--audit-log",
        metavar="FILE",
        help="audit log (default: $VISOR_HOME/audit/SERVER.jsonl, one per server)",
    )
    run.add_argument("--server-name", metavar="NAME", default="", help="server name the policy refers to")
    run.add_argument(
        "--max-message-bytes",
        metavar="N",
        type=_positive_int,
        default=DEFAULT_MAX_MESSAGE_BYTES,
        help="largest message accepted in either direction (default 16 MiB)",
    )
    run.add_argument(
        "--identity", metavar="NAME", help="the agent identity the policy's identities section applies to"
    )
    run.add_argument(
        "--pin-file", metavar="FILE", help="keep tool pins in FILE across restarts (trust on first use)"
    )
    run.add_argument(
        "--audit-max-bytes",
        metavar="N",
        type=_positive_int,
        help="rotate the audit log when it reaches N bytes",
    )
    run.add_argument(
        "--no-checks",
        action="store_true",
        help="relay with wire checks only: no policy, no audit log (for measuring; never for real use)",
    )
    run.add_argument(
        "--unsafe-no-fsync",
        action="store_true",
        help="write the audit log without fsync (for measuring; allows are then not durable)",
    )
    run.add_argument(
        "--approval-dir",
        "-approval-dir",  # mcp-visor's spelling (Go flags), so its users' configs keep working
        metavar="DIR",
        help="ask for approvals through pending files in DIR (answer with `visor approve`/`visor deny`)",
    )
    run.add_argument(
        "--approval-tty",
        "-approval-cli",  # mcp-visor's prompt flag: here on /dev/tty, since stdin is the wire
        "--approval-cli",
        action="store_true",
        help="ask for approvals on /dev/tty (never stdin)",
    )
    run.add_argument(
        "--approval-elicitation",
        action="store_true",
        help="also let the MCP client answer approvals (elicitation) next to --approval-dir or "
        "--approval-tty; without this flag the client is never asked when either is given. "
        "The client's code can accept on its own: its answers are recorded as client-reported",
    )
    run.add_argument(
        "--log-level",
        default=None,
        choices=["debug", "info", "warning", "error"],
        help="default info: one line per deny and per approval question; -q is warning, -v is debug",
    )
    run.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="only warnings")
    run.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug log lines too"
    )
    run.add_argument("--log-format", default="console", choices=["json", "console"])
    run.add_argument("--shutdown-grace", type=float, default=5.0, metavar="SECONDS", help=argparse.SUPPRESS)
    run.add_argument(
        "--url", metavar="URL", help="a Streamable HTTP server instead of COMMAND (docs/remote.md; no OAuth)"
    )
    run.add_argument(
        "--header", metavar="'NAME: VALUE'", action="append", default=[],
        help="an HTTP header for --url (repeatable); ${VAR} in VALUE is read from the environment",
    )  # fmt: skip
    run.add_argument(
        "--group", metavar="NAME",
        help="share seen output, taints and approvals with every server of group NAME (default: "
        "$VISOR_GROUP, else the servers the same client process started; docs/groups.md)",
    )  # fmt: skip
    run.add_argument(
        "--no-group", action="store_true",
        help="share nothing with the client's other servers (this server's own output only)",
    )  # fmt: skip
    run.add_argument("command", nargs=argparse.REMAINDER, help="the server command, after --")
    run.set_defaults(func=_cmd_run)


def _cmd_run(args: argparse.Namespace) -> int:
    from visor.run import run_command

    if args.log_level is None:
        args.log_level = (
            "warning"
            if getattr(args, "quiet", False)
            else "debug"
            if getattr(args, "verbose", False)
            else "info"
        )

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if args.url is not None or args.header:
        from visor.http.options import upstream_config

        try:
            args.http_upstream, command = upstream_config(args, command)
        except ValueError as exc:
            print(f"visor run: {exc}", file=sys.stderr)
            return 2
    elif not command:
        print(
            "visor run: no server command given; usage: visor run [OPTIONS] -- COMMAND [ARGS...]",
            file=sys.stderr,
        )
        return 2
    if args.policy and not args.no_checks:
        from visor.migrate.detect import bouncer_hint

        # The loader would refuse it by its first tool name ("unknown key"); say what it is instead.
        hint = bouncer_hint(args.policy)
        if hint is not None:
            print(f"visor run: policy refused: {hint}", file=sys.stderr)
            return 1
    return run_command(args, command)


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"visor {__version__}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from visor.demo.runner import run_demo

    return run_demo(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from visor.bench.runner import run_bench

    return run_bench(args)


def build_parser(*, run_only: bool = False) -> argparse.ArgumentParser:
    """The whole command line; with `run_only`, the top level and `visor run` alone.

    `visor run` builds only its own parser: the other command modules import
    much that relaying never uses, and the time to the first answer counts it.
    """
    parser = argparse.ArgumentParser(
        prog="visor",
        description="A deterministic action boundary for MCP tool calls.",
        epilog="start with: visor init --list   (then `visor COMMAND --help` for any command)",
    )
    parser.add_argument("-V", "--version", action="version", version=f"visor {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="less output (visor run: warnings only)")
    parser.add_argument("-v", "--verbose", action="store_true", help="more output (visor run: debug)")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    _add_run(sub)
    if run_only:
        for register in _optional_registrations(_RUN_OPTION_MODULES, "register_run"):
            register(sub)
        return parser
    version = add_command(sub, "version", "print the version", "Print the version of Visor.", "visor version")
    version.set_defaults(func=_cmd_version)
    demo = add_command(
        sub,
        "demo",
        "run the built-in demonstration",
        "Start a real `visor run` in front of a helpdesk server in a temporary workspace, drive it "
        "with a scripted hijacked agent, and show that the attacker got nothing.",
        "visor demo --keep /tmp/visor-demo",
    )
    demo.add_argument("--keep", metavar="DIR", help="keep the workspace, log and review pack in DIR")
    demo.set_defaults(func=_cmd_demo)
    bench = add_command(
        sub,
        "bench",
        "measure Visor against a direct connection and a byte relay",
        "Run the same workload directly, through a byte relay and through Visor, and print the table.",
        "visor bench --quick",
    )
    bench.add_argument("--quick", action="store_true", help="smaller workloads, for a smoke run")
    bench.add_argument("--output", metavar="FILE", help="write the figures as JSON here")
    bench.add_argument(
        "--progress", action="store_true", help="say on stderr which row runs (the default on a terminal)"
    )
    bench.add_argument(
        "--server-cmd", metavar="CMD", help="benchmark your own server (a shell-quoted command line)"
    )
    bench.add_argument("--policy", metavar="FILE", help="with --server-cmd: your policy")
    bench.add_argument(
        "--server-name", default="", help="with --server-cmd: the server name your policy uses"
    )
    bench.add_argument("--tool", default="echo", help="with --server-cmd: the tool to call")
    bench.add_argument(
        "--arguments", default="{}", metavar="JSON", help="with --server-cmd: the call's arguments"
    )
    bench.set_defaults(func=_cmd_bench)
    for register in _optional_registrations(_COMMAND_MODULES):
        register(sub)
    return parser


# Each of these modules offers `register(subparsers)` for its own subcommands.
_COMMAND_MODULES = (
    "visor.policy.commands",
    "visor.audit.commands",
    "visor.approval.commands",
    "visor.install.commands",
    "visor.watch",
    "visor.serve.command",
)
# Those of them that also add options to `visor run`: for `visor run` alone, their
# `register_run(subparsers)` adds just those (building their other subcommands costs start-up time).
_RUN_OPTION_MODULES = ("visor.audit.commands",)


def _optional_registrations(
    names: Sequence[str], function: str = "register"
) -> list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]]:
    import importlib

    registrations = []
    for name in names:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # Only the module itself (or its package) being absent is skipped;
            # a broken import inside it is a bug and must surface.
            if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
                raise
            continue
        registrations.append(getattr(module, function))
    return registrations


def _subcommand_names(parser: argparse.ArgumentParser) -> list[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


def _unknown_command(parser: argparse.ArgumentParser, args_list: list[str]) -> str | None:
    """'did you mean' for the first word when it is not a command."""
    first = next((a for a in args_list if a not in ("-q", "--quiet", "-v", "--verbose")), None)
    if first is None or first.startswith("-"):
        return None
    names = _subcommand_names(parser)
    if first in names:
        return None
    import difflib

    close = difflib.get_close_matches(first, names, n=3, cutoff=0.6)
    close += [n for n in names if n.startswith(first) and n not in close]
    hint = f"; did you mean {' or '.join(repr(c) for c in close[:3])}?" if close else ""
    return f"visor: unknown command {first!r}{hint} (see `visor --help`)"


def _command_parser(parser: argparse.ArgumentParser, args_list: list[str]) -> argparse.ArgumentParser:
    """The (sub)command parser the words of the command line lead to: `visor audit verify ...` -> verify."""
    current = parser
    for word in args_list:
        if word == "--":
            break
        choices = next(
            (a.choices for a in current._actions if isinstance(a, argparse._SubParsersAction)), None
        )
        if isinstance(choices, dict) and word in choices:
            current = choices[word]
    return current


def _unknown_arguments(command: argparse.ArgumentParser, extras: list[str]) -> str:
    """Argparse blames the top-level parser for a subcommand's unknown option; name the subcommand."""
    import difflib

    first = extras[0]
    options = [s for a in command._actions for s in a.option_strings if s.startswith("--")]
    close = difflib.get_close_matches(first.split("=", 1)[0], options, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    what = "unknown option" if first.startswith("-") else "unexpected argument"
    return f"{command.prog}: {what} {first!r}{hint} (see `{command.prog} --help`)"


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    is_run = next((a for a in args_list if a not in ("-q", "--quiet", "-v", "--verbose")), None) == "run"
    if is_run:
        # Protect the wire before anything can print: from here on, fd 1 is
        # stderr for everyone but the relay, which keeps a private copy.
        from visor.run import protect_stdio

        protect_stdio()
    try:
        parser = build_parser(run_only=is_run)
        unknown = _unknown_command(parser, args_list)
        if unknown is not None:
            print(unknown, file=sys.stderr)
            return 2
        args, extras = parser.parse_known_args(args_list)
        if extras:
            print(_unknown_arguments(_command_parser(parser, args_list), extras), file=sys.stderr)
            return 2
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return 2
        return int(args.func(args))
    except KeyboardInterrupt:
        # Ctrl-C: no traceback, the shell convention for SIGINT.
        print("visor: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
