"""atheris target: every reading of a path argument, against a real file system.

Each input byte picks a token (`/`, `\\`, `.`, `..`, `a`, `A`, `~`, `%2e`,
NUL, a symlink's name, a space, a colon, `é` in NFC and NFD...); the first
byte picks how the path starts (absolute in the sandbox, relative, `file:`,
`~`). The sandbox is a real temporary directory holding a directory, a
symlink out of it and one within it, and a directory whose POSIX name reads
as the sandbox with Windows separators.

Invariants:
1. `paths.forms` raises nothing but PathError.
2. When the policy allows `write_file` on the path (allowed_path_prefixes:
   the sandbox), every reading computed here independently with the
   standard library lies in the sandbox: the raw join resolved by
   `os.path.realpath` (what the kernel opens), its lexical normalisation,
   that normalisation resolved, and the same with `\\` as a separator.
3. A case, NFD, trailing dot/space or `:stream` variant of a sensitive name,
   under the generated directory, is sensitive and denied.

Run through `python -m tests.fuzz.run` (FUZZ_TARGETS=paths), or by hand:
    python -m tests.fuzz.fuzz_paths WORK_CORPUS tests/fuzz/corpus/paths -max_total_time=60
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import unicodedata
from urllib.parse import unquote, urlsplit

try:
    import atheris
except ImportError:  # the hypothesis fallback (tests/fuzz/fallback.py) imports check() without it
    atheris = None

if atheris is not None:
    with atheris.instrument_imports(include=["visor"]):
        from tests.policy.helpers import decide, policy_from, session_for
        from visor.policy import paths
else:
    from tests.policy.helpers import decide, policy_from, session_for
    from visor.policy import paths

TOKENS = (
    "/", "\\", ".", "..", "a", "A", "~", "%2e", "%2E%2e", "\x00", "sub", "link", "inlink", "sandbox",
    "outside", " ", ":", "é", "e\u0301", "//", "\\\\", "...", "Sandbox", "%5c", "#", "?", "file:", "other",
)  # fmt: skip
STARTS = ("{sandbox}/", "", "file://{sandbox}/", "~/", "{root}/", "file:", "{sandbox}\\", " {sandbox}/")
SENSITIVE = (".env", ".ssh/id_rsa", "key.pem", "id_ed25519", ".aws/credentials", ".env.local", "c.p12")

_STATE: dict[str, object] = {}


def _setup() -> dict[str, object]:
    """The sandbox on disk and the policy, once per process."""
    if _STATE:
        return _STATE
    root = os.path.realpath(tempfile.mkdtemp(prefix="visor-fuzz-paths-"))
    atexit.register(shutil.rmtree, root, True)
    sandbox = os.path.join(root, "sandbox")
    os.makedirs(os.path.join(sandbox, "sub", "sub"))
    os.makedirs(os.path.join(root, "outside", "deep"))
    os.symlink(os.path.join(root, "outside", "deep"), os.path.join(sandbox, "link"))
    os.symlink(os.path.join(sandbox, "sub"), os.path.join(sandbox, "inlink"))
    os.symlink(os.path.join(root, "outside"), os.path.join(sandbox, "sub", "link"))
    os.makedirs(os.path.join(root, "other\\..\\sandbox"))
    pol = policy_from(
        f"""
        servers:
          - name: fs
            allowed: true
            tools:
              - name: write_file
                allowed: true
                write_params: [path]
                allowed_path_prefixes: ["{sandbox}"]
              - name: read_file
                allowed: true
        """
    )
    _STATE.update(
        root=root,
        sandbox=sandbox,
        cwd=os.path.join(sandbox, "sub"),
        home=os.path.join(root, "outside"),
        policy=pol,
        session=session_for(pol, "fs"),
    )
    return _STATE


def _inside(path: str, sandbox: str) -> bool:
    if path.startswith("//"):
        path = "/" + path.lstrip("/")  # the kernel reads "//" as "/"
    return path == sandbox or path.startswith(sandbox + "/")


def _reference(raw: str, cwd: str) -> list[str]:
    """What servers open, computed with the standard library only."""
    value = raw.strip()
    texts = [value, raw]
    if value[:5].lower() == "file:":
        texts = [unquote(urlsplit(value).path)]
    out = []
    for t in texts:
        for s in (t, t.replace("\\", "/")):
            s = os.path.expanduser(s)
            joined = os.path.join(cwd, s)
            norm = os.path.normpath(joined)
            out += [norm, os.path.realpath(joined), os.path.realpath(norm)]
    return out


def _path_of(data: bytes, st: dict[str, object]) -> str:
    start = STARTS[data[0] % len(STARTS)] if data else ""
    body = "".join(TOKENS[b % len(TOKENS)] for b in data[1:])
    return start.format(sandbox=st["sandbox"], root=st["root"]) + body


def _sensitive_variant(data: bytes) -> str:
    name = SENSITIVE[data[0] % len(SENSITIVE)] if data else ".env"
    out = []
    for i, ch in enumerate(name):
        flip = data[(i + 1) % len(data)] & 1 if data else 0
        out.append(ch.upper() if flip else ch)
    variant = "".join(out)
    tail = data[-1] % 5 if data else 0
    variant += ("", ".", " ", ". .", "::$DATA")[tail]
    folder = "café" if len(data) % 2 else "Café"
    if len(data) % 3 == 0:
        folder = unicodedata.normalize("NFD", folder)
    return f"/srv/{folder}/{variant}"


def check(data: bytes) -> set[str]:
    """The invariants for one input; an AssertionError is a violation. Returns
    the known open issues hit (none: the fuzz runner's interface)."""
    st = _setup()
    sandbox, cwd = str(st["sandbox"]), str(st["cwd"])
    raw = _path_of(data, st)
    saved_cwd, saved_home = os.getcwd(), os.environ.get("HOME")
    os.chdir(cwd)
    os.environ["HOME"] = str(st["home"])
    try:
        # 1. nothing but PathError
        try:
            forms = paths.forms(raw)
        except paths.PathError:
            forms = None
        # 2. an allow holds for every reading a server could take
        d = decide(st["policy"], st["session"], "write_file", path=raw, content="x")  # type: ignore[arg-type]
        if d.action == "allow":
            assert forms is not None, (raw, d)
            for reading in (*forms, *_reference(raw, cwd)):
                assert _inside(reading, sandbox), f"allowed {raw!r}, but a server could open {reading!r}"
        # 3. a variant of a sensitive name is sensitive
        variant = _sensitive_variant(data)
        assert any(paths.is_sensitive(f) for f in paths.forms(variant)), variant
        d = decide(st["policy"], st["session"], "read_file", path=variant)  # type: ignore[arg-type]
        assert (d.action, d.rule) == ("deny", "path.sensitive"), (variant, d)
    finally:
        os.chdir(saved_cwd)
        if saved_home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = saved_home
    return set()


def test_one_input(data: bytes) -> None:
    check(data)


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
