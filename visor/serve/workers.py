"""`visor serve --workers N`: N processes serving one port, each session kept with its owner.

An MCP session of the gateway owns things that live in one process: its upstream process (or
upstream HTTP session), its Visor session state, its relay. With N processes accepting on one
shared socket the kernel hands each new TCP connection to any of them, and one MCP client opens
several connections (its GET stream, its POSTs), so a session's requests land on processes that
do not own it. Hence:

* The supervisor (the process the user started) binds the listening socket once, so that
  `--listen HOST:0` works and every worker serves the same port, creates a private 0700 run
  directory, and starts N workers (`python -m visor serve ... --worker-of SPEC`), each given the
  listening socket and one end of a socket pair. A worker says "ready" on its pair once it
  serves; the supervisor prints the one ready line when all of them have, forwards SIGTERM,
  SIGINT and SIGHUP to them, restarts one that dies, and removes the run directory at exit. A
  worker whose pair reaches end of file (the supervisor is gone) stops as on SIGTERM: no worker
  outlives its supervisor, and each ends its sessions' upstream processes on the way out.
* Worker I also listens on `RUNDIR/worker-I.sock` and mints session ids ending in `-I`. A request
  whose `Mcp-Session-Id` names another worker is forwarded to that worker's socket, after the
  Origin and token checks, and its answer streamed back unchanged; when the owner cannot be
  reached (it died) the request is served locally, where the unknown session gets its 404.
  A sessionless (2026-07-28) request goes the same way to the one worker that holds its client
  credential's conversation (a hash of the credential's digest), so that a conversation's budgets
  are not multiplied by N.
* Worker I writes its own audit log, `X.worker-I.jsonl` for `--audit-log X.jsonl`: a log has one
  writer and one hash chain.
* A scrape of `/metrics` reaches any one worker, which asks the others for their figures over their
  unix sockets (`/metrics?worker-snapshot`, JSON, answered only there) and answers with every
  worker's samples, each labelled `worker="I"` (a restarted worker's counters reset in its own
  series only), and with `visor_workers_reporting`: a worker that is restarting is left out, and
  the page says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from visor import logs

if TYPE_CHECKING:
    from visor.http.client import OriginClient
    from visor.http.server import Answer, HttpServer, Request
    from visor.serve.gateway import Gateway

WORKER_OPTION = "--worker-of"
MAX_WORKERS = 64
# A restarted worker that dies before it is ready this many times in a row is not started again.
MAX_START_FAILURES = 5
_BACKOFF_FIRST = 0.5
_BACKOFF_MAX = 8.0
_READY = b"ready\n"
# How long the worker answering a scrape waits for each other worker's figures.
PEER_METRICS_TIMEOUT = 2.0
# The most a worker's figures may take (a few KB in practice); a larger answer is left out.
PEER_METRICS_MAX_BYTES = 16 << 20
# How long connecting to another worker's socket may take (a GET stream lasts as long as its
# session: only connecting is bounded).
FORWARD_CONNECT_TIMEOUT = 10.0
# `[ID.]<32 hex>-<I>`: the session ids a worker mints (gateway.Gateway.mint_sid; ID is --replica-id).
_SID = re.compile(r"(?:[A-Za-z0-9_]{1,32}\.)?[0-9a-f]{32}-(0|[1-9][0-9]{0,2})")
# A unix socket path longer than sun_path (108 bytes on Linux) cannot be bound.
_SUN_PATH_MAX = 100
# Hop-by-hop headers (RFC 9110 section 7.6.1) are the forwarding connection's own, not passed on.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
    }
)
_HOP_BY_HOP_AND_LENGTH = _HOP_BY_HOP | {"content-length"}

log = logs.get_logger("visor.serve")


class WorkerSpecError(ValueError):
    """A `--worker-of` value that is not one the supervisor writes."""


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What the supervisor hands worker `index` of `count`: the listening socket's fd, its control
    pair's fd, and the run directory where every worker's unix socket is."""

    listen_fd: int
    control_fd: int
    index: int
    count: int
    rundir: Path

    def encode(self) -> str:
        return f"{self.listen_fd}:{self.control_fd}:{self.index}:{self.count}:{self.rundir}"

    @classmethod
    def parse(cls, text: str) -> WorkerSpec:
        parts = text.split(":", 4)
        if len(parts) != 5 or not all(p.isdigit() for p in parts[:4]) or not parts[4]:
            raise WorkerSpecError(
                f"{WORKER_OPTION} {text!r}: expected LISTEN_FD:CONTROL_FD:INDEX:COUNT:RUNDIR"
            )
        index, count = int(parts[2]), int(parts[3])
        if not index < count <= MAX_WORKERS:
            raise WorkerSpecError(f"{WORKER_OPTION} {text!r}: needs INDEX < COUNT <= {MAX_WORKERS}")
        return cls(int(parts[0]), int(parts[1]), index, count, Path(parts[4]))

    @property
    def socket_path(self) -> Path:
        return worker_socket(self.rundir, self.index)


def worker_socket(rundir: Path, index: int) -> Path:
    return rundir / f"worker-{index}.sock"


def worker_audit_path(path: Path, index: int) -> Path:
    """`X.jsonl` -> `X.worker-I.jsonl`: one log, one writer, one chain per worker."""
    return path.with_name(f"{path.stem}.worker-{index}{path.suffix or '.jsonl'}")


def owner_of(sid: str) -> int | None:
    """The worker a session id names, or None for an id no worker minted (served locally: 404)."""
    match = _SID.fullmatch(sid)
    return int(match.group(1)) if match else None


def conversation_owner(authorization: str | None, count: int) -> int:
    """The worker that holds the conversation of every sessionless (2026-07-28) request made with
    this credential: one worker, so that the conversation's budgets and provenance are one
    (visor/serve/sessionless.py), not one per worker a request happens to reach."""
    from visor.serve.sessionless import conversation_key

    digest = hashlib.sha256(conversation_key(authorization).encode()).digest()
    return int.from_bytes(digest[:8], "big") % count


# ---------------------------------------------------------------------------- the worker side


class Forwarder:
    """The hook at the top of `Gateway._mcp`: a request for another worker's session is relayed to
    that worker's unix socket and its answer streamed back unchanged (status, headers, body, SSE
    events as they come). None: serve the request here."""

    def __init__(self, spec: WorkerSpec, shared_state: bool) -> None:
        self._spec = spec
        self._shared_state = shared_state
        # One client per owner, each a pool of keep-alive connections to the owner's socket.
        self._clients: dict[int, OriginClient] = {}

    def _client(self, owner: int) -> OriginClient:
        from visor.http.client import OriginClient

        client = self._clients.get(owner)
        if client is None:
            client = OriginClient(
                # (The URL only names the socket's server: each request gives its own Host and target.)
                "http://worker/",
                connect_timeout=FORWARD_CONNECT_TIMEOUT,
                unix_path=str(worker_socket(self._spec.rundir, owner)),
                # The bytes go both ways as they were written: the client's headers only (no
                # User-Agent or Accept-Encoding of the forwarder's), a Content-Encoding left alone,
                # no cookie kept from one client's answer for another's request.
                relay=True,
            )
            self._clients[owner] = client
        return client

    async def __call__(self, request: Request) -> Answer | None:
        from visor.http.client import ConnectFailed, HttpClientError
        from visor.http.server import StreamResponse
        from visor.serve.gateway import SESSION_HEADER, VERSION_HEADER, _error
        from visor.wire import errors

        sid = request.headers.get(SESSION_HEADER)
        conversation = (
            sid is None
            and request.method == "POST"
            and request.headers.get(VERSION_HEADER) in errors.MODERN_PROTOCOL_VERSIONS
        )
        if conversation:
            owner: int | None = conversation_owner(request.headers.get("Authorization"), self._spec.count)
        else:
            owner = owner_of(sid) if sid is not None else None
        if owner is None or owner == self._spec.index:
            return None
        # Every field the client sent (a repeated one each time), but the connection's own.
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP_AND_LENGTH]
        target = f"{request.path}?{request.query_string}" if request.query_string else request.path
        # Read here, then sent whole: a body over the limit is refused where it arrives (read()
        # raises, the server answers 413), as the owner would refuse it.
        body = await request.read() if request.body_exists else None
        try:
            # No read timeout: a GET stream (or a long tool call) lasts as long as the owner serves it.
            upstream = await self._client(owner).request(request.method, headers, body, target=target)
        except ConnectFailed as exc:
            log.info("forward_owner_unreachable", owner=owner, mcp_session=sid, error=str(exc))
            if conversation and not self._shared_state:
                # A second conversation here would start with fresh budgets: the client waits.
                return _error(
                    503,
                    errors.INTERNAL_ERROR,
                    "Service Unavailable: the worker that holds this client's conversation is restarting",
                    headers={"Retry-After": "1"},
                )
            # The owner is gone (killed, restarting): its sessions went with it (404 here), or
            # with --state this worker continues them from the store.
            return None
        except HttpClientError as exc:
            log.warning("forward_failed", owner=owner, mcp_session=sid, error=str(exc))
            return _error(502, errors.INTERNAL_ERROR, "the worker that owns this session went away")
        log.debug(
            "request_forwarded", owner=owner, mcp_session=sid, method=request.method, status=upstream.status
        )
        async with upstream:
            # Framed again here (chunked): the owner's own framing headers do not pass.
            response = StreamResponse(
                status=upstream.status,
                headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP_AND_LENGTH
                },
            )
            await response.prepare(request)
            try:
                # As each piece arrives (an event stream's events as the owner writes them): no
                # whole body is held, and no size is capped. While the client takes no more,
                # write() waits, and the owner's socket stops being read past a megabyte.
                async for chunk in upstream.chunks():
                    await response.write(chunk)
                await response.write_eof()
            except ConnectionResetError:
                log.info("forward_closed_by_client", owner=owner, mcp_session=sid)
            except HttpClientError as exc:
                # The owner died mid-answer: the client must see a broken stream, not a whole one.
                log.warning("forward_broken", owner=owner, mcp_session=sid, error=str(exc))
                if request.transport is not None:
                    request.transport.close()
            return response

    async def peer_metrics(self, token: str | None) -> tuple[int, list[tuple[int, dict[str, Any]]]]:
        """This worker's index, and every other worker's `/metrics` figures
        (`GatewayMetrics.snapshot`), asked over their unix sockets at once; a worker that does not
        answer in time (dead, restarting) or answers something else is left out, and the page
        says how many it holds (`visor_workers_reporting`)."""
        peers = [i for i in range(self._spec.count) if i != self._spec.index]
        answers = await asyncio.gather(*(self._peer_snapshot(i, token) for i in peers))
        return self._spec.index, [(i, a) for i, a in zip(peers, answers, strict=True) if a is not None]

    async def _peer_snapshot(self, index: int, token: str | None) -> dict[str, Any] | None:
        from visor.http.client import HttpClientError
        from visor.serve.metrics import SNAPSHOT_QUERY, render

        # Our own request over the private socket: a loopback Host passes the DNS-rebinding check
        # of a loopback listener, and the client token (when one is set) the token check.
        headers = {"Host": "localhost"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        try:
            # The whole exchange (connecting included) within the timeout.
            async with asyncio.timeout(PEER_METRICS_TIMEOUT):
                reply = await self._client(index).request("GET", headers, target=f"/metrics?{SNAPSHOT_QUERY}")
                async with reply:
                    if reply.status != 200:
                        log.warning("peer_metrics_refused", worker=index, status=reply.status)
                        return None
                    snapshot = orjson.loads(await reply.read(PEER_METRICS_MAX_BYTES))
        except (HttpClientError, TimeoutError, orjson.JSONDecodeError) as exc:
            log.info("peer_metrics_unavailable", worker=index, error=str(exc) or type(exc).__name__)
            return None
        try:
            if not isinstance(snapshot, dict):
                raise TypeError(f"a JSON {type(snapshot).__name__}, not an object")
            render([(index, snapshot)])  # what the page will do with it
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            log.warning("peer_metrics_malformed", worker=index, error=repr(exc))
            return None
        return snapshot

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()


class Worker:
    """What `visor serve --worker-of SPEC` adds to the single-process path (command._serve)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        # Neither fd may reach an upstream process: the port, or the supervisor's pair, would
        # then outlive this worker.
        os.set_inheritable(spec.listen_fd, False)
        os.set_inheritable(spec.control_fd, False)
        self._control = socket.socket(fileno=spec.control_fd)
        whole_lines_on_stderr()
        tag_log_lines(spec.index)
        self._forwarder: Forwarder | None = None

    def audit_path(self, path: Path) -> Path:
        return worker_audit_path(path, self.spec.index)

    def attach(self, gateway: Gateway) -> None:
        gateway.sid_suffix = f"-{self.spec.index}"
        self._forwarder = Forwarder(self.spec, shared_state=gateway.state is not None)
        gateway.forward = self._forwarder
        forwarder, token = self._forwarder, gateway.config.token
        gateway.peer_metrics = lambda: forwarder.peer_metrics(token)

    async def start(self, server: HttpServer, stop: asyncio.Event) -> None:
        """Serve the shared socket and this worker's unix socket, then tell the supervisor."""
        listen = socket.socket(fileno=self.spec.listen_fd)
        await server.listen_socket(listen)
        path = self.spec.socket_path
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # the socket of this index's previous (dead) worker
        await server.listen_unix(str(path))
        os.chmod(path, 0o600)
        loop = asyncio.get_running_loop()
        self._control.setblocking(False)
        await loop.sock_sendall(self._control, _READY)

        def supervisor_gone() -> None:
            try:
                data = self._control.recv(64)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                log.warning("supervisor_gone", worker=self.spec.index, detail="stopping")
                loop.remove_reader(self._control.fileno())
                stop.set()

        loop.add_reader(self._control.fileno(), supervisor_gone)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(self._control.fileno())
        if self._forwarder is not None:
            await self._forwarder.close()
        with contextlib.suppress(FileNotFoundError):
            self.spec.socket_path.unlink()
        self._control.close()


# ---------------------------------------------------------------------------- the supervisor side


def worker_argv(argv: list[str], spec: WorkerSpec) -> list[str]:
    """The supervisor's own command line, run again as worker `spec.index`: the same options (the
    worker ignores --workers), with `--worker-of SPEC` put right after the `serve` subcommand so
    that it cannot land in the upstream command after `--`."""
    try:
        at = argv.index("serve")
    except ValueError:
        raise WorkerSpecError("--workers: `visor serve` must be started from its command line") from None
    return [sys.executable, "-m", "visor", *argv[: at + 1], WORKER_OPTION, spec.encode(), *argv[at + 1 :]]


def whole_lines_on_stderr() -> None:
    """The supervisor and its workers share one stderr: each log line must reach it in one write
    (whole up to the pipe's atomic size), not its text and its newline in two writes that another
    process's line can fall between. Buffered, `print(..., flush=True)` (structlog's) is one write."""
    with contextlib.suppress(AttributeError, ValueError):
        sys.stderr.reconfigure(line_buffering=False, write_through=False)  # type: ignore[union-attr]


def tag_log_lines(index: int) -> None:
    """Every log line of worker `index` says `worker=index`: the workers share one stderr."""
    import structlog

    def add_worker(logger: Any, name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        event.setdefault("worker", index)
        return event

    processors = structlog.get_config()["processors"]
    structlog.configure(processors=[add_worker, *processors])


def bind(host: str, port: int) -> socket.socket:
    """The one listening socket every worker serves (what `HttpServer.listen` would bind)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def make_rundir() -> Path:
    """A 0700 directory for the workers' unix sockets: under $XDG_RUNTIME_DIR, else the tmp dir."""
    for base in (os.environ.get("XDG_RUNTIME_DIR"), tempfile.gettempdir()):
        if base and os.path.isdir(base) and len(base) + 40 < _SUN_PATH_MAX:
            return Path(tempfile.mkdtemp(prefix="visor-serve-", dir=base))  # mkdtemp makes it 0700
    raise OSError("no directory short enough for the workers' unix sockets ($XDG_RUNTIME_DIR, $TMPDIR)")


@dataclass(slots=True)
class _Slot:
    index: int
    proc: asyncio.subprocess.Process | None = None
    ready: bool = False
    failures: int = 0
    started: list[int] = field(default_factory=list)


class Supervisor:
    """Starts and keeps N workers; exits when told to or when a worker cannot be kept running."""

    def __init__(
        self, argv: list[str], count: int, listen: socket.socket, rundir: Path, grace: float
    ) -> None:
        self._argv = argv
        self._listen = listen
        self._rundir = rundir
        self._grace = grace
        self._slots = [_Slot(i) for i in range(count)]
        self._stop = asyncio.Event()
        self._all_ready = asyncio.Event()
        self._stop_signal = signal.SIGTERM
        self._failed = False

    async def run(self, shown: str) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._request_stop, sig)
        loop.add_signal_handler(signal.SIGHUP, self._forward, signal.SIGHUP)
        log.info("serve_workers", workers=len(self._slots), rundir=str(self._rundir))
        keepers = [loop.create_task(self._keep(slot)) for slot in self._slots]
        try:
            waits = [loop.create_task(self._all_ready.wait()), loop.create_task(self._stop.wait())]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for waiting in waits:
                waiting.cancel()
            if self._all_ready.is_set() and not self._stop.is_set():
                print(f"visor serve: listening on {shown}", file=sys.stderr, flush=True)
            await self._stop.wait()
            log.info("serve_stopping", workers=len(self._slots))
            self._forward(self._stop_signal)
            _done, pending = await asyncio.wait(keepers, timeout=self._grace + 20.0)
            for slot in self._slots:
                if slot.proc is not None and slot.proc.returncode is None:
                    log.error(
                        "worker_kill", worker=slot.index, pid=slot.proc.pid, detail="not stopped in time"
                    )
                    with contextlib.suppress(ProcessLookupError):
                        slot.proc.kill()
            if pending:
                await asyncio.wait(pending)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
            for task in keepers:
                task.cancel()
            for slot in self._slots:
                if slot.proc is not None and slot.proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        slot.proc.kill()
                    await slot.proc.wait()
        return 1 if self._failed else 0

    def _request_stop(self, sig: signal.Signals) -> None:
        if not self._stop.is_set():
            self._stop_signal = sig
            self._stop.set()

    def _forward(self, sig: signal.Signals) -> None:
        for slot in self._slots:
            proc = slot.proc
            # A worker not ready yet may not have its handlers: SIGHUP would kill it, and it reads
            # the policy file as it starts anyway. SIGTERM/SIGINT reach every worker.
            if proc is not None and proc.returncode is None and (slot.ready or sig != signal.SIGHUP):
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)

    async def _keep(self, slot: _Slot) -> None:
        """Start worker `slot.index`, and again each time it dies, until the gateway stops."""
        while not self._stop.is_set():
            status, was_ready = await self._run_once(slot)
            if self._stop.is_set():
                return
            if was_ready:
                slot.failures = 0
            else:
                slot.failures += 1
                first_start = len(slot.started) == 1
                if first_start or slot.failures >= MAX_START_FAILURES:
                    # A policy or audit log refused at start does not fix itself: fail closed.
                    print(
                        f"visor serve: worker {slot.index} exited with status {status} before it was ready"
                        + ("" if first_start else f" ({slot.failures} times in a row)")
                        + "; stopping",
                        file=sys.stderr,
                        flush=True,
                    )
                    self._failed = True
                    self._request_stop(signal.SIGTERM)
                    return
            delay = min(_BACKOFF_MAX, _BACKOFF_FIRST * 2 ** max(0, slot.failures - 1))
            log.error("worker_exited", worker=slot.index, status=status, restart_in=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)

    async def _run_once(self, slot: _Slot) -> tuple[int, bool]:
        """One life of a worker: its exit status and whether it became ready."""
        ours, theirs = socket.socketpair()
        spec = WorkerSpec(self._listen.fileno(), theirs.fileno(), slot.index, len(self._slots), self._rundir)
        try:
            slot.proc = await asyncio.create_subprocess_exec(
                *worker_argv(self._argv, spec),
                stdin=asyncio.subprocess.DEVNULL,
                pass_fds=(self._listen.fileno(), theirs.fileno()),
            )
        except OSError as exc:  # out of processes or descriptors: a start that failed, as any other
            log.error("worker_start_failed", worker=slot.index, error=str(exc))
            ours.close()
            slot.proc = None
            slot.started.append(-1)
            return -1, False
        finally:
            theirs.close()
        proc = slot.proc
        slot.ready = False
        slot.started.append(proc.pid)
        log.info("worker_started", worker=slot.index, pid=proc.pid)
        if self._stop.is_set():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(self._stop_signal)
        reader, writer = await asyncio.open_connection(sock=ours)
        try:
            line = await reader.readline()
            if line == _READY:
                slot.ready = True
                log.info("worker_ready", worker=slot.index, pid=proc.pid)
                if all(s.ready for s in self._slots):
                    self._all_ready.set()
            status = await proc.wait()
        finally:
            writer.close()
        return status, slot.ready


def supervise(args: argparse.Namespace, host: str, port: int, argv: list[str]) -> int:
    """The `--workers N` path of `visor serve` (N > 1): bind, start the workers, keep them."""
    from visor.serve.command import ServeError

    whole_lines_on_stderr()
    try:
        listen = bind(host, port)
    except OSError as exc:
        print(f"visor serve: cannot listen on {args.listen}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    try:
        rundir = make_rundir()
    except OSError as exc:
        listen.close()
        print(f"visor serve: cannot make a run directory for the workers: {exc}", file=sys.stderr)
        return 1
    try:
        worker_argv(argv, WorkerSpec(0, 0, 0, 1, rundir))  # refuse an unusable command line before starting
        bound = listen.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        supervisor = Supervisor(argv, args.workers, listen, rundir, args.shutdown_grace)
        return asyncio.run(supervisor.run(f"http://{shown}:{bound}/mcp"))
    except (WorkerSpecError, ServeError) as exc:
        print(f"visor serve: {exc}", file=sys.stderr)
        return 2
    finally:
        listen.close()
        shutil.rmtree(rundir, ignore_errors=True)
