"""mcp-visor's command-line forms that Visor accepts: lint's --no-warnings and
--no-info, and the Go spelling of the approval flags."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.approval.helpers import call, cli, recv_id, start, wait_pending
from tests.conftest import VisorProcess

WARNS = """version: "1.0"
servers:
  - name: mail
    allowed: false
    tools:
      - {name: read_inbox, allowed: true}
"""
BROKEN = 'version: "1.0"\nservers:\n  - name: mail\n'


def lint(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "visor", *args], capture_output=True, text=True, timeout=60)


def test_no_warnings_hides_warnings_never_errors(tmp_path: Path) -> None:
    warns = tmp_path / "w.yaml"
    warns.write_text(WARNS)
    shown = lint("policy", "lint", str(warns))
    assert shown.returncode == 0 and "warning" in shown.stdout
    hidden = lint("policy", "lint", "--no-warnings", str(warns))
    assert hidden.returncode == 0 and "warning:" not in hidden.stdout
    assert "ok (1 warning(s) hidden by --no-warnings)" in hidden.stdout
    as_json = json.loads(lint("lint", "--no-warnings", "--no-info", "--json", str(warns)).stdout)
    assert as_json["warnings"] == [] and as_json["errors"] == []
    broken = tmp_path / "b.yaml"
    broken.write_text(BROKEN)
    result = lint("lint", "--no-warnings", "--no-info", str(broken))
    assert result.returncode == 1 and "error" in result.stdout and "allowed" in result.stdout


def test_strict_with_no_warnings_is_refused(tmp_path: Path) -> None:
    warns = tmp_path / "w.yaml"
    warns.write_text(WARNS)
    result = lint("lint", "--strict", "--no-warnings", str(warns))
    assert result.returncode == 2 and "contradict" in result.stderr
    assert lint("lint", "--strict", str(warns)).returncode == 1


def test_go_spelled_approval_flags_on_run_approve_and_deny(tmp_path: Path) -> None:
    adir = tmp_path / "approvals"
    vp: VisorProcess
    vp, _log, _audit = start(tmp_path, extra=["-approval-dir", str(adir)])
    try:
        call(vp, 1, "send_email", {"to": "new@example.org", "body": "hi"})
        ((pid, _rec),) = wait_pending(adir).items()
        listing = cli("approve", "-approval-dir", str(adir))
        assert listing.returncode == 0 and pid in listing.stdout
        ok = cli("approve", f"-approval-dir={adir}", pid[:8])
        assert ok.returncode == 0, ok.stderr
        assert recv_id(vp, 1)["result"]["isError"] is False
        call(vp, 2, "send_email", {"to": "other@example.org", "body": "hi"})
        ((pid2, _),) = wait_pending(adir).items()
        no = cli("deny", "-approval-dir", str(adir), pid2)
        assert no.returncode == 0, no.stderr
        assert recv_id(vp, 2)["result"]["isError"] is True
    finally:
        vp.close_stdin()
        vp.wait()


def test_approval_cli_means_the_terminal_never_stdin() -> None:
    from visor.cli import build_parser

    for flag in ("-approval-cli", "--approval-cli"):
        args = build_parser().parse_args(["run", flag, "--", "server"])
        assert args.approval_tty is True
    args = build_parser().parse_args(["run", "-approval-dir=/tmp/x", "--", "server"])
    assert args.approval_dir == "/tmp/x"
