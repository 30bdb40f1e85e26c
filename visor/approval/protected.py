"""Visor's own files, which no tool call may name: pure path logic, no decision.

The approval directory is the trust boundary for `--approval-dir`: an answer
written there approves a waiting call, and the pending file beside it holds
the hash that answer must carry. A wrapped filesystem server whose allowed
prefix covers it (a home directory) would let the agent approve its own call.
The audit log, the pin file and the policy are as much Visor's own. So every
string in a call's arguments that reads as a path (absolute, `~`, relative
to the working directory Visor and its server share, a `file:` URI,
percent-encoded, a word of a longer string, or a word as a POSIX shell reads
it, quotes and escapes undone, so a folder named "Jane Doe" is still found) is
resolved and compared with these locations, whatever the policy allows.

Every reading a server could take counts (``visor.policy.paths.forms``):
backslashes as separators or as name characters, the lexical and the kernel
resolution of ``..`` around symlinks, a NUL-truncated name (what a C server
opens). Names are compared as a case-insensitive, NFC/NFD-insensitive file
system with Windows' trailing dots and spaces would compare them, and by
identity (st_dev, st_ino) for the directories and files that exist, so a
hardlink, a bind mount or a renamed parent is still ours.
"""

from __future__ import annotations

import contextlib
import os
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import unquote

from visor.policy.paths import PathError, existing_prefixes, forms
from visor.policy.schema import Glob
from visor.policy.shell import loose_words

# (id(Protected), a directory relative names are read from) -> (the instance, whether any bare
# name there may be protected, the folded names of protected entries directly in it)
_LOOSE: dict[tuple[int, str], tuple[Protected, bool, frozenset[str]]] = {}


@dataclass(frozen=True, slots=True)
class Protected:
    """Real paths of directories (everything under them) and files (exactly, or `NAME.*` siblings)."""

    dirs: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    # (st_dev, st_ino) of the directories that exist: a directory renamed
    # after start-up (or reached by a parent's new name) is still itself.
    dir_ids: frozenset[tuple[int, int]] = frozenset()
    # The same for the files that exist at start-up (a hardlink is the file);
    # the files are stat'ed again on each call, since a rewrite may replace them.
    file_ids: frozenset[tuple[int, int]] = frozenset()
    # `dirs` and `files` case-folded and NFC-normalised, for the folded comparison.
    folded_dirs: tuple[str, ...] = ()
    folded_files: tuple[str, ...] = ()
    # The working directory relative names are read from: the server's, which it inherits from
    # Visor when it is started and keeps. Empty: Visor's own at each call (hand-built instances).
    cwd: str = ""
    # The directories that hold a protected location (folded like the rest), below the working
    # directory and the home directory: renaming one away and another into its place replaces
    # what Visor (or the next session's client) opens by name, so each is protected exactly
    # (not what else is under it).
    folded_ancestors: frozenset[str] = frozenset()
    # Other directories the server may read a relative name from: Node's filesystem server
    # resolves one against each of its allowed directories (its command line's, or the client's
    # roots), so ".visor/approvals/X.pending" with the home directory allowed is ours there.
    bases: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        dirs: Iterable[os.PathLike[str] | str],
        files: Iterable[os.PathLike[str] | str],
        cwd: str | None = None,
        bases: Iterable[str] = (),
    ) -> Protected:
        """``cwd``: the server's working directory (default: Visor's now, which a server
        started from here inherits). Taken once: a system call per call would cost every call.
        ``bases``: the other directories the server reads relative names from."""
        real_dirs = tuple(sorted({os.path.realpath(os.path.abspath(os.fspath(d))) for d in dirs}))
        real_files = tuple(sorted({os.path.realpath(os.path.abspath(os.fspath(f))) for f in files}))
        here = cwd if cwd is not None else os.getcwd()
        return cls(
            real_dirs,
            real_files,
            frozenset(_ids(real_dirs)),
            frozenset(_ids(real_files)),
            tuple(sorted({_fold(d).rstrip("/") for d in real_dirs})),
            tuple(sorted({_fold(f) for f in real_files})),
            here,
            frozenset(_fold(a) for a in _ancestors((*real_dirs, *real_files), here)),
            _real_bases(bases, here),
        )

    def with_bases(self, bases: Iterable[str]) -> Protected:
        """The same locations, with more directories the server reads relative names from."""
        extra = _real_bases(bases, self.cwd or os.getcwd())
        if set(extra) <= set(self.bases):
            return self
        return replace(self, bases=tuple(sorted({*self.bases, *extra})))

    def __bool__(self) -> bool:
        return bool(self.dirs or self.files)

    def with_file(self, path: str | os.PathLike[str]) -> Protected:
        """These locations and one more file, resolved now; the identities taken at start
        (of directories renamed since) are kept."""
        real = os.path.realpath(os.path.abspath(os.fspath(path)))
        if real in self.files:
            return self
        return replace(
            self,
            files=tuple(sorted({*self.files, real})),
            file_ids=self.file_ids | frozenset(_ids([real])),
            folded_files=tuple(sorted({*self.folded_files, _fold(real)})),
            folded_ancestors=self.folded_ancestors
            | frozenset(_fold(a) for a in _ancestors([real], self.cwd or os.getcwd())),
        )

    def named_in_any_reading(self, value: dict[str, object]) -> str | None:
        """The string that names a protected location under any reading of ``value`` (JSON
        inside strings included, as a server that decodes them reads it), or None. Arguments
        nested too deeply for every reading to be known name one, by definition (fail closed)."""
        if not self:
            return None
        named = self.named_by(value)
        if named is None:
            from visor.policy import readings

            try:
                decoded = readings.every_decoding(value)
            except readings.AmbiguousJson:
                return "(arguments nested too deeply to check)"
            if decoded is not None:
                named = self.named_by(decoded)
        return named

    def named_by(self, arguments: object) -> str | None:
        """The first argument string that names a protected location, or None."""
        cwd = self.cwd or os.getcwd()
        named = self._named_from(arguments, cwd)
        for base in self.bases:
            if named is not None:
                break
            if base != cwd:
                named = self._named_from(arguments, base)
        return named

    def _named_from(self, arguments: object, cwd: str) -> str | None:
        """The first argument string that names a protected location, relative names read from ``cwd``."""
        cached = _LOOSE.get((id(self), cwd))
        if cached is not None and cached[0] is self:
            loose, bare = cached[1], cached[2]
        else:
            # Resolving the working directory walks the file system; it is the
            # same on every call, so it is done once per directory, not per call.
            real_cwd = os.path.realpath(cwd)
            loose = self._covers(real_cwd, frozenset())  # a bare file name may be one of ours
            # A protected file (a project's .mcp.json) directly in the working
            # directory is named by its bare name: those names are looked up as words.
            here = _fold(real_cwd).rstrip("/")
            bare = frozenset(
                f.rsplit("/", 1)[1]
                for f in (*self.folded_files, *self.folded_dirs, *self.folded_ancestors)
                if f.rsplit("/", 1)[0] == here
            )
            if len(_LOOSE) > 64:
                _LOOSE.clear()
            _LOOSE[(id(self), cwd)] = (self, loose, bare)
        ids: list[frozenset[tuple[int, int]]] = []  # the files' identities, read once per call if needed
        stack: list[object] = [arguments]
        while stack:
            node = stack.pop()
            # exact types, as JSON decoding makes them
            if type(node) is str:
                if self._names(node, cwd, loose, ids) or (bare and _names_bare(node, bare)):
                    return node
            elif type(node) is dict:
                stack.extend(node.keys())
                stack.extend(node.values())
            elif type(node) is list:
                stack.extend(node)
        return None

    def _file_ids(self, ids: list[frozenset[tuple[int, int]]]) -> frozenset[tuple[int, int]]:
        if not ids:
            ids.append(self.file_ids | frozenset(_ids(self.files)))
        return ids[0]

    def _names(self, text: str, cwd: str, loose: bool, ids: list[frozenset[tuple[int, int]]]) -> bool:
        if not loose and not _PATHISH.search(text):
            return False
        # the whole string, and each word a path can hide as in a longer one (a command line, a
        # redirect, an option `--out=PATH`, a quoted name, one with spaces in it)
        candidates = {text}
        candidates.update(loose_words(text))
        for c in list(candidates):
            # percent-encoding, twice over for a server that decodes twice
            while "%" in c and (d := unquote(c)) != c and d not in candidates:
                candidates.add(d)
                c = d
        for c in list(candidates):
            if "\x00" in c:
                candidates.add(c.split("\x00", 1)[0])  # a C server stops at the NUL
        seen: set[str] = set()
        for c in candidates:
            if not c or "\x00" in c or (not loose and not _PATHISH.search(c)):
                continue
            for form in _forms(c):
                try:
                    readings = forms(form, cwd)
                except PathError:  # a remote file URI (its path is another form), an unencodable name
                    readings = (os.path.normpath(os.path.join(cwd, form.replace("\x00", ""))),)
                for r in readings:
                    if r in seen:
                        continue
                    seen.add(r)
                    if self._covers(r, self._file_ids(ids) if self.files else frozenset()):
                        return True
        return False

    def _covers(self, real: str, file_ids: frozenset[tuple[int, int]]) -> bool:
        for v in Glob.variants(real):
            key = _fold(v)
            for d in self.folded_dirs:
                if key == d or key.startswith(d + "/"):
                    return True
            if any(key == f or key.startswith(f + ".") for f in self.folded_files):
                return True
            if key in self.folded_ancestors:
                return True
        if self.dir_ids or file_ids:
            for path, st in _existing_ancestors(real):
                key_id = (st.st_dev, st.st_ino)
                if key_id in self.dir_ids or (path == real and key_id in file_ids):
                    return True
        return False


def _real_bases(bases: Iterable[str], cwd: str) -> tuple[str, ...]:
    """The real paths of ``bases`` that are directories (relative ones read from ``cwd``)."""
    out: set[str] = set()
    for base in bases:
        path = os.path.join(cwd, os.path.expanduser(base))
        with contextlib.suppress(OSError, ValueError):
            if os.path.isdir(path):
                out.add(os.path.realpath(path))
    return tuple(sorted(out))


def command_directories(command: Iterable[str]) -> list[str]:
    """The words of a server's command line that may name a directory (``DIR``, ``--opt=DIR``):
    a filesystem server reads relative names from the directories it was given."""
    out: list[str] = []
    for word in command:
        out.append(word)
        if word.startswith("-") and "=" in word:
            out.append(word.split("=", 1)[1])
    return out


def _ancestors(locations: Iterable[str], cwd: str) -> set[str]:
    """The directories above ``locations`` (real paths), short of ``/`` and of the working and
    home directories and what holds them: a tool that renames one (`move_file .vscode old`, then
    a prepared directory to `.vscode`) swaps in a policy, log or client config of its own."""
    spared: set[str] = {"/"}
    for base in (cwd, os.path.expanduser("~")):
        if not base.startswith("/"):
            continue
        path = os.path.realpath(base)
        while True:
            spared.add(path)
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
    out: set[str] = set()
    for loc in locations:
        path = os.path.dirname(loc)
        while path not in spared and path not in out:
            out.add(path)
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
    return out


def _existing_ancestors(real: str) -> list[tuple[str, os.stat_result]]:
    """`real` and each of its parents up to ``/`` that lstat finds, deepest first, with its stat.

    A long reading (a 4 KB text with slashes read as a path) has hundreds of parents, and below
    the first name that does not exist none can be found: such a reading is looked up from the
    root down, to that name (`existing_prefixes`). Readings are normalised absolute paths, so
    their parents below the root are exactly their prefixes; anything else, and every short
    path, gets the plain walk up, one lstat per parent.
    """
    if "//" not in real and (walk := existing_prefixes(real)) is not None:
        return walk[0][::-1]
    out: list[tuple[str, os.stat_result]] = []
    path = real
    while True:
        with contextlib.suppress(OSError, ValueError):
            out.append((path, os.lstat(path)))
        parent = os.path.dirname(path)
        if parent == path:
            return out
        path = parent


def signing_key_dir() -> Path:
    """Where `visor audit keygen` keeps keys ($VISOR_HOME/keys): protected in every session,
    since another server's Visor may sign with a key kept there."""
    from visor.audit.paths import visor_home

    return visor_home() / "keys"


def signing_key_files(key: str | os.PathLike[str] | None) -> list[Path]:
    """The private key `visor run --signing-key` signs checkpoints with, and the public key
    beside it (`NAME.key` -> `NAME.pub`). A tool that reads the private key can sign a
    rewritten log; one that replaces the public key a reviewer verifies with can make a
    forged checkpoint pass. (`NAME.key.*` siblings are covered as for every protected file.)"""
    if not key:
        return []
    path = Path(os.path.expanduser(os.fspath(key)))
    files = [path]
    if path.suffix == ".key":
        files.append(path.with_suffix(".pub"))
    return files


def _names_bare(text: str, bare: frozenset[str]) -> bool:
    """Whether ``text`` is one of the bare names (or its ``NAME.*`` sibling), compared
    as a case-insensitive file system with Windows name rules would. Only the whole
    string: a file tool takes a name whole, and a sentence that mentions one
    (a commit message) names nothing."""
    key = _fold(text.strip()).rstrip(". ")
    return bool(key) and (key in bare or any(key.startswith(b + ".") for b in bare))


# A string that may name a path: a separator, a home, a percent-escape, a file URI.
_PATHISH = re.compile(r"[/\\~%]|file:", re.IGNORECASE)


def _fold(path: str) -> str:
    """Case-folded and NFC-normalised: how a case- and normalisation-insensitive file system compares names."""
    if path.isascii():
        return path.lower()
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", path).casefold())


def _ids(paths: Iterable[str]) -> Iterable[tuple[int, int]]:
    for p in paths:
        try:
            st = os.stat(p)
        except (OSError, ValueError):
            continue
        yield (st.st_dev, st.st_ino)


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
