"""`visor init`: the I/O around configs.py — read, show, ask, back up, write atomically."""

from __future__ import annotations

import argparse
import difflib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from visor.install.configs import (
    Config,
    ConfigError,
    Plan,
    Seed,
    Update,
    WrapOptions,
    command_line,
    header_values,
    home_dir,
    known_locations,
    load_text,
    plan_undo,
    plan_wrap,
    seed_wrapper,
    wrapped_run_args,
)

if TYPE_CHECKING:
    from visor.policy.schema import Policy

# Directories a desktop app is likely to have on its PATH when it is started
# from the Dock, Finder or a desktop launcher rather than from a shell: macOS
# launchd gives /usr/bin:/bin:/usr/sbin:/sbin, and some apps add the Homebrew
# and /usr/local locations. Anything else (a venv, ~/.local/bin, pipx, pyenv
# shims) is only on the PATH your shell profile builds.
DESKTOP_PATH_DIRS = ("/usr/local/bin", "/usr/bin", "/bin", "/opt/homebrew/bin")


def read_config(path: Path) -> tuple[Config, bytes]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 (byte {e.start}); the file was not changed") from None
    return load_text(text, str(path)), data


def find_visor_executable() -> str | None:
    """The `visor` being run now, else one next to this Python, else one on PATH."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if argv0 is not None and argv0.name == "visor" and argv0.exists():
        return str(argv0.absolute())
    beside = Path(sys.executable).parent / "visor"
    if beside.exists() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("visor")
    return os.path.abspath(found) if found else None


def path_warning(absolute: bool, on_path: str | None, executable: str | None) -> str | None:
    """What to tell the user about the client finding `visor`, if anything."""
    if absolute:
        return None
    if on_path is None:
        where = f" (it is at {executable})" if executable else ""
        return (
            "warning: `visor` is not on your PATH" + where + ": a client would fail to start the wrapped "
            "servers (spawn visor ENOENT). Rerun with --absolute to write the full path."
        )
    folder = os.path.dirname(on_path)
    if folder in DESKTOP_PATH_DIRS:
        return None
    return (
        f"warning: `visor` is {on_path}. A client started from your shell (Claude Code in a terminal) "
        f"finds it, but desktop apps started from the Dock, Finder or a launcher (Claude Desktop, "
        f"Cursor, VS Code) do not read your shell profile and usually see only "
        f"{', '.join(DESKTOP_PATH_DIRS)}; if a wrapped server then fails to start, rerun with "
        f"--absolute to write {on_path} into the config."
    )


def render_plan(plan: Plan, verb: str) -> list[str]:
    lines = []
    for e in plan.changed:
        lines.append(f"  {verb:<8} {e.label:<24} {e.summary()}")
    for e, why in plan.skipped:
        lines.append(f"  {'skip':<8} {e.label:<24} {why}")
    return lines


def hide_header_values(diff: str, values: list[str]) -> str:
    """The diff with every HTTP header value of a remote entry shown as <hidden>: they hold tokens."""
    import json

    # Whole JSON strings as a file spells them, then (long enough not to hit ordinary words) the
    # bare text, in case a value sits inside another string; longest first.
    quoted = {json.dumps(v, ensure_ascii=a) for v in values for a in (False, True)}
    bare = {v for v in values if len(v) >= 6}
    for text in sorted(quoted, key=len, reverse=True):
        diff = diff.replace(text, '"<hidden>"')
    for text in sorted(bare, key=len, reverse=True):
        diff = diff.replace(text, "<hidden>")
    return diff


def unified_diff(old: str, new: str, path: str) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"{path} (before)",
            tofile=f"{path} (after)",
        )
    )


def backup_prefix(path: Path) -> str:
    """Backups of one config: its name and a digest of where it lives (two .mcp.json differ)."""
    import hashlib

    digest = hashlib.sha256(os.path.realpath(path).encode("utf-8", "surrogateescape")).hexdigest()[:10]
    return f"{path.name}.{digest}.visor-backup-"


def backup_path(path: Path, now: float) -> Path:
    """In $VISOR_HOME/backups/ (0700), not beside the config: one folder, nothing for a client to read."""
    from visor.userfiles import backups_dir, ensure_dir

    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return ensure_dir(backups_dir()) / f"{backup_prefix(path)}{stamp}"


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_backup(path: Path, data: bytes, now: float) -> Path:
    """A copy of the file as it was, in $VISOR_HOME/backups/; never overwrites an older backup."""
    base = backup_path(path, now)
    mode = path.stat().st_mode & 0o777
    for n in range(1000):
        candidate = base if n == 0 else base.with_name(f"{base.name}-{n}")
        try:
            fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            continue
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return candidate
    raise ConfigError(f"{path}: too many backups from this second; try again")


def atomic_write(path: Path, data: bytes, expected: bytes) -> None:
    """Replace `path` with `data`: temporary file in the same folder, fsync, rename.

    `expected` is what we read and showed the user; if the file changed since
    (the client rewrote it), nothing is written.
    """
    mode = path.stat().st_mode & 0o7777
    folder = str(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".visor-tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        if path.read_bytes() != expected:
            raise ConfigError(f"{path}: changed while we were asking; nothing written, run again")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)


def _ask(question: str) -> bool:
    print(question, end="", flush=True)
    try:
        answer = sys.stdin.readline()
    except KeyboardInterrupt:
        print()
        return False
    return answer.strip().lower() in ("y", "yes")


def run_init(args: argparse.Namespace) -> int:
    if args.list:
        return run_list()
    if not args.config:
        print("visor init: give --config FILE (or --list to find your configs)", file=sys.stderr)
        return 2
    shown = Path(args.config)
    # A symlinked config (dotfiles) is rewritten where it really lives.
    path = Path(os.path.realpath(shown))
    try:
        config, data = read_config(path)
    except ConfigError as exc:
        print(f"visor init: {str(exc).replace(str(path), str(shown), 1)}", file=sys.stderr)
        return 1
    warning = None
    policy = None
    try:
        if args.undo:
            plan = plan_undo(config, args.server)
            verb = "unwrap"
        else:
            options, warning, policy, update = _wrap_options(args)
            plan = plan_wrap(config, args.server, options, update)
            verb = "wrap"
    except ConfigError as exc:
        print(f"visor init: {exc}", file=sys.stderr)
        return 1
    if not config.entries:
        print(f"{shown}: no MCP servers found (no mcpServers or servers block); nothing to do")
        return 0
    print(f"{shown}:")
    for line in render_plan(plan, verb):
        print(line)
    if not plan.changes:
        print("nothing to change")
        return 0
    print()
    diff = unified_diff(config.doc.text, plan.text, str(shown))
    print(hide_header_values(diff, [v for e in plan.changed for v in header_values(e.fields)]), end="")
    if warning and not args.undo:
        print(warning, file=sys.stderr)
    if not args.undo:
        for e in plan.changed:
            seed = seed_wrapper(e.value)
            if isinstance(seed, Seed):
                kept = f"; not carried over: {' '.join(seed.dropped)}" if seed.dropped else ""
                print(
                    f"note: {e.label} was wrapped by {seed.tool}: Visor now runs the server inside it "
                    f"({' '.join(command_line(seed.upstream))}){kept}; --undo restores the {seed.tool} entry",
                    file=sys.stderr,
                )
        for e in plan.changed:
            if e.kind == "remote" and header_values(e.fields):
                print(
                    f"note: {e.label}: its header values moved to the entry's env (VISOR_HEADER_*), which "
                    "the client passes to `visor run`, so no token is on a command line; they stay in this "
                    "file (and in x-visor-upstream, for --undo) as before",
                    file=sys.stderr,
                )
    if policy is not None:
        for e in plan.changed:
            if policy.server(e.name) is None:
                print(
                    f"warning: the policy has no server entry {e.name!r} (and no '*'): every call to it "
                    f"would be denied; scaffold one with `visor policy scaffold --server-name {e.name} ...`",
                    file=sys.stderr,
                )
    if args.dry_run:
        print("dry run: nothing written")
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            print(
                "visor init: not written: no terminal to ask on; rerun with --yes to write", file=sys.stderr
            )
            return 1
        if not _ask(f"Write these changes to {shown}? [y/N] "):
            print("not written")
            return 1
    new = plan.text.encode("utf-8")
    now = time.time()
    try:
        backup = write_backup(path, data, now)
        atomic_write(path, new, data)
    except ConfigError as e:
        print(f"visor init: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(
            f"visor init: cannot write {shown}: {e.strerror or e}; the file was not changed", file=sys.stderr
        )
        return 1
    done = "unwrapped" if args.undo else "wrapped"
    print(f"{done} {len(plan.changed)} server(s) in {shown}; backup: {backup}")
    print("restart your MCP client to apply" + ("" if args.undo else "; check with `visor doctor`"))
    return 0


def _wrap_options(
    args: argparse.Namespace,
) -> tuple[WrapOptions, str | None, Policy | None, Update]:
    from visor.userfiles import pins_dir

    policy_path = None
    loaded = None
    if args.policy:
        from visor.policy.loader import PolicyError, load_policy

        policy_path = os.path.abspath(os.path.expanduser(args.policy))
        try:
            loaded = load_policy(policy_path)
        except PolicyError as e:
            from visor.migrate.detect import bouncer_hint

            hint = bouncer_hint(policy_path)
            raise ConfigError(
                f"the policy does not load, so wrapped servers would not start: {e}"
                + (f"\n  {hint}" if hint else "")
            ) from None
    executable = find_visor_executable()
    on_path = shutil.which("visor")
    if args.absolute:
        if executable is None:
            raise ConfigError("cannot find the visor executable to write with --absolute")
        command = executable
    else:
        if on_path is None:
            where = f" (it is at {executable})" if executable else ""
            raise ConfigError(
                "`visor` is not on your PATH" + where + ", so a client could not start the wrapped "
                "servers (spawn visor ENOENT); nothing written. Rerun with --absolute to write its "
                "full path, or put it on your PATH (pipx install / uv tool install)."
            )
        command = "visor"
    approval_dir = os.path.abspath(os.path.expanduser(args.approval_dir)) if args.approval_dir else None
    pin_dir = None if args.no_pin_file else str(pins_dir().absolute())
    signing_key = _checked_signing_key(args.signing_key) if getattr(args, "signing_key", None) else None
    options = WrapOptions(command, policy_path, approval_dir, pin_dir, signing_key=signing_key)
    # What a re-run changes in entries it wrapped before: only what was asked for.
    update = Update(
        visor_command=command if args.absolute else None,
        policy=policy_path,
        approval_dir=approval_dir,
        no_pin_file=args.no_pin_file,
        signing_key=signing_key,
    )
    return options, path_warning(args.absolute, on_path, executable), loaded, update


def _checked_signing_key(given: str) -> str:
    """The signing key's absolute path, once it loads as `visor run` will load it: a key the
    wrapped servers could not use would stop every one of them from starting."""
    from visor.audit.signing import SigningError, load_signer

    path = os.path.abspath(os.path.expanduser(given))
    try:
        load_signer(path, every=1, seconds=0)
    except SigningError as exc:
        raise ConfigError(
            f"the signing key does not load, so wrapped servers would not start: {exc}"
        ) from None
    return path


def run_list() -> int:
    home, cwd = home_dir(), Path.cwd()
    found = 0
    for loc in known_locations(home, cwd):
        if not loc.path.is_file():
            print(f"{loc.client}: {loc.path}: not found")
            continue
        found += 1
        try:
            config, _ = read_config(loc.path)
        except ConfigError as exc:
            print(f"{loc.client}: {loc.path}: error: {exc}")
            continue
        print(f"{loc.client}: {loc.path}")
        if not config.entries:
            print("  (no MCP servers)")
        for e in config.entries:
            state = {
                "stdio": "not wrapped",
                "wrapped": "wrapped",
                "seed": "wrapped by a seed",
                "remote": "remote (not wrapped)" if e.note == "" else "remote (not covered)",
                "other": "unknown",
            }[e.kind]
            if e.kind == "wrapped" and wrapped_run_args(e.fields) is None:
                state = "NOT PROTECTED"
            elif e.kind == "seed":
                state = e.note  # "wrapped by mcp-bouncer": `init` unwraps it and wraps the server
            print(f"  {e.label:<24} {state:<21} {e.summary()}")
    if not found:
        print("no MCP client configs found; give one with `visor init --config FILE`")
    return 0
