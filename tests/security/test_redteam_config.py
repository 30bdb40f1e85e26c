"""Red team: configuration as an attack surface, each finding through the real process.

1. A deny pattern with a numbered conditional group, ``(?(1)...)``, was searched
   inside the combined screen of all the tool's deny patterns, where group 1 is
   another pattern's: the screen missed a command the pattern matched alone, and
   the deny list was skipped (``env touch X`` ran under a pattern written to
   refuse it). Patterns whose meaning depends on group numbers are not combined.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import VisorProcess
from tests.policy.helpers import decide, policy_from, session_for
from tests.policy.test_shell_bash_differential import BASH
from tests.security.test_redteam_paths_commands import BASH_SERVER

# ---------------------------------------------------------------- 1. screens and group numbers

# The second pattern refuses `env touch ...` (and `rm ...`): group 1 is its own `(env\s+)`
# alone, the first pattern's `(curl)` once both are one alternation.
CONDITIONAL_POLICY = textwrap.dedent(
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
                patterns: ['(curl)\s+evil', '^(env\s+)?(?(1)touch|rm)\s']
    """
)


def test_a_pattern_with_a_numbered_conditional_denies_as_it_reads_alone() -> None:
    policy = policy_from(CONDITIONAL_POLICY)
    session = session_for(policy, "sh")
    for cmd in ("env touch X", "rm X", "curl evil"):
        d = decide(policy, session, "run", command=cmd)
        assert d.action == "deny", (cmd, d)
    assert decide(policy, session, "run", command="touch X").action == "allow"


@pytest.mark.skipif(BASH is None, reason="needs the real bash")
def test_a_numbered_conditional_deny_pattern_holds_through_visor_run(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (tmp_path / "server.py").write_text(BASH_SERVER)
    (tmp_path / "policy.yaml").write_text(CONDITIONAL_POLICY)
    vp = VisorProcess(
        [sys.executable, str(tmp_path / "server.py")],
        visor_args=["--policy", str(tmp_path / "policy.yaml"), "--server-name", "sh"],
        cwd=scratch,
    )
    try:
        init, listed = vp.open_session("2025-06-18", timeout=60, list_id=1)
        assert "result" in init and "result" in listed
        vp.request(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "run", "arguments": {"command": "env touch X"}},
            }
        )
        while (msg := vp.recv(timeout=60)).get("id") != 2:
            pass
    finally:
        vp.kill()
    assert msg["result"].get("isError") is True, msg
    assert not (scratch / "X").exists()
