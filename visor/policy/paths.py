"""Path arguments: finding them, normalising them, matching them.

The only I/O in this module is ``os.path.realpath`` (symlinks are resolved
where the path exists) and ``os.getcwd`` (relative paths resolve against the
proxy's working directory, which is also the server's unless the client
configures otherwise; see docs/policy.md).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any
from urllib.parse import unquote, urlsplit

from visor.policy.schema import Glob
from visor.wire.folding import fold_lower

_PATH_MAX = os.pathconf("/", "PC_PATH_MAX") if hasattr(os, "pathconf") else 4096

# Argument names that always hold paths. Matching is on the snake_case form of
# the name, so ``filePath`` and ``file_path`` are the same.
_PATH_NAMES: frozenset[str] = frozenset(
    {
        "path",
        "paths",
        "file",
        "files",
        "file_path",
        "file_paths",
        "filepath",
        "filename",
        "filenames",
        "source",
        "destination",
        "src",
        "dst",
        "dest",
        "uri",
        "dir",
        "directory",
        "folder",
        "root",
        "cwd",
        "target",
        "absolute_path",
        "absolutepath",
        "repo_path",
        "working_directory",
        "working_dir",
        "workdir",
    }
)
# Any name whose last snake_case word is one of these is path-shaped too
# (``target_path``, ``output_file``, ``config_dir``).
_PATH_SUFFIXES: frozenset[str] = frozenset(
    {"path", "paths", "file", "files", "filename", "dir", "directory", "folder", "filepath"}
)
# Names whose values are free text: never read as paths even when they start
# with "/" (a file's content, a message body, a shell command, a regex).
_TEXT_NAMES: frozenset[str] = frozenset(
    {
        "content",
        "contents",
        "text",
        "body",
        "message",
        "description",
        "title",
        "comment",
        "pattern",
        "patterns",
        "regex",
        "query",
        "sql",
        "statement",
        "command",
        "cmd",
        "exec",
        "script",
        "new_text",
        "old_text",
        "newtext",
        "oldtext",
        "diff",
        "patch",
        "exclude_patterns",
        "url",
    }
)

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


@lru_cache(maxsize=4096)
def snake(name: str) -> str:
    """``toAddress`` -> ``to_address``; ``Recipient-Email`` -> ``recipient_email``.

    Lower case after Go's case folding: a Go server reads ``paTH`` and
    Unicode variants (``ſ`` for ``s``, the Kelvin sign for
    ``k``) as ``path``, so Visor's name vocabularies must too."""
    return fold_lower(_CAMEL.sub("_", name).replace("-", "_"))


@lru_cache(maxsize=4096)
def is_path_name(name: str) -> bool:
    s = snake(name)
    if s in _PATH_NAMES:
        return True
    return s.rsplit("_", 1)[-1] in _PATH_SUFFIXES


def _looks_like_path(value: str) -> bool:
    """A string that a server would read as a path, whatever its argument is called."""
    if not value or len(value) > 4096 or "\n" in value:
        return False
    return value.startswith(("/", "~", "./", "../", "file:", "\\\\")) or value in (".", "..")


def iter_path_values(
    arguments: dict[str, Any], extra_names: tuple[str, ...] = ()
) -> Iterator[tuple[str, str]]:
    """Yield ``(argument_name, raw_value)`` for every path-like value, nested values included.

    A value counts when its argument name is path-shaped (or listed in
    ``extra_names``), or when the string itself looks like a path and the name
    is not a free-text one. Lists and nested objects are walked; an element of a
    list inherits the list's name.
    """
    stack: list[tuple[str, object, bool]] = [(k, v, False) for k, v in arguments.items()]
    while stack:
        name, value, named = stack.pop()
        if isinstance(value, str):
            sname = snake(name)
            if (
                named
                or name in extra_names
                or is_path_name(name)
                or (sname not in _TEXT_NAMES and _looks_like_path(value))
            ):
                yield name, value
        elif isinstance(value, list):
            is_named = named or name in extra_names or is_path_name(name)
            stack.extend((name, v, is_named) for v in value)
        elif isinstance(value, dict):
            stack.extend((k, v, False) for k, v in value.items())


class PathError(ValueError):
    """A path value that cannot be read safely (NUL byte, remote file URI)."""


def normalise(raw: str, cwd: str | None = None) -> str:
    """The absolute, lexically normalised form of a path argument.

    ``file://`` URIs are percent-decoded; ``~`` is expanded; backslashes are
    read as separators (a Windows server would); ``..``, ``.`` and repeated
    slashes are collapsed. Symlinks are not resolved here: see ``forms``.
    """
    value = raw.strip()
    if "\x00" in value:
        raise PathError("path contains a NUL byte")
    if value[:5].lower() == "file:":
        parts = urlsplit(value)
        if parts.netloc not in ("", "localhost"):
            raise PathError(f"file URI names a remote host {parts.netloc!r}")
        value = unquote(parts.path)
        if "\x00" in value:
            raise PathError("path contains a NUL byte")
    value = value.replace("\\", "/")
    if value.startswith("~"):
        value = os.path.expanduser(value)
    if not value.startswith("/"):
        value = os.path.join(cwd if cwd is not None else os.getcwd(), value)
    value = os.path.normpath(value)
    if value.startswith("//"):
        # POSIX keeps a leading "//"; the kernel treats it as "/".
        value = "/" + value.lstrip("/")
    return value


def _norm(path: str) -> str:
    value = os.path.normpath(path)
    if value.startswith("//"):
        # POSIX keeps a leading "//"; the kernel treats it as "/".
        value = "/" + value.lstrip("/")
    return value


def _real(path: str) -> str:
    try:
        value = _realpath(path)
    except (ValueError, OSError, RecursionError) as e:  # a lone surrogate, a symlink chain too deep
        raise PathError(f"path cannot be resolved: {type(e).__name__}") from None
    if value.startswith("//"):
        value = "/" + value.lstrip("/")
    return value


# Paths with more names than this take the short cut below; shorter ones go straight to realpath.
_SHORT_CUT_NAMES = 16
_MISSING = frozenset({errno.ENOENT, errno.ENOTDIR})


def existing_prefixes(path: str) -> tuple[list[tuple[str, os.stat_result]], list[str]] | None:
    """Look a long absolute path's names up from the root, stopping at the first that is missing.

    A long string that is not a path at all (a 4 KB message with slashes in it, which every path
    check reads as one) would cost a system call per slash to walk whole. Once a name is missing
    (ENOENT, ENOTDIR) nothing below it exists: no name below can be looked up, nor be a symlink,
    unless a '..' climbs back above it. Returns ("/" and each prefix that exists, shallowest
    first, with its lstat; the names not looked up, the missing one first: empty when every name
    exists), '.' and empty names dropped. None when the walk cannot say, and the caller takes the
    long way: a relative or short path, a '..', another error (ELOOP, EACCES, a NUL), a prefix
    at PATH_MAX.
    """
    if path.count("/") <= _SHORT_CUT_NAMES or not path.startswith("/"):
        return None
    names = [n for n in path.split("/") if n and n != "."]
    if ".." in names:
        return None
    try:
        found = [("/", os.lstat("/"))]
        prefix = ""
        for k, name in enumerate(names):
            candidate = f"{prefix}/{name}"
            if len(candidate.encode("utf-8", "surrogatepass")) >= _PATH_MAX:
                return None
            try:
                found.append((candidate, os.lstat(candidate)))
            except OSError as exc:
                return (found, names[k:]) if exc.errno in _MISSING else None
            prefix = candidate
    except (OSError, ValueError):
        return None
    return found, []


def _realpath(path: str) -> str:
    """`os.path.realpath(path)`, the same string, without one lstat per name past the first
    name that does not exist (`existing_prefixes`): realpath the part above it, append the rest
    as realpath would. (tests/policy/test_paths_realpath.py holds the two to the same string on
    a tree of links.)"""
    walk = existing_prefixes(path)
    if walk is None or not walk[1]:
        return os.path.realpath(path)
    found, rest = walk
    return os.path.realpath(found[-1][0]).rstrip("/") + "/" + "/".join(rest)


@lru_cache(maxsize=4096)
def _texts(raw: str, home: str) -> tuple[str, ...]:
    """Pure: every string a server could open for ``raw``, before the working directory is joined.

    ``home`` is only the cache key for ``~`` expansion. Raises PathError.
    """
    if "\x00" in raw:
        raise PathError("path contains a NUL byte")
    value = raw.strip()
    bases: list[str] = []
    if value[:5].lower() == "file:":
        parts = urlsplit(value)
        if parts.netloc not in ("", "localhost"):
            raise PathError(f"file URI names a remote host {parts.netloc!r}")
        bases.append(unquote(parts.path))
        # A server that cuts "file://host" off by hand keeps "?..." and "#..."
        # (and may or may not percent-decode what is left).
        rest = value[5:]
        if rest.startswith("//"):
            rest = rest[2:]
            slash = rest.find("/")
            rest = rest[slash:] if slash >= 0 else "/"
        bases += (rest, unquote(rest))
        if ".." in value:
            bases.append(value)  # taken as a relative name "file:..." that climbs out
        if any("\x00" in b for b in bases):
            raise PathError("path contains a NUL byte")
    else:
        bases.append(value)
        if raw != value:
            bases.append(raw)  # a server that does not trim: " /x" is relative
    out: list[str] = []
    for base in bases:
        seps = (base, base.replace("\\", "/")) if "\\" in base else (base,)
        for sep in seps:
            # POSIX names as written; Windows names (trailing dots and spaces
            # dropped, ":stream" cut) when they differ.
            for text in (sep, Glob.variants(sep)[-1]):
                if text.startswith("~"):
                    expanded = os.path.expanduser(text)
                    if expanded not in out:
                        out.append(expanded)
                    if expanded != text and ".." not in text:
                        continue  # a literal "~" directory is only a risk if the path climbs out of it
                if text not in out:
                    out.append(text)
    return tuple(out)


def forms(raw: str, cwd: str | None = None, bases: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Every path a real server could act on for ``raw``, lexical reading first.

    The readings (docs/policy.md, "Paths"): the value trimmed and as sent;
    a ``file:`` URI decoded, cut by hand (query and fragment kept) and, when
    it has ``..``, as a relative name; ``\\`` as a name character (POSIX) and
    as a separator (Windows); names with Windows' trailing dots, spaces and
    ``:stream`` dropped; ``~`` expanded (and literal when it climbs). Each is
    joined to the working directory and read three ways: lexically
    normalised; normalised then symlinks resolved (Node's filesystem
    server); and the raw join resolved as the kernel walks it (symlinks
    followed before ``..``). A deny rule fires if any reading matches; an
    allow rule must hold for every one. A relative name is also joined to
    each of ``bases``: the directories the server itself reads relative names
    from (Node's filesystem server: its allowed directories, or the client's
    roots). Raises PathError.
    """
    home = os.environ.get("HOME", "") if "~" in raw else ""
    # only short values are cached: a huge argument must not pin memory
    texts = _texts(raw, home) if len(raw) <= 1024 else _texts.__wrapped__(raw, home)
    base = cwd
    lexical: list[str] = []
    joins: list[str] = []
    for text in texts:
        if text.startswith("/"):
            joined_all: tuple[str, ...] = (text,)
        else:
            if base is None:
                base = os.getcwd()
            joined_all = (os.path.join(base, text), *(os.path.join(b, text) for b in bases if b != base))
        for joined in joined_all:
            norm = _norm(joined)
            if norm not in lexical:
                lexical.append(norm)
            if joined != norm and joined not in joins:
                joins.append(joined)
    out = list(lexical)
    for path in (*lexical, *joins):
        real = _real(path)
        if real not in out:
            out.append(real)
    return tuple(out)


def under_prefix(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix if prefix.endswith("/") else prefix + "/")


# ---------------------------------------------------------------- globs


def translate_glob(pattern: str) -> str:
    """Doublestar glob -> regex: ``**`` spans segments, ``*``/``?`` stay inside one."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                at_start = i == 0 or pattern[i - 1] == "/"
                j = i + 2
                if at_start and j < n and pattern[j] == "/":
                    out.append("(?:.*/)?")  # "**/" matches zero or more whole segments
                    i = j + 1
                    continue
                if at_start and j == n and i > 0:
                    out.pop()  # "/**" at the end also matches the directory itself
                    out.append("(?:/.*)?")
                    i = j
                    continue
                out.append(".*")
                i = j
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = pattern.find("]", i + 2)
            if j == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : j]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = j
        elif c == "{":
            j = pattern.find("}", i)
            if j == -1:
                out.append(re.escape(c))
            else:
                alts = pattern[i + 1 : j].split(",")
                out.append("(?:" + "|".join(translate_glob(a) for a in alts) + ")")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def compile_glob(pattern: str, resolve: bool = True) -> Glob:
    """Compile a doublestar glob; raises ``re.error`` on a malformed class."""
    regex = re.compile(translate_glob(pattern), re.DOTALL)
    alt = None
    if resolve and pattern.startswith("/"):
        # Resolve the literal directory prefix (up to the first wildcard).
        cut = len(pattern)
        for ch in "*?[{":
            k = pattern.find(ch)
            if k != -1:
                cut = min(cut, k)
        literal = pattern[:cut]
        head = literal.rsplit("/", 1)[0] or "/"
        real = os.path.realpath(head)
        if real != head:
            alt = re.compile(translate_glob(real.rstrip("/") + pattern[len(head.rstrip("/")) :]), re.DOTALL)
    return Glob(pattern, regex, alt)


# Files that no tool call may name, whatever a policy's allow rules say.
SENSITIVE_GLOBS: tuple[str, ...] = (
    "**/.env",
    "**/.env.*",
    "**/.ssh",
    "**/.ssh/**",
    "**/id_rsa",
    "**/id_rsa.*",
    "**/id_dsa",
    "**/id_ecdsa",
    "**/id_ecdsa.*",
    "**/id_ed25519",
    "**/id_ed25519.*",
    "**/*.pem",
    "**/*.key",
    "**/*.p12",
    "**/*.pfx",
    "**/.aws/credentials",
    "**/.aws/config",
    "**/.config/gcloud/**",
    "**/.azure/**",
    "**/.kube/config",
    "**/kubeconfig",
    "**/kubeconfig.*",
    "**/.netrc",
    "**/.git-credentials",
    "**/.docker/config.json",
    "**/.pgpass",
    "**/.npmrc",
    "**/.pypirc",
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/sudoers",
)

# Matched against case-folded paths (the globs are lower case): macOS and
# Windows read `.Env` and `ID_RSA.PEM` as the names on this list.
_SENSITIVE_RE = re.compile("|".join(f"(?:{translate_glob(g)})" for g in SENSITIVE_GLOBS), re.DOTALL)


@lru_cache(maxsize=8192)
def _builtin_sensitive(path: str) -> bool:
    return any(_SENSITIVE_RE.fullmatch(v.casefold()) is not None for v in Glob.variants(path))


def is_sensitive(path: str, extra: tuple[Glob, ...] = ()) -> bool:
    """Whether some file system would read ``path`` as a sensitive file.

    Case-insensitive, NFC/NFD-insensitive, and with Windows' reading of each
    name (``.env.``, ``.env ``, ``.env::$DATA`` are ``.env``): see
    ``Glob.variants``.
    """
    if _builtin_sensitive(path) if len(path) <= 1024 else _builtin_sensitive.__wrapped__(path):
        return True
    return any(g.match_folded(path) for g in extra)
