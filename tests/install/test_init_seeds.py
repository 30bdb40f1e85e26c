"""`visor init` on entries mcp-bouncer or mcp-visor wrapped: Visor unwraps their
wrapper, wraps the real server, and `--undo` gives back their entry byte for byte."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.install.helpers import SDK_SERVER, visor
from visor.install.configs import UPSTREAM_KEY, load_text, seed_wrapper, wrapped_run_args
from visor.install.jsonc import parse

PY = sys.executable
SERVER = str(SDK_SERVER)

# As mcp-bouncer's `init` leaves an entry: `bouncer run`, the original under x-bouncer-upstream.
BOUNCER_ENTRY = {
    "command": "bouncer",
    "args": ["run", "--config", "/home/me/.mcp.json", "--upstream-name", "notes"],
    "x-bouncer-upstream": {"command": PY, "args": [SERVER], "env": {"NOTES_DIR": "/tmp"}},
}
# As mcp-visor's README wraps one: `mcp-visor serve -server CMD -server-arg A ... -audit-log L`.
MCP_VISOR_ENTRY = {
    "command": "/usr/local/bin/mcp-visor",
    "args": ["serve", "-server", PY, "-server-arg", SERVER, "-audit-log=/tmp/a.jsonl", "-approval-cli"],
    "env": {"NOTES_DIR": "/tmp"},
}


def claude_code() -> str:
    return json.dumps({"mcpServers": {"notes": BOUNCER_ENTRY, "time": MCP_VISOR_ENTRY}}, indent=2) + "\n"


def claude_desktop() -> str:
    servers = {"notes": BOUNCER_ENTRY, "time": MCP_VISOR_ENTRY}
    return json.dumps({"mcpServers": servers, "globalShortcut": "Ctrl+Space"}, indent=2, ensure_ascii=False)


def cursor() -> str:
    return json.dumps({"mcpServers": {"notes": BOUNCER_ENTRY, "time": MCP_VISOR_ENTRY}}, indent=4)


def vscode() -> str:
    # JSONC, tabs, comments and trailing commas, one entry on one line
    return (
        "{\n"
        "\t// wrapped by the seeds\n"
        '\t"servers": {\n'
        f'\t\t"notes": {json.dumps({"type": "stdio", **BOUNCER_ENTRY})}, /* bouncer */\n'
        '\t\t"time": {\n'
        '\t\t\t"type": "stdio",\n'
        f'\t\t\t"command": {json.dumps(MCP_VISOR_ENTRY["command"])}, // mcp-visor\n'
        f'\t\t\t"args": {json.dumps(MCP_VISOR_ENTRY["args"])},\n'
        '\t\t\t"env": {"NOTES_DIR": "/tmp"},\n'
        "\t\t},\n"
        "\t},\n"
        "}\n"
    )


def claude_json() -> str:
    return json.dumps({"projects": {"/home/me/p": {"mcpServers": {"notes": BOUNCER_ENTRY}}}}, indent=2)


FORMATS = [
    (".mcp.json", claude_code),
    ("claude_desktop_config.json", claude_desktop),
    (".cursor/mcp.json", cursor),
    (".vscode/mcp.json", vscode),
    (".claude.json", claude_json),
]


def entries(path: Path) -> dict[str, dict]:
    config = load_text(path.read_text(encoding="utf-8"), str(path))
    return {e.name: e.value for e in config.entries}


@pytest.mark.parametrize(("rel", "make"), FORMATS)
def test_init_unwraps_the_seeds_and_undo_restores_them(tmp_path: Path, rel: str, make) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(make(), encoding="utf-8", newline="")
    original = path.read_bytes()
    before = entries(path)

    wrapped = visor("init", "--config", str(path), "--yes", cwd=tmp_path)
    assert wrapped.returncode == 0, wrapped.stderr
    assert "was wrapped by mcp-bouncer" in wrapped.stderr
    after = entries(path)
    for name, value in after.items():
        split = wrapped_run_args(value)
        assert split is not None, f"{name} is not wrapped by visor run"
        # the real server runs behind Visor, with the environment the seed gave it
        assert split[1] == [PY, SERVER]
        assert value["env"] == {"NOTES_DIR": "/tmp"}
        assert "bouncer" not in json.dumps(split) and "mcp-visor" not in json.dumps(split)
        # the seed's entry is kept whole for undo
        assert value[UPSTREAM_KEY] == before[name]
    if "time" in after:
        assert "not carried over: -audit-log -approval-cli" in wrapped.stderr

    again = visor("init", "--config", str(path), "--yes", cwd=tmp_path)
    assert again.returncode == 0 and "nothing to change" in again.stdout

    undone = visor("init", "--config", str(path), "--undo", "--yes", cwd=tmp_path)
    assert undone.returncode == 0, undone.stderr
    assert path.read_bytes() == original


def test_rerun_with_options_updates_and_undo_still_restores_the_seed(tmp_path: Path) -> None:
    path = tmp_path / ".mcp.json"
    path.write_text(claude_code(), encoding="utf-8")
    original = path.read_bytes()
    assert visor("init", "--config", str(path), "--yes").returncode == 0
    approvals = tmp_path / "approvals"
    update = visor("init", "--config", str(path), "--approval-dir", str(approvals), "--yes")
    assert update.returncode == 0, update.stderr
    for value in entries(path).values():
        options, upstream = wrapped_run_args(value) or ([], [])
        assert "--approval-dir" in options and upstream == [PY, SERVER]
    assert visor("init", "--config", str(path), "--undo", "--yes").returncode == 0
    assert path.read_bytes() == original


def test_a_seed_policy_is_not_dropped_silently(tmp_path: Path) -> None:
    bouncer = dict(BOUNCER_ENTRY, args=[*BOUNCER_ENTRY["args"], "--policy", "/home/me/bouncer.yaml"])
    mcp_visor = dict(MCP_VISOR_ENTRY, args=[*MCP_VISOR_ENTRY["args"], "-policy", "/home/me/visor.yaml"])
    path = tmp_path / ".mcp.json"
    path.write_text(json.dumps({"mcpServers": {"notes": bouncer, "time": mcp_visor}}, indent=2))
    original = path.read_bytes()
    result = visor("init", "--config", str(path), "--yes")
    assert result.returncode == 0
    assert "visor policy import --from bouncer /home/me/bouncer.yaml" in result.stdout
    assert "visor policy import --from mcp-visor /home/me/visor.yaml" in result.stdout
    assert path.read_bytes() == original  # nothing wrapped without the policy
    policy = tmp_path / "p.yaml"
    policy.write_text(
        'version: "1.0"\nservers:\n  - {name: "*", allowed: true, tools: [{name: "*", allowed: true}]}\n'
    )
    result = visor("init", "--config", str(path), "--policy", str(policy), "--yes")
    assert result.returncode == 0, result.stderr
    for value in entries(path).values():
        options, upstream = wrapped_run_args(value) or ([], [])
        assert str(policy) in options and upstream == [PY, SERVER]


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["serve", "-server-url", "https://x.example/mcp"], "remote"),
        (["serve", "-policy", "p.yaml"], "without -server"),
        (["serve", "-server", "x", "-frobnicate"], "-frobnicate"),
        (["serve", "-server", "x", "extra"], "cannot place"),
    ],
)
def test_mcp_visor_wrappers_it_cannot_read_are_left_alone(args: list[str], why: str) -> None:
    text = json.dumps({"mcpServers": {"s": {"command": "mcp-visor", "args": args}}})
    [entry] = load_text(text, "mcp.json").entries
    assert entry.kind == "other" and why in entry.note
    assert isinstance(seed_wrapper(entry.value), str)


def test_broken_bouncer_wrapper_is_left_alone() -> None:
    text = json.dumps(
        {"mcpServers": {"s": {"command": "bouncer", "args": ["run"], "x-bouncer-upstream": {}}}}
    )
    [entry] = load_text(text, "mcp.json").entries
    assert entry.kind == "other" and "x-bouncer-upstream" in entry.note


def test_doctor_starts_the_server_that_was_inside_the_seed(tmp_path: Path) -> None:
    path = tmp_path / ".mcp.json"
    path.write_text(json.dumps({"mcpServers": {"notes": BOUNCER_ENTRY}}, indent=2))
    before = visor("doctor", "--config", str(path), "--no-start")
    assert "wrapped by mcp-bouncer, not by Visor" in before.stdout + before.stderr
    assert visor("init", "--config", str(path), "--yes").returncode == 0
    doctor = visor("doctor", "--config", str(path))
    assert "differs from" not in doctor.stdout
    assert "starts through Visor; tools/list answered" in doctor.stdout, doctor.stdout
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr


def test_parse_keeps_vscode_comments_after_the_wrap(tmp_path: Path) -> None:
    path = tmp_path / ".vscode" / "mcp.json"
    path.parent.mkdir()
    path.write_text(vscode(), encoding="utf-8")
    assert visor("init", "--config", str(path), "--yes").returncode == 0
    text = path.read_text()
    assert "// wrapped by the seeds" in text and "/* bouncer */" in text and "// mcp-visor" in text
    parse(text)


def test_list_names_the_seed_that_wrapped_an_entry(tmp_path: Path) -> None:
    (tmp_path / ".mcp.json").write_text(claude_code())
    listing = visor("init", "--list", cwd=tmp_path, env={"HOME": str(tmp_path)})
    assert listing.returncode == 0
    notes = next(ln for ln in listing.stdout.splitlines() if ln.strip().startswith("notes"))
    assert "wrapped by mcp-bouncer" in notes and PY[:40] in notes
    time = next(ln for ln in listing.stdout.splitlines() if ln.strip().startswith("time "))
    assert "wrapped by mcp-visor" in time
