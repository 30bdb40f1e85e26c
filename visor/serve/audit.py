"""One MCP session's view of the gateway's shared audit writer.

A log has one writer, and the gateway keeps one log for every session it serves; each session's
records must still say which MCP session they belong to. The writer's own `session` field names
the gateway process (the chain), and this view adds `mcp_session` to every event it hands on.
The field is part of the hashed body like any other, so `visor audit verify` checks it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio
    from contextlib import AbstractContextManager

    from visor.audit.writer import AuditStats, AuditWriter

FIELD = "mcp_session"


class SessionAudit:
    """What the relay reads of an `AuditWriter`, for one MCP session; closing it closes nothing."""

    __slots__ = ("_mcp_session", "_writer")

    def __init__(self, writer: AuditWriter, mcp_session: str) -> None:
        self._writer = writer
        self._mcp_session = mcp_session

    def _tagged(self, event: dict[str, Any]) -> dict[str, Any]:
        return {**event, FIELD: self._mcp_session}

    def append(self, event: dict[str, Any]) -> dict[str, Any]:
        return self._writer.append(self._tagged(event), key=self._mcp_session)

    def submit(self, event: dict[str, Any], *, sole: bool = False) -> asyncio.Future[dict[str, Any]]:
        # The session is the writer's key: a sole call is committed on the loop's thread only
        # while no other session writes (visor/audit/writer.py).
        return self._writer.submit(self._tagged(event), key=self._mcp_session, sole=sole)

    async def commit(self, event: dict[str, Any]) -> dict[str, Any]:
        return await self._writer.commit(self._tagged(event))

    def batch(self) -> AbstractContextManager[None]:
        # one wake-up of the shared writer for a read's worth of records, as on stdio
        return self._writer.batch()

    async def close(self) -> None:
        # The gateway closes the shared writer once, when it stops; a session ending must not.
        return None

    @property
    def healthy(self) -> bool:
        return self._writer.healthy

    @property
    def path(self) -> Path:
        return self._writer.path

    @property
    def session(self) -> str:
        return self._writer.session

    @property
    def checkpoints(self) -> int:
        return self._writer.checkpoints

    @property
    def stats(self) -> AuditStats:
        return self._writer.stats
