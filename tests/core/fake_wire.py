"""Drive a `SessionCore` in memory: messages in as events, actions out as plain lists.

No event loop, no subprocess, no file: the audit log, the approval channels
and the timers are whatever the test says they did.
"""

from __future__ import annotations

import itertools
import textwrap
from dataclasses import dataclass, field
from typing import Any

import orjson

from visor.approval.broker import ApprovalBroker
from visor.approval.model import ApprovalAnswer, ApprovalRequest
from visor.core.checks import Checks, PolicyChecks
from visor.core.events import (
    Action,
    AppendRecord,
    AskHuman,
    ClientData,
    CommitDone,
    CommitRecord,
    Event,
    SendToClient,
    SendToServer,
    ServerData,
)
from visor.core.session import CoreConfig, SessionCore
from visor.policy.loader import load_policy_text
from visor.session import SessionState

POLICY = """\
version: "1.0"
default_action: deny
servers:
  - name: "srv"
    allowed: true
    tools:
      - name: "echo"
        allowed: true
      - name: "ask_me"
        allowed: true
        approval_required: true
      - name: "rm"
        allowed: false
"""

TOOLS = [{"name": n, "inputSchema": {"type": "object"}} for n in ("echo", "ask_me", "rm")]


class SilentChannel:
    """An approval channel that exists (so a question can be asked) and is never awaited here."""

    name = "directory"

    async def ask(self, req: ApprovalRequest) -> ApprovalAnswer | None:
        raise AssertionError("the core never awaits a channel")


def line(obj: dict[str, Any]) -> bytes:
    return orjson.dumps(obj)


def request(msg_id: Any, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def call(msg_id: Any, tool: str, **arguments: Any) -> dict[str, Any]:
    return request(msg_id, "tools/call", {"name": tool, "arguments": arguments})


def cancel(msg_id: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": msg_id}}


def result(msg_id: Any, value: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "result": value if value is not None else {}}


@dataclass
class Wire:
    """A core and everything it has said so far."""

    core: SessionCore
    actions: list[Action] = field(default_factory=list)
    seq: itertools.count[int] = field(default_factory=lambda: itertools.count(100))

    def feed(self, event: Event) -> list[Action]:
        out = self.core.handle(event)
        self.actions.extend(out)
        return out

    def client(self, *messages: dict[str, Any] | bytes) -> list[Action]:
        """One read from the client holding every message given (one batch)."""
        data = b"".join((m if isinstance(m, bytes) else line(m)) + b"\n" for m in messages)
        return self.feed(ClientData(data))

    def server(self, *messages: dict[str, Any] | bytes) -> list[Action]:
        data = b"".join((m if isinstance(m, bytes) else line(m)) + b"\n" for m in messages)
        return self.feed(ServerData(data))

    def commit_all(self, actions: list[Action]) -> list[Action]:
        """Report every commit in `actions` durable, in order."""
        out: list[Action] = []
        for a in actions:
            if isinstance(a, CommitRecord):
                out += self.feed(CommitDone(a.call, next(self.seq)))
        return out

    def list_tools(self) -> None:
        """The client lists the tools (and the server answers): the session's first listing."""
        self.client(request("list", "tools/list"))
        self.server(result("list", {"tools": TOOLS}))


def to_server(actions: list[Action]) -> list[dict[str, Any]]:
    return [orjson.loads(a.line) for a in actions if isinstance(a, SendToServer)]


def to_client(actions: list[Action]) -> list[dict[str, Any]]:
    return [orjson.loads(a.line) for a in actions if isinstance(a, SendToClient)]


def records(actions: list[Action]) -> list[dict[str, Any]]:
    """Every record appended or committed, in order."""
    return [a.event for a in actions if isinstance(a, AppendRecord | CommitRecord)]


def kinds(actions: list[Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


def asks(actions: list[Action]) -> list[AskHuman]:
    return [a for a in actions if isinstance(a, AskHuman)]


def commits(actions: list[Action]) -> list[CommitRecord]:
    return [a for a in actions if isinstance(a, CommitRecord)]


def policy_wire(
    *, listed: bool = True, approvals: bool = True, listing_timeout: float = 15.0, policy: str = POLICY
) -> Wire:
    """A core judging with `policy` for server "srv"; `listed`: the client has listed the tools."""
    loaded = load_policy_text(textwrap.dedent(policy), "test.yaml")
    session = SessionState(loaded, "srv")
    broker = ApprovalBroker(channels=[SilentChannel()], timeout=60.0) if approvals else None
    checks = PolicyChecks(
        policy=loaded,
        session=session,
        audit_session="s" * 32,
        server_name="srv",
        argv=["server"],
        approvals=broker,
    )
    ids = (f"visor-{n:032x}" for n in itertools.count(1))
    core = SessionCore(checks, CoreConfig(listing_timeout=listing_timeout), new_id=lambda: next(ids))
    wire = Wire(core)
    wire.actions.extend(core.start())
    if listed:
        wire.list_tools()
    return wire


def plain_wire() -> Wire:
    """A core with no checks (`visor run --no-checks`)."""
    ids = (f"visor-{n:032x}" for n in itertools.count(1))
    return Wire(SessionCore(Checks(), new_id=lambda: next(ids)))
