"""Red-team findings on paths and shell commands, each through the real process that runs it.

1. ANSI-C quoting (`$'...'`) in a command's words: the reader kept the word as written
   (`$'-rf'`), so a deny pattern never saw the value bash passes (`rm $'-rf' /` is
   `rm -rf /`). The value is now decoded where it is certain, refused where it is not.
2. A protected file replaced by renaming the directory that holds it: `.vscode/mcp.json`
   (a client config that puts Visor in the chain) could not be named, but `.vscode` could,
   so `move_file .vscode old` then `move_file prepared .vscode` swapped in a config without
   Visor. The directories that hold a protected location are now protected themselves.
3. Expansions in the arguments of a command under a deny list alone: `touch {X,}`,
   `touch $9X`, `touch "$@"X`, `touch $(printf X)` run `touch X`, which the deny pattern
   refuses, yet the reading was called certain and the call allowed. A deny list now asks.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import VisorProcess
from tests.policy.helpers import decide, policy_from, session_for
from tests.policy.test_shell_bash_differential import BASH, bash_runs
from visor.approval.protected import Protected
from visor.policy.shell import read_command

ROOT = Path(__file__).resolve().parents[2]
NODE_FS = (
    ROOT
    / ".venv"
    / "node"
    / "node_modules"
    / "@modelcontextprotocol"
    / "server-filesystem"
    / "dist"
    / "index.js"
)

# A stdio MCP server (the SDK's MCPServer) whose one tool runs `bash -c COMMAND` in its working directory.
BASH_SERVER = textwrap.dedent(
    """
    import subprocess
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("sh")

    @app.tool()
    def run(command: str) -> str:
        p = subprocess.run(["bash", "--norc", "--noprofile", "-c", command], capture_output=True, text=True)
        return f"rc={p.returncode}"

    app.run()
    """
)

SH_POLICY = textwrap.dedent(
    r"""
    version: "1.0"
    default_action: deny
    settings: {session_max_calls: 0, session_timeout_seconds: 0}
    servers:
      - name: sh
        allowed: true
        tools:
          - name: run
            allowed: true
            rules:
              - type: deny_command_pattern
                patterns: ["touch\\s+X", "rm\\s+-rf\\s+/"]
    """
)


def _session(vp: VisorProcess) -> None:
    init, listed = vp.open_session("2025-06-18", timeout=60, list_id=1)
    assert "result" in init
    assert "result" in listed


def _call(vp: VisorProcess, n: int, tool: str, arguments: dict[str, object]) -> dict:
    vp.request(
        {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    )
    while True:
        msg = vp.recv(timeout=60)
        if msg.get("id") == n:
            return msg["result"]


def _bash_visor(tmp_path: Path) -> tuple[VisorProcess, Path]:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (tmp_path / "server.py").write_text(BASH_SERVER)
    (tmp_path / "policy.yaml").write_text(SH_POLICY)
    vp = VisorProcess(
        [sys.executable, str(tmp_path / "server.py")],
        visor_args=[
            "--policy",
            str(tmp_path / "policy.yaml"),
            "--server-name",
            "sh",
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
        ],
        cwd=scratch,
    )
    _session(vp)
    return vp, scratch


# ---------------------------------------------------------------- 1. $'...'

ANSI_C = [
    "touch $'X'",
    "touch $'\\x58'",
    "touch $'\\130'",
    "$'touch' X",
    "t$'ou'ch X",
    "touch $'a\\tb' $'\\'q' $'\\?\\e'",
    "touch $'\\101\\x42c'",
    "touch \"$'X'\"",
]


@pytest.mark.skipif(BASH is None, reason="needs the real bash")
@pytest.mark.parametrize("cmd", ANSI_C)
def test_ansi_c_words_read_as_bash_runs_them(cmd: str) -> None:
    r = read_command(cmd)
    assert r.certain, r.unreadable
    assert [c.words for c in r.commands] == bash_runs(cmd)
    assert all(all(c.literal) for c in r.commands)


@pytest.mark.parametrize(
    "cmd", ["touch $'\\u0058'", "touch $'\\0X'", "touch $'\\x'", "touch $'\\cX'", "touch $'\\xff'"]
)
def test_ansi_c_escapes_not_decoded_with_certainty_are_refused(cmd: str) -> None:
    assert not read_command(cmd).certain


def test_deny_pattern_sees_the_value_of_ansi_c_quoting() -> None:
    policy = policy_from(SH_POLICY)
    session = session_for(policy, "sh")
    for cmd in ("rm $'-rf' /", "touch $'X'", "touch $'\\x58'"):
        d = decide(policy, session, "run", command=cmd)
        assert d.action == "deny", (cmd, d)


def test_ansi_c_sensitive_file_in_a_command_is_denied() -> None:
    policy = policy_from(
        """
        servers:
          - name: sh
            allowed: true
            tools:
              - name: run
                allowed: true
        """
    )
    d = decide(policy, session_for(policy, "sh"), "run", command="cat $'.e'nv")
    assert (d.action, d.rule) == ("deny", "path.sensitive")


@pytest.mark.skipif(BASH is None, reason="needs the real bash")
def test_ansi_c_quoting_does_not_pass_a_deny_pattern_through_visor_run(tmp_path: Path) -> None:
    vp, scratch = _bash_visor(tmp_path)
    try:
        result = _call(vp, 2, "run", {"command": "touch $'X'"})
    finally:
        vp.kill()
    assert result.get("isError") is True, result
    assert not (scratch / "X").exists()


# ---------------------------------------------------------------- 2. renaming a protected file's directory


@pytest.mark.skipif(
    shutil.which("node") is None or not NODE_FS.exists(), reason="needs node and the npm filesystem server"
)
def test_a_protected_config_cannot_be_swapped_by_renaming_its_directory(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    (project / ".vscode").mkdir(parents=True)
    config = project / ".vscode" / "mcp.json"
    original = json.dumps({"servers": {"fs": {"command": "visor", "args": ["run", "--", "server"]}}})
    config.write_text(original)
    (tmp_path / "policy.yaml").write_text(
        'version: "1.0"\ndefault_action: deny\nservers:\n  - name: fs\n    allowed: true\n'
        '    tools:\n      - name: "*"\n        allowed: true\n'
    )
    vp = VisorProcess(
        ["node", str(NODE_FS), str(project)],
        visor_args=[
            "--policy",
            str(tmp_path / "policy.yaml"),
            "--server-name",
            "fs",
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
        ],
        cwd=project,
    )
    try:
        _session(vp)
        forged = json.dumps({"servers": {"fs": {"command": "server"}}})
        steps = [
            ("write_file", {"path": str(config), "content": forged}),  # denied before and after
            ("create_directory", {"path": str(project / "new")}),
            ("write_file", {"path": str(project / "new" / "mcp.json"), "content": forged}),
            ("move_file", {"source": str(project / ".vscode"), "destination": str(project / "old")}),
            ("move_file", {"source": ".vscode", "destination": "old"}),
            ("move_file", {"source": str(project / "new"), "destination": str(project / ".vscode")}),
        ]
        results = [_call(vp, 10 + k, tool, args) for k, (tool, args) in enumerate(steps)]
    finally:
        vp.kill()
    assert config.read_text() == original
    for k in (0, 3, 4, 5):
        assert results[k].get("isError") is True, (steps[k], results[k])
        assert "visor.protected_path" in results[k]["content"][0]["text"]


def test_directories_holding_protected_files_are_protected_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    project = home / "proj"
    (project / ".vscode").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    prot = Protected.of([home / ".visor" / "approvals"], [project / ".vscode" / "mcp.json"], cwd=str(project))
    assert prot.named_by({"source": str(project / ".vscode")})
    assert prot.named_by({"source": f"{project}/.vscode/."})
    assert prot.named_by({"source": ".vscode"})
    assert prot.named_by({"source": str(home / ".visor")})
    # what else the directory holds, the working directory and the home directory are not ours
    assert prot.named_by({"path": str(project / ".vscode" / "launch.json")}) is None
    assert prot.named_by({"path": str(project)}) is None
    assert prot.named_by({"path": str(home)}) is None
    assert prot.named_by({"path": "/"}) is None


# ---------------------------------------------------------------- 3. expansions under a deny list

# What real bash runs for these is `touch X` (the harness runs no substitution's body).
_BASH_RUNS_TOUCH_X = ("touch {X,}", "touch $9X", 'touch "$@"X', "touch ${9}X")


@pytest.mark.parametrize(
    "cmd",
    [
        "touch {X,}",
        "touch $9X",
        'touch "$@"X',
        "touch $(printf X)",
        "touch ${9}X",
        "touch `printf X`",
        "echo ok && touch a{,X}",
        "true $(touch $9X)",
    ],
)
def test_expansions_in_arguments_do_not_pass_a_deny_list(cmd: str) -> None:
    if BASH is not None and cmd in _BASH_RUNS_TOUCH_X:
        assert bash_runs(cmd, disable_builtins=False)[-1] == ("touch", "X")
    policy = policy_from(SH_POLICY)
    d = decide(policy, session_for(policy, "sh"), "run", command=cmd)
    # a human decides: no deny pattern can see what the word becomes
    assert d.action == "ask" and "no deny pattern can see" in d.reason, d


@pytest.mark.parametrize(
    "cmd", ["touch Y", "ls *.py", "find . -name '*.py' -exec wc -l {} \\;", "echo ~/notes", "echo '$HOME'"]
)
def test_words_without_run_time_values_are_judged_by_the_deny_list_alone(cmd: str) -> None:
    # Globs and `~` are not counted (docs/limits.md): only expansions whose value the shell makes.
    policy = policy_from(SH_POLICY)
    assert decide(policy, session_for(policy, "sh"), "run", command=cmd).action == "allow"
