"""One validated tools/call in, one verdict out.

The relay hands every valid `tools/call` request to `Gate.on_tool_call`,
which answers with `Forward` (relay these bytes to the server), `Answer`
(send these bytes to the client; the server sees nothing) or `Deferred` (a
future that resolves to one of them, or to `Drop`). The gate is the only
place that combines a decision, an approval and an audit commit.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from visor.wire.message import Message


@dataclass(frozen=True, slots=True)
class Forward:
    line: bytes


@dataclass(frozen=True, slots=True)
class Answer:
    line: bytes


@dataclass(frozen=True, slots=True)
class Drop:
    """Send nothing anywhere (a cancelled call)."""


@dataclass(frozen=True, slots=True)
class Deferred:
    """The verdict needs an async step; `ordered` keeps it in line with later messages."""

    future: asyncio.Future[Forward | Answer | Drop]
    ordered: bool


Verdict = Forward | Answer | Deferred


@dataclass(slots=True)
class CallContext:
    """What the relay knows about the call's session when it arrives."""

    modern: bool = False
    client_capabilities: dict[str, Any] | None = None
    progress_token: Any = None


class Gate:
    """Until a policy is configured, every valid call is forwarded unchanged."""

    def on_tool_call(self, msg: Message, ctx: CallContext) -> Verdict:
        return Forward(msg.raw)

    def on_tool_result(self, request: Message | None, tool: str | None, response: Message) -> bytes | None:
        """Observe a server's answer to a tools/call; return replacement bytes or None."""
        return None

    def on_tools_list(self, response: Message) -> bytes | None:
        return None

    def cancel(self, request_id: Any) -> bool:
        """The client cancelled a call that has not been forwarded; True if one was waiting."""
        return False
