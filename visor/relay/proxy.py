"""The stdio driver: a client's pipes and a server's, around one `SessionCore`.

Everything about what goes where is decided by the core (visor/core/); this
module performs its actions and feeds back what happened. Both directions are
driven by protocol callbacks rather than tasks: bytes arrive in
`data_received` and are handed to the core as one event per read, so one
read's worth of messages is judged as one batch and written with one system
call per direction. Back-pressure is transport flow control: when the
server's stdin (or the client's stdout) buffers past its high-water mark, or
too many messages wait behind a held call, reading from the client pauses.

The asynchronous steps live here, not in the core: audit commits (the
writer thread resolves a future), questions to humans (the approval broker's
tasks), timers, and Visor's own requests to the client (elicitation).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import os
import signal
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from visor.approval.model import new_rpc_id
from visor.core.events import (
    Action,
    Announce,
    AppendRecord,
    ApprovalAnswered,
    AskHuman,
    CancelTimer,
    ClientData,
    ClientEof,
    ClientGone,
    CloseServerInput,
    Closing,
    CommitDone,
    CommitFailed,
    CommitRecord,
    DeliverReply,
    Event,
    SaveApprovals,
    SavePins,
    SendToClient,
    SendToServer,
    ServerData,
    ServerEof,
    ServerInputLost,
    StartTimer,
    StopServer,
    Timer,
    TimerFired,
    VisorForget,
    VisorNotify,
    VisorRequest,
    WithdrawApproval,
)
from visor.core.passthrough import LISTING_TIMEOUT_SECONDS, Checks
from visor.core.session import CoreConfig, SessionCore
from visor.logs import get_logger
from visor.relay import upstream as upstream_mod

if TYPE_CHECKING:
    from visor.approval.broker import ApprovalBroker, Outcome
    from visor.approval.model import ApprovalRequest
    from visor.audit.writer import AuditWriter
    from visor.core.calls import CallContext, ToolCallState
    from visor.relay.reload import PolicySource
    from visor.telemetry.driver import DriverTelemetry

log = get_logger("visor.relay")
# Lines about records and approvals keep the name they always had.
gate_log = get_logger("visor.gate")

_READ_CHUNK = 256 * 1024
# How often `--watch-policy` looks at the policy file.
_POLICY_POLL_SECONDS = 1.0
# How long a changed policy file must stay the same before `--watch-policy` loads it: an
# editor that writes in place leaves a prefix between two writes, and a prefix that ends
# before a tool's rules is a valid, weaker policy.
_POLICY_SETTLE_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class RelayConfig:
    max_message_bytes: int = 16 * 1024 * 1024
    shutdown_grace: float = 5.0
    term_grace: float = 2.0
    max_pending: int = 10_000
    # Messages held behind a call before reading from the client pauses.
    max_backlog: int = 4096
    # How long a call made before any listing waits for Visor's own tools/list.
    listing_timeout: float = LISTING_TIMEOUT_SECONDS


class _Writer:
    """Whole lines to one transport, gathered and written with one call per batch.

    A pipelined client sends many messages per read, and one write system
    call per message would cost more than everything else Visor does with them.
    """

    __slots__ = ("_batch", "_loop", "_scheduled", "_transport")

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: asyncio.WriteTransport) -> None:
        self._loop = loop
        self._transport = transport
        self._batch: list[bytes] = []
        self._scheduled = False

    def write(self, line: bytes) -> None:
        self._batch.append(line)
        self._batch.append(b"\n")
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        batch = self._batch
        if batch:
            self._batch = []
            if not self._transport.is_closing():
                self._transport.writelines(batch)


@dataclass(slots=True)
class _Pipes:
    """The four ends of the wire once connected, and the batching writers on the two that Visor writes."""

    server_in: asyncio.WriteTransport
    server_out: asyncio.ReadTransport
    client_out: asyncio.WriteTransport
    # None when the client's stdout is a file (written directly, no flow control).
    client_out_proto: _WriteProtocol | None
    to_server: _Writer
    to_client: _Writer


class _ReadProtocol(asyncio.Protocol):
    def __init__(self, on_data: Callable[[bytes], None], on_eof: Callable[[], None]) -> None:
        self._on_data = on_data
        self._on_eof = on_eof
        self._ended = False

    def data_received(self, data: bytes) -> None:
        self._on_data(data)

    def eof_received(self) -> bool:
        self._end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            self._on_eof()


class _WriteProtocol(asyncio.Protocol):
    def __init__(
        self, pause: Callable[[], None], resume: Callable[[], None], lost: Callable[[], None]
    ) -> None:
        self._pause = pause
        self._resume = resume
        self._lost = lost
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def pause_writing(self) -> None:
        self._pause()

    def resume_writing(self) -> None:
        self._resume()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        self._lost()


class _FileWriteTransport(asyncio.WriteTransport):
    """Stdout that the event loop cannot watch (a regular file, /dev/null): write directly.

    Such writes cannot block for long. A failed write (a full disk, a
    descriptor opened for reading only) ends the client's side of the
    session the way a closed pipe does, through `lost`.
    """

    def __init__(self, fd: int, lost: Callable[[], None]) -> None:
        super().__init__()
        self._fd = fd
        self._closing = False
        self._lost = lost

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        except OSError as exc:
            log.warning("client_stdout_failed", error=exc.strerror or repr(exc))
            self._closing = True
            asyncio.get_running_loop().call_soon(self._lost)

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._closing = True

    def get_write_buffer_size(self) -> int:
        return 0


_PIPE_SIZE = 1 << 20
_F_SETPIPE_SZ = 1031


def _pollable(fd: int) -> bool:
    """Whether the event loop can watch `fd`: a pipe, a socket or a terminal.

    Anything else (a regular file, /dev/null and other character devices) is
    refused by epoll, and uvloop aborts the whole process on it; those are
    read in a thread and written directly instead.
    """
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or (stat.S_ISCHR(mode) and os.isatty(fd))


def _fd_kind(fd: int) -> str:
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "not a pipe"


def _grow_pipe(fd: int) -> None:
    """Ask for 1 MiB pipe buffers: large messages then cross in a few system calls, not hundreds."""
    with contextlib.suppress(OSError):
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_SIZE)


class _ClientLink:
    """Visor's own messages to the client (elicitation requests, progress, cancellation),
    for the approval broker. The core writes them and matches the answers; the
    futures the broker awaits are kept here, by request id."""

    def __init__(self, relay: Relay) -> None:
        self._relay = relay

    def request(self, method: str, params: dict[str, Any]) -> tuple[str, asyncio.Future[dict[str, Any]]]:
        relay = self._relay
        rpc_id = new_rpc_id()
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        relay.replies[rpc_id] = fut
        relay.feed(VisorRequest(rpc_id, method, params))
        return rpc_id, fut

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self._relay.feed(VisorNotify(method, params))

    def forget(self, rpc_id: str) -> None:
        self._relay.replies.pop(rpc_id, None)
        self._relay.feed(VisorForget(rpc_id))

    def client_name(self) -> str | None:
        return self._relay.core.client_name()

    def client_capabilities(self) -> dict[str, Any] | None:
        """What the client declared in initialize (a call's _meta never changes it)."""
        return self._relay.core.client_capabilities


@dataclass(frozen=True, slots=True)
class ServerEnd:
    """How the server side ended: what `visor run` exits with, and the `session_end` log line's fields."""

    status: int
    detail: dict[str, Any]
    failed: bool = False


@dataclass(frozen=True, slots=True)
class ServerPort:
    """A server in this process instead of behind two pipes: what a `ServerLink.start` may return
    where it would return the two descriptors (`visor run --url`, visor/http/relay.py). The
    server-side counterpart of `ClientPort`.

    `input` stands where the server's stdin pipe would. The relay sets its protocol
    (`set_protocol`) and writes whole lines to it; the transport calls that protocol's
    `pause_writing` / `resume_writing` as its server falls behind and catches up (the relay then
    holds the client back, as when the stdin pipe is full), and `connection_lost` if it breaks.
    The relay closes it as it would close the server's stdin.

    `output` stands where the server's stdout pipe would. The relay sets its protocol and the
    transport hands the server's bytes to that protocol's `data_received`, and its end to
    `eof_received`, once; never while paused (`pause_reading`, as the relay does when its client
    reads slowly), and nothing after the relay closed it.
    """

    input: asyncio.WriteTransport
    output: asyncio.ReadTransport


class ServerLink:
    """What stands behind the server's two pipes: the relay writes the server's input to one
    descriptor and reads its output from the other, whatever produces them.

    `ProcessLink` (the default) is a child process; `visor run --url` puts an HTTP session there
    (visor/http/relay.py), attached in memory (`ServerPort`). The relay owns both descriptors once
    `start` returns them.
    """

    async def start(self) -> tuple[int, int] | ServerPort:
        """Start the server: (the descriptor of its input, the descriptor of its output), or a port."""
        raise NotImplementedError

    async def finish(self) -> ServerEnd:
        """The server's output ended: let it end in order and say how it ended."""
        raise NotImplementedError

    async def stop(self, server_eof: asyncio.Future[None]) -> None:
        """The client's side ended and the server's input is closed: give the server its grace to
        end (its output's EOF sets `server_eof`), then end it. The relay ends the output itself if
        it is still open a second after this returns."""
        raise NotImplementedError

    async def close(self) -> None:
        """Every exit path, an exception included: nothing of the server survives."""


class ProcessLink(ServerLink):
    """A server child process started from argv (visor/relay/upstream.py)."""

    def __init__(self, argv: list[str], config: RelayConfig) -> None:
        self.argv = argv
        self.config = config
        self.upstream: upstream_mod.Upstream | None = None

    @property
    def pid(self) -> int | None:
        return self.upstream.pid if self.upstream is not None else None

    async def start(self) -> tuple[int, int]:
        up = self.upstream = await upstream_mod.spawn(self.argv)
        return up.stdin_fd, up.stdout_fd

    async def finish(self) -> ServerEnd:
        assert self.upstream is not None
        returncode = await upstream_mod.stop(
            self.upstream, self.config.shutdown_grace, self.config.term_grace
        )
        return ServerEnd(upstream_mod.exit_status(returncode), {"returncode": returncode})

    async def stop(self, server_eof: asyncio.Future[None]) -> None:
        # The server may keep stdout open after its stdin closed: stdin, then signals.
        assert self.upstream is not None
        await upstream_mod.stop(self.upstream, self.config.shutdown_grace, self.config.term_grace)

    async def close(self) -> None:
        up = self.upstream
        if up is not None:
            # The process group is killed and the server reaped (no zombie).
            upstream_mod.kill_group(up.pid)
            await upstream_mod.reap(up)


@dataclass(frozen=True, slots=True)
class ClientPort:
    """A client in this process instead of behind two pipes: what `Relay.run_attached` connects
    where `Relay.run` connects the client's stdin and stdout (the gateway's MCP sessions,
    visor/serve/session.py). The client-side counterpart of `ServerLink`.

    `input` stands where the client's stdin pipe would. The relay pauses, resumes and closes it
    exactly as it does that pipe (the server's stdin full, too many messages held behind a call,
    the client gone); it starts paused, and the relay resumes it once it can take bytes. The
    client's bytes reach the relay through `Relay.client_data`, and its end through
    `Relay.client_eof`, which the port's owner calls: data only while the input is not paused, the
    end once. After the relay closed the input, neither (the relay sees its own close as the end of
    the input, as with a pipe).

    `output` stands where the client's stdout pipe would. The relay sets its protocol
    (`set_protocol`) and writes whole lines to it; the transport calls that protocol's
    `pause_writing` / `resume_writing` as its reader falls behind and catches up (the relay then
    stops reading the server, as when the client's stdout pipe is full), and `connection_lost`
    once it is closed (the relay closes it as the session ends).
    """

    input: asyncio.ReadTransport
    output: asyncio.WriteTransport


class Relay:
    """One `visor run` session between a client's pipes and a server's."""

    def __init__(
        self,
        argv: list[str],
        config: RelayConfig,
        checks: Checks,
        *,
        audit: AuditWriter | None = None,
        approvals: ApprovalBroker | None = None,
        pin_saver: Callable[[dict[str, Any]], None] | None = None,
        approvals_saver: Callable[[dict[str, Any]], None] | None = None,
        telemetry: DriverTelemetry | None = None,
        policy_source: PolicySource | None = None,
        link: ServerLink | None = None,
        handle_signals: bool = True,
    ) -> None:
        self.argv = argv
        # What stands behind the server's pipes (a child process unless told otherwise).
        self.link: ServerLink = link if link is not None else ProcessLink(argv, config)
        # One `visor run` is one session and owns the process's SIGINT/SIGTERM/SIGHUP; a
        # gateway running many relays in one loop handles signals itself (False).
        self.handle_signals = handle_signals
        # Where SIGHUP reloads the policy from; None: SIGHUP keeps its default action.
        self.policy_source = policy_source
        self._reloading: asyncio.Task[None] | None = None
        self._poller: asyncio.Task[None] | None = None
        self._reload_again = False
        self.config = config
        self.checks = checks
        # `audit` and `approvals` are also what visor.watch.announce reads.
        self.audit = audit
        # What a failed append raises; the audit writer's module is imported only with an audit log
        # (`--no-checks` has none).
        self._append_errors: tuple[type[Exception], ...] = (ValueError,)
        if audit is not None:
            from visor.audit.writer import AuditUnhealthy

            self._append_errors = (AuditUnhealthy, ValueError)
        self.approvals = approvals
        self._pin_saver = pin_saver
        self._approvals_saver = approvals_saver
        self._telemetry = telemetry
        self.core = SessionCore(
            checks,
            CoreConfig(
                max_message_bytes=config.max_message_bytes,
                max_pending=config.max_pending,
                listing_timeout=config.listing_timeout,
            ),
        )
        self.closed = False
        self._pause_reasons: set[str] = set()
        # Events that arrive while actions are being performed wait their turn.
        self._queued: collections.deque[Event] = collections.deque()
        self._performing = False
        # The asynchronous steps in progress, by the core's tokens.
        self._asks: dict[ToolCallState, asyncio.Task[None]] = {}
        self._withdrawn: set[asyncio.Task[None]] = set()
        self._background: set[asyncio.Task[None]] = set()
        self._timers: dict[Timer, asyncio.TimerHandle] = {}
        # Calls whose allow record was made durable (the writer counts hand-offs, not calls).
        self._committed = 0
        self.replies: dict[str, asyncio.Future[dict[str, Any]]] = {}
        # Set by run(): the loop, the server's output's end, the connected pipes.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server_eof: asyncio.Future[None] | None = None
        self._pipes: _Pipes | None = None
        # The server's side is read before the client's is connected (that connect yields to the
        # loop): what a server that writes and exits at once sends meanwhile waits here.
        self._before_connected: list[Callable[[], None]] = []
        self._client_in: asyncio.ReadTransport | None = None
        # The session's first records are written before anything can fail.
        self._perform(self.core.start())

    # ------------------------------------------------------------ the core
    def feed(self, event: Event) -> None:
        """Hand one event to the core and perform what it answers, in order."""
        if self._performing:
            self._queued.append(event)
            return
        self._performing = True
        # Everything this event leads to reaches the audit thread as one wake-up.
        held = self.audit.batch() if self.audit is not None else contextlib.nullcontext()
        try:
            with held:
                self._perform(self._handle(event))
                while self._queued:
                    self._perform(self._handle(self._queued.popleft()))
        finally:
            self._performing = False
        if "backlog" in self._pause_reasons and not self.core.server_backlog:
            self._resume_client("backlog")

    def _handle(self, event: Event) -> list[Action]:
        if self._telemetry is not None:
            self._telemetry.before(event)
        return self.core.handle(event)

    def _perform(self, actions: list[Action]) -> None:
        # The allow records of one batch (one read from the client) go to the
        # writer as one hand-off: all but the last appended, the last submitted.
        # The writer writes in order and an fsync covers everything written
        # before it, so the last one durable means every one is.
        commits_left = sum(1 for a in actions if type(a) is CommitRecord)
        group: list[tuple[ToolCallState, int]] = []
        for action in actions:
            if type(action) is CommitRecord:
                commits_left -= 1
            try:
                self._perform_one(action, group, last=commits_left == 0)
                if self._telemetry is not None:
                    self._telemetry.performed(action)
            except Exception:
                # One action that fails (a pin file that cannot be written) must not
                # stop the others, nor escape into the transport's callback.
                log.exception("action_failed", action=type(action).__name__)

    def _perform_one(self, action: Action, group: list[tuple[ToolCallState, int]], *, last: bool) -> None:
        match action:
            case SendToServer(line=line):
                self._wire.to_server.write(line)
            case SendToClient(line=line):
                self._wire.to_client.write(line)
            case AppendRecord(event=event):
                self._append(event)
            case CommitRecord():
                self._commit(action, group, last=last)
            case Announce(event=event, logger=logger):
                from visor.watch import announce

                announce(self, event, get_logger(logger))
            case AskHuman():
                self._ask(action)
            case WithdrawApproval(call=call):
                task = self._asks.pop(call, None)
                if task is not None:
                    task.cancel()
                    self._withdrawn.add(task)
                    task.add_done_callback(self._withdrawn.discard)
            case StartTimer(timer=timer, seconds=seconds):
                assert self._loop is not None
                self._timers[timer] = self._loop.call_later(seconds, self._fire, timer)
            case CancelTimer(timer=timer):
                handle = self._timers.pop(timer, None)
                if handle is not None:
                    handle.cancel()
            case DeliverReply(rpc_id=rpc_id, reply=reply):
                fut = self.replies.pop(rpc_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(reply)
            case SavePins(data=data):
                if self._pin_saver is not None:
                    self._pin_saver(data)
            case SaveApprovals(data=data):
                if self._approvals_saver is not None:
                    self._approvals_saver(data)
            case CloseServerInput():
                self._wire.to_server.flush()
                self._wire.server_in.close()
            case StopServer():
                assert self._loop is not None
                task = self._loop.create_task(self._escalate_if_stuck())
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            case _:
                raise TypeError(f"not a session action: {action!r}")

    @property
    def _wire(self) -> _Pipes:
        assert self._pipes is not None, "the relay is not connected yet"
        return self._pipes

    def _append(self, event: dict[str, Any]) -> None:
        if self.audit is None:
            return
        try:
            self.audit.append(event)
        except self._append_errors as exc:
            # Later allows fail on their own commit; a lost non-allow record is logged.
            gate_log.error("audit_append_failed", error=str(exc), audit_event=event.get("event"))

    def _commit(self, action: CommitRecord, group: list[tuple[ToolCallState, int]], *, last: bool) -> None:
        """Hand one allow record to the writer; `group`: the batch's records appended before it."""
        call = action.call
        if self.audit is None:
            self.feed(CommitFailed(call, "no audit log"))
            return
        if not last:
            try:
                record = self.audit.append(action.event)
            except Exception as exc:  # unhealthy, closed, or a record that cannot be built: fail closed
                self.feed(CommitFailed(call, str(exc)))
                return
            group.append((call, record["seq"]))
            return
        members, group[:] = group[:], []
        try:
            # Sole: this call is the session's only one in flight and nothing else waits to be
            # judged; the writer may then make it durable on this thread (visor/audit/writer.py).
            sole = not members and not self._queued and len(self.core.pending) == 1
            fut = self.audit.submit(action.event, sole=sole)
        except Exception as exc:
            for member, _ in members:
                self.feed(CommitFailed(member, str(exc)))
            self.feed(CommitFailed(call, str(exc)))
            return

        def durable(f: asyncio.Future[dict[str, Any]]) -> None:
            exc = f.exception()
            if exc is not None:
                for member, _ in members:
                    self.feed(CommitFailed(member, str(exc)))
                self.feed(CommitFailed(call, str(exc)))
                return
            self._committed += len(members) + 1
            for member, seq in members:
                self.feed(CommitDone(member, seq))
            self.feed(CommitDone(call, f.result()["seq"]))

        if fut.done():
            # Made durable on this thread (a sole call): go on now, not a turn of the loop later.
            # The feed in progress takes these events after the actions it is performing.
            durable(fut)
        else:
            fut.add_done_callback(durable)

    def _ask(self, action: AskHuman) -> None:
        assert self._loop is not None
        self._asks[action.call] = self._loop.create_task(
            self._wait_for_human(action.call, action.request, action.ctx, action.out_of_band_only)
        )

    async def _wait_for_human(
        self, call: ToolCallState, request: ApprovalRequest, ctx: CallContext, out_of_band_only: bool
    ) -> None:
        outcome: Outcome | None = None
        broker = self.approvals
        if broker is not None:
            try:
                outcome = await broker.ask(request, ctx, out_of_band_only=out_of_band_only)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                gate_log.error("approval_failed", error=repr(exc), tool=call.msg.tool)
        if self._asks.get(call) is asyncio.current_task():
            del self._asks[call]
        self.feed(ApprovalAnswered(call, outcome))

    def _fire(self, timer: Timer) -> None:
        self._timers.pop(timer, None)
        self.feed(TimerFired(timer))

    async def close(self) -> None:
        """The session is over: held calls are withdrawn and recorded, the log closed."""
        if self.closed:
            return
        self.closed = True
        self.feed(Closing())
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        # Questions still open are withdrawn (their pending files deleted) before the log closes.
        tasks = [*self._asks.values(), *self._withdrawn]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        audit = self.audit
        if audit is None:
            return
        await audit.close()
        stats = audit.stats
        gate_log.info(
            "audit_stats",
            commits=self._committed,
            fsyncs=stats.fsync_count,
            fsyncs_on_loop=stats.caller_fsyncs,
            records=stats.records_written,
            largest_group=stats.largest_group,
            healthy=audit.healthy,
        )

    # ------------------------------------------------------------------ setup
    async def run(self, client_in_fd: int, client_out_fd: int) -> int:
        """Start the server, relay until both sides ended, and return the exit status."""
        return await self._run((client_in_fd, client_out_fd))

    async def run_attached(self, client: ClientPort) -> int:
        """`run` for a client in this process (`ClientPort`): the same relay, the same ends."""
        return await self._run(client)

    def client_data(self, data: bytes) -> None:
        """Bytes from a `ClientPort`'s client, as if read from its stdin."""
        self._on_client_data(data)

    def client_eof(self) -> None:
        """A `ClientPort`'s client has no more to send, as if its stdin closed."""
        self._on_client_eof()

    async def _run(self, client: tuple[int, int] | ClientPort) -> int:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._server_eof = loop.create_future()
        try:
            server = await self.link.start()
        except BaseException:
            if isinstance(client, tuple):
                # The relay never took the client's pipe ends: they are closed here.
                os.close(client[0])
                os.close(client[1])
            await self.link.close()
            raise
        signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if self.handle_signals else ()
        try:
            await self._connect(loop, server, client)
            if self.approvals is not None:
                self.approvals.link = _ClientLink(self)
            if self.handle_signals:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(sig, self._on_signal, sig)
                self._watch_hangup(loop)
            return await self._lifecycle()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
            await self._stop_reloading()
            await self.link.close()

    async def _connect(
        self,
        loop: asyncio.AbstractEventLoop,
        server: tuple[int, int] | ServerPort,
        client: tuple[int, int] | ClientPort,
    ) -> None:
        for fd in (
            *(server if isinstance(server, tuple) else ()),
            *(client if isinstance(client, tuple) else ()),
        ):
            _grow_pipe(fd)
        server_in_proto = _WriteProtocol(
            lambda: self._pause_client("server_stdin"),
            lambda: self._resume_client("server_stdin"),
            self._on_server_stdin_lost,
        )
        server_out_proto = _ReadProtocol(self._on_server_data, self._on_server_eof)
        server_in: asyncio.WriteTransport
        server_out: asyncio.ReadTransport
        if isinstance(server, ServerPort):
            server_in, server_out = server.input, server.output
            server_in.set_protocol(server_in_proto)
            server_out.set_protocol(server_out_proto)
        else:
            server_in_fd, server_out_fd = server
            server_in, _ = await loop.connect_write_pipe(
                lambda: server_in_proto, os.fdopen(server_in_fd, "wb", 0)
            )
            server_out, _ = await loop.connect_read_pipe(
                lambda: server_out_proto, os.fdopen(server_out_fd, "rb", 0)
            )
        client_out: asyncio.WriteTransport
        client_out_proto: _WriteProtocol | None = None
        if isinstance(client, ClientPort):
            client_out = client.output
            client_out_proto = _WriteProtocol(
                lambda: self._pause_server("client_stdout"),
                lambda: self._resume_server("client_stdout"),
                self._on_client_gone,
            )
            client_out.set_protocol(client_out_proto)
        elif not _pollable(client_out_fd := client[1]):
            log.info("client_stdout_not_a_pipe", kind=_fd_kind(client_out_fd))
            client_out = _FileWriteTransport(client_out_fd, self._on_client_gone)
        else:
            proto = client_out_proto = _WriteProtocol(
                lambda: self._pause_server("client_stdout"),
                lambda: self._resume_server("client_stdout"),
                self._on_client_gone,
            )
            client_out, _ = await loop.connect_write_pipe(lambda: proto, os.fdopen(client_out_fd, "wb", 0))
        self._pipes = _Pipes(
            server_in,
            server_out,
            client_out,
            client_out_proto,
            _Writer(loop, server_in),
            _Writer(loop, client_out),
        )
        early, self._before_connected = self._before_connected, []
        for handle in early:
            handle()

        if isinstance(client, ClientPort):
            self._client_in = client.input
            client.input.resume_reading()
        elif not _pollable(client_in_fd := client[0]):
            log.info("client_stdin_not_a_pipe", kind=_fd_kind(client_in_fd))
            loop.create_task(self._read_file(client_in_fd))
        else:
            self._client_in, _ = await loop.connect_read_pipe(
                lambda: _ReadProtocol(self._on_client_data, self._on_client_eof),
                os.fdopen(client_in_fd, "rb", 0),
            )

    async def _read_file(self, fd: int) -> None:
        # A regular file or a device cannot be watched by the event loop; read it in a thread.
        loop = asyncio.get_running_loop()
        while True:
            try:
                data = await loop.run_in_executor(None, os.read, fd, _READ_CHUNK)
            except OSError as exc:
                log.warning("client_stdin_failed", error=exc.strerror or repr(exc))
                break
            if not data or self.core.client_closed:
                break
            self._on_client_data(data)
            while self._pause_reasons and not self.core.client_closed:
                await asyncio.sleep(0.001)
        self._on_client_eof()

    async def _lifecycle(self) -> int:
        assert self._server_eof is not None
        await self._server_eof
        end = await self.link.finish()
        await self._close_client_out()
        await self.close()
        (log.error if end.failed else log.info)("session_end", **end.detail)
        return end.status

    async def _close_client_out(self) -> None:
        wire = self._wire
        wire.to_client.flush()
        wire.client_out.close()
        if wire.client_out_proto is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(wire.client_out_proto.closed), 5.0)

    # ----------------------------------------------------------- flow control
    def _pause_client(self, reason: str) -> None:
        if not self._pause_reasons and self._client_in is not None:
            self._client_in.pause_reading()
        self._pause_reasons.add(reason)

    def _resume_client(self, reason: str) -> None:
        self._pause_reasons.discard(reason)
        if not self._pause_reasons and self._client_in is not None and not self.core.client_closed:
            self._client_in.resume_reading()

    def _pause_server(self, reason: str) -> None:
        self._wire.server_out.pause_reading()
        # Visor answers some client messages itself (rejections, denials): a
        # client that does not read them must not make them pile up here.
        self._pause_client(reason)

    def _resume_server(self, reason: str) -> None:
        if not self.core.server_closed:
            self._wire.server_out.resume_reading()
        self._resume_client(reason)

    # ---------------------------------------------------------------- events
    def _on_client_data(self, data: bytes) -> None:
        self.feed(ClientData(data))
        wire = self._wire
        wire.to_server.flush()
        wire.to_client.flush()
        if self.core.server_backlog > self.config.max_backlog:
            self._pause_client("backlog")

    def _on_client_eof(self) -> None:
        self.feed(ClientEof())

    def _on_client_gone(self) -> None:
        # The client stopped reading our stdout: nobody can receive answers.
        if not self.core.client_closed:
            if self._client_in is not None:
                self._client_in.close()
            self.feed(ClientGone())

    def _on_signal(self, sig: int) -> None:
        log.info("signal_received", signal=signal.Signals(sig).name)
        if self._client_in is not None and not self.core.client_closed:
            self._client_in.pause_reading()
        self.feed(ClientGone())

    # ---------------------------------------------------------------- reloads
    def _watch_hangup(self, loop: asyncio.AbstractEventLoop) -> None:
        """SIGHUP reloads the policy (only when there is one to reload); with `watch`, so does
        a change of the file."""
        source = self.policy_source
        if source is not None:
            loop.add_signal_handler(signal.SIGHUP, self.request_reload)
            if source.watch and source.path is not None:
                self._poller = loop.create_task(self._poll_policy(source))

    async def _poll_policy(self, source: PolicySource) -> None:
        # One stat a second: cheaper and more portable than inotify, and an editor's
        # rename-over-the-file is seen the same way as a write in place.
        loaded = source.stamp()
        changed: tuple[int, int, int] | None = None  # the stamp of a change not loaded yet
        since = 0.0
        while not self.closed:
            await asyncio.sleep(_POLICY_POLL_SECONDS)
            now = source.stamp()
            if now is None or now == loaded:
                changed = None
                continue
            if now != changed:
                # still being written, maybe: look again once it has held still
                changed, since = now, time.monotonic()
                continue
            if time.monotonic() - since >= _POLICY_SETTLE_SECONDS:
                loaded, changed = now, None
                self.request_reload()

    def request_reload(self) -> None:
        """Load the policy again off the event loop, then swap it in between two events.

        A request while one is loading runs once more after it (the file may have
        changed again since the first was read); never two loads at once."""
        if self.policy_source is None or self.closed or self._loop is None:
            return
        log.info("policy_reload_requested", source=self.policy_source.path or "<default>")
        if self._reloading is not None and not self._reloading.done():
            self._reload_again = True
            return
        self._reloading = self._loop.create_task(self._reload())

    async def _reload(self) -> None:
        source = self.policy_source
        assert source is not None and self._loop is not None
        while True:
            self._reload_again = False
            event = await self._loop.run_in_executor(None, source.load)
            if self.closed:
                return
            self.feed(event)
            if not self._reload_again:
                return

    async def _stop_reloading(self) -> None:
        for task in (self._poller, self._reloading):
            if task is not None and not task.done():
                # The session is over: a policy still loading is never put in force.
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def _escalate_if_stuck(self) -> None:
        # The server may keep its output open after its input closed: stop it in order.
        server_eof = self._server_eof
        assert server_eof is not None
        await self.link.stop(server_eof)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(server_eof), 1.0)
        if not server_eof.done():
            self._wire.server_out.close()
            server_eof.set_result(None)

    def _on_server_stdin_lost(self) -> None:
        if self._pipes is None:
            self._before_connected.append(self._on_server_stdin_lost)
            return
        if not self.core.stopping:
            log.info("server_stdin_closed")
        self.feed(ServerInputLost())

    def _on_server_data(self, data: bytes) -> None:
        if self._pipes is None:
            self._before_connected.append(lambda: self._on_server_data(data))
            return
        self.feed(ServerData(data))
        self._wire.to_client.flush()

    def _on_server_eof(self) -> None:
        if self._pipes is None:
            self._before_connected.append(self._on_server_eof)
            return
        self.feed(ServerEof())
        if self._server_eof is not None and not self._server_eof.done():
            self._server_eof.set_result(None)
