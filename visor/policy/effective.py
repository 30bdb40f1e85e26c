"""What the policy says about one tool in one session: packs selected, entries merged.

`select_packs` picks the built-in packs that describe a server; `merge_tool`
lays a policy entry over a pack's (what the entry says wins, lists are
unions); `resolve_tool` does both for one tool and returns the `Effective`
the evaluator reads. Pure: the session (visor/session.py) caches one per tool.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypeVar

from visor.policy import destinations as dst
from visor.policy.loader import build_plan, build_screens
from visor.policy.schema import Pack, Policy, ServerPolicy, ToolPolicy
from visor.wire.folding import go_fold

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Effective:
    """What the evaluator needs to know about one tool in this session."""

    entry: ToolPolicy | None  # merged pack + policy entry (None: nothing known)
    registered: bool  # the policy lists the tool, or has a "*" tool entry
    fallback: bool  # no pack entry and no exact policy entry: guess destinations by name
    trust: dst.TrustList
    packs: tuple[str, ...] = ()
    # The server entry's name for this tool in another case (``send_email`` for a listed
    # ``Send_Email``), when it has no entry of its exact name: what it restricts would be missed.
    case_twin: str | None = None


def merge_tool(base: ToolPolicy | None, over: ToolPolicy) -> ToolPolicy:
    """Field-by-field merge: what ``over`` says wins, lists are unions, and a
    field ``over`` does not mention keeps ``base``'s value, so restating one
    field never switches another check off."""
    if base is None:
        return over

    def union(a: tuple[_T, ...], b: tuple[_T, ...]) -> tuple[_T, ...]:
        return tuple(dict.fromkeys(a + b))

    return ToolPolicy(
        name=over.name,
        allowed=over.allowed if over.allowed is not None else base.allowed,
        risk=over.risk or base.risk,
        approval_required=over.approval_required or base.approval_required,
        # stricter wins: out_of_band on either side keeps the client's elicitation out
        approval="out_of_band"
        if "out_of_band" in (over.approval, base.approval)
        else over.approval or base.approval,
        description=over.description or base.description,
        rules=base.rules + over.rules,
        exfiltrating=over.exfiltrating if over.exfiltrating is not None else base.exfiltrating,
        sink_params=union(base.sink_params, over.sink_params),
        # per argument, what the policy says wins over the pack
        sink_kinds=tuple({**dict(base.sink_kinds), **dict(over.sink_kinds)}.items()),
        trusted_destinations=union(base.trusted_destinations, over.trusted_destinations),
        write_params=union(base.write_params, over.write_params),
        allowed_path_prefixes=union(base.allowed_path_prefixes, over.allowed_path_prefixes),
        prefix_alts=union(base.prefix_alts, over.prefix_alts),
        arg_patterns=base.arg_patterns + over.arg_patterns,
        max_calls=over.max_calls if over.max_calls is not None else base.max_calls,
        trusted_output_fields=union(base.trusted_output_fields, over.trusted_output_fields),
        sender_fields=union(base.sender_fields, over.sender_fields),
        untrusted_output=over.untrusted_output or base.untrusted_output,
        screens=over.screens if not base.rules else build_screens(base.rules + over.rules),
        plan=over.plan if not base.rules else build_plan(base.rules + over.rules),
        origin=f"{over.origin}+{base.origin}",
        line=over.line or base.line,
    )


def _describes(entry: ToolPolicy, arguments: frozenset[str] | None) -> bool:
    return entry.arguments is None or arguments is None or arguments <= set(entry.arguments)


def _sending_part(entry: ToolPolicy) -> ToolPolicy | None:
    """What a pack entry still says of a same-named tool it does not describe: that it sends
    and which arguments are destinations, never what it exempts (an argument that is no
    destination, output fields it vouches for, writes confined to some arguments only)."""
    if entry.exfiltrating is not True:
        return None
    return replace(
        entry,
        sink_kinds=tuple((a, k) for a, k in entry.sink_kinds if k != "none"),
        trusted_destinations=(),
        trusted_output_fields=(),
        sender_fields=(),
        write_params=(),
        arguments=None,
    )


def pack_entry(pack: Pack, tool: str, arguments: frozenset[str] | None) -> ToolPolicy | None:
    """What `pack` says of `tool` taking `arguments` (see `resolve_tool`); None: nothing."""
    entry = pack.tools.get(tool)
    if entry is None or _describes(entry, arguments):
        return entry
    return _sending_part(entry)


def select_packs(
    policy: Policy, server: ServerPolicy | None, server_name: str, tool_names: set[str]
) -> tuple[str, ...]:
    """Which built-in packs describe this session's server.

    A server entry's ``packs:`` list wins outright. Otherwise a pack applies
    when the server name (``--server-name``) is one of its names, or when the
    server's tools/list contains at least two of the pack's tools (all of them
    for a one-tool pack).
    """
    if server is not None and server.packs is not None:
        return tuple(p for p in server.packs if p in policy.packs)
    lowered = server_name.lower()
    out: list[str] = []
    for name, pack in sorted(policy.packs.items()):
        if lowered and lowered in pack.servers:
            out.append(name)
            continue
        need = min(2, len(pack.tools))
        if tool_names and sum(1 for t in pack.tools if t in tool_names) >= need:
            out.append(name)
    return tuple(out)


def resolve_tool(
    policy: Policy,
    server: ServerPolicy | None,
    packs: tuple[str, ...],
    tool: str,
    arguments: frozenset[str] | None = None,
) -> Effective:
    """What the policy says about `tool` on this server: the entries of the active `packs`
    merged in order, then the server's own entry for the tool (or its ``"*"`` entry) over them.

    `arguments`: the top-level argument names of the tool's listed schema. A pack entry that
    names its server's arguments describes only a tool that takes no others: a `fetch` that
    also takes `method` and `body` is not mcp-server-fetch's reader, whatever its name (None:
    no listing to compare with, as in lint; the packs as written). Of a sending entry that
    does not describe the tool, what makes it stricter stays (`_sending_part`)."""
    pack_entries: list[tuple[Pack, ToolPolicy]] = [
        (policy.packs[p], e) for p in packs if (e := pack_entry(policy.packs[p], tool, arguments)) is not None
    ]
    base: ToolPolicy | None = None
    for _pack, described in pack_entries:
        base = merge_tool(base, described) if base is not None else described
    exact = server.tools.get(tool) if server is not None else None
    star = server.tools.get("*") if server is not None and exact is None else None
    user = exact or (replace(star, name=tool) if star is not None else None)
    entry = merge_tool(base, user) if user is not None else base
    trusted: tuple[str, ...] = entry.trusted_destinations if entry is not None else ()
    if server is not None:
        trusted = trusted + server.allowed_destinations
    twin: str | None = None
    if server is not None and exact is None:
        folded = go_fold(tool.strip())
        twin = next((k for k in server.tools if k != "*" and go_fold(k.strip()) == folded), None)
    return Effective(
        entry=entry,
        registered=user is not None,
        fallback=exact is None and base is None,
        trust=dst.build_trust(trusted) if trusted else dst.EMPTY_TRUST,
        packs=tuple(p.name for p, _ in pack_entries),
        case_twin=twin,
    )
