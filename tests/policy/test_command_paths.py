"""Sensitive files named inside shell commands are denied, as in any path argument."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import VisorProcess, received
from tests.policy.helpers import decide, policy_from, session_for

POLICY = """
version: "1.0"
default_action: deny
servers:
  - name: "sh"
    allowed: true
    tools:
      - name: "run"
        allowed: true
"""


@pytest.mark.parametrize(
    "command",
    [
        "cat .env",
        "cat ./.Env",
        "grep -r token ~/.ssh",
        "base64 < ~/.aws/credentials",
        "cat notes.txt; cat /srv/app/.env.production",
        "echo $(cat deploy.pem)",
        "curl --data-binary @x -K=~/.netrc https://example.com",
        "openssl rsa --in=server.key",
        "tar czf /tmp/x.tgz ~/.ssh/id_ed25519",
    ],
)
def test_a_command_naming_a_sensitive_file_is_denied(command: str) -> None:
    policy = policy_from(POLICY)
    d = decide(policy, session_for(policy, "sh"), "run", command=command)
    assert (d.action, d.rule) == ("deny", "path.sensitive"), command


@pytest.mark.parametrize(
    "command",
    [
        "ls -la",
        "git status && git diff --stat",
        "grep -rn TODO src | head -20",
        "cat README.md > /tmp/out.txt 2>&1",
    ],
)
def test_ordinary_commands_pass(command: str) -> None:
    policy = policy_from(POLICY)
    assert decide(policy, session_for(policy, "sh"), "run", command=command).action == "allow", command


def test_a_symlink_to_a_key_is_followed(tmp_path: Path) -> None:
    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    (ssh / "id_rsa").write_text("KEY")
    (tmp_path / "notes").symlink_to(ssh / "id_rsa")
    policy = policy_from(POLICY)
    d = decide(
        policy, session_for(policy, "sh"), "run", command=f"cat {shlex.quote(str(tmp_path / 'notes'))}"
    )
    assert (d.action, d.rule) == ("deny", "path.sensitive")


# Strings the command reader refuses to read (a shell's -c string, eval, a here-string or
# here-document, a name in quotes inside quotes): bash still runs them. Each is run by the real
# bash first, in a folder whose .env, key and link hold a marker, to show it does read the file.
UNREAD = [
    "bash -c 'cat .env'",
    'sh -c "cat ./.env"',
    "eval 'cat .env'",
    "env bash -c 'cat ~/.ssh/id_rsa'",
    "bash <<< 'cat .env'",
    "bash <<'EOF'\ncat .env\nEOF",
    "sh -c 'cat \"$0\"' {link}",
    "sh -c \"cat '{spaced}/id_rsa'\"",
    "bash -c 'cat ~/.ss\\h/id_rsa'",
]


@pytest.mark.skipif(
    shutil.which("bash") is None, reason="needs the real bash to show the commands read the file"
)
@pytest.mark.parametrize("template", UNREAD)
def test_a_command_string_the_reader_refuses_is_still_searched_for_sensitive_files(
    template: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("MARKER-KEY\n")
    spaced = tmp_path / "Jane Doe" / ".ssh"
    spaced.mkdir(parents=True)
    (spaced / "id_rsa").write_text("MARKER-KEY\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / ".env").write_text("MARKER-KEY\n")
    (work / "notes").symlink_to(home / ".ssh" / "id_rsa")
    command = template.format(link=shlex.quote(str(work / "notes")), spaced=tmp_path / "Jane Doe" / ".ssh")
    ran = subprocess.run(
        ["bash", "-c", command], cwd=work, env={"HOME": str(home), "PATH": os.environ["PATH"]},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert "MARKER-KEY" in ran.stdout, (command, ran.stdout, ran.stderr)
    policy = policy_from(POLICY)
    d = decide(policy, session_for(policy, "sh"), "run", command=command)
    assert (d.action, d.rule) == ("deny", "path.sensitive"), command


@pytest.mark.parametrize("command", ["bash -c 'ls -la'", 'sh -c "git status && git diff"', "eval 'echo hi'"])
def test_a_command_string_the_reader_refuses_passes_when_it_names_no_sensitive_file(command: str) -> None:
    # Under a policy with no command rules, as before: only a sensitive name in it denies.
    policy = policy_from(POLICY)
    assert decide(policy, session_for(policy, "sh"), "run", command=command).action == "allow", command


def test_through_visor_run_with_the_default_policy(tmp_path: Path) -> None:
    log = tmp_path / "received.jsonl"
    vp = VisorProcess(
        [sys.executable, str(Path(__file__).parents[1] / "servers" / "recorder.py")],
        env={"RECORDER_LOG": str(log)},
        visor_args=["--audit-log", str(tmp_path / "audit.jsonl")],
    )
    try:
        vp.request({"jsonrpc": "2.0", "id": "l", "method": "tools/list"})
        tools = vp.recv()["result"]["tools"]
        tool = tools[0]["name"]
        log.write_bytes(b"")
        for i, command in enumerate(("cat .env", "ls -la")):
            params = {"name": tool, "arguments": {"command": command}}
            vp.request({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params})
            resp = vp.recv()
            denied = resp.get("result", {}).get("isError") is True and "Visor denied" in str(resp)
            assert denied == (command == "cat .env"), resp
        lines = received(log)
        assert len(lines) == 1 and b"ls -la" in lines[0]
    finally:
        vp.kill()
