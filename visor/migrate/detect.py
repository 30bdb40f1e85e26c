"""Which format a policy file is in: Visor's (and mcp-visor's), or mcp-bouncer's."""

from __future__ import annotations

import yaml

#: The top-level keys of a Visor policy (a superset of mcp-visor's); the loader
#: refuses any other. tests/migrate pins this against the loader's own set.
VISOR_TOP_LEVEL = frozenset(
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

BOUNCER_HINT = "convert it with `visor policy import --from bouncer FILE -o NEW.yaml`"


def looks_like_bouncer(data: object) -> bool:
    """A non-empty mapping of tool names to entries, with none of Visor's top-level keys."""
    if not isinstance(data, dict) or not data:
        return False
    if any(k in VISOR_TOP_LEVEL for k in data):
        return False
    return all(v is None or isinstance(v, dict) for v in data.values())


def bouncer_hint(path: str) -> str | None:
    """If the file at `path` is an mcp-bouncer policy, what to tell the user; else None.

    Only a hint: whatever this says, the loader still decides (and refuses the file).
    """
    try:
        with open(path, "rb") as f:
            data = yaml.safe_load(f.read(1 << 20))
    except Exception:
        # Only a hint, read before the loader: a file the constructor cannot build
        # (`!!bool "1"`, `!!int x`) is left for the loader to refuse with file, line and key.
        return None
    if not looks_like_bouncer(data):
        return None
    return (
        f"{path} is an mcp-bouncer policy (tool names at the top level), which Visor does not load: "
        + BOUNCER_HINT.replace("FILE", path)
    )
