"""`visor policy scaffold` against real servers from PyPI, checked with the real linter."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, stdio_client

from tests.install.helpers import venv_tool, visor
from tests.integration.sdk_scenario import visor_params
from visor.install.scaffold import guess_server_name, plan_tool, render_policy
from visor.install.stdio_client import Listing
from visor.policy.lint import lint_policy
from visor.policy.loader import builtin_packs, load_policy, load_policy_text


def scaffold(tmp_path: Path, name: str, *command: str) -> Path:
    out = tmp_path / f"{name}.yaml"
    result = visor("policy", "scaffold", "--server-name", name, "-o", str(out), "--", *command, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"wrote {out}" in result.stderr
    return out


def lint_strict(path: Path) -> None:
    result = visor("lint", "--strict", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == f"{path}: ok"


def test_scaffold_time_server_lints_and_runs(tmp_path: Path) -> None:
    server = [venv_tool("mcp-server-time"), "--local-timezone", "UTC"]
    out = scaffold(tmp_path, "time", *server)
    lint_strict(out)
    policy = load_policy(out)
    assert policy.default_action == "deny"
    [srv] = policy.servers
    assert srv.name == "time" and srv.allowed
    assert sorted(srv.tools) == ["convert_time", "get_current_time"]
    assert all(t.allowed for t in srv.tools.values())
    text = out.read_text()
    assert "# get_current_time: Get current time in a specific timezone" in text
    assert "readOnlyHint" in text

    # The scaffold is a working policy: the allowed tool runs through `visor run`,
    # and the same policy denies everything for a server of another name.
    async def call(name: str) -> tuple[bool, str]:
        params = visor_params(
            server,
            ["--server-name", name, "--policy", str(out), "--audit-log", str(tmp_path / f"{name}.jsonl")],
        )
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            await s.list_tools()
            res = await s.call_tool(
                "convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}
            )
            return bool(res.is_error), res.content[0].text  # type: ignore[union-attr]

    ok_error, ok_text = anyio.run(call, "time")
    assert not ok_error, ok_text
    denied_error, denied_text = anyio.run(call, "other")
    assert denied_error and "Visor denied" in denied_text


def test_scaffold_git_server_applies_the_pack(tmp_path: Path) -> None:
    out = scaffold(tmp_path, "git", venv_tool("mcp-server-git"))
    lint_strict(out)
    policy = load_policy(out)
    tools = policy.servers[0].tools
    assert len(tools) >= 12
    root = os.path.realpath(tmp_path)
    pack = builtin_packs()["git"]
    for name, tool in tools.items():
        entry = pack.tools[name]
        assert tool.exfiltrating is False
        if entry.write_params:
            assert tool.allowed_path_prefixes == (root,), name
        else:
            assert tool.allowed_path_prefixes == ()
    text = out.read_text()
    assert "# Packs applied: git" in text
    assert f"writes through repo_path: confined to {root}" in text


def test_scaffold_fetch_server(tmp_path: Path) -> None:
    out = scaffold(tmp_path, "fetch", venv_tool("mcp-server-fetch"))
    lint_strict(out)
    assert load_policy(out).servers[0].tools["fetch"].exfiltrating is False  # the pack's verdict


def test_scaffold_to_stdout_guesses_the_name(tmp_path: Path) -> None:
    result = visor("policy", "scaffold", "--", venv_tool("mcp-server-time"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    policy = load_policy_text(result.stdout)
    assert policy.servers[0].name == "mcp-server-time"
    assert "--server-name mcp-server-time" in result.stderr


def test_scaffold_refuses_to_overwrite_and_reports_a_dead_server(tmp_path: Path) -> None:
    existing = tmp_path / "p.yaml"
    existing.write_text("keep me\n")
    result = visor("policy", "scaffold", "-o", str(existing), "--", venv_tool("mcp-server-time"))
    assert result.returncode == 1 and "--force" in result.stderr
    assert existing.read_text() == "keep me\n"
    dead = visor("policy", "scaffold", "--", str(tmp_path / "no-such-server"))
    assert dead.returncode == 1
    assert "cannot start" in dead.stderr and "no-such-server" in dead.stderr


TOOLS = [
    {
        "name": "send_message",
        "description": "Post a message\nto a channel",
        "inputSchema": {"type": "object", "properties": {"channel": {}, "text": {}}},
    },
    {"name": "notify_team", "inputSchema": {"type": "object", "properties": {"body": {}}}},
    {
        "name": "write_note",
        "inputSchema": {"type": "object", "properties": {"path": {}, "content": {}}},
        "annotations": {"destructiveHint": True},
    },
    {
        "name": "drop_table",
        "inputSchema": {"type": "object", "properties": {"table": {}}},
        "annotations": {"destructiveHint": True},
    },
    {
        "name": "search_notes",
        "inputSchema": {"type": "object", "properties": {"query": {}, "path": {}}},
        "annotations": {"readOnlyHint": True},
    },
    {"name": 'weird "name" # not a comment', "inputSchema": {"type": "object"}},
]


def test_plan_from_schema_and_annotations() -> None:
    packs = builtin_packs()
    plans = {t["name"]: plan_tool(t, packs, (), "/work/here") for t in TOOLS}
    send = plans["send_message"]
    assert (send.exfiltrating, send.sink_params, send.write_params) == (True, ("channel",), ())
    notify = plans["notify_team"]
    assert notify.exfiltrating is True and notify.sink_params == ()
    assert any("every address-shaped value" in w for w in notify.why)
    note = plans["write_note"]
    assert note.write_params == ("path",) and note.path_prefixes == ("/work/here",)
    assert note.exfiltrating is None
    drop = plans["drop_table"]
    assert drop.write_params == () and any("approval_required" in w for w in drop.why)
    search = plans["search_notes"]
    assert (search.exfiltrating, search.write_params) == (None, ())


def test_rendered_policy_loads_and_has_no_lint_errors() -> None:
    listing = Listing(
        server_info={"name": "notes\nserver", "version": "1"},
        protocol_version="2025-06-18",
        capabilities={},
        tools=tuple(TOOLS),
        resources=({"uri": "notes://all", "name": "all"},),
        prompts=({"name": "summarise"},),
    )
    text = render_policy(listing, "notes", ["npx", "-y", "notes-mcp"], "/work/here")
    policy = load_policy_text(text, "scaffold.yaml")
    tools = policy.servers[0].tools
    assert set(tools) == {t["name"] for t in TOOLS}
    assert tools["send_message"].sink_params == ("channel",)
    assert tools["write_note"].allowed_path_prefixes == ("/work/here",)
    findings = lint_policy(policy)
    assert not [f for f in findings if f.level == "error"]
    # the only warnings are the honest ones: sending tools with no trusted destinations
    assert all("trusted_destinations" in f.message for f in findings)
    assert "# The server also lists 1 resources (notes://all)" in text
    assert "notes server" in text.splitlines()[1]  # a newline in serverInfo cannot break the YAML


def test_pack_selected_by_server_name() -> None:
    listing = Listing({"name": "gmail"}, "2025-06-18", {}, ({"name": "send_email", "inputSchema": {}},))
    text = render_policy(listing, "gmail", ["gmail-mcp"], "/w")
    tool = load_policy_text(text).servers[0].tools["send_email"]
    assert tool.exfiltrating is True
    assert "pack gmail" in text and "destinations in to, cc, bcc" in text


@pytest.mark.parametrize(
    ("command", "name"),
    [
        (["npx", "-y", "@modelcontextprotocol/server-filesystem", "/tmp"], "server-filesystem"),
        (["uvx", "mcp-server-git", "--repository", "."], "mcp-server-git"),
        (["uvx", "--from", "git+https://x/y", "mcp-thing"], "mcp-thing"),
        (["/usr/local/bin/mcp-server-time"], "mcp-server-time"),
        (["python3", "-m", "my_server"], "my_server"),
        (["node", "build/index.js"], "index"),
        (["npx", "pkg@1.2.3"], "pkg"),
        (["docker", "run", "-i", "--rm", "ghcr.io/github/github-mcp-server"], "github-mcp-server"),
    ],
)
def test_guess_server_name(command: list[str], name: str) -> None:
    assert guess_server_name(command) == name


def test_a_scaffolded_policy_states_its_limits() -> None:
    """An omitted limit means mcp-visor's default (100 calls, one hour): a scaffolded
    policy for a long-running editor session says what it wants instead."""
    listing = Listing({"name": "notes"}, "2025-11-25", {}, ({"name": "read_note", "inputSchema": {}},))
    policy = load_policy_text(render_policy(listing, "notes", ["notes-server"], "/srv"), "scaffold.yaml")
    assert policy.settings.session_max_calls is None
    assert policy.settings.session_timeout_seconds is None
    assert policy.settings.approval_timeout_seconds == 120


def test_a_long_project_path_is_written_whole_in_the_confinement_comment(tmp_path: Path) -> None:
    # A server-provided text is cut at a width; the root the writes are confined to is the user's
    # own path and the point of its comment line, so it is never cut, however deep the project.
    from visor.install.scaffold import render_policy
    from visor.install.stdio_client import Listing

    root = str(tmp_path / ("a-rather-long-directory-name-" * 6) / "project")
    tools = (
        {"name": "write_file", "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}}},
    )
    listing = Listing({"name": "files", "version": "1"}, "2025-11-25", {}, tools)
    text = render_policy(listing, "files", ["files-server"], root)
    assert f"through path: confined to {root}" in text
    out = tmp_path / "files.yaml"
    out.write_text(text)
    assert load_policy(out).servers[0].tools["write_file"].allowed_path_prefixes == (root,)
