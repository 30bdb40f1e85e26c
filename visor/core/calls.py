"""One tools/call while Visor holds it: what the core and the checks know about it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from visor.approval.model import ApprovalRequest
    from visor.policy.evaluate import Decision, ToolCall
    from visor.policy.schema import Policy
    from visor.wire.message import Message


@dataclass(frozen=True, slots=True)
class CallContext:
    """What the session knows about the call's client when it arrives."""

    modern: bool = False
    client_capabilities: dict[str, Any] | None = None
    progress_token: Any = None


class Stage(Enum):
    """Where a held call is. A call the server has seen is no longer held."""

    LISTING = "listing"  # waiting for Visor's own tools/list
    DECIDING = "deciding"  # inside the checks (a verdict is being made)
    COMMIT = "commit"  # allowed; waiting for the fsync that covers its allow record
    HUMAN = "human"  # waiting for a human's answer
    RELAYED = "relayed"  # written to the server
    DONE = "done"  # answered by Visor, withdrawn or dropped


@dataclass(slots=True)
class Slot:
    """A place in the line of messages to the server: held until its bytes (or None) are known."""

    line: bytes | None = None
    ready: bool = False


@dataclass(slots=True, eq=False)
class Approval:
    """The questions asked about one call so far (several rounds for several destinations)."""

    msg: Message  # the call as the log and the server see it (redacted)
    call: ToolCall  # as the policy judged it (original arguments: what the human is shown)
    current: Decision
    # The policy the call was judged under: every round and the re-check after a yes use it,
    # even when a reload put another one in force meanwhile (docs/policy.md, "Reloading").
    policy: Policy
    approved: list[Decision] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    rounds: int = 0
    request: ApprovalRequest | None = None


@dataclass(slots=True, eq=False)
class ToolCallState:
    """One tools/call from its arrival to its relay or its answer.

    Compared by identity: the object itself is the token of its audit commit
    and of its approval (`CommitRecord`, `AskHuman`), so no table maps tokens
    back to calls.
    """

    msg: Message  # as the client sent it (the policy reads these arguments)
    ctx: CallContext
    stage: Stage = Stage.DECIDING
    # Its place in the line to the server while it holds later messages back
    # (waiting for a listing or a commit), else None.
    slot: Slot | None = None
    # The client cancelled it before it was relayed: it never reaches the server.
    withdrawn: bool = False
    approval: Approval | None = None
    # The bytes to relay once the allow record is durable.
    line: bytes | None = None
    # The allow record's seq and when the allow was made (time.monotonic), for its `result`.
    allow_seq: int | None = None
    started: float | None = None
