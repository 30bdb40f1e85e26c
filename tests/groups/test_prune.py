"""Pruning: only groups whose processes are all gone, and whose files are old, are removed."""

from __future__ import annotations

import os
import time

from tests.groups.helpers import run_py
from visor.groups import store as gs

# A member in a process that then exits; its client is itself (dead too) or its parent (this test).
MEMBER = """
import json, os
from visor.groups import identity, store as gs
me = identity.process_info(os.getpid())
client = {client}
with gs.GroupStore({name!r}, "mail", client=client) as s:
    s.record_outputs(["email:x@y.example"])
print(json.dumps(str(s.path)))
"""
DEAD_CLIENT = 'identity.GroupIdentity("x", "parent", os.getpid(), me.start)'
LIVE_CLIENT = "identity.resolve(env={})"  # the parent: this test process


def _age(name: str, seconds: float) -> None:
    old = time.time() - seconds
    for p in gs.groups_dir().glob(f"{name}.sqlite*"):
        os.utime(p, (old, old))


def test_prune_removes_only_dead_old_groups() -> None:
    run_py(MEMBER.format(name="dead", client=DEAD_CLIENT))
    run_py(MEMBER.format(name="young", client=DEAD_CLIENT))
    run_py(MEMBER.format(name="client-alive", client=LIVE_CLIENT))
    run_py(MEMBER.format(name="member-alive", client=DEAD_CLIENT))
    held = gs.GroupStore("member-alive", "chat")  # a member of it lives on in this process
    folder = gs.groups_dir()
    (folder / "corrupt.sqlite").write_bytes(b"not a database " * 100)
    (folder / "empty.sqlite").write_bytes(b"")
    os.chmod(folder / "corrupt.sqlite", 0o600)
    for name in ("dead", "client-alive", "member-alive", "corrupt", "empty"):
        _age(name, 7 * 3600)
    try:
        removed = gs.prune_stale(6 * 3600)
        assert sorted(removed) == ["dead", "empty"]
        names = {p.name for p in folder.iterdir()}
        assert not any(n.startswith(("dead.", "empty.")) for n in names)
        for kept in ("young", "client-alive", "member-alive", "corrupt"):
            assert f"{kept}.sqlite" in names
        assert held.seen("email:x@y.example") is True
        # nothing is old enough under a longer age
        assert gs.prune_stale(8 * 3600) == []
    finally:
        held.close()
    # a pruned group starts afresh when a member opens it again
    with gs.GroupStore("dead", "mail") as s:
        assert s.seen("email:x@y.example") is False and not s.lost


def test_prune_without_a_groups_folder_is_a_no_op() -> None:
    assert gs.prune_stale() == []


def test_prune_waits_for_no_one_and_skips_a_group_while_a_member_joins() -> None:
    run_py(MEMBER.format(name="dead", client=DEAD_CLIENT))
    _age("dead", 7 * 3600)
    # a member between its check of the file and its registration holds the lock shared
    with gs._folder_lock(gs.groups_dir(), exclusive=False, wait=True) as held:
        assert held
        assert gs.prune_stale(6 * 3600) == []
    assert (gs.groups_dir() / "dead.sqlite").exists()
    assert gs.prune_stale(6 * 3600) == ["dead"]
