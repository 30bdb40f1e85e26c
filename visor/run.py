"""`visor run`: load the policy, open the audit log, wire the gate into the relay."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import itertools
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from visor import logs
from visor.core.passthrough import Checks
from visor.relay import loop as event_loop
from visor.relay.proxy import Relay, RelayConfig
from visor.relay.reload import PolicySource
from visor.relay.upstream import SpawnError

if TYPE_CHECKING:
    from visor.approval.broker import ApprovalBroker
    from visor.audit.writer import AuditWriter
    from visor.core.checks import PolicyChecks
    from visor.groups.index import GroupIndex
    from visor.telemetry.driver import DriverTelemetry

# The client's pipes, moved off fds 0 and 1 by protect_stdio().
_WIRE_IN: int | None = None
_WIRE_OUT: int | None = None
# Why the wire cannot be used (a closed or wrong-way descriptor); run_command says so and exits.
_WIRE_PROBLEM: str | None = None
_PROTECTED = False

_WIRE_NAMES = {0: "stdin (file descriptor 0)", 1: "stdout (file descriptor 1)"}


def _wire_problem(fd: int, *, reading: bool, was_closed: bool) -> str | None:
    """Why `fd` cannot carry the client's side of the wire, or None."""
    name = _WIRE_NAMES[fd]
    if was_closed:
        return f"{name} is closed"
    try:
        st = os.fstat(fd)
        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError as exc:
        return f"{name} cannot be used: {exc.strerror or exc}"
    if stat.S_ISDIR(st.st_mode):
        return f"{name} is a directory"
    if reading and mode == os.O_WRONLY:
        return f"{name} is open for writing only; Visor reads the client's messages from it"
    if not reading and mode == os.O_RDONLY:
        return f"{name} is open for reading only; Visor writes the answers to it"
    return None


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def protect_stdio() -> None:
    """Keep private copies of the wire fds and point 0 and 1 elsewhere.

    Any stray print (a library, a crash handler, argparse) then lands on
    stderr instead of corrupting the protocol stream, and nothing but the
    relay can read the client's stdin: approval answers can never come from it.

    Never raises: a closed or unusable descriptor is recorded in
    `_WIRE_PROBLEM`, and `visor run` reports it on stderr and exits non-zero
    before it starts the server.
    """
    global _WIRE_IN, _WIRE_OUT, _WIRE_PROBLEM, _PROTECTED
    if _PROTECTED:
        return
    _PROTECTED = True
    # Python sets sys.stdin/sys.stdout to None when the descriptor was closed at
    # start-up; by now a library may have been given that number by open().
    closed = {0: sys.stdin is None or not _is_open(0), 1: sys.stdout is None or not _is_open(1)}
    problems = [
        p for fd in (0, 1) if (p := _wire_problem(fd, reading=fd == 0, was_closed=closed[fd])) is not None
    ]
    if problems:
        _WIRE_PROBLEM = (
            "; ".join(problems) + ". Visor relays the MCP client's messages over its stdin and stdout: "
            "start it with both connected (a pipe, a file or /dev/null)"
        )
    # Fill closed standard descriptors first, so that no dup below can be handed 0, 1 or 2.
    for fd in (0, 1, 2):
        if not _is_open(fd):
            with contextlib.suppress(OSError):
                null = os.open(os.devnull, os.O_RDWR)
                if null != fd:
                    os.dup2(null, fd)
                    os.close(null)
    if _WIRE_PROBLEM is None:
        _WIRE_IN = os.dup(0)
        _WIRE_OUT = os.dup(1)
        os.set_inheritable(_WIRE_IN, False)
        os.set_inheritable(_WIRE_OUT, False)
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
    if sys.stdout is not None:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
    try:
        os.dup2(2, 1)
    except OSError:
        with contextlib.suppress(OSError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.close(null)
    if sys.stdout is None:
        # stdout was closed at start-up: argparse's help and stray prints go to stderr now.
        sys.stdout = sys.stderr


def default_audit_path_for(server_name: str, command: list[str]) -> Path:
    """One log per server under $VISOR_HOME/audit/: a log has a single writer.

    A client that starts several wrapped servers at once runs one Visor per
    server, and each needs a chain of its own.
    """
    from visor.audit.paths import visor_home

    base = server_name or Path(command[0]).name or "server"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in base).lstrip(".") or "server"
    return visor_home() / "audit" / f"{safe}.jsonl"


def default_audit_candidates(base: Path) -> Iterator[Path]:
    """``<name>.jsonl``, then ``<name>-2.jsonl``, ``<name>-3.jsonl``, ... without end.

    A log has one writer (its lock): a session whose name is held by a live
    session of the same server takes the next. Each name that is busy is
    held by a running process, so the search ends at most one past the
    number of sessions running; concurrent sessions are never capped here.
    """
    yield base
    for n in itertools.count(2):
        yield base.with_name(f"{base.stem}-{n}.jsonl")


class StartupError(Exception):
    """Visor refuses to start: the message says what to fix."""


def measure_invocation(command: list[str], positions: tuple[int, ...]) -> tuple[str | None, str | None]:
    """``(digest, None)`` of the stdio invocation ``command`` under
    ``stdio_invocation_sha256_v1``, or ``(None, why)`` when it cannot be
    measured (the file reads for visor/policy/attestation.py, which defines
    the encoding). ``positions`` are the arguments whose file content is bound.
    """
    import shutil

    from visor.policy import attestation as att

    if not command or not command[0]:
        return None, "the server command is empty"
    name, args = command[0], command[1:]
    found = shutil.which(name)
    if found is None:
        return None, f"{name!r} is not an executable file (looked up on PATH)"
    runner = att.unpinnable_launcher((os.path.basename(name), os.path.basename(found)), args)
    if runner is not None:
        return None, f"launcher {runner!r} runs a package from a registry, which cannot be content-pinned"
    for pos in positions:
        if pos >= len(args):
            return None, f"entry_arg_positions {pos} is out of range for {len(args)} arguments"
    digest = att.Digest()

    def stream(path: str, tag: int, index: int, what: str) -> str | None:
        real = os.path.realpath(path, strict=True)
        st = os.stat(real)
        if not stat.S_ISREG(st.st_mode):
            return f"{what} {path!r} is not a regular file"
        if tag == att.TAG_EXECUTABLE and not st.st_mode & 0o111:
            return f"{what} {path!r} is not executable"
        digest.header(tag, index, st.st_size)
        count = 0
        with open(real, "rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.data(chunk)
                count += len(chunk)
        if count != st.st_size:
            return f"{what} {path!r} changed size while it was hashed"
        return None

    try:
        why = stream(found, att.TAG_EXECUTABLE, 0, "the launcher")
        if why is not None:
            return None, why
        for i, arg in enumerate(args):
            digest.argument(i, arg)
            if i in positions:
                why = stream(arg, att.TAG_ENTRY_PAYLOAD, i, "the entry argument")
                if why is not None:
                    return None, why
    except OSError as exc:
        return None, f"cannot read {exc.filename or 'a file'}: {exc.strerror or exc}"
    return digest.result(), None


@dataclass(frozen=True, slots=True)
class _Checked:
    """What a checked session runs with: the checks and the I/O they are driven through."""

    checks: PolicyChecks
    audit: AuditWriter
    approvals: ApprovalBroker
    pin_saver: Callable[[dict[str, Any]], None] | None
    approvals_saver: Callable[[dict[str, Any]], None]
    listing_timeout: float
    group: GroupIndex | None = None


def _build_checks(args: argparse.Namespace, command: list[str]) -> _Checked:
    from visor.audit.writer import AuditError, AuditLogBusy, AuditWriter, new_session_id
    from visor.core.checks import PolicyChecks
    from visor.pinfile import read_pins, unwritable, write_pins
    from visor.policy.loader import PolicyError, load_default_policy, load_policy
    from visor.session import SessionState

    try:
        policy = load_policy(args.policy) if args.policy else load_default_policy()
    except PolicyError as exc:
        raise StartupError(f"policy refused: {exc}") from exc
    except OSError as exc:
        raise StartupError(f"cannot read the policy {args.policy}: {exc.strerror or exc}") from exc
    from visor.policy import attestation

    if args.policy and policy.server(args.server_name) is None:
        # Not an error (a deny-all session is a choice), but the likeliest cause is a typo in
        # --server-name or in the entry's name, and every call would then be refused.
        from visor.logs import get_logger

        get_logger("visor.run").warning(
            "policy_has_no_entry_for_server",
            server=args.server_name,
            policy=str(args.policy),
            every_call=policy.default_action,
            servers=[s.name for s in policy.servers][:20],
        )
    # An attested server entry: measure the invocation once, before it starts.
    policy = attestation.observe(policy, args.server_name, lambda pos: measure_invocation(command, pos))

    # Before the audit log opens: a refused option must not leave its writer running.
    approvals = _build_approvals(args, policy.settings.approval_timeout_seconds)
    listing_timeout = _listing_timeout()
    if args.identity and not any(i.name == args.identity for i in policy.identities):
        raise StartupError(f"identity {args.identity!r} is not defined in the policy's identities")
    group = _join_group(args, policy)
    session = SessionState(policy, args.server_name, identity=args.identity, group=group)
    pin_saver: Callable[[dict[str, Any]], None] | None = None
    if args.pin_file:
        pin_path = Path(args.pin_file)
        if pin_path.exists():
            try:
                session.import_pins(read_pins(pin_path))
            except (OSError, ValueError) as exc:
                raise StartupError(f"pin file {pin_path} refused: {exc}") from exc
        # Pins that cannot be saved are lost at exit, and the next start trusts whatever the
        # server lists then: a --pin-file whose folder cannot be written is refused now.
        problem = unwritable(pin_path)
        if problem is not None:
            raise StartupError(f"pin file {pin_path} refused: {problem}")

        def save_pins(data: dict[str, Any]) -> None:
            write_pins(pin_path, data)

        pin_saver = save_pins

    # Destinations a human approved with "remember": trusted again after a restart.
    approved_path = approved_destinations_path(args, command)
    if approved_path.exists():
        try:
            session.import_approvals(read_pins_json(approved_path))
        except (OSError, ValueError) as exc:
            raise StartupError(f"approved-destinations file {approved_path} refused: {exc}") from exc

    def approvals_saver(data: dict[str, Any]) -> None:
        try:
            write_pins(approved_path, data)
            os.chmod(approved_path, 0o600)
        except OSError as exc:  # the yes still holds for this session
            from visor.logs import get_logger

            get_logger("visor.run").error("approvals_save_failed", path=str(approved_path), error=str(exc))

    candidates: Iterable[Path]
    if args.audit_log:
        candidates = [Path(args.audit_log)]
    else:
        # Two clients may start the same wrapped server at once; a log has one
        # writer, so the second takes the next default name rather than failing.
        candidates = default_audit_candidates(default_audit_path_for(args.server_name, command))
    audit = None
    for audit_path in candidates:
        try:
            audit = AuditWriter.open(
                audit_path,
                session=new_session_id(),
                max_bytes=args.audit_max_bytes,
                durable=not args.unsafe_no_fsync,
                signer=_signer(args),  # --signing-key: signed checkpoints (visor/audit/signing.py)
            )
            break
        except AuditLogBusy as exc:
            if args.audit_log:
                raise StartupError(f"audit log refused: {exc}") from exc
            # Held by a live session of the same server: the next name.
        except AuditError as exc:
            raise StartupError(f"audit log refused: {exc}") from exc
    assert audit is not None
    checks = PolicyChecks(
        policy=policy,
        session=session,
        audit_session=audit.session,
        server_name=args.server_name,
        argv=command,
        approvals=approvals,
        protected=_protected_paths(args, audit_path, command),
        save_pins=pin_saver is not None,
        fixed_identity=args.identity or None,
    )
    return _Checked(checks, audit, approvals, pin_saver, approvals_saver, listing_timeout, group)


def _signer(args: argparse.Namespace) -> Any:
    """The checkpoint signer of `--signing-key` (or VISOR_SIGNING_KEY), or None. The signing
    module is imported only with a key: a start without one does not pay for it."""
    if not getattr(args, "signing_key", None):
        return None
    from visor.audit.signing import signer_from_args

    return signer_from_args(args)


def _join_group(args: argparse.Namespace, policy: Any) -> GroupIndex | None:
    """The group of servers this one's client started (docs/groups.md), or None
    with ``--no-group``. A store that cannot be joined still gives an index,
    one that answers "cannot tell" (the evaluator then asks)."""
    if getattr(args, "no_group", False):
        if getattr(args, "group", None) is not None:
            raise StartupError("--group NAME and --no-group contradict each other: give one")
        return None
    from visor.groups import identity
    from visor.groups.index import GroupIndex
    from visor.groups.store import prune_stale

    try:
        ident = identity.resolve(getattr(args, "group", None))
    except identity.GroupNameError as exc:
        raise StartupError(f"--group or VISOR_GROUP refused: {exc}") from exc
    prune_stale()
    return GroupIndex.join(ident, args.server_name, max_keys=policy.settings.output_index_max_keys)


def _listing_timeout() -> float:
    """How long a call made before any listing waits for Visor's own tools/list
    (``VISOR_TOOLS_LIST_TIMEOUT`` seconds, default visor.core.passthrough.LISTING_TIMEOUT_SECONDS)."""
    from visor.core.passthrough import LISTING_TIMEOUT_SECONDS

    raw = os.environ.get("VISOR_TOOLS_LIST_TIMEOUT")
    if not raw:
        return LISTING_TIMEOUT_SECONDS
    try:
        value = float(raw)
    except ValueError:
        raise StartupError(f"VISOR_TOOLS_LIST_TIMEOUT={raw!r} is not a number of seconds") from None
    if not 0 < value <= 3600:
        raise StartupError(f"VISOR_TOOLS_LIST_TIMEOUT={raw!r} must be above 0 and at most 3600 seconds")
    return value


def approved_destinations_path(args: argparse.Namespace, command: list[str]) -> Path:
    """Where destinations approved with "remember" are kept: next to the pin
    file when there is one, else $VISOR_HOME/approved/SERVER.json (a file per
    server, like the audit log). Visor's own file: no tool call may name it."""
    if args.pin_file:
        pin = Path(args.pin_file)
        return pin.with_name(pin.name + ".approved.json")
    from visor.audit.paths import visor_home

    return (
        visor_home()
        / "approved"
        / default_audit_path_for(args.server_name, command).with_suffix(".json").name
    )


def read_pins_json(path: Path) -> dict[str, Any]:
    import json

    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def _protected_paths(args: argparse.Namespace, audit_path: Path, command: list[str]) -> Any:
    """Visor's own files, which no tool call may name (visor/approval/protected.py); relative
    names are read from the working directory and from every directory the server's command
    line names (a filesystem server's allowed directories)."""
    from visor.approval.directory import default_dir
    from visor.approval.protected import Protected, command_directories, signing_key_dir, signing_key_files
    from visor.audit.paths import audit_dir, visor_home
    from visor.install.locations import home_dir, protected_config_paths

    # $VISOR_HOME/approved: destinations a human approved with "remember"
    dirs = [default_dir(), audit_dir(), visor_home() / "approved"]
    # $VISOR_HOME/groups: what the client's servers saw, their taints and approvals (docs/groups.md)
    dirs.append(visor_home() / "groups")
    if getattr(args, "approval_dir", None):
        dirs.append(Path(args.approval_dir))
    files = [audit_path]
    if args.pin_file:
        files.append(Path(args.pin_file))
        files.append(Path(args.pin_file).with_name(Path(args.pin_file).name + ".approved.json"))
    if args.policy:
        files.append(Path(args.policy))
    # The client configs that put Visor in front of this server: a write to
    # one would take Visor out of the chain for the next session.
    files.extend(protected_config_paths(home_dir(), Path.cwd()))
    # The audit signing key: whoever reads it can sign a rewritten log (visor/approval/protected.py).
    dirs.append(signing_key_dir())
    # $VISOR_HOME/run: where `visor approve` (no --approval-dir) finds the approval directories in
    # use; an entry a tool wrote would list a directory of its own, or hide the real one.
    from visor.userfiles import run_dir

    dirs.append(run_dir())
    files.extend(signing_key_files(getattr(args, "signing_key", None)))
    return Protected.of(dirs, files, bases=command_directories(command[1:]))


def _build_approvals(args: argparse.Namespace, timeout: float) -> Any:
    """The approval channels the operator chose.

    `--approval-dir` and `--approval-tty` are out of band: the client cannot
    answer them. MCP elicitation goes through the client, so next to either
    of them it is used only with `--approval-elicitation`; with neither, it is
    the only channel and joins a call when the client declared it in initialize.
    """
    from visor.approval.broker import ApprovalBroker, Channel

    channels: list[Channel] = []
    approval_dir = getattr(args, "approval_dir", None)
    if approval_dir:
        from visor.approval.directory import DirectoryChannel, DirectoryError, prepare

        try:
            channels.append(DirectoryChannel(prepare(Path(approval_dir))))
        except DirectoryError as exc:
            raise StartupError(f"approval directory refused: {exc}") from exc
        # `visor approve` (no --approval-dir) finds this directory; the entry goes at exit.
        from visor.watch import register_approval_dir

        register_approval_dir(Path(approval_dir), args.server_name)
    if getattr(args, "approval_tty", False):
        from visor.approval.tty import TtyChannel, TtyError, probe

        try:
            probe()
        except TtyError as exc:
            raise StartupError(str(exc)) from exc
        channels.append(TtyChannel())
    elicitation = True if getattr(args, "approval_elicitation", False) else None
    return ApprovalBroker(channels=channels, timeout=float(timeout), elicitation=elicitation)


def _start_telemetry(args: argparse.Namespace, checked: _Checked) -> DriverTelemetry | None:
    """OpenTelemetry export when the standard OTEL_EXPORTER_OTLP_* variables ask for it (docs/telemetry.md)."""
    from visor import telemetry

    reports = telemetry.start(server=args.server_name, session=checked.audit.session)
    if isinstance(reports, telemetry.NoTelemetry):
        return None
    from visor.telemetry.driver import DriverTelemetry

    checked.audit.observe_fsync(reports.fsynced)
    output = checked.checks.session.output
    reports.watch_output_index(lambda: len(output))
    checks = checked.checks

    def take_evaluation() -> float | None:
        seconds, checks.evaluation_seconds = checks.evaluation_seconds, None
        return seconds

    return DriverTelemetry(reports, take_evaluation)


def run_command(args: argparse.Namespace, command: list[str]) -> int:
    logs.configure(args.log_level, args.log_format)
    log = logs.get_logger("visor.run")
    protect_stdio()
    if _WIRE_PROBLEM is not None:
        # Before the server starts: there is nothing to stop or reap.
        print(f"visor run: {_WIRE_PROBLEM}", file=sys.stderr)
        return 2
    assert _WIRE_IN is not None and _WIRE_OUT is not None
    wire_in, wire_out = _WIRE_IN, _WIRE_OUT
    config = RelayConfig(
        max_message_bytes=args.max_message_bytes,
        shutdown_grace=args.shutdown_grace,
    )

    async def session() -> int:
        # The checks are built inside the loop: the audit writer delivers its
        # results to this loop's futures.
        if args.no_checks:
            log.warning("checks_disabled", detail="--no-checks: no policy, no audit log; for measuring only")
        elif args.unsafe_no_fsync:
            log.warning("audit_not_durable", detail="--unsafe-no-fsync: allows are not fsync'd before relay")
        if getattr(args, "watch_policy", False) and (args.no_checks or not args.policy):
            raise StartupError("--watch-policy watches the --policy FILE: give one (and no --no-checks)")
        make_relay: Callable[..., Relay] = Relay
        group: GroupIndex | None = None  # the client's group of servers (docs/groups.md), closed at the end
        telemetry: DriverTelemetry | None = None
        if getattr(args, "http_upstream", None) is not None:
            from functools import partial

            from visor.http.relay import HttpRelay  # imports the HTTP stack: only for --url

            make_relay = partial(HttpRelay, args.http_upstream)
        if args.no_checks:
            relay = make_relay(command, config, Checks())
        else:
            checked = _build_checks(args, command)
            group = checked.group
            telemetry = _start_telemetry(args, checked)
            relay = make_relay(
                command,
                replace(config, listing_timeout=checked.listing_timeout),
                checked.checks,
                audit=checked.audit,
                approvals=checked.approvals,
                pin_saver=checked.pin_saver,
                approvals_saver=checked.approvals_saver,
                telemetry=telemetry,
                policy_source=PolicySource(  # SIGHUP, and --watch-policy
                    str(args.policy) if args.policy else None, watch=getattr(args, "watch_policy", False)
                ),
            )
        try:
            return await relay.run(wire_in, wire_out)
        finally:
            if telemetry is not None:
                # Flushed on a thread: a collector that is down must not hold the loop.
                await asyncio.to_thread(telemetry.telemetry.shutdown)
            if not relay.closed:
                # The session failed before its normal end (the server could not
                # start, the client's descriptors could not be used): the records
                # written so far still reach the disk, and the writer stops.
                with contextlib.suppress(Exception):
                    await relay.close()
            if group is not None:
                group.close()

    try:
        return event_loop.run(session())
    except StartupError as exc:
        print(f"visor run: {exc}", file=sys.stderr)
        return 1
    except SpawnError as exc:
        log.error("server_spawn_failed", error=str(exc))
        return 1
    except Exception:
        log.exception("visor_failed")
        return 1
