"""Packs against the real servers' tools/list, where the server is installable here."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import anyio
import pytest

from visor.policy import paths
from visor.policy.destinations import is_destination_name
from visor.policy.loader import builtin_packs


def _list_tools(command: str, args: list[str]) -> list[dict]:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    async def run() -> list[dict]:
        with anyio.fail_after(60):
            return await _inner()

    async def _inner() -> list[dict]:
        params = StdioServerParameters(command=command, args=args)
        async with stdio_client(params) as (r, w), ClientSession(r, w) as session:
            await session.initialize()
            result = await session.list_tools()
            return [
                {"name": t.name, "properties": list((t.input_schema or {}).get("properties", {}))}
                for t in result.tools
            ]

    return anyio.run(run)


def _check_pack(pack_name: str, tools: list[dict]) -> None:
    real = {t["name"]: set(t["properties"]) for t in tools}
    pack = builtin_packs()[pack_name]
    for name, entry in pack.tools.items():
        assert name in real, f"pack {pack_name} names {name!r}, which the server does not list"
        for param in (*entry.write_params, *entry.sink_params):
            assert param in real[name], f"{pack_name}/{name}: no argument {param!r}"
        if entry.arguments is not None:
            # the entry describes exactly the verified tool: one with other arguments is another's
            assert set(entry.arguments) == real[name], (pack_name, name, real[name])
    # every real tool is described by the pack, so nothing falls to the name-based guess
    assert set(real) <= set(pack.tools), set(real) - set(pack.tools)
    # every path argument of the real server is recognised as a path by name
    for name, props in real.items():
        for prop in props:
            if prop in ("path", "paths", "source", "destination", "repo_path", "files"):
                assert paths.is_path_name(prop), (name, prop)


def _venv_bin(name: str) -> str | None:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else shutil.which(name)


def test_git_pack_matches_mcp_server_git() -> None:
    exe = _venv_bin("mcp-server-git")
    if exe is None:
        pytest.skip("mcp-server-git is not installed")
    _check_pack("git", _list_tools(exe, []))


def test_time_server_has_no_destination_or_path_arguments() -> None:
    exe = _venv_bin("mcp-server-time")
    if exe is None:
        pytest.skip("mcp-server-time is not installed")
    for tool in _list_tools(exe, []):
        for prop in tool["properties"]:
            assert not is_destination_name(prop), (tool["name"], prop)
            assert not paths.is_path_name(prop), (tool["name"], prop)


def test_fetch_pack_matches_mcp_server_fetch() -> None:
    # The test extra installs it; a missing server is a broken set-up, not a skip.
    assert importlib.util.find_spec("mcp_server_fetch") is not None, "mcp-server-fetch is not installed"
    _check_pack("fetch", _list_tools(sys.executable, ["-m", "mcp_server_fetch"]))


# `make test` installs the npm reference server here (see the Makefile).
FILESYSTEM_SERVER = (
    Path(__file__).parents[2] / ".venv" / "node" / "node_modules" / ".bin" / "mcp-server-filesystem"
)


def test_filesystem_pack_matches_the_reference_server(tmp_path: Path) -> None:
    if FILESYSTEM_SERVER.exists():
        command, args = str(FILESYSTEM_SERVER), [str(tmp_path)]
    elif shutil.which("npx"):
        command, args = "npx", ["-y", "@modelcontextprotocol/server-filesystem", str(tmp_path)]
    else:
        pytest.fail("neither the installed reference filesystem server nor npx is available")
    _check_pack("filesystem", _list_tools(command, args))
