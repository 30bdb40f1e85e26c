"""Config rewriting as text in, text out: every client format, round trips, what is left alone."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from visor.install.configs import (
    UPSTREAM_KEY,
    ConfigError,
    WrapOptions,
    detect_indent,
    load_text,
    plan_undo,
    plan_wrap,
    wrapped_run_args,
    wrapped_value,
)
from visor.install.jsonc import JsoncError, parse

CLAUDE_CODE = """{
  "mcpServers": {
    "filesystem": {
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-filesystem", "/home/me/project"],
      "env": {"DEBUG": "1"},
      "cwd": "/home/me/project"
    },
    "linear": {
      "type": "http",
      "url": "https://mcp.linear.app/mcp"
    }
  }
}
"""

CLAUDE_DESKTOP = json.dumps(
    {
        "mcpServers": {
            "time": {"command": "uvx", "args": ["mcp-server-time", "--local-timezone", "Europe/Paris"]},
            "git": {"command": "uvx", "args": ["mcp-server-git"], "env": {"GIT_AUTHOR_NAME": "Zoë"}},
        },
        "globalShortcut": "Ctrl+Space",
    },
    indent=2,
    ensure_ascii=False,
)

CURSOR = json.dumps(
    {
        "mcpServers": {
            "github": {
                "command": "docker",
                "args": ["run", "-i", "--rm", "ghcr.io/github/github-mcp-server"],
                "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "x"},
            },
            "sse": {"url": "http://localhost:8000/sse"},
        }
    },
    indent=4,
)

VSCODE = """{
\t// Inputs are prompted on first server start
\t"inputs": [
\t\t{"type": "promptString", "id": "token", "description": "API token", "password": true},
\t],
\t"servers": {
\t\t/* the reference time server */
\t\t"time": {
\t\t\t"type": "stdio",
\t\t\t"command": "uvx", // from PyPI
\t\t\t"args": ["mcp-server-time"],
\t\t\t"envFile": "${workspaceFolder}/.env",
\t\t},
\t\t"remote": {"type": "http", "url": "https://api.example.com/mcp"},
\t},
}
"""

OPTIONS = WrapOptions("visor", "/etc/visor/policy.yaml")


def wrap(text: str, path: str = "mcp.json", names: list[str] | None = None) -> str:
    return plan_wrap(load_text(text, path), names, OPTIONS).text


def undo(text: str, path: str = "mcp.json", names: list[str] | None = None) -> str:
    return plan_undo(load_text(text, path), names).text


def jsonc_value(text: str) -> dict:
    return parse(text).root.value


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (CLAUDE_CODE, "/p/.mcp.json"),
        (CLAUDE_DESKTOP, "/h/.config/Claude/claude_desktop_config.json"),
        (CURSOR, "/h/.cursor/mcp.json"),
        (VSCODE, "/p/.vscode/mcp.json"),
    ],
    ids=["claude-code", "claude-desktop", "cursor", "vscode"],
)
def test_wrap_undo_wrap_round_trip(text: str, path: str) -> None:
    wrapped = wrap(text, path)
    assert wrapped != text
    assert undo(wrapped, path) == text  # byte-identical, comments and trailing commas included
    assert wrap(undo(wrapped, path), path) == wrapped
    # wrapping twice changes nothing: wrapped entries are left alone
    assert wrap(wrapped, path) == wrapped
    plan = plan_wrap(load_text(wrapped, path), None, OPTIONS)
    assert not plan.changes
    assert all(why for _, why in plan.skipped)


def test_wrapped_entry_keeps_env_cwd_and_the_original() -> None:
    data = json.loads(wrap(CLAUDE_CODE))
    fs = data["mcpServers"]["filesystem"]
    original = json.loads(CLAUDE_CODE)["mcpServers"]["filesystem"]
    assert fs["command"] == "visor"
    assert fs["args"] == [
        "run",
        "--server-name",
        "filesystem",
        "--policy",
        "/etc/visor/policy.yaml",
        "--",
        "npx",
        "-y",
        "@modelcontextprotocol/server-filesystem",
        "/home/me/project",
    ]
    assert fs["env"] == {"DEBUG": "1"}
    assert fs["cwd"] == "/home/me/project"
    assert fs[UPSTREAM_KEY] == original
    assert fs == wrapped_value(original, "filesystem", OPTIONS)
    assert list(fs) == ["command", "args", "env", "cwd", UPSTREAM_KEY]
    assert wrapped_run_args(fs) == (
        ["--server-name", "filesystem", "--policy", "/etc/visor/policy.yaml"],
        ["npx", "-y", "@modelcontextprotocol/server-filesystem", "/home/me/project"],
    )


def test_remote_entries_are_wrapped_with_url_and_legacy_sse_left_alone() -> None:
    for text, path in ((CLAUDE_CODE, ".mcp.json"), (CURSOR, "mcp.json"), (VSCODE, ".vscode/mcp.json")):
        config = load_text(text, path)
        plan = plan_wrap(config, None, OPTIONS)
        after = jsonc_value(plan.text)
        block = "servers" if "servers" in after else "mcpServers"
        remote = [e for e in config.entries if e.kind == "remote"]
        assert remote, path
        for e in remote:
            if e.name == "sse":
                # the legacy transport: not spoken by visor run --url, so the entry's text is unchanged
                assert (e, e.note) in plan.skipped and "/sse" in e.note
                node = e.member.value
                assert text[node.start : node.end] in plan.text
                continue
            assert e in plan.changed
            options, upstream = wrapped_run_args(after[block][e.name]) or ([], ["?"])
            assert upstream == [] and options[-2:] == ["--url", e.value["url"]]
        assert undo(plan.text, path) == text


def test_vscode_comments_outside_entries_survive_and_inside_come_back_on_undo() -> None:
    wrapped = wrap(VSCODE, ".vscode/mcp.json")
    assert "// Inputs are prompted on first server start" in wrapped
    assert "/* the reference time server */" in wrapped
    # the comment inside the entry travels with the original, under x-visor-upstream
    assert wrapped.count("// from PyPI") == 1
    data = jsonc_value(wrapped)
    time = data["servers"]["time"]
    assert time["type"] == "stdio"
    assert time["envFile"] == "${workspaceFolder}/.env"
    assert time["args"][-2:] == ["--", "uvx"] or time["args"][-3:] == ["--", "uvx", "mcp-server-time"]
    assert '\t\t\t"command": "visor"' in wrapped  # tabs kept
    assert undo(wrapped, ".vscode/mcp.json") == VSCODE


def test_only_named_servers_are_wrapped_and_undone() -> None:
    wrapped = wrap(CLAUDE_DESKTOP, "c.json", ["git"])
    data = json.loads(wrapped)
    assert UPSTREAM_KEY in data["mcpServers"]["git"]
    assert UPSTREAM_KEY not in data["mcpServers"]["time"]
    both = wrap(wrapped, "c.json")
    assert undo(both, "c.json", ["time"]) == wrapped
    assert undo(both, "c.json") == CLAUDE_DESKTOP
    with pytest.raises(ConfigError, match=r"no server named 'nope' \(servers: git, time\)"):
        wrap(CLAUDE_DESKTOP, "c.json", ["nope"])


def test_non_ascii_crlf_and_no_trailing_newline() -> None:
    text = CLAUDE_DESKTOP.replace("\n", "\r\n")
    assert not text.endswith("\n")
    wrapped = wrap(text, "c.json")
    assert "\r\n" in wrapped and "\n" not in wrapped.replace("\r\n", "")
    assert not wrapped.endswith("\n")
    assert json.loads(wrapped)["mcpServers"]["git"]["env"]["GIT_AUTHOR_NAME"] == "Zoë"
    assert undo(wrapped, "c.json") == text


def test_compact_one_line_file() -> None:
    text = '{"mcpServers":{"a":{"command":"srv","args":["--x"]}}}'
    wrapped = wrap(text)
    assert "\n" not in wrapped
    assert json.loads(wrapped)["mcpServers"]["a"]["args"] == [
        "run",
        "--server-name",
        "a",
        "--policy",
        "/etc/visor/policy.yaml",
        "--",
        "srv",
        "--x",
    ]
    assert undo(wrapped) == text


def test_entry_without_args_and_with_unusual_key_order() -> None:
    text = '{\n  "mcpServers": {\n    "x": {\n      "env": {},\n      "command": "srv",\n      "disabled": false\n    }\n  }\n}\n'
    wrapped = wrap(text)
    x = json.loads(wrapped)["mcpServers"]["x"]
    assert list(x) == ["env", "command", "args", "disabled", UPSTREAM_KEY]
    assert x["args"][-2:] == ["--", "srv"]
    assert undo(wrapped) == text


def test_hand_wrapped_entry_is_left_alone_and_cannot_be_undone() -> None:
    text = json.dumps(
        {"mcpServers": {"h": {"command": "/usr/local/bin/visor", "args": ["run", "--", "srv"]}}}
    )
    config = load_text(text, "m.json")
    assert config.entries[0].kind == "wrapped"
    assert not plan_wrap(config, None, OPTIONS).changes
    plan = plan_undo(config, None)
    assert not plan.changes
    assert "undo cannot restore" in plan.skipped[0][1]


def test_claude_json_user_and_project_scopes() -> None:
    text = json.dumps(
        {
            "numStartups": 12,
            "mcpServers": {
                "time": {"type": "stdio", "command": "uvx", "args": ["mcp-server-time"], "env": {}}
            },
            "projects": {
                "/home/me/app": {
                    "allowedTools": [],
                    "mcpServers": {"git": {"type": "stdio", "command": "uvx", "args": ["mcp-server-git"]}},
                },
                "/home/me/other": {"allowedTools": []},
            },
        },
        indent=2,
    )
    config = load_text(text, "/home/me/.claude.json")
    assert [e.label for e in config.entries] == ["time", "projects./home/me/app.mcpServers.git"]
    wrapped = plan_wrap(config, None, OPTIONS).text
    data = json.loads(wrapped)
    assert data["projects"]["/home/me/app"]["mcpServers"]["git"]["type"] == "stdio"
    assert data["projects"]["/home/me/app"]["mcpServers"]["git"]["command"] == "visor"
    assert data["numStartups"] == 12
    assert undo(wrapped, "/home/me/.claude.json") == text


def test_strict_json_files_refuse_comments_with_line_and_column() -> None:
    text = '{\n  "mcpServers": {\n    // a note\n    "a": {"command": "x"}\n  }\n}\n'
    with pytest.raises(ConfigError, match=r"^/h/.cursor/mcp.json:3:5: comment in a strict JSON file"):
        load_text(text, "/h/.cursor/mcp.json")
    trailing = '{"mcpServers": {"a": {"command": "x"},}}'
    with pytest.raises(ConfigError, match=r":1:38: trailing comma"):
        load_text(trailing, "/p/.mcp.json")


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ('{\n  "mcpServers": {\n    "a": {"command": "x" "args": []}\n  }\n}', "3:26", "expected ','"),
        ('{\n  "mcpServers": {\n    "a": {"command": "x"}\n  }\n', "5:1", "unexpected end of file"),
        ('{"mcpServers": {"a": 1, "a": 2}}', "1:25", "duplicate key 'a'"),
        ('{"mcpServers": {"a": {"command": "x\ny"}}}', "1:34", "unterminated string"),
        ('{"mcpServers": {}} extra', "1:20", "unexpected data after the end"),
        ("{'mcpServers': {}}", "1:2", "expected a string key in double quotes"),
    ],
)
def test_broken_json_names_line_and_column(text: str, where: str, what: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(text, "/p/.mcp.json")
    message = str(info.value)
    assert message.startswith(f"/p/.mcp.json:{where}: ")
    assert what in message


def test_top_level_must_be_an_object() -> None:
    with pytest.raises(ConfigError, match="top level is not a JSON object"):
        load_text("[1, 2]", "x.json")


def test_detect_indent() -> None:
    assert detect_indent(CLAUDE_DESKTOP) == "  "
    assert detect_indent(CURSOR) == "    "
    assert detect_indent(VSCODE) == "\t"
    assert detect_indent("{}") == "  "


def test_parser_spans_and_positions() -> None:
    doc = parse('{"a": [1, {"b": "c"}], "d": null}')
    a = doc.root.member("a")
    assert a is not None
    assert doc.text[a.value.start : a.value.end] == '[1, {"b": "c"}]'
    assert doc.root.value == {"a": [1, {"b": "c"}], "d": None}
    with pytest.raises(JsoncError) as info:
        parse('{\n  "a": tru\n}')
    assert (info.value.line, info.value.column) == (2, 8)


_names = st.text(
    st.characters(min_codepoint=32, max_codepoint=0x2FF, exclude_characters='"\\'), min_size=1, max_size=8
)
_args = st.lists(st.text(max_size=12), max_size=4)
_entry = st.fixed_dictionaries(
    {"command": st.text(min_size=1, max_size=10), "args": _args},
    optional={"env": st.dictionaries(_names, st.text(max_size=6), max_size=2), "cwd": st.text(max_size=8)},
)


@settings(max_examples=150, deadline=None)
@given(
    servers=st.dictionaries(_names, _entry, min_size=1, max_size=4),
    indent=st.sampled_from([None, 1, 2, 4, "\t"]),
    trailing=st.sampled_from(["", "\n", "\r\n"]),
)
def test_property_wrap_then_undo_is_identity(servers: dict, indent: object, trailing: str) -> None:
    text = json.dumps({"mcpServers": servers}, indent=indent, ensure_ascii=False) + trailing  # type: ignore[arg-type]
    wrapped = wrap(text)
    data = json.loads(wrapped)["mcpServers"]
    for name, entry in servers.items():
        assert data[name] == wrapped_value(entry, name, OPTIONS)
    assert undo(wrapped) == text


def test_a_marked_entry_whose_command_is_not_visor_is_reported_unprotected() -> None:
    # Someone edited the command but left the marker: init must not call it wrapped.
    from visor.install.configs import WrapOptions, load_text, plan_wrap

    text = (
        '{"mcpServers": {"mail": {"command": "npx", "args": ["mail-mcp"], '
        '"x-visor-upstream": {"command": "npx", "args": ["mail-mcp"]}}}}\n'
    )
    plan = plan_wrap(load_text(text, "c.json"), None, WrapOptions())
    ((_entry, note),) = plan.skipped
    assert "NOT PROTECTED" in note and not plan.changed
