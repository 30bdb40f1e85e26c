"""Per-session state: pins, history, budgets, taints, seen output, approvals.

The evaluator reads this state and never changes it; the gate changes it
through the ``record_*``/``observe_*``/``remember_*`` methods, after a verdict
is committed. Nothing here does I/O: pin persistence hands plain dicts to the
caller (``export_pins``/``import_pins``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from visor.policy import chains, readings
from visor.policy import destinations as dst
from visor.policy.loader import build_plan, build_screens
from visor.policy.schema import Pack, Policy, ServerPolicy, ToolPolicy

if TYPE_CHECKING:
    from visor.policy.evaluate import Decision, ToolCall

PIN_FORMAT = 2


@dataclass(frozen=True, slots=True)
class SessionEvent:
    kind: str  # "pin", "pin_changed", "pin_new", "taint"
    tool: str | None
    detail: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Effective:
    """What the evaluator needs to know about one tool in this session."""

    entry: ToolPolicy | None  # merged pack + policy entry (None: nothing known)
    registered: bool  # the policy lists the tool, or has a "*" tool entry
    fallback: bool  # no pack entry and no exact policy entry: guess destinations by name
    trust: dst.TrustList
    packs: tuple[str, ...] = ()


# Every field of a tool that a client shows to the model or to the user, or
# that changes how the tool runs: a tool re-titled, re-iconed or re-annotated
# after it was pinned is a changed tool.
PINNED_FIELDS = (
    "name", "title", "description", "inputSchema", "outputSchema", "annotations", "icons", "_meta", "execution",
)  # fmt: skip
# What pin files of format 1 covered: kept to carry those pins over without a gap.
_PINNED_FIELDS_V1 = ("description", "inputSchema", "annotations", "outputSchema")


def _digest(tool: dict, fields: tuple[str, ...]) -> str:
    body = {k: tool.get(k) for k in fields}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def pin_digest(tool: dict) -> str:
    """SHA-256 of the canonical JSON of every pinned field of a tool."""
    return _digest(tool, PINNED_FIELDS)


def merge_tool(base: ToolPolicy | None, over: ToolPolicy) -> ToolPolicy:
    """Field-by-field merge: what ``over`` says wins, lists are unions, and a
    field ``over`` does not mention keeps ``base``'s value, so restating one
    field never switches another check off."""
    if base is None:
        return over

    def union(a: tuple, b: tuple) -> tuple:
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
        trusted_destinations=union(base.trusted_destinations, over.trusted_destinations),
        write_params=union(base.write_params, over.write_params),
        allowed_path_prefixes=union(base.allowed_path_prefixes, over.allowed_path_prefixes),
        prefix_alts=union(base.prefix_alts, over.prefix_alts),
        arg_patterns=base.arg_patterns + over.arg_patterns,
        max_calls=over.max_calls if over.max_calls is not None else base.max_calls,
        screens=over.screens if not base.rules else build_screens(base.rules + over.rules),
        plan=over.plan if not base.rules else build_plan(base.rules + over.rules),
        origin=f"{over.origin}+{base.origin}",
        line=over.line or base.line,
    )


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


class SessionState:
    """State of one proxied session (one ``visor run``, one upstream server)."""

    def __init__(self, policy: Policy, server: str, identity: str | None = None) -> None:
        self.policy = policy
        self.server = server
        self.identity = identity if identity is not None else policy.settings.identity
        self.started_at = datetime.now(UTC)
        self.server_entry: ServerPolicy | None = policy.server(server)
        # pins
        self.pins: dict[str, str] = {}
        # inputSchema per listed tool: which member names a server reads,
        # and which parameters it takes as plain strings (policy/readings.py)
        self.schemas: dict[str, Any] = {}
        self._names: dict[str, readings.ArgumentShape] = {}
        self.baseline: set[str] = set()
        self.changed: set[str] = set()
        self.late: set[str] = set()
        self.listing_complete = False
        self.listing_seen = False
        # The first listing may come in pages; only pages fetched by following
        # its own nextCursor belong to it. A listing started afresh before it
        # was complete closes it: tools first seen after that are late.
        self._next_cursor: str | None = None
        # format-1 pins (fewer fields): a tool whose old digest still matches is re-pinned in full
        self._legacy_pins: dict[str, str] = {}
        self.pins_loaded_from: str | None = None
        self.server_info_pin: str | None = None
        self.server_changed = False
        # history and budgets (only allowed calls count)
        self.history: list[tuple[str, str]] = []
        self._history_cap = max(
            [policy.settings.chain_window_size, *(c.within_calls or 0 for c in policy.tool_chains)]
        )
        self.calls_total = 0
        self.tool_calls: dict[str, int] = {}
        self.taints: set[str] = set()
        # provenance
        self.output = dst.OutputIndex(policy.settings.output_index_max_keys)
        self.outputs_seen = 0
        self.approvals: set[tuple[str, str, str]] = set()
        # resolution cache
        self.active_packs: tuple[str, ...] = ()
        self._effective: dict[str, Effective] = {}
        self._reselect_packs()

    # ------------------------------------------------------------ resolution

    def _reselect_packs(self) -> None:
        packs = select_packs(self.policy, self.server_entry, self.server, set(self.pins))
        if packs != self.active_packs or not self._effective:
            self.active_packs = packs
            self._effective.clear()
            self._names.clear()

    def effective(self, tool: str) -> Effective:
        eff = self._effective.get(tool)
        if eff is None:
            eff = self._resolve(tool)
            self._effective[tool] = eff
        return eff

    def _resolve(self, tool: str) -> Effective:
        pack_entries: list[tuple[Pack, ToolPolicy]] = [
            (self.policy.packs[p], self.policy.packs[p].tools[tool])
            for p in self.active_packs
            if tool in self.policy.packs[p].tools
        ]
        base: ToolPolicy | None = None
        for _pack, entry in pack_entries:
            base = merge_tool(base, entry) if base is not None else entry
        srv = self.server_entry
        exact = srv.tools.get(tool) if srv is not None else None
        star = srv.tools.get("*") if srv is not None and exact is None else None
        user = exact or (replace(star, name=tool) if star is not None else None)
        entry = merge_tool(base, user) if user is not None else base
        trusted: tuple[str, ...] = entry.trusted_destinations if entry is not None else ()
        if srv is not None:
            trusted = trusted + srv.allowed_destinations
        return Effective(
            entry=entry,
            registered=user is not None,
            fallback=exact is None and base is None,
            trust=dst.build_trust(trusted) if trusted else dst.EMPTY_TRUST,
            packs=tuple(p.name for p, _ in pack_entries),
        )

    def argument_shape(self, tool: str) -> readings.ArgumentShape:
        """The member names the tool's arguments are read by (its schema's and
        the policy's), and which parameters its schema types as strings."""
        hit = self._names.get(tool)
        if hit is None:
            schema = self.schemas.get(tool)
            names = readings.schema_property_names(schema)
            entry = self.effective(tool).entry
            if entry is not None:
                names.update(entry.write_params)
                names.update(entry.sink_params)
                names.update(n for n, _rx in entry.arg_patterns)
            plain, no_strings = readings.typed_properties(schema)
            hit = readings.ArgumentShape(readings.ArgumentNames.of(names), plain, no_strings)
            if len(self._names) >= 4096:
                self._names.clear()
            self._names[tool] = hit
        return hit

    # ------------------------------------------------------------ observing

    def observe_server_info(self, info: dict) -> list[SessionEvent]:
        """Pin the server's self-reported name (``initialize`` result ``serverInfo``)."""
        name = info.get("name") if isinstance(info, dict) else None
        if not isinstance(name, str):
            return []
        if self.server_info_pin is None:
            self.server_info_pin = name
            return [SessionEvent("pin", None, {"server_info": name})]
        if name != self.server_info_pin:
            self.server_changed = True
            return [SessionEvent("pin_changed", None, {"server_info": name, "pinned": self.server_info_pin})]
        return []

    def observe_tools_list(self, result: dict, cursor: object = None) -> list[SessionEvent]:
        """Pin a tools/list page. ``cursor`` is the ``params.cursor`` of the request it answers."""
        tools = result.get("tools") if isinstance(result, dict) else None
        if not isinstance(tools, list):
            return []
        events: list[SessionEvent] = []
        if (
            self.listing_seen
            and not self.listing_complete
            and (cursor is None or cursor != self._next_cursor)
        ):
            # not the next page of the first listing: that listing ends here, incomplete
            self.listing_complete = True
        self.listing_seen = True
        for tool in tools:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                continue
            name = tool["name"]
            digest = pin_digest(tool)
            if name not in self.schemas or self.pins.get(name) == digest:
                # the schema of the pinned tool; a changed tool is denied anyway
                self.schemas[name] = tool.get("inputSchema")
                self._names.pop(name, None)
            pinned = self.pins.get(name)
            legacy = self._legacy_pins.pop(name, None)
            if legacy is not None and pinned is None:
                if _digest(tool, _PINNED_FIELDS_V1) == legacy:
                    self.pins[name] = digest
                    self.baseline.add(name)
                    events.append(SessionEvent("pin", name, {"sha256": digest, "upgraded_from": legacy}))
                else:
                    self.pins[name] = legacy
                    self.baseline.add(name)
                    self.changed.add(name)
                    events.append(SessionEvent("pin_changed", name, {"pinned": legacy, "sha256": digest}))
                continue
            if pinned is None:
                self.pins[name] = digest
                if self.listing_complete:
                    # appeared after the first complete listing: not trusted on first use
                    self.late.add(name)
                    events.append(SessionEvent("pin_new", name, {"sha256": digest}))
                else:
                    self.baseline.add(name)
                    events.append(SessionEvent("pin", name, {"sha256": digest}))
            elif pinned != digest and name not in self.changed:
                self.changed.add(name)
                events.append(SessionEvent("pin_changed", name, {"pinned": pinned, "sha256": digest}))
        nxt = result.get("nextCursor")
        if not self.listing_complete:
            if isinstance(nxt, str) and nxt:
                self._next_cursor = nxt
            else:
                self.listing_complete = True
        self._reselect_packs()
        return events

    def observe_output(self, tool: str | None, result: dict) -> None:
        """Index every destination-like token in a server result or error."""
        self.outputs_seen += 1
        stack: list[Any] = [result]
        add = self.output.add
        # Plain words ("content", "text", "isError", "ok") hold no key: they
        # are skipped here, before a call (OutputIndex.add would return at once).
        while stack:
            v = stack.pop()
            if isinstance(v, str):
                if not (v.isalpha() and v.isascii()):
                    add(v)
            elif isinstance(v, dict):
                # binary payloads hold no readable destination
                binary = "mimeType" in v and v.get("type") in ("image", "audio")
                for k, item in v.items():
                    if binary and k == "data":
                        continue
                    if k == "blob" and isinstance(item, str):
                        continue
                    if isinstance(k, str) and not (k.isalpha() and k.isascii()):
                        add(k)
                    if isinstance(item, str):
                        if not (item.isalpha() and item.isascii()):
                            add(item)
                    elif isinstance(item, dict | list):
                        stack.append(item)
            elif isinstance(v, list):
                stack.extend(v)

    # ------------------------------------------------------------ recording

    def record_allowed(self, call: ToolCall) -> list[SessionEvent]:
        self.history.append((call.server, call.tool))
        if len(self.history) > self._history_cap * 2:
            del self.history[: -self._history_cap]
        self.calls_total += 1
        self.tool_calls[call.tool] = self.tool_calls.get(call.tool, 0) + 1
        events: list[SessionEvent] = []
        for taint, value in chains.taints_set_by(self.policy.taints, call.server, call.tool, call.arguments):
            if taint.name not in self.taints:
                self.taints.add(taint.name)
                events.append(SessionEvent("taint", call.tool, {"taint": taint.name, "matched": value}))
        return events

    def remember_approval(self, call: ToolCall, decision: Decision) -> None:
        """Remember a human's yes for this tool, argument and destination only."""
        if decision.destination is not None and decision.argument is not None:
            self.approvals.add((call.tool, decision.argument, decision.destination))

    # ------------------------------------------------------------ pin files

    def export_pins(self) -> dict:
        out: dict[str, Any] = {
            "format": PIN_FORMAT,
            "server": self.server,
            "tools": dict(sorted(self.pins.items())),
        }
        if self.server_info_pin is not None:
            out["server_info"] = self.server_info_pin
        return out

    def import_pins(self, data: dict) -> None:
        """Adopt pins saved by an earlier session: they become this session's first listing."""
        if not isinstance(data, dict) or data.get("format") not in (1, PIN_FORMAT):
            raise ValueError(f"not a Visor pin file (format 1 or {PIN_FORMAT})")
        tools = data.get("tools")
        if not isinstance(tools, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in tools.items()
        ):
            raise ValueError("pin file 'tools' must map tool names to sha256 hex digests")
        info = data.get("server_info")
        if info is not None and not isinstance(info, str):
            raise ValueError("pin file 'server_info' must be a string")
        if data["format"] == 1:
            # Pinned before titles, icons, _meta and execution were: each is
            # re-pinned in full on its first listing if its old digest matches.
            self._legacy_pins.update(tools)
        else:
            self.pins.update(tools)
            self.baseline.update(tools)
        if tools:
            self.listing_complete = True
            self.listing_seen = True
        if info is not None:
            self.server_info_pin = info
        self._reselect_packs()
