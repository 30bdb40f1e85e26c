"""Check and normalise an mcp-visor policy for Visor.

Visor loads mcp-visor's format and gives it mcp-visor's meaning (defaults
included), so a policy that loads is written back unchanged. mcp-visor's
loader ignores keys it does not know (its own README example puts a tool's
``risk``, ``approval_required`` and ``rules`` on a server entry, where they
do nothing); Visor refuses them. Normalising drops each such key, which is
exactly what mcp-visor did with it, and says so: the policy means what it
meant under mcp-visor, and a note names each key so that the author can move
it to where it takes effect. Any other error is not guessed around.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from visor.migrate.detect import BOUNCER_HINT, looks_like_bouncer
from visor.migrate.result import Imported, MigrationError, Note
from visor.policy.loader import PolicyError, load_policy_text

_STEP = re.compile(r"([^.\[\]]+)((?:\[\d+\])*)")
# A policy with more unknown keys than this is not a policy with a few misplaced keys.
_MAX_DROPS = 200


def _parent_and_key(data: Any, path: str) -> tuple[dict[str, Any], str] | None:
    """The mapping holding the last key of ``servers[1].tools[0].risk``, and that key."""
    parts = path.split(".")
    node = data
    for i, part in enumerate(parts):
        m = _STEP.fullmatch(part)
        if m is None:
            return None
        name, indexes = m.group(1), m.group(2)
        if i == len(parts) - 1:
            if indexes or not isinstance(node, dict) or name not in node:
                return None
            return node, name
        if not isinstance(node, dict) or name not in node:
            return None
        node = node[name]
        for idx in re.findall(r"\[(\d+)\]", indexes):
            if not isinstance(node, list) or int(idx) >= len(node):
                return None
            node = node[int(idx)]
    return None


def normalise(text: str, source: str) -> Imported:
    try:
        load_policy_text(text, source)
        return Imported(text, ())
    except PolicyError as first:
        error = first
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise MigrationError(f"{source}: not valid YAML: {e}") from None
    if looks_like_bouncer(data):
        raise MigrationError(
            f"{source}: tool names at the top level: this is an mcp-bouncer policy; "
            + BOUNCER_HINT.replace("FILE", source)
        )
    notes: list[Note] = []
    in_original = True
    for _ in range(_MAX_DROPS):
        if "unknown key" not in error.message:
            raise MigrationError(f"{error} (not an ignored key; fix it by hand)")
        found = _parent_and_key(data, error.key)
        if found is None:
            raise MigrationError(f"{error} (cannot locate the key to drop it; fix it by hand)")
        parent, key = found
        del parent[key]
        hint = error.message.split("(", 1)[1].rstrip(")") if "(" in error.message else ""
        notes.append(
            Note(
                error.key,
                f"dropped: mcp-visor ignores {key!r} here, so it never took effect"
                + (f"; {hint}" if hint else "")
                + (f" (line {error.line})" if in_original and error.line else ""),
                False,
            )
        )
        in_original = False
        out = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False, width=100)
        try:
            load_policy_text(out, source)
        except PolicyError as e:
            error = e
            continue
        header = f"# Normalised by `visor policy import --from mcp-visor` from {source}:\n" + "".join(
            f"#  - {n.where}: dropped (mcp-visor ignored it)\n" for n in notes
        )
        return Imported(header + out, tuple(notes))
    raise MigrationError(f"{source}: more than {_MAX_DROPS} keys mcp-visor would ignore; fix it by hand")
