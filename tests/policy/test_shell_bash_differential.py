"""Visor's shell reader against the real bash.

(a) whatever Visor reads as certain, `bash -n` accepts; (b) in a sandboxed bash
(empty PATH, `env -i`, builtins disabled so every command reaches
`command_not_found_handle`, which logs its argv), every command bash actually
executes is one Visor listed. A command Visor reads while bash runs something
it did not list is a false allow and fails the test.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from visor.policy.shell import Reading, read_command

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(
    BASH is None, reason="bash is not installed: the differential needs the real bash"
)


def _builtins() -> list[str]:
    out = subprocess.run(
        [BASH or "bash", "--norc", "--noprofile", "-c", "compgen -b"], capture_output=True, text=True
    )
    return [b for b in out.stdout.split() if b != "enable"]


def bash_accepts(cmd: str) -> bool:
    """`bash -n`: the command parses."""
    p = subprocess.run(
        [BASH or "bash", "--norc", "--noprofile", "-n", "-c", cmd], capture_output=True, timeout=10
    )
    return p.returncode == 0


def bash_runs(cmd: str, *, disable_builtins: bool = True) -> list[tuple[str, ...]]:
    """The argv of every command bash executes for ``cmd`` in the sandbox."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "empty").mkdir()
        (root / "cwd").mkdir()
        log = root / "log"
        log.write_bytes(b"")
        handler = (
            "command_not_found_handle() { enable printf; "
            f"printf '%s\\0' \"$#\" \"$@\" >> '{log}'; enable -n printf; }}"
        )
        prelude = handler + "\n"
        if disable_builtins:
            prelude += "enable -n " + " ".join(_BUILTINS) + "\n"
        else:
            prelude += "enable -n printf\n"
        subprocess.run(
            [
                "env",
                "-i",
                f"PATH={root / 'empty'}",
                f"HOME={root / 'cwd'}",
                BASH or "bash",
                "--norc",
                "--noprofile",
                "-c",
                prelude + cmd,
            ],
            cwd=root / "cwd",
            capture_output=True,
            timeout=20,
            stdin=subprocess.DEVNULL,
        )  # capture_output waits for background jobs too (they hold the pipes)
        fields = log.read_bytes().split(b"\0")[:-1]
    runs: list[tuple[str, ...]] = []
    i = 0
    while i < len(fields):
        k = int(fields[i])
        runs.append(tuple(f.decode("utf-8", "surrogateescape") for f in fields[i + 1 : i + 1 + k]))
        i += 1 + k
    return runs


_BUILTINS = _builtins() if BASH else []


def _matches(words: tuple[str, ...], literal: tuple[bool, ...], argv: tuple[str, ...]) -> bool:
    if not words or words[0] != argv[0]:
        return False
    for j in range(1, len(words)):
        if not literal[j]:
            return True  # from here the arguments are only known at run time
        if j >= len(argv) or argv[j] != words[j]:
            return False
    return len(argv) == len(words)


def uncovered(reading: Reading, runs: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """The commands bash ran that Visor did not list (as a multiset).

    A maximum bipartite matching, not a greedy one: the commands of a
    pipeline run concurrently, so their order in the trace varies, and a
    greedy pass could pair a run with the wrong command and report a miss."""
    pool = [c for c in reading.commands if c.words]
    owner: dict[int, int] = {}  # pool index -> run index

    def place(r: int, seen: set[int]) -> bool:
        for k, c in enumerate(pool):
            if k in seen or not _matches(c.words, c.literal, runs[r]):
                continue
            seen.add(k)
            if k not in owner or place(owner[k], seen):
                owner[k] = r
                return True
        return False

    return [argv for r, argv in enumerate(runs) if not place(r, set())]


def check(cmd: str) -> Reading:
    reading = read_command(cmd)
    if reading.certain:
        assert bash_accepts(cmd), f"Visor read {cmd!r} but bash -n rejects it"
        runs = bash_runs(cmd)
        assert not uncovered(reading, runs), (cmd, runs, reading.commands)
    return reading


CORPUS = [
    # the two known bypasses and their relatives
    "ls #'\ntouch X #'",
    'ls #"\ntouch X #"',
    "ls #`\ntouch X",
    "echo $(echo ')'; touch X)",
    'echo $(echo ")"; touch X)',
    "echo $(echo \\); touch X)",
    "echo $(echo # )\ntouch X\n)",
    "echo \"$(echo ')' ; touch X)\"",
    "ls a#b; touch X",
    "ls a #b; touch X",
    "ls;#x\ntouch X",
    "ls&#x\ntouch X",
    "(ls)#x\ntouch X",
    "ls $(echo a)#b",
    # ordinary commands
    "ls -la",
    "git status",
    "grep -rn foo src | head -20",
    "cat a.txt && echo done",
    "ls 'a b' \"c d\" e\\ f",
    "ls; touch X",
    "ls && touch X || rm Y",
    "ls | cat |& tee Z",
    "ls & touch X",
    "ls\ntouch X\n",
    "ls &&\n touch X",
    "ls |\n\n cat",
    "ls &&\n# comment\ntouch X",
    "(ls; touch X)",
    "( (ls) )",
    "{ ls; touch X; }",
    "{ ls\n}",
    "{ ls; } > out 2>&1",
    "(ls) > out",
    "echo `pwd`",
    'echo "`pwd`"',
    "echo $(ls $(pwd))",
    "ls <(cat a) >(tee b)",
    "cat < <(ls)",
    "echo a<(ls)",
    "X=1 ls",
    "X=$(id) ls",
    "X=1",
    "X=1 Y=2",
    "> out ls",
    "ls > out 2>&1",
    "ls &> out",
    "ls &>> out",
    "ls 2>/dev/null",
    'cat <<< "$(id) x"',
    "cat <<< 'a b'",
    'ls $HOME "$HOME" ${HOME} $1 $@ "$@"',
    "ls *.py ~/x {a,b}",
    "echo $'a\\'b'; touch X",
    "echo $'a' b",
    "'l's -la",
    "\\ls -la",
    '"ls" -la',
    "ls \\#x",
    "ls \\; touch X",
    "ls '\n' touch",
    'ls "a\nb"; touch X',
    "ls ')' '(' ; touch X",
    "ls $",
    "ls $ x",
    'ls "$"',
    'ls "a\\"b"; touch X',
    'ls "a\\b"',
    "ls a}b }",
    "echo $(\n ls\n)",
    "echo $( (ls) )",
    "echo $()",
    "ls ;",
    "ls &",
    "ls;ls;;",
    # unreadable ones (checked only when Visor reads them)
    "ls <<EOF\nx\nEOF",
    "ls \\\ntouch X",
    "$(echo ls)",
    "$x",
    "${x}",
    "l? -la",
    "{ls,-la}",
    "~/bin/x",
    "eval 'touch X'",
    "exec touch X",
    "source x",
    ". x",
    "bash -c 'touch X'",
    "sh -c 'touch X'",
    "env FOO=1 sh -c 'touch X'",
    "env -S 'sh -c x'",
    "echo $((1+2))",
    "echo ${x:-$(id)}",
    "if true; then ls; fi",
    "for i in a; do ls; done",
    "f() { ls; }; f",
    "! ls",
    "[[ -f x ]]",
    "((x=1))",
    "time ls",
    "echo 'unterminated",
    'echo "unterminated',
    "echo $(ls",
    "echo `ls",
    "ls )",
    "ls }",
    "; ls",
    "ls &&",
    "ls\rtouch X",
    "ls\x00touch",
    "ls\x1btouch",
    "a[$(id)]=1 ls",
    "let x=1",
    "read -r x",
    "printf -v 'a[$(touch X)]' 1",
    "{fd}>x ls",
    "ls 2<(ls)",
    "case x in x) ls;; esac",
    "echo `echo 'a`b'`",
    "echo `echo \\`ls\\``",
]


@pytest.mark.parametrize("cmd", CORPUS, ids=range(len(CORPUS)))
def test_corpus_against_bash(cmd: str) -> None:
    check(cmd)


def test_the_known_bypasses_are_seen() -> None:
    # bash runs `touch X` for both; Visor lists it
    for cmd in ("ls #'\ntouch X #'", "echo $(echo ')'; touch X)"):
        assert ("touch", "X") in bash_runs(cmd)
        assert any(c.words == ("touch", "X") for c in read_command(cmd).commands)


def test_the_harness_sees_what_bash_runs() -> None:
    # the oracle itself: a command Visor does not list would be caught
    runs = bash_runs("ls -la; (touch X) | cat $(id)")
    assert sorted(runs) == sorted([("ls", "-la"), ("touch", "X"), ("id",), ("cat",)])
    assert uncovered(read_command("ls -la"), runs)


@pytest.mark.parametrize("builtin", [*_BUILTINS, "enable"])
def test_builtins_that_run_code_from_arguments_are_refused(builtin: str) -> None:
    """Probe every bash builtin with arguments that hold `$(...)` in an array
    subscript (literal or via a variable): when bash runs the hidden command,
    Visor must have refused the command."""
    sub = "'a[$(touch P)]'"
    shapes = [
        f"B {sub}",
        f"B -v {sub} 1",
        f"B {sub}=1",
        f"B -i {sub}=1",
        f"B x {sub}",
        f"B {sub} -eq 1",
        f"B 1 -eq {sub}",
        "B y",
        "B 1 -eq y",
        "B -v y",
        "B y -eq 1",
        "B %d y",
        f"B -p {sub} 1",
        f"B -n {sub}",
        f"B -a {sub}",
        f"B {sub} <<< 1",
        "B -v y 1",
    ]
    for shape in shapes:
        cmd = f"y={sub}; " + shape.replace("B", builtin, 1)
        reading = read_command(cmd)
        if not reading.certain:
            continue
        runs = bash_runs(cmd + " </dev/null", disable_builtins=False)
        assert ("touch", "P") not in runs, f"{cmd!r} runs touch, yet Visor read it as certain"


# ------------------------------------------------------------ generated

_WORDS = st.sampled_from(["ls", "echo", "a", "-la", "x1", "touch", "cat", "X"])
_PIECES = st.sampled_from(
    [
        "ls",
        "touch",
        " ",
        " ",
        " ",
        "a",
        "X",
        ";",
        "&&",
        "||",
        "|",
        "&",
        "\n",
        "#",
        "'",
        '"',
        "\\",
        "$(",
        ")",
        "(",
        "{ ",
        " }",
        "`",
        "$x",
        "$",
        "<",
        ">",
        "2>&1",
        "<(",
        "*",
        "~",
        "=",
        "x=1 ",
        "#'",
        "')'",
        "|&",
        "<<<",
    ]
)


@st.composite
def _structured(draw: st.DrawFn, depth: int = 0) -> str:
    """Mostly well-formed commands: words, quotes, substitutions, lists, groups."""

    def word() -> str:
        w = draw(_WORDS)
        kind = draw(st.integers(0, 7))
        if kind == 1:
            return f"'{w} {draw(_WORDS)}'"
        if kind == 2:
            return f'"{w} $x"'
        if kind == 3 and depth < 2:
            return "$(" + draw(_structured(depth + 1)) + ")"
        if kind == 4:
            return w + "#" + draw(_WORDS)
        if kind == 5:
            return "\\" + w
        return w

    def simple() -> str:
        words = [draw(st.sampled_from(["ls", "touch", "cat", "echo"]))]
        words += [word() for _ in range(draw(st.integers(0, 3)))]
        if draw(st.booleans()):
            words.append("#" + draw(st.sampled_from(["c", "'", '"', ")", "`"])) + "\n")
        return " ".join(words)

    parts = [simple()]
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from([";", " && ", " || ", " | ", " & ", "\n"]))
        nxt = simple()
        if depth < 2 and draw(st.integers(0, 5)) == 0:
            nxt = "(" + draw(_structured(depth + 1)) + ")"
        if depth < 2 and draw(st.integers(0, 5)) == 0:
            nxt = "{ " + draw(_structured(depth + 1)) + "; }"
        parts.append(op + nxt)
    return "".join(parts)


@settings(max_examples=150, deadline=None, database=None)
@given(_structured())
def test_generated_commands_against_bash(cmd: str) -> None:
    check(cmd)


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(_PIECES, min_size=1, max_size=12).map("".join))
def test_generated_soup_against_bash(cmd: str) -> None:
    check(cmd)
