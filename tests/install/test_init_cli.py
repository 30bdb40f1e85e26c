"""`visor init` end to end on real files: ask, back up, write atomically, undo, list."""

from __future__ import annotations

import json
import os
import pty
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.install.helpers import VISOR_EXE, visor
from tests.install.test_configs import CLAUDE_CODE, CLAUDE_DESKTOP, CURSOR, VSCODE
from visor.install.init import backup_prefix

POLICY = """version: "1.0"
default_action: deny
servers:
  - name: "filesystem"
    allowed: true
    tools:
      - name: "read_file"
        allowed: true
"""


def backups(path: Path) -> list[Path]:
    """The backups of one config, in $VISOR_HOME/backups/ (never beside the config)."""
    assert not list(path.parent.glob(path.name + ".visor-backup-*"))
    # tests/conftest.py gives every test its own VISOR_HOME
    return sorted((Path(os.environ["VISOR_HOME"]) / "backups").glob(backup_prefix(path) + "*"))


@pytest.mark.parametrize(
    ("rel", "text"),
    [
        (".mcp.json", CLAUDE_CODE),
        ("claude_desktop_config.json", CLAUDE_DESKTOP),
        (".cursor/mcp.json", CURSOR),
        (".vscode/mcp.json", VSCODE),
    ],
)
def test_wrap_undo_wrap_on_real_files(tmp_path: Path, rel: str, text: str) -> None:
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="")
    original = path.read_bytes()

    first = visor("init", "--config", str(path), "--yes", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "+++ " in first.stdout and "x-visor-upstream" in first.stdout  # the diff was shown
    wrapped = path.read_bytes()
    assert wrapped != original
    [backup] = backups(path)
    assert backup.read_bytes() == original

    undone = visor("init", "--config", str(path), "--undo", "--yes", cwd=tmp_path)
    assert undone.returncode == 0, undone.stderr
    assert path.read_bytes() == original

    again = visor("init", "--config", str(path), "--yes", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert path.read_bytes() == wrapped
    assert len(backups(path)) >= 2  # one per write, never overwritten

    idle = visor("init", "--config", str(path), "--yes", cwd=tmp_path)
    assert idle.returncode == 0
    assert "nothing to change" in idle.stdout
    assert "already wrapped" in idle.stdout
    assert path.read_bytes() == wrapped


def test_refuses_to_write_without_a_terminal_or_yes(tmp_path: Path) -> None:
    path = tmp_path / ".mcp.json"
    path.write_text(CLAUDE_CODE)
    result = visor("init", "--config", str(path))
    assert result.returncode == 1
    assert "no terminal to ask on; rerun with --yes" in result.stderr
    assert "--- " in result.stdout  # still shows what it would do
    assert path.read_text() == CLAUDE_CODE
    assert not backups(path)


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / ".mcp.json"
    path.write_text(CLAUDE_CODE)
    result = visor("init", "--config", str(path), "--dry-run")
    assert result.returncode == 0
    assert "dry run: nothing written" in result.stdout
    assert path.read_text() == CLAUDE_CODE


def _init_on_a_terminal(args: list[str], answer: bytes, cwd: Path) -> tuple[int, str]:
    """Run `visor init` with a real pseudo-terminal as its stdin and answer the question."""
    main, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "visor.cli", "init", *args],
        stdin=secondary,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env={**os.environ, "PATH": f"{VISOR_EXE.parent}{os.pathsep}{os.environ.get('PATH', '')}"},
    )
    os.close(secondary)
    os.write(main, answer)
    out, _ = proc.communicate(timeout=60)
    os.close(main)
    return proc.returncode, out.decode()


def test_asks_on_the_terminal_yes(tmp_path: Path) -> None:
    path = tmp_path / ".mcp.json"
    path.write_text(CLAUDE_CODE)
    code, out = _init_on_a_terminal(["--config", str(path)], b"y\n", tmp_path)
    assert code == 0, out
    assert "Write these changes to" in out
    assert "x-visor-upstream" in path.read_text()


def test_asks_on_the_terminal_no(tmp_path: Path) -> None:
    path = tmp_path / ".mcp.json"
    path.write_text(CLAUDE_CODE)
    code, out = _init_on_a_terminal(["--config", str(path)], b"n\n", tmp_path)
    assert code == 1
    assert "not written" in out
    assert path.read_text() == CLAUDE_CODE
    assert not backups(path)


def test_broken_json_is_reported_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / ".mcp.json"
    broken = '{\n  "mcpServers": {\n    "a": {"command": "x"}\n    "b": {"command": "y"}\n  }\n}\n'
    path.write_text(broken)
    before = path.stat().st_mtime_ns
    for extra in ([], ["--undo"], ["--dry-run"]):
        result = visor("init", "--config", str(path), "--yes", *extra)
        assert result.returncode == 1
        assert f"{path}:4:5: not valid JSON: expected ',' or '}}' after an object member" in result.stderr
        assert "(it was not changed)" in result.stderr
    assert path.read_text() == broken
    assert path.stat().st_mtime_ns == before
    assert not backups(path)


def test_missing_file(tmp_path: Path) -> None:
    result = visor("init", "--config", str(tmp_path / "nope.json"), "--yes")
    assert result.returncode == 1
    assert "nope.json: no such file" in result.stderr


def test_policy_is_absolute_and_must_load(tmp_path: Path) -> None:
    path = tmp_path / ".mcp.json"
    path.write_text(CLAUDE_CODE)
    (tmp_path / "bad.yaml").write_text("version: '1.0'\ndefault_action: maybe\n")
    bad = visor("init", "--config", ".mcp.json", "--policy", "bad.yaml", "--yes", cwd=tmp_path)
    assert bad.returncode == 1
    assert "the policy does not load" in bad.stderr and "default_action" in bad.stderr
    assert path.read_text() == CLAUDE_CODE

    (tmp_path / "good.yaml").write_text(POLICY)
    good = visor("init", "--config", ".mcp.json", "--policy", "good.yaml", "--yes", cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    args = json.loads(path.read_text())["mcpServers"]["filesystem"]["args"]
    assert args[args.index("--policy") + 1] == str(tmp_path / "good.yaml")
    assert "no server entry 'filesystem'" not in good.stderr

    path.write_text(CLAUDE_DESKTOP)
    other = visor("init", "--config", ".mcp.json", "--policy", "good.yaml", "--dry-run", cwd=tmp_path)
    assert "the policy has no server entry 'time'" in other.stderr
    assert "every call to it would be denied" in other.stderr


def test_absolute_writes_the_visor_executable(tmp_path: Path) -> None:
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(CLAUDE_DESKTOP)
    result = visor("init", "--config", str(path), "--absolute", "--yes")
    assert result.returncode == 0, result.stderr
    data = json.loads(path.read_text())
    assert data["mcpServers"]["time"]["command"] == str(VISOR_EXE)
    assert "warning" not in result.stderr


def test_warns_when_visor_is_not_where_a_desktop_app_looks(tmp_path: Path) -> None:
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(CLAUDE_DESKTOP)
    # A PATH with visor in a venv (as here), and one without visor at all.
    in_venv = visor(
        "init", "--config", str(path), "--dry-run", env={"PATH": f"{VISOR_EXE.parent}:/usr/bin:/bin"}
    )
    assert f"`visor` is {VISOR_EXE}" in in_venv.stderr
    assert "--absolute" in in_venv.stderr
    missing = visor("init", "--config", str(path), "--dry-run", env={"PATH": "/usr/bin:/bin"})
    assert "`visor` is not on your PATH" in missing.stderr


def test_keeps_mode_and_writes_through_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "dotfiles" / "mcp.json"
    real.parent.mkdir()
    real.write_text(CURSOR)
    real.chmod(0o600)
    link = tmp_path / "mcp.json"
    link.symlink_to(real)
    result = visor("init", "--config", str(link), "--yes")
    assert result.returncode == 0, result.stderr
    assert link.is_symlink()
    assert "x-visor-upstream" in real.read_text()
    assert stat.S_IMODE(real.stat().st_mode) == 0o600
    [backup] = backups(real)
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    # no temporary files left behind, and the backup is not beside the config
    assert sorted(p.name for p in real.parent.iterdir()) == ["mcp.json"]
    assert stat.S_IMODE(backup.parent.stat().st_mode) == 0o700


def test_server_selection_and_unknown_name(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(CLAUDE_DESKTOP)
    result = visor("init", "--config", str(path), "--server", "git", "--yes")
    assert result.returncode == 0, result.stderr
    data = json.loads(path.read_text())["mcpServers"]
    assert "x-visor-upstream" in data["git"] and "x-visor-upstream" not in data["time"]
    unknown = visor("init", "--config", str(path), "--server", "gti", "--yes")
    assert unknown.returncode == 1
    assert "no server named 'gti' (servers: git, time)" in unknown.stderr


def test_list_finds_the_usual_locations(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    (home / ".cursor").mkdir(parents=True)
    (home / ".config" / "Claude").mkdir(parents=True)
    (project / ".vscode").mkdir(parents=True)
    (home / ".cursor" / "mcp.json").write_text(CURSOR)
    (home / ".config" / "Claude" / "claude_desktop_config.json").write_text(CLAUDE_DESKTOP)
    (project / ".vscode" / "mcp.json").write_text(VSCODE)
    (project / ".mcp.json").write_text("{ broken")
    assert (
        visor(
            "init", "--config", str(home / ".cursor" / "mcp.json"), "--server", "github", "--yes"
        ).returncode
        == 0
    )

    result = visor("init", "--list", cwd=project, env={"HOME": str(home)})
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"Cursor (user): {home / '.cursor' / 'mcp.json'}\n" in out
    lines = out.splitlines()
    github = next(ln for ln in lines if ln.strip().startswith("github"))
    assert " wrapped " in github and "docker run -i --rm" in github
    assert any(ln.strip().startswith("sse") and "remote (not covered)" in ln for ln in lines)
    assert any(ln.strip().startswith("time") and "not wrapped" in ln for ln in lines)
    assert f"Claude Desktop (Linux): {home / '.config' / 'Claude' / 'claude_desktop_config.json'}\n" in out
    assert f"VS Code (workspace): {project / '.vscode' / 'mcp.json'}\n" in out
    assert f"Claude Code (project): {project / '.mcp.json'}: error:" in out
    assert f"{home / '.claude.json'}: not found" in out
