"""Ask every channel the operator chose about one request; the first answer wins.

Which channels: the operator's. The out-of-band ones (`--approval-dir`,
`--approval-tty`) are asked whenever they are configured. MCP elicitation
goes through the client, whose code can accept without showing anyone the
question, so when an out-of-band channel is configured it is used only with
`--approval-elicitation`; a tool whose policy says `approval: out_of_band`
is never elicited; and only a capability the client declared in
`initialize` counts (one that first appears in a call's `_meta` does not).

The chosen channels race rather than run in turn: a human at a terminal
should not wait for a client dialog to time out, and the policy's approval
timeout bounds the whole wait once. When one channel answers, the others are
withdrawn (the pending file deleted, the client told to cancel its dialog,
the terminal prompt cleared). A channel that fails (an error reply, a
malformed answer, a file it cannot write) drops out; if none is left, the
call is denied.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any, Protocol

from visor.approval import elicitation
from visor.approval.model import ApprovalAnswer, ApprovalRequest
from visor.logs import get_logger

log = get_logger("visor.approval")

PROGRESS_SECONDS = 3.0


class ClientLink(Protocol):
    """What the relay offers Visor for talking to the client on its own account."""

    def request(self, method: str, params: dict[str, Any]) -> tuple[str, asyncio.Future[dict[str, Any]]]: ...

    def notify(self, method: str, params: dict[str, Any]) -> None: ...

    def forget(self, rpc_id: str) -> None: ...

    def client_name(self) -> str | None: ...


def handshake_capabilities(link: Any) -> dict[str, Any] | None:
    """The capabilities the client declared in `initialize`, and nothing a later call's `_meta` says.

    The relay's link offers them as `client_capabilities()` when it has that
    method; otherwise they are read from the relay's protocol state, which
    `initialize` alone sets.
    """
    getter = getattr(link, "client_capabilities", None)
    if callable(getter):
        caps = getter()
    else:
        state = getattr(getattr(link, "_relay", None), "state", None)
        caps = getattr(state, "client_capabilities", None)
    return caps if type(caps) is dict else None


class Channel(Protocol):
    name: str

    async def ask(self, req: ApprovalRequest) -> ApprovalAnswer | None: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    answer: ApprovalAnswer | None
    # why there is no answer: "unavailable", "timeout", "failed"
    failure: str | None = None


class ElicitationChannel:
    name = "elicitation"

    def __init__(self, link: ClientLink) -> None:
        self._link = link

    async def ask(self, req: ApprovalRequest) -> ApprovalAnswer | None:
        rpc_id, fut = self._link.request("elicitation/create", elicitation.request_params(req))
        try:
            response = await fut
        except asyncio.CancelledError:
            # The wait ended elsewhere: the client's dialog must go too.
            self._link.forget(rpc_id)
            self._link.notify(
                "notifications/cancelled",
                {"requestId": rpc_id, "reason": "the approval is no longer needed"},
            )
            raise
        # The answer comes through the client's UI; its clientInfo name is
        # the best "who" Visor can know.
        answer = elicitation.parse_response(response, req, self._link.client_name())
        if answer is None:
            log.warning("elicitation_failed", id=req.id, response=str(response)[:200])
        return answer


class ApprovalBroker:
    def __init__(self, *, channels: list[Channel], timeout: float, elicitation: bool | None = None) -> None:
        """`channels`: the out-of-band channels configured (directory, terminal).

        `elicitation`: may the client's elicitation be used at all. None (the
        default) means only when no out-of-band channel is configured; the
        operator turns it on next to one with `--approval-elicitation`.
        """
        self.channels = channels
        self.timeout = timeout
        self.elicitation = not channels if elicitation is None else elicitation
        self.link: ClientLink | None = None

    @property
    def out_of_band(self) -> bool:
        """True if a channel outside the client (directory, terminal) is configured."""
        return bool(self.channels)

    def elicitation_for(self, ctx: Any, *, out_of_band_only: bool = False) -> bool:
        """Whether this call's question may go to the client as an elicitation."""
        if not self.elicitation or out_of_band_only or self.link is None:
            return False
        # Over stdio on the 2026-07-28 revision the SDK client has no
        # back-channel for server requests: it answers elicitation/create with
        # "method not found". Elicitation is for the handshake revisions only.
        if getattr(ctx, "modern", False):
            return False
        # Declared in initialize, and not withdrawn by this call's _meta: a
        # capability that first appears in a call's _meta enables nothing.
        return elicitation.client_supports_form(
            handshake_capabilities(self.link)
        ) and elicitation.client_supports_form(getattr(ctx, "client_capabilities", None))

    def channels_for(self, ctx: Any, *, out_of_band_only: bool = False) -> list[Channel]:
        chosen: list[Channel] = []
        if self.elicitation_for(ctx, out_of_band_only=out_of_band_only):
            assert self.link is not None
            chosen.append(ElicitationChannel(self.link))
        chosen.extend(self.channels)
        return chosen

    async def ask(self, req: ApprovalRequest, ctx: Any, *, out_of_band_only: bool = False) -> Outcome:
        channels = self.channels_for(ctx, out_of_band_only=out_of_band_only)
        if not channels:
            return Outcome(None, "unavailable")
        tasks = [asyncio.ensure_future(c.ask(req)) for c in channels]
        progress = self._progress(req, getattr(ctx, "progress_token", None))
        try:
            async with asyncio.timeout(self.timeout):
                remaining = set(tasks)
                while remaining:
                    done, remaining = await asyncio.wait(remaining, return_when=asyncio.FIRST_COMPLETED)
                    for t in tasks:  # in channel order when two finish together
                        if t in done and not t.cancelled() and t.exception() is None:
                            answer = t.result()
                            if answer is not None:
                                return Outcome(answer)
                        elif t in done and not t.cancelled():
                            log.error("approval_channel_failed", error=repr(t.exception()))
            return Outcome(None, "failed")
        except TimeoutError:
            return Outcome(None, "timeout")
        finally:
            for t in (*tasks, *([progress] if progress else [])):
                t.cancel()
            # Let every channel withdraw before the verdict goes out.
            for t in (*tasks, *([progress] if progress else [])):
                with contextlib.suppress(BaseException):
                    await t

    def _progress(self, req: ApprovalRequest, token: Any) -> asyncio.Task[None] | None:
        if token is None or self.link is None:
            return None
        link = self.link

        async def beat() -> None:
            # Clients that reset their request timeout on progress keep
            # waiting while a human decides.
            n = 0
            while True:
                link.notify(
                    "notifications/progress",
                    {
                        "progressToken": token,
                        "progress": n,
                        "message": f"waiting for a human to approve (approval id {req.id})",
                    },
                )
                n += 1
                await asyncio.sleep(PROGRESS_SECONDS)

        return asyncio.get_running_loop().create_task(beat())
