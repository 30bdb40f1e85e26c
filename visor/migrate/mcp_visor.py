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

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from visor.migrate.detect import BOUNCER_HINT, looks_like_bouncer
from visor.migrate.result import Imported, MigrationError, Note
from visor.policy.loader import PolicyError, load_policy_text
from visor.policy.reader import compose

_STEP = re.compile(r"([^.\[\]]+)((?:\[\d+\])*)")
# A policy with more unknown keys than this is not a policy with a few misplaced keys.
_MAX_DROPS = 200


def _parent_and_key(root: Node | None, path: str) -> tuple[MappingNode, int] | None:
    """The mapping node holding the last key of ``servers[1].tools[0].risk``, and that key's index."""
    parts = path.split(".")
    node = root
    for i, part in enumerate(parts):
        m = _STEP.fullmatch(part)
        if m is None:
            return None
        name, indexes = m.group(1), m.group(2)
        if not isinstance(node, MappingNode):
            return None
        found = [j for j, (k, _v) in enumerate(node.value) if isinstance(k, ScalarNode) and k.value == name]
        if len(found) != 1:
            return None
        if i == len(parts) - 1:
            return (node, found[0]) if not indexes else None
        node = node.value[found[0]][1]
        for idx in re.findall(r"\[(\d+)\]", indexes):
            if not isinstance(node, SequenceNode) or int(idx) >= len(node.value):
                return None
            node = node.value[int(idx)]
    return None


def _looks_like_bouncer(text: str) -> bool:
    try:
        return looks_like_bouncer(yaml.safe_load(text))
    except Exception:  # only a hint; the loader's error stands
        return False


def normalise(text: str, source: str) -> Imported:
    try:
        load_policy_text(text, source)
        return Imported(text, ())
    except PolicyError as first:
        error = first
    if _looks_like_bouncer(text):
        raise MigrationError(
            f"{source}: tool names at the top level: this is an mcp-bouncer policy; "
            + BOUNCER_HINT.replace("FILE", source)
        )
    # Keys are dropped from the loader's own node tree and written back from it: every
    # value kept is the scalar as written (its style and tag), and a duplicate key, a
    # merge key or a value the loader refuses is still there to be refused.
    try:
        root = compose(text, source)
    except PolicyError as e:
        raise MigrationError(f"{source}: not valid YAML: {e.message}") from None
    notes: list[Note] = []
    in_original = True
    for _ in range(_MAX_DROPS):
        if "unknown key" not in error.message:
            raise MigrationError(f"{error} (not an ignored key; fix it by hand)")
        found = _parent_and_key(root, error.key)
        if found is None:
            raise MigrationError(f"{error} (cannot locate the key to drop it; fix it by hand)")
        parent, index = found
        key = parent.value[index][0].value
        del parent.value[index]
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
        out = yaml.serialize(root, allow_unicode=True, width=100)
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
