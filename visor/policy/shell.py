"""Read a shell command string into the simple commands bash would run.

This is a deliberately small, strict reader for a safe subset of the bash
language, not a general parser. Inside the subset it follows bash's own token
rules (quotes, backslashes, comments that start only at the start of a word,
``$(...)``, backticks, ``<(...)``/``>(...)``, ``( )`` subshells, ``{ }``
groups, ``; & && || | |&`` and newlines). Everything outside the subset, and
everything whose meaning depends on run-time values in a place where that
could change which command runs, is reported as unreadable with a reason, never
guessed: a policy then denies (or asks) instead of allowing.

Why not a grammar library: tree-sitter-bash is error tolerant (it builds a tree
for text bash rejects) and bashlex is a partial port of an old bash parser;
neither can be shown to agree with bash on the odd inputs an attacker chooses.
A small reader whose every accepted construct is cross-checked against the
real bash (tests/policy/test_shell_bash_differential.py) can.

Pure: no I/O, no globals mutated; results are memoised by the caller.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["Reading", "SimpleCommand", "read_command"]


@dataclass(frozen=True, slots=True)
class SimpleCommand:
    """One simple command bash would run.

    ``text`` is the source as written (quotes kept, substitutions kept as
    written); ``words`` are the command name and arguments with quoting
    removed. ``literal[i]`` is False when ``words[i]`` still holds an
    expansion (``$x``, a glob, a substitution) whose value is only known at run
    time; the command name is always literal, or the command is unreadable.
    ``assignments`` are the ``NAME=value`` words before the name; a command
    with no name (only assignments or redirections) runs nothing.
    """

    text: str
    words: tuple[str, ...]
    literal: tuple[bool, ...]
    assignments: tuple[str, ...] = ()
    unquoted: str = ""  # the tokens with quoting removed where that is unambiguous

    @property
    def name(self) -> str | None:
        return self.words[0] if self.words else None


@dataclass(frozen=True, slots=True)
class Reading:
    """The simple commands of a command string, in the order bash starts them
    (a substitution before the command that uses it), or why it is unreadable."""

    commands: tuple[SimpleCommand, ...]
    unreadable: str | None = None
    # the files redirections open (`> out.txt`, `< ~/.ssh/id_rsa`), quoting removed
    targets: tuple[str, ...] = ()
    # those of them opened for writing (`>`, `>>`, `>|`, `&>`, `&>>`, `<>`, `>& FILE`)
    writes: tuple[str, ...] = ()
    # the first argument whose value bash makes only when it runs (`$x`, `$(...)`, backticks,
    # `{a,b}`): read with certainty, but no deny pattern can see what it becomes (`rm -rf $9/`
    # runs `rm -rf /`). Globs and `~` are not counted (docs/limits.md).
    runtime: str | None = None

    @property
    def certain(self) -> bool:
        return self.unreadable is None


class _Unreadable(Exception):
    """Raised inside the reader only; read_command turns it into a Reading."""


# Characters that end a word (bash's metacharacters) and the blanks between words.
_META = frozenset(" \t\n;&|()<>")
_BLANK = " \t"
# Anything below space other than tab and newline, DEL, and NUL: bash may read
# these differently from us (\r is a word character to bash, a line break to
# many tools), so they are refused outright.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")
_SUBSCRIPT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\[")
_BRACE_PARAM = re.compile(r"\$\{(?:[A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!-])\}")
_SPECIAL_PARAM = frozenset("@*#?$!-0123456789")
_FD_VAR = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")
# A token whose quote-removed value can stand in the unquoted form as is.
_BARE = re.compile(r"[^\s'\"\\;&|<>()`$]*")

# Reserved words we do not read (loops, conditionals, functions, `!`, `time`,
# `[[`): refusing them costs a false deny at worst.
_RESERVED = frozenset(
    [
        "if",
        "then",
        "else",
        "elif",
        "fi",
        "case",
        "esac",
        "for",
        "select",
        "while",
        "until",
        "do",
        "done",
        "function",
        "in",
        "time",
        "coproc",
        "!",
        "[[",
        "]]",
        "{",
        "}",
    ]
)
# Builtins that run code from their arguments, change what a later command
# name means, or evaluate array subscripts (which run `$(...)` inside them:
# found by probing every bash builtin, see the differential test).
_CODE_BUILTINS = frozenset(
    [
        "eval",
        "exec",
        "source",
        ".",
        "trap",
        "command",
        "builtin",
        "enable",
        "alias",
        "unalias",
        "hash",
        "shopt",
        "let",
        "declare",
        "typeset",
        "local",
        "read",
        "readarray",
        "mapfile",
        "fc",
        "bind",
        "complete",
        "compgen",
        "compopt",
    ]
)
# Shells whose `-c` string (or here-string) would be more shell we have not read.
_SHELLS = frozenset(
    [
        "sh",
        "bash",
        "zsh",
        "dash",
        "ksh",
        "mksh",
        "ash",
        "rbash",
        "busybox",
        "fish",
        "csh",
        "tcsh",
        "pwsh",
        "yash",
        "posh",
    ]
)
_SHELL_C = re.compile(r"-[A-Za-z]*c")


# Redirections that open their target for writing (`>&` only with a file, not a descriptor).
_WRITING = frozenset({">", ">>", ">|", "&>", "&>>", "<>", ">&"})


class _Reader:
    __slots__ = ("_why", "out", "runtime", "s", "targets", "writes")

    def __init__(self, s: str) -> None:
        self.s = s
        self.out: list[SimpleCommand] = []
        self.targets: list[str] = []
        self.writes: list[str] = []
        self.runtime: str | None = None  # Reading.runtime
        self._why: str | None = None  # the run-time expansion in the word being read, if any

    # ------------------------------------------------------------ lists

    def list_(self, i: int, closer: str | None, kind: str) -> int:
        """Read a command list from ``i`` up to ``closer`` (``)`` or ``}``) or the
        end; return the index after the closer. ``kind`` is top, subst,
        subshell or group (a subshell or group may not be empty)."""
        s, n = self.s, len(self.s)
        state = "start"  # start | cmd (after a command) | sep (after ; & newline) | op (after && || |)
        while True:
            while i < n and s[i] in _BLANK:
                i += 1
            if i >= n:
                if closer is not None:
                    raise _Unreadable(f"unbalanced {'`(`' if closer == ')' else '`{`'}")
                if state == "op":
                    raise _Unreadable("command ends with an operator")
                return i
            c = s[i]
            if c == "#":
                # here `#` is at the start of a word: a comment up to the newline
                j = s.find("\n", i)
                i = n if j == -1 else j
                continue
            if c == "\n":
                if state == "cmd":
                    state = "sep"
                i += 1
                continue
            if closer == ")" and c == ")":
                if state == "op":
                    raise _Unreadable("`)` after an operator")
                if state == "start" and kind == "subshell":
                    raise _Unreadable("empty subshell")
                return i + 1
            if closer == "}" and c == "}" and state in ("sep", "start") and (i + 1 >= n or s[i + 1] in _META):
                if state == "start":
                    raise _Unreadable("empty group")
                return i + 1
            if c in ";&|" and not s.startswith("&>", i):
                op = self._operator(i)
                if state != "cmd":
                    raise _Unreadable(f"unexpected {op!r}")
                if op in (";;", ";&", ";;&"):
                    raise _Unreadable(f"{op!r} outside case")
                state = "sep" if op in (";", "&") else "op"
                i += len(op)
                continue
            if c == ")":
                raise _Unreadable("unbalanced `)`")
            if state == "cmd":
                raise _Unreadable(f"unexpected {c!r} after a command")
            i = self.command(i, closer)
            state = "cmd"

    def _operator(self, i: int) -> str:
        for op in (";;&", ";;", ";&", "&&", "||", "|&", ";", "&", "|"):
            if self.s.startswith(op, i):
                return op
        raise AssertionError("not an operator")  # pragma: no cover - callers check the first character

    # ------------------------------------------------------------ commands

    def command(self, i: int, closer: str | None) -> int:
        s, n = self.s, len(self.s)
        if s.startswith("((", i):
            raise _Unreadable("arithmetic command `((`")
        if s[i] == "(":
            i = self.list_(i + 1, ")", "subshell")
            return self._trailing_redirections(i)
        if s[i] == "{" and (i + 1 >= n or s[i + 1] in _META):
            i = self.list_(i + 1, "}", "group")
            return self._trailing_redirections(i)
        if s[i] == "}":
            raise _Unreadable("`}` without a group")
        return self.simple(i)

    def _trailing_redirections(self, i: int) -> int:
        """After `( )` or `{ }` only redirections may follow before an operator."""
        s, n = self.s, len(self.s)
        while True:
            while i < n and s[i] in _BLANK:
                i += 1
            if i >= n or s[i] in "\n;|)#" or (s[i] == "&" and not s.startswith("&>", i)):
                return i
            if s[i] == "}" and (i + 1 >= n or s[i + 1] in _META):
                return i
            r = self._redirection(i)
            if r is None:
                raise _Unreadable("a word after `)` or `}`")
            i, _tokens = r

    def simple(self, i: int) -> int:
        s, n = self.s, len(self.s)
        start = i
        end = i
        assignments: list[str] = []
        words: list[str] = []
        literal: list[bool] = []
        tokens: list[str] = []  # for the unquoted form
        here_string = False
        while True:
            while i < n and s[i] in _BLANK:
                i += 1
            if i >= n or s[i] in "\n;|)#" or (s[i] == "&" and not s.startswith("&>", i)):
                break
            if s[i] == "(":
                raise _Unreadable("`(` inside a command (function definition or array)")
            r = self._redirection(i)
            if r is not None:
                i, toks = r
                here_string |= "<<<" in toks[0]
                tokens.extend(toks)
                end = i
                continue
            self._why = None
            j, value, lit = self.word(i)
            raw = s[i:j]
            if _FD_VAR.fullmatch(raw) and j < n and s[j] in "<>":
                raise _Unreadable("`{var}` redirection")
            if not words and _SUBSCRIPT.match(raw):
                raise _Unreadable("array subscript in an assignment")
            if not words and _ASSIGN.match(raw):
                assignments.append(raw)
            else:
                if words and self._why is not None and self.runtime is None:
                    self.runtime = f"{self._why} in the argument {raw[:60]!r}"
                words.append(value)
                literal.append(lit)
            tokens.append(value if _BARE.fullmatch(value) else raw)
            i = end = j
        if words:
            _check_name(words, literal, here_string)
        if end > start:
            self.out.append(
                SimpleCommand(
                    text=s[start:end].strip(),
                    words=tuple(words),
                    literal=tuple(literal),
                    assignments=tuple(assignments),
                    unquoted=" ".join(tokens),
                )
            )
        return i

    def _redirection(self, i: int) -> tuple[int, list[str]] | None:
        """A redirection at ``i``: (index after its target, tokens), or None."""
        s, n = self.s, len(self.s)
        j = i
        while j < n and s[j].isdigit():
            j += 1
        if j >= n or s[j] not in "<>&":
            return None
        if s[j] == "&" and not s.startswith("&>", j):
            return None
        if j > i and s[j] == "&":
            return None  # `2&>x` is the word 2, then `&>`: not a redirection of ours
        if s[j] in "<>" and s.startswith("(", j + 1):
            if j > i:
                raise _Unreadable("digits before a process substitution")
            return None  # process substitution: a word
        for op in ("&>>", "&>", "<<<", "<<-", "<<", "<>", "<&", ">>", ">|", ">&", "<", ">"):
            if s.startswith(op, j):
                break
        if op in ("<<", "<<-"):
            raise _Unreadable("here-document")
        k = j + len(op)
        while k < n and s[k] in _BLANK:
            k += 1
        if k >= n or (s[k] in _META and not (s[k] in "<>" and s.startswith("(", k + 1))) or s[k] == "#":
            raise _Unreadable(f"redirection {op!r} without a target")
        e, value, _lit = self.word(k)
        raw = s[k:e]
        if raw.isdigit() and e < n and s[e] in "<>":
            # bash lexes digits right before < or > as that redirection's fd
            # number (`<2>&1` is `<` then `2>&1`), so this one has no target
            raise _Unreadable(f"redirection {op!r} without a target")
        if op != "<<<" and not (op in ("<&", ">&") and (value.isdigit() or value == "-")):
            self.targets.append(value)  # a file it opens (`>&1` duplicates a descriptor)
            if op in _WRITING:
                self.writes.append(value)
        return e, [s[i:k].strip(), value if _BARE.fullmatch(value) else raw]

    # ------------------------------------------------------------ words

    def word(self, i: int) -> tuple[int, str, bool]:
        """One word from ``i``: (end, value with quoting removed, literal)."""
        s, n = self.s, len(self.s)
        out: list[str] = []
        lit = True
        start = i
        braces, listed = 0, False  # unquoted `{` open, and a `,` or `..` seen inside one
        while i < n:
            c = s[i]
            if c in "<>" and s.startswith("(", i + 1):
                i = self.list_(i + 2, ")", "subst")
                lit = False  # the value is a /dev/fd path known only at run time
                continue
            if c in _META:
                break
            if c == "'":
                j = s.find("'", i + 1)
                if j == -1:
                    raise _Unreadable("unbalanced single quote")
                out.append(s[i + 1 : j])
                i = j + 1
            elif c == '"':
                i, v, ok = self._double(i + 1)
                out.append(v)
                lit &= ok
            elif c == "\\":
                if i + 1 >= n:
                    raise _Unreadable("backslash at the end")
                if s[i + 1] == "\n":
                    raise _Unreadable("line continuation (backslash-newline)")
                out.append(s[i + 1])
                i += 2
            elif c == "$":
                i, v, ok = self._dollar(i, False)
                out.append(v)
                lit &= ok
            elif c == "`":
                i = self._backtick(i, False)
                lit = False
                self._why = self._why or "command substitution"
            else:
                if c in "*?[{~":
                    lit = False  # glob, brace or tilde expansion: the value is not the text
                if c == "{":
                    braces += 1
                elif c == "}" and braces:
                    braces -= 1
                    if listed:
                        self._why = self._why or "brace expansion"
                elif braces and (c == "," or s.startswith("..", i)):
                    listed = True  # `{a,b}` or `{1..3}`: bash makes several words of it
                out.append(c)
                i += 1
        if i == start:
            raise _Unreadable(f"unexpected {s[i]!r}" if i < n else "missing word")
        value = "".join(out)
        return i, (value if lit else s[start:i]), lit

    def _double(self, i: int) -> tuple[int, str, bool]:
        """Inside double quotes from ``i``: (index after the closing quote, value, literal)."""
        s, n = self.s, len(self.s)
        out: list[str] = []
        lit = True
        while i < n:
            c = s[i]
            if c == '"':
                return i + 1, "".join(out), lit
            if c == "\\":
                if i + 1 >= n:
                    break
                nx = s[i + 1]
                if nx == "\n":
                    raise _Unreadable("line continuation (backslash-newline)")
                if nx in '$`"\\':
                    out.append(nx)
                    i += 2
                else:
                    out.append("\\")
                    i += 1
            elif c == "$":
                i, v, ok = self._dollar(i, True)
                out.append(v)
                lit &= ok
            elif c == "`":
                i = self._backtick(i, True)
                lit = False
                self._why = self._why or "command substitution"
            else:
                out.append(c)
                i += 1
        raise _Unreadable("unbalanced double quote")

    def _dollar(self, i: int, in_dq: bool) -> tuple[int, str, bool]:
        """A `$` at ``i``: (end, text, literal)."""
        s, n = self.s, len(self.s)
        nx = s[i + 1] if i + 1 < n else ""
        if nx == "(":
            if s.startswith("((", i + 1):
                raise _Unreadable("arithmetic expansion `$((`")
            why = self._why
            end = self.list_(i + 2, ")", "subst")
            self._why = why or "command substitution"  # (the body's own words reset it)
            return end, s[i:end], False
        if nx == "{":
            m = _BRACE_PARAM.match(s, i)
            if m is None:
                raise _Unreadable("parameter expansion with an operator `${...}`")
            self._why = self._why or "parameter expansion"
            return m.end(), m.group(), False
        if nx == "[":
            raise _Unreadable("arithmetic expansion `$[`")
        if nx == "'" and not in_dq:
            # ANSI-C quoting: ends at the first ' not escaped by a backslash
            j = i + 2
            while j < n and s[j] != "'":
                j += 2 if s[j] == "\\" else 1
            if j >= n:
                raise _Unreadable("unbalanced $'...' quote")
            # its value is known: a deny pattern must see `rm $'-rf' /` as `rm -rf /`
            return j + 1, _ansi_c(s[i + 2 : j]), True
        if nx == '"' and not in_dq:
            raise _Unreadable('locale translation $"..."')
        m = _NAME.match(s, i + 1)
        if m is not None:
            self._why = self._why or "parameter expansion"
            return m.end(), s[i : m.end()], False
        if nx and nx in _SPECIAL_PARAM:
            self._why = self._why or "parameter expansion"
            return i + 2, s[i : i + 2], False
        return i + 1, "$", True  # a lone `$` is itself

    def _backtick(self, i: int, in_dq: bool) -> int:
        """A backtick substitution. Its end is the next backtick; any backslash,
        `#` (or `"` inside double quotes) in the body is refused, because there
        bash's rules for finding the end and for unescaping differ from $( ).
        If bash would have ended it at a later backtick (one inside quotes),
        the body we read has an unbalanced quote and is refused as such."""
        s = self.s
        j = s.find("`", i + 1)
        if j == -1:
            raise _Unreadable("unbalanced backtick")
        body = s[i + 1 : j]
        if "\\" in body or "#" in body or (in_dq and '"' in body):
            raise _Unreadable("backslash, `#` or quote inside backticks")
        inner = _Reader(body)
        inner.list_(0, None, "subst")
        self.runtime = self.runtime or inner.runtime
        self.out.extend(inner.out)
        self.targets.extend(inner.targets)
        self.writes.extend(inner.writes)
        return j + 1


# The escapes of `$'...'` whose value does not depend on the locale or the bash version.
_ANSI_C = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r"}
_ANSI_C |= {"t": "\t", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}
_OCTAL = re.compile(r"[0-7]{1,3}")
_HEX = re.compile(r"[0-9A-Fa-f]{1,2}")


def _ansi_c(body: str) -> str:
    """The value of ``$'body'``, or unreadable for what we do not decode with certainty
    (``\\u``, ``\\c``, a NUL that ends the string, a byte that is not ASCII, an unknown escape)."""
    out: list[str] = []
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        nx = body[i + 1] if i + 1 < n else ""
        if nx in _ANSI_C:
            out.append(_ANSI_C[nx])
            i += 2
            continue
        m = _OCTAL.match(body, i + 1) if nx.isdigit() else _HEX.match(body, i + 2) if nx == "x" else None
        if m is None:
            raise _Unreadable(f"escape {body[i : i + 2]!r} in $'...'")
        code = int(m.group(), 8 if nx != "x" else 16)
        if not 0 < code < 0x80:
            raise _Unreadable(f"escape {body[i : m.end()]!r} in $'...' is a NUL or not ASCII")
        out.append(chr(code))
        i = m.end()
    return "".join(out)


def _check_name(words: list[str], literal: tuple[bool, ...] | list[bool], here_string: bool) -> None:
    name = words[0]
    if not literal[0]:
        raise _Unreadable(f"the command name {name[:40]!r} is only known at run time")
    base = name.rsplit("/", 1)[-1]
    if name in _RESERVED:
        raise _Unreadable(f"reserved word {name!r} is not read")
    if name in _CODE_BUILTINS or base in _CODE_BUILTINS:
        raise _Unreadable(f"{name!r} runs code or changes names at run time")
    if base == "printf" and any(w.startswith("-v") for w in words[1:]):
        raise _Unreadable("printf -v assigns to a variable (subscripts run code)")
    if base == "env" and any((w.startswith("-") and "S" in w) or w.startswith("--split") for w in words[1:]):
        raise _Unreadable("env -S splits a string into a command")
    # a shell anywhere in the words (env sh -c, sudo bash -c, xargs sh -c)
    # with -c or a here-string runs a string we have not read
    for k, w in enumerate(words):
        if w.rsplit("/", 1)[-1] in _SHELLS:
            rest = words[k + 1 :]
            if here_string or any(_SHELL_C.match(a) for a in rest) or not all(literal[k + 1 :]):
                raise _Unreadable(f"{w!r} runs a command string")


# ------------------------------------------------------------ entry points

# The fast path: nothing but word characters and blanks. Such a string is one
# simple command whose words are its blank-separated fields, once the name is
# checked against the refused names (done by the full reader on any doubt).
_PLAIN = re.compile(r"[A-Za-z0-9_./:,@%+=^\- \t]*")


def read_command(cmd: str) -> Reading:
    """Read ``cmd`` into the simple commands bash would run, or say why not."""
    if _PLAIN.fullmatch(cmd):
        words = cmd.split()  # safe: the string holds only ASCII word characters, spaces and tabs
        if not words:
            return Reading(())
        if "=" not in words[0]:
            literal = (True,) * len(words)
            try:
                _check_name(words, literal, False)
            except _Unreadable as e:
                return Reading((), str(e))
            return Reading((SimpleCommand(cmd.strip(" \t"), tuple(words), literal, (), " ".join(words)),))
    bad = _CONTROL.search(cmd)
    if bad is not None:
        return Reading((), f"control character {bad.group()!r}")
    r = _Reader(cmd)
    try:
        r.list_(0, None, "top")
    except _Unreadable as e:
        return Reading(tuple(r.out), str(e), tuple(r.targets), tuple(r.writes))
    except RecursionError:
        return Reading((), "nested too deeply")
    return Reading(tuple(r.out), None, tuple(r.targets), tuple(r.writes), r.runtime)


read_command_cached = lru_cache(maxsize=1024)(read_command)


# ------------------------------------------------------------ loose words

# Where a word may end for some reader of a command line or of an argument: blanks, quotes, the
# shell's operators, `=` (an option's value) and `,` (a list). `$` stays: `$HOME/.ssh` ends in
# `.ssh` whatever HOME is.
_LOOSE_SPLIT = re.compile(r"[\s<>|;&'\"`=(),]+")
# The same but for blanks: a name that holds spaces ('/Users/Jane Doe/x', `--out=/a b/x`).
_LOOSE_PIECES = re.compile(r"[<>|;&'\"`=(),]+")


def loose_words(text: str) -> Iterator[str]:
    """Every word some reader could take from ``text`` where no exact reading is certain (a
    command the reader refuses, an argument that may reach a shell or a program's argv): the
    runs between blanks, quotes and operators, and the same with backslashes dropped (``.ss\\h``);
    where there are blanks, the pieces between quotes and operators that keep them; where there
    are quotes or backslashes, the words a POSIX shell makes (quotes and escapes undone). For
    finding file names, never for allowing: a word found here may be none of the command's."""
    for word in _LOOSE_SPLIT.split(text):
        if word:
            yield word
            if "\\" in word:
                yield word.replace("\\", "")
    if not text.isprintable() or " " in text:
        for piece in _LOOSE_PIECES.split(text):
            piece = piece.strip()
            if " " in piece or "\t" in piece:
                yield piece
    if "'" in text or '"' in text or "\\" in text:
        yield from _posix_words(text)


def _posix_words(text: str) -> list[str]:
    import shlex  # pure Python and slow: only for text with quotes or escapes to undo

    try:
        lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:  # an unclosed quote: the other readings stand
        return []
    return [*words, *(w.split("=", 1)[1] for w in words if "=" in w)]
