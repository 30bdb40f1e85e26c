"""VS Code's variables in an MCP config (`${workspaceFolder}`, `${env:NAME}`, ...).

VS Code replaces them before it starts a server, so `visor doctor` must too, or
it would start `${workspaceFolder}/server.js` literally and report a failure
the client never sees. The variables are the ones VS Code documents for
`mcp.json`: the predefined ones, `${env:NAME}` and `${input:ID}`. A variable
doctor cannot know (an `${input:...}` VS Code prompts for, `${config:...}`,
`${command:...}`, a workspace folder of a user-level config) is reported, and
the server is not started with the literal text in place.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from visor.install.configs import HEADER_ENV_PREFIX

_VAR = re.compile(r"\$\{([^${}]+)\}")


@dataclass(frozen=True, slots=True)
class Context:
    workspace: Path | None  # the folder that holds .vscode/, if the config is a workspace one
    home: Path
    environ: Mapping[str, str]


def is_vscode_config(path: Path, blocks: tuple[tuple[str, ...], ...]) -> bool:
    """VS Code's own configs: .vscode/mcp.json, its user mcp.json and settings.json."""
    parts = path.parts
    if ".vscode" in parts:
        return True
    if "Code" in parts and "User" in parts:
        return True
    return bool(blocks) and all(b[0] in ("servers", "mcp") for b in blocks)


def context_for(path: Path, home: Path, environ: Mapping[str, str] | None = None) -> Context:
    parts = path.absolute().parts
    workspace = None
    if ".vscode" in parts:
        i = len(parts) - 1 - parts[::-1].index(".vscode")
        workspace = Path(*parts[:i])
    return Context(workspace, home, os.environ if environ is None else environ)


def _one(name: str, ctx: Context) -> str | None:
    if name.startswith("env:"):
        # VS Code gives an unset variable as the empty string
        return ctx.environ.get(name[4:], "")
    if name in ("pathSeparator", "/"):
        return os.sep
    if name == "userHome":
        return str(ctx.home)
    if ctx.workspace is not None:
        if name in ("workspaceFolder", "workspaceRoot", "cwd"):
            return str(ctx.workspace)
        if name == "workspaceFolderBasename":
            return ctx.workspace.name
        if name.startswith("workspaceFolder:") and name.split(":", 1)[1] == ctx.workspace.name:
            return str(ctx.workspace)
    return None


def expand(entry: dict[str, object], ctx: Context) -> tuple[dict[str, object], list[str]]:
    """`entry` with every variable replaced in its strings; and the ones that could not be."""
    missing: list[str] = []
    return {k: _expand(v, ctx, missing) for k, v in entry.items()}, missing


def _expand(value: object, ctx: Context, missing: list[str]) -> object:
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            if m.group(1).startswith(HEADER_ENV_PREFIX):
                # init's header reference for `visor run --header`: not a VS Code variable, so
                # VS Code passes it on as written and Visor reads it from the entry's env.
                return m.group(0)
            got = _one(m.group(1), ctx)
            if got is None:
                if m.group(0) not in missing:
                    missing.append(m.group(0))
                return m.group(0)
            return got

        return _VAR.sub(sub, value)
    if isinstance(value, list):
        return [_expand(v, ctx, missing) for v in value]
    if isinstance(value, dict):
        return {k: _expand(v, ctx, missing) for k, v in value.items()}
    return value


def read_env_file(path: Path) -> dict[str, str]:
    """An `envFile` as VS Code reads one: KEY=VALUE lines, # comments, optional quotes."""
    out: dict[str, str] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, val = line.removeprefix("export ").partition("=")
        val = val.strip()
        if len(val) >= 2 and val[0] == val[-1] and val[0] in "\"'":
            val = val[1:-1]
        out[key.strip()] = val
    return out
