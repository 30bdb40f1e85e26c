"""`visor serve`: the options, the checks built once per process and once per MCP session, the server.

What one MCP session gets is what one `visor run` gets (visor/run.py builds the same pieces):
its own Visor session state (pins, budgets, taints, approvals), its own checks and session core,
its own approval broker, and its own upstream process (or upstream HTTP session). What the
sessions share is the policy, loaded and measured once, and the audit log: one writer, one
chain, each record naming its MCP session in `mcp_session` (visor/serve/audit.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from visor import logs
from visor.serve.metrics import GatewayMetrics

if TYPE_CHECKING:
    from visor.audit.writer import AuditWriter
    from visor.core.events import PolicyReloaded
    from visor.http.upstream import HttpUpstreamConfig
    from visor.policy.schema import Policy
    from visor.relay.reload import PolicySource
    from visor.serve.gateway import GatewayConfig
    from visor.serve.session import McpSession
    from visor.serve.state import Adoption, SharedState
    from visor.serve.workers import Worker
    from visor.telemetry import Telemetry

DEFAULT_LISTEN = "127.0.0.1:8808"
REPLICA_ID = re.compile(r"[A-Za-z0-9_]{1,32}")
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# A shorter token is guessable in a network attacker's budget; refuse it at start.
MIN_TOKEN_CHARS = 16


class ServeError(Exception):
    """`visor serve` refuses to start: the message says what to fix."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from visor.cli import _positive_int, add_command

    p = add_command(
        sub,
        "serve",
        "serve an MCP server over Streamable HTTP behind Visor (a gateway)",
        "Serve Streamable HTTP at http://HOST:PORT/mcp. Each MCP session gets its own upstream "
        "process (COMMAND) or upstream HTTP session (--url), its own Visor session state, and the "
        "same checks, approvals and durable audit as `visor run` (docs/deploy.md).",
        "visor serve --listen 127.0.0.1:8808 --policy policy.yaml -- uvx mcp-server-time",
        usage="visor serve [OPTIONS] (-- COMMAND [ARGS...] | --url URL)",
    )
    p.add_argument("--listen", metavar="HOST:PORT", default=DEFAULT_LISTEN, help=f"default {DEFAULT_LISTEN}")
    p.add_argument(
        "--client-token-env", metavar="VAR",
        help="clients must present 'Authorization: Bearer <token>' with the token in $VAR "
        "(required to listen on anything but loopback)",
    )  # fmt: skip
    p.add_argument(
        "--allow-origin", metavar="ORIGIN", action="append", default=[],
        help="a browser Origin allowed besides the listen host's own (repeatable, exact match)",
    )  # fmt: skip
    p.add_argument("--max-sessions", type=_positive_int, default=64, metavar="N", help="default 64")
    p.add_argument(
        "--max-in-flight", type=_positive_int, default=64, metavar="N",
        help="requests in flight per session (default 64)",
    )  # fmt: skip
    p.add_argument(
        "--idle-timeout", type=float, default=900.0, metavar="SECONDS",
        help="end a session (and its upstream) after this long without a request (default 900)",
    )  # fmt: skip
    p.add_argument("--policy", metavar="FILE", help="policy YAML (default: the embedded default policy)")
    p.add_argument("--audit-log", metavar="FILE", help="audit log (default: $VISOR_HOME/audit/SERVER.jsonl)")
    p.add_argument("--server-name", metavar="NAME", default="", help="server name the policy refers to")
    p.add_argument(
        "--max-message-bytes", metavar="N", type=_positive_int, default=DEFAULT_MAX_MESSAGE_BYTES,
        help="largest message (HTTP body, SSE event, line) accepted in either direction (default 16 MiB)",
    )  # fmt: skip
    p.add_argument(
        "--identity", metavar="NAME", help="the agent identity the policy's identities section applies to"
    )
    p.add_argument(
        "--pin-file", metavar="FILE", help="tool pins read at each session's start and kept in FILE"
    )
    p.add_argument(
        "--audit-max-bytes", metavar="N", type=_positive_int, help="rotate the audit log at N bytes"
    )
    p.add_argument(
        "--unsafe-no-fsync", action="store_true",
        help="write the audit log without fsync (for measuring; allows are then not durable)",
    )  # fmt: skip
    p.add_argument(
        "--approval-dir", metavar="DIR",
        help="ask for approvals through pending files in DIR (answer with `visor approve`/`visor deny`)",
    )  # fmt: skip
    p.add_argument(
        "--approval-elicitation", action="store_true",
        help="also let the MCP client answer approvals (elicitation) next to --approval-dir",
    )  # fmt: skip
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", default="console", choices=["json", "console"])
    p.add_argument("--shutdown-grace", type=float, default=5.0, metavar="SECONDS", help=argparse.SUPPRESS)
    p.add_argument(
        "--workers", type=_positive_int, default=1, metavar="N",
        help="N processes serving the one port, each session kept by the process that opened it; "
        "each writes its own audit log, FILE.worker-I.jsonl (default 1: one process, docs/deploy.md)",
    )  # fmt: skip
    # Set by the --workers supervisor on the command line of each worker it starts (visor/serve/workers.py).
    p.add_argument("--worker-of", metavar="SPEC", help=argparse.SUPPRESS)
    p.add_argument(
        "--replica-id", metavar="ID",
        help="begin every session id this replica mints with 'ID.' (letters, digits, '_'; at most 32), "
        "so a load balancer can send each session to the replica that holds it (docs/deploy.md)",
    )  # fmt: skip
    p.add_argument(
        "--state", metavar="URL",
        help="keep each session's state (budgets, pins, untrusted output, taints, approvals) in this "
        "Redis/Valkey server (redis://HOST:PORT/DB) so any replica can continue any session "
        "(docs/deploy.md); needs the 'state' extra",
    )  # fmt: skip
    p.add_argument("--url", metavar="URL", help="a Streamable HTTP server instead of COMMAND (no OAuth)")
    p.add_argument(
        "--header", metavar="'NAME: VALUE'", action="append", default=[],
        help="an HTTP header for --url (repeatable); ${VAR} in VALUE is read from the environment",
    )  # fmt: skip
    p.add_argument("command", nargs=argparse.REMAINDER, help="the server command, after --")
    p.set_defaults(func=serve_command)


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ServeError(f"--listen {text!r}: expected HOST:PORT (an IPv6 address in brackets: [::1]:8808)")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ServeError(f"--listen {text!r}: the port must be 0 to 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def _token(args: argparse.Namespace, host: str) -> str | None:
    from visor.serve.gateway import is_loopback

    var = args.client_token_env
    if var is None:
        if not is_loopback(host):
            raise ServeError(
                f"--listen {args.listen}: refusing to serve beyond loopback without client authentication; "
                "give --client-token-env VAR with a bearer token in $VAR"
            )
        return None
    token = os.environ.get(var)
    if not token:
        raise ServeError(f"--client-token-env {var}: ${var} is not set or empty")
    if len(token) < MIN_TOKEN_CHARS:
        raise ServeError(f"--client-token-env {var}: the token must be at least {MIN_TOKEN_CHARS} characters")
    if any(not 0x21 <= ord(c) <= 0x7E for c in token):
        raise ServeError(f"--client-token-env {var}: the token must be visible ASCII (an HTTP header value)")
    return token


@dataclass(frozen=True, slots=True)
class _Shared:
    """What every session of the process shares: the policy, measured once, and the audit writer."""

    policy: Policy
    audit: AuditWriter
    command: list[str]
    http: HttpUpstreamConfig | None
    listing_timeout: float
    # Every file a reload read, loaded or not: a session opened after it protects them too (a
    # failed v2 is the file the operator fixes and reloads next; no session may write it).
    reload_paths: list[str] = field(default_factory=list)


def _open_shared(
    args: argparse.Namespace,
    command: list[str],
    http: HttpUpstreamConfig | None,
    worker: Worker | None = None,
) -> _Shared:
    from visor.audit.signing import signer_from_args
    from visor.audit.writer import AuditError, AuditLogBusy, AuditWriter, new_session_id
    from visor.policy import attestation
    from visor.policy.loader import PolicyError, load_default_policy, load_policy
    from visor.run import (
        StartupError,
        _listing_timeout,
        default_audit_candidates,
        default_audit_path_for,
        measure_invocation,
    )

    try:
        policy = load_policy(args.policy) if args.policy else load_default_policy()
    except PolicyError as exc:
        raise ServeError(f"policy refused: {exc}") from exc
    except OSError as exc:
        raise ServeError(f"cannot read the policy {args.policy}: {exc.strerror or exc}") from exc
    if http is not None:
        policy = attestation.observe(policy, args.server_name, lambda pos: (None, "the server is a URL"))
    else:
        policy = attestation.observe(policy, args.server_name, lambda pos: measure_invocation(command, pos))
    if args.identity and not any(i.name == args.identity for i in policy.identities):
        raise ServeError(f"identity {args.identity!r} is not defined in the policy's identities")
    try:
        listing_timeout = _listing_timeout()
    except StartupError as exc:
        raise ServeError(str(exc)) from exc
    candidates = [Path(args.audit_log)] if args.audit_log else default_audit_candidates(
        default_audit_path_for(args.server_name, command)
    )  # fmt: skip
    if worker is not None:
        candidates = map(worker.audit_path, candidates)  # one log per worker: one writer, one chain
    for path in candidates:
        try:
            audit = AuditWriter.open(
                path,
                session=new_session_id(),
                max_bytes=args.audit_max_bytes,
                durable=not args.unsafe_no_fsync,
                signer=signer_from_args(args),
            )
            return _Shared(policy, audit, command, http, listing_timeout)
        except AuditLogBusy as exc:
            if args.audit_log:
                raise ServeError(f"audit log refused: {exc}") from exc
        except AuditError as exc:
            raise ServeError(f"audit log refused: {exc}") from exc
    raise AssertionError("the audit candidates never end")


def _telemetry(args: argparse.Namespace, shared: _Shared, metrics: GatewayMetrics) -> Telemetry:
    """`/metrics` always; OpenTelemetry too when the standard OTEL_EXPORTER_OTLP_* variables ask
    for it (docs/telemetry.md): one span per final verdict of every session, as `visor run`."""
    from visor import telemetry

    otel = telemetry.start(server=args.server_name, session=shared.audit.session)
    if isinstance(otel, telemetry.NoTelemetry):
        return metrics
    from visor.telemetry.fanout import FanOut

    return FanOut(metrics, otel)


def _open_state(args: argparse.Namespace) -> SharedState | None:
    """The shared store of `--state`, reached once at start: a store that does not answer now is a
    configuration to fix, not a reason to start and refuse every session."""
    if not args.state:
        return None
    try:
        from visor.serve.state import SharedState, StateOptionError
    except ImportError as exc:  # pragma: no cover - the extra is part of the test install
        raise ServeError(
            f"--state needs the 'state' extra (pip install 'visor-mcp-proxy[state]'): {exc}"
        ) from exc
    try:
        state = SharedState(args.state, ttl_seconds=max(2 * args.idle_timeout, 60.0))
        state.ping()
    except ImportError as exc:
        raise ServeError(
            f"--state needs the 'state' extra (pip install 'visor-mcp-proxy[state]'): {exc}"
        ) from exc
    except StateOptionError as exc:
        raise ServeError(str(exc)) from exc
    logs.get_logger("visor.serve").info("state_store", store=state.display, owner=state.owner)
    return state


def _session_factory(
    args: argparse.Namespace,
    shared: _Shared,
    gateway_ref: list[Any],
    reloads: list[PolicyReloaded],
    reports: Telemetry,
    shared_state: SharedState | None = None,
    worker: Worker | None = None,
) -> Any:
    """One MCP session: the pieces `visor run` builds per process, built per session.

    Every session starts with the policy loaded at start-up, then is given the last reload that
    loaded (`reloads`), as the sessions running at that SIGHUP were: the same checks decide
    whether it can be put in force, and its records say so.

    With `--state`, the session's group store and call ledger are on the shared store, and a
    session adopted from another replica (`adoption`) starts from the counts and pins recorded
    there, then replays the client's `initialize` to its own new upstream."""
    from visor.approval.broker import ApprovalBroker
    from visor.approval.directory import DirectoryChannel, DirectoryError, prepare
    from visor.core.checks import PolicyChecks
    from visor.pinfile import read_pins, write_pins
    from visor.relay.proxy import RelayConfig
    from visor.run import _protected_paths, approved_destinations_path, read_pins_json
    from visor.serve.audit import SessionAudit
    from visor.serve.drivers import HttpSessionRelay, SessionRelay
    from visor.serve.session import McpSession
    from visor.session import SessionState
    from visor.telemetry.driver import DriverTelemetry
    from visor.watch import register_approval_dir

    config = RelayConfig(
        max_message_bytes=args.max_message_bytes,
        shutdown_grace=args.shutdown_grace,
        listing_timeout=shared.listing_timeout,
    )
    protected = _protected_paths(args, shared.audit.path, shared.command)
    if worker is not None and args.audit_log:
        # Every worker's log, not only this one's: a tool call through one worker must not name
        # a sibling's chain either (the default folder, $VISOR_HOME/audit, is protected whole).
        from visor.approval.protected import Protected
        from visor.serve.workers import worker_audit_path

        siblings = [worker_audit_path(Path(args.audit_log), i) for i in range(worker.spec.count)]
        protected = Protected.of(protected.dirs, [*protected.files, *siblings], bases=protected.bases)
    approved_path = approved_destinations_path(args, shared.command)
    log = logs.get_logger("visor.serve")
    # The approval directory is checked and announced (for `visor approve`) once per process;
    # each session gets its own broker over it, as each `visor run` does.
    approval_dir: Path | None = None
    if args.approval_dir:
        try:
            approval_dir = prepare(Path(args.approval_dir))
        except DirectoryError as exc:
            raise ServeError(f"approval directory refused: {exc}") from exc
        register_approval_dir(Path(args.approval_dir), args.server_name)
    elicitation = True if args.approval_elicitation else None
    if args.pin_file:
        from visor.pinfile import unwritable

        # As visor run: pins that cannot be saved would be trusted afresh at the next start.
        problem = unwritable(Path(args.pin_file))
        if problem is not None:
            raise ServeError(f"pin file {args.pin_file} refused: {problem}")

    async def new_session(sid: str, adoption: Adoption | None = None) -> McpSession:
        from visor.serve.state import CONVERSATION_MARK, counts_of

        policy = shared.policy
        approvals = ApprovalBroker(
            channels=[DirectoryChannel(approval_dir)] if approval_dir is not None else [],
            timeout=float(policy.settings.approval_timeout_seconds),
            elicitation=elicitation,
        )
        group = None
        if shared_state is not None:
            group = shared_state.group(sid, args.server_name, policy.settings.output_index_max_keys)
        state = SessionState(policy, args.server_name, identity=args.identity, group=group)
        savers: list[Any] = []
        if args.pin_file:
            pin_path = Path(args.pin_file)
            if pin_path.exists():
                state.import_pins(read_pins(pin_path))
            savers.append(lambda data: write_pins(pin_path, data))
        if shared_state is not None:
            link = shared_state.link(sid)
            state.ledger = link
            savers.append(link.save_pins)
            if adoption is not None:
                state.adopt_counts(counts_of(adoption.record))
                if adoption.record.pins:
                    state.adopt_pins(adoption.record.pins)
        pin_saver = None
        if savers:

            def save_pins(data: dict[str, Any]) -> None:
                for saver in savers:
                    saver(data)

            pin_saver = save_pins
        if approved_path.exists():
            state.import_approvals(read_pins_json(approved_path))

        def approvals_saver(data: dict[str, Any]) -> None:
            try:
                write_pins(approved_path, data)
                os.chmod(approved_path, 0o600)
            except OSError as exc:  # the yes still holds for this session
                log.error("approvals_save_failed", path=str(approved_path), error=str(exc))

        audit = SessionAudit(shared.audit, sid)
        guarded = protected
        for read in shared.reload_paths:  # what reloads read before this session began
            guarded = guarded.with_file(read)
        checks = PolicyChecks(
            policy=policy,
            session=state,
            audit_session=shared.audit.session,
            server_name=args.server_name,
            argv=shared.command,
            approvals=approvals,
            protected=guarded,
            save_pins=pin_saver is not None,
        )
        kwargs: dict[str, Any] = {
            "audit": audit, "approvals": approvals, "pin_saver": pin_saver, "approvals_saver": approvals_saver,
            "telemetry": DriverTelemetry(reports),  # each session's verdicts: /metrics, and OTLP if asked
        }  # fmt: skip
        if shared.http is not None:
            relay: Any = HttpSessionRelay(shared.http, shared.command, config, checks, **kwargs)
        else:
            relay = SessionRelay(shared.command, config, checks, **kwargs)
        gateway = gateway_ref[0]
        session = McpSession(
            sid, relay, max_message_bytes=args.max_message_bytes, on_end=gateway.session_ended
        )
        for reloaded in reloads[-1:]:
            relay.feed(reloaded)
        await session.start()
        if adoption is not None:
            from visor.audit import events as audit_events

            audit.append(
                audit_events.session_adopted(
                    server=args.server_name,
                    owner=shared_state.owner if shared_state is not None else "",
                    previous_owner=adoption.previous_owner,
                    calls_total=adoption.record.calls_total,
                    pins=len((adoption.record.pins or {}).get("tools") or {}),
                )
            )
            try:
                if adoption.record.initialize != CONVERSATION_MARK:
                    await session.replay_initialize(adoption.record.initialize)
            except Exception:
                # Not continued here; that does not end it for the replicas that could.
                session.keep_in_store = True
                await session.end(config.shutdown_grace + 10.0)
                raise
        return session

    return new_session


class _Reloader:
    """SIGHUP: the policy file loaded once, off the loop, and handed to every live session's relay
    (each puts it in force between two of its events, or refuses it, on its own record)."""

    def __init__(
        self, source: PolicySource, gateway: Any, shared: _Shared, reloads: list[PolicyReloaded]
    ) -> None:
        self._source = source
        self._gateway = gateway
        self._shared = shared
        self._reloads = reloads
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def request(self) -> None:
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        from visor.audit import events
        from visor.core.events import PolicyReloaded, PolicyReloadFailed

        log = logs.get_logger("visor.serve")
        while True:
            self._again = False
            event = await asyncio.get_running_loop().run_in_executor(None, self._source.load)
            sessions = list(self._gateway.sessions.values())
            log.info("policy_reload", sessions=len(sessions), loaded=isinstance(event, PolicyReloaded))
            if event.path is not None and event.path not in self._shared.reload_paths:
                self._shared.reload_paths.append(event.path)
            if isinstance(event, PolicyReloaded):
                self._reloads[:] = [event]
            elif not sessions:
                # No session to record it: the attempt is on record for the process.
                log.error(
                    "policy_reload_failed", error=event.error, detail="the policy in force is unchanged"
                )
                assert isinstance(event, PolicyReloadFailed)
                previous = self._reloads[-1].policy.sha256 if self._reloads else self._shared.policy.sha256
                self._shared.audit.append(
                    events.policy_reload(
                        source=event.source,
                        previous=previous,
                        policy=event.sha256,
                        ok=False,
                        error=event.error,
                    )
                )
            for session in sessions:
                if not session.ended and not session.relay.closed:
                    session.relay.feed(event)
            if not self._again:
                return

    async def stop(self) -> None:
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


def serve_command(args: argparse.Namespace) -> int:
    logs.configure(args.log_level, args.log_format)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    http = None
    try:
        if args.url is not None or args.header:
            from visor.http.options import upstream_config

            try:
                http, command = upstream_config(args, command)
            except ValueError as exc:
                raise ServeError(str(exc)) from exc
        elif not command:
            raise ServeError(
                "no server command given; usage: visor serve [OPTIONS] (-- COMMAND [ARGS...] | --url URL)"
            )
        host, port = parse_listen(args.listen)
        token = _token(args, host)
        if not 0 < args.idle_timeout <= 86400:
            raise ServeError("--idle-timeout must be above 0 and at most 86400 seconds")
        if args.replica_id is not None and not REPLICA_ID.fullmatch(args.replica_id):
            raise ServeError(
                f"--replica-id {args.replica_id[:40]!r}: 1 to 32 letters, digits or '_' (it begins every "
                "session id, which load balancers match)"
            )
        from visor.serve.workers import MAX_WORKERS, Worker, WorkerSpec, WorkerSpecError

        if args.workers > MAX_WORKERS:
            raise ServeError(f"--workers {args.workers}: at most {MAX_WORKERS}")
        worker = None
        if args.worker_of is not None:
            try:
                worker = Worker(WorkerSpec.parse(args.worker_of))
            except (WorkerSpecError, OSError) as exc:
                raise ServeError(str(exc)) from exc
    except ServeError as exc:
        print(f"visor serve: {exc}", file=sys.stderr)
        return 2
    if worker is None and args.workers > 1:
        from visor.serve.workers import supervise

        return supervise(args, host, port, sys.argv[1:])
    from visor.serve.gateway import GatewayConfig

    config = GatewayConfig(
        host=host,
        port=port,
        token=token,
        allowed_origins=frozenset(args.allow_origin),
        max_message_bytes=args.max_message_bytes,
        max_sessions=args.max_sessions,
        max_in_flight=args.max_in_flight,
        idle_timeout=args.idle_timeout,
        end_grace=args.shutdown_grace + 10.0,
        server_name=args.server_name,
        replica_id=args.replica_id,
    )
    from visor.relay import loop as event_loop

    try:
        return event_loop.run(_serve(args, command, http, config, worker))
    except ServeError as exc:
        print(f"visor serve: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"visor serve: cannot listen on {args.listen}: {exc.strerror or exc}", file=sys.stderr)
        return 1


def connection_cap(max_sessions: int, max_in_flight: int) -> int:
    """The HTTP server's `max_connections` for `max_sessions` sessions of up to `max_in_flight`
    requests in flight each.

    Legitimate use must never be refused: each session may hold its requests in flight and its
    event stream (GET) at once, each on a connection of its own, and 64 more leave room for
    clients opening sessions, probing, or retrying. But the connections must not take the
    descriptors the rest of the process needs (upstream processes and their pipes, the audit log,
    the state store): at most half the soft RLIMIT_NOFILE, whatever the sessions ask. And never
    fewer than 64, so a tiny limit or configuration still serves."""
    import resource

    wanted = max_sessions * (max_in_flight + 1) + 64
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY:
        wanted = min(wanted, soft // 2)
    return max(wanted, 64)


def _raise_descriptor_limit(log: Any) -> None:
    """Raise this process's soft limit on open files to its hard limit (as Go's runtime does).

    A gateway holds a descriptor per client connection and three per stdio upstream; the common
    soft limit of 1024 would cap its connections (`connection_cap`, half of it) below what its
    own session limits allow. The hard limit is the operator's, and stays."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("descriptor_limit_kept", soft=soft, hard=hard, error=str(exc))


async def _serve(
    args: argparse.Namespace,
    command: list[str],
    http: HttpUpstreamConfig | None,
    config: GatewayConfig,
    worker: Worker | None = None,
) -> int:
    from visor.http.server import HttpServer
    from visor.serve.gateway import Gateway

    log = logs.get_logger("visor.serve")
    if args.unsafe_no_fsync:
        log.warning("audit_not_durable", detail="--unsafe-no-fsync: allows are not fsync'd before relay")
    shared_state = _open_state(args)
    shared = _open_shared(args, command, http, worker)
    gateway_ref: list[Any] = []
    reloads: list[PolicyReloaded] = []
    try:
        metrics = GatewayMetrics()
        reports = _telemetry(args, shared, metrics)
        shared.audit.observe_fsync(reports.fsynced)
        factory = _session_factory(args, shared, gateway_ref, reloads, reports, shared_state, worker)
    except BaseException:
        # A refused option must not leave the audit writer's thread running.
        await shared.audit.close()
        raise
    gateway = Gateway(config, factory, metrics, state=shared_state)
    gateway_ref.append(gateway)
    if worker is not None:
        worker.attach(gateway)
    _raise_descriptor_limit(log)
    # A client that goes away ends its handler: a GET stream no one reads is closed, not kept.
    server = HttpServer(
        gateway.handle,
        max_body=config.max_message_bytes,
        max_connections=connection_cap(config.max_sessions, config.max_in_flight),
    )
    metrics.watch_connections(lambda: (len(server.connections), server.refused))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    from visor.relay.reload import PolicySource

    reloader = _Reloader(PolicySource(str(args.policy) if args.policy else None), gateway, shared, reloads)
    loop.add_signal_handler(signal.SIGHUP, reloader.request)
    expiry = loop.create_task(gateway.expire_idle())
    try:
        if worker is not None:
            # The supervisor's socket, and the ready line is the supervisor's to print.
            await worker.start(server, stop)
        else:
            port = await server.listen(config.host, config.port)
            shown = f"[{config.host}]" if ":" in config.host else config.host
            print(f"visor serve: listening on http://{shown}:{port}/mcp", file=sys.stderr, flush=True)
        await stop.wait()
        log.info("serve_stopping", sessions=len(gateway.sessions))
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        await reloader.stop()
        expiry.cancel()
        with contextlib.suppress(BaseException):
            await expiry
        await gateway.close()
        await server.close(timeout=1.0)
        if worker is not None:
            await worker.close()
        await shared.audit.close()
        if shared_state is not None:
            shared_state.close()
    return 0
