"""Visor's own files are sought from every directory the server reads relative names from.

The npm filesystem server resolves a relative name against each of its allowed
directories: the ones on its command line, or the client's roots, which
replace them. Visor read relative names only from the working directory, so
with the home directory allowed and the session started in a project below it,
``.visor/approvals/ID.pending`` was ``~/project/.visor/...`` to Visor (nothing of
its own, inside the allowed prefix) and ``~/.visor/approvals/ID.pending`` to the
server: the agent read the pending approval, whose hash an answer must carry,
and could write the answer beside it. Through a real ``visor run`` in front of
the real server, nothing of Visor's is read or written, from the command
line's directories or from roots the client announced later.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.conftest import VisorProcess

NODE = Path(__file__).parents[2] / ".venv" / "node" / "node_modules" / ".bin" / "mcp-server-filesystem"
SECRET = "hash-the-answer-must-carry"

POLICY = """\
version: "1.0"
default_action: allow
servers:
  - name: "filesystem"
    allowed: true
    tools:
      - name: "read_text_file"
        allowed: true
        allowed_path_prefixes: ["{home}"]
      - name: "write_file"
        allowed: true
        write_params: ["path"]
        allowed_path_prefixes: ["{home}"]
"""


def _home(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A home directory with Visor's approval directory (a pending question in it) and a project."""
    if not NODE.exists():
        pytest.fail("the npm filesystem server is not installed; `make test` installs it")
    home = tmp_path / "home"
    approvals = home / ".visor" / "approvals"
    approvals.mkdir(parents=True)
    for d in (home / ".visor", approvals):
        os.chmod(d, 0o700)
    (approvals / "0f3a9c.pending").write_text(SECRET)
    project = home / "project"
    project.mkdir()
    return home, approvals, project


def _visor(tmp_path: Path, home: Path, approvals: Path, project: Path, allowed: Path) -> VisorProcess:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(home=home))
    return VisorProcess(
        [str(NODE), str(allowed)],
        visor_args=[
            "--server-name",
            "filesystem",
            "--policy",
            str(policy),
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
            "--approval-dir",
            str(approvals),
        ],
        env={"HOME": str(home), "VISOR_HOME": str(home / ".visor")},
        cwd=project,
    )


def _call(vp: VisorProcess, msg_id: int, tool: str, arguments: dict) -> dict:
    vp.request(
        {
            "jsonrpc": "2.0",
            "id": msg_id,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments},
        }
    )
    while True:
        msg = vp.recv()
        if msg.get("id") == msg_id and "method" not in msg:
            return msg


def _denied_as_visors(resp: dict) -> None:
    text = resp["result"]["content"][0]["text"]
    assert resp["result"]["isError"] is True and "visor.protected_path" in text, resp
    assert SECRET not in text


def test_relative_names_from_the_servers_allowed_directory_are_visors(tmp_path: Path) -> None:
    home, approvals, project = _home(tmp_path)
    vp = _visor(tmp_path, home, approvals, project, allowed=home)
    try:
        vp.open_session("2025-06-18")
        _denied_as_visors(_call(vp, 1, "read_text_file", {"path": ".visor/approvals/0f3a9c.pending"}))
        _denied_as_visors(
            _call(vp, 2, "write_file", {"path": ".visor/approvals/0f3a9c.answer", "content": "approve"})
        )
        _denied_as_visors(
            _call(vp, 3, "read_text_file", {"path": "./.visor/../.visor/approvals/0f3a9c.pending"})
        )
        # the project's own files still read as before
        (project / "notes.txt").write_text("plans")
        (home / "notes.txt").write_text("plans")
        ok = _call(vp, 4, "read_text_file", {"path": "notes.txt"})
        assert ok["result"]["content"][0]["text"] == "plans", ok
    finally:
        vp.kill()
    assert not (approvals / "0f3a9c.answer").exists()


def test_relative_names_from_roots_the_client_announced_are_visors(tmp_path: Path) -> None:
    home, approvals, project = _home(tmp_path)
    vp = _visor(tmp_path, home, approvals, project, allowed=project)
    try:
        vp.request(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {"roots": {"listChanged": True}},
                    "clientInfo": {"name": "t", "version": "1"},
                },
            }
        )
        assert vp.recv()["id"] == 0
        vp.request({"jsonrpc": "2.0", "method": "notifications/initialized"})
        ask = vp.recv()
        assert ask["method"] == "roots/list", ask
        root = {"uri": approvals.as_uri(), "name": "inbox"}
        vp.request({"jsonrpc": "2.0", "id": ask["id"], "result": {"roots": [root]}})
        # the server takes the roots in on its own time
        deadline = time.monotonic() + 20
        while True:
            listed = _call(vp, 9, "list_allowed_directories", {})
            if str(approvals) in listed["result"]["content"][0]["text"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert str(approvals) in listed["result"]["content"][0]["text"], listed
        _denied_as_visors(_call(vp, 1, "read_text_file", {"path": "0f3a9c.pending"}))
        _denied_as_visors(_call(vp, 2, "write_file", {"path": "0f3a9c.answer", "content": "approve"}))
    finally:
        vp.kill()
    assert not (approvals / "0f3a9c.answer").exists()
