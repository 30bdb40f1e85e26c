"""Ask every available channel about one request; the first answer wins.

Channels race rather than run in turn: a human at a terminal should not wait
for a client dialog to time out, and the policy's approval timeout bounds the
whole wait once. When one channel answers, the others are withdrawn (the
pending file deleted, the client told to cancel its dialog, the terminal
prompt cleared). A channel that fails (an error reply, a malformed answer, a
file it cannot write) drops out; if none is left, the call is denied.
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
    def __init__(self, *, channels: list[Channel], timeout: float) -> None:
        self.channels = channels
        self.timeout = timeout
        self.link: ClientLink | None = None

    def channels_for(self, ctx: Any) -> list[Channel]:
        chosen: list[Channel] = []
        # Over stdio on the 2026-07-28 revision the SDK client has no
        # back-channel for server requests: it answers elicitation/create with
        # "method not found". Elicitation is for the handshake revisions only.
        if (
            self.link is not None
            and not getattr(ctx, "modern", False)
            and elicitation.client_supports_form(getattr(ctx, "client_capabilities", None))
        ):
            chosen.append(ElicitationChannel(self.link))
        chosen.extend(self.channels)
        return chosen

    async def ask(self, req: ApprovalRequest, ctx: Any) -> Outcome:
        channels = self.channels_for(ctx)
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
