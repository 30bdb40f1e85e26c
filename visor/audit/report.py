"""`visor report`: a Markdown review pack for a security reviewer.

Inputs are the audit log (read leniently: malformed lines are counted, never
fatal) and optionally the policy.  The pack never prints argument values, nor
`reason` strings (a reason can quote an argument), nor any record field other
than names the policy or the server defined: server, tool, rule, taint, event.

The policy is read through `visor.policy.loader.load_policy(path) -> Policy`
(schema in visor/policy/schema.py), imported lazily: a loader that cannot be
imported, or a policy it refuses, degrades to a section saying the policy
could not be analysed instead of breaking the report.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from visor.audit.paths import chain_files
from visor.audit.reader import Loaded, Window, load
from visor.audit.record import utc_timestamp
from visor.audit.show import printable
from visor.audit.verify import ChainReport, Problem, verify_files, verify_path
from visor.display import escape

if TYPE_CHECKING:
    from visor.audit.signing import PublicKey
    from visor.policy.schema import Policy, ServerPolicy, ToolPolicy

_WRITE_NAME = re.compile(
    r"(write|create|delete|remove|move|rename|edit|update|put|upload|patch|mkdir|rm)", re.I
)
_DECISIONS = ("allow", "deny", "ask", "approve", "decline", "reject")


# Markdown's own punctuation. `&` too: a renderer decodes `&#x202E;` or `&lt;` into the
# character it names, after every escape of the raw text, so a name shown would not be
# the name logged. `~` strikes through, `$` starts math where a renderer does maths.
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>|#&~$])")


def md(value: Any) -> str:
    """A name from a log or policy, safe inside Markdown table cells and text."""
    return _MD_SPECIAL.sub(r"\\\1", printable(value, 80)) or "-"


def md_long(value: Any) -> str:
    """Like `md` without the length cut (for Visor's own messages)."""
    return _MD_SPECIAL.sub(r"\\\1", printable(value)) or "-"


# ------------------------------------------------------------------ policy view


@dataclass(frozen=True, slots=True)
class ToolView:
    server: str
    name: str
    allowed: bool
    source: str  # "policy", "pack:NAME", "policy+pack:NAME", "fallback"
    controls: tuple[str, ...]
    sends: bool
    trusted: int
    writes: bool
    confined: bool
    constrained: bool


@dataclass(frozen=True, slots=True)
class PolicyView:
    source: str
    sha256: str
    default_action: str
    tools: tuple[ToolView, ...]
    servers: tuple[tuple[str, bool, str], ...]  # name, allowed, packs
    global_controls: tuple[str, ...]
    settings: dict[str, Any] = field(default_factory=dict)
    # Controls every tool has under this policy, listed or matched by "*".
    always: tuple[str, ...] = ()

    def wildcard(self, server: str) -> ToolView | None:
        """The "*" tool entry a tool of `server` falls under: its own server's, else the "*" server's."""
        names = {s for s, _, _ in self.servers}
        srv = server if server in names else "*" if "*" in names else None
        if srv is None:
            return None
        return next((t for t in self.tools if t.server == srv and t.name == "*"), None)


def _pack_tools(policy: Policy, server: ServerPolicy) -> dict[str, tuple[str, ToolPolicy]]:
    """Pack entries that apply to `server`: explicit `packs:`, else selected by server name."""
    allowed_packs = policy.settings.packs
    chosen = server.packs
    out: dict[str, tuple[str, ToolPolicy]] = {}
    for pname, pack in policy.packs.items():
        if allowed_packs is not None and pname not in allowed_packs:
            continue
        selected = pname in chosen if chosen is not None else server.name.lower() in pack.servers
        if selected:
            for tname, tool in pack.tools.items():
                out.setdefault(tname, (f"pack:{pname}", tool))
    return out


def _mentions(policy: Policy, server: str, tool: str) -> list[str]:
    """Session-level controls that name this tool (chains, taints, egress, time)."""
    found: list[str] = []
    for chain in policy.tool_chains:
        for role, matches in (("source", chain.sources), ("sink", chain.sinks)):
            if any(m.matches(server, tool) for m in matches):
                found.append(f"chain {chain.name} ({role}, {chain.action})")
    for taint in policy.taints:
        if tool in taint.source_tools:
            found.append(f"sets taint {taint.name}")
    for eg in policy.egress_controls:
        if tool in eg.sink_tools:
            found.append(f"egress {eg.name} when {eg.when_tainted} ({eg.action})")
    for tr in policy.time_restrictions:
        if tool in tr.tool_names or any(r.fullmatch(tool) for r in tr.tools):
            found.append(f"time window {tr.name}")
    return found


def _tool_view(policy: Policy, server: ServerPolicy, tool: ToolPolicy, source: str) -> ToolView:
    controls: list[str] = []
    # max_calls 0 forbids the tool outright, whatever `allowed` says.
    allowed = server.allowed and tool.allowed is not False and tool.max_calls != 0
    if tool.approval_required:
        controls.append("approval required")
    if tool.risk:
        controls.append(f"risk {tool.risk}")
    rules = Counter(r.type for r in tool.rules)
    controls += [f"{t} ×{n}" if n > 1 else t for t, n in sorted(rules.items())]
    if tool.max_calls is not None:
        controls.append("forbidden (max_calls 0)" if tool.max_calls == 0 else f"max_calls {tool.max_calls}")
    sinks = tool.sink_params
    sends = bool(tool.exfiltrating) or bool(sinks)
    trusted = len(tool.trusted_destinations) + len(server.allowed_destinations)
    trusted += rules.get("allow_recipient_domain", 0)
    if sends:
        controls.append(f"sends via {', '.join(sinks) or 'any argument'}; trusted destinations: {trusted}")
    write_params = tool.write_params
    prefixes = tool.allowed_path_prefixes
    confined = bool(prefixes) or "allow_path" in rules
    writes = bool(write_params) or bool(_WRITE_NAME.search(tool.name))
    if write_params:
        controls.append(f"writes via {', '.join(write_params)}; confined to {len(prefixes)} prefix(es)")
    elif prefixes:
        controls.append(f"paths confined to {len(prefixes)} prefix(es)")
    if tool.arg_patterns:
        controls.append(f"argument patterns ×{len(tool.arg_patterns)}")
    controls += _mentions(policy, server.name, tool.name)
    constrained = bool(controls) and controls != [f"risk {tool.risk}"]
    return ToolView(
        server=server.name,
        name=tool.name,
        allowed=allowed,
        source=source if source != "policy" else (tool.origin or "policy"),
        controls=tuple(controls),
        sends=sends,
        trusted=trusted,
        writes=writes,
        confined=confined,
        constrained=constrained,
    )


def analyse_policy(policy: Policy) -> PolicyView:
    tools: list[ToolView] = []
    servers: list[tuple[str, bool, str]] = []
    for server in policy.servers:
        packs = server.packs
        servers.append((server.name, server.allowed, "auto" if packs is None else ", ".join(packs) or "none"))
        own = dict(server.tools)
        for tool in own.values():
            tools.append(_tool_view(policy, server, tool, "policy"))
        # A pack describes a tool (what it sends or writes); registration still comes
        # from the policy: the server's "*" entry if any, else the default action.
        wildcard = own.get("*")
        if wildcard is not None:
            registered = wildcard.allowed is not False
        else:
            registered = policy.default_action == "allow"
        for tname, (origin, tool) in sorted(_pack_tools(policy, server).items()):
            if tname not in own:
                view = _tool_view(policy, server, tool, origin)
                label = f"{origin} via *" if wildcard is not None else f"{origin}, not listed"
                tools.append(dataclasses.replace(view, allowed=view.allowed and registered, source=label))
    settings = policy.settings
    glob: list[str] = [f"default action: {policy.default_action}"]
    for label, value in (
        ("session call budget", settings.session_max_calls),
        ("argument size limit (bytes)", settings.max_argument_size_bytes),
        ("output size limit (bytes)", settings.max_output_size_bytes),
        ("approval timeout (s)", settings.approval_timeout_seconds),
    ):
        glob.append(f"{label}: {value if value is not None else 'none'}")
    glob.append(f"taints: {len(policy.taints)}")
    glob.append(f"egress controls: {len(policy.egress_controls)}")
    glob.append(f"tool chains: {len(policy.tool_chains)}")
    redaction = policy.redaction
    n_red = len(redaction.patterns) + len(redaction.output_patterns)
    glob.append(f"redaction patterns: {n_red}")
    always = ["pinned: refused if not in the first tools/list or changed since"]
    n_sensitive = len(redaction.sensitive_files)
    if n_sensitive:
        always.append(f"sensitive files denied in path-like arguments ({n_sensitive} patterns)")
    return PolicyView(
        source=policy.source,
        sha256=policy.sha256,
        default_action=policy.default_action,
        tools=tuple(tools),
        servers=tuple(servers),
        global_controls=tuple(glob),
        always=tuple(always),
    )


# What a tool matched only by a "*" entry gets besides the entry's own controls.
_WILDCARD_SENDS = "destination provenance on destination-shaped arguments (to, cc, url, channel, ...)"


DEFAULT_POLICY = "<default>"


def _load_policy(path: Path | str) -> tuple[PolicyView | None, str | None]:
    try:
        # lazy: the loader is optional for the report
        import importlib

        loader = importlib.import_module("visor.policy.loader")
    except ImportError as exc:
        return None, f"the policy loader is not available ({exc})"
    try:
        policy: Policy = loader.load_default_policy() if path == DEFAULT_POLICY else loader.load_policy(path)
    except Exception as exc:  # any loader error is reported, not raised: the pack is still useful
        return None, f"{type(exc).__name__}: {printable(str(exc), 300)}"
    return analyse_policy(policy), None


# -------------------------------------------------------------------- findings


@dataclass(frozen=True, slots=True)
class Finding:
    severity: str  # "high", "medium", "low", "info"
    text: str


def findings(
    view: PolicyView | None, chain: ChainReport, loaded: Loaded, seen: set[tuple[str, str]]
) -> list[Finding]:
    out: list[Finding] = []
    if not chain.ok:
        out.append(Finding("high", f"The audit chain does not verify: {md_long(str(chain.problem))}."))
    if loaded.malformed:
        out.append(Finding("medium", f"{loaded.malformed} malformed line(s) in the log were skipped."))
    if view is None:
        return out
    if view.default_action == "allow":
        out.append(Finding("high", "The policy's default action is allow: unknown tools run unchecked."))
    for t in view.tools:
        if not t.allowed:
            continue
        where = f"{md(t.server)} / {md(t.name)}"
        if t.sends and t.trusted == 0:
            out.append(
                Finding(
                    "medium",
                    f"{where} sends data but has no trusted destinations: every send is asked or denied.",
                )
            )
        if t.writes and not t.confined:
            out.append(
                Finding("high", f"{where} writes but is not confined to a path prefix or allow_path rule.")
            )
        if not t.constrained and t.name == "*":
            out.append(
                Finding(
                    "medium",
                    f"{where}: every tool the server lists is allowed; beyond pinning and the policy-wide "
                    "checks (sensitive files, destination provenance) nothing constrains them. "
                    "`visor policy scaffold` writes an explicit policy to start from.",
                )
            )
        elif not t.constrained:
            out.append(
                Finding("medium", f"{where} is allowed and nothing constrains it beyond being listed.")
            )
    known = {(t.server, t.name) for t in view.tools}
    servers = {s for s, _, _ in view.servers}
    for server, tool in sorted(seen - known):
        if server in servers or "*" in servers:
            continue
        out.append(Finding("info", f"{md(server)} / {md(tool)} appears in the log but not in this policy."))
    return out


# ------------------------------------------------------------------ statistics


def _table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> list[str]:
    head = list(header)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


_OWASP: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (
        "LLM01 Prompt Injection",
        "Partial",
        "Does not detect injected instructions. Limits what a misled agent can do: default deny, "
        "argument rules, sends to destinations first seen in untrusted tool output are denied, "
        "session taints and tool chains.",
        ("deny", "ask", "taint"),
    ),
    (
        "LLM02 Sensitive Information Disclosure",
        "Partial",
        "Sensitive-path rules, egress controls after a taint, recipient rules, redaction of "
        "arguments before they are logged. Content sent to a trusted destination is not inspected.",
        ("redact", "taint", "deny"),
    ),
    (
        "LLM03 Supply Chain",
        "Partial",
        "Server identity and tool pins: a tool missing from the first tools/list, or whose "
        "description or schema changed, is denied. Does not vet what a server does.",
        ("pin", "pin_changed"),
    ),
    ("LLM04 Data and Model Poisoning", "Not covered", "Training and fine-tuning data are out of scope.", ()),
    (
        "LLM05 Improper Output Handling",
        "Partial",
        "The model's output that becomes a tool call is validated before it runs: strict JSON-RPC, "
        "normalised paths, command and query patterns. What a client does with tool results is out of scope.",
        ("reject", "deny"),
    ),
    (
        "LLM06 Excessive Agency",
        "Core",
        "Default-deny registration per server and tool, per-tool and per-session budgets, "
        "human approval, every verdict in a hash-chained log.",
        ("allow", "deny", "ask", "approve", "decline"),
    ),
    ("LLM07 System Prompt Leakage", "Not covered", "Visor does not see prompts.", ()),
    ("LLM08 Vector and Embedding Weaknesses", "Not covered", "Retrieval stores are out of scope.", ()),
    ("LLM09 Misinformation", "Not covered", "Visor judges actions, not the truth of text.", ()),
    (
        "LLM10 Unbounded Consumption",
        "Partial",
        "Session call budget, per-tool max_calls, argument and message size limits. No rate or cost limits.",
        ("deny",),
    ),
)

_NOT_COVERED = (
    "Anything that does not pass through Visor as an MCP `tools/call` over stdio: an agent with a "
    "shell, raw HTTP or another MCP transport can act around it.",
    "Content inspection: an allowed call to a trusted destination can still carry sensitive data; Visor is not DLP.",
    "Detecting prompt injection: Visor constrains actions; it does not judge text.",
    "A malicious MCP server: pins detect a changed tool list, not what an unchanged tool does.",
    "Tamper-proof evidence: the hash chain has no key. Anyone able to write the log can rewrite it "
    "from the point of an edit onwards; it is tamper-evident only against partial edits, or against "
    "all edits once its head hash is recorded elsewhere (`visor audit verify --head`). Signed "
    "checkpoints (`visor run --signing-key`) protect the records before each checkpoint, not a log cut "
    "back to an earlier clean exit, a deleted log, or anything once the private key is read.",
    "Confidentiality of the log: it holds redacted arguments in plain text, protected by file modes only.",
    "Statistics here are as complete as the log: records outside the time window and malformed lines are not counted.",
)


def policies_in_log(recs: Iterable[dict[str, Any]]) -> dict[str, str]:
    """sha256 -> source ("<default>" or a path) of every policy the sessions in `recs` loaded,
    at start or by a reload that was put in force (SIGHUP, --watch-policy)."""
    found: dict[str, str] = {}
    for r in recs:
        event = r.get("event")
        if event == "policy_reload" and r.get("ok") is not True:
            continue
        if event in ("policy_load", "policy_reload") and isinstance(r.get("policy"), str):
            found[r["policy"]] = str(r.get("source", ""))
    return found


def _policy_from_log(recs: tuple[dict[str, Any], ...]) -> tuple[Path | str | None, str | None]:
    """The one policy the logged sessions ran under, when it can be read back exactly.

    Returns (source for _load_policy, None) or (None, why not)."""
    used = policies_in_log(recs)
    if not used:
        return None, "the log records no policy"
    if len(used) > 1:
        names = ", ".join(sorted(md(Path(src).name or src) for src in used.values()))
        return (
            None,
            f"the sessions ran under {len(used)} different policies ({names}); name one with `--policy`",
        )
    sha, source = next(iter(used.items()))
    if source == DEFAULT_POLICY:
        return DEFAULT_POLICY, None
    path = Path(source)
    try:
        data = path.read_bytes()
    except OSError:
        return None, f"the policy the sessions ran under ({md(path.name)}) cannot be read here"
    if hashlib.sha256(data).hexdigest() != sha:
        return (
            None,
            f"the policy file {md(path.name)} changed since the sessions ran; name one with `--policy`",
        )
    return path, None


def _verify_log(log: Path, keys: Sequence[PublicKey]) -> ChainReport:
    if not any(p.exists() for p in chain_files(log)):
        return ChainReport(
            (log,), 0, None, None, None, 0, Problem(log, 0, 0, "no such file", "missing", False), ()
        )
    return verify_path(log, keys=keys)


def build_report(
    audit_files: list[Path],
    *,
    policy_path: Path | None = None,
    win: Window = Window(),  # noqa: B008 - Window is frozen
    now: datetime | None = None,
    logs: list[Path] | None = None,
    policy_from_log: bool = False,
    keys: Sequence[PublicKey] = (),
) -> str:
    """The pack for one chain (`audit_files`) or several (`logs`, each named by its live file).

    With `keys`, the integrity line checks the signed checkpoints too (`visor audit verify --key`).

    With `policy_from_log` and no `policy_path`, the policy is the one the
    logged sessions ran under (the embedded default included), when there is
    exactly one and it is unchanged.
    """
    chains = [chain_files(log) for log in logs] if logs is not None else [audit_files]
    audit_files = [f for files in chains for f in files]
    parts = [load(files, win) for files in chains]
    loaded = Loaded(
        tuple(audit_files),
        tuple(r for part in parts for r in part.records),
        sum(part.malformed for part in parts),
        tuple(m for part in parts for m in part.missing),
    )
    if logs is not None:
        # As `visor audit verify` judges each log: its files first (a live file deleted or emptied
        # next to its rotated files, a hole in their numbers), then every line.
        reports = [_verify_log(log, keys) for log in logs]
    else:
        reports = [verify_files([p for p in files if p.exists()], keys=keys) for files in chains]
    chain = next((c for c in reports if not c.ok), reports[0] if reports else verify_files([]))
    recs = loaded.records
    policy_note = None
    source: Path | str | None = policy_path
    if source is None and policy_from_log:
        source, policy_note = _policy_from_log(recs)
    view, policy_error = _load_policy(source) if source is not None else (None, None)
    seen = {(str(r.get("server")), str(r.get("tool"))) for r in recs if r.get("tool") is not None}

    lines: list[str] = ["# Visor review pack", ""]
    lines.append(f"Generated {utc_timestamp(now or datetime.now(UTC))}.")
    window_text = f"{win.since.isoformat() if win.since else 'start'} to {win.until.isoformat() if win.until else 'end'}"
    lines.append(f"Time window: {window_text} (record timestamps, UTC).")
    lines.append("")
    lines.append("Argument values and reason texts are never included in this pack; only names defined")
    lines.append("by the policy or the servers appear (server, tool, rule, taint).")
    lines.append("")

    lines += ["## 1. Evidence", ""]
    lines.append(f"- Audit files: {', '.join(md(p.name) for p in audit_files) or 'none'}")
    if loaded.missing:
        lines.append(f"- Missing files: {', '.join(md(p.name) for p in loaded.missing)}")
    lines.append(f"- Records in the window: {len(recs)}; malformed lines skipped: {loaded.malformed}")
    sessions = {r.get("session") for r in recs}
    lines.append(f"- Sessions: {len(sessions)}")
    servers_seen = sorted({str(r.get("server")) for r in recs if r.get("event") == "session_start"})
    if servers_seen:
        lines.append(f"- Servers: {', '.join(md(s) for s in servers_seen)}")
    if recs:
        stamps = sorted(str(r.get("ts", "")) for r in recs)
        lines.append(f"- First and last record: {md(stamps[0])} to {md(stamps[-1])}")
    reloads = [r for r in recs if r.get("event") == "policy_reload"]
    if reloads:
        refused = sum(1 for r in reloads if r.get("ok") is not True)
        lines.append(
            f"- Policy reloads: {len(reloads) - refused} put in force, {refused} refused "
            "(the old policy stayed in force)"
        )
    verdict = "verifies" if all(c.ok for c in reports) else "DOES NOT VERIFY"
    lines.append(f"- Chain integrity (whole log, not only the window): {verdict}")
    for c in reports:
        lines.append(f"  - {md_long(c.summary())}")
    signed = [r for r in recs if r.get("event") == "checkpoint"]
    if signed and not keys:
        lines.append(
            f"- Signed checkpoints in the window: {len(signed)}; their signatures were not checked "
            "(`visor report --key PUB` or `visor audit verify --key PUB` checks them)"
        )
    elif not keys:
        lines.append("- Signed checkpoints: none (the logs were written without `--signing-key`)")
    lines.append("")

    lines += ["## 2. Controls per server and tool", ""]
    if source is None:
        why = policy_note or "No policy was given (`--policy`)"
        lines.append(f"{why}, so controls cannot be listed. Tools seen in the log:")
        lines.append("")
        lines += _table(["Server", "Tool"], sorted((md(s), md(t)) for s, t in seen))
    elif view is None:
        shown_name = (
            "the embedded default policy" if source == DEFAULT_POLICY else f"`{md(Path(source).name)}`"
        )
        digest = (
            hashlib.sha256(Path(source).read_bytes()).hexdigest()
            if source != DEFAULT_POLICY and Path(source).is_file()
            else "unreadable"
        )
        lines.append(f"The policy {shown_name} (sha256 {digest}) could not be analysed: {md(policy_error)}.")
        lines.append("Findings below are limited to the log.")
    else:
        if source == DEFAULT_POLICY:
            lines.append(
                f"The embedded default policy (what `visor run` enforces without `--policy`), "
                f"sha256 `{view.sha256}`, read from the log."
            )
        else:
            lines.append(
                f"Policy `{md(Path(view.source).name or Path(source).name)}`, sha256 `{view.sha256}`."
            )
        lines.append("")
        lines += [f"- {md(c)}" for c in view.global_controls]
        lines += [f"- every tool: {md(c)}" for c in view.always]
        lines.append("")
        lines += _table(
            ["Server", "Allowed", "Packs"], ((md(n), "yes" if a else "no", md(p)) for n, a, p in view.servers)
        )
        lines.append("")
        rows = [
            (
                md(t.server),
                md(t.name),
                "yes" if t.allowed else "no",
                md(t.source),
                "; ".join(md(c) for c in t.controls) or "none",
            )
            for t in sorted(view.tools, key=lambda t: (t.server, t.name))
        ]
        known = {(t.server, t.name) for t in view.tools}
        for server, tool in sorted(seen - known):
            star = view.wildcard(server)
            if star is None:
                rows.append(
                    (md(server), md(tool), f"by default action ({view.default_action})", "fallback", "none")
                )
                continue
            controls = [*star.controls, *view.always]
            if not star.sends:
                controls.append(_WILDCARD_SENDS)
            rows.append(
                (
                    md(server),
                    md(tool),
                    "yes" if star.allowed else "no",
                    md(f"{star.server} / * entry"),
                    "; ".join(md(c) for c in controls),
                )
            )
        lines += _table(["Server", "Tool", "Allowed", "Source", "Controls"], rows)
    lines.append("")

    lines += ["## 3. Findings", ""]
    found = findings(view, chain, loaded, seen)
    found += [
        Finding("high", f"The audit chain does not verify: {md_long(str(c.problem))}.")
        for c in reports
        if not c.ok and c is not chain
    ]
    order = {"high": 0, "medium": 1, "low": 2, "info": 3}
    lines += [f"- **{f.severity}**: {f.text}" for f in sorted(found, key=lambda f: order[f.severity])] or [
        "- None."
    ]
    lines.append("")

    lines += ["## 4. Verdicts", ""]
    by_tool: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    by_rule: dict[str, Counter[str]] = defaultdict(Counter)
    for r in recs:
        event = r.get("event")
        if event in _DECISIONS:
            by_tool[(str(r.get("server", "-")), str(r.get("tool", "-")))][event] += 1
            by_rule[str(r.get("rule") or "-")][event] += 1
    if by_tool:
        lines += ["By tool:", ""]
        lines += _table(
            ["Server", "Tool", *_DECISIONS],
            ((md(s), md(t), *(c[e] for e in _DECISIONS)) for (s, t), c in sorted(by_tool.items())),
        )
        lines += ["", "By rule:", ""]
        lines += _table(
            ["Rule", *_DECISIONS], ((md(k), *(c[e] for e in _DECISIONS)) for k, c in sorted(by_rule.items()))
        )
    else:
        lines.append("No verdicts in the window.")
    lines.append("")

    lines += ["## 5. Taints and pins", ""]
    taints = Counter(str(r.get("taint") or r.get("name") or "-") for r in recs if r.get("event") == "taint")
    pins = Counter(
        (str(r.get("event")), str(r.get("server", "-")), str(r.get("tool", "-")))
        for r in recs
        if r.get("event") in ("pin", "pin_changed")
    )
    if taints:
        lines += _table(["Taint", "Times set"], ((md(k), n) for k, n in sorted(taints.items())))
    else:
        lines.append("No taints were set.")
    lines.append("")
    if pins:
        lines += _table(
            ["Event", "Server", "Tool", "Count"],
            ((md(e), md(s), md(t), n) for (e, s, t), n in sorted(pins.items())),
        )
    else:
        lines.append("No pins were recorded.")
    lines.append("")

    lines += ["## 6. OWASP Top 10 for LLM Applications (2025)", ""]
    events = Counter(str(r.get("event")) for r in recs)
    owasp = []
    for name, level, text, evs in _OWASP:
        evidence = ", ".join(f"{e}: {events[e]}" for e in evs) or "-"
        owasp.append((name, level, text, evidence))
    lines += _table(["Risk", "Coverage", "What Visor does", "Events in this log"], owasp)
    lines.append("")

    lines += ["## 7. What Visor does not cover", ""]
    lines += [f"- {t}" for t in _NOT_COVERED]
    lines.append("")
    # Every cell went through md() already; this is the last guard for the
    # whole page: no control character reaches whoever reads it in a terminal.
    return escape("\n".join(lines), keep="\n")
