"""`visor doctor`: is this installation doing what the user thinks it does?

One line per check, OK / WARN / FAIL, with the fix on FAIL and WARN lines.

Starting a wrapped server: doctor runs the entry's own `visor` command with the
entry's options, environment and cwd, so it exercises what the client would
run. It swaps two things for throwaway ones under a temporary directory:

* the audit log. A client that is running already holds the real log (a log
  has one writer), so using it would make doctor fail or interleave two
  sessions in one chain; and doctor's test session is not evidence of
  anything the agent did. The real log is checked separately: that it (or
  the folder it will be created in) is writable and that its chain verifies.
* the pin file. Pins are trust on first use; doctor must not be the one to
  trust the server's tool list on the user's behalf.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from visor.display import colour_level, escape
from visor.install import vscode_vars
from visor.install.configs import (
    UPSTREAM_KEY,
    Config,
    ConfigError,
    Entry,
    command_line,
    home_dir,
    known_locations,
    real_server,
    wrapped_run_args,
)
from visor.install.init import DESKTOP_PATH_DIRS, read_config
from visor.install.stdio_client import ClientError, child_env, list_server

# Options doctor replaces when it starts a server (see the module docstring).
_SWAPPED = ("--audit-log", "--pin-file", "--audit-max-bytes")


@dataclass(frozen=True, slots=True)
class Check:
    level: str  # "OK" | "WARN" | "FAIL"
    subject: str
    message: str
    fix: str = ""

    def render(self) -> str:
        text = f"{self.level:<4} {self.subject}: {self.message}"
        return text + (f" -- fix: {self.fix}" if self.fix and self.level != "OK" else "")


def _resolve(command: str, path_var: str | None = None) -> str | None:
    if os.sep in command or "/" in command:
        return command if os.path.isfile(command) and os.access(command, os.X_OK) else None
    return shutil.which(command, path=path_var)


def parse_run_options(options: list[str], upstream: list[str]) -> argparse.Namespace:
    """The wrapped args read by `visor run`'s own parser; ValueError if it refuses them."""
    from visor.cli import build_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser().parse_args(["run", *options, "--", *upstream])
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        raise ValueError(lines[-1] if lines else "visor run refuses these options") from None


def _without(options: list[str], names: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    skip = False
    for opt in options:
        if skip:
            skip = False
            continue
        if opt in names:
            skip = True
            continue
        if any(opt.startswith(n + "=") for n in names):
            continue
        out.append(opt)
    return out


class Doctor:
    def __init__(
        self, timeout: float, start: bool, scratch: Path, quiet: bool = False, progress: bool = False
    ) -> None:
        self.timeout = timeout
        self.start = start
        self.scratch = scratch
        self.quiet = quiet  # --json: the checks are printed together at the end
        self.progress = progress
        self.checks: list[Check] = []
        self.logs_checked: set[Path] = set()

    def add(self, level: str, subject: str, message: str, fix: str = "") -> None:
        check = Check(level, subject, message, fix)
        self.checks.append(check)
        if not self.quiet:
            # Messages quote audit logs, servers' errors and file names: none may drive the terminal.
            print(colour_level(escape(check.render()), level), flush=True)

    def step(self, text: str) -> None:
        """Progress on stderr (a terminal, or --progress): starting a server takes seconds."""
        if self.progress:
            print(f"visor doctor: {text}", file=sys.stderr, flush=True)

    # ----------------------------------------------------------- configs

    def config(self, path: Path) -> None:
        try:
            config, _ = read_config(path)
        except ConfigError as e:
            # A mistyped --config is not a file to fix: point at the configs that do exist.
            fix = (
                "check the path; `visor init --list` shows the configs it finds"
                if not path.exists()
                else ("fix the file, then run again")
            )
            self.add("FAIL", str(path), str(e).removeprefix(f"{path}:").strip(), fix)
            return
        if not config.entries:
            self.add("WARN", str(path), "no MCP servers in this file")
            return
        for entry in config.entries:
            self.entry(config, path, entry)

    def entry(self, config: Config, path: Path, e: Entry) -> None:
        subject = f"{path.name}:{e.label}"
        if e.kind == "remote" and e.note:
            # init leaves this entry alone: offering its command as the fix would do nothing.
            self.add(
                "WARN",
                subject,
                f"remote server ({e.summary()}), not covered by Visor: its tool calls bypass Visor ({e.note})",
                "see docs/remote.md for the remote entries `visor init` can wrap",
            )
            return
        if e.kind == "remote":
            self.add(
                "WARN",
                subject,
                f"remote server ({e.summary()}), not wrapped: its tool calls bypass Visor",
                f"visor init --config {path} --server {e.name} (wraps it as `visor run --url`; "
                "docs/remote.md says which remote entries it can wrap)",
            )
            return
        if e.kind == "stdio":
            self.add(
                "WARN",
                subject,
                "not wrapped: its tool calls bypass Visor",
                f"visor init --config {path} --server {e.name}",
            )
            return
        if e.kind == "seed":
            self.add(
                "WARN",
                subject,
                f"{e.note}, not by Visor: its tool calls bypass Visor",
                f"visor init --config {path} --server {e.name} (Visor unwraps it and wraps the server inside)",
            )
            return
        if e.kind != "wrapped":
            self.add("WARN", subject, f"not a server entry Visor understands ({e.note})")
            return
        ctx = (
            vscode_vars.context_for(path, home_dir())
            if vscode_vars.is_vscode_config(path, config.blocks)
            else None
        )
        self.wrapped(path, subject, e, ctx)

    def wrapped(self, path: Path, subject: str, e: Entry, ctx: vscode_vars.Context | None = None) -> None:
        value = e.fields
        unresolved: list[str] = []
        if ctx is not None:
            # what VS Code does before it starts the entry
            value, unresolved = vscode_vars.expand(value, ctx)
            if unresolved:
                self.add(
                    "WARN",
                    subject,
                    f"uses {', '.join(unresolved)}, which VS Code fills in when it starts the server "
                    "and doctor cannot; the server is not started here",
                    "start it from VS Code (MCP: List Servers) to check it",
                )
        split = wrapped_run_args(value)
        if split is None:
            self.add(
                "FAIL",
                subject,
                f"has {UPSTREAM_KEY} but does not run `visor run`",
                f"visor init --undo --config {path} --server {e.name}, then wrap it again",
            )
            return
        options, upstream = split
        if not upstream and any(o == "--url" or o.startswith("--url=") for o in options):
            self.remote(path, subject, e, value, options)
            return
        if not upstream:
            self.add("FAIL", subject, "no server command after `--`", f"visor init --undo --config {path}")
            return
        try:
            args = parse_run_options(options, upstream)
        except ValueError as err:
            self.add(
                "FAIL",
                subject,
                f"`visor run` refuses the wrapped options: {err}",
                "fix the args in the entry",
            )
            return
        if args.no_checks or args.unsafe_no_fsync:
            switched = "--no-checks" if args.no_checks else "--unsafe-no-fsync"
            self.add(
                "FAIL",
                subject,
                f"wrapped with {switched}: measuring options that switch protection off",
                f"remove {switched} from the entry's args",
            )

        up = value.get(UPSTREAM_KEY)
        if isinstance(up, dict):
            up = real_server(up)  # a seed's entry under x-visor-upstream: the server inside it
        if isinstance(up, dict) and command_line(up) and command_line(up) != upstream:
            self.add(
                "WARN",
                subject,
                f"the command after `--` differs from {UPSTREAM_KEY}; --undo restores {UPSTREAM_KEY}",
                "make them agree, or undo and wrap again",
            )

        given_env = value.get("env")
        env: dict[str, object] = dict(given_env) if isinstance(given_env, dict) else {}
        env_file = value.get("envFile")
        if ctx is not None and isinstance(env_file, str) and not unresolved:
            try:
                env = {**vscode_vars.read_env_file(Path(env_file)), **env}
            except (OSError, UnicodeError) as err:
                self.add(
                    "FAIL", subject, f"envFile {env_file}: cannot read it ({err})", "fix envFile in the entry"
                )
        visor_cmd = str(value["command"])
        visor_exe = _resolve(visor_cmd)
        if visor_exe is None:
            self.add(
                "FAIL",
                subject,
                f"the client cannot start {visor_cmd!r}: not found on PATH",
                f"visor init --config {path} --server {e.name} --absolute",
            )
        elif not os.path.isabs(visor_cmd) and os.path.dirname(visor_exe) not in DESKTOP_PATH_DIRS:
            self.add(
                "WARN",
                subject,
                f"runs {visor_cmd!r}, found at {visor_exe} on this shell's PATH; a desktop app started "
                "from the Dock or a launcher may not see that folder",
                # A rewrap keeps the entry's --policy and other options; undo and wrap again would not.
                f"visor init --config {path} --server {e.name} --absolute",
            )
        else:
            self.add("OK", subject, f"wrapped; runs {visor_exe}")

        cwd = value.get("cwd")
        program = upstream[0]
        if isinstance(cwd, str) and "/" in program and not os.path.isabs(program):
            program = os.path.join(cwd, program)
        # child_env passes string values only: a PATH that is not one is not the child's
        env_path = env.get("PATH")
        if (
            _resolve(program, env_path if isinstance(env_path, str) and env_path else os.environ.get("PATH"))
            is None
        ):
            self.add(
                "FAIL",
                subject,
                f"the server command {upstream[0]!r} is not found",
                "install it, or give its absolute path in the entry (and in x-visor-upstream)",
            )
        if isinstance(cwd, str) and not os.path.isdir(cwd):
            self.add("FAIL", subject, f"cwd {cwd!r} does not exist", "create it or fix cwd in the entry")

        policy_ok = self.policy(subject, args)
        self.approvals(subject, args, f"visor init --config {path} --server {e.name}")
        self.audit_log(subject, args, upstream)
        if not self.start:
            return
        if unresolved:
            return
        if visor_exe is None or not policy_ok:
            self.add("FAIL", subject, "not started: fix the problems above first")
            return
        self.step(f"starting {e.label} through Visor (up to {self.timeout:g} s)")
        self.start_through_visor(subject, e, visor_exe, options, upstream, env, cwd)

    def remote(
        self, path: Path, subject: str, e: Entry, value: Mapping[str, object], options: list[str]
    ) -> None:
        """A remote server wrapped as `visor run --url`: its options, policy and header variables.

        Doctor does not connect to the remote server: that would send the
        entry's credentials from here.
        """
        try:
            args = parse_run_options(options, [])
        except ValueError as err:
            self.add(
                "FAIL",
                subject,
                f"`visor run` refuses the wrapped options: {err}",
                "fix the args in the entry",
            )
            return
        given_env = value.get("env")
        env = given_env if isinstance(given_env, dict) else {}
        for header in args.header or []:
            for name in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", str(header)):
                if name not in env and name not in os.environ:
                    self.add(
                        "FAIL",
                        subject,
                        f"header {str(header).split(':', 1)[0]!r} reads ${{{name}}}, which neither the entry's env "
                        "nor this environment sets: Visor would refuse to start",
                        f"set {name} in the entry's env",
                    )
        visor_cmd = str(value["command"])
        visor_exe = _resolve(visor_cmd)
        if visor_exe is None:
            self.add(
                "FAIL",
                subject,
                f"the client cannot start {visor_cmd!r}: not found on PATH",
                f"visor init --config {path} --server {e.name} --absolute",
            )
        else:
            self.add(
                "OK",
                subject,
                f"wrapped remote server ({args.url}); runs {visor_exe}; not connected by doctor",
            )
        self.policy(subject, args)
        self.approvals(subject, args, f"visor init --config {path} --server {e.name}")

    # ----------------------------------------------------------- parts

    def policy(self, subject: str, args: argparse.Namespace) -> bool:
        from visor.policy.lint import lint_file

        if not args.policy:
            self.add("OK", subject, "policy: the embedded default (every listed tool, pinned; sends checked)")
            return True
        if not os.path.isabs(args.policy):
            self.add(
                "WARN",
                subject,
                f"policy path {args.policy!r} is relative: it depends on where the client starts Visor",
                "use an absolute path",
            )
        policy, findings = lint_file(args.policy)
        errors = [f for f in findings if f.level == "error"]
        if errors or policy is None:
            first = errors[0].render(args.policy) if errors else f"{args.policy}: does not load"
            self.add("FAIL", subject, f"policy does not load: {first}", f"visor lint {args.policy}")
            return False
        warnings = len(findings) - len(errors)
        if policy.server(args.server_name) is None:
            self.add(
                "FAIL",
                subject,
                f"policy {args.policy} has no server entry {args.server_name!r} (and no '*'): every call is denied",
                f"add a servers entry named {args.server_name!r}, or scaffold one with "
                f"`visor policy scaffold --server-name {args.server_name} -o FILE -- COMMAND`",
            )
            return True
        more = f" ({warnings} warning(s): visor lint {args.policy})" if warnings else ""
        self.add("OK", subject, f"policy {args.policy} loads{more}")
        return True

    def approvals(self, subject: str, args: argparse.Namespace, rewrap: str) -> None:
        if args.approval_dir:
            d = Path(args.approval_dir)
            probe = d if d.exists() else next((p for p in d.parents if p.exists()), Path("/"))
            if not os.access(probe, os.W_OK | os.X_OK):
                self.add(
                    "FAIL",
                    subject,
                    f"approval dir {d} is not writable",
                    "choose a folder you own for --approval-dir",
                )
            else:
                self.add("OK", subject, f"approvals through files in {d} (answer with `visor approve`)")
        elif args.approval_tty:
            self.add("OK", subject, "approvals on /dev/tty (only when the client runs Visor from a terminal)")
        else:
            self.add(
                "WARN",
                subject,
                "no approval channel: an `ask` reaches you only if the client supports MCP elicitation, "
                "otherwise it is denied",
                # init rewraps with the entry's other options kept; a hand edit is easy to get wrong.
                f"{rewrap} --approval-dir DIR, then answer with `visor approve`",
            )

    def audit_log(self, subject: str, args: argparse.Namespace, upstream: list[str]) -> None:
        from visor.run import default_audit_path_for

        path = Path(args.audit_log) if args.audit_log else default_audit_path_for(args.server_name, upstream)
        self.log_file(subject, path)

    def log_file(self, subject: str, path: Path) -> None:
        from visor.audit.verify import verify_path

        if path in self.logs_checked:
            return
        self.logs_checked.add(path)
        if not path.exists():
            folder = next((p for p in path.parents if p.exists()), Path("/"))
            if os.access(folder, os.W_OK | os.X_OK):
                self.add("OK", subject, f"audit log {path}: not written yet; {folder} is writable")
            else:
                self.add(
                    "FAIL", subject, f"audit log {path}: cannot be created in {folder}", "--audit-log FILE"
                )
            return
        if not os.access(path, os.W_OK):
            self.add("FAIL", subject, f"audit log {path} is not writable", f"chmod u+w {path}")
            return
        report = verify_path(path)
        if report.problem is not None:
            self.add(
                "FAIL",
                subject,
                f"audit log does not verify: {report.problem}",
                f"visor audit verify {path}; a torn tail: visor audit repair {path}",
            )
        else:
            self.add("OK", subject, f"audit log {path}: {report.records} record(s), chain verifies")

    def start_through_visor(
        self,
        subject: str,
        e: Entry,
        visor_exe: str,
        options: list[str],
        upstream: list[str],
        env: dict[str, object],
        cwd: object,
    ) -> None:
        from visor.audit.verify import verify_path

        scratch = Path(tempfile.mkdtemp(prefix="doctor-", dir=self.scratch))
        log = scratch / "audit.jsonl"
        argv = [visor_exe, "run", *_without(options, _SWAPPED), "--audit-log", str(log), "--", *upstream]
        try:
            listing = list_server(
                argv,
                env=child_env(env),
                cwd=cwd if isinstance(cwd, str) and os.path.isdir(cwd) else None,
                timeout=self.timeout,
            )
        except ClientError as err:
            self.explain_failure(subject, err, upstream, env, cwd)
            return
        ident = listing.server_info.get("name", "?")
        self.add(
            "OK",
            subject,
            f"starts through Visor; tools/list answered {len(listing.tools)} tool(s) from {ident}",
        )
        report = verify_path(log)
        if report.problem is not None or not report.records:
            self.add(
                "FAIL", subject, f"Visor's test session did not leave a verifying log: {report.summary()}"
            )

    def explain_failure(
        self, subject: str, err: ClientError, upstream: list[str], env: dict[str, object], cwd: object
    ) -> None:
        """Whose fault: the server's own error if it fails on its own too, else Visor's.

        Through Visor, the server's stderr and Visor's log lines arrive mixed;
        starting the server alone once more gives its own words, unmixed.
        """
        self.step("the start failed; starting the server alone to see its own error")
        try:
            list_server(
                upstream,
                env=child_env(env),
                cwd=cwd if isinstance(cwd, str) and os.path.isdir(cwd) else None,
                timeout=self.timeout,
            )
        except ClientError as own:
            self.add(
                "FAIL",
                subject,
                f"the server does not start, with or without Visor: {' | '.join(str(own).splitlines())}",
                "fix the server command, its path or its env (this is the server's own error)",
            )
            return
        self.add(
            "FAIL",
            subject,
            f"the server starts on its own but not through Visor: {' | '.join(str(err).splitlines())}",
            "check the wrapped `visor run` options; run them by hand to see Visor's message",
        )


def config_paths(given: list[str] | None) -> list[Path]:
    if given:
        return [Path(p) for p in given]
    return [loc.path for loc in known_locations(home_dir(), Path.cwd()) if loc.path.is_file()]


def run_doctor(args: argparse.Namespace) -> int:
    from visor.audit.paths import default_audit_logs

    paths = config_paths(args.config)
    as_json = getattr(args, "json", False)
    progress = getattr(args, "progress", False) or (sys.stderr.isatty() and not as_json)
    with tempfile.TemporaryDirectory(prefix="visor-doctor-") as tmp:
        doc = Doctor(args.timeout, not args.no_start, Path(tmp), quiet=as_json, progress=progress)
        if not paths:
            doc.add(
                "WARN",
                "configs",
                "no MCP client config found in the usual places",
                "visor init --list; or visor doctor --config FILE",
            )
        for p in paths:
            doc.step(f"checking {p}")
            doc.config(p)
        doc.step("verifying the audit logs")
        for log in default_audit_logs():
            doc.log_file("audit", log)
    counts = {lvl: sum(1 for c in doc.checks if c.level == lvl) for lvl in ("OK", "WARN", "FAIL")}
    status = 1 if counts["FAIL"] else 0
    if as_json:
        # ASCII-escaped: no control, C1 or bidi character of a quoted log reaches a terminal raw.
        print(json.dumps(json_report(doc.checks, paths, counts, status), indent=2, ensure_ascii=True))
    else:
        print(f"{counts['OK']} ok, {counts['WARN']} warning(s), {counts['FAIL']} failure(s)")
    return status


#: Version of `visor doctor --json`'s document (docs/clients.md); bumped on any incompatible change.
JSON_VERSION = 1


def json_report(
    checks: list[Check], configs: list[Path], counts: dict[str, int], status: int
) -> dict[str, Any]:
    return {
        "version": JSON_VERSION,
        "configs": [str(p) for p in configs],
        "checks": [
            {
                "level": c.level.lower(),
                "subject": c.subject,
                "message": c.message,
                "fix": (c.fix or None) if c.level != "OK" else None,
            }
            for c in checks
        ],
        "summary": {"ok": counts["OK"], "warn": counts["WARN"], "fail": counts["FAIL"]},
        "exit_code": status,
    }
