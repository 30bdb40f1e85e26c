"""Visor's own files, which no tool call may name: pure path logic, no decision.

The approval directory is the trust boundary for `--approval-dir`: an answer
written there approves a waiting call, and the pending file beside it holds
the hash that answer must carry. A wrapped filesystem server whose allowed
prefix covers it (a home directory) would let the agent approve its own call.
The audit log, the pin file and the policy are as much Visor's own. So every
string in a call's arguments that reads as a path (absolute, `~`, relative
to the working directory Visor and its server share, a `file:` URI,
percent-encoded, or a word of a longer string) is resolved and compared with
these locations, whatever the policy allows.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

# Separators of the words a path can hide between in a longer string (a
# command line, a redirect, an option `--out=PATH`, a quoted name).
_WORDS = re.compile(r"[\s<>|;&'\"`=(),]+")

# id(Protected) -> (the instance, working directory, whether a bare name there is protected)
_LOOSE: dict[int, tuple[Protected, str, bool]] = {}


@dataclass(frozen=True, slots=True)
class Protected:
    """Real paths of directories (everything under them) and files (exactly, or `NAME.*` siblings)."""

    dirs: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    # (st_dev, st_ino) of the directories that exist: a directory renamed
    # after start-up (or reached by a parent's new name) is still itself.
    dir_ids: frozenset[tuple[int, int]] = frozenset()

    @classmethod
    def of(cls, dirs: Iterable[os.PathLike[str] | str], files: Iterable[os.PathLike[str] | str]) -> Protected:
        real_dirs = tuple(sorted({os.path.realpath(os.path.abspath(os.fspath(d))) for d in dirs}))
        ids = set()
        for d in real_dirs:
            try:
                st = os.stat(d)
            except OSError:
                continue
            ids.add((st.st_dev, st.st_ino))
        return cls(
            real_dirs,
            tuple(sorted({os.path.realpath(os.path.abspath(os.fspath(f))) for f in files})),
            frozenset(ids),
        )

    def __bool__(self) -> bool:
        return bool(self.dirs or self.files)

    def named_by(self, arguments: Any) -> str | None:
        """The first argument string that names a protected location, or None."""
        cwd = os.getcwd()
        cached = _LOOSE.get(id(self))
        if cached is not None and cached[0] is self and cached[1] == cwd:
            loose = cached[2]
        else:
            # Resolving the working directory walks the file system; it is the
            # same on every call, so it is done once per directory, not per call.
            loose = self._covers(os.path.realpath(cwd))  # a bare file name may be one of ours
            if len(_LOOSE) > 64:
                _LOOSE.clear()
            _LOOSE[id(self)] = (self, cwd, loose)
        stack = [arguments]
        while stack:
            node = stack.pop()
            t = type(node)
            if t is str:
                if self._names(node, cwd, loose):
                    return node
            elif t is dict:
                stack.extend(node.keys())
                stack.extend(node.values())
            elif t is list:
                stack.extend(node)
        return None

    def _names(self, text: str, cwd: str, loose: bool) -> bool:
        if not loose and "/" not in text and "~" not in text and "%" not in text:
            return False
        candidates = {text}
        candidates.update(w for w in _WORDS.split(text) if w)
        for c in list(candidates):
            if "%" in c:
                candidates.add(unquote(c))
        for c in candidates:
            if not c or "\x00" in c:
                continue
            for form in _forms(c):
                path = os.path.join(cwd, os.path.expanduser(form))
                try:
                    real = os.path.realpath(path)
                except ValueError:  # not encodable as a file name: compare the text
                    real = os.path.normpath(path)
                if self._covers(real):
                    return True
        return False

    def _covers(self, real: str) -> bool:
        for d in self.dirs:
            if real == d or real.startswith(d.rstrip("/") + "/"):
                return True
        if any(real == f or real.startswith(f + ".") for f in self.files):
            return True
        if self.dir_ids:
            path = real
            while True:
                try:
                    st = os.lstat(path)
                except (OSError, ValueError):
                    pass
                else:
                    if (st.st_dev, st.st_ino) in self.dir_ids:
                        return True
                parent = os.path.dirname(path)
                if parent == path:
                    return False
                path = parent
        return False


def _forms(word: str) -> Iterable[str]:
    yield word
    low = word[:5].lower()
    if low == "file:":
        rest = word[5:]
        if rest.startswith("//"):
            rest = rest[2:]
            slash = rest.find("/")
            rest = rest[slash:] if slash >= 0 else "/"  # file://host/path: the host is ignored
        yield rest
