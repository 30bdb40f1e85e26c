"""Visor's own files are named by no request at all, not only tools/call, resources/read and prompts/get.

Through a real ``visor run`` in front of an SDK server whose resource template
``file:///{path}`` completes a partial path by listing it (tests/servers/sdk_files.py):
a ``completion/complete`` of the approval directory listed the pending
approvals to the agent, and a request of a method Visor knows nothing of went
to the server whatever it named. Both are now refused on record; completions
elsewhere still work.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.conftest import VisorProcess

SERVER = [sys.executable, str(Path(__file__).parents[1] / "servers" / "sdk_files.py")]


def _start(tmp_path: Path) -> tuple[VisorProcess, Path]:
    approvals = tmp_path / "approvals"
    approvals.mkdir(mode=0o700)
    (approvals / "0f3a9c.pending").write_text("{}")
    vp = VisorProcess(
        SERVER,
        visor_args=[
            "--server-name",
            "files",
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
            "--approval-dir",
            str(approvals),
        ],
        env={"VISOR_HOME": str(tmp_path / "home")},
    )
    vp.open_session("2025-06-18")
    return vp, approvals


def _complete(vp: VisorProcess, msg_id: int, value: str) -> dict:
    ref = {"type": "ref/resource", "uri": "file:///{path}"}
    vp.request(
        {
            "jsonrpc": "2.0",
            "id": msg_id,
            "method": "completion/complete",
            "params": {"ref": ref, "argument": {"name": "path", "value": value}},
        }
    )
    return vp.recv()


def _denials(tmp_path: Path) -> list[dict]:
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == "deny"]


def test_a_completion_never_lists_the_approval_directory(tmp_path: Path) -> None:
    vp, approvals = _start(tmp_path)
    try:
        # the template puts the leading slash in: the value alone names nothing Visor could place
        resp = _complete(vp, 5, str(approvals).lstrip("/") + "/")
        assert resp["error"]["data"]["visor"]["rule"] == "visor.protected_path", resp
        assert "0f3a9c" not in json.dumps(resp)
        # completing anywhere else still works
        (tmp_path / "notes").mkdir()
        (tmp_path / "notes" / "plan.txt").write_text("x")
        ok = _complete(vp, 6, str(tmp_path / "notes").lstrip("/") + "/pl")
        assert ok["result"]["completion"]["values"] == [str(tmp_path / "notes" / "plan.txt").lstrip("/")], ok
    finally:
        vp.kill()
    (deny,) = _denials(tmp_path)
    assert deny["method"] == "completion/complete" and deny["rule"] == "visor.protected_path"


def test_a_request_visor_knows_nothing_of_never_carries_its_files(tmp_path: Path) -> None:
    vp, approvals = _start(tmp_path)
    try:
        vp.request(
            {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "files/read",
                "params": {"path": str(approvals / "0f3a9c.pending")},
            }
        )
        resp = vp.recv()
        assert resp["error"]["data"]["visor"]["rule"] == "visor.protected_path", resp
        # the same method naming nothing of Visor's reaches the server (which does not know it)
        vp.request({"jsonrpc": "2.0", "id": 8, "method": "files/read", "params": {"path": "/srv/x"}})
        other = vp.recv()
        assert other["error"]["code"] == -32601, other
    finally:
        vp.kill()
    assert [d["method"] for d in _denials(tmp_path)] == ["files/read"]
