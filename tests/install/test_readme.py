"""The README's commands, run as a new user would: in order, in a fresh $HOME, without VISOR_HOME.

Every fenced ```sh block is read from README.md and each command line is run
with bash in a project directory holding the `.mcp.json` the README shows
(its first ```json block). Skipped, and only these:

* `make ...` lines: they build the venv this test already runs in
  (`make demo` and `make test` are what brought you here);
* lines that need a real desktop client: none today (the list is below, and
  checked to be still in the README, so it cannot go stale silently).

`uvx` is replaced by a stand-in on PATH that runs the `mcp-server-time`
installed in this venv: the real one would download it, and tests use no
network. `visor` is on PATH as after `pipx install`. Where the README says
a client uses a wrapped server, the test plays the client: it starts the
wrapped entry's command and makes a few calls, so that the audit commands
after it have real logs to read.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
from pathlib import Path

import pytest

from tests.install.helpers import VENV_BIN

README = Path(__file__).parents[2] / "README.md"
NEEDS_A_DESKTOP_CLIENT: tuple[str, ...] = ()


def shell_blocks(text: str) -> list[list[str]]:
    """The command lines of each ```sh block (comments and blank lines dropped)."""
    blocks = []
    for m in re.finditer(r"^```sh\n(.*?)^```", text, re.S | re.M):
        lines = [ln.strip() for ln in m.group(1).splitlines()]
        blocks.append([ln for ln in lines if ln and not ln.startswith("#")])
    return blocks


def first_json_block(text: str) -> dict:
    m = re.search(r"^```json\n(.*?)^```", text, re.S | re.M)
    assert m, "README.md has no ```json example of a client config"
    return json.loads(m.group(1))


def _env(home: Path, bin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "VISOR_HOME"}
    env["HOME"] = str(home)
    env["PATH"] = os.pathsep.join([str(bin_dir), str(VENV_BIN), "/usr/bin", "/bin"])
    return env


def _run(line: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """One line through bash, with a pseudo-terminal as stdin that answers `y` to a question."""
    main, secondary = pty.openpty()
    proc = subprocess.Popen(
        ["bash", "-c", line],
        stdin=secondary,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=env,
    )
    os.close(secondary)
    os.write(main, b"y\n")
    out, _ = proc.communicate(timeout=180)
    os.close(main)
    return proc.returncode, out.decode(errors="replace")


def _play_client(entry: dict, cwd: Path, env: dict[str, str]) -> None:
    """What the client does with a wrapped entry: start it, list tools, call one."""
    msgs = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "readme-test", "version": "1"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "get_current_time", "arguments": {"timezone": "UTC"}},
        },
        {
            "jsonrpc": "2.0",
            "id": 4,
            "method": "tools/call",
            "params": {"name": "not_a_listed_tool", "arguments": {}},
        },
    ]
    proc = subprocess.Popen(
        [entry["command"], *entry["args"]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    answers: dict[int, dict] = {}
    for msg in msgs:
        proc.stdin.write(json.dumps(msg).encode() + b"\n")
        proc.stdin.flush()
        if "id" in msg:
            while msg["id"] not in answers:
                line = proc.stdout.readline()
                assert line, proc.stderr.read().decode() if proc.stderr else ""
                got = json.loads(line)
                if "id" in got:
                    answers[got["id"]] = got
    _, err = proc.communicate(timeout=60)  # closes stdin: the client goes away
    assert answers[3]["result"].get("isError") is not True, answers[3]
    assert answers[4]["result"].get("isError") is True, answers[4]
    # the deny was announced on stderr, the client's MCP log
    assert "not_a_listed_tool" in err.decode() and "deny" in err.decode(), err.decode()


def test_every_readme_command_runs_for_a_new_user(tmp_path: Path) -> None:
    if not (VENV_BIN / "mcp-server-time").exists():
        pytest.fail("mcp-server-time is not installed in the venv; install the test extra")
    text = README.read_text(encoding="utf-8")
    for line in NEEDS_A_DESKTOP_CLIENT:
        assert line in text, f"stale skip list: {line!r} is no longer in the README"
    blocks = shell_blocks(text)
    assert blocks[0][:2] == ["make demo", "make test"] or all(ln.startswith("make ") for ln in blocks[0]), (
        "the README's first commands are make demo and make test"
    )

    home = tmp_path / "home"
    project = home / "project"
    bin_dir = tmp_path / "bin"
    for d in (project, bin_dir):
        d.mkdir(parents=True)
    uvx = bin_dir / "uvx"
    uvx.write_text(
        "#!/bin/sh\n# stand-in for uvx: the real one downloads; this runs the installed server\n"
        f'if [ "$1" = mcp-server-time ]; then shift; exec {VENV_BIN / "mcp-server-time"} "$@"; fi\n'
        'echo "stand-in uvx: only mcp-server-time" >&2; exit 1\n'
    )
    uvx.chmod(0o755)
    config = project / ".mcp.json"
    config.write_text(json.dumps(first_json_block(text), indent=2) + "\n")
    env = _env(home, bin_dir)

    ran = 0
    wrapped: dict | None = None
    played = False
    for block in blocks:
        if any(ln.startswith("visor audit") or ln.startswith("visor report") for ln in block) and not played:
            assert wrapped is not None, (
                "no command in the README wrapped the server before the audit commands"
            )
            _play_client(wrapped, project, env)
            played = True
        for line in block:
            if line.startswith("make ") or line in NEEDS_A_DESKTOP_CLIENT:
                continue
            code, out = _run(line, project, env)
            assert code == 0, f"README command failed ({code}): {line}\n{out}"
            assert "Traceback" not in out, f"{line}\n{out}"
            ran += 1
            entry = json.loads(config.read_text())["mcpServers"]["time"]
            if entry.get("command") != "uvx":
                wrapped = entry
    assert played, "the README has no audit commands after the server is wrapped"
    assert ran >= 10
    # what the README promised along the way
    assert (home / ".visor" / "time.yaml").is_file()
    assert (home / ".visor" / "review.md").is_file()
    assert oct((home / ".visor").stat().st_mode & 0o777) == "0o700"
    assert (
        json.loads(config.read_text())["mcpServers"]["time"] == first_json_block(text)["mcpServers"]["time"]
    )
