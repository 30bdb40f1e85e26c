"""Loading is strict and fails closed; every error names file, line and key."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from visor.policy.loader import PolicyError, load_default_policy, load_policy, load_policy_text

DATA = Path(__file__).parent / "data"
POLICIES = Path(__file__).parents[2] / "policies"

HEAD = 'version: "1.0"\ndefault_action: deny\n'


def _err(body: str) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        load_policy_text(HEAD + textwrap.dedent(body), "p.yaml")
    return info.value


TOOL = """\
servers:
  - name: s
    allowed: true
    tools:
      - name: t
        allowed: true
"""

# (policy body after the two head lines, expected line, expected key, expected message part)
ERRORS = [
    ("bogus: 1\n", 3, "bogus", "unknown key"),
    (TOOL + '        max_calls: "2"\n', 9, "servers[0].tools[0].max_calls", "expected an integer"),
    (
        TOOL + '        exfiltrating: "false"\n',
        9,
        "servers[0].tools[0].exfiltrating",
        "expected true or false",
    ),
    (TOOL + "        max_calls: -1\n", 9, "servers[0].tools[0].max_calls", "must be >= 0"),
    (
        "servers:\n  - name: s\n    allowed: true\n    tools:\n      - name: t\n",
        7,
        "servers[0].tools[0].allowed",
        "missing required key",
    ),
    ("servers:\n  - name: s\n    tools: []\n", 4, "servers[0].allowed", "missing required key"),
    (
        TOOL + "        rules:\n          - type: deny_everything\n",
        10,
        "servers[0].tools[0].rules[0].type",
        "unknown rule type",
    ),
    (
        TOOL + '        rules:\n          - type: deny_command_pattern\n            patterns: ["([a-z"]\n',
        11,
        "rules[0].patterns[0]",
        "does not compile",
    ),
    (
        TOOL + "        rules:\n          - type: deny_path\n            domains: [x.com]\n",
        11,
        "rules[0].domains",
        "unknown key",
    ),
    (TOOL + "        rules:\n          - type: deny_path\n", 10, "rules[0].patterns", "missing required key"),
    (
        TOOL + '        allowed_path_prefixes: ["relative/dir"]\n',
        9,
        "allowed_path_prefixes[0]",
        "must be absolute",
    ),
    (TOOL + '        arg_patterns: {name: "("}\n', 9, "arg_patterns.name", "does not compile"),
    (TOOL + "        max_calls: 1\n        max_calls: 2\n", 10, "max_calls", "duplicate key"),
    (
        TOOL + "        rules:\n          - type: max_file_size\n            bytes: -5\n",
        11,
        "rules[0].bytes",
        "must be >= 1",
    ),
    ("settings:\n  chain_window_size: -3\n", 4, "settings.chain_window_size", "must be >= 0"),
    ("settings:\n  session_max_tools: 5.5\n", 4, "settings.session_max_tools", "expected an integer"),
    (
        "tool_chains:\n  - name: c\n    sources: [{tool_pattern: a}]\n    sinks: [{tool_pattern: b}]\n",
        4,
        "tool_chains[0].action",
        "missing required key",
    ),
    (
        'tool_chains:\n  - name: c\n    sources: [{tool_pattern: "("}]\n    sinks: [{tool_pattern: b}]\n    action: deny\n',
        5,
        "tool_pattern",
        "does not compile",
    ),
    (
        "taints:\n  - name: t\n    source_tools: [a]\negress_controls:\n  - name: e\n    when_tainted: t\n    sink_tools: [b]\n",
        7,
        "egress_controls[0].action",
        "missing required key",
    ),
    (
        "egress_controls:\n  - name: e\n    when_tainted: nothing\n    sink_tools: [b]\n    action: deny\n",
        5,
        "when_tainted",
        "no taint named",
    ),
    (
        "time_restrictions:\n  - name: tr\n    tools: [x]\n    denied_days: [sunday]\n",
        4,
        "time_restrictions[0].outside_action",
        "missing required key",
    ),
    (
        "time_restrictions:\n  - name: tr\n    denied_days: [someday]\n    outside_action: deny\n",
        5,
        "denied_days[0]",
        "unknown day",
    ),
    (
        'time_restrictions:\n  - name: tr\n    allowed_hours: [{start: "25:00", end: "10:00"}]\n    outside_action: deny\n',
        5,
        "start",
        "HH:MM",
    ),
    (
        'time_restrictions:\n  - name: tr\n    allowed_hours: [{start: "09:00", end: "10:00", timezone: Mars/Base}]\n    outside_action: deny\n',
        5,
        "timezone",
        "unknown time zone",
    ),
    (
        'redaction:\n  patterns:\n    - regex: "[unclosed"\n',
        5,
        "redaction.patterns[0].regex",
        "does not compile",
    ),
    ("default_action: maybe\n", 3, "default_action", "duplicate key"),
    ('servers:\n  - name: s\n    allowed: "yes"\n', 5, "servers[0].allowed", "expected true or false"),
    (
        "servers:\n  - {name: s, allowed: true}\n  - {name: s, allowed: true}\n",
        5,
        "servers[1].name",
        "duplicate server",
    ),
    (TOOL + "      - name: t\n        allowed: false\n", 9, "servers[0].tools[1].name", "duplicate tool"),
    ("settings:\n  packs: [nonexistent]\n", 4, "settings.packs[0]", "unknown pack"),
]


@pytest.mark.parametrize(("body", "line", "key", "message"), ERRORS)
def test_loader_errors_name_file_line_and_key(body: str, line: int, key: str, message: str) -> None:
    e = _err(body)
    text = str(e)
    assert text.startswith(f"p.yaml:{line}: "), text
    assert key in text, text
    assert message in text, text


def test_invalid_yaml_names_the_line() -> None:
    e = _err("servers: [\n")
    assert str(e).startswith("p.yaml:")
    assert "invalid YAML" in str(e)


def test_wrong_positions_are_refused_naming_the_key() -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(DATA / "wrong-positions.yaml")
    text = str(info.value)
    assert "wrong-positions.yaml:12: servers[1].rules: unknown key 'rules' at server level" in text
    assert "tools:" in text


def test_mcp_visor_style_policy_loads_with_its_meaning() -> None:
    p = load_policy(DATA / "visor-style-basic.yaml")
    assert p.default_action == "deny"
    s = p.settings
    assert (s.session_max_calls, s.session_timeout_seconds, s.approval_timeout_seconds) == (40, 7200, 30)
    assert s.chain_window_size == 4 and s.log_level == "debug"
    files = p.server_index["files"]
    assert files.transport == "stdio" and files.allowed
    read = files.tools["file_read"]
    assert [r.type for r in read.rules] == ["deny_path", "allow_path"]
    assert files.tools["file_delete"].allowed is False
    assert p.tool_chains[0].within_calls == 2 and p.tool_chains[1].within_calls is None
    assert p.tool_chains[1].action == "ask"  # require_approval
    assert p.egress_controls[0].when_tainted == "touched_payroll"
    assert p.time_restrictions[0].outside_action == "ask"
    assert p.time_restrictions[1].denied_days == frozenset({7})
    assert p.redaction.output_redaction
    assert p.redaction.patterns[0].regex.pattern == "TOK-[A-Z0-9]{16}"
    assert p.redaction.output_patterns[0].name == "bearer"
    assert len(p.sha256) == 64 and p.source.endswith("visor-style-basic.yaml")


def test_sha256_is_of_the_source_bytes(tmp_path: Path) -> None:
    import hashlib

    f = tmp_path / "p.yaml"
    f.write_bytes(b'version: "1.0"\nservers: []\n')
    assert load_policy(f).sha256 == hashlib.sha256(f.read_bytes()).hexdigest()


def test_missing_file_and_bad_utf8(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"version: \xff\n")
    with pytest.raises(PolicyError, match="UTF-8"):
        load_policy(bad)


def test_empty_policy_is_an_error() -> None:
    with pytest.raises(PolicyError, match="empty"):
        load_policy_text("", "e.yaml")


def test_default_policy_is_embedded_and_symlinked() -> None:
    p = load_default_policy()
    assert "*" in p.server_index and "*" in p.server_index["*"].tools
    link = POLICIES / "default.yaml"
    assert link.is_symlink()
    assert os.readlink(link) == "../visor/policy/default.yaml"
    assert load_policy(link).sha256 == p.sha256


@pytest.mark.parametrize("name", sorted(p.name for p in POLICIES.glob("*.yaml")))
def test_shipped_policies_load(name: str) -> None:
    load_policy(POLICIES / name)


# mcp-visor's own example policies, copied with their license (data/mcp-visor/SOURCE.md).
REFERENCE = DATA / "mcp-visor"


def test_mcp_visor_reference_policies_load() -> None:
    files = sorted(REFERENCE.glob("*.yaml"))
    assert len(files) == 13  # 12 example policies and the README's wrong-positions example
    assert (REFERENCE / "LICENSE-mcp-visor").is_file()
    for f in files:
        if f.name == "readme-example-wrong-positions.yaml":
            with pytest.raises(PolicyError, match=r"servers\[1\]\.risk: unknown key 'risk' at server level"):
                load_policy(f)
        else:
            load_policy(f)
