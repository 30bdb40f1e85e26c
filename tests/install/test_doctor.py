"""`visor doctor` on a good installation and on broken ones, with real servers."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.install.helpers import SDK_SERVER, VISOR_EXE, venv_tool, visor


def write_config(path: Path, servers: dict) -> Path:
    path.write_text(json.dumps({"mcpServers": servers}, indent=2) + "\n")
    return path


def lines(out: str, level: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith(level + " ")]


def test_good_setup(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / ".mcp.json",
        {
            "sdk": {"command": sys.executable, "args": [str(SDK_SERVER)], "env": {"SDK_TEST": "1"}},
            "time": {
                "command": venv_tool("mcp-server-time"),
                "args": ["--local-timezone", "UTC"],
                "cwd": str(tmp_path),
            },
        },
    )
    policy = tmp_path / "time.yaml"
    scaffolded = visor(
        "policy", "scaffold", "--server-name", "time", "-o", str(policy), "--", venv_tool("mcp-server-time")
    )
    assert scaffolded.returncode == 0, scaffolded.stderr
    for args in (["--server", "sdk"], ["--server", "time", "--policy", str(policy)]):
        wrapped = visor("init", "--config", str(config), "--absolute", "--yes", *args)
        assert wrapped.returncode == 0, wrapped.stderr

    result = visor("doctor", "--config", str(config), env={"HOME": str(tmp_path)})
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert not lines(out, "FAIL"), out
    assert f"OK   .mcp.json:sdk: wrapped; runs {VISOR_EXE}" in out
    assert "OK   .mcp.json:sdk: starts through Visor; tools/list answered" in out
    assert "from visor-test-server" in out
    assert "OK   .mcp.json:time: starts through Visor; tools/list answered 2 tool(s) from mcp-time" in out
    assert f"OK   .mcp.json:time: policy {policy} loads" in out
    assert "OK   .mcp.json:sdk: policy: the embedded default" in out
    assert any("no approval channel" in ln for ln in lines(out, "WARN"))
    assert "0 failure(s)" in out
    # the user's audit logs were not written: doctor used a throwaway one
    audit = Path(os.environ["VISOR_HOME"]) / "audit"
    assert not audit.exists() or not any(audit.iterdir())


def test_unwrapped_remote_and_approval_dir(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "mcp.json",
        {
            "plain": {"command": venv_tool("mcp-server-time")},
            "remote": {"type": "http", "url": "https://example.com/mcp"},
            "approved": {
                "command": str(VISOR_EXE),
                "args": [
                    "run",
                    "--server-name",
                    "approved",
                    "--approval-dir",
                    str(tmp_path / "approvals"),
                    "--",
                    venv_tool("mcp-server-time"),
                ],
                "x-visor-upstream": {"command": venv_tool("mcp-server-time")},
            },
        },
    )
    result = visor("doctor", "--config", str(config), "--no-start")
    assert result.returncode == 0, result.stdout
    out = result.stdout
    assert (
        f"WARN mcp.json:plain: not wrapped: its tool calls bypass Visor -- fix: visor init --config {config} --server plain"
        in out
    )
    assert (
        "WARN mcp.json:remote: remote server (https://example.com/mcp), not wrapped: its tool calls bypass Visor"
        in out
    )
    assert f"OK   mcp.json:approved: approvals through files in {tmp_path / 'approvals'}" in out
    assert "starts through Visor" not in out  # --no-start


def test_a_remote_entry_init_leaves_alone_is_not_offered_init_as_the_fix(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "mcp.json",
        {
            "legacy": {"url": "https://example.com/sse"},
            "typed": {"type": "sse", "url": "https://example.com/x"},
        },
    )
    before = config.read_bytes()
    result = visor("doctor", "--config", str(config), "--no-start")
    for name in ("legacy", "typed"):
        line = next(ln for ln in result.stdout.splitlines() if ln.startswith(f"WARN mcp.json:{name}:"))
        assert "not covered by Visor" in line and "legacy HTTP+SSE" in line, line
        assert f"--server {name}" not in line.split(" -- fix: ")[1], line
        # the command the fix would have named changes nothing
        wrapped = visor("init", "--config", str(config), "--server", name, "--yes")
        assert wrapped.returncode == 0 and "nothing to change" in wrapped.stdout, wrapped.stdout
    assert config.read_bytes() == before


def test_a_mistyped_config_path_is_not_told_to_fix_the_file(tmp_path: Path) -> None:
    result = visor("doctor", "--config", str(tmp_path / "mpc.json"), "--no-start")
    assert result.returncode == 1
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("FAIL"))
    assert "no such file" in line and "visor init --list" in line and "fix the file" not in line, line


def test_the_fix_for_a_bare_visor_keeps_the_policy_the_entry_was_wrapped_with(tmp_path: Path) -> None:
    # The fix was "visor init --undo ...; visor init --absolute ...": the undo drops --policy,
    # and the rewrap as typed ran the server under the embedded default (every listed tool).
    import shlex

    policy = tmp_path / "policy.yaml"
    policy.write_text('version: "1.0"\ndefault_action: deny\nservers:\n  - name: "time"\n    allowed: true\n')
    config = write_config(tmp_path / "mcp.json", {"time": {"command": venv_tool("mcp-server-time")}})
    wrapped = visor("init", "--config", str(config), "--policy", str(policy), "--yes")
    assert wrapped.returncode == 0, wrapped.stderr
    result = visor("doctor", "--config", str(config), "--no-start")
    line = next(ln for ln in result.stdout.splitlines() if "a desktop app" in ln)
    fix = line.split(" -- fix: ", 1)[1]
    assert ";" not in fix and "--undo" not in fix, fix
    argv = shlex.split(fix)
    assert argv[:2] == ["visor", "init"], fix
    done = visor(*argv[1:], "--yes")
    assert done.returncode == 0, done.stderr
    entry = json.loads(config.read_text())["mcpServers"]["time"]
    assert os.path.isabs(entry["command"])
    assert entry["args"][entry["args"].index("--policy") + 1] == str(policy)
    # the same for the approval channel: a runnable init line, the policy kept
    again = visor("doctor", "--config", str(config), "--no-start")
    line = next(ln for ln in again.stdout.splitlines() if "no approval channel" in ln)
    fix = line.split(" -- fix: ", 1)[1].split(", then ", 1)[0].replace("DIR", str(tmp_path / "answers"))
    done = visor(*shlex.split(fix)[1:], "--yes")
    assert done.returncode == 0, done.stderr
    args = json.loads(config.read_text())["mcpServers"]["time"]["args"]
    assert args[args.index("--approval-dir") + 1] == str(tmp_path / "answers")
    assert args[args.index("--policy") + 1] == str(policy)


def test_broken_setup(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text('version: "1.0"\ndefault_action: deny\nservers:\n  - name: "time"\n    allowed: true\n')
    config = write_config(
        tmp_path / ".mcp.json",
        {
            "ghost": {"command": str(tmp_path / "no-such-server"), "args": ["--flag"]},
            "time": {"command": venv_tool("mcp-server-time")},
            "elsewhere": {"command": venv_tool("mcp-server-time")},
        },
    )
    for server in ("ghost", "time", "elsewhere"):
        wrapped = visor(
            "init",
            "--config",
            str(config),
            "--absolute",
            "--yes",
            "--server",
            server,
            "--policy",
            str(policy),
        )
        assert wrapped.returncode == 0, wrapped.stderr
    # then the policy is broken by hand
    policy.write_text(
        'version: "1.0"\ndefault_action: deny\nservers:\n  - name: "time"\n    allowed: maybe\n'
    )

    result = visor("doctor", "--config", str(config), "--timeout", "20")
    assert result.returncode == 1
    out = result.stdout
    fails = lines(out, "FAIL")
    ghost = [ln for ln in fails if ln.startswith("FAIL .mcp.json:ghost:")]
    assert any(
        f"the server command '{tmp_path / 'no-such-server'}' is not found -- fix: install it" in ln
        for ln in ghost
    ), out
    assert any(
        "policy does not load" in ln and "allowed" in ln and f"fix: visor lint {policy}" in ln for ln in fails
    )
    assert any(
        ln.startswith("FAIL .mcp.json:time: not started: fix the problems above first") for ln in fails
    )

    # a policy that loads but has no entry for this server name: every call denied
    policy.write_text('version: "1.0"\ndefault_action: deny\nservers:\n  - name: "time"\n    allowed: true\n')
    again = visor("doctor", "--config", str(config), "--timeout", "20")
    assert again.returncode == 1
    assert any(
        "has no server entry 'elsewhere'" in ln and "every call is denied" in ln
        for ln in lines(again.stdout, "FAIL")
    ), again.stdout
    assert "OK   .mcp.json:time: starts through Visor" in again.stdout
    ghost_start = [
        ln
        for ln in lines(again.stdout, "FAIL")
        if ln.startswith("FAIL .mcp.json:ghost: the server does not start, with or without Visor")
    ]
    # the server's own failure, not Visor's log lines about it
    assert ghost_start and "server_spawn_failed" not in ghost_start[0], again.stdout


def test_broken_config_and_bad_audit_log(tmp_path: Path) -> None:
    config = tmp_path / ".mcp.json"
    config.write_text('{"mcpServers": {"a": {"command": "x"},}}')
    home = Path(os.environ["VISOR_HOME"])
    (home / "audit").mkdir(parents=True)
    (home / "audit" / "old.jsonl").write_text('{"not": "a record"}\n')
    result = visor("doctor", "--config", str(config))
    assert result.returncode == 1
    out = result.stdout
    assert f"FAIL {config}: 1:38: trailing comma in a strict JSON file" in out
    assert any(
        ln.startswith("FAIL audit: audit log does not verify:") and "old.jsonl:1" in ln
        for ln in lines(out, "FAIL")
    )
    assert config.read_text() == '{"mcpServers": {"a": {"command": "x"},}}'


def test_no_configs_found(tmp_path: Path) -> None:
    result = visor("doctor", cwd=tmp_path, env={"HOME": str(tmp_path)})
    assert result.returncode == 0
    assert "WARN configs: no MCP client config found in the usual places" in result.stdout


def test_a_remote_entry_wrapped_by_init_is_checked_not_failed(tmp_path: Path) -> None:
    """`visor init` turns a url entry into `visor run --url`; doctor reads that form (and
    never connects, which would send the entry's credentials from here)."""
    config = write_config(
        tmp_path / "mcp.json",
        {"remote": {"type": "http", "url": "https://example.com/mcp", "headers": {"X-Api-Key": "k-123"}}},
    )
    wrapped = visor("init", "--config", str(config), "--absolute", "--yes", env={"HOME": str(tmp_path)})
    assert wrapped.returncode == 0, wrapped.stdout + wrapped.stderr
    result = visor("doctor", "--config", str(config), env={"HOME": str(tmp_path)})
    assert result.returncode == 0, result.stdout
    assert "OK   mcp.json:remote: wrapped remote server (https://example.com/mcp)" in result.stdout
    assert "FAIL" not in result.stdout
    assert "k-123" not in result.stdout + result.stderr

    # The header's variable gone from the entry's env: Visor would refuse to start, doctor says so.
    data = json.loads(config.read_text())
    data["mcpServers"]["remote"]["env"] = {}
    config.write_text(json.dumps(data))
    broken = visor("doctor", "--config", str(config), env={"HOME": str(tmp_path)})
    assert "FAIL mcp.json:remote: header 'X-Api-Key' reads ${" in broken.stdout, broken.stdout
