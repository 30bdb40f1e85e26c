"""visor.policy.shell: what it reads (and how) and what it refuses; the rules built on it."""

from __future__ import annotations

import pytest

from tests.policy.helpers import decide, policy_from, session_for
from visor.policy.shell import read_command


def words(cmd: str) -> list[tuple[str, ...]]:
    r = read_command(cmd)
    assert r.certain, (cmd, r.unreadable)
    return [c.words for c in r.commands]


READ = [
    ("ls -la", [("ls", "-la")]),
    ("git status", [("git", "status")]),
    ("grep -rn foo src | head -20", [("grep", "-rn", "foo", "src"), ("head", "-20")]),
    ("cat a.txt && echo done", [("cat", "a.txt"), ("echo", "done")]),
    ("ls 'a b' \"c d\" e\\ f", [("ls", "a b", "c d", "e f")]),
    # the two known bypasses
    ("ls #'\ntouch X #'", [("ls",), ("touch", "X")]),
    ("echo $(echo ')'; touch X)", [("echo", ")"), ("touch", "X"), ("echo", "$(echo ')'; touch X)")]),
    # variants: a comment starts only at the start of a word
    ("ls a#b; touch X", [("ls", "a#b"), ("touch", "X")]),
    ("ls;#x\ntouch X", [("ls",), ("touch", "X")]),
    ("(ls)#x\ntouch X", [("ls",), ("touch", "X")]),
    ("echo $(echo # )\ntouch X\n)", [("echo",), ("touch", "X"), ("echo", "$(echo # )\ntouch X\n)")]),
    ("ls \\#x; touch X", [("ls", "#x"), ("touch", "X")]),
    # lists, pipelines, groups, subshells, substitutions
    ("ls & touch X", [("ls",), ("touch", "X")]),
    ("ls |& cat", [("ls",), ("cat",)]),
    ("ls &&\n touch X", [("ls",), ("touch", "X")]),
    ("(ls; touch X)", [("ls",), ("touch", "X")]),
    ("{ ls; touch X; } > out", [("ls",), ("touch", "X")]),
    ("echo `pwd`", [("pwd",), ("echo", "`pwd`")]),
    ("ls <(cat a) >(tee b)", [("cat", "a"), ("tee", "b"), ("ls", "<(cat a)", ">(tee b)")]),
    ('cat <<< "$(id)"', [("id",), ("cat",)]),
    ("X=$(id) ls", [("id",), ("ls",)]),
    ("'l's -la", [("ls", "-la")]),
    ("ls $HOME *.py", [("ls", "$HOME", "*.py")]),
    ("", []),
]


@pytest.mark.parametrize(("cmd", "expected"), READ)
def test_reads_like_bash(cmd: str, expected: list[tuple[str, ...]]) -> None:
    assert words(cmd) == expected


REFUSED = [
    ("ls <<EOF\nx\nEOF", "here-document"),
    ("ls <<-EOF\nx\nEOF", "here-document"),
    ("ls \\\ntouch X", "line continuation"),
    ("$(echo ls)", "only known at run time"),
    ("$IFS", "only known at run time"),
    ("l${IFS}s", "only known at run time"),
    ("{ls,-la}", "only known at run time"),
    ("l? -la", "only known at run time"),
    ("eval 'touch X'", "runs code"),
    ("exec touch X", "runs code"),
    ("source x", "runs code"),
    (". x", "runs code"),
    ("let x=1", "runs code"),
    ("bash -c 'touch X'", "command string"),
    ("sh -c x", "command string"),
    ("zsh -c x", "command string"),
    ("dash -c x", "command string"),
    ("env FOO=1 sh -c x", "command string"),
    ("sudo bash -ec x", "command string"),
    ("bash <<< 'touch X'", "command string"),
    ("env -S 'sh x'", "env -S"),
    ("echo ${x:-$(id)}", "operator"),
    ("echo $((1+2))", "arithmetic"),
    ("((x=1))", "arithmetic"),
    ("if true; then ls; fi", "reserved word"),
    ("! ls", "reserved word"),
    ("time ls", "reserved word"),
    ("f() { ls; }", "function"),
    ("echo 'open", "unbalanced single quote"),
    ('echo "open', "unbalanced double quote"),
    ("echo $(ls", "unbalanced"),
    ("echo `ls", "unbalanced backtick"),
    ("echo `echo 'a`b'`", "unbalanced single quote"),
    ("echo `echo \\`ls\\``", "backslash"),
    ("ls )", "unbalanced"),
    ("; ls", "unexpected"),
    ("ls &&", "ends with an operator"),
    ("ls\rtouch X", "control character"),
    ("ls\x00", "control character"),
    ("a[$(id)]=1 ls", "subscript"),
    ("printf -v 'a[$(id)]' 1", "printf -v"),
    ("ls >#x", "without a target"),
]


@pytest.mark.parametrize(("cmd", "why"), REFUSED)
def test_refuses_what_it_cannot_read(cmd: str, why: str) -> None:
    r = read_command(cmd)
    assert not r.certain
    assert why in (r.unreadable or ""), r.unreadable


POLICY = policy_from(
    r"""
    servers:
      - name: sh
        allowed: true
        tools:
          - name: allowlisted
            allowed: true
            rules:
              - type: allow_command_pattern
                patterns: ["^ls( |$)"]
          - name: denylisted
            allowed: true
            rules:
              - type: deny_command_pattern
                patterns: ["rm\\s+-rf"]
    """
)
SESSION = session_for(POLICY, "sh")


@pytest.mark.parametrize("cmd", ["ls #'\ntouch X #'", "ls $(echo ')'; touch X)", "ls; touch X"])
def test_allow_list_denies_the_bypasses(cmd: str) -> None:
    d = decide(POLICY, SESSION, "allowlisted", command=cmd)
    assert (d.action, d.rule) == ("deny", "servers[sh].tools[allowlisted].allow_command_pattern")


def test_allow_list_denies_unreadable_with_reason() -> None:
    d = decide(POLICY, SESSION, "allowlisted", command="ls <<EOF\nx\nEOF")
    assert d.action == "deny"
    assert d.reason == "command cannot be read with certainty: here-document"


@pytest.mark.parametrize("cmd", ["ls -la", "'l's -la", "ls 'a b'", "ls | ls"])
def test_allow_list_admits_plain_commands(cmd: str) -> None:
    assert decide(POLICY, SESSION, "allowlisted", command=cmd).action == "allow"


def test_allow_list_checks_the_name_not_a_quoted_whole() -> None:
    # "ls -la" quoted is one word: a command named `ls -la`, not ls
    assert decide(POLICY, SESSION, "allowlisted", command='"ls -la"').action == "deny"


def test_deny_list_asks_for_unreadable_and_still_denies() -> None:
    d = decide(POLICY, SESSION, "denylisted", command="eval 'touch X'")
    assert (d.action, d.rule) == ("ask", "servers[sh].tools[denylisted].deny_command_pattern")
    assert d.reason.startswith("command cannot be read with certainty:")
    # a deny still wins over the ask
    assert decide(POLICY, SESSION, "denylisted", command="eval 'rm -rf /'").action == "deny"
    assert decide(POLICY, SESSION, "denylisted", command="ls -la").action == "allow"
