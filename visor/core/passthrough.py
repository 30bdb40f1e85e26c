"""The hooks the session core calls, each answering as Visor with no checks at all.

The session core (visor/core/session.py) calls a `Checks` for every message
that needs a judgement and acts on what it returns: `Forward` (relay these
bytes), `Answer` (send these bytes to the client; the server sees nothing),
`AwaitCommit` (relay once the allow record is durable) or `AwaitHuman` (put
this question to a human first). `Checks` itself passes every valid call
unchanged (`visor run --no-checks`); `PolicyChecks` (visor/core/checks.py)
overrides every hook with the policy's judgement.

Kept apart from `PolicyChecks` so that what the core and the relay need to run
imports neither the policy package nor the audit writer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from visor.logs import get_logger
from visor.wire import errors

if TYPE_CHECKING:
    from visor.approval.broker import Outcome
    from visor.approval.model import ApprovalRequest
    from visor.core.calls import Approval, CallContext, ToolCallState
    from visor.core.events import Action
    from visor.policy.schema import Policy
    from visor.wire.message import Message, Rejected

# The stderr lines of call decisions keep the name they always had.
log = get_logger("visor.gate")

# A tools/call that comes before any listing waits for Visor's own tools/list
# (every page) for at most this long; no answer or an error denies it.
LISTING_TIMEOUT_SECONDS = 15.0


@dataclass(frozen=True, slots=True)
class Forward:
    """Relay `line` to the server now (in its place in line)."""

    line: bytes


@dataclass(frozen=True, slots=True)
class Answer:
    """Send `line` to the client; the server sees nothing."""

    line: bytes


@dataclass(frozen=True, slots=True)
class AwaitCommit:
    """Append `record` durably, then `after`; relay `line` once the fsync covering `record` returned."""

    record: dict[str, Any]
    line: bytes
    after: tuple[dict[str, Any], ...]
    started: float


@dataclass(frozen=True, slots=True)
class AwaitHuman:
    """Put `request` to a human; the answer comes back through `Checks.on_approval`."""

    approval: Approval
    request: ApprovalRequest
    out_of_band_only: bool


Verdict = Forward | Answer | AwaitCommit | AwaitHuman


@dataclass(frozen=True, slots=True)
class Refuse:
    """A gated client request refused: answer the client with `line`; the server never sees it."""

    line: bytes


@dataclass(frozen=True, slots=True)
class Rewrite:
    """Send `line` to the server in place of the request (secrets in it redacted)."""

    line: bytes


RequestVerdict = Refuse | Rewrite | None


class Checks:
    """Forwards every valid call unchanged: the relay's behaviour with no checks at all."""

    def attach(self, emit: Callable[[Action], None]) -> None:
        """Where records and notices go: the core's list of actions for the event being handled."""

    def start(self) -> None:
        """The session begins (records its start)."""

    def needs_listing(self) -> bool:
        """Whether a tools/call now must wait for Visor's own tools/list (nothing is pinned)."""
        return False

    def on_tool_call(self, msg: Message, ctx: CallContext) -> Verdict:
        return Forward(msg.raw)

    def on_listing_page(self, result: dict[str, Any], cursor: Any) -> None:
        """One page of Visor's own tools/list."""

    def on_listing_failed(self, msg: Message, ctx: CallContext, failure: str) -> Answer:
        """A call that waited for Visor's tools/list, which failed: its denial."""
        return Answer(
            errors.tool_error_result(msg.id, f"Visor denied this call: {failure}", modern=ctx.modern)
        )

    def on_call_failed(self, msg: Message, ctx: CallContext, reason: str) -> Answer:
        """A step of judging the call raised: its denial (`internal.error`)."""
        return Answer(
            errors.tool_error_result(msg.id, "Visor denied this call: internal error", modern=ctx.modern)
        )

    def on_commit_failed(self, call: ToolCallState, error: str) -> Answer:
        text = f"Visor denied this call: the audit log cannot be written ({error})"
        return Answer(errors.tool_error_result(call.msg.id, text, modern=call.ctx.modern))

    def on_approval(self, approval: Approval, outcome: Outcome, ctx: CallContext) -> Verdict:
        """A human's answer (or why there is none) to the question `approval` asked last."""
        return Answer(errors.tool_error_result(approval.msg.id, "Visor denied this call", modern=ctx.modern))

    def on_cancelled(self, call: ToolCallState, *, closing: bool) -> None:
        """`call` was withdrawn before any verdict (the client cancelled it, or the session ended)."""

    def on_withdrawn(self, call: ToolCallState) -> None:
        """An allowed call was cancelled by the client before it was relayed; it never ran."""

    def on_tool_result(self, call: ToolCallState | None, tool: str | None, response: Message) -> bytes | None:
        """Observe a server's answer to a tools/call; return replacement bytes or None."""
        return None

    def on_tools_list(self, response: Message, request: Message | None = None) -> bytes | None:
        return None

    def on_client_request(self, msg: Message) -> RequestVerdict:
        """Any request but tools/call and initialize: `Refuse`, `Rewrite` or None (relay it)."""
        return None

    def on_response(self, method: str, response: Message) -> bytes | None:
        """Any answer but a tool call's or a tool listing's: replacement bytes or None."""
        return None

    def on_notification(self, msg: Message) -> bytes | None:
        """A server's notification: replacement bytes or None."""
        return None

    def on_server_request(self, msg: Message) -> bytes | None:
        """A request from the server: an error line to send back to it (refused), or None (relay it)."""
        return None

    def rewrite_server_request(self, msg: Message) -> bytes | None:
        """A relayed server request as the client may see it, or None to relay it unchanged."""
        return None

    def on_server_info(self, info: dict[str, Any]) -> None:
        """The server said who it is (initialize or server/discover)."""

    def on_roots(self, response: Message) -> None:
        """The client's answer to the server's roots/list, before the server reads it."""

    def on_reject(
        self,
        direction: str,
        reason: str,
        rejected: Rejected | None,
        *,
        size: int | None = None,
        digest: str | None = None,
    ) -> None:
        """A wire-level refusal in either direction: `size` and `digest` (SHA-256) of the refused line."""

    def on_close(self) -> None:
        """The session is over (after every held call was withdrawn)."""

    def on_policy_reload(self, policy: Policy, path: str | None = None) -> None:
        """A new policy, loaded and validated (from `path`, None for the embedded default):
        put it in force (between two events)."""
        log.warning("policy_reload_ignored", detail="--no-checks: there is no policy to reload")

    def on_policy_reload_failed(
        self, source: str, error: str, sha256: str | None, path: str | None = None
    ) -> None:
        """A reload whose policy could not be loaded (from `path`): the one in force stays."""
        log.warning("policy_reload_ignored", detail="--no-checks: there is no policy to reload")
