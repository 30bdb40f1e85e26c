"""What goes into the session core (events) and what comes out of it (actions).

A driver (visor/relay/proxy.py for stdio) feeds one event at a time to
`SessionCore.handle` and performs the actions it returns, in order. Some
actions carry a token (a `ToolCallState`, a `Timer`): the driver hands the
same object back in the event that reports how the action ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from visor.approval.broker import Outcome
    from visor.approval.model import ApprovalRequest
    from visor.core.calls import CallContext, ToolCallState
    from visor.policy.schema import Policy


class Timer:
    """A timer's identity: compared by identity, named for the log."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Timer({self.name!r})"


# ------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True)
class ClientData:
    """Bytes the client wrote (any chunking): every complete line in them is handled as one batch."""

    data: bytes


@dataclass(frozen=True, slots=True)
class ClientEof:
    """The client closed its side of the wire."""


@dataclass(frozen=True, slots=True)
class ClientGone:
    """Nobody can read answers any more (the client stopped reading, or Visor was told to stop)."""


@dataclass(frozen=True, slots=True)
class ServerData:
    data: bytes


@dataclass(frozen=True, slots=True)
class ServerEof:
    """The server closed its stdout."""


@dataclass(frozen=True, slots=True)
class ServerInputLost:
    """The server's stdin cannot be written any more (it closed it, or exited)."""


@dataclass(frozen=True, slots=True)
class CommitDone:
    """The fsync covering `call`'s allow record returned; `seq` is that record's."""

    call: ToolCallState
    seq: int


@dataclass(frozen=True, slots=True)
class CommitFailed:
    """`call`'s allow record could not be made durable."""

    call: ToolCallState
    error: str


@dataclass(frozen=True, slots=True)
class ApprovalAnswered:
    """How the question about `call` ended; None: the approval step itself failed."""

    call: ToolCallState
    outcome: Outcome | None


@dataclass(frozen=True, slots=True)
class TimerFired:
    timer: Timer


@dataclass(frozen=True, slots=True)
class VisorRequest:
    """Visor asks the client something on its own account (an elicitation), with id `rpc_id`."""

    rpc_id: str
    method: str
    params: dict[str, Any]


@dataclass(frozen=True, slots=True)
class VisorNotify:
    """A notification from Visor itself to the client (progress, a withdrawn dialog)."""

    method: str
    params: dict[str, Any]


@dataclass(frozen=True, slots=True)
class VisorForget:
    """No answer to Visor's own request `rpc_id` is awaited any more."""

    rpc_id: str


@dataclass(frozen=True, slots=True)
class PolicyReloaded:
    """A policy loaded and validated off the hot path (SIGHUP): in force from this event on,
    unless a setting that cannot change while the session runs differs (then refused)."""

    policy: Policy
    # The file it was read from (None: the embedded default), protected from then on.
    path: str | None = None


@dataclass(frozen=True, slots=True)
class PolicyReloadFailed:
    """A reload whose policy could not be loaded: `error` as the loader said it (file, line, key)."""

    source: str
    error: str
    # SHA-256 of the file's bytes as they were read, when they could be read.
    sha256: str | None = None
    # The file (None: the embedded default): the one the operator means to put in force, so it is
    # protected from then on all the same.
    path: str | None = None


@dataclass(frozen=True, slots=True)
class Closing:
    """The session ends: calls still held are withdrawn and recorded, then `session_end`."""


Event = (
    ClientData
    | ClientEof
    | ClientGone
    | ServerData
    | ServerEof
    | ServerInputLost
    | CommitDone
    | CommitFailed
    | ApprovalAnswered
    | TimerFired
    | VisorRequest
    | VisorNotify
    | VisorForget
    | PolicyReloaded
    | PolicyReloadFailed
    | Closing
)

# ----------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class SendToServer:
    line: bytes  # one message, without its newline


@dataclass(frozen=True, slots=True)
class SendToClient:
    line: bytes


@dataclass(frozen=True, slots=True)
class AppendRecord:
    """Append to the audit log; durable with the next group commit, nothing waits for it."""

    event: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CommitRecord:
    """Append to the audit log and report `CommitDone`/`CommitFailed` for `call` once an fsync
    covering it has returned. The core holds the call (and what queues behind it) meanwhile."""

    event: dict[str, Any]
    call: ToolCallState


@dataclass(frozen=True, slots=True)
class Announce:
    """One line on stderr for a deny or an ask record (visor.watch.announce), by `logger`."""

    event: dict[str, Any]
    logger: str


@dataclass(frozen=True, slots=True)
class AskHuman:
    """Put `request` to the approval channels; report `ApprovalAnswered` for `call`."""

    call: ToolCallState
    request: ApprovalRequest
    ctx: CallContext
    out_of_band_only: bool


@dataclass(frozen=True, slots=True)
class WithdrawApproval:
    """The question about `call` is void (cancelled, or the session ends): withdraw it everywhere."""

    call: ToolCallState


@dataclass(frozen=True, slots=True)
class StartTimer:
    timer: Timer
    seconds: float


@dataclass(frozen=True, slots=True)
class CancelTimer:
    timer: Timer


@dataclass(frozen=True, slots=True)
class DeliverReply:
    """The answer to Visor's own request `rpc_id` to the client (or why there is none)."""

    rpc_id: str
    reply: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SavePins:
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SaveApprovals:
    """Destinations a human approved with "remember" (SessionState.export_approvals)."""

    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CloseServerInput:
    """Everything accepted for the server has been sent: close its stdin."""


@dataclass(frozen=True, slots=True)
class StopServer:
    """The client side ended: stop the server in order (stdin closed, then signals)."""


Action = (
    SendToServer
    | SendToClient
    | AppendRecord
    | CommitRecord
    | Announce
    | AskHuman
    | WithdrawApproval
    | StartTimer
    | CancelTimer
    | DeliverReply
    | SavePins
    | SaveApprovals
    | CloseServerInput
    | StopServer
)
