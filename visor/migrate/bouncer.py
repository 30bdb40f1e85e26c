"""mcp-bouncer policy -> Visor policy.

An mcp-bouncer policy maps tool names (at the top level) to per-tool checks:
``exfiltrating``, ``sink_params``, ``trusted_destinations``, ``write_params``,
``allowed_path_prefixes``, ``arg_patterns`` and ``max_calls``. Bouncer lets
every tool the server listed at start-up run, applies its packs by tool name,
guesses destinations for the rest, and reads a user entry *instead of* the pack
entry for that tool.

The Visor policy written here is the embedded default policy (pinned tools,
sensitive files, destination provenance, packs) with one tool entry per bouncer
entry. Visor merges a tool entry with its pack entry instead of replacing it,
so a bouncer entry that left a pack's destination check out keeps it here:
stricter, never broader. What Visor would read more broadly than bouncer did
(a bare domain or a URL in ``trusted_destinations``, a relative path prefix)
is left out or denied, and each such case is a note for stderr.
"""

from __future__ import annotations

import os
from importlib import resources
from typing import Any

import yaml

from visor.migrate.detect import VISOR_TOP_LEVEL
from visor.migrate.result import Imported, MigrationError, Note
from visor.policy import destinations as dst

# The keys bouncer's loader reads; it ignores every other key of an entry.
_KEYS = (
    "exfiltrating",
    "sink_params",
    "trusted_destinations",
    "write_params",
    "allowed_path_prefixes",
    "arg_patterns",
    "max_calls",
)
_LIST_KEYS = ("sink_params", "write_params")


def _default_policy() -> dict[str, Any]:
    text = (resources.files("visor.policy") / "default.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


def _exact_trust(entry: str) -> str | None:
    """Why Visor would trust more than bouncer's exact match for this entry, or None."""
    s = entry.strip()
    if not s:
        return "empty"
    if s.startswith(("*.", "@")):
        return "Visor reads it as a whole domain"
    found = dst.parse(s)
    if len(found) != 1:
        return "Visor reads it as several destinations"
    d = found[0]
    if d.kind == "host":
        return "Visor reads a bare domain as every address and URL at that domain"
    if d.kind == "url":
        return "Visor reads a URL as every URL under that path"
    if d.kind == "opaque" and ("@" in d.value or dst._urlish(d.value)):
        return "Visor cannot read it unambiguously and never trusts it"
    return None


def _strs(value: object) -> list[str] | None:
    # bouncer: a list is read item by item with str(); anything else is ignored
    return [str(x) for x in value] if isinstance(value, list) else None


def _tool(name: str, raw: object, base_dir: str | None, notes: list[Note]) -> dict[str, Any]:
    where = f"tool {name!r}"
    out: dict[str, Any] = {"name": name, "allowed": True}
    if raw is None or not isinstance(raw, dict):
        if raw is not None:
            notes.append(
                Note(
                    where,
                    f"entry is {type(raw).__name__}, not a mapping: mcp-bouncer read it as "
                    "an empty entry; so does Visor (the pack's checks still apply here)",
                    False,
                )
            )
        return out
    for key in raw:
        if key not in _KEYS:
            notes.append(
                Note(
                    where,
                    f"key {key!r} is not an mcp-bouncer key (bouncer ignored it); not carried "
                    "over: add the Visor equivalent by hand if you meant it (docs/policy.md)",
                    False,
                )
            )
    if "exfiltrating" in raw:
        v = raw["exfiltrating"]
        if isinstance(v, bool):
            out["exfiltrating"] = v
        elif v:
            # bouncer: bool(v); a truthy non-boolean ("no" included) switched the check on
            out["exfiltrating"] = True
            notes.append(
                Note(
                    where,
                    f"exfiltrating: {v!r} is not a boolean; bouncer read it as true, so does this policy",
                    False,
                )
            )
        else:
            notes.append(
                Note(
                    where,
                    f"exfiltrating: {v!r} is not a boolean; left out, so the pack or Visor's "
                    "destination guess decides (at least as strict)",
                    True,
                )
            )
    for key in _LIST_KEYS:
        if key in raw:
            items = _strs(raw[key])
            if items is None:
                notes.append(
                    Note(where, f"{key} is not a list; bouncer ignored it, so does this policy", False)
                )
            elif items:
                out[key] = items
    if "trusted_destinations" in raw:
        items = _strs(raw["trusted_destinations"])
        if items is None:
            notes.append(
                Note(
                    where,
                    "trusted_destinations is not a list; bouncer ignored it, so does this policy",
                    False,
                )
            )
        else:
            kept = []
            for item in items:
                why = _exact_trust(item)
                if why is None:
                    kept.append(item.strip())
                else:
                    notes.append(
                        Note(
                            where,
                            f"trusted destination {item!r} left out: bouncer trusted that exact "
                            f"value only; {why}. A call to it now asks a human; add it by hand if you "
                            "mean the broader reading",
                            True,
                        )
                    )
            if kept:
                out["trusted_destinations"] = kept
    if "allowed_path_prefixes" in raw:
        items = _strs(raw["allowed_path_prefixes"])
        if items is None:
            notes.append(
                Note(
                    where,
                    "allowed_path_prefixes is not a list; bouncer ignored it, so does this policy",
                    False,
                )
            )
        elif items:
            prefixes = []
            for p in items:
                if os.path.isabs(p):
                    prefixes.append(os.path.normpath(p))
                elif base_dir is not None:
                    prefixes.append(os.path.normpath(os.path.join(base_dir, p)))
                    notes.append(
                        Note(where, f"relative path prefix {p!r} resolved against {base_dir}", False)
                    )
                else:
                    notes.append(
                        Note(
                            where,
                            f"relative path prefix {p!r}: bouncer resolved it against the "
                            "directory the client started it in, which this file does not say; the "
                            "tool is DENIED until you rerun with --base-dir DIR or write an absolute "
                            "prefix",
                            True,
                        )
                    )
                    out["allowed"] = False
            if out["allowed"] and prefixes:
                out["allowed_path_prefixes"] = prefixes
    if "arg_patterns" in raw:
        pats = raw["arg_patterns"]
        if not isinstance(pats, dict):
            notes.append(
                Note(where, "arg_patterns is not a mapping; bouncer ignored it, so does this policy", False)
            )
        elif pats:
            out["arg_patterns"] = {str(k): str(v) for k, v in pats.items()}
    if "max_calls" in raw:
        v = raw["max_calls"]
        if v == 0 and isinstance(v, int) and not isinstance(v, bool):
            out["allowed"] = False  # bouncer's "0 forbids the tool outright", in Visor's words
        elif isinstance(v, int) and not isinstance(v, bool) and v > 0:
            out["max_calls"] = v
        else:
            notes.append(
                Note(
                    where,
                    f"max_calls: {v!r} is not a whole number >= 0; bouncer ignored it, so does this policy",
                    False,
                )
            )
    return out


def convert(text: str, source: str, server_name: str = "*", base_dir: str | None = None) -> Imported:
    """The Visor policy for an mcp-bouncer policy file's text."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise MigrationError(f"{source}: not valid YAML: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise MigrationError(
            f"{source}: the top level is {type(data).__name__}; an mcp-bouncer policy maps tool names to entries"
        )
    visor_keys = [k for k in data if k in VISOR_TOP_LEVEL]
    if visor_keys:
        raise MigrationError(
            f"{source}: has {', '.join(map(repr, visor_keys))} at the top level: this is a Visor or mcp-visor "
            "policy, not an mcp-bouncer one; use `visor policy import --from mcp-visor`"
        )
    if base_dir is not None and not os.path.isabs(base_dir):
        base_dir = os.path.abspath(base_dir)
    notes: list[Note] = []
    tools: list[dict[str, Any]] = []
    for name, raw in data.items():
        if not isinstance(name, str) or not name.strip():
            notes.append(
                Note(f"key {name!r}", "not a tool name (bouncer compared it with none); left out", False)
            )
            continue
        if name == "*":
            notes.append(
                Note(
                    "tool '*'",
                    "bouncer read '*' as a tool of that literal name; in Visor it would "
                    "mean every tool, so it is left out",
                    False,
                )
            )
            continue
        tools.append(_tool(name, raw, base_dir, notes))
    policy = _default_policy()
    policy["description"] = f"Imported from the mcp-bouncer policy {os.path.basename(source)}"
    server = {"name": server_name, "allowed": True, "tools": [*tools, {"name": "*", "allowed": True}]}
    policy["servers"] = [server]
    header = (
        f"# Imported by `visor policy import --from bouncer` from {source}.\n"
        "# Visor's default policy (tools pinned at start-up, sensitive files denied,\n"
        "# destination provenance on every sending tool) plus one entry per bouncer tool.\n"
        "# A tool entry here is merged with the built-in pack's entry for that tool\n"
        "# (bouncer replaced it): the pack's checks stay on. See docs/migration.md.\n"
    )
    body = yaml.safe_dump(policy, sort_keys=False, allow_unicode=True, default_flow_style=False, width=100)
    return Imported(header + body, tuple(notes))
