"""The real MCP SDK client through `visor run`: everything works exactly as without Visor."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession

from tests.integration.sdk_scenario import direct_params, sdk_server_scenario, visor_params

SDK_SERVER = [sys.executable, str(Path(__file__).parents[1] / "servers" / "sdk_server.py")]


def test_sdk_server_through_visor_matches_direct(tmp_path: Path) -> None:
    direct = anyio.run(sdk_server_scenario, direct_params(SDK_SERVER))
    proxied = anyio.run(
        sdk_server_scenario,
        visor_params(SDK_SERVER, ["--server-name", "test", "--audit-log", str(tmp_path / "audit.jsonl")]),
    )
    assert proxied == direct
    # The scenario really exercised what it claims to.
    assert direct["add"]["structuredContent"] == {"result": 42}
    assert direct["weather"]["structuredContent"]["tags"] == ["sunny", "ünïcode"]
    assert direct["with_meta"]["_meta"]["example.org/trace"]["id"] == 9007199254740993
    assert direct["confirm"]["content"][0]["text"] == "accepted ok=True"
    assert len(direct["progress"]) == 3
    assert direct["fail"]["isError"] is True


def test_sdk_server_modern_protocol_through_visor(tmp_path: Path) -> None:
    direct = anyio.run(sdk_server_scenario, direct_params(SDK_SERVER), True)
    proxied = anyio.run(
        sdk_server_scenario, visor_params(SDK_SERVER, ["--audit-log", str(tmp_path / "audit.jsonl")]), True
    )
    assert proxied == direct
    assert direct["add"]["resultType"] == "complete"


def _time_server() -> list[str]:
    exe = Path(sys.executable).with_name("mcp-server-time")
    if not exe.exists():
        pytest.fail("mcp-server-time is not installed; `make test` installs it with the test extra")
    return [str(exe), "--local-timezone", "UTC"]


async def _time_scenario(params) -> dict:  # type: ignore[no-untyped-def]
    from mcp import stdio_client

    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        tools = await s.list_tools()
        conv = await s.call_tool(
            "convert_time",
            {"source_timezone": "Europe/Paris", "time": "12:30", "target_timezone": "Asia/Tokyo"},
        )
        bad = await s.call_tool("get_current_time", {"timezone": "Not/AZone"})
        return {
            "tools": sorted(t.name for t in tools.tools),
            "convert": conv.model_dump(mode="json", exclude_none=True)["structured_content"]
            if conv.structured_content
            else [c.text for c in conv.content],  # type: ignore[union-attr]
            "bad_is_error": bad.is_error,
        }


def test_real_reference_server_time_through_visor(tmp_path: Path) -> None:
    server = _time_server()
    direct = anyio.run(_time_scenario, direct_params(server))
    proxied = anyio.run(_time_scenario, visor_params(server, ["--audit-log", str(tmp_path / "a.jsonl")]))
    assert proxied == direct
    assert "convert_time" in direct["tools"]
    assert direct["bad_is_error"] is True


def _git_server() -> list[str]:
    exe = Path(sys.executable).with_name("mcp-server-git")
    if not exe.exists():
        pytest.fail("mcp-server-git is not installed; `make test` installs it with the test extra")
    return [str(exe)]


async def _git_scenario(params, repo: str) -> dict:  # type: ignore[no-untyped-def]
    from mcp import stdio_client

    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        tools = await s.list_tools()
        status = await s.call_tool("git_status", {"repo_path": repo})
        log = await s.call_tool("git_log", {"repo_path": repo, "max_count": 5})
        return {
            "tools": sorted(t.name for t in tools.tools),
            "status": [c.text for c in status.content],  # type: ignore[union-attr]
            "log": [c.text for c in log.content],  # type: ignore[union-attr]
        }


def test_real_reference_server_git_through_visor(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.org",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.org",
    }
    import os

    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.txt").write_text("hello\n")
    subprocess.run(["git", "-C", str(repo), "add", "a.txt"], check=True)
    subprocess.run(
        ["git", "-C", str(repo), "commit", "-qm", "first commit"], check=True, env={**os.environ, **env}
    )
    server = _git_server()
    direct = anyio.run(_git_scenario, direct_params(server), str(repo))
    proxied = anyio.run(
        _git_scenario, visor_params(server, ["--audit-log", str(tmp_path / "a.jsonl")]), str(repo)
    )
    assert proxied == direct
    assert any("first commit" in t for t in direct["log"])
    assert "git_status" in direct["tools"]


FILESYSTEM_SERVER = (
    Path(__file__).parents[2] / ".venv" / "node" / "node_modules" / ".bin" / "mcp-server-filesystem"
)


async def _filesystem_scenario(params, root: str) -> dict:  # type: ignore[no-untyped-def]
    from mcp import stdio_client

    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        tools = await s.list_tools()
        read = await s.call_tool("read_text_file", {"path": f"{root}/notes.txt"})
        wrote = await s.call_tool("write_file", {"path": f"{root}/out.txt", "content": "written"})
        env = await s.call_tool("read_text_file", {"path": f"{root}/.env"})
        return {
            "tools": sorted(t.name for t in tools.tools),
            "read": [c.text for c in read.content],  # type: ignore[union-attr]
            "wrote_error": wrote.is_error,
            "env_error": env.is_error,
            "env_text": " ".join(c.text for c in env.content),  # type: ignore[union-attr]
        }


def test_real_npm_filesystem_server_through_visor_with_the_default_policy(tmp_path: Path) -> None:
    if not FILESYSTEM_SERVER.exists():
        pytest.fail("the npm filesystem server is not installed; `make test` installs it")
    root = tmp_path / "root"
    root.mkdir()
    (root / "notes.txt").write_text("meeting at noon\n")
    (root / ".env").write_text("API_KEY=not-for-the-agent\n")
    real_root = str(root.resolve())
    server = [str(FILESYSTEM_SERVER), real_root]
    direct = anyio.run(_filesystem_scenario, direct_params(server), real_root)
    (root / "out.txt").unlink()
    proxied = anyio.run(
        _filesystem_scenario,
        visor_params(server, ["--server-name", "filesystem", "--audit-log", str(tmp_path / "a.jsonl")]),
        real_root,
    )
    # Reads and writes inside the root work as without Visor...
    assert proxied["tools"] == direct["tools"] and proxied["read"] == direct["read"] == ["meeting at noon\n"]
    assert direct["wrote_error"] is False and proxied["wrote_error"] is False
    assert (root / "out.txt").read_text() == "written"
    # ...but the .env the server itself would hand over is denied by the default policy.
    assert direct["env_error"] is False and "not-for-the-agent" in direct["env_text"]
    assert proxied["env_error"] is True and "Visor denied" in proxied["env_text"]
    assert "not-for-the-agent" not in proxied["env_text"]


def _fetch_server() -> list[str]:
    exe = Path(sys.executable).with_name("mcp-server-fetch")
    if not exe.exists():
        pytest.fail("mcp-server-fetch is not installed; `make test` installs it with the test extra")
    # loopback is the only network a test has: the server refuses it unless told
    return [str(exe), "--ignore-robots-txt", "--allow-private-ips"]


async def _fetch_scenario(params, url: str) -> dict:  # type: ignore[no-untyped-def]
    from mcp import stdio_client

    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        await s.list_tools()
        page = await s.call_tool("fetch", {"url": url, "max_length": 2000})
        return {"is_error": page.is_error, "text": "".join(c.text for c in page.content)}  # type: ignore[union-attr]


def test_real_reference_server_fetch_reads_an_ordinary_url_through_visor(tmp_path: Path) -> None:
    """mcp-server-fetch under the embedded default policy: an ordinary URL (a page served on
    loopback, since tests have no network) is fetched through Visor exactly as without it."""
    import http.server
    import threading

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html><body><h1>Release notes</h1><p>Version 2 is out.</p></body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/notes?v=2"
        server = _fetch_server()
        direct = anyio.run(_fetch_scenario, direct_params(server), url)
        proxied = anyio.run(
            _fetch_scenario, visor_params(server, ["--audit-log", str(tmp_path / "a.jsonl")]), url
        )
    finally:
        httpd.shutdown()
    assert direct["is_error"] is False and "Version 2 is out" in direct["text"]
    assert proxied == direct
