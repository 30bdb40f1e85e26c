"""The approval directory is held open from start-up: swapping what its path names redirects nothing.

Otherwise an agent that can rename directories through a wrapped tool could
move the real directory away, put one of its own at the path, and answer
there (or read the pending file there) under names Visor does not protect.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from visor.approval import model
from visor.approval.directory import DirectoryChannel, prepare


def _req() -> model.ApprovalRequest:
    return model.make_request(
        server="s",
        tool="send_email",
        arguments={"to": "evil@attacker.example"},
        request_id=1,
        session="sess",
        rule="r",
        reason="why",
        destination=None,
        argument=None,
        now=time.time(),
        timeout=60,
    )


def test_a_directory_swapped_after_start_up_neither_gets_the_pending_file_nor_answers(tmp_path: Path) -> None:
    real = prepare(tmp_path / "approvals")
    channel = DirectoryChannel(real)
    req = _req()

    async def scenario() -> model.ApprovalAnswer | None:
        # The swap happens before the call is asked about.
        moved = tmp_path / "moved"
        real.rename(moved)
        impostor = tmp_path / "approvals"
        impostor.mkdir(mode=0o700)
        task = asyncio.ensure_future(channel.ask(req))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if (moved / f"{req.id}.pending").exists() or (impostor / f"{req.id}.pending").exists():
                break
        assert not (impostor / f"{req.id}.pending").exists(), "the pending file went to the impostor"
        assert (moved / f"{req.id}.pending").exists()
        # An answer in the directory now at the path approves nothing.
        (impostor / f"{req.id}.answer").write_bytes(model.answer_record(req.id, req.call_hash, True, False))
        await asyncio.sleep(0.3)
        assert not task.done()
        task.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            return None

    assert asyncio.run(scenario()) is None
