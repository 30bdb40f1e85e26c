"""The policy keys for redaction and gating beyond tools/call: strict loading and pure decisions."""

from __future__ import annotations

import pytest

from visor import redact
from visor.policy.loader import PolicyError, load_policy_text
from visor.policy.requests import prompt_decision, resource_decision, server_request_decision

BASE = """\
version: "1.0"
servers:
  - name: s
    allowed: true
"""


def _load(extra_server: str = "", top: str = "") -> object:
    return load_policy_text(BASE + extra_server + top, "p.yaml")


def test_new_server_keys_load() -> None:
    p = _load(
        "    hide_denied_tools: true\n"
        "    server_requests: {sampling: deny, elicitation: allow}\n"
        "    resources: {allow: ['memo://**', 'file:///srv/**'], deny: ['memo://private/**']}\n"
        "    prompts: {deny: ['admin-*']}\n"
    )
    s = p.server_index["s"]  # type: ignore[attr-defined]
    assert s.hide_denied_tools and s.server_requests == {"sampling": "deny", "elicitation": "allow"}
    assert resource_decision(p, "s", "memo://notes/a") is None  # type: ignore[arg-type]
    assert resource_decision(p, "s", "memo://private/a").rule == "servers[s].resources.deny"  # type: ignore[arg-type,union-attr]
    assert resource_decision(p, "s", "https://x").rule == "servers[s].resources.allow"  # type: ignore[arg-type,union-attr]
    assert resource_decision(p, "s", "file:///srv/app/x.txt") is None  # type: ignore[arg-type]
    assert resource_decision(p, "s", "file:///srv/app/.env").rule == "resource.sensitive"  # type: ignore[arg-type,union-attr]
    assert prompt_decision(p, "s", "admin-reset").rule == "servers[s].prompts.deny"  # type: ignore[arg-type,union-attr]
    assert prompt_decision(p, "s", "review") is None  # type: ignore[arg-type]
    assert server_request_decision(p, "s", "sampling/createMessage") is not None  # type: ignore[arg-type]
    assert server_request_decision(p, "s", "elicitation/create") is None  # type: ignore[arg-type]


def test_defaults_without_sections() -> None:
    p = _load()
    assert resource_decision(p, "s", "file:///home/me/.ssh/id_ed25519") is not None  # type: ignore[arg-type]
    assert resource_decision(p, "s", "file:///home/me/notes.txt") is None  # type: ignore[arg-type]
    # Unknown server under default deny: nothing of it is read.
    assert resource_decision(p, "other", "memo://x").rule == "registration.unknown_server"  # type: ignore[arg-type,union-attr]
    assert prompt_decision(p, "s", "anything") is None  # type: ignore[arg-type]
    assert server_request_decision(p, "s", "sampling/createMessage") is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ("    hide_denied_tools: yes please\n", 5, "servers[0].hide_denied_tools"),
        ("    server_requests: {sampling: maybe}\n", 5, "servers[0].server_requests.sampling"),
        ("    server_requests: {roots: deny}\n", 5, "servers[0].server_requests.roots"),
        ("    resources: {allow: 'memo://*'}\n", 5, "servers[0].resources.allow"),
        ("    resources: {block: []}\n", 5, "servers[0].resources.block"),
        ("    prompts: [a]\n", 5, "servers[0].prompts"),
    ],
)
def test_bad_server_keys_name_file_line_and_key(text: str, line: int, key: str) -> None:
    with pytest.raises(PolicyError) as e:
        _load(text)
    assert (e.value.source, e.value.line, e.value.key) == ("p.yaml", line, key)


def test_redaction_builtin_disable_and_names() -> None:
    p = _load(top="redaction:\n  disable: [jwt]\n  patterns:\n    - {regex: 'TOK-[0-9]+'}\n")
    red = p.redaction  # type: ignore[attr-defined]
    assert red.patterns[0].name == "policy-1" and red.disable == ("jwt",)
    names = [x.name for x in red.engine.arguments.patterns]
    assert "jwt" not in names and "github_token" in names and names[-1] == "policy-1"
    off = _load(top="redaction:\n  builtin: false\n  output_redaction: false\n")
    assert off.redaction.engine.arguments.empty and off.redaction.engine.outputs.empty  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("top", "line", "key", "words"),
    [
        ("redaction:\n  disable: [nope]\n", 6, "redaction.disable[0]", "no built-in pattern"),
        (
            "redaction:\n  output_patterns:\n    - {name: jwt, regex: x}\n",
            7,
            "redaction.output_patterns[0].name",
            "built-in",
        ),
        (
            "redaction:\n  patterns:\n    - {name: a, regex: x}\n    - {name: a, regex: y}\n",
            8,
            "redaction.patterns[1].name",
            "duplicate",
        ),
        ("redaction:\n  builtin: 1\n", 6, "redaction.builtin", "true or false"),
    ],
)
def test_redaction_errors(top: str, line: int, key: str, words: str) -> None:
    with pytest.raises(PolicyError) as e:
        _load(top=top)
    assert (e.value.line, e.value.key) == (line, key) and words in e.value.message


def test_a_builtin_may_be_replaced_when_disabled() -> None:
    p = _load(top="redaction:\n  disable: [jwt]\n  patterns:\n    - {name: jwt, regex: 'eyJ[a-z]+'}\n")
    assert p.redaction.patterns[0].name == "jwt"  # type: ignore[attr-defined]


def test_unchanged_values_are_the_same_objects() -> None:
    args = {"a": ["x", {"b": "y"}], "n": 1}
    new, findings = redact.redact_arguments(redact.DEFAULT_REDACTOR.arguments, args)
    assert new is args and findings == []


def test_truncate_utf8_never_splits() -> None:
    for text in ("€😀a" * 50, "é" * 7, "x"):
        for limit in range(0, 40):
            cut = redact.truncate_utf8(text, limit)
            assert len(cut.encode()) <= limit and text.startswith(cut)
            assert len(cut.encode()) > limit - 4 or cut == text
