"""The evaluator: one tools/call in, one Decision out. Pure and synchronous.

``evaluate`` runs a fixed list of small named checks in the documented order
(docs/policy.md, "Decision order"). A check may deny, ask or pass. The first
deny wins at once; an ask is remembered and returned only after every later
check has had its chance to deny, so an ask never hides a deny.

The checks a policy can never trigger are left out of its plan, compiled once
when the policy is loaded (``compile_policy``, kept on ``Policy.compiled``).
The evaluator reads the session (visor/policy/facts.py) and changes nothing
in it that a later verdict could tell apart: the only writes are to the
session's own memo tables, filled by reading.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson

from visor.policy import attestation, chains, paths, readings, rules, shell
from visor.policy import destinations as dst
from visor.policy.decision import Decision, ToolCall, stricter
from visor.policy.decision import ask as _ask
from visor.policy.decision import deny as _deny
from visor.policy.facts import EffectiveTool, SessionFacts
from visor.policy.ruletypes import RULE_TYPES
from visor.policy.schema import ChainMatch, Policy, ToolChain, ToolPolicy

# ToolCall, Decision and stricter live in visor/policy/decision.py; these
# names stay importable from here for the modules that import them so.
__all__ = [
    "CHECKS",
    "UNTRUSTED_OUTPUT_ASK",
    "Compiled",
    "Decision",
    "ToolCall",
    "compile_policy",
    "evaluate",
    "stricter",
]


class _Ctx:
    """Per-call facts computed at most once and shared by the checks."""

    __slots__ = ("_now", "_paths", "_view", "call", "eff", "memo", "policy", "prefix", "session")

    def __init__(
        self, policy: Policy, session: SessionFacts, call: ToolCall, now: datetime | None, memo: _Memo
    ) -> None:
        self.policy = policy
        self.session = session
        self.call = call
        self._now = now
        self.memo = memo
        # the call's own argument names too: one its schema leaves out still reaches the server
        self.eff: EffectiveTool = session.effective(call.tool, call.arguments)
        srv = session.server_entry
        self.prefix = f"servers[{srv.name if srv else call.server}].tools[{call.tool}]"
        self._paths: list[rules.PathValue] | None = None
        self._view: rules.CallView | None = None

    @property
    def view(self) -> rules.CallView:
        if self._view is None:
            self._view = rules.CallView(self.call.arguments)
        return self._view

    @property
    def entry(self) -> ToolPolicy | None:
        return self.eff.entry

    @property
    def now(self) -> datetime:
        """The clock, read once per call and only by the checks that need it."""
        if self._now is None:
            self._now = datetime.now(UTC)
        return self._now

    def paths(self) -> list[rules.PathValue]:
        """``(argument, raw, forms)`` for every path-like value; raises PathError."""
        if self._paths is None:
            extra = self.entry.write_params if self.entry is not None else ()
            self._paths = [
                (name, raw, paths.forms(raw, bases=self.session.path_bases))
                for name, raw in paths.iter_path_values(self.call.arguments, extra)
            ]
        return self._paths


Check = Callable[[_Ctx], "Decision | None"]


# ------------------------------------------------------------------ 2. pins


PROTECTED_PATH_REASON = (
    "an argument names Visor's own files (approval directory, audit log, pins or policy); "
    "no tool call may read or write them"
)


def check_protected_paths(c: _Ctx) -> Decision | None:
    """Above any policy: a call that names Visor's own files (an answer file written by a tool
    is the agent approving itself). The one check that reads the file system: it resolves each
    path as the server would, so a renamed directory or a hard link is still itself."""
    protected = c.session.protected
    if protected is None or protected.named_in_any_reading(c.call.arguments) is None:
        return None
    return _deny("visor.protected_path", PROTECTED_PATH_REASON)


def check_attestation(c: _Ctx) -> Decision | None:
    """A server entry that pins an invocation digest (``attestation:``) gets
    no call through unless `visor run` measured the same digest at start-up
    (visor/policy/attestation.py). mcp-visor checks this first, before limits."""
    srv = c.session.server_entry
    att = srv.attestation if srv is not None else None
    if srv is None or att is None:
        return None
    why = attestation.verdict(att.observed, att.unresolved, att.digest)
    if why is None:
        return None
    return _deny(f"servers[{srv.name}].attestation", why)


def check_server_pin(c: _Ctx) -> Decision | None:
    if c.session.server_changed:
        return _deny("pin.server_changed", "the server identifies itself differently from when it was pinned")
    return None


def check_tool_pin(c: _Ctx) -> Decision | None:
    s, tool = c.session, c.call.tool
    if not s.pins:
        if s.listing_seen:
            return _deny("pin.unknown_tool", f"tool {tool!r} was not in the server's tools/list")
        # A client normally lists tools first. Without a list there is nothing
        # to pin against, so a human decides (and no answer means deny).
        return _ask("pin.no_tools_list", f"tool {tool!r} was called before the server's tools were listed")
    if tool not in s.pins:
        return _deny("pin.unknown_tool", f"tool {tool!r} was not in the server's tools/list")
    if tool in s.changed:
        return _deny(
            "pin.changed_tool",
            f"tool {tool!r} changed its definition since it was first listed, or a listing named it "
            "in another case (a case-insensitive server runs one tool for both names)",
        )
    if tool in s.late:
        return _deny(
            "pin.new_tool",
            f"tool {tool!r} appeared after the first tools/list; it is not trusted on first use",
        )
    return None


# ------------------------------------------------------------------ 3. limits


def check_argument_size(c: _Ctx) -> Decision | None:
    limit = c.policy.settings.max_argument_size_bytes
    try:
        size = len(orjson.dumps(c.call.arguments))
    except TypeError:  # integers beyond 64 bits and the like
        import json

        size = len(json.dumps(c.call.arguments).encode())
    if size > limit:
        return _deny("limits.argument_size", f"arguments are {size} bytes, over the limit of {limit}")
    return None


def check_session_budget(c: _Ctx) -> Decision | None:
    limit = c.policy.settings.session_max_calls
    if limit is not None and c.session.calls_total >= limit:
        return _deny("budget.session_calls", f"the session has used its budget of {limit} calls")
    return None


def check_session_timeout(c: _Ctx) -> Decision | None:
    limit = c.policy.settings.session_timeout_seconds
    if limit is not None and (c.now - c.session.started_at).total_seconds() > limit:
        return _deny("limits.session_timeout", f"the session is older than {limit} seconds")
    return None


def check_tool_budget(c: _Ctx) -> Decision | None:
    entry = c.entry
    if entry is None or entry.max_calls is None:
        return None
    if entry.max_calls == 0:
        return _deny("budget.max_calls", f"tool {c.call.tool!r} is forbidden (max_calls: 0)")
    used = c.session.tool_calls.get(c.call.tool, 0)
    if used >= entry.max_calls:
        return _deny(
            "budget.max_calls", f"tool {c.call.tool!r} has used its budget of {entry.max_calls} calls"
        )
    return None


# ------------------------------------------------------------------ 4. registration


def check_registration(c: _Ctx) -> Decision | None:
    srv = c.session.server_entry
    default_deny = c.policy.default_action == "deny"
    if srv is None:
        if default_deny:
            return _deny("registration.unknown_server", f"server {c.call.server!r} is not in the policy")
        return None
    if not srv.allowed:
        return _deny(f"servers[{srv.name}].allowed", f"server {srv.name!r} is not allowed by the policy")
    twin = c.eff.case_twin
    if twin is not None:
        # The policy names this tool only in another case: judging it by the "*" entry or the
        # default would drop whatever that entry restricts (an approval, a budget, a rule).
        return _deny(
            "registration.case_variant",
            f"tool {c.call.tool!r} is named {twin!r} in the policy; name it as the server lists it",
        )
    if not c.eff.registered:
        if default_deny:
            return _deny("registration.unknown_tool", f"tool {c.call.tool!r} is not in the policy")
        return None
    entry = c.entry
    if entry is not None and entry.allowed is False:
        return _deny(f"{c.prefix}.allowed", f"tool {c.call.tool!r} is not allowed by the policy")
    return None


# ------------------------------------------------------------------ 5. arguments


def check_argument_names(c: _Ctx) -> Decision | None:
    """A member that a case-insensitive server (Go's encoding/json) reads as
    a name the schema or the policy knows, without being exactly that name,
    has two readings: Visor's checks would miss what the server does."""
    hit = readings.case_variant(c.call.arguments, c.session.argument_shape(c.call.tool).names)
    if hit is None:
        return None
    member, name = hit
    return _deny(
        "arguments.case_variant",
        f"argument member {member!r} is a case variant of {name!r}; a case-insensitive server "
        f"would read it as {name!r}",
        argument=member,
    )


def check_sensitive_paths(c: _Ctx) -> Decision | None:
    extra = c.policy.settings.sensitive_paths
    try:
        found = c.paths()
    except paths.PathError as e:
        return _deny("path.invalid", f"a path argument cannot be checked: {e}")
    for name, _raw, forms in found:
        for form in forms:
            if paths.is_sensitive(form, extra):
                return _deny(
                    "path.sensitive", f"argument {name!r} names a sensitive file ({form})", argument=name
                )
    return None


def check_command_paths(c: _Ctx) -> Decision | None:
    """Sensitive files named inside a shell command: its arguments (`cat .env`,
    `grep -r key ~/.ssh`, `--key-file=id_rsa`) and its redirections
    (`< ~/.aws/credentials`), read as bash reads the command."""
    texts = c.view.strings(rules.COMMAND_ARGS)  # (the arguments' walk, done once per call)
    if not texts:
        return None
    extra = c.policy.settings.sensitive_paths
    for cmd in texts:
        reading = shell.read_command_cached(cmd) if len(cmd) <= 1024 else shell.read_command(cmd)
        words = _command_path_words(reading)
        if not reading.certain:
            # A string the reader refuses (`bash -c '...'`, `eval`, a here-document) still runs:
            # every run of characters in it may be a file name some shell gives a program.
            words = itertools.chain(words, shell.loose_words(cmd))
        for word in words:
            try:
                found = paths.forms(word, bases=c.session.path_bases)
            except paths.PathError:
                continue  # not a path any program could open
            for form in found:
                if paths.is_sensitive(form, extra):
                    return _deny(
                        "path.sensitive",
                        f"the command names a sensitive file ({form})",
                        argument="command",
                    )
    return None


def _command_path_words(reading: shell.Reading) -> Iterator[str]:
    # Words that still hold an expansion are read as written: `~/.ssh`, and
    # `$HOME/.ssh` ends in `.ssh` whatever HOME is. A glob (`.e*`) is not
    # expanded here (docs/limits.md).
    yield from reading.targets
    for command in reading.commands:
        for i, word in enumerate(command.words):
            if i == 0 or not word:
                continue
            yield word
            if word.startswith("-") and "=" in word:
                yield word.split("=", 1)[1]  # --key-file=PATH


def check_path_rules(c: _Ctx) -> Decision | None:
    entry = c.entry
    if entry is None or not entry.rules:
        return None
    found = c.paths()
    for rule in entry.rules:
        check = RULE_TYPES[rule.type].path_check
        if check is not None:
            reason = check(rule, found)
            if reason is not None:
                return _deny(f"{c.prefix}.{rule.type}", reason)
    return None


def _prefix_targets(c: _Ctx, entry: ToolPolicy) -> Iterator[tuple[str, tuple[str, ...]]]:
    found = c.paths()
    if not entry.write_params:
        for name, _raw, forms in found:
            yield name, forms
        return
    wanted = set(entry.write_params)
    for name, _raw, forms in found:
        if name in wanted:
            yield name, forms


def check_path_prefixes(c: _Ctx) -> Decision | None:
    entry = c.entry
    if entry is None or not entry.allowed_path_prefixes:
        return None
    allowed = entry.allowed_path_prefixes + entry.prefix_alts
    for name, forms in _prefix_targets(c, entry):
        for form in forms:
            if not any(paths.under_prefix(form, p) for p in allowed):
                return _deny(
                    f"{c.prefix}.allowed_path_prefixes",
                    f"argument {name!r} ({form}) is outside the allowed path prefixes",
                    argument=name,
                )
    return None


def check_argument_rules(c: _Ctx) -> Decision | None:
    entry = c.eff.entry
    if entry is None or not entry.plan:
        return None
    view = c.view
    screens = entry.screens
    pending: Decision | None = None
    allow_list = any(RULE_TYPES[t].admits_commands for t, _f, _g in entry.plan)
    for rtype, fn, group in entry.plan:
        spec = RULE_TYPES[rtype]
        if spec.denies_commands and pending is None and not allow_list:
            # deny lists alone cannot vouch for a command Visor cannot read with
            # certainty, nor for an argument whose value bash makes only when it
            # runs (`rm -rf $9/` is `rm -rf /`): a human decides (after every deny
            # had its chance)
            why = view.unreadable()
            if why is not None:
                pending = _ask(f"{c.prefix}.{rtype}", f"command cannot be read with certainty: {why}")
            elif (runtime := view.runtime()) is not None:
                pending = _ask(
                    f"{c.prefix}.{rtype}", f"no deny pattern can see what the command becomes: {runtime}"
                )
        screen = screens.get(rtype)
        if screen is not None:
            # one combined regex tells whether any pattern of this type can match
            texts = view.commands() if spec.screen == "commands" else view.queries()
            if not any(screen.search(t) for _w, _p, ts in texts for t in ts):
                continue
        for rule in group:
            reason = fn(rule, view)
            if reason is not None:
                return _deny(f"{c.prefix}.{rtype}", reason)
    return pending


def check_arg_patterns(c: _Ctx) -> Decision | None:
    entry = c.entry
    if entry is None or not entry.arg_patterns:
        return None
    for name, rx in entry.arg_patterns:
        # every member of that name, at any depth (a model parameter's members are read by its
        # server as surely as an argument)
        for _k, member in c.view.named(frozenset((name,))):
            for value in dst.iter_values(member):
                if rx.fullmatch(value) is None:
                    return _deny(
                        f"{c.prefix}.arg_patterns",
                        f"argument {name!r} does not match {rx.pattern!r}",
                        argument=name,
                    )
    return None


# ------------------------------------------------------------------ 6. provenance


def _destination_args(c: _Ctx) -> list[tuple[str, str]]:
    """``(argument, string value)`` pairs to treat as destinations; [] if not a sending call."""
    entry, args = c.entry, c.call.arguments
    exfil = entry.exfiltrating if entry is not None else None
    if exfil is False or (exfil is None and not c.eff.fallback):
        return []
    sinks, not_sinks = (
        dst.declared_arguments(entry.sink_params, entry.sink_kinds) if entry is not None else (set(), set())
    )
    out: list[tuple[str, str]] = []
    for k, v in args.items():
        if dst.names_destination(sinks, not_sinks, k):
            out.extend((k, s) for s in dst.iter_values(v) if s.strip())
    if not out and exfil is True and not sinks:
        # a sending tool with no declared destination: every address-shaped value counts
        for k, v in args.items():
            for s in dst.iter_values(v):
                if any(d.kind in ("email", "url") for d in c.view.parse(s)):
                    out.append((k, s))
    return out


#: The ask that stands for a destination seen in untrusted output under
#: ``untrusted_output: ask``; with no approval channel the checks turn it back into the
#: ``provenance.untrusted_output`` deny (``_no_approval`` in visor/core/checks.py).
UNTRUSTED_OUTPUT_ASK = "provenance.untrusted_output_ask"


def _seen_where(c: _Ctx, d: dst.Dest, attributed: bool = False) -> str:
    where = c.session.where_seen(d, attributed)
    if where is None:
        group = c.session.group
        server = group.where(d, dst.ATTRIBUTED if attributed else dst.OUTPUT) if group is not None else None
        if group is not None and server is not None:
            # shown by another server the same client started (or by this one,
            # where the tool and field were not recorded)
            return f"in the output of server {server!r} of this client's group {group.name!r}"
        return "in this session's tool output (the tool and field were not recorded)"
    tool, field = where
    return f"in the output of tool {tool!r}, field {field}"


def _untrusted_mode(c: _Ctx) -> str:
    entry = c.entry
    if entry is not None and entry.untrusted_output is not None:
        return entry.untrusted_output
    return c.policy.settings.untrusted_output


def check_provenance(c: _Ctx) -> Decision | None:
    pairs = _destination_args(c)
    if not pairs:
        return None
    session, trust = c.session, c.eff.trust
    tool = c.call.tool
    srv = session.server_entry
    denied = srv.denied_destinations if srv is not None else ()
    # A destination is read as the kind its argument names: declared in
    # sink_kinds, else said by the argument's name (a bare name in a
    # recipient argument is a user, not a channel). A bare name in an argument
    # whose kind cannot be told is read as both a user and a channel, and is
    # placed only when both readings are (dst.readings).
    declared = dict(c.entry.sink_kinds) if c.entry is not None and c.entry.sink_kinds else {}
    parsed: list[tuple[str, dst.Dest]] = []
    alternatives: dict[int, tuple[dst.Dest, ...]] = {}
    for arg, value in pairs:
        kind = declared.get(arg)
        if kind is None or kind == "none":  # "none" here: sink_params also names it
            kind = dst.named_kind(arg)
        for d in c.view.parse(value):
            reads = dst.readings(d, kind)
            if len(reads) > 1:
                alternatives[len(parsed)] = reads
            parsed.append((arg, reads[0]))

    def placed_as(arg: str, d: dst.Dest) -> bool:
        return d.key in trust.keys or session.approved(tool, arg, d.key) or session.asserted_destination(d)

    def placed_both(arg: str, reads: tuple[dst.Dest, ...]) -> bool:
        # a human's yes covers the name as asked (its first reading); trust
        # and asserted fields must place every reading
        if session.approved(tool, arg, reads[0].key):
            return True
        return all(r.key in trust.keys or session.asserted_destination(r) for r in reads)

    # Placed without a human: an exact trusted destination, one a human
    # approved for this tool and argument earlier in the session (or in an
    # earlier one, with "remember"), or one the service itself asserted in a
    # trusted field of its output (a calendar participant, a file's
    # shared_with): a known correspondent, even if free text repeats it.
    placed = [
        placed_both(arg, alternatives[i]) if i in alternatives else placed_as(arg, d)
        for i, (arg, d) in enumerate(parsed)
    ]
    group = session.group
    # What the group says of each destination's free-text keys (True, False,
    # None: cannot tell), asked at most once per destination.
    group_seen: dict[int, bool | None] = {}

    def seen_in_group(i: int, d: dst.Dest) -> bool | None:
        if group is None:
            return False
        if i not in group_seen:
            group_seen[i] = group.seen(d)
        return group_seen[i]

    ask_seen: Decision | None = None
    # every deny first ...
    for i, ((arg, d), ok) in enumerate(zip(parsed, placed, strict=True)):
        if denied and d.domain and any(dst.domain_within(d.domain, p) for p in denied):
            return _deny(
                "provenance.denied_destination",
                f"{d.value} is a denied destination",
                destination=d.key,
                argument=arg,
            )
        # Output is untrusted: a destination its free text showed is refused,
        # unless placed above (a domain or prefix in the trust list does not
        # vouch for every address under it). So is one that another server
        # of the client's group showed.
        if not ok and (session.output.seen(d) or seen_in_group(i, d) is True):
            if _untrusted_mode(c) == "ask":
                if ask_seen is None:
                    ask_seen = _ask(
                        UNTRUSTED_OUTPUT_ASK,
                        f"destination {d.value} in argument {arg!r} appeared {_seen_where(c, d)}: "
                        "text a third party may have written, the way an injected instruction names "
                        "where to send data; send only if you know this recipient",
                        destination=d.key,
                        argument=arg,
                    )
                continue
            return _deny(
                "provenance.untrusted_output",
                f"destination {d.value} in argument {arg!r} appeared {_seen_where(c, d)}"
                if not session.output.seen(d)
                else f"destination {d.value} in argument {arg!r} appeared in this session's tool output",
                destination=d.key,
                argument=arg,
            )
    if ask_seen is not None:
        return ask_seen
    # ... then what a human must place
    full = session.output.saturated
    for i, ((arg, d), ok) in enumerate(zip(parsed, placed, strict=True)):
        if ok:
            continue
        covered = all(trust.covers(r) for r in alternatives.get(i, (d,)))
        if not covered and (
            session.attributed.seen(d) or (group is not None and group.seen(d, dst.ATTRIBUTED) is True)
        ):
            # Seen only in a field a third party writes (a received mail's
            # sender): a real sender, but whoever mails the user writes it.
            # One the trust list covers (a colleague at the user's own domain)
            # is not a stranger: who wrote the record does not change where
            # the data goes, so the trust list decides below.
            return _ask(
                "provenance.third_party_output",
                f"destination {d.value} in argument {arg!r} appeared {_seen_where(c, d, True)}, "
                "which whoever wrote the record (a mail's sender) sets, not the service",
                destination=d.key,
                argument=arg,
            )
        if covered:
            if not full:
                if seen_in_group(i, d) is False:
                    continue
                # The group cannot tell whether another server of the client
                # showed it (its store cannot be reached, a write was lost, it
                # is full): a domain or prefix never vouches for that.
                return _ask(
                    "provenance.group_unavailable",
                    f"destination {d.value} in argument {arg!r} is trusted by domain or prefix, but "
                    f"this client's group of servers ({group.name if group is not None else '?'}) cannot "
                    "tell whether another server's output showed it",
                    destination=d.key,
                    argument=arg,
                )
            # The index dropped keys once it was full: "not seen" proves nothing,
            # and a domain or prefix in the trust list never vouched for an
            # address that output showed. A human places it.
            return _ask(
                "provenance.index_full",
                f"destination {d.value} in argument {arg!r} is trusted by domain or prefix, but the "
                "output index is full and cannot tell whether this session's output showed it",
                destination=d.key,
                argument=arg,
            )
        rule = "provenance.unplaceable" if d.kind == "opaque" else "provenance.unknown_destination"
        what = (
            "cannot be read as an address"
            if d.kind == "opaque"
            else "is not a trusted or approved destination"
        )
        return _ask(
            rule, f"destination {d.value} in argument {arg!r} {what}", destination=d.key, argument=arg
        )
    return None


# ------------------------------------------------------------------ 7. session rules


def check_egress(c: _Ctx) -> Decision | None:
    # with a group, taints raised by any server of the client count
    taints = c.session.all_taints()
    if not taints:
        return None
    hit = chains.egress_hit(c.policy.egress_controls, taints, c.call.server, c.call.tool)
    if hit is None:
        return None
    where = (
        "the session is tainted"
        if hit.when_tainted in c.session.taints
        else "another server of this client's group is tainted (or the group cannot tell)"
    )
    reason = hit.reason or f"{where} ({hit.when_tainted}) and {c.call.tool!r} is an egress sink"
    return Decision(hit.action, f"egress_controls[{hit.name}]", reason)


def check_chains(c: _Ctx) -> Decision | None:
    # Every chain that is not "allow" and whose sinks include this call fires
    # when one of its sources ran within the chain's own window (or the
    # policy's chain_window_size); the name matching (a regex per sink and
    # source) is memoised in the policy's compiled plan.
    memo = c.memo
    key = (c.call.server, c.call.tool)
    hits = memo.sink_chains.get(key)
    if hits is None:
        hits = tuple(
            chain
            for chain in c.policy.tool_chains
            if chain.action != "allow" and any(s.matches(*key) for s in chain.sinks)
        )
        memo.remember_sinks(key, hits)
    if not hits:
        return None
    window = c.policy.settings.chain_window_size
    history = c.session.history
    for chain in hits:
        w = chain.within_calls or window
        recent = history[-w:] if w < len(history) else history
        for entry in recent:
            if memo.is_source(chain, entry):
                return Decision(
                    chain.action,
                    f"tool_chains[{chain.name}]",
                    f"call completes the tool chain {chain.name!r}",
                )
    return None


def check_identity(c: _Ctx) -> Decision | None:
    if not c.policy.identities or not c.session.identity:
        return None
    reason = chains.identity_verdict(c.policy.identities, c.session.identity, c.call.server, c.call.tool)
    if reason is not None:
        return _deny(f"identities[{c.session.identity}]", reason)
    return None


def check_time(c: _Ctx) -> Decision | None:
    if not c.policy.time_restrictions:
        return None
    hit = chains.time_verdict(c.policy.time_restrictions, c.call.server, c.call.tool, c.now)
    if hit is None:
        return None
    tr, reason = hit
    return Decision(tr.outside_action, f"time_restrictions[{tr.name}]", reason)


# ------------------------------------------------------------------ 8. approvals


def check_approval(c: _Ctx) -> Decision | None:
    entry = c.entry
    if entry is None:
        return None
    for rule in entry.rules:
        if RULE_TYPES[rule.type].always_asks:
            return _ask(f"{c.prefix}.{rule.type}", f"tool {c.call.tool!r} always needs approval")
    if entry.approval_required:
        return _ask(f"{c.prefix}.approval_required", f"tool {c.call.tool!r} needs approval")
    return None


#: The decision order. Names are stable: tests and docs refer to them.
CHECKS: tuple[tuple[str, Check], ...] = (
    ("visor.protected_path", check_protected_paths),
    ("attestation", check_attestation),
    ("pin.server", check_server_pin),
    ("pin.tool", check_tool_pin),
    ("limits.argument_size", check_argument_size),
    ("budget.session_calls", check_session_budget),
    ("limits.session_timeout", check_session_timeout),
    ("budget.max_calls", check_tool_budget),
    ("registration", check_registration),
    ("arguments.names", check_argument_names),
    ("path.sensitive", check_sensitive_paths),
    ("rules.paths", check_path_rules),
    ("rules.path_prefixes", check_path_prefixes),
    ("rules.arguments", check_argument_rules),
    # after the policy's own command rules, so that their verdict is the one reported
    ("path.sensitive_in_commands", check_command_paths),
    ("rules.arg_patterns", check_arg_patterns),
    ("provenance", check_provenance),
    ("egress_controls", check_egress),
    ("tool_chains", check_chains),
    ("identities", check_identity),
    ("time_restrictions", check_time),
    ("approval", check_approval),
)


# Checks that can never fire for a policy are left out of its plan (a policy
# with no chains skips the chain check); the order of the rest is unchanged.
def _tools(policy: Policy) -> list[ToolPolicy]:
    return [t for srv in policy.servers for t in srv.tools.values()]


_SKIPPABLE: dict[Check, Callable[[Policy], bool]] = {
    # packs carry no rules, prefixes or patterns: only policy entries can
    check_path_rules: lambda p: (
        not any(RULE_TYPES[r.type].path_check is not None for t in _tools(p) for r in t.rules)
    ),
    check_path_prefixes: lambda p: not any(t.allowed_path_prefixes for t in _tools(p)),
    check_argument_rules: lambda p: not any(t.plan for t in _tools(p)),
    check_arg_patterns: lambda p: not any(t.arg_patterns for t in _tools(p)),
    check_session_budget: lambda p: p.settings.session_max_calls is None,
    check_session_timeout: lambda p: p.settings.session_timeout_seconds is None,
    check_attestation: lambda p: not any(srv.attestation is not None for srv in p.servers),
    check_egress: lambda p: not p.egress_controls,
    check_chains: lambda p: not p.tool_chains,
    check_identity: lambda p: not p.identities,
    check_time: lambda p: not p.time_restrictions,
}


class _Memo:
    """Name matching results of one policy's chains (the policy is immutable).
    Bounded: tool and server names come from the client."""

    __slots__ = ("sink_chains", "sources")
    CAP = 4096

    def __init__(self) -> None:
        self.sink_chains: dict[tuple[str, str], tuple[ToolChain, ...]] = {}
        self.sources: dict[tuple[int, tuple[str, str]], bool] = {}

    def remember_sinks(self, key: tuple[str, str], chains: tuple[ToolChain, ...]) -> None:
        if len(self.sink_chains) >= self.CAP:
            self.sink_chains.clear()
        self.sink_chains[key] = chains

    def is_source(self, chain: ToolChain, entry: tuple[str, str]) -> bool:
        """Whether the call ``entry`` (server, tool) is one of the chain's sources."""
        key = (id(chain), entry)  # chains live as long as the policy that holds this memo
        hit = self.sources.get(key)
        if hit is None:
            hit = _any_matches(chain.sources, entry)
            if len(self.sources) >= self.CAP:
                self.sources.clear()
            self.sources[key] = hit
        return hit


def _any_matches(matches: tuple[ChainMatch, ...], entry: tuple[str, str]) -> bool:
    return any(m.matches(*entry) for m in matches)


@dataclass(frozen=True, slots=True)
class Compiled:
    """What the evaluator derives from one policy, once: the checks that can
    fire for it, in the decision order, and the memo of its chains' name
    matching. Built by the loader (``Policy.compiled``)."""

    checks: tuple[Check, ...]
    memo: _Memo


def compile_policy(policy: Policy) -> Compiled:
    checks = tuple(c for _n, c in CHECKS if not (c in _SKIPPABLE and _SKIPPABLE[c](policy)))
    return Compiled(checks, _Memo())


def _compiled_of(policy: Policy) -> Compiled:
    plan = policy.compiled
    if plan is None:
        # A Policy built by hand rather than loaded (tests): compiled for this call only.
        plan = compile_policy(policy)
    return plan


def evaluate(
    policy: Policy,
    session: SessionFacts,
    call: ToolCall,
    now: datetime | None = None,
    answered: frozenset[tuple[str, str | None, str | None]] = frozenset(),
) -> Decision:
    """Decide one call under every reading a server could take of it.

    The literal arguments are judged, and so are the arguments as a server
    that JSON-decodes string parameters reads them (policy/readings.py);
    the stricter verdict wins (deny over ask over allow). Where the tool's
    schema admits no string for every decoded parameter, only the decoded
    reading exists. A string whose JSON no single reading exists for
    (duplicate keys) is denied.

    ``answered`` holds the asks (rule, argument, destination) a human has
    already approved for this very call: they pass, so that the next
    question, if any, surfaces instead of hiding behind the first.
    """
    shape = session.argument_shape(call.tool)
    try:
        decoded = readings.decoded_reading(call.arguments, shape.plain_strings)
    except readings.AmbiguousJson as e:
        return _deny(
            "arguments.ambiguous_json",
            f"a string argument holds JSON that parsers read differently ({e})",
        )
    if decoded is None:
        return _evaluate_reading(policy, session, call, now, answered)
    second = ToolCall(call.server, call.tool, decoded)
    if all(k in shape.no_strings for k, v in decoded.items() if v is not call.arguments[k]):
        # Every decoded parameter admits no string in the tool's schema: no
        # server reads the string itself, only what it decodes to.
        return _evaluate_reading(policy, session, second, now, answered)
    first = _evaluate_reading(policy, session, call, now, answered)
    if first.action == "deny":
        return first
    return stricter(first, _evaluate_reading(policy, session, second, now, answered))


def _evaluate_reading(
    policy: Policy,
    session: SessionFacts,
    call: ToolCall,
    now: datetime | None,
    answered: frozenset[tuple[str, str | None, str | None]],
) -> Decision:
    """Decide one reading of a call."""
    plan = _compiled_of(policy)
    ctx = _Ctx(policy, session, call, now, plan.memo)
    pending: Decision | None = None
    for check in plan.checks:
        try:
            d = check(ctx)
        except paths.PathError as e:
            return _deny("path.invalid", f"a path argument cannot be checked: {e}")
        if d is None:
            continue
        if d.action == "deny":
            return d
        if d.action == "ask" and pending is None and (d.rule, d.argument, d.destination) not in answered:
            pending = d
    if pending is not None:
        return pending
    if not ctx.eff.registered:
        return Decision("allow", "default_action", "allowed: the policy's default_action is allow")
    return Decision("allow", ctx.prefix, "allowed by policy")
