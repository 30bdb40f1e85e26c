"""`visor init` on remote entries (a `url`): wrapped as `visor run --url` over stdio, header values
moved to the entry's env (never on a command line, never printed), `--undo` byte for byte; legacy
SSE entries left alone with the reason. On every client format the install tests cover."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from tests.http.http_helpers import sdk_server
from tests.install.helpers import VENV_BIN, visor
from visor.install.configs import UPSTREAM_KEY, load_text, wrapped_run_args
from visor.install.jsonc import parse

SECRET = "s3cr3t-t0ken-value"
URL = "https://mcp.example.test/mcp"
SSE_URL = "https://legacy.example.test/sse"


def claude_code() -> str:
    servers = {
        "github": {"type": "http", "url": URL, "headers": {"Authorization": f"Bearer {SECRET}"}},
        "legacy": {"type": "sse", "url": SSE_URL},
    }
    return json.dumps({"mcpServers": servers}, indent=2) + "\n"


def claude_json() -> str:
    project = {"mcpServers": {"github": {"type": "http", "url": URL, "headers": {"X-Api-Key": SECRET}}}}
    return json.dumps({"numStartups": 3, "projects": {"/home/me/p": project}}, indent=2)


def claude_desktop() -> str:
    servers = {"github": {"url": URL, "headers": {"Authorization": f"Bearer {SECRET}"}}}
    return json.dumps({"mcpServers": servers, "globalShortcut": "Ctrl+Space"}, indent=2, ensure_ascii=False)


def cursor() -> str:
    # Cursor infers the transport from the url; a url ending in /sse is its legacy SSE form
    servers = {
        "github": {"url": URL, "headers": {"Authorization": f"Bearer {SECRET}"}, "disabled": False},
        "legacy": {"url": SSE_URL},
    }
    return json.dumps({"mcpServers": servers}, indent=4)


def vscode() -> str:
    # JSONC: tabs, comments, trailing commas, one entry on one line
    return (
        "{\n"
        "\t// remote servers\n"
        '\t"servers": {\n'
        '\t\t"github": {\n'
        '\t\t\t"type": "http", // streamable\n'
        f'\t\t\t"url": "{URL}",\n'
        f'\t\t\t"headers": {{"Authorization": "Bearer {SECRET}"}},\n'
        "\t\t},\n"
        f'\t\t"legacy": {{"type": "sse", "url": "{SSE_URL}"}}, /* old */\n'
        "\t},\n"
        "}\n"
    )


FORMATS: list[tuple[str, Callable[[], str]]] = [
    (".mcp.json", claude_code),
    (".claude.json", claude_json),
    ("claude_desktop_config.json", claude_desktop),
    (".cursor/mcp.json", cursor),
    (".vscode/mcp.json", vscode),
]


def entries(path: Path) -> dict[str, Any]:
    config = load_text(path.read_text(encoding="utf-8"), str(path))
    return {e.name: e.value for e in config.entries}


@pytest.mark.parametrize(("rel", "make"), FORMATS)
def test_remote_entry_wrapped_as_visor_run_url_and_undone_byte_for_byte(
    tmp_path: Path, rel: str, make: Callable[[], str]
) -> None:
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(make(), encoding="utf-8", newline="")
    original = path.read_bytes()
    before = entries(path)

    wrapped = visor("init", "--config", str(path), "--yes", cwd=tmp_path)
    assert wrapped.returncode == 0, wrapped.stderr
    # the token is never printed: not in the diff, not in a note
    assert SECRET not in wrapped.stdout + wrapped.stderr
    assert "<hidden>" in wrapped.stdout
    after = entries(path)
    github = after["github"]
    options, upstream = wrapped_run_args(github) or ([], ["not wrapped"])
    assert upstream == []
    assert options[options.index("--url") + 1] == URL
    header_name = next(iter(before["github"]["headers"]))
    var = "VISOR_HEADER_" + header_name.upper().replace("-", "_")
    assert options[options.index("--header") + 1] == f"{header_name}: ${{{var}}}"
    assert SECRET not in json.dumps(github["args"])
    assert github["env"] == {var: before["github"]["headers"][header_name]}
    assert "url" not in github and "headers" not in github
    assert github.get("type", "stdio") == "stdio"
    assert github[UPSTREAM_KEY] == before["github"]
    if "disabled" in before["github"]:
        assert github["disabled"] is False
    if "legacy" in before:
        assert after["legacy"] == before["legacy"]
        assert "legacy HTTP+SSE" in wrapped.stdout or "/sse" in wrapped.stdout
    if rel.endswith(".vscode/mcp.json"):
        text = path.read_text()
        assert "// remote servers" in text and "/* old */" in text and "// streamable" in text
        parse(text)

    again = visor("init", "--config", str(path), "--yes", cwd=tmp_path)
    assert again.returncode == 0 and "nothing to change" in again.stdout

    undone = visor("init", "--config", str(path), "--undo", "--yes", cwd=tmp_path)
    assert undone.returncode == 0, undone.stderr
    assert SECRET not in undone.stdout + undone.stderr
    assert path.read_bytes() == original


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ({"type": "sse", "url": SSE_URL}, "legacy HTTP+SSE"),
        ({"url": SSE_URL}, "ends in /sse"),
        ({"type": "ws", "url": "wss://x.example.test/mcp"}, "not a transport Visor speaks"),
        ({"type": "http", "url": "https://${HOST}/mcp"}, "placeholder"),
        ({"type": "http", "url": "ftp://x.example.test/mcp"}, "http:// or https://"),
        ({"type": "http", "url": URL, "headers": {"Mcp-Session-Id": "x"}}, "Visor sets itself"),
        ({"type": "http", "url": URL, "headers": {"X-A": "1", "X_A": "2"}}, "share the variable"),
        ({"type": "http", "url": URL, "headers": {"X": 1}}, "object of strings"),
        ({"type": "http", "url": URL, "command": "node"}, "both url and command"),
        ({"serverUrl": URL}, "without a url key"),
    ],
)
def test_remote_entries_visor_cannot_take_are_left_alone_with_the_reason(
    tmp_path: Path, entry: dict[str, Any], why: str
) -> None:
    path = tmp_path / ".mcp.json"
    path.write_text(json.dumps({"mcpServers": {"r": entry}}, indent=2))
    original = path.read_bytes()
    result = visor("init", "--config", str(path), "--yes")
    assert result.returncode == 0, result.stderr
    assert "nothing to change" in result.stdout
    skip = next(ln for ln in result.stdout.splitlines() if ln.strip().startswith("skip"))
    assert why in skip, skip
    assert path.read_bytes() == original


def test_existing_env_is_kept_and_rerun_with_a_policy_rewraps_remote_entries(tmp_path: Path) -> None:
    entry = {"type": "http", "url": URL, "env": {"KEEP": "1"}, "headers": {"X-Api-Key": SECRET}}
    path = tmp_path / ".mcp.json"
    path.write_text(json.dumps({"mcpServers": {"r": entry}}, indent=2))
    original = path.read_bytes()
    assert visor("init", "--config", str(path), "--yes").returncode == 0
    assert entries(path)["r"]["env"] == {"KEEP": "1", "VISOR_HEADER_X_API_KEY": SECRET}
    policy = tmp_path / "p.yaml"
    policy.write_text('version: "1.0"\nservers:\n  - {name: "r", allowed: true}\n')
    update = visor("init", "--config", str(path), "--policy", str(policy), "--yes")
    assert update.returncode == 0, update.stderr
    assert SECRET not in update.stdout + update.stderr
    options, _ = wrapped_run_args(entries(path)["r"]) or ([], [])
    assert options[options.index("--policy") + 1] == str(policy)
    assert options.count("--url") == 1 and options.count("--header") == 1
    assert visor("init", "--config", str(path), "--undo", "--yes").returncode == 0
    assert path.read_bytes() == original


def test_list_shows_remote_entries_without_secrets(tmp_path: Path) -> None:
    entry = {"type": "http", "url": f"https://user:{SECRET}@x.example.test/mcp?key={SECRET}"}
    (tmp_path / ".mcp.json").write_text(json.dumps({"mcpServers": {"r": entry}}))
    listing = visor("init", "--list", cwd=tmp_path, env={"HOME": str(tmp_path)})
    assert listing.returncode == 0
    line = next(ln for ln in listing.stdout.splitlines() if ln.strip().startswith("r "))
    assert "remote (not wrapped)" in line and "x.example.test/mcp" in line
    assert SECRET not in listing.stdout


POLICY = 'version: "1.0"\ndefault_action: deny\nservers:\n  - name: "remote"\n    allowed: true\n'
POLICY += '    tools:\n      - {name: "add", allowed: true}\n'


async def _call_add(params: StdioServerParameters) -> Any:
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        return await s.call_tool("add", {"a": 2, "b": 40})


def test_the_wrapped_entry_runs_as_a_client_starts_it(tmp_path: Path) -> None:
    """The real SDK stdio client starts the entry's command, args and env (as a client does) and
    reaches the real SDK server, which refuses any request without the bearer token."""
    token = "tok-" + os.urandom(8).hex()
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    with sdk_server("--token-env", "REQUIRED_TOKEN", env={"REQUIRED_TOKEN": token}) as url:
        entry = {"type": "http", "url": url, "headers": {"Authorization": f"Bearer {token}"}}
        path = tmp_path / ".mcp.json"
        path.write_text(json.dumps({"mcpServers": {"remote": entry}}, indent=2))
        result = visor("init", "--config", str(path), "--policy", str(policy), "--absolute", "--yes")
        assert result.returncode == 0, result.stderr
        wrapped = entries(path)["remote"]
        assert token not in json.dumps(wrapped["args"])
        home = tmp_path / "home"
        env = {"PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", "HOME": str(home)}
        env["VISOR_HOME"] = str(home / ".visor")
        params = StdioServerParameters(
            command=wrapped["command"], args=wrapped["args"], env={**env, **wrapped["env"]}
        )
        answer = anyio.run(_call_add, params)
    got = answer.model_dump(mode="json", by_alias=True)
    assert got.get("isError") in (False, None), got
    assert got["content"][0]["text"] == "42"
    # without the env the client passes, visor run stops at once and names the variable it misses
    bare = subprocess.run(
        [wrapped["command"], *wrapped["args"]], env=env, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bare.returncode == 2
    assert "VISOR_HEADER_AUTHORIZATION is not set" in bare.stderr


def test_short_header_values_are_hidden_without_mangling_the_diff() -> None:
    from visor.install.init import hide_header_values

    diff = '--- m.json (before)\n-{"headers": {"A": "b", "B": "caf\\u00e9"}}\n'
    shown = hide_header_values(diff, ["b", "café"])
    assert shown == '--- m.json (before)\n-{"headers": {"A": "<hidden>", "B": "<hidden>"}}\n'
