"""YAML -> Policy, strictly: the sections of a policy and of a pack.

The YAML is composed into nodes (which keep their line numbers) and read by a
small typed reader (visor/policy/reader.py): unknown keys, duplicate keys,
wrong scalar types, negative numbers, bad regexes and missing required keys
are all errors that name the file, the line and the key path. A tool's
``rules:`` are read by their rule type (visor/policy/ruletypes.py). Nothing is
defaulted silently where the mcp-visor loader would have read a missing
``allowed`` as false. The loaded policy carries its evaluation plan, compiled
here once.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

from visor import redact
from visor.policy import destinations as dst
from visor.policy import fields, paths
from visor.policy.evaluate import compile_policy
from visor.policy.reader import TAG, Reader, compose, kind_of
from visor.policy.reader import PolicyError as PolicyError
from visor.policy.ruletypes import build_plan as build_plan
from visor.policy.ruletypes import build_screens as build_screens
from visor.policy.ruletypes import read_rule
from visor.policy.schema import (
    ATTESTATION_KINDS,
    AccessList,
    Action,
    Attestation,
    ChainMatch,
    EgressControl,
    Glob,
    Identity,
    Pack,
    Policy,
    Redaction,
    RedactionPattern,
    ServerPolicy,
    Settings,
    Taint,
    TimeRestriction,
    TimeWindow,
    ToolChain,
    ToolPolicy,
)

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

_DAYS = {
    "monday": 1,
    "tuesday": 2,
    "wednesday": 3,
    "thursday": 4,
    "friday": 5,
    "saturday": 6,
    "sunday": 7,
    "mon": 1,
    "tue": 2,
    "wed": 3,
    "thu": 4,
    "fri": 5,
    "sat": 6,
    "sun": 7,
}
_HINTS = {
    ("server", "rules"): "rules belong to a tool entry under tools:, not to the server",
    ("server", "risk"): "risk belongs to a tool entry under tools:, not to the server",
    ("server", "approval_required"): "approval_required belongs to a tool entry under tools:",
    ("server", "exfiltrating"): "exfiltrating belongs to a tool entry under tools:",
    ("server", "max_calls"): "max_calls belongs to a tool entry under tools:",
    ("tool", "tools"): "tools: belongs to a server entry",
    ("tool", "patterns"): "patterns belong to a rule under rules:",
}


# ----------------------------------------------------------------- sections

_TOP = frozenset(
    {
        "version",
        "description",
        "default_action",
        "settings",
        "servers",
        "tool_chains",
        "taints",
        "egress_controls",
        "identities",
        "time_restrictions",
        "redaction",
    }
)
_SETTINGS = frozenset(
    {
        "max_argument_size_bytes",
        "max_output_size_bytes",
        "session_max_tools",
        "session_max_calls",
        "session_timeout_seconds",
        "approval_timeout_seconds",
        "chain_window_size",
        "log_level",
        "identity",
        "packs",
        "sensitive_paths",
        "output_index_max_keys",
        "untrusted_output",
    }
)
_SERVER = frozenset(
    {
        "name",
        "transport",
        "allowed",
        "allowed_destinations",
        "denied_destinations",
        "description",
        "tools",
        "packs",
        "resources",
        "prompts",
        "server_requests",
        "hide_denied_tools",
        "attestation",
    }
)
_SERVER_REQUESTS = ("sampling", "elicitation", "sampling_tools")
_TOOL_COMMON = frozenset(
    {
        "name",
        "description",
        "exfiltrating",
        "sink_params",
        "sink_kinds",
        "trusted_destinations",
        "write_params",
        "allowed_path_prefixes",
        "arg_patterns",
        "max_calls",
        "trusted_output_fields",
        "sender_fields",
    }
)
_TOOL = _TOOL_COMMON | {"allowed", "risk", "approval_required", "approval", "rules", "untrusted_output"}
#: `untrusted_output:` of a tool or of settings: what a destination seen in output gets.
UNTRUSTED_OUTPUT_MODES = ("deny", "ask")
#: A tool's `approval:` key: which channels may answer its asks.
APPROVAL_MODES = ("any", "out_of_band")
_ACTIONS = ("deny", "require_approval", "ask", "allow")
_RISKS = ("low", "medium", "high", "critical", "unknown")


def _action(r: Reader, node: Node, key: str, allow_allow: bool = True) -> Action:
    choices = _ACTIONS if allow_allow else _ACTIONS[:3]
    value = r.choice(node, key, choices)
    return "ask" if value in ("require_approval", "ask") else "deny" if value == "deny" else "allow"


#: Settings whose explicit 0 means "no limit" (mcp-visor checks them only when > 0).
_ZERO_IS_OFF = frozenset({"session_max_calls", "session_timeout_seconds", "max_output_size_bytes"})


def _settings(r: Reader, node: Node) -> Settings:
    m = r.mapping(node, "settings", _SETTINGS, kind="settings")
    kw: dict[str, Any] = {}
    if "session_max_tools" in m and "session_max_calls" in m:
        r.fail(
            m["session_max_calls"],
            "settings.session_max_calls",
            "give session_max_tools or session_max_calls, not both",
        )
    for key, field_name in (
        ("max_argument_size_bytes", "max_argument_size_bytes"),
        ("max_output_size_bytes", "max_output_size_bytes"),
        ("session_max_tools", "session_max_calls"),
        ("session_max_calls", "session_max_calls"),
        ("session_timeout_seconds", "session_timeout_seconds"),
        ("approval_timeout_seconds", "approval_timeout_seconds"),
        ("chain_window_size", "chain_window_size"),
        ("output_index_max_keys", "output_index_max_keys"),
    ):
        if key in m:
            value = r.int_(m[key], f"settings.{key}")
            if value == 0:
                # As in mcp-visor (whose runtime checks read `> 0`), an explicit 0
                # switches a limit off; for the other settings 0 keeps the default.
                if field_name in _ZERO_IS_OFF:
                    kw[field_name] = None
                continue
            kw[field_name] = value
    if "log_level" in m:
        kw["log_level"] = r.choice(
            m["log_level"], "settings.log_level", ("debug", "info", "warn", "warning", "error")
        )
    if "identity" in m:
        kw["identity"] = r.str_(m["identity"], "settings.identity")
    if "packs" in m:
        names = r.strs(m["packs"], "settings.packs")
        available = _packs()
        for i, name in enumerate(names):
            if name not in available:
                r.fail(
                    m["packs"].value[i],
                    f"settings.packs[{i}]",
                    f"unknown pack {name!r}; built-in: {', '.join(sorted(available))}",
                )
        kw["packs"] = names
    if "untrusted_output" in m:
        kw["untrusted_output"] = r.choice(
            m["untrusted_output"], "settings.untrusted_output", UNTRUSTED_OUTPUT_MODES
        )
    if "sensitive_paths" in m:
        kw["sensitive_paths"] = tuple(
            r.glob(n, f"settings.sensitive_paths[{i}]")
            for i, n in enumerate(r.list_(m["sensitive_paths"], "settings.sensitive_paths"))
        )
    return Settings(**kw)


def _sink_kinds(r: Reader, node: Node, key: str, sinks: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``sink_kinds: {user: user, channel: none}``: argument name to the kind it names."""
    if not isinstance(node, MappingNode):
        r.fail(node, key, f"expected a mapping of argument name to kind, got {kind_of(node)}")
    names = {k.value for k, _ in node.value if isinstance(k, ScalarNode)}
    out: list[tuple[str, str]] = []
    for arg, v in r.mapping(node, key, names).items():
        kind = r.choice(v, f"{key}.{arg}", dst.SINK_KINDS)
        if kind == "none" and arg in sinks:
            r.fail(v, f"{key}.{arg}", f"argument {arg!r} is in sink_params: it cannot also be 'none'")
        out.append((arg, kind))
    return tuple(out)


def _tool(r: Reader, node: Node, key: str, origin: str, in_pack: bool) -> ToolPolicy:
    allowed_keys = _TOOL_COMMON | {"arguments"} if in_pack else _TOOL
    required = ("name",) if in_pack else ("name", "allowed")
    m = r.mapping(node, key, allowed_keys, required, kind="pack tool" if in_pack else "tool")
    name = r.str_(m["name"], f"{key}.name")
    kw: dict[str, Any] = {"name": name, "origin": origin, "line": node.start_mark.line + 1}
    if "allowed" in m:
        kw["allowed"] = r.bool_(m["allowed"], f"{key}.allowed")
    if "risk" in m:
        kw["risk"] = r.choice(m["risk"], f"{key}.risk", _RISKS)
    if "approval_required" in m:
        kw["approval_required"] = r.bool_(m["approval_required"], f"{key}.approval_required")
    if "approval" in m:
        kw["approval"] = r.choice(m["approval"], f"{key}.approval", APPROVAL_MODES)
    if "description" in m:
        kw["description"] = r.str_(m["description"], f"{key}.description", nonempty=False)
    if "rules" in m:
        kw["rules"] = tuple(
            read_rule(r, n, f"{key}.rules[{i}]") for i, n in enumerate(r.list_(m["rules"], f"{key}.rules"))
        )
    if "exfiltrating" in m:
        kw["exfiltrating"] = r.bool_(m["exfiltrating"], f"{key}.exfiltrating")
    for k in ("sink_params", "write_params"):
        if k in m:
            kw[k] = r.strs(m[k], f"{key}.{k}")
    if "sink_kinds" in m:
        kw["sink_kinds"] = _sink_kinds(r, m["sink_kinds"], f"{key}.sink_kinds", kw.get("sink_params", ()))
    if "trusted_destinations" in m:
        kw["trusted_destinations"] = r.strs(m["trusted_destinations"], f"{key}.trusted_destinations")
    if "allowed_path_prefixes" in m:
        pkey = f"{key}.allowed_path_prefixes"
        prefixes: list[str] = []
        alts: list[str] = []
        for i, n in enumerate(r.list_(m["allowed_path_prefixes"], pkey)):
            p = r.str_(n, f"{pkey}[{i}]")
            if not p.startswith("/"):
                r.fail(
                    n,
                    f"{pkey}[{i}]",
                    f"path prefix {p!r} must be absolute (a relative prefix would depend on where the client starts Visor)",
                )
            norm = paths.normalise(p)
            prefixes.append(norm)
            real = os.path.realpath(norm)
            if real != norm:
                alts.append(real)
        kw["allowed_path_prefixes"] = tuple(prefixes)
        kw["prefix_alts"] = tuple(alts)
    if "arg_patterns" in m:
        akey = f"{key}.arg_patterns"
        am = m["arg_patterns"]
        if not isinstance(am, MappingNode):
            r.fail(am, akey, f"expected a mapping of argument name to regex, got {kind_of(am)}")
        names = {k.value for k, _ in am.value if isinstance(k, ScalarNode)}
        amap = r.mapping(am, akey, names)
        kw["arg_patterns"] = tuple((a, r.regex(v, f"{akey}.{a}")) for a, v in amap.items())
    if "max_calls" in m:
        kw["max_calls"] = r.int_(m["max_calls"], f"{key}.max_calls")
    if "arguments" in m:
        kw["arguments"] = r.strs(m["arguments"], f"{key}.arguments")
    for k in ("trusted_output_fields", "sender_fields"):
        if k in m:
            fkey = f"{key}.{k}"
            compiled = []
            for i, n in enumerate(r.list_(m[k], fkey)):
                text = r.str_(n, f"{fkey}[{i}]")
                try:
                    compiled.append(fields.compile_path(text))
                except ValueError as e:
                    r.fail(n, f"{fkey}[{i}]", f"not a field path: {e}")
            kw[k] = tuple(compiled)
    if "untrusted_output" in m:
        kw["untrusted_output"] = r.choice(
            m["untrusted_output"], f"{key}.untrusted_output", UNTRUSTED_OUTPUT_MODES
        )
    kw["screens"] = build_screens(kw.get("rules", ()))
    kw["plan"] = build_plan(kw.get("rules", ()))
    return ToolPolicy(**kw)


def _server(r: Reader, node: Node, key: str) -> ServerPolicy:
    m = r.mapping(node, key, _SERVER, ("name", "allowed"), kind="server")
    name = r.str_(m["name"], f"{key}.name")
    tools: dict[str, ToolPolicy] = {}
    for i, n in enumerate(r.list_(m["tools"], f"{key}.tools") if "tools" in m else []):
        t = _tool(r, n, f"{key}.tools[{i}]", "policy", in_pack=False)
        if t.name in tools:
            r.fail(n, f"{key}.tools[{i}].name", f"duplicate tool {t.name!r} in server {name!r}")
        tools[t.name] = t
    packs = None
    if "packs" in m:
        packs = r.strs(m["packs"], f"{key}.packs")
        for i, p in enumerate(packs):
            if p not in _packs():
                r.fail(
                    m["packs"].value[i],
                    f"{key}.packs[{i}]",
                    f"unknown pack {p!r}; built-in: {', '.join(sorted(_packs()))}",
                )
    return ServerPolicy(
        name=name,
        allowed=r.bool_(m["allowed"], f"{key}.allowed"),
        transport=r.str_(m["transport"], f"{key}.transport") if "transport" in m else None,
        description=r.str_(m["description"], f"{key}.description", nonempty=False)
        if "description" in m
        else "",
        allowed_destinations=r.strs(m["allowed_destinations"], f"{key}.allowed_destinations")
        if "allowed_destinations" in m
        else (),
        denied_destinations=r.strs(m["denied_destinations"], f"{key}.denied_destinations")
        if "denied_destinations" in m
        else (),
        packs=packs,
        tools=tools,
        line=node.start_mark.line + 1,
        resources=_access_list(r, m["resources"], f"{key}.resources") if "resources" in m else None,
        prompts=_access_list(r, m["prompts"], f"{key}.prompts") if "prompts" in m else None,
        server_requests=_server_requests(r, m["server_requests"], f"{key}.server_requests")
        if "server_requests" in m
        else {},
        hide_denied_tools=r.bool_(m["hide_denied_tools"], f"{key}.hide_denied_tools")
        if "hide_denied_tools" in m
        else False,
        attestation=_attestation(r, m["attestation"], f"{key}.attestation") if "attestation" in m else None,
    )


_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _attestation(r: Reader, node: Node, key: str) -> Attestation:
    """``{kind, digest, entry_arg_positions}``, validated as mcp-visor validates it."""
    m = r.mapping(
        node, key, {"kind", "digest", "entry_arg_positions"}, ("kind", "digest"), kind="attestation"
    )
    kind = r.str_(m["kind"], f"{key}.kind")
    if kind not in ATTESTATION_KINDS:
        r.fail(
            m["kind"],
            f"{key}.kind",
            f"unsupported attestation kind {kind!r}; supported: {', '.join(ATTESTATION_KINDS)}",
        )
    digest = r.str_(m["digest"], f"{key}.digest")
    if _DIGEST.fullmatch(digest) is None:
        r.fail(m["digest"], f"{key}.digest", f"must be sha256:<64 lower-case hex digits>, got {digest!r}")
    positions: list[int] = []
    if "entry_arg_positions" in m:
        pkey = f"{key}.entry_arg_positions"
        for i, n in enumerate(r.list_(m["entry_arg_positions"], pkey)):
            pos = r.int_(n, f"{pkey}[{i}]")
            if pos in positions:
                r.fail(n, f"{pkey}[{i}]", f"duplicate position {pos}")
            positions.append(pos)
    # list order is not part of the identity (sorted, as mcp-visor normalises it)
    return Attestation(
        kind=kind,
        digest=digest,
        entry_arg_positions=tuple(sorted(positions)),
        line=node.start_mark.line + 1,
    )


def _access_list(r: Reader, node: Node, key: str) -> AccessList:
    """``{allow: [globs], deny: [globs]}``; globs are matched against the whole URI or name."""
    m = r.mapping(node, key, {"allow", "deny"}, kind="access list")

    def globs(k: str) -> tuple[Glob, ...]:
        out = []
        for i, n in enumerate(r.list_(m[k], f"{key}.{k}")):
            text = r.str_(n, f"{key}.{k}[{i}]")
            try:
                out.append(paths.compile_glob(text, resolve=False))
            except re.error as e:
                r.fail(n, f"{key}.{k}[{i}]", f"glob {text!r} does not compile: {e}")
        return tuple(out)

    return AccessList(
        allow=globs("allow") if "allow" in m else None,
        deny=globs("deny") if "deny" in m else (),
        line=node.start_mark.line + 1,
    )


def _server_requests(r: Reader, node: Node, key: str) -> dict[str, str]:
    m = r.mapping(node, key, frozenset(_SERVER_REQUESTS), kind="server_requests")
    return {k: r.choice(v, f"{key}.{k}", ("allow", "deny")) for k, v in m.items()}


def _chain_match(r: Reader, node: Node, key: str) -> ChainMatch:
    m = r.mapping(node, key, {"server", "tool_pattern"}, ("tool_pattern",), kind="chain endpoint")
    server = r.str_(m["server"], f"{key}.server") if "server" in m else "*"
    pattern = r.str_(m["tool_pattern"], f"{key}.tool_pattern")
    # anchored and case-insensitive, as mcp-visor reads it
    rx = r.regex(m["tool_pattern"], f"{key}.tool_pattern", re.IGNORECASE)
    return ChainMatch(server, pattern, rx)


def _chain(r: Reader, node: Node, key: str) -> ToolChain:
    m = r.mapping(
        node,
        key,
        {"name", "description", "sources", "sinks", "action", "within_calls"},
        ("name", "sources", "sinks", "action"),
        kind="chain",
    )
    srcs = r.list_(m["sources"], f"{key}.sources")
    sinks = r.list_(m["sinks"], f"{key}.sinks")
    if not srcs:
        r.fail(m["sources"], f"{key}.sources", "must not be an empty list")
    if not sinks:
        r.fail(m["sinks"], f"{key}.sinks", "must not be an empty list")
    return ToolChain(
        name=r.str_(m["name"], f"{key}.name"),
        description=r.str_(m["description"], f"{key}.description", nonempty=False)
        if "description" in m
        else "",
        sources=tuple(_chain_match(r, n, f"{key}.sources[{i}]") for i, n in enumerate(srcs)),
        sinks=tuple(_chain_match(r, n, f"{key}.sinks[{i}]") for i, n in enumerate(sinks)),
        action=_action(r, m["action"], f"{key}.action"),
        within_calls=r.int_(m["within_calls"], f"{key}.within_calls", minimum=1)
        if "within_calls" in m
        else None,
        line=node.start_mark.line + 1,
    )


def _taint(r: Reader, node: Node, key: str) -> Taint:
    m = r.mapping(
        node,
        key,
        {"name", "description", "source_tools", "source_servers", "source_patterns"},
        ("name", "source_tools"),
        kind="taint",
    )
    return Taint(
        name=r.str_(m["name"], f"{key}.name"),
        description=r.str_(m["description"], f"{key}.description", nonempty=False)
        if "description" in m
        else "",
        source_tools=r.strs(m["source_tools"], f"{key}.source_tools", nonempty=True),
        source_servers=r.strs(m["source_servers"], f"{key}.source_servers") if "source_servers" in m else (),
        source_patterns=tuple(
            r.glob(n, f"{key}.source_patterns[{i}]")
            for i, n in enumerate(r.list_(m["source_patterns"], f"{key}.source_patterns"))
        )
        if "source_patterns" in m
        else (),
        line=node.start_mark.line + 1,
    )


def _egress(r: Reader, node: Node, key: str, taint_names: set[str]) -> EgressControl:
    m = r.mapping(
        node,
        key,
        {"name", "description", "when_tainted", "sink_tools", "sink_servers", "action", "reason"},
        ("name", "when_tainted", "sink_tools", "action"),
        kind="egress control",
    )
    when = r.str_(m["when_tainted"], f"{key}.when_tainted")
    if when not in taint_names:
        r.fail(m["when_tainted"], f"{key}.when_tainted", f"no taint named {when!r} is defined under taints:")
    return EgressControl(
        name=r.str_(m["name"], f"{key}.name"),
        description=r.str_(m["description"], f"{key}.description", nonempty=False)
        if "description" in m
        else "",
        when_tainted=when,
        sink_tools=r.strs(m["sink_tools"], f"{key}.sink_tools", nonempty=True),
        sink_servers=r.strs(m["sink_servers"], f"{key}.sink_servers") if "sink_servers" in m else (),
        action=_action(r, m["action"], f"{key}.action", allow_allow=False),
        reason=r.str_(m["reason"], f"{key}.reason", nonempty=False) if "reason" in m else "",
        line=node.start_mark.line + 1,
    )


def _identity(r: Reader, node: Node, key: str) -> Identity:
    m = r.mapping(
        node, key, {"name", "description", "allowed_servers", "allowed_tools"}, ("name",), kind="identity"
    )
    return Identity(
        name=r.str_(m["name"], f"{key}.name"),
        description=r.str_(m["description"], f"{key}.description", nonempty=False)
        if "description" in m
        else "",
        allowed_servers=r.strs(m["allowed_servers"], f"{key}.allowed_servers")
        if "allowed_servers" in m
        else (),
        allowed_tools=r.strs(m["allowed_tools"], f"{key}.allowed_tools") if "allowed_tools" in m else (),
        line=node.start_mark.line + 1,
    )


def _tz(r: Reader, node: Node, key: str) -> str:
    name = r.str_(node, key)
    # Imported here: only a policy that names a time zone needs it (start-up time).
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        r.fail(node, key, f"unknown time zone {name!r}")
    return name


def _hhmm(r: Reader, node: Node, key: str) -> int:
    text = r.str_(node, key)
    mt = re.fullmatch(r"(\d{1,2}):(\d{2})", text.strip())
    if (
        not mt
        or int(mt.group(1)) > 24
        or int(mt.group(2)) > 59
        or (int(mt.group(1)) == 24 and mt.group(2) != "00")
    ):
        r.fail(node, key, f"expected a time HH:MM, got {text!r}")
    return int(mt.group(1)) * 60 + int(mt.group(2))


def _days(r: Reader, node: Node, key: str) -> frozenset[int]:
    out: set[int] = set()
    for i, n in enumerate(r.list_(node, key)):
        d = r.str_(n, f"{key}[{i}]").strip().lower()
        if d not in _DAYS:
            r.fail(n, f"{key}[{i}]", f"unknown day {d!r}")
        out.add(_DAYS[d])
    return frozenset(out)


def _time_restriction(r: Reader, node: Node, key: str) -> TimeRestriction:
    m = r.mapping(
        node,
        key,
        {
            "name",
            "description",
            "servers",
            "tools",
            "allowed_hours",
            "denied_days",
            "outside_action",
            "timezone",
        },
        ("name", "outside_action"),
        kind="time restriction",
    )
    windows: list[TimeWindow] = []
    for i, n in enumerate(
        r.list_(m["allowed_hours"], f"{key}.allowed_hours") if "allowed_hours" in m else []
    ):
        wkey = f"{key}.allowed_hours[{i}]"
        w = r.mapping(n, wkey, {"start", "end", "timezone", "days"}, ("start", "end"), kind="time window")
        windows.append(
            TimeWindow(
                start_minute=_hhmm(r, w["start"], f"{wkey}.start"),
                end_minute=_hhmm(r, w["end"], f"{wkey}.end"),
                timezone=_tz(r, w["timezone"], f"{wkey}.timezone") if "timezone" in w else "UTC",
                days=_days(r, w["days"], f"{wkey}.days") if "days" in w else frozenset(),
            )
        )
    tools = r.strs(m["tools"], f"{key}.tools") if "tools" in m else ("*",)
    tz = (
        _tz(r, m["timezone"], f"{key}.timezone")
        if "timezone" in m
        else (windows[0].timezone if windows else "UTC")
    )
    return TimeRestriction(
        name=r.str_(m["name"], f"{key}.name"),
        description=r.str_(m["description"], f"{key}.description", nonempty=False)
        if "description" in m
        else "",
        servers=r.strs(m["servers"], f"{key}.servers") if "servers" in m else (),
        tools=tuple(re.compile("(?i)" + re.escape(t).replace(r"\*", ".*")) for t in tools),
        tool_names=tools,
        allowed_hours=tuple(windows),
        denied_days=_days(r, m["denied_days"], f"{key}.denied_days") if "denied_days" in m else frozenset(),
        outside_action=_action(r, m["outside_action"], f"{key}.outside_action", allow_allow=False),
        timezone=tz,
        line=node.start_mark.line + 1,
    )


def _redaction_patterns(
    r: Reader, node: Node, key: str, prefix: str, disabled: frozenset[str]
) -> tuple[RedactionPattern, ...]:
    out: list[RedactionPattern] = []
    seen: set[str] = set()
    for i, n in enumerate(r.list_(node, key)):
        pk = f"{key}[{i}]"
        m = r.mapping(n, pk, {"name", "regex", "replacement"}, ("regex",), kind="redaction pattern")
        # mcp-visor patterns have no names; the audit log needs one to say which matched.
        name = r.str_(m["name"], f"{pk}.name") if "name" in m else f"{prefix}-{i + 1}"
        if name in redact.BUILTIN_NAMES and name not in disabled:
            r.fail(
                m.get("name", n),
                f"{pk}.name",
                f"{name!r} is the name of a built-in pattern; list it under redaction.disable "
                "to replace it, or choose another name",
            )
        if name in seen:
            r.fail(m.get("name", n), f"{pk}.name", f"duplicate redaction pattern {name!r}")
        seen.add(name)
        out.append(
            RedactionPattern(
                name=name,
                regex=r.regex(m["regex"], f"{pk}.regex"),
                replacement=r.str_(m["replacement"], f"{pk}.replacement", nonempty=False)
                if "replacement" in m
                else redact.DEFAULT_REPLACEMENT,
            )
        )
    return tuple(out)


def _redaction(r: Reader, node: Node) -> Redaction:
    m = r.mapping(
        node,
        "redaction",
        {"output_redaction", "sensitive_files", "patterns", "output_patterns", "builtin", "disable"},
        kind="redaction",
    )
    disable = r.strs(m["disable"], "redaction.disable") if "disable" in m else ()
    for i, d in enumerate(disable):
        if d not in redact.BUILTIN_NAMES:
            r.fail(
                m["disable"].value[i],
                f"redaction.disable[{i}]",
                f"no built-in pattern is named {d!r}; built-in: {', '.join(sorted(redact.BUILTIN_NAMES))}",
            )
    off = frozenset(disable)
    return _with_engine(
        Redaction(
            output_redaction=r.bool_(m["output_redaction"], "redaction.output_redaction")
            if "output_redaction" in m
            else True,
            builtin=r.bool_(m["builtin"], "redaction.builtin") if "builtin" in m else True,
            disable=disable,
            sensitive_files=_sensitive_files(r, m["sensitive_files"])
            if "sensitive_files" in m
            else _default_sensitive_files(),
            patterns=_redaction_patterns(r, m["patterns"], "redaction.patterns", "policy", off)
            if "patterns" in m
            else (),
            output_patterns=_redaction_patterns(
                r, m["output_patterns"], "redaction.output_patterns", "policy-output", off
            )
            if "output_patterns" in m
            else (),
        )
    )


#: mcp-visor's `redaction.sensitive_files` when a policy gives none (loader.go DefaultPolicy).
MCP_VISOR_SENSITIVE_FILES: tuple[str, ...] = (
    "**/.env",
    "**/.env.*",
    "**/credentials",
    "**/secrets",
    "**/.aws/credentials",
    "**/.ssh/**",
    "**/.docker/config.json",
    "**/kubeconfig",
    "**/.npmrc",
    "**/*.pem",
    "**/*.key",
)


def _mcp_visor_reading(text: str) -> Glob:
    """A sensitive_files glob as mcp-visor reads it: every character literal
    except ``**`` (any characters, ``/`` included) and ``*`` (any within one
    segment), case-insensitive, matched against the whole path."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("**", i):
            out.append(".*")
            i += 2
        elif text[i] == "*":
            out.append("[^/]*")
            i += 1
        else:
            out.append(re.escape(text[i]))
            i += 1
    return Glob(text, re.compile("".join(out), re.IGNORECASE | re.DOTALL))


def _both_readings(visor_glob: Glob, text: str) -> tuple[Glob, ...]:
    """Visor's doublestar reading of a sensitive_files glob, and mcp-visor's
    where it is a different regex: a path either one matches is sensitive, so
    the file denies at least what mcp-visor denies (``[``, ``{`` and ``?`` are
    literal there, and ``**`` spans any characters)."""
    theirs = _mcp_visor_reading(text)
    if theirs.regex.pattern == visor_glob.regex.pattern:
        return (visor_glob,)
    return (visor_glob, theirs)


def _sensitive_files(r: Reader, node: Node) -> tuple[Glob, ...]:
    out: list[Glob] = []
    for i, n in enumerate(r.list_(node, "redaction.sensitive_files")):
        key = f"redaction.sensitive_files[{i}]"
        out.extend(_both_readings(r.glob(n, key), r.str_(n, key)))
    return tuple(out)


def _default_sensitive_files() -> tuple[Glob, ...]:
    return tuple(
        g for text in MCP_VISOR_SENSITIVE_FILES for g in _both_readings(paths.compile_glob(text), text)
    )


def _with_engine(red: Redaction) -> Redaction:
    """Compile the redaction patterns for both directions once, at load."""

    def pats(items: tuple[RedactionPattern, ...]) -> tuple[redact.Pattern, ...]:
        return tuple(redact.Pattern(p.name, p.regex, p.replacement) for p in items)

    engine = redact.build_redactor(
        builtin=red.builtin,
        disable=red.disable,
        patterns=pats(red.patterns),
        output_patterns=pats(red.output_patterns),
        outputs=red.output_redaction,
    )
    return replace(red, engine=engine)


def _build(text: str, source: str, sha: str, *, embedded: bool = False) -> Policy:
    root = compose(text, source, embedded=embedded)
    r = Reader(source, _HINTS)
    if root is None:
        raise PolicyError(source, 0, "", "the policy is empty")
    m = r.mapping(root, "", _TOP, kind="top")
    version = "1.0"
    if "version" in m:
        v = m["version"]
        if not isinstance(v, ScalarNode) or v.tag not in (TAG + "str", TAG + "float", TAG + "int"):
            r.fail(v, "version", f"expected a version string, got {kind_of(v)}")
        version = str(v.value)
    default_action: Literal["allow", "deny"] = "deny"
    if "default_action" in m:
        chosen = r.choice(m["default_action"], "default_action", ("allow", "deny"))
        default_action = "allow" if chosen == "allow" else "deny"
    settings = _settings(r, m["settings"]) if "settings" in m else Settings()
    servers: list[ServerPolicy] = []
    index: dict[str, ServerPolicy] = {}
    for i, n in enumerate(r.list_(m["servers"], "servers") if "servers" in m else []):
        s = _server(r, n, f"servers[{i}]")
        if s.name in index:
            r.fail(n, f"servers[{i}].name", f"duplicate server {s.name!r}")
        index[s.name] = s
        servers.append(s)
    taints = tuple(
        _taint(r, n, f"taints[{i}]")
        for i, n in enumerate(r.list_(m["taints"], "taints") if "taints" in m else [])
    )
    tnames = {t.name for t in taints}
    if len(tnames) != len(taints):
        dup = next(t for t in taints if [x.name for x in taints].count(t.name) > 1)
        raise PolicyError(source, dup.line, "taints", f"duplicate taint {dup.name!r}")
    packs = _packs()
    if settings.packs is not None:
        packs = {k: v for k, v in packs.items() if k in settings.packs}
    redaction = (
        _redaction(r, m["redaction"])
        if "redaction" in m
        else _with_engine(Redaction(sensitive_files=_default_sensitive_files()))
    )
    # mcp-visor denies a tool call naming one of redaction.sensitive_files
    # (internal/proxy/tools_call.go): the evaluator's sensitive-path check
    # reads settings.sensitive_paths, so the globs join them there.
    known = {(g.pattern, g.regex.pattern) for g in settings.sensitive_paths}
    merged = tuple(g for g in redaction.sensitive_files if (g.pattern, g.regex.pattern) not in known)
    if merged:
        settings = replace(settings, sensitive_paths=settings.sensitive_paths + merged)
    policy = Policy(
        source=source,
        sha256=sha,
        version=version,
        description=r.str_(m["description"], "description", nonempty=False) if "description" in m else "",
        default_action=default_action,
        settings=settings,
        servers=tuple(servers),
        server_index=index,
        tool_chains=tuple(
            _chain(r, n, f"tool_chains[{i}]")
            for i, n in enumerate(r.list_(m["tool_chains"], "tool_chains") if "tool_chains" in m else [])
        ),
        taints=taints,
        egress_controls=tuple(
            _egress(r, n, f"egress_controls[{i}]", tnames)
            for i, n in enumerate(
                r.list_(m["egress_controls"], "egress_controls") if "egress_controls" in m else []
            )
        ),
        identities=tuple(
            _identity(r, n, f"identities[{i}]")
            for i, n in enumerate(r.list_(m["identities"], "identities") if "identities" in m else [])
        ),
        time_restrictions=tuple(
            _time_restriction(r, n, f"time_restrictions[{i}]")
            for i, n in enumerate(
                r.list_(m["time_restrictions"], "time_restrictions") if "time_restrictions" in m else []
            )
        ),
        redaction=redaction,
        packs=packs,
    )
    return replace(policy, compiled=compile_policy(policy))


# ----------------------------------------------------------------- packs

_PACKS: dict[str, Pack] | None = None


def load_pack_text(text: str, source: str, *, embedded: bool = False) -> Pack:
    root = compose(text, source, embedded=embedded)
    r = Reader(source, _HINTS)
    if root is None:
        raise PolicyError(source, 0, "", "the pack is empty")
    m = r.mapping(root, "", {"name", "description", "servers", "tools"}, ("name", "tools"), kind="pack")
    tools: dict[str, ToolPolicy] = {}
    name = r.str_(m["name"], "name")
    for i, n in enumerate(r.list_(m["tools"], "tools")):
        t = _tool(r, n, f"tools[{i}]", f"pack:{name}", in_pack=True)
        if t.name in tools:
            r.fail(n, f"tools[{i}].name", f"duplicate tool {t.name!r}")
        tools[t.name] = t
    servers = r.strs(m["servers"], "servers") if "servers" in m else (name,)
    return Pack(
        name=name,
        servers=tuple(s.lower() for s in servers),
        tools=tools,
        description=r.str_(m["description"], "description", nonempty=False) if "description" in m else "",
    )


def _package_files() -> Traversable:
    """``importlib.resources.files("visor.policy")``: the package's folder itself when it is
    plain files, as importlib.resources would answer, without importing importlib.resources
    (and zipfile, tempfile...) at every start; importlib.resources for anything else (a zip)."""
    import sys
    from importlib.machinery import SourceFileLoader, SourcelessFileLoader
    from pathlib import Path

    spec = sys.modules["visor.policy"].__spec__
    if spec is not None and spec.origin and type(spec.loader) in (SourceFileLoader, SourcelessFileLoader):
        return Path(spec.origin).parent
    from importlib import resources

    return resources.files("visor.policy")


def _packs() -> dict[str, Pack]:
    """The built-in packs, read once from the package's ``packs/`` folder."""
    global _PACKS
    if _PACKS is None:
        found: dict[str, Pack] = {}
        folder = _package_files() / "packs"
        for entry in sorted(folder.iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".yaml"):
                pack = load_pack_text(entry.read_text(encoding="utf-8"), f"packs/{entry.name}", embedded=True)
                found[pack.name] = pack
        _PACKS = found
    return _PACKS


def builtin_packs() -> dict[str, Pack]:
    return dict(_packs())


# ----------------------------------------------------------------- public


def _build_checked(text: str, source: str, sha: str) -> Policy:
    """`_build`, with every failure a PolicyError: nothing else may escape a load.

    The specific checks name file, line and key; this net catches what they
    did not foresee (found by fuzzing: NUL bytes in paths, regexes too large
    or too nested for `re`, YAML nested thousands deep, odd time zone names),
    so that a bad policy always stops `visor run` with a message, never a
    traceback.
    """
    try:
        return _build(text, source, sha)
    except PolicyError:
        raise
    except (re.error, ValueError, OSError, RecursionError, OverflowError, UnicodeError, yaml.YAMLError) as e:
        raise PolicyError(source, 0, "", f"the policy cannot be used: {type(e).__name__}: {e}") from None
    except Exception as e:  # the same promise for anything else unforeseen
        raise PolicyError(source, 0, "", f"the policy cannot be used: {type(e).__name__}: {e}") from None


def load_policy_text(text: str, source: str = "<string>") -> Policy:
    """Parse and validate a policy; raises PolicyError naming file, line and key."""
    try:
        sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    except UnicodeEncodeError as e:
        raise PolicyError(source, 0, "", f"the policy is not valid Unicode text: {e}") from None
    return _build_checked(text, source, sha)


def load_policy(path: str | os.PathLike[str]) -> Policy:
    source = os.fspath(path)
    try:
        with open(source, "rb") as f:
            data = f.read()
    except OSError as e:
        raise PolicyError(source, 0, "", f"cannot read the policy: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PolicyError(source, 0, "", f"the policy is not valid UTF-8: {e}") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return _build_checked(text, source, hashlib.sha256(data).hexdigest())


def load_default_policy() -> Policy:
    """The embedded default policy (visor/policy/default.yaml)."""
    data = (_package_files() / "default.yaml").read_bytes()
    return _build(data.decode("utf-8"), "<default>", hashlib.sha256(data).hexdigest(), embedded=True)
