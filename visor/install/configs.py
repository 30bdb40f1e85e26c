"""MCP client configs: find the server entries, wrap them in `visor run`, undo it.

Everything here is text in, text out. A rewrite splices new text over the
spans of the entries it changes and leaves every other byte of the file alone,
so comments, key order, blank lines and the trailing newline survive, and an
undo right after a wrap gives back the original file exactly.

The original entry is kept *as text* (re-indented one level) under
``x-visor-upstream``: undo puts that text back, comments inside the entry
included. The wrapped entry keeps every other key of the original (``env``,
``cwd``, ``envFile``, ``type``, client settings such as ``disabled``), so the
client still gives the server its environment and still knows the entry; only
``command`` and ``args`` change.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from visor.http.headers import RESERVED as RESERVED_HEADERS
from visor.http.target import UrlError, check_url, display_url
from visor.install.jsonc import Document, JsoncError, Member, Node, parse

# Re-exported: `visor init` and `visor doctor` name them from here.
from visor.install.locations import Location as Location
from visor.install.locations import home_dir as home_dir
from visor.install.locations import known_locations as known_locations
from visor.install.locations import protected_config_paths as protected_config_paths

UPSTREAM_KEY = "x-visor-upstream"
_REMOTE_TYPES = frozenset({"http", "sse", "streamable-http", "streamablehttp", "ws", "websocket"})


class ConfigError(Exception):
    """A config Visor will not rewrite; the message names the file and what to do."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One server entry of a config."""

    block: tuple[str, ...]  # where its servers block is: ("mcpServers",), ("projects", P, "mcpServers")
    name: str
    member: Member
    kind: str  # "stdio" | "wrapped" | "seed" (wrapped by mcp-bouncer or mcp-visor) | "remote" | "other"
    note: str = ""

    @property
    def value(self) -> object:
        return self.member.value.value

    @property
    def fields(self) -> dict[str, object]:
        """The entry's members; empty when the entry is not an object."""
        v = self.member.value.value
        return v if isinstance(v, dict) else {}

    @property
    def label(self) -> str:
        return ".".join((*self.block, self.name)) if len(self.block) > 1 else self.name

    def summary(self) -> str:
        """The command line the entry runs, or its URL, shortened for a listing."""
        v = self.fields
        if self.kind == "remote":
            url = v.get("url", v.get("serverUrl"))
            # without user info or query values: they may hold a token
            return display_url(url) if isinstance(url, str) else str(v.get("type", ""))
        if self.kind == "wrapped":
            up = v.get(UPSTREAM_KEY)
            if isinstance(up, dict) and "url" in up and isinstance(up["url"], str):
                return f"--url {display_url(up['url'])}"
            src = real_server(up) if isinstance(up, dict) else v
        else:
            src = real_server(v)
        argv = command_line(src)
        text = shlex.join(argv) if argv else ""
        if self.kind == "seed":
            text = f"({self.note}) {text}"
        return text if len(text) <= 90 else text[:87] + "..."


@dataclass(frozen=True, slots=True)
class Config:
    path: str  # for messages only
    doc: Document
    entries: tuple[Entry, ...]
    blocks: tuple[tuple[str, ...], ...]


def command_line(entry: Mapping[str, object]) -> list[str]:
    cmd = entry.get("command")
    args = entry.get("args", [])
    if not isinstance(cmd, str) or not isinstance(args, list):
        return []
    return [cmd, *(str(a) for a in args)]


def _is_visor_command(entry: Mapping[str, object]) -> bool:
    cmd = entry.get("command")
    args = entry.get("args")
    if not isinstance(cmd, str) or not isinstance(args, list) or not args:
        return False
    base = cmd.replace("\\", "/").rsplit("/", 1)[-1].lower()
    return base in ("visor", "visor.exe") and args[0] == "run"


# ---------------------------------------------------- the seeds' wrappers

#: Where mcp-bouncer's `init` keeps the entry it replaced (command, args, env, cwd).
BOUNCER_KEY = "x-bouncer-upstream"
# mcp-visor's `serve` flags (Go flag syntax: -name value, -name=value, one or two dashes).
_MCP_VISOR_VALUE_FLAGS = frozenset(
    {
        "server",
        "server-arg",
        "session-id",
        "client-id",
        "policy",
        "audit-log",
        "approval-dir",
        "server-url",
        "webhook-url",
        "siem-target",
        "vault-addr",
        "metrics-addr",
        "otel-endpoint",
        "trace",
    }
)
_MCP_VISOR_BOOL_FLAGS = frozenset({"approval-cli", "demo", "dashboard"})


@dataclass(frozen=True, slots=True)
class Seed:
    """An entry wrapped by mcp-bouncer or mcp-visor, and the real server inside it."""

    tool: str  # "mcp-bouncer" | "mcp-visor"
    upstream: dict[str, object]  # the real server's entry: command, args, env, cwd, other keys
    policy: str | None  # the wrapper's own policy file, if it named one
    dropped: tuple[str, ...]  # the wrapper's other options, which Visor does not carry over


def _basename(cmd: str) -> str:
    return cmd.replace("\\", "/").rsplit("/", 1)[-1].lower()


def _outer(value: Mapping[str, object], *skip: str) -> dict[str, object]:
    return {k: v for k, v in value.items() if k not in ("command", "args", *skip)}


def _bouncer_seed(value: Mapping[str, object]) -> Seed | str:
    up = value.get(BOUNCER_KEY)
    if not isinstance(up, dict) or not isinstance(up.get("command"), str):
        return f"wrapped by mcp-bouncer, but {BOUNCER_KEY} has no command: restore the entry by hand"
    args = up.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        return f"wrapped by mcp-bouncer, but {BOUNCER_KEY}.args is not a list of strings"
    # the real entry: bouncer's copy, then what the client entry adds (type, disabled, ...)
    real: dict[str, object] = {"command": up["command"], "args": list(args)}
    real.update({k: v for k, v in up.items() if k not in ("command", "args")})
    real.update({k: v for k, v in _outer(value, BOUNCER_KEY).items() if k not in real})
    policy = None
    dropped: list[str] = []
    given = value.get("args")
    outer_args = given if isinstance(given, list) else []
    i = 0
    while i < len(outer_args):
        a = str(outer_args[i])
        if a == "--policy" and i + 1 < len(outer_args):
            policy = str(outer_args[i + 1])
            i += 2
            continue
        if a.startswith("--policy="):
            policy = a.split("=", 1)[1]
        elif a not in ("run",) and a.startswith("-") and a not in ("--upstream-name", "--config"):
            dropped.append(a)
        i += 1
    return Seed("mcp-bouncer", real, policy, tuple(dropped))


def _mcp_visor_seed(value: Mapping[str, object]) -> Seed | str:
    args = value.get("args")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        return "wrapped by mcp-visor, but args is not a list of strings"
    flags: dict[str, list[str]] = {}
    i = 1
    while i < len(args):
        a = args[i]
        if a == "--" or not a.startswith("-") or a == "-":
            return f"wrapped by mcp-visor with an argument Visor cannot place ({a!r}): unwrap it by hand"
        name, eq, val = a.lstrip("-").partition("=")
        if name in _MCP_VISOR_BOOL_FLAGS:
            flags.setdefault(name, []).append(val if eq else "true")
        elif name in _MCP_VISOR_VALUE_FLAGS:
            if not eq:
                if i + 1 >= len(args):
                    return f"wrapped by mcp-visor, but -{name} has no value"
                i += 1
                val = args[i]
            flags.setdefault(name, []).append(val)
        else:
            return f"wrapped by mcp-visor with an option Visor does not know (-{name}): unwrap it by hand"
        i += 1
    if "server-url" in flags or "demo" in flags:
        return "wrapped by mcp-visor for a remote server or its demo: not a stdio server Visor can wrap"
    server = flags.get("server", [""])[-1]
    if not server:
        return "wrapped by mcp-visor, but without -server: no server command to wrap"
    real: dict[str, object] = {"command": server, "args": list(flags.get("server-arg", []))}
    real.update(_outer(value))
    dropped = tuple(f"-{k}" for k in flags if k not in ("server", "server-arg", "policy"))
    policy = flags["policy"][-1] if "policy" in flags else None
    return Seed("mcp-visor", real, policy, dropped)


def seed_wrapper(value: object) -> Seed | str | None:
    """The seed wrapper around an entry (or why it cannot be unwrapped); None if there is none."""
    if not isinstance(value, dict):
        return None
    if BOUNCER_KEY in value:
        return _bouncer_seed(value)
    cmd, args = value.get("command"), value.get("args")
    if (
        isinstance(cmd, str)
        and _basename(cmd) in ("mcp-visor", "mcp-visor.exe")
        and isinstance(args, list)
        and args[:1] == ["serve"]
    ):
        return _mcp_visor_seed(value)
    return None


def real_server(value: object) -> dict[str, object]:
    """The server an entry runs in the end: inside a seed wrapper, the wrapped one."""
    seed = seed_wrapper(value)
    return seed.upstream if isinstance(seed, Seed) else value if isinstance(value, dict) else {}


def classify(value: object) -> tuple[str, str]:
    if not isinstance(value, dict):
        return "other", "not an object"
    if UPSTREAM_KEY in value:
        return "wrapped", ""
    if _is_visor_command(value):
        return "wrapped", f"wrapped by hand (no {UPSTREAM_KEY}: undo cannot restore it)"
    seed = seed_wrapper(value)
    if isinstance(seed, str):
        return "other", seed
    if seed is not None:
        return "seed", f"wrapped by {seed.tool}"
    kind = str(value.get("type", "")).lower()
    if "url" in value or "serverUrl" in value or kind in _REMOTE_TYPES:
        return "remote", remote_refusal(value) or ""
    if not isinstance(value.get("command"), str):
        return "other", "no command"
    args = value.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        return "other", "args is not a list of strings"
    return "stdio", ""


def _blocks(root: Node) -> list[tuple[tuple[str, ...], Node]]:
    """Every servers block this file has, in document order."""
    found: list[tuple[tuple[str, ...], Node]] = []
    for m in root.members:
        if m.key in ("mcpServers", "servers") and isinstance(m.value.value, dict):
            found.append(((m.key,), m.value))
        elif m.key == "mcp" and isinstance(m.value.value, dict):
            # VS Code user settings.json: "mcp": {"servers": {...}}
            inner = m.value.member("servers")
            if inner is not None and isinstance(inner.value.value, dict):
                found.append((("mcp", "servers"), inner.value))
        elif m.key == "projects" and isinstance(m.value.value, dict):
            # ~/.claude.json: per-project ("local scope") servers
            for p in m.value.members:
                inner = p.value.member("mcpServers") if isinstance(p.value.value, dict) else None
                if inner is not None and isinstance(inner.value.value, dict):
                    found.append((("projects", p.key, "mcpServers"), inner.value))
    return found


def _allows_comments(path: str, blocks: list[tuple[tuple[str, ...], Node]]) -> bool:
    """VS Code reads its MCP config as JSONC; the other clients use strict JSON."""
    parts = Path(path).parts
    if ".vscode" in parts or Path(path).name == "settings.json":
        return True
    return bool(blocks) and all(b[0] in ("servers", "mcp") for b, _ in blocks)


def load_text(text: str, path: str) -> Config:
    try:
        doc = parse(text)
    except JsoncError as e:
        raise ConfigError(
            f"{path}:{e.line}:{e.column}: not valid JSON: {e.message}; fix the file (it was not changed)"
        ) from None
    if not isinstance(doc.root.value, dict):
        raise ConfigError(f"{path}: the top level is not a JSON object; this is not an MCP client config")
    blocks = _blocks(doc.root)
    if doc.extensions and not _allows_comments(path, blocks):
        ext = doc.extensions[0]
        raise ConfigError(
            f"{path}:{ext.line}:{ext.column}: {ext.kind} in a strict JSON file: this client does not "
            f"accept it either; remove it and run again (the file was not changed)"
        )
    entries = [
        Entry(block, m.key, m, *classify(m.value.value)) for block, node in blocks for m in node.members
    ]
    return Config(path, doc, tuple(entries), tuple(b for b, _ in blocks))


# ------------------------------------------------------------- formatting


def _newline(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


def _line_indent(text: str, offset: int) -> str:
    start = text.rfind("\n", 0, offset) + 1
    line = text[start:offset]
    return line[: len(line) - len(line.lstrip(" \t"))]


def detect_indent(text: str) -> str:
    """The file's indentation unit: a tab, or the smallest step of spaces (default two)."""
    steps: list[int] = []
    for line in text.splitlines():
        stripped = line.lstrip(" \t")
        if not stripped or len(stripped) == len(line):
            continue
        lead = line[: len(line) - len(stripped)]
        if lead.startswith("\t"):
            return "\t"
        steps.append(len(lead))
    return " " * min(steps) if steps else "  "


def _entry_unit(text: str, node: Node, entry_indent: str) -> str:
    """The indentation step inside this entry, else the file's."""
    for m in node.members:
        inner = _line_indent(text, m.key_start)
        if inner.startswith(entry_indent) and len(inner) > len(entry_indent):
            return inner[len(entry_indent) :]
    return detect_indent(text)


def _shift(text: str, prefix: str) -> str:
    """Add `prefix` to every non-empty line after the first."""
    lines = text.split("\n")
    return "\n".join([lines[0], *(prefix + ln if ln not in ("", "\r") else ln for ln in lines[1:])])


def _unshift(text: str, prefix: str) -> str:
    lines = text.split("\n")
    if not prefix:
        return text
    return "\n".join([lines[0], *(ln[len(prefix) :] if ln.startswith(prefix) else ln for ln in lines[1:])])


def _dump(value: object, indent: str | None, depth_indent: str, nl: str) -> str:
    if indent is None:
        return json.dumps(value, ensure_ascii=False)
    text = _shift(json.dumps(value, ensure_ascii=False, indent=indent), depth_indent)
    return text.replace("\n", nl)


# ------------------------------------------------------------- wrap / undo


@dataclass(frozen=True, slots=True)
class WrapOptions:
    visor_command: str = "visor"
    policy: str | None = None  # absolute path, or None for the embedded default
    approval_dir: str | None = None  # absolute path
    pin_dir: str | None = None  # absolute path: each server's pins in PIN_DIR/<name>.json
    pin_path: str | None = None  # an entry's own pin file, kept as it was written
    signing_key: str | None = None  # absolute path: the audit log's Ed25519 signing key

    def pin_file(self, name: str) -> str | None:
        if self.pin_path:
            return self.pin_path
        if not self.pin_dir:
            return None
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).lstrip(".") or "server"
        return os.path.join(self.pin_dir, f"{safe}.json")


def visor_args(
    name: str, upstream: list[str], policy: str | None, options: WrapOptions | None = None
) -> list[str]:
    args = ["run", "--server-name", name]
    if policy:
        args += ["--policy", policy]
    if options is not None:
        if options.approval_dir:
            args += ["--approval-dir", options.approval_dir]
        pin = options.pin_file(name)
        if pin:
            args += ["--pin-file", pin]
        if options.signing_key:
            args += ["--signing-key", options.signing_key]
    return [*args, "--", *upstream]


# `visor run` options `visor init` writes, and so may rewrite on a later run.
MANAGED_OPTIONS = ("--server-name", "--policy", "--approval-dir", "--pin-file", "--signing-key")


@dataclass(frozen=True, slots=True)
class Update:
    """What a re-run of `visor init` changes in entries it wrapped before (None: keep)."""

    visor_command: str | None = None
    policy: str | None = None
    approval_dir: str | None = None
    pin_dir: str | None = None
    no_pin_file: bool = False
    signing_key: str | None = None

    @property
    def any(self) -> bool:
        return any(
            (
                self.visor_command,
                self.policy,
                self.approval_dir,
                self.pin_dir,
                self.no_pin_file,
                self.signing_key,
            )
        )


def current_options(entry: Mapping[str, object]) -> tuple[dict[str, str], list[str]] | None:
    """The managed options of a wrapped entry, and any other option (None if unreadable)."""
    split = wrapped_run_args(entry)
    if split is None:
        return None
    options, _ = split
    remote = _is_remote_original(entry.get(UPSTREAM_KEY))
    managed: dict[str, str] = {}
    other: list[str] = []
    i = 0
    while i < len(options):
        opt = options[i]
        key, eq, value = opt.partition("=")
        if key in ("--url", "--header") and remote:
            # written from the remote original on every rewrap, not an option to carry over
            i += 1 if eq else 2
            continue
        if key in MANAGED_OPTIONS:
            if not eq:
                if i + 1 >= len(options):
                    return None
                value = options[i + 1]
                i += 1
            managed[key] = value
        else:
            other.append(opt)
        i += 1
    return managed, other


def _updated_options(e: Entry, update: Update) -> tuple[WrapOptions | None, str]:
    """The options to re-wrap `e` with, or (None, why it is left alone)."""
    value = e.fields
    up = value.get(UPSTREAM_KEY)
    found = current_options(value)
    if found is None:
        return None, "already wrapped; its visor run options cannot be read, left alone"
    managed, other = found
    if other:
        return None, (
            f"already wrapped with options `visor init` does not write ({' '.join(other)}); "
            f"left alone: edit it by hand, or `visor init --undo --server {e.name}` and wrap again"
        )
    extra = {k: v for k, v in value.items() if k not in ("command", "args", UPSTREAM_KEY)}
    if _is_remote_original(up):
        assert isinstance(up, dict)
        as_wrapped = remote_wrapped_value(up, e.name, WrapOptions())
        original = {k: v for k, v in as_wrapped.items() if k not in ("command", "args")}
    else:
        original = {k: v for k, v in real_server(up).items() if k not in ("command", "args")}
    if extra != original:
        return None, (
            "already wrapped, and edited since (its keys differ from the original's); left alone: "
            f"`visor init --undo --server {e.name}` and wrap again"
        )
    keep_pin = None if update.no_pin_file or update.pin_dir else managed.get("--pin-file")
    options = WrapOptions(
        visor_command=update.visor_command or str(value["command"]),
        policy=update.policy or managed.get("--policy"),
        approval_dir=update.approval_dir or managed.get("--approval-dir"),
        pin_dir=None if update.no_pin_file else update.pin_dir,
        pin_path=keep_pin,
        signing_key=update.signing_key or managed.get("--signing-key"),
    )
    return options, ""


def wrapped_value(entry: dict[str, object], name: str, options: WrapOptions) -> dict[str, object]:
    """The wrapped entry as data (what the wrapped text parses to)."""
    out: dict[str, object] = {}
    for k, v in entry.items():
        if k == "command":
            out["command"] = options.visor_command
            out["args"] = visor_args(name, command_line(entry), options.policy, options)
        elif k != "args":
            out[k] = v
    out[UPSTREAM_KEY] = entry
    return out


def _seed_wrapped_text(text: str, entry: Entry, options: WrapOptions) -> str:
    """A seed-wrapped entry wrapped around the real server inside it.

    The new members are written from data (the real server came out of the
    seed's wrapper, not from text in this place); the seed's entry is kept
    verbatim under x-visor-upstream, so undo gives back exactly that.
    """
    real = real_server(entry.value)
    return _data_wrapped_text(text, entry, wrapped_value(real, entry.name, options))


def _data_wrapped_text(text: str, entry: Entry, members: Mapping[str, object]) -> str:
    """`members` written as the entry, in the file's layout, with the original under x-visor-upstream."""
    node = entry.member.value
    original = text[node.start : node.end]
    nl = _newline(text)
    multiline = "\n" in original
    outer = _line_indent(text, entry.member.key_start)
    unit = _entry_unit(text, node, outer) if multiline else ""
    inner = outer + unit
    if multiline and node.members:
        first = _line_indent(text, node.members[0].key_start)
        if first.startswith(outer) and len(first) > len(outer):
            inner, unit = first, first[len(outer) :]
    parts = [
        f"{json.dumps(k, ensure_ascii=False)}: {_dump(v, unit if multiline else None, inner, nl)}"
        for k, v in members.items()
        if k != UPSTREAM_KEY
    ]
    if not multiline:
        parts.append(f'"{UPSTREAM_KEY}": {original}')
        return "{" + ", ".join(parts) + "}"
    parts.append(f'"{UPSTREAM_KEY}": {_shift(original, unit)}')
    return "{" + nl + ("," + nl).join(inner + p for p in parts) + nl + outer + "}"


# --------------------------------------------------------- remote entries

#: A remote entry's header values move to the wrapped entry's ``env`` under these names, and its
#: args say ``--header 'Name: ${VISOR_HEADER_NAME}'``: `visor run` reads the value from the
#: environment the client starts it in, so a token is never on a command line (``ps``, logs).
HEADER_ENV_PREFIX = "VISOR_HEADER_"
# What a client's `type` says for Streamable HTTP (none: the client infers it from the url).
_STREAMABLE_TYPES = frozenset({"", "http", "streamable-http", "streamablehttp"})
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def header_env_name(header: str) -> str:
    return HEADER_ENV_PREFIX + re.sub(r"[^A-Z0-9]", "_", header.upper())


def remote_refusal(value: Mapping[str, object]) -> str | None:
    """Why a remote entry is not wrapped (the listing says it), or None when `visor run --url` can take it."""
    kind = str(value.get("type", "")).lower()
    url = value.get("url")
    if url is None:
        return "remote server without a url key (serverUrl, or a type only): not rewritten; wrap it by hand"
    if kind == "sse":
        return (
            "legacy HTTP+SSE server (type sse): `visor run --url` speaks Streamable HTTP only; left alone, "
            "not protected"
        )
    if kind not in _STREAMABLE_TYPES:
        return f"remote server of type {kind!r}: not a transport Visor speaks; left alone, not protected"
    if "command" in value:
        return "has both url and command: unclear which the client runs; left alone"
    if not isinstance(url, str):
        return "url is not a string; left alone"
    if "${" in url:
        return (
            "the url holds a ${...} placeholder the client fills in; `visor run --url` needs the URL itself"
        )
    try:
        check_url(url)
    except UrlError as exc:
        return f"{exc}; left alone"
    if not kind and url.split("?", 1)[0].rstrip("/").endswith("/sse"):
        return (
            'no type, and the url ends in /sse (the legacy HTTP+SSE endpoint): left alone; add "type": '
            '"http" if it is Streamable HTTP'
        )
    headers = value.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        return "headers is not an object of strings; left alone"
    env = value.get("env", {})
    if not isinstance(env, dict):
        return "env is not an object; left alone"
    names: set[str] = set()
    for header in headers:
        if not _HEADER_NAME.fullmatch(header):
            return f"header name {header!r} is not a valid HTTP field name; left alone"
        if header.lower() in RESERVED_HEADERS or header.lower().startswith("mcp-param-"):
            return f"header {header} is one Visor sets itself from the protocol; left alone"
        var = header_env_name(header)
        if var in names or var in env:
            return f"two headers (or env) would share the variable {var}; left alone"
        names.add(var)
    return None


def remote_run_args(name: str, entry: Mapping[str, object], options: WrapOptions) -> list[str]:
    """`run [options] --url URL --header 'Name: ${VISOR_HEADER_NAME}'...` for a remote entry."""
    head = visor_args(name, [], options.policy, options)
    assert head[-1] == "--"
    args = [*head[:-1], "--url", str(entry["url"])]
    headers = entry.get("headers", {})
    assert isinstance(headers, dict)
    for header in headers:
        args += ["--header", f"{header}: ${{{header_env_name(header)}}}"]
    return args


def remote_wrapped_value(entry: Mapping[str, object], name: str, options: WrapOptions) -> dict[str, object]:
    """A remote entry as the stdio entry that runs `visor run --url` (key order kept)."""
    headers = entry.get("headers", {})
    assert isinstance(headers, dict)
    moved = {header_env_name(h): v for h, v in headers.items()}
    out: dict[str, object] = {}
    for k, v in entry.items():
        if k == "url":
            out["command"] = options.visor_command
            out["args"] = remote_run_args(name, entry, options)
            if moved and "env" not in entry:
                out["env"] = moved
        elif k == "env":
            assert isinstance(v, dict)
            out["env"] = {**v, **moved}
        elif k == "type":
            out["type"] = "stdio"  # the client now starts a process; it no longer connects
        elif k != "headers":
            out[k] = v
    return out


def header_values(entry: Mapping[str, object]) -> list[str]:
    """The header values of a remote entry, or of the remote original of a wrapped one."""
    up = entry.get(UPSTREAM_KEY)
    src = up if isinstance(up, dict) else entry
    headers = src.get("headers")
    if not isinstance(headers, dict):
        return []
    return [v for v in headers.values() if isinstance(v, str) and v]


def _is_remote_original(value: object) -> bool:
    return isinstance(value, dict) and "url" in value and "command" not in value


def _wrapped_text(text: str, entry: Entry, options: WrapOptions) -> str:
    """The wrapped entry's text: same key order, other members copied verbatim."""
    if entry.kind == "seed":
        return _seed_wrapped_text(text, entry, options)
    if entry.kind == "remote":
        return _data_wrapped_text(text, entry, remote_wrapped_value(entry.fields, entry.name, options))
    node = entry.member.value
    original = text[node.start : node.end]
    nl = _newline(text)
    members = node.members
    old_args = node.member("args")
    new_args = visor_args(entry.name, command_line(entry.fields), options.policy, options)
    multiline = "\n" in original
    outer = _line_indent(text, entry.member.key_start)
    unit = _entry_unit(text, node, outer) if multiline else ""
    inner = outer + unit
    if multiline and members:
        first = _line_indent(text, members[0].key_start)
        if first.startswith(outer) and len(first) > len(outer):
            inner, unit = first, first[len(outer) :]
    # args keep their old layout: one line if they were on one line
    args_multiline = multiline and (
        old_args is None or "\n" in text[old_args.value.start : old_args.value.end]
    )
    args_text = _dump(new_args, unit if args_multiline else None, inner, nl)

    parts: list[str] = []
    for m in members:
        if m.key == "command":
            parts.append(f'"command": {json.dumps(options.visor_command, ensure_ascii=False)}')
            if old_args is None:
                parts.append(f'"args": {args_text}')
        elif m.key == "args":
            parts.append(f'"args": {args_text}')
        else:
            parts.append(text[m.key_start : m.value.end])
    if not multiline:
        parts.append(f'"{UPSTREAM_KEY}": {original}')
        return "{" + ", ".join(parts) + "}"
    parts.append(f'"{UPSTREAM_KEY}": {_shift(original, unit)}')
    return "{" + nl + ("," + nl).join(inner + p for p in parts) + nl + outer + "}"


def _unwrapped_text(text: str, entry: Entry) -> str:
    up = entry.member.value.member(UPSTREAM_KEY)
    assert up is not None
    outer = _line_indent(text, entry.member.key_start)
    inner = _line_indent(text, up.key_start)
    same_line = "\n" not in text[entry.member.key_start : up.key_start]
    unit = inner[len(outer) :] if inner.startswith(outer) and not same_line else ""
    return _unshift(text[up.value.start : up.value.end], unit)


def _rewrap_text(text: str, entry: Entry, options: WrapOptions, config_path: str) -> str | None:
    """The entry wrapped again from its original, at the same place in the file."""
    node = entry.member.value
    original = _unwrapped_text(text, entry)
    unwrapped = text[: node.start] + original + text[node.end :]
    try:
        again = load_text(unwrapped, config_path)
    except ConfigError:
        return None
    match = next(
        (
            x
            for x in again.entries
            if x.block == entry.block
            and x.name == entry.name
            and (x.kind in ("stdio", "seed") or (x.kind == "remote" and remote_refusal(x.fields) is None))
        ),
        None,
    )
    if match is None:
        return None
    inner = match.member.value
    return _wrapped_text(unwrapped, match, options) if inner.start == node.start else None


def _splice(text: str, edits: list[tuple[int, int, str]]) -> str:
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text


@dataclass(frozen=True, slots=True)
class Plan:
    """What a rewrite does: the new text and, per entry, what happened to it."""

    text: str
    changed: tuple[Entry, ...]
    skipped: tuple[tuple[Entry, str], ...]

    @property
    def changes(self) -> bool:
        return bool(self.changed)


def select(config: Config, names: list[str] | None) -> list[Entry]:
    if not names:
        return list(config.entries)
    known = {e.name for e in config.entries}
    missing = [n for n in names if n not in known]
    if missing:
        have = ", ".join(sorted(known)) or "none"
        raise ConfigError(f"{config.path}: no server named {', '.join(map(repr, missing))} (servers: {have})")
    return [e for e in config.entries if e.name in names]


def plan_wrap(
    config: Config, names: list[str] | None, options: WrapOptions, update: Update | None = None
) -> Plan:
    """Wrap the stdio entries; with `update`, also rewrite the `visor run` options of wrapped ones.

    A wrapped entry is re-wrapped from its x-visor-upstream original, so the
    result is what wrapping the original with the new options gives (and
    undo still restores the original exactly).
    """
    text = config.doc.text
    edits: list[tuple[int, int, str]] = []
    changed: list[Entry] = []
    skipped: list[tuple[Entry, str]] = []
    for e in select(config, names):
        if e.kind == "stdio":
            node = e.member.value
            edits.append((node.start, node.end, _wrapped_text(text, e, options)))
            changed.append(e)
        elif e.kind == "remote":
            why = remote_refusal(e.fields)
            if why is not None:
                skipped.append((e, why))
                continue
            node = e.member.value
            edits.append((node.start, node.end, _wrapped_text(text, e, options)))
            changed.append(e)
        elif e.kind == "seed":
            seed = seed_wrapper(e.value)
            assert isinstance(seed, Seed)
            if seed.policy and not options.policy:
                # Wrapping with the default policy would drop the seed's own rules: not silently.
                how = (
                    f"visor policy import --from bouncer {seed.policy} -o NEW.yaml"
                    if seed.tool == "mcp-bouncer"
                    else f"visor policy import --from mcp-visor {seed.policy} -o NEW.yaml"
                )
                skipped.append(
                    (
                        e,
                        f"{e.note} with its policy {seed.policy}; left alone: convert it (`{how}`) "
                        "and run init again with --policy NEW.yaml",
                    )
                )
                continue
            node = e.member.value
            edits.append((node.start, node.end, _wrapped_text(text, e, options)))
            changed.append(e)
        elif (
            update is not None
            and update.any
            and e.kind == "wrapped"
            and _is_visor_command(e.fields)
            and isinstance(e.fields.get(UPSTREAM_KEY), dict)
        ):
            new_options, why = _updated_options(e, update)
            if new_options is None:
                skipped.append((e, why))
                continue
            rewrapped = _rewrap_text(text, e, new_options, config.path)
            node = e.member.value
            if rewrapped is None or rewrapped == text[node.start : node.end]:
                skipped.append((e, "already wrapped with these options"))
                continue
            edits.append((node.start, node.end, rewrapped))
            changed.append(e)
        elif e.kind == "wrapped" and not _is_visor_command(e.fields):
            # The marker is there, the protection is not: someone edited the
            # command. Saying "already wrapped" here would hide that.
            skipped.append(
                (
                    e,
                    f"NOT PROTECTED: has {UPSTREAM_KEY} but its command is not `visor run`; "
                    f"run `visor init --undo --server {e.name}`, then wrap it again",
                )
            )
        elif e.kind == "wrapped":
            skipped.append((e, "already wrapped; left alone"))
        else:
            skipped.append((e, e.note))
    return Plan(_splice(text, edits), tuple(changed), tuple(skipped))


def plan_undo(config: Config, names: list[str] | None) -> Plan:
    text = config.doc.text
    edits: list[tuple[int, int, str]] = []
    changed: list[Entry] = []
    skipped: list[tuple[Entry, str]] = []
    for e in select(config, names):
        up = e.member.value.member(UPSTREAM_KEY) if e.kind == "wrapped" else None
        if up is not None and isinstance(up.value.value, dict):
            node = e.member.value
            edits.append((node.start, node.end, _unwrapped_text(text, e)))
            changed.append(e)
        elif e.kind == "wrapped":
            skipped.append((e, e.note or f"{UPSTREAM_KEY} is not an object; restore it by hand"))
        else:
            skipped.append((e, "not wrapped"))
    return Plan(_splice(text, edits), tuple(changed), tuple(skipped))


def wrapped_run_args(entry: Mapping[str, object]) -> tuple[list[str], list[str]] | None:
    """``(visor run options, upstream argv)`` of a wrapped entry, split at ``--``."""
    if not _is_visor_command(entry):
        return None
    given = entry["args"]
    assert isinstance(given, list)  # _is_visor_command checked it
    args = [str(a) for a in given[1:]]
    if "--" not in args:
        return args, []
    i = args.index("--")
    return args[:i], args[i + 1 :]
