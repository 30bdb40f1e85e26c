"""`visor lint`: load with the same code as `visor run`, then point out what
loads but is probably wrong."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from visor.policy import destinations as dst
from visor.policy.effective import resolve_tool, select_packs
from visor.policy.loader import PolicyError, load_policy
from visor.policy.schema import Policy, ServerPolicy, ToolPolicy

_SENDER_NAME = re.compile(r"(send|post|share|notify|invite|forward|publish|upload|webhook|reply|email)", re.I)
_READER_NAME = re.compile(r"(read|get|list|search|fetch|find|query)", re.I)


@dataclass(frozen=True, slots=True)
class Finding:
    level: str  # "error" | "warning"
    line: int
    key: str
    message: str

    def render(self, source: str) -> str:
        where = f"{source}:{self.line}" if self.line else source
        return (
            f"{where}: {self.level}: {self.key}: {self.message}"
            if self.key
            else f"{where}: {self.level}: {self.message}"
        )


def _server_known(policy: Policy, name: str) -> bool:
    return name == "*" or name in policy.server_index or "*" in policy.server_index


def _tool_known(policy: Policy, name: str) -> bool:
    if "*" in name or "?" in name:
        return True
    for s in policy.servers:
        if name in s.tools or "*" in s.tools:
            return True
    return policy.default_action == "allow"


def _pack_overrides(policy: Policy, srv: ServerPolicy, i: int) -> list[Finding]:
    out: list[Finding] = []
    for pname in select_packs(policy, srv, "" if srv.name == "*" else srv.name, set()):
        pack = policy.packs[pname]
        for j, (tname, tool) in enumerate(srv.tools.items()):
            base = pack.tools.get(tname)
            if base is None:
                continue
            key = f"servers[{i}].tools[{j}]"
            if base.exfiltrating is True and tool.exfiltrating is False:
                out.append(
                    Finding(
                        "warning",
                        tool.line,
                        f"{key}.exfiltrating",
                        f"overrides pack {pname!r}: exfiltrating true -> false switches destination provenance off for {tname!r}",
                    )
                )
            changed = [
                f
                for f in ("max_calls",)
                if getattr(tool, f) is not None
                and getattr(base, f) is not None
                and getattr(tool, f) != getattr(base, f)
            ]
            added = [f for f in ("sink_params", "write_params", "trusted_destinations") if getattr(tool, f)]
            if changed or added:
                out.append(
                    Finding(
                        "warning",
                        tool.line,
                        key,
                        f"merges with pack {pname!r} entry for {tname!r}"
                        + (f"; overrides {', '.join(changed)}" if changed else "")
                        + (f"; adds to {', '.join(added)}" if added else ""),
                    )
                )
    return out


def _sink_kind_findings(policy: Policy, srv: ServerPolicy, i: int) -> list[Finding]:
    """What a policy's ``sink_kinds`` does that its author may not have meant: ``none`` on an
    argument that is a destination by a pack or by its own name switches destination provenance
    off for it (Visor obeys: the Slack pack itself says the channel a user is added to is no
    recipient); ``none`` on one a pack's ``sink_params`` names changes nothing; a kind other
    than the pack's changes how its values are read. One finding per argument."""
    out: list[Finding] = []
    packs = select_packs(policy, srv, "" if srv.name == "*" else srv.name, set())
    for j, (tname, tool) in enumerate(srv.tools.items()):
        if not tool.sink_kinds:
            continue
        key = f"servers[{i}].tools[{j}].sink_kinds"
        bases = [(p, policy.packs[p].tools[tname]) for p in packs if tname in policy.packs[p].tools]
        # the entry the evaluator will use: the packs' entries merged in order, the policy's over them
        effective = resolve_tool(policy, srv, packs, tname).entry or tool
        after = dst.declared_arguments(effective.sink_params, effective.sink_kinds)
        for arg, kind in sorted(tool.sink_kinds):
            where = f"{key}.{arg}"
            if kind == "none":
                by_pack = next(
                    (
                        p
                        for p, b in bases
                        if dst.names_destination(*dst.declared_arguments(b.sink_params, b.sink_kinds), arg)
                    ),
                    None,
                )
                if dst.names_destination(*after, arg):
                    message = (
                        f"none has no effect: {arg!r} of {tname!r} is named in sink_params"
                        + (f" (pack {by_pack!r})" if by_pack and arg not in tool.sink_params else "")
                        + ", so it is still a destination"
                    )
                elif effective.exfiltrating is True and not after[0]:
                    # No argument is declared a destination, so the evaluator reads every
                    # address- or URL-shaped value of a sending tool as one (evaluate._destination_args).
                    message = (
                        f"none on {arg!r} of {tname!r}: with no argument declared a destination, only "
                        "its address- and URL-shaped values are still checked, not user or channel names"
                    )
                elif by_pack is not None:
                    message = (
                        f"none overrides pack {by_pack!r}, where {arg!r} of {tname!r} is a destination: "
                        "destination provenance is off for it"
                    )
                elif dst.is_destination_name(arg):
                    message = (
                        f"{arg!r} reads as a destination by its name; none switches destination "
                        f"provenance off for it on {tname!r}"
                    )
                else:
                    continue
                out.append(Finding("warning", tool.line, where, message))
                continue
            theirs = next(
                (dict(b.sink_kinds).get(arg) for _, b in bases if dict(b.sink_kinds).get(arg)), None
            )
            if theirs is not None and theirs not in ("none", kind):
                pname = next(p for p, b in bases if dict(b.sink_kinds).get(arg) == theirs)
                out.append(
                    Finding(
                        "warning",
                        tool.line,
                        where,
                        f"overrides pack {pname!r}: {arg!r} of {tname!r} was read as {theirs}, now as {kind}",
                    )
                )
    return out


def _tool_findings(policy: Policy, srv: ServerPolicy, i: int, j: int, tool: ToolPolicy) -> list[Finding]:
    out: list[Finding] = []
    key = f"servers[{i}].tools[{j}]"
    if tool.allowed and not srv.allowed:
        out.append(
            Finding(
                "warning",
                tool.line,
                f"{key}.allowed",
                f"tool is allowed but server {srv.name!r} is not: it can never run",
            )
        )
    if tool.allowed is False and (tool.rules or tool.approval_required):
        out.append(
            Finding(
                "warning",
                tool.line,
                key,
                "tool is not allowed, so its rules and approval_required never apply",
            )
        )
    if tool.allowed is False and tool.approval == "out_of_band":
        out.append(
            Finding(
                "warning",
                tool.line,
                f"{key}.approval",
                "tool is not allowed, so approval: out_of_band never applies",
            )
        )
    if tool.max_calls == 0 and tool.allowed:
        out.append(
            Finding(
                "warning", tool.line, f"{key}.max_calls", "max_calls: 0 forbids this allowed tool outright"
            )
        )
    deny_globs = [g for r in tool.rules if r.type == "deny_path" for g in r.globs]
    for r in tool.rules:
        if r.type == "allow_path":
            for g in r.globs:
                if any(d.pattern == g.pattern or d.match(g.pattern) for d in deny_globs):
                    out.append(
                        Finding(
                            "warning",
                            r.line,
                            f"{key}.rules",
                            f"allow_path {g.pattern!r} is shadowed by a deny_path pattern",
                        )
                    )
        if r.type in ("allow_command_pattern", "allow_query_pattern"):
            deny_type = r.type.replace("allow", "deny")
            denies = {p for d in tool.rules if d.type == deny_type for p in d.patterns}
            for p in r.patterns:
                if p in denies:
                    out.append(
                        Finding(
                            "warning",
                            r.line,
                            f"{key}.rules",
                            f"{r.type} {p!r} is also a deny pattern: it never admits anything",
                        )
                    )
    if tool.exfiltrating is None and _SENDER_NAME.search(tool.name) and not _READER_NAME.search(tool.name):
        packs = select_packs(policy, srv, "" if srv.name == "*" else srv.name, {tool.name})
        if not any(tool.name in policy.packs[p].tools for p in packs):
            out.append(
                Finding(
                    "warning",
                    tool.line,
                    key,
                    f"{tool.name!r} looks like a sending tool but has no pack entry and no 'exfiltrating': "
                    "destination provenance is off for it (set exfiltrating: true and sink_params)",
                )
            )
    if tool.exfiltrating and not tool.trusted_destinations and not srv.allowed_destinations:
        out.append(
            Finding(
                "warning",
                tool.line,
                key,
                f"sending tool {tool.name!r} has no trusted_destinations: every new destination asks a human",
            )
        )
    return out


def lint_policy(policy: Policy) -> list[Finding]:
    out: list[Finding] = []
    for i, srv in enumerate(policy.servers):
        for j, tool in enumerate(srv.tools.values()):
            out.extend(_tool_findings(policy, srv, i, j, tool))
        out.extend(_pack_overrides(policy, srv, i))
        out.extend(_sink_kind_findings(policy, srv, i))
        # packs selected by name: their sending tools need trusted destinations too
        for pname in select_packs(policy, srv, "" if srv.name == "*" else srv.name, set()):
            for tname, ptool in policy.packs[pname].tools.items():
                user = srv.tools.get(tname)
                if (
                    ptool.exfiltrating
                    and user is not None
                    and user.allowed
                    and not user.trusted_destinations
                    and not srv.allowed_destinations
                ):
                    out.append(
                        Finding(
                            "warning",
                            user.line,
                            f"servers[{i}]",
                            f"sending tool {tname!r} (pack {pname}) has no trusted_destinations: every new destination asks",
                        )
                    )
    for i, ch in enumerate(policy.tool_chains):
        if ch.action == "allow":
            out.append(Finding("warning", ch.line, f"tool_chains[{i}].action", "action allow has no effect"))
        for part, ends in (("sources", ch.sources), ("sinks", ch.sinks)):
            for k, e in enumerate(ends):
                if not _server_known(policy, e.server):
                    out.append(
                        Finding(
                            "warning",
                            ch.line,
                            f"tool_chains[{i}].{part}[{k}].server",
                            f"server {e.server!r} is not in the policy: this end never matches",
                        )
                    )
    for i, eg in enumerate(policy.egress_controls):
        for t in eg.sink_tools:
            if not _tool_known(policy, t):
                out.append(
                    Finding(
                        "warning",
                        eg.line,
                        f"egress_controls[{i}].sink_tools",
                        f"tool {t!r} is in no server entry: under default deny it never runs anyway",
                    )
                )
    for i, tn in enumerate(policy.taints):
        for t in tn.source_tools:
            if not _tool_known(policy, t):
                out.append(
                    Finding(
                        "warning",
                        tn.line,
                        f"taints[{i}].source_tools",
                        f"tool {t!r} is in no server entry: this taint is never set",
                    )
                )
    for i, tr in enumerate(policy.time_restrictions):
        if not tr.allowed_hours and not tr.denied_days:
            out.append(
                Finding(
                    "warning",
                    tr.line,
                    f"time_restrictions[{i}]",
                    "has neither allowed_hours nor denied_days: it never applies",
                )
            )
        for s in tr.servers:
            if not _server_known(policy, s):
                out.append(
                    Finding(
                        "warning",
                        tr.line,
                        f"time_restrictions[{i}].servers",
                        f"server {s!r} is not in the policy",
                    )
                )
    if policy.identities and not policy.settings.identity:
        out.append(
            Finding(
                "warning",
                policy.identities[0].line,
                "identities",
                "identities apply only when an identity is given (settings.identity)",
            )
        )
    for i, ident in enumerate(policy.identities):
        for s in ident.allowed_servers:
            if not _server_known(policy, s):
                out.append(
                    Finding(
                        "warning",
                        ident.line,
                        f"identities[{i}].allowed_servers",
                        f"server {s!r} is not in the policy",
                    )
                )
    referenced = {e.server for ch in policy.tool_chains for e in (*ch.sources, *ch.sinks)}
    referenced |= {s for tr in policy.time_restrictions for s in tr.servers}
    referenced |= {s for ident in policy.identities for s in ident.allowed_servers}
    if referenced and "*" not in referenced:
        for i, srv in enumerate(policy.servers):
            if srv.name not in referenced and srv.name != "*":
                out.append(
                    Finding(
                        "warning",
                        srv.line,
                        f"servers[{i}]",
                        f"server {srv.name!r} is never referenced by chains, time restrictions or identities",
                    )
                )
    return out


def lint_file(path: str) -> tuple[Policy | None, list[Finding]]:
    try:
        policy = load_policy(path)
    except PolicyError as e:
        return None, [Finding("error", e.line, e.key, e.message)]
    return policy, lint_policy(policy)


def findings_json(source: str, findings: list[Finding]) -> dict[str, Any]:
    return {
        "file": source,
        "errors": [asdict(f) for f in findings if f.level == "error"],
        "warnings": [asdict(f) for f in findings if f.level == "warning"],
    }
