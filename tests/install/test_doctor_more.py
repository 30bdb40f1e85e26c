"""`visor doctor`: VS Code's variables filled in before a start, the server's own
error when it does not start, the --json document, progress on stderr."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.install.helpers import SDK_SERVER, VISOR_EXE, visor

PY = sys.executable
# A server that checks it was given what VS Code would give it, then runs the SDK server.
CHECKING_SERVER = """import os, runpy, sys
expected = {"HOME_SEEN": sys.argv[1], "TOKEN": sys.argv[2], "FROM_FILE": "yes"}
for key, want in expected.items():
    if os.environ.get(key) != want:
        sys.stderr.write(f"bad {key}: {os.environ.get(key)!r} != {want!r}\\n")
        sys.exit(4)
sys.argv = [sys.argv[0]]
runpy.run_path(SDK_SERVER, run_name="__main__")
""".replace("SDK_SERVER", repr(str(SDK_SERVER)))


def wrapped(name: str, upstream: list[str], **extra: object) -> dict:
    return {
        "type": "stdio",
        "command": str(VISOR_EXE),
        "args": ["run", "--server-name", name, "--", *upstream],
        **extra,
        "x-visor-upstream": {"type": "stdio", "command": upstream[0], "args": upstream[1:], **extra},
    }


def vscode_workspace(tmp_path: Path, servers: dict) -> Path:
    (tmp_path / ".vscode").mkdir(exist_ok=True)
    path = tmp_path / ".vscode" / "mcp.json"
    path.write_text("// workspace servers\n" + json.dumps({"servers": servers}, indent=2))
    return path


def test_vscode_variables_are_filled_in_before_the_start(tmp_path: Path) -> None:
    (tmp_path / "srv").mkdir()
    (tmp_path / "srv" / "check.py").write_text(CHECKING_SERVER)
    (tmp_path / ".env").write_text("# from envFile\nFROM_FILE='yes'\n")
    home = tmp_path / "home"
    home.mkdir()
    entry = wrapped(
        "checked",
        [PY, "${workspaceFolder}${/}srv/check.py", str(home), "t0k3n"],
        env={"HOME_SEEN": "${userHome}", "TOKEN": "${env:DOCTOR_TEST_TOKEN}"},
        envFile="${workspaceFolder}/.env",
    )
    config = vscode_workspace(tmp_path, {"checked": entry})
    result = visor("doctor", "--config", str(config), env={"HOME": str(home), "DOCTOR_TEST_TOKEN": "t0k3n"})
    assert "checked: starts through Visor; tools/list answered" in result.stdout, result.stdout
    assert "not found" not in result.stdout


def test_a_variable_doctor_cannot_know_is_reported_not_started(tmp_path: Path) -> None:
    entry = wrapped("prompted", [PY, str(SDK_SERVER)], env={"TOKEN": "${input:api-token}"})
    config = vscode_workspace(tmp_path, {"prompted": entry})
    result = visor("doctor", "--config", str(config))
    assert "uses ${input:api-token}" in result.stdout
    assert "starts through Visor" not in result.stdout and "does not start" not in result.stdout


def test_other_clients_keep_dollar_braces_literally(tmp_path: Path) -> None:
    entry = wrapped("literal", [PY, str(SDK_SERVER)], env={"TOKEN": "${input:api-token}"})
    config = tmp_path / ".mcp.json"
    config.write_text(json.dumps({"mcpServers": {"literal": entry}}))
    result = visor("doctor", "--config", str(config))
    assert "literal: starts through Visor" in result.stdout, result.stdout


def test_the_servers_own_error_not_visors_log_lines(tmp_path: Path) -> None:
    broken = [PY, "-c", "import sys; sys.stderr.write('boom: no API key given\\n'); sys.exit(3)"]
    config = tmp_path / ".mcp.json"
    config.write_text(json.dumps({"mcpServers": {"broken": wrapped("broken", broken)}}))
    result = visor("doctor", "--config", str(config))
    [fail] = [ln for ln in result.stdout.splitlines() if ln.startswith("FAIL") and "broken:" in ln]
    assert "does not start, with or without Visor" in fail and "boom: no API key given" in fail
    assert "server_started" not in fail and "session_end" not in fail  # none of Visor's log lines
    assert result.returncode == 1


def test_a_server_that_starts_alone_but_not_through_visor(tmp_path: Path) -> None:
    entry = wrapped("sdk", [PY, str(SDK_SERVER)])
    entry["args"] = ["run", "--server-name", "sdk", "--identity", "nobody", "--", PY, str(SDK_SERVER)]
    config = tmp_path / ".mcp.json"
    config.write_text(json.dumps({"mcpServers": {"sdk": entry}}))
    result = visor("doctor", "--config", str(config))
    assert "starts on its own but not through Visor" in result.stdout, result.stdout
    assert "nobody" in result.stdout


def test_json_document_and_progress(tmp_path: Path) -> None:
    config = tmp_path / ".mcp.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "sdk": wrapped("sdk", [PY, str(SDK_SERVER)]),
                    "plain": {"command": PY, "args": [str(SDK_SERVER)]},
                }
            }
        )
    )
    result = visor("doctor", "--config", str(config), "--json")
    report = json.loads(result.stdout)
    assert report["version"] == 1 and report["configs"] == [str(config)]
    assert report["exit_code"] == result.returncode == 0
    levels = [c["level"] for c in report["checks"]]
    assert set(levels) <= {"ok", "warn", "fail"}
    assert report["summary"] == {k: levels.count(k) for k in ("ok", "warn", "fail")}
    for check in report["checks"]:
        assert set(check) == {"level", "subject", "message", "fix"}
        assert check["fix"] is None if check["level"] == "ok" else check["fix"] is None or check["fix"]
    plain = [c for c in report["checks"] if c["subject"] == ".mcp.json:plain"]
    assert plain[0]["level"] == "warn" and plain[0]["fix"].startswith("visor init")
    assert any(c["message"].startswith("starts through Visor") for c in report["checks"])
    assert "visor doctor:" not in result.stderr  # not a terminal: no progress unless asked
    progress = visor("doctor", "--config", str(config), "--progress", "--no-start")
    assert f"visor doctor: checking {config}" in progress.stderr
    assert "visor doctor:" not in progress.stdout


def test_a_vscode_remote_entry_init_wrapped_is_not_reported_as_using_a_vscode_variable(
    tmp_path: Path,
) -> None:
    # init writes --header 'Authorization: ${VISOR_HEADER_AUTHORIZATION}'; VS Code leaves a name
    # it does not know as written, and Visor reads it from env. Doctor warned on every such entry
    # that VS Code fills it in and doctor cannot.
    config = tmp_path / ".vscode" / "mcp.json"
    config.parent.mkdir()
    config.write_text(
        '{"servers": {"gh": {"type": "http", "url": "https://api.example.test/mcp",'
        ' "headers": {"Authorization": "Bearer abc"}}}}'
    )
    wrapped = visor("init", "--config", str(config), "--yes")
    assert wrapped.returncode == 0, wrapped.stderr
    result = visor("doctor", "--config", str(config), "--no-start")
    assert "VISOR_HEADER_AUTHORIZATION" not in result.stdout, result.stdout
    assert "OK   mcp.json:gh: wrapped remote server (https://api.example.test/mcp)" in result.stdout
    # a variable VS Code does fill in is still reported
    data = json.loads(config.read_text())
    data["servers"]["gh"]["env"]["VISOR_HEADER_AUTHORIZATION"] = "Bearer ${input:tok}"
    config.write_text(json.dumps(data))
    again = visor("doctor", "--config", str(config), "--no-start")
    assert "uses ${input:tok}, which VS Code fills in" in again.stdout, again.stdout
