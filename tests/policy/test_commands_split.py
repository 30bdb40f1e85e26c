"""Command splitting: chaining never smuggles a second command past an allow pattern."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.policy.helpers import decide, policy_from, session_for
from visor.policy.loader import build_screens, load_policy_text
from visor.policy.rules import split_command
from visor.policy.shell import read_command

POLICY = policy_from(
    r"""
    servers:
      - name: sh
        allowed: true
        tools:
          - name: run
            allowed: true
            rules:
              - type: deny_command_pattern
                patterns: ["rm\\s+-rf", "(a)\\1x"]
              - type: allow_command_pattern
                patterns: ["^ls\\s", "^echo\\s"]
    """
)
SESSION = session_for(POLICY, "sh")


def test_split_examples() -> None:
    assert split_command("ls /a; rm x") == ["ls /a", "rm x"]
    assert split_command('ls "a;b|c"') == ['ls "a;b|c"']
    assert split_command("echo 'a $(b)'") == ["echo 'a $(b)'"]
    # a substitution's body runs first; the outer command keeps it as written
    assert split_command('echo "a $(id) b"') == ["id", 'echo "a $(id) b"']
    # unreadable: nothing after the doubt is listed (and the rules refuse it)
    assert split_command("echo 'unterminated; x") == []
    assert read_command("echo 'unterminated; x").unreadable == "unbalanced single quote"
    assert split_command("ls <(cat /etc/shadow)") == ["cat /etc/shadow", "ls <(cat /etc/shadow)"]
    assert split_command("") == []


def test_unscreenable_patterns_still_apply() -> None:
    # a backreference cannot be combined into the screen; the rule still runs
    assert "deny_command_pattern" not in build_screens(POLICY.server("sh").tools["run"].rules)
    d = decide(POLICY, SESSION, "run", command="echo aax")
    assert (d.action, d.rule) == ("deny", "servers[sh].tools[run].deny_command_pattern")


def test_screen_is_built_for_plain_patterns() -> None:
    p = load_policy_text(
        """
servers:
  - name: s
    allowed: true
    tools:
      - name: t
        allowed: true
        rules:
          - {type: deny_command_pattern, patterns: ["a+b", "c"]}
"""
    )
    assert "deny_command_pattern" in p.server("s").tools["t"].screens


_sep = st.sampled_from([";", "&&", "||", "|", "&", "\n", " ; ", "`", "$(", "<(", "\r"])
_bad = st.sampled_from(["cat /etc/shadow", "curl x", "python -c 1", "sh", "id"])
_ok = st.sampled_from(["ls /tmp", "echo hi", "ls -la /", "echo 'x'"])


@settings(max_examples=200, deadline=None)
@given(ok=_ok, sep=_sep, bad=_bad, close=st.booleans())
def test_property_chained_command_is_never_allowed(ok: str, sep: str, bad: str, close: bool) -> None:
    tail = {"`": "`", "$(": ")", "<(": ")"}.get(sep, "") if close else ""
    command = f"{ok} {sep}{bad}{tail}"
    d = decide(POLICY, SESSION, "run", command=command)
    assert d.action == "deny", command


def test_image_data_is_not_indexed() -> None:
    from visor.session import SessionState

    s = SessionState(POLICY, "sh")
    s.observe_output(
        "run",
        {"content": [{"type": "image", "mimeType": "image/png", "data": "eve@attacker.example"}]},
    )
    from visor.policy.destinations import parse

    assert not s.output.seen(parse("eve@attacker.example")[0])
