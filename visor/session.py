"""Per-session state: pins, history, budgets, taints, seen output, approvals.

The evaluator reads this state (filling only its memo tables); the session's
checks (visor/core/checks.py) change it through the ``record_*``/``observe_*``/
``remember_*`` methods. Pin persistence hands plain dicts to the caller
(``export_pins``/``import_pins``); the only I/O is the group store's, when the
session belongs to a group (visor/groups/).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from visor.policy import chains, fields, readings
from visor.policy import destinations as dst
from visor.policy.effective import Effective, resolve_tool, select_packs
from visor.policy.schema import Policy, ServerPolicy, Taint
from visor.wire.folding import go_fold

if TYPE_CHECKING:
    from visor.groups.index import GroupIndex
    from visor.policy.evaluate import Decision, ToolCall
    from visor.policy.facts import ProtectedFacts

PIN_FORMAT = 2
#: Format of the remembered-destinations file (``export_approvals``).
APPROVALS_FORMAT = 1
#: Destinations remembered across restarts, at most (the file stays small).
APPROVALS_MAX = 4096

# Classes of a place in output (observe_output): free text, a field the
# service asserts, a field a third party writes.
_FREE, _ASSERTED, _SENDER = 0, 1, 2
# A value in an asserted field longer than this is not read as destinations
# (a field that holds prose is not a list of correspondents): free text.
_ASSERTED_MAX = 1024


class SharedStateError(Exception):
    """The shared store of a session's state (``visor serve --state``) could not record an
    allowed call: the call must not run, since no replica would count it."""


class SharedStateConflict(SharedStateError):
    """The store counts calls of this session that this process did not make (another replica
    served it meanwhile). Nothing was counted; the session took the store's counts, and the
    call is judged again on them."""


@dataclass(frozen=True, slots=True)
class SharedCounts:
    """What the shared store holds of a session's budgets and history (visor/serve/state.py)."""

    calls_total: int
    tool_calls: dict[str, int]
    history: tuple[tuple[str, str], ...]


class CallLedger(Protocol):
    """Where a session's allowed calls are counted besides memory, when the session's state is
    shared between replicas. ``record_call`` counts the call only if the store's total is still
    ``expect_total`` (atomically) and returns the new counts (session total, this tool's); it
    raises SharedStateConflict when the store counted calls this process did not make, and
    SharedStateError when it cannot record."""

    def record_call(self, server: str, tool: str, history_cap: int, expect_total: int) -> tuple[int, int]: ...

    def counts(self) -> SharedCounts: ...

    # A human's "remember" yes to an exact call (approval_required) follows the session too:
    # (rule, arguments digest). Both raise SharedStateError when the store cannot answer.
    def remember_exact(self, rule: str, digest: str) -> None: ...

    def exact_approvals(self) -> frozenset[tuple[str, str]]: ...


@dataclass(frozen=True, slots=True)
class SessionEvent:
    kind: str  # "pin", "pin_changed", "pin_new", "taint"
    tool: str | None
    detail: dict[str, Any] = field(default_factory=dict)


# Every field of a tool that a client shows to the model or to the user, or
# that changes how the tool runs: a tool re-titled, re-iconed or re-annotated
# after it was pinned is a changed tool.
PINNED_FIELDS = (
    "name", "title", "description", "inputSchema", "outputSchema", "annotations", "icons", "_meta", "execution",
)  # fmt: skip
# What pin files of format 1 covered: kept to carry those pins over without a gap.
_PINNED_FIELDS_V1 = ("description", "inputSchema", "annotations", "outputSchema")
_ALL_FIELDS = frozenset(PINNED_FIELDS)


def _variants(obj: dict[str, Any], name: str) -> list[str]:
    """The members of ``obj`` that a case-insensitive client (Go's ``encoding/json``) reads as
    ``name`` without being exactly it (``Description``, ``deſcription``)."""
    folded = go_fold(name)
    return [k for k in obj if k != name and type(k) is str and go_fold(k) == folded]


def _digest(tool: dict[str, Any], fields: tuple[str, ...]) -> str:
    body = {k: tool.get(k) for k in fields}
    # A client that matches members case-insensitively shows the last of `description` and
    # `Description`: a variant is pinned with the field it stands for (absent in every
    # ordinary tool, so their digests are unchanged).
    if not tool.keys() <= _ALL_FIELDS:
        for name in fields:
            for k in _variants(tool, name):
                body[k] = tool[k]
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def pin_digest(tool: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of every pinned field of a tool."""
    return _digest(tool, PINNED_FIELDS)


class SessionState:
    """State of one proxied session (one ``visor run``, one upstream server)."""

    def __init__(
        self,
        policy: Policy,
        server: str,
        identity: str | None = None,
        group: GroupIndex | None = None,
    ) -> None:
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
        self.server_info_pin: str | None = None
        self.server_changed = False
        # Pinned names by their case-folded form: a server that finds tools case-insensitively
        # (strings.EqualFold) runs one tool for two names that fold equal.
        self._folded: dict[str, str] = {}
        # history and budgets (only allowed calls count)
        self.history: list[tuple[str, str]] = []
        self._history_cap = max(
            [policy.settings.chain_window_size, *(c.within_calls or 0 for c in policy.tool_chains)]
        )
        self.calls_total = 0
        self.tool_calls: dict[str, int] = {}
        # The shared store counting this session's calls for every replica (visor serve --state).
        self.ledger: CallLedger | None = None
        # Visor's own files, which no call may name: the evaluator's first check (set by the checks).
        self.protected: ProtectedFacts | None = None
        # Directories the server reads relative names from besides the working directory (its
        # command line's, the client's roots): a relative path argument is judged from each.
        self.path_bases: tuple[str, ...] = ()
        self.taints: set[str] = set()
        # provenance
        # Where a key was first seen is recorded only when some question can
        # say it (untrusted_output: ask somewhere in the policy).
        self._trace = policy.settings.untrusted_output == "ask" or any(
            t.untrusted_output == "ask" for srv in policy.servers for t in srv.tools.values()
        )
        max_keys = policy.settings.output_index_max_keys
        small = max(1024, max_keys // 4)
        # The other servers the same client started (visor/groups/): with a
        # group, the three key tables below are the group's, which share every
        # new key with the group's store (written by ``observe_output``).
        self.group = group
        # every key of free text (and of asserted fields: a look-alike of a
        # correspondent is not vouched for)
        self.output = dst.OutputIndex(
            max_keys,
            trace=self._trace,
            table=group.table(dst.OUTPUT, max_keys, self._trace) if group is not None else None,
        )
        # the exact keys of destinations in fields the service asserts
        self.asserted: dst.DigestTable = (
            group.table(dst.ASSERTED, small) if group is not None else dst.DigestTable(small)
        )
        # every key of fields a third party writes (a received mail's sender)
        self.attributed = dst.OutputIndex(
            small,
            trace=True,
            table=group.table(dst.ATTRIBUTED, small, trace=True) if group is not None else None,
        )
        # (tool, argument, destination key) a human approved: trusted for the session
        self.approvals: set[tuple[str, str, str]] = set()
        # the ones a human asked to remember across restarts
        self.remembered: set[tuple[str, str, str]] = set()
        # called with export_approvals() when ``remembered`` grows (visor/run.py saves it)
        self.approvals_saver: Any = None
        # resolution cache
        self.active_packs: tuple[str, ...] = ()
        self._effective: dict[str, Effective] = {}
        self._listed_names: dict[str, frozenset[str]] = {}
        self._reselect_packs()

    def rebind(self, policy: Policy, identity: str | None = None) -> None:
        """Judge by ``policy`` from now on (a reload), keeping the session's state: pins, history,
        budgets, taints, provenance and approvals. These are the members ``__init__`` derives from
        its policy; the provenance index's size and tracing are fixed at start (a reload that
        changes them is refused before it gets here). ``identity``: the one given at start, which
        a policy's default does not replace."""
        self.policy = policy
        self.server_entry = policy.server(self.server)
        self.identity = identity if identity is not None else policy.settings.identity
        # History already trimmed to the old window stays trimmed; it never shrinks on a reload,
        # so that switching back and forth (an approval's own policy) loses nothing.
        window = max([policy.settings.chain_window_size, *(c.within_calls or 0 for c in policy.tool_chains)])
        self._history_cap = max(self._history_cap, window)
        # Packs are selected again from the pins, and every resolved entry is resolved again.
        self._effective.clear()
        self._reselect_packs()

    # ------------------------------------------------------------ resolution

    def _reselect_packs(self) -> None:
        # Only tools trusted on first use choose packs: a tool that appeared later is denied
        # itself, and must not change how the pinned tools are read (their output's fields).
        packs = select_packs(self.policy, self.server_entry, self.server, set(self.pins) - self.late)
        if packs != self.active_packs or not self._effective:
            self.active_packs = packs
            self._effective.clear()
            self._names.clear()

    def effective(self, tool: str, called: Collection[str] = ()) -> Effective:
        """What the policy says of `tool`. `called`: the argument names a call sends. A name
        its schema does not list reaches the server all the same (a server may read what it
        did not list), so a pack entry that lists its tool's arguments describes the call only
        if it names those too: a `fetch` listed as mcp-server-fetch's and called with a
        `method` is not that reader."""
        eff = self._effective.get(tool)
        if eff is None:
            eff = resolve_tool(self.policy, self.server_entry, self.active_packs, tool, self._listed(tool))
            self._effective[tool] = eff
        if called and eff.packs:
            listed = self._listed(tool)
            if not listed.issuperset(called):
                # only a pack entry can fall away: resolved for this call, not cached
                return resolve_tool(
                    self.policy, self.server_entry, self.active_packs, tool, listed.union(called)
                )
        return eff

    def _listed(self, tool: str) -> frozenset[str]:
        """The top-level argument names of the tool's listed schema (read once per schema:
        every call of a tool a pack describes asks)."""
        hit = self._listed_names.get(tool)
        if hit is None:
            schema = self.schemas.get(tool)
            props = schema.get("properties") if isinstance(schema, dict) else None
            hit = frozenset(props) if isinstance(props, dict) else frozenset()
            if len(self._listed_names) >= 4096:
                self._listed_names.clear()
            self._listed_names[tool] = hit
        return hit

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

    def observe_server_info(self, info: dict[str, Any]) -> list[SessionEvent]:
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

    def observe_tools_list(self, result: dict[str, Any], cursor: object = None) -> list[SessionEvent]:
        """Pin a tools/list page. ``cursor`` is the ``params.cursor`` of the request it answers."""
        tools = result.get("tools") if isinstance(result, dict) else None
        if not isinstance(tools, list):
            return []
        extra = [result[k] for k in _variants(result, "tools") if isinstance(result[k], list)]
        if extra:
            # `Tools` next to `tools`: a case-insensitive client lists the other one. Every
            # tool in either is pinned; one name defined two ways is a changed tool.
            tools = [t for group in (tools, *extra) for t in group]
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
                self._effective.pop(name, None)  # a pack entry applies by the schema's arguments
                self._listed_names.pop(name, None)
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
        events.extend(self._case_twins(tools))
        nxt = result.get("nextCursor")
        if not self.listing_complete:
            if isinstance(nxt, str) and nxt:
                self._next_cursor = nxt
            else:
                self.listing_complete = True
        self._reselect_packs()
        return events

    def _case_twins(self, tools: list[Any]) -> list[SessionEvent]:
        """Two listed names that differ only in case or surrounding spaces (``send_note`` then
        ``Send_Note``) are one tool to a server that finds tools case-insensitively (or trimmed,
        as it finds methods: ``strings.TrimSpace``): a call by either name may run the
        definition listed under the other, so neither is trusted (a rename by case in a later
        listing is a changed tool under its old name too)."""
        events: list[SessionEvent] = []
        for tool in tools:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                continue
            name = tool["name"]
            twin = self._folded.setdefault(go_fold(name.strip()), name)
            if twin == name:
                continue
            for n in (twin, name):
                if n not in self.changed:
                    self.changed.add(n)
                    other = name if n == twin else twin
                    events.append(SessionEvent("pin_changed", n, {"case_variant": other}))
        return events

    def observe_output(
        self, tool: str | None, result: dict[str, Any], *, error: bool = False, called: Collection[str] = ()
    ) -> None:
        """Index every destination-like token in a server result or error.

        A tool whose entry names ``trusted_output_fields`` or ``sender_fields``
        is read field by field (``structuredContent``, and text content that is
        a JSON or YAML document): see ``_observe_fields``. Everything else is
        free text, and so is an ``error`` (a JSON-RPC error or an ``isError``
        result): an error states no record of the service's; it often repeats
        what the call sent, which would launder an address into a trusted field.

        With a group, the keys this result added reach the group's store
        before this returns, so before the result is relayed: the client,
        and so the model, never reads output the other servers cannot see.

        ``called``: the argument names of the call this answers. The fields a pack entry
        vouches for are read as such only if the entry describes that call (``effective``).
        """
        self._observe_output(None if error else tool, result, tool, called)
        if self.group is not None:
            self.group.flush()

    def _observe_output(
        self,
        tool: str | None,
        result: dict[str, Any],
        shown_as: str | None = None,
        called: Collection[str] = (),
    ) -> None:
        entry = self.effective(tool, called).entry if tool is not None else None
        if entry is not None and (entry.trusted_output_fields or entry.sender_fields):
            self._observe_fields(tool or "", result, entry.trusted_output_fields, entry.sender_fields, True)
            return
        if self._trace:
            self._observe_fields(tool or shown_as or "(not a tool call)", result, (), (), False)
            return
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

    def _observe_fields(
        self,
        tool: str,
        result: dict[str, Any],
        trusted: tuple[fields.FieldPath, ...],
        sender: tuple[fields.FieldPath, ...],
        read_text: bool,
    ) -> None:
        """Index ``result`` place by place: a string in a ``trusted`` field is a
        known correspondent (and free text too: its look-alikes are not), one
        in a ``sender`` field is attributed (asked about), anything else is
        free text. With ``read_text``, a text content item that is a JSON or
        YAML document is read as records (visor/policy/fields.py)."""
        # (value, path, class); a path is a tuple of segments (fields.ITEM for a list item)
        # (value, path, class, kind of name an asserted field holds: FieldPath.kind)
        stack: list[tuple[Any, tuple[str | None, ...], int, str | None]] = [(result, (), _FREE, None)]
        while stack:
            v, path, cls, kind = stack.pop()
            if isinstance(v, str):
                if v.isascii() and v.isalpha() and cls != _ASSERTED:
                    continue  # a plain word holds no key (a bare user name is placed only by a field)
                self._index_string(tool, v, path, cls, kind)
            elif isinstance(v, dict | fields.Pairs):
                items = v.items() if isinstance(v, dict) else v
                binary = isinstance(v, dict) and "mimeType" in v and v.get("type") in ("image", "audio")
                text_item = read_text and isinstance(v, dict) and v.get("type") == "text"
                for k, item in items:
                    if binary and k == "data":
                        continue
                    if k == "blob" and isinstance(item, str):
                        continue
                    seg = fields.key_segment(k)
                    sub = (*path, seg) if len(path) < 64 else path
                    c, ck = cls, kind
                    if c == _FREE and (trusted or sender):
                        if sender and fields.matches(sender, sub) is not None:
                            c = _SENDER  # the stricter class when both match
                        elif trusted and (hit := fields.matches(trusted, sub)) is not None:
                            c, ck = _ASSERTED, hit.kind
                    if isinstance(k, str) and k and not (k.isascii() and k.isalpha() and c != _ASSERTED):
                        self._index_string(tool, k, sub, c, ck)
                    if text_item and k == "text" and isinstance(item, str):
                        doc = fields.read_structured(item)
                        if doc is not None:
                            stack.append((doc, (), c, ck))
                            continue
                    if isinstance(item, int | float) and not isinstance(item, bool):
                        item = str(item)  # a phone number or account id in a record
                    if isinstance(item, str | dict | list):
                        stack.append((item, sub, c, ck))
            elif isinstance(v, list):
                sub = (*path, fields.ITEM) if len(path) < 64 else path
                c, ck = cls, kind
                if c == _FREE and (trusted or sender):
                    if sender and fields.matches(sender, sub) is not None:
                        c = _SENDER
                    elif trusted and (hit := fields.matches(trusted, sub)) is not None:
                        c, ck = _ASSERTED, hit.kind
                for item in v:
                    if isinstance(item, int | float) and not isinstance(item, bool):
                        item = str(item)
                    stack.append((item, sub, c, ck))

    def _index_string(
        self, tool: str, s: str, path: tuple[str | None, ...], cls: int, kind: str | None = None
    ) -> None:
        if cls == _SENDER:
            self.attributed.set_where((tool, fields.render(path)))
            self.attributed.add(s)
            return
        if self._trace:
            self.output.set_where((tool, fields.render(path)))
        self.output.add(s)
        if cls == _ASSERTED and len(s) <= _ASSERTED_MAX:
            for d in dst.parse_cached(s):
                # a bare name is the user or channel the field's kind says, or nothing
                read = dst.field_name_read(d, kind) if d.kind != "opaque" else None
                if read is not None:
                    self.asserted.add(read.key)

    # ------------------------------------------------------------ provenance

    def asserted_destination(self, d: dst.Dest) -> bool:
        """The service (or, with a group, any service of the group) asserted
        exactly ``d`` in a trusted field of some output."""
        if d.kind == "opaque":
            return False
        if d.key in self.asserted:
            return True
        # "cannot tell" places nothing: the destination is then judged unplaced
        return self.group is not None and self.group.asserted(d) is True

    def where_seen(self, d: dst.Dest, attributed: bool = False) -> tuple[str, str] | None:
        """(tool, field) where output first showed ``d``, when recorded."""
        return (self.attributed if attributed else self.output).where_of(d)

    def approved(self, tool: str, argument: str, key: str) -> bool:
        """A human approved ``key`` for this tool and argument, or (with a
        group) approved the destination through any server of the group."""
        if (tool, argument, key) in self.approvals:
            return True
        return self.group is not None and self.group.approved(key) is True

    def all_taints(self) -> set[str] | frozenset[str]:
        """This session's taints and every taint its group raised. A group
        that cannot tell counts as having raised every taint the policy
        defines: egress controls then apply as if it had (fail closed)."""
        group = self.group
        if group is None:
            return self.taints
        shared = group.taints()
        if shared is None:
            return self.taints | {t.name for t in self.policy.taints}
        return self.taints | shared if shared else self.taints

    # ------------------------------------------------------------ recording

    def record_allowed(self, call: ToolCall) -> list[SessionEvent]:
        """Count an allowed call. With a shared ledger the call is counted there first; a ledger
        that cannot count it raises SharedStateError and nothing changes here (the call is denied)."""
        if self.ledger is not None:
            try:
                self.ledger.record_call(call.server, call.tool, self._history_cap, self.calls_total)
            except SharedStateConflict:
                # Another replica served this session meanwhile: its calls count here too. This
                # call was judged on stale counts and is not counted; the caller judges it again.
                self.adopt_counts(self.ledger.counts())
                raise
        self.history.append((call.server, call.tool))
        if len(self.history) > self._history_cap * 2:
            del self.history[: -self._history_cap]
        self.calls_total += 1
        self.tool_calls[call.tool] = self.tool_calls.get(call.tool, 0) + 1
        hits = chains.taints_set_by(
            self.policy.taints, call.server, call.tool, call.arguments, self.path_bases
        )
        return self._raise_taints(hits, call.tool)

    def record_resource_read(self, uri: str) -> list[SessionEvent]:
        """A ``resources/read`` about to be relayed: the data it returns taints the session as a
        source tool's read of the same file or URL would (docs/policy.md, "taints")."""
        if not self.policy.taints:
            return []
        hits = chains.taints_read_by_resource(self.policy.taints, self.server, uri)
        return self._raise_taints(hits, None, {"method": "resources/read"})

    def record_output_resources(self, payload: dict[str, Any], tool: str | None) -> list[SessionEvent]:
        """Resource contents in something the server sends toward the model (an embedded
        resource in a tool result or a prompt, the contents of a ``resources/read``): each
        ``uri`` that carries ``text`` or a ``blob`` taints as a read of that resource would,
        whichever tool or request brought it. The data is in the model's context either way."""
        if not any(t.source_patterns for t in self.policy.taints):
            return []
        hits: list[tuple[Taint, str]] = []
        stack: list[Any] = [payload]
        while stack:
            v = stack.pop()
            if isinstance(v, dict):
                uri = v.get("uri")
                if isinstance(uri, str) and ("text" in v or "blob" in v):
                    hits.extend(chains.taints_read_by_resource(self.policy.taints, self.server, uri))
                stack.extend(x for x in v.values() if isinstance(x, dict | list))
            elif isinstance(v, list):
                stack.extend(x for x in v if isinstance(x, dict | list))
        return self._raise_taints(hits, tool, {"in_output": True}) if hits else []

    def _raise_taints(
        self, hits: list[tuple[Taint, str]], tool: str | None, how: dict[str, Any] | None = None
    ) -> list[SessionEvent]:
        events: list[SessionEvent] = []
        for taint, value in hits:
            if taint.name not in self.taints:
                self.taints.add(taint.name)
                detail = {"taint": taint.name, "matched": value}
                if how:
                    detail.update(how)
                events.append(SessionEvent("taint", tool, detail))
                if self.group is not None:
                    # a failure marks the group lost: every member then assumes every taint
                    self.group.raise_taint(taint.name, tool or "resources/read")
        return events

    def adopt_counts(self, counts: SharedCounts) -> None:
        """Take a session's budgets and history from the shared store (a session continued on
        another replica, or a conflict): what was counted anywhere counts here."""
        self.calls_total = counts.calls_total
        self.tool_calls = dict(counts.tool_calls)
        self.history = list(counts.history[-self._history_cap :]) if self._history_cap else []

    def adopt_pins(self, data: dict[str, Any]) -> None:
        """Take the pins of a session started on another replica. As with a pin file, the
        listing stays unseen: Visor's own tools/list (before the first call) then reads this
        upstream's tools and schemas and holds them to these pins, so a tool that differs on
        the new upstream is a changed tool."""
        self.import_pins(data)

    def remember_approval(self, call: ToolCall, decision: Decision, persist: bool = False) -> None:
        """Remember a human's yes for this tool, argument and destination only:
        trusted for the rest of the session, whatever output repeats it. With
        ``persist`` (the human chose "remember"), across restarts too: the
        saver hands ``export_approvals()`` to visor/run.py."""
        if decision.destination is None or decision.argument is None:
            return
        key = (call.tool, decision.argument, decision.destination)
        self.approvals.add(key)
        if self.group is not None:
            # the destination is placed for every server of the group (docs/groups.md)
            self.group.approve(call.tool, decision.argument, decision.destination, persist)
        if persist and key not in self.remembered and len(self.remembered) < APPROVALS_MAX:
            self.remembered.add(key)
            if self.approvals_saver is not None:
                self.approvals_saver(self.export_approvals())

    def export_approvals(self) -> dict[str, Any]:
        return {
            "format": APPROVALS_FORMAT,
            "server": self.server,
            "destinations": [list(k) for k in sorted(self.remembered)],
        }

    def import_approvals(self, data: dict[str, Any]) -> None:
        """Adopt destinations a human approved with "remember" in an earlier session."""
        if not isinstance(data, dict) or data.get("format") != APPROVALS_FORMAT:
            raise ValueError(f"not a Visor approved-destinations file (format {APPROVALS_FORMAT})")
        items = data.get("destinations")
        if not isinstance(items, list) or not all(
            isinstance(i, list) and len(i) == 3 and all(isinstance(x, str) and x for x in i) for i in items
        ):
            raise ValueError("'destinations' must be a list of [tool, argument, destination] strings")
        if data.get("server") != self.server:
            raise ValueError(f"the file is for server {data.get('server')!r}, not {self.server!r}")
        for tool, arg, dest in items[:APPROVALS_MAX]:
            key = (tool, arg, dest)
            self.remembered.add(key)
            self.approvals.add(key)

    # ------------------------------------------------------------ pin files

    def export_pins(self) -> dict[str, Any]:
        """The pins to keep: the tools trusted on first use. A tool that appeared after the first
        listing is left out, so that the next session holds it late too instead of trusting it
        as part of its first listing."""
        out: dict[str, Any] = {
            "format": PIN_FORMAT,
            "server": self.server,
            "tools": {k: v for k, v in sorted(self.pins.items()) if k not in self.late},
        }
        if self.server_info_pin is not None:
            out["server_info"] = self.server_info_pin
        return out

    def import_pins(self, data: dict[str, Any]) -> None:
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
        self._case_twins([{"name": n} for n in tools])
        if tools:
            # The pinned listing is the first one: any tool it lacks is late. It is not this
            # server's listing, though: until one is seen, Visor lists the tools itself before the
            # first call, so a tool whose definition changed since it was pinned is a changed tool
            # even for a client that calls without listing (a cached or remembered tool).
            self.listing_complete = True
        if info is not None:
            self.server_info_pin = info
        self._reselect_packs()
