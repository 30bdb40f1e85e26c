"""Where MCP clients keep their configs: the paths alone.

`visor run` names these files at every start (no tool call may write one:
that would take Visor out of the chain for the next session), and reading,
wrapping or checking them is `visor init`'s and `visor doctor`'s job
(visor/install/configs.py). Kept apart so that a session's start does not
import the config reader, the JSONC parser and the HTTP target checks only to
name a few paths (issue 16, start-up).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Location:
    client: str
    path: Path


def known_locations(home: Path, cwd: Path) -> list[Location]:
    """Where the usual clients keep their MCP configs (user-wide, then this project)."""
    return [
        Location("Claude Code (user and local scope)", home / ".claude.json"),
        Location("Claude Code (project)", cwd / ".mcp.json"),
        Location(
            "Claude Desktop (macOS)",
            home / "Library" / "Application Support" / "Claude" / "claude_desktop_config.json",
        ),
        Location("Claude Desktop (Linux)", home / ".config" / "Claude" / "claude_desktop_config.json"),
        Location("Cursor (user)", home / ".cursor" / "mcp.json"),
        Location("Cursor (project)", cwd / ".cursor" / "mcp.json"),
        Location("VS Code (workspace)", cwd / ".vscode" / "mcp.json"),
    ]


def protected_config_paths(home: Path, cwd: Path) -> list[Path]:
    """Every client config that decides whether Visor is in the chain: the ones
    `visor init` edits and the others clients read MCP servers from. A tool
    that could write one would take Visor out of the next session."""
    extra = [
        home / ".config" / "Code" / "User" / "settings.json",
        home / ".config" / "Code" / "User" / "mcp.json",
        home / "Library" / "Application Support" / "Code" / "User" / "settings.json",
        home / "Library" / "Application Support" / "Code" / "User" / "mcp.json",
        home / ".codeium" / "windsurf" / "mcp_config.json",
        home / ".gemini" / "settings.json",
        home / ".codex" / "config.toml",
        cwd / ".vscode" / "settings.json",
        cwd / ".gemini" / "settings.json",
    ]
    return [loc.path for loc in known_locations(home, cwd)] + extra


def home_dir() -> Path:
    # HOME first, so that tests (and users with a redirected HOME) decide.
    return Path(os.environ.get("HOME") or Path.home())
