"""The HTTP rows' second floor: Visor's real judgement behind the least glue Python allows.

`visor serve --url` pays for two things over a raw TCP relay: Visor's judgement (the session
core, its policy checks, provenance, redaction and the audit records) and the I/O layers around
it (tasks, queues, the session's relay, the upstream's client, limits, routing). This process keeps
the first exactly and cuts the second to the bone: asyncio protocols only (no task, no future on
the path of a call), llhttp both ways, the real `SessionCore` with the real `PolicyChecks` per
session, real audit records chained and appended, and the allows fsync'd before their calls are
sent on, a turn of the loop's allows together (`AuditLog`: the writer's group commit, ideal).

What it leaves out makes it faster than any real gateway can be: no Origin, Accept or media-type
checks, no body or session limits, no SSE, no metrics, no approval channel, no idle expiry, no
shutdown. It is a measuring instrument, never a product path: if a target is missed even here,
no arrangement of the gateway's I/O can meet it on this machine; the distance between this row
and `visor serve --url` is what the gateway's own I/O layers cost.

Run: ``python -m visor.bench.core_floor LISTEN_FD UPSTREAM_HOST UPSTREAM_PORT POLICY AUDIT_LOG``;
the listening socket is inherited, as `visor.bench.tcp_relay`'s is.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import os
import secrets
import socket
import sys
from pathlib import Path
from typing import Any, cast

import httptools
import orjson
import uvloop

from visor.audit import record
from visor.core.checks import PolicyChecks
from visor.core.events import (
    Action,
    AppendRecord,
    ClientData,
    CommitDone,
    CommitRecord,
    SendToClient,
    SendToServer,
    ServerData,
)
from visor.core.session import CoreConfig, SessionCore
from visor.policy.loader import load_policy
from visor.session import SessionState

SERVER_NAME = "bench"


class AuditLog:
    """One chained log for every session, as the gateway's. The allows of a turn are fsync'd
    together: on the loop's thread when nothing else could run meanwhile (no request is out to the
    upstream), else on a thread while the loop goes on, the allows of later turns then waiting for
    the next fsync (group commit)."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.session = secrets.token_hex(16)
        self.seq = -1  # the first record is 0
        self.prev = "0" * 64
        self.lines: list[bytes] = []
        self.waiting: list[tuple[Session, CommitRecord, int]] = []
        self.scheduled = False
        self.syncing = False
        # Requests out to the upstream, across sessions: answers that could be judged meanwhile.
        self.out = 0

    def add(self, event: dict[str, Any]) -> int:
        self.seq += 1
        encoded = record.build(event, session=self.session, seq=self.seq, prev=self.prev)
        self.prev = encoded.record["hash"]
        self.lines.append(encoded.line)
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)
        return self.seq

    def commit(self, session: Session, action: CommitRecord) -> None:
        self.waiting.append((session, action, self.add(action.event)))

    def flush(self) -> None:
        self.scheduled = False
        if self.lines:
            lines, self.lines = self.lines, []
            os.write(self.fd, b"".join(lines))
        if not self.waiting or self.syncing:
            return
        waiting, self.waiting = self.waiting, []
        if self.out == 0:
            os.fdatasync(self.fd)
            self._done(waiting)
            return
        self.syncing = True
        loop = asyncio.get_running_loop()
        loop.run_in_executor(None, os.fdatasync, self.fd).add_done_callback(
            lambda done: self._synced(done, waiting)
        )

    def _synced(self, done: asyncio.Future[None], waiting: list[tuple[Session, CommitRecord, int]]) -> None:
        self.syncing = False
        done.result()  # a failed fsync ends the measurement loudly, never reports a call durable
        self._done(waiting)
        if self.waiting and not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def _done(self, waiting: list[tuple[Session, CommitRecord, int]]) -> None:
        for session, action, seq in waiting:
            session.perform(session.core.handle(CommitDone(action.call, seq)))


class _Peer(asyncio.Protocol):
    """One HTTP connection read by llhttp: its transport, and the body and `Mcp-Session-Id` of
    the message being read."""

    parser: httptools.HttpRequestParser | httptools.HttpResponseParser

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.body: list[bytes] = []
        self.sid: bytes | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"mcp-session-id":
            self.sid = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def take(self) -> tuple[bytes, bytes | None]:
        """The message just read: its body and its session id (both cleared for the next)."""
        body, sid = b"".join(self.body), self.sid
        self.body.clear()
        self.sid = None
        return body, sid


class Upstream(_Peer):
    """One connection to the upstream server, one request at a time."""

    parser: httptools.HttpResponseParser

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        self.parser = httptools.HttpResponseParser(self)

    def on_message_complete(self) -> None:
        body, sid = self.take()
        if sid is not None:
            self.session.upstream_sid = sid
        self.session.floor.audit.out -= 1
        self.session.idle.append(self)
        if self.parser.get_status_code() == 200:
            self.session.perform(self.session.core.handle(ServerData(body + b"\n")))
        self.session.send_waiting()

    def post(self, line: bytes) -> None:
        assert self.transport is not None
        self.session.floor.audit.out += 1
        head = b"POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n" % self.session.host
        head += b"Accept: application/json, text/event-stream\r\n"
        if self.session.upstream_sid is not None:
            head += b"Mcp-Session-Id: " + self.session.upstream_sid + b"\r\n"
        self.transport.write(head + b"Content-Length: %d\r\n\r\n" % len(line) + line)


class Session:
    """One MCP session: its own core, checks and state, and its own upstream connections."""

    def __init__(self, floor: Floor) -> None:
        self.floor = floor
        self.sid = secrets.token_hex(16).encode()
        self.host = floor.host.encode()
        self.upstream_sid: bytes | None = None
        checks = PolicyChecks(
            policy=floor.policy,
            session=SessionState(floor.policy, SERVER_NAME),
            audit_session=floor.audit.session,
            server_name=SERVER_NAME,
            argv=["core_floor"],
            approvals=None,
            protected=floor.protected,
        )
        ids = itertools.count(1)
        self.core = SessionCore(checks, CoreConfig(), new_id=lambda: f"visor-{next(ids)}")
        self.answers: dict[bytes, Client] = {}
        self.idle: list[Upstream] = []
        self.queued: collections.deque[bytes] = collections.deque()
        self.opening = 0
        # The connections being opened (a task the loop holds only weakly could be collected).
        self.connecting: set[asyncio.Task[None]] = set()
        self.perform(self.core.start())

    def perform(self, actions: list[Action]) -> None:
        for action in actions:
            kind = type(action)
            if kind is SendToServer:
                self.queued.append(cast(SendToServer, action).line)
            elif kind is SendToClient:
                line = cast(SendToClient, action).line
                msg = orjson.loads(line)
                client = self.answers.pop(orjson.dumps(msg.get("id")), None) if "method" not in msg else None
                if client is not None:
                    client.answer(200, line, self.sid)
            elif kind is AppendRecord:
                self.floor.audit.add(cast(AppendRecord, action).event)
            elif kind is CommitRecord:
                self.floor.audit.commit(self, cast(CommitRecord, action))
        self.send_waiting()

    def send_waiting(self) -> None:
        while self.queued and self.idle:
            self.idle.pop().post(self.queued.popleft())
        if len(self.queued) > self.opening:
            self.opening += 1
            task = asyncio.get_running_loop().create_task(self._connect())
            self.connecting.add(task)
            task.add_done_callback(self.connecting.discard)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        _, upstream = await loop.create_connection(lambda: Upstream(self), self.floor.host, self.floor.port)
        self.opening -= 1
        self.idle.append(upstream)
        self.send_waiting()

    def request(self, client: Client, body: bytes) -> None:
        msg = orjson.loads(body)
        if "id" in msg:
            self.answers[orjson.dumps(msg["id"])] = client
        else:
            client.answer(202, b"", self.sid)  # a notification: accepted, sent on by the core
        self.perform(self.core.handle(ClientData(body + b"\n")))


class Client(_Peer):
    """One HTTP connection from a client: POSTs to /mcp, answered with JSON."""

    parser: httptools.HttpRequestParser

    def __init__(self, floor: Floor) -> None:
        super().__init__()
        self.floor = floor
        self.parser = httptools.HttpRequestParser(self)

    def on_message_complete(self) -> None:
        body, sid = self.take()
        if self.parser.get_method() != b"POST":
            self.floor.sessions.pop(sid or b"", None)
            self.answer(200, b"", None)
            return
        session = self.floor.sessions.get(sid) if sid is not None else None
        if session is None:
            session = Session(self.floor)
            self.floor.sessions[session.sid] = session
        session.request(self, body)

    def answer(self, status: int, body: bytes, sid: bytes | None) -> None:
        assert self.transport is not None
        head = b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % (
            status,
            len(body),
        )
        if sid is not None:
            head += b"Mcp-Session-Id: " + sid + b"\r\n"
        self.transport.write(head + b"\r\n" + body)


class Floor:
    def __init__(self, host: str, port: int, policy: Path, audit_log: Path) -> None:
        from visor.run import _protected_paths

        self.host = host
        self.port = port
        self.policy = load_policy(policy)
        # The files `visor serve` protects, so the per-call path check costs what it does there.
        names = argparse.Namespace(approval_dir=None, pin_file=None, policy=str(policy), signing_key=None)
        self.protected = _protected_paths(names, audit_log, [])
        self.audit = AuditLog(audit_log)
        self.sessions: dict[bytes, Session] = {}


async def _serve(fd: int, floor: Floor) -> None:
    loop = asyncio.get_running_loop()
    # Already bound and listening: the bench connects as soon as it started this process.
    await loop.create_server(lambda: Client(floor), sock=socket.socket(fileno=fd))
    await asyncio.Event().wait()


def main(argv: list[str]) -> None:
    fd, host, port, policy, audit_log = argv
    uvloop.run(_serve(int(fd), Floor(host, int(port), Path(policy), Path(audit_log))))


if __name__ == "__main__":
    main(sys.argv[1:])
