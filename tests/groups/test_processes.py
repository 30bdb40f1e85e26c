"""Real processes sharing one group: what one records, another sees; concurrent writers lose nothing."""

from __future__ import annotations

import json
import os

from tests.groups.helpers import child_env, run_py, spawn_py
from visor.groups import store as gs

MAIL = """
import json
from visor.groups import store as gs
with gs.GroupStore("client-1", "mail") as s:
    s.record({gs.OUTPUT: ["email:attacker@evil.example", "host:evil.example"],
              gs.ASSERTED: ["email:colleague@corp.example"]})
    s.raise_taint("read_inbox", "read_email")
    s.approve("email:bob@corp.example", tool="send_email", argument="to", remember=True)
print(json.dumps("ok"))
"""

CHAT = """
import json
from visor.groups import store as gs
with gs.GroupStore("client-1", "chat") as s:
    print(json.dumps({
        "attacker": s.seen_any(["email:attacker@evil.example"]),
        "host": s.seen("host:evil.example"),
        "unseen": s.seen("email:someone@else.example"),
        "colleague": s.seen("email:colleague@corp.example", gs.ASSERTED),
        "where": s.where(["host:evil.example"]),
        "taints": sorted(s.taints()),
        "bob": s.approved("email:bob@corp.example"),
        "eve": s.approved("email:eve@evil.example"),
    }))
"""


def test_what_one_server_saw_another_process_sees() -> None:
    assert run_py(MAIL) == "ok"
    got = run_py(CHAT)
    assert got == {
        "attacker": True,
        "host": True,
        "unseen": False,
        "colleague": True,
        "where": "mail",
        "taints": ["read_inbox"],
        "bob": True,
        "eve": False,
    }


def test_another_group_sees_nothing() -> None:
    run_py(MAIL)
    other = CHAT.replace('"client-1"', '"client-2"')
    got = run_py(other)
    assert got["attacker"] is False and got["taints"] == [] and got["bob"] is False


WRITER = """
import json, sys
from visor.groups import store as gs
me = sys.argv[1] if len(sys.argv) > 1 else "{me}"
# a generous busy timeout: this test is about lost updates, not about waiting
with gs.GroupStore("busy", f"server-{{me}}", busy_timeout=60) as s:
    print("ready", flush=True)
    sys.stdin.readline()  # all writers start together
    for batch in range(40):
        keys = [f"token:{{me}}-{{batch}}-{{i}}" for i in range(50)]
        keys.append(f"token:shared-{{batch}}")  # every writer also writes the same keys
        s.record_outputs(keys)  # one transaction; a lock held past the busy timeout raises
        if batch % 10 == 0:
            s.raise_taint(f"taint-{{me}}")
print(json.dumps("done"))
"""


def test_four_concurrent_writers_lose_nothing() -> None:
    env = child_env()
    procs = [spawn_py(WRITER.format(me=n), env=env) for n in range(4)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err
            assert json.loads(out.strip().splitlines()[-1]) == "done"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    with gs.GroupStore("busy", "checker") as s:
        assert not s.lost
        assert s.count() == 4 * 40 * 50 + 40
        for n in range(4):
            for batch in range(40):
                assert s.seen_any([f"token:{n}-{batch}-{i}" for i in range(50)]) is True
                for i in (0, 25, 49):
                    assert s.seen(f"token:{n}-{batch}-{i}") is True
        assert all(s.seen(f"token:shared-{b}") is True for b in range(40))
        assert s.taints() == frozenset(f"taint-{n}" for n in range(4))
    # every file of the group stayed private under concurrent creation
    folder = gs.groups_dir()
    assert all(os.stat(p).st_mode & 0o077 == 0 for p in folder.iterdir())


FIRST_OPEN = """
import json, sys
from visor.groups import store as gs
sys.stdin.readline()
with gs.GroupStore("race", sys.argv[1] if len(sys.argv) > 1 else "x") as s:
    print(json.dumps(s.digest("email:a@b.example").hex()))
"""


def test_members_created_at_once_agree_on_one_key() -> None:
    env = child_env()
    procs = [spawn_py(FIRST_OPEN, env=env) for _ in range(4)]
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    digests = set()
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        digests.add(json.loads(out.strip().splitlines()[-1]))
    assert len(digests) == 1
