"""Many concurrent `visor run` of one server: every one starts and keeps a log of its own.

Editor windows, parallel agents, a bridge that starts a process per HTTP
session: each is one `visor run` of the same server at the same time. A log
has one writer (its lock), so each session takes the next free name
(`<server>.jsonl`, `<server>-2.jsonl`, ...) and naming never caps them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import RECORDER, VisorProcess, sentinel

SESSIONS = 20


def test_twenty_concurrent_sessions_of_one_server_all_start_and_each_log_verifies(tmp_path: Path) -> None:
    home = Path(os.environ["VISOR_HOME"])
    procs = [
        VisorProcess([sys.executable, str(RECORDER)], visor_args=["--server-name", "same"])
        for _ in range(SESSIONS)
    ]
    try:
        # All of them alive at once: each answers through its own Visor.
        for i, vp in enumerate(procs):
            vp.request({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
            # Twenty Pythons starting at once on a small machine: a generous wait.
            assert "tools" in vp.recv(timeout=120)["result"], vp.stderr
            vp.request(
                {
                    "jsonrpc": "2.0",
                    "id": i,
                    "method": "tools/call",
                    "params": {"name": "echo", "arguments": {"session": i}},
                }
            )
            answer = vp.recv(timeout=60)
            assert answer["id"] == i and not answer["result"].get("isError"), answer
            sentinel(vp)
        assert all(vp.proc.poll() is None for vp in procs)
    finally:
        for vp in procs:
            vp.kill()
    assert [vp.proc.returncode for vp in procs] == [0] * SESSIONS, [vp.stderr for vp in procs]

    logs = sorted(p.name for p in (home / "audit").glob("*.jsonl"))
    expected = sorted(["same.jsonl", *(f"same-{n}.jsonl" for n in range(2, SESSIONS + 1))])
    assert logs == expected
    # One session per log, each with its own allow.
    sessions = set()
    calls = set()
    for name in logs:
        recs = [json.loads(x) for x in (home / "audit" / name).read_bytes().splitlines()]
        assert [r["event"] for r in recs].count("session_start") == 1
        sessions.add(recs[0]["session"])
        calls.update(json.dumps(r["args"]) for r in recs if r["event"] == "allow")
    assert len(sessions) == SESSIONS
    assert calls == {json.dumps({"session": i}) for i in range(SESSIONS)}

    verify = subprocess.run(
        [sys.executable, "-m", "visor.cli", "audit", "verify"], capture_output=True, text=True, timeout=60
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    ok = [line for line in verify.stdout.splitlines() if line.startswith("OK ")]
    assert len(ok) == SESSIONS, verify.stdout
    for name in logs:
        assert name in verify.stdout
