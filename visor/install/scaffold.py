"""`visor policy scaffold`: from a live server's tools/list to an explicit policy.

The policy is default-deny and allows each tool the server listed, so that a
tool added later is refused until someone adds it. What Visor knows about a
tool is written out with a comment saying where it came from: a built-in pack
(verified against the real server, or following its documented schema), or
the tool's own schema and annotations (argument names that look like
destinations or paths, readOnlyHint/destructiveHint). Writing tools are
confined to one directory as a starting point; that is the line a user is
most likely to edit.

``render_policy`` is pure (a listing in, YAML text out); ``run_scaffold`` does
the I/O.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from visor.display import escape
from visor.install.stdio_client import ClientError, Listing, child_env, list_server
from visor.policy import paths
from visor.policy.destinations import is_destination_name
from visor.policy.effective import pack_entry, select_packs
from visor.policy.loader import builtin_packs, load_policy_text
from visor.policy.schema import Pack, Policy

_SENDER_WORDS = frozenset(
    {"send", "post", "share", "notify", "invite", "forward", "publish", "upload", "webhook", "reply", "email"}
)
_WRITER_WORDS = frozenset(
    {
        "write",
        "edit",
        "create",
        "update",
        "delete",
        "remove",
        "move",
        "rename",
        "put",
        "save",
        "append",
        "insert",
        "mkdir",
        "commit",
        "add",
        "reset",
        "checkout",
        "patch",
        "apply",
        "set",
        "drop",
        "modify",
        "replace",
    }
)
_LAUNCHERS = frozenset(
    {"npx", "uvx", "pipx", "bunx", "pnpm", "yarn", "node", "bun", "deno", "uv", "docker", "podman"}
)
_LAUNCHER_WORDS = frozenset({"run", "exec", "dlx", "tool", "x", "-m"})
# launcher options that take a value: `uvx --from git+https://... NAME`
_VALUE_OPTIONS = frozenset(
    {
        "--from",
        "--with",
        "--python",
        "-p",
        "--package",
        "--index-url",
        "-e",
        "--env",
        "-v",
        "--volume",
        "--name",
    }
)


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What the scaffold writes for one tool, and why."""

    name: str
    why: tuple[str, ...]  # comment lines
    exfiltrating: bool | None = None
    sink_params: tuple[str, ...] = ()
    write_params: tuple[str, ...] = ()
    path_prefixes: tuple[str, ...] = ()


def _words(name: str) -> set[str]:
    return set(re.split(r"[_\W]+", paths.snake(name)))


def _props(tool: dict[str, Any]) -> list[str]:
    schema = tool.get("inputSchema")
    props = schema.get("properties") if isinstance(schema, dict) else None
    return [str(p) for p in props] if isinstance(props, dict) else []


def _hints(tool: dict[str, Any]) -> dict[str, Any]:
    ann = tool.get("annotations")
    return ann if isinstance(ann, dict) else {}


def plan_tool(tool: dict[str, Any], packs: dict[str, Pack], active: tuple[str, ...], root: str) -> ToolPlan:
    name = str(tool.get("name", ""))
    props = _props(tool)
    hints = _hints(tool)
    for pname in active:
        # as `visor run` reads it: an entry verified against a tool with other arguments
        # says nothing of this one, or only that it sends (a policy entry is not so limited)
        entry = pack_entry(packs[pname], name, frozenset(props))
        if entry is None:
            continue
        source = packs[pname].description or pname
        reasons = [f"pack {pname} ({source})"]
        if entry.exfiltrating:
            sink_names = ", ".join(entry.sink_params) or "every address-shaped value"
            reasons.append(f"sends: destinations in {sink_names} are checked for provenance")
            reasons.append("add trusted_destinations for the places it may always send to")
        if entry.write_params:
            reasons.append(
                f"writes through {', '.join(entry.write_params)}: confined to {root} to start with"
            )
        if not entry.exfiltrating and not entry.write_params:
            reasons.append("reads only")
        # The pack's lists apply by merging; restating them here would only
        # make `visor lint` report the merge. The prefixes are the policy's own.
        return ToolPlan(
            name,
            tuple(reasons),
            exfiltrating=entry.exfiltrating,
            path_prefixes=(root,) if entry.write_params else (),
        )

    words = _words(name)
    dests = [p for p in props if is_destination_name(p)]
    path_args = [p for p in props if paths.is_path_name(p)]
    read_only = hints.get("readOnlyHint") is True
    sender = bool(words & _SENDER_WORDS) and not read_only
    writer = not read_only and (bool(words & _WRITER_WORDS) or hints.get("destructiveHint") is True)
    why: list[str] = ["no pack describes this tool; read from its name, schema and annotations"]
    exfil: bool | None = None
    sinks: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    if dests or sender:
        exfil = True
        sinks = tuple(dests)
        if dests:
            why.append(f"destination-shaped arguments {', '.join(dests)}: checked for provenance")
        else:
            why.append(
                "named like a sending tool, no destination-shaped argument: every address-shaped value is checked"
            )
        why.append("add trusted_destinations for the places it may always send to")
    if writer and path_args:
        writes = tuple(path_args)
        why.append(
            f"writes (by its name or destructiveHint) through {', '.join(path_args)}: confined to {root}"
        )
    elif writer:
        why.append("looks like it changes something but has no path-shaped argument; consider max_calls")
    if exfil is None and not writes:
        why.append("readOnlyHint" if read_only else "no destination- or path-shaped argument")
    if hints.get("destructiveHint") is True and not writes:
        why.append("destructiveHint: consider approval_required: true or max_calls")
    return ToolPlan(name, tuple(why), exfil, sinks, writes, (root,) if writes else ())


def _q(text: str) -> str:
    """A YAML double-quoted scalar (JSON strings are valid YAML).

    JSON leaves LS, PS, NEL and other invisible characters raw; YAML folds a line break inside
    quotes, and a reviewer does not see them: written as escapes (`\\u2028`), which YAML reads back
    to the same character.
    """
    return escape(json.dumps(text, ensure_ascii=False))


def _comment(text: str, limit: int = 100) -> str:
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def active_packs(server_name: str, tool_names: set[str]) -> tuple[dict[str, Pack], tuple[str, ...]]:
    packs = builtin_packs()
    probe = Policy(source="<scaffold>", sha256="", packs=packs)
    return packs, select_packs(probe, None, server_name, tool_names)


def render_policy(listing: Listing, server_name: str, command: list[str], root: str) -> str:
    names = {str(t.get("name", "")) for t in listing.tools}
    packs, active = active_packs(server_name, names)
    info = listing.server_info
    ident = " ".join(str(info.get(k, "")) for k in ("name", "version")).strip() or "unknown"
    out = [
        "# Visor policy written by `visor policy scaffold`; review it before relying on it.",
        f"# Server: {_comment(ident)}, started as: {_comment(shlex.join(command), 200)}",
        f"# Use it with: visor run --server-name {_comment(server_name)} --policy THIS_FILE -- ...",
        "# Default deny: only the tools listed below may run, and only for this server name.",
        "# Sensitive files (.env, SSH keys, cloud credentials, ...) stay denied in every path argument,",
        "# and tool pinning refuses a tool whose description or schema changes.",
    ]
    out.append(f"# Packs applied: {', '.join(active)}" if active else "# Packs applied: none matched")
    for kind, items in (("resources", listing.resources), ("prompts", listing.prompts)):
        if items:
            shown = ", ".join(_comment(str(i.get("uri") or i.get("name", "")), 60) for i in items[:10])
            more = f" and {len(items) - 10} more" if len(items) > 10 else ""
            out.append(f"# The server also lists {len(items)} {kind} ({shown}{more});")
            out.append("#   the policy governs tools/call only.")
    out += [
        'version: "1.0"',
        _q_line("description", f"Scaffolded from {ident}: {len(listing.tools)} tool(s), default deny"),
        "default_action: deny",
        "",
        "# Limits stated, not left to the defaults (an omitted key means what it means",
        "# in mcp-visor: 100 calls and one hour per session). A wrapped server often",
        "# runs for a whole editor session: 0 switches the budget and the timeout off.",
        "settings:",
        "  session_max_calls: 0",
        "  session_timeout_seconds: 0",
        "  approval_timeout_seconds: 120",
        "",
        "servers:",
        f"  - name: {_q(server_name)}",
        "    allowed: true",
    ]
    if not listing.tools:
        out.append("    # the server listed no tools")
        out.append("    tools: []")
        return "\n".join(out) + "\n"
    out.append("    tools:")
    for tool in listing.tools:
        plan = plan_tool(tool, packs, active, root)
        desc = _comment(str(tool.get("description", "")).split("\n", 1)[0], 90)
        if desc:
            # The server chose the name: flattened like the description, or a line break in it
            # (LF, CR, NEL, LS) would end the comment and make the rest of it policy.
            out.append(f"      # {_comment(plan.name)}: {_comment(desc)}")
        # The confinement root is the user's own path and the point of its line: never cut.
        out.extend(f"      #   {_comment(w, 110 + len(root))}" for w in plan.why)
        out.append(f"      - name: {_q(plan.name)}")
        out.append("        allowed: true")
        if plan.exfiltrating is not None:
            out.append(f"        exfiltrating: {'true' if plan.exfiltrating else 'false'}")
        if plan.sink_params:
            out.append(f"        sink_params: [{', '.join(map(_q, plan.sink_params))}]")
        if plan.write_params:
            out.append(f"        write_params: [{', '.join(map(_q, plan.write_params))}]")
        if plan.path_prefixes:
            out.append(f"        allowed_path_prefixes: [{', '.join(map(_q, plan.path_prefixes))}]")
    return "\n".join(out) + "\n"


def _q_line(key: str, value: str) -> str:
    return f"{key}: {_q(_comment(value, 200))}"


def guess_server_name(command: list[str]) -> str:
    """A name from the command: the package a launcher runs, else the program."""
    rest = list(command)
    if (rest and Path(rest[0]).name.lower() in _LAUNCHERS) or (rest and _is_python(rest[0])):
        rest = rest[1:]
        while rest and (rest[0].startswith("-") or rest[0] in _LAUNCHER_WORDS):
            rest = rest[2:] if rest[0] in _VALUE_OPTIONS else rest[1:]
    base = rest[0] if rest else command[0] if command else "server"
    base = base.rstrip("/").rsplit("/", 1)[-1]
    if "@" in base[1:]:
        base = base[: base.index("@", 1)]
    base = base.lstrip("@")
    for ext in (".py", ".js", ".mjs", ".ts"):
        base = base.removesuffix(ext)
    return base or "server"


def _is_python(cmd: str) -> bool:
    return re.fullmatch(r"python(\d+(\.\d+)?)?", Path(cmd).name.lower()) is not None


def _write_new(path: Path, text: str, force: bool) -> None:
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists; choose another -o or pass --force")
    from visor.userfiles import ensure_parent

    ensure_parent(path)
    folder = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def run_scaffold(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print(
            "visor policy scaffold: no server command; usage: ... scaffold [OPTIONS] -- COMMAND [ARGS...]",
            file=sys.stderr,
        )
        return 2
    name = args.server_name or guess_server_name(command)
    root = os.path.abspath(args.write_root or os.getcwd())
    try:
        listing = list_server(command, env=child_env(None), timeout=args.timeout)
    except ClientError as e:
        print(f"visor policy scaffold: {shlex.join(command)}: {e}", file=sys.stderr)
        return 1
    text = render_policy(listing, name, command, root)
    # A scaffold that does not load is a bug here, never the user's to find.
    load_policy_text(text, "<scaffold>")
    if args.output:
        try:
            _write_new(Path(args.output), text, args.force)
        except (OSError, FileExistsError) as e:
            print(f"visor policy scaffold: {e}", file=sys.stderr)
            return 1
        print(
            f"wrote {args.output}: {len(listing.tools)} tool(s) allowed for server {name!r}", file=sys.stderr
        )
    else:
        sys.stdout.write(text)
    print(
        f"note: the policy applies to `visor run --server-name {name}`; `visor init` uses the entry's name "
        f"in your client config, so they must match. Check it with `visor lint {args.output or 'FILE'}`.",
        file=sys.stderr,
    )
    return 0
