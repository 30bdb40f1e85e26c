"""Rules over the session's history: tool chains, taints and egress controls,
identities and time restrictions. Pure functions over immutable policy data
and the (read-only) session facts passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from fnmatch import fnmatchcase
from typing import Any

from visor.policy import paths
from visor.policy.schema import (
    EgressControl,
    Identity,
    Taint,
    TimeRestriction,
)
from visor.wire.folding import go_fold


def name_matches(patterns: Sequence[str], name: str) -> bool:
    """Exact names, or shell-style wildcards (``aws_iam_*``)."""
    return any(p == name or p == "*" or (("*" in p or "?" in p) and fnmatchcase(name, p)) for p in patterns)


def name_matches_any_case(patterns: Sequence[str], name: str) -> bool:
    """``name_matches`` with case ignored (Go's simple folding), for the lists that make a
    call stricter (taint sources, egress sinks): a policy's ``send_note`` covers a server's
    ``Send_Note``, as ``tool_chains`` and ``time_restrictions`` already match. Never for a
    list that allows (identities): there another case is another tool."""
    if name_matches(patterns, name):
        return True
    folded = go_fold(name)
    return any(
        go_fold(p) == folded or (("*" in p or "?" in p) and fnmatchcase(folded, go_fold(p))) for p in patterns
    )


def taints_set_by(
    taints: Sequence[Taint], server: str, tool: str, arguments: dict[str, Any], bases: tuple[str, ...] = ()
) -> list[tuple[Taint, str]]:
    """Taints that an allowed call sets, with the argument value that matched.

    As in mcp-visor, a taint fires when the tool is a source tool (in any case) and one
    of its arguments, read as a path or a URL, matches a source pattern (no patterns:
    any call of the tool). URLs are matched on their path too, so ``**/secrets/**``
    taints a fetch of ``https://host/secrets/x``. ``bases``: the directories besides the
    working directory the server reads relative names from.
    """
    hits: list[tuple[Taint, str]] = []
    candidates: list[str] | None = None
    for taint in taints:
        if not name_matches_any_case(taint.source_tools, tool):
            continue
        if taint.source_servers and not name_matches(taint.source_servers, server):
            continue
        if not taint.source_patterns:
            hits.append((taint, ""))
            continue
        if candidates is None:
            candidates = _taint_candidates(arguments, bases)
        if candidates and candidates[0] is UNREAD:
            hits.append((taint, UNREAD))  # more values than Visor reads: assume the source
            continue
        for value in candidates:
            # as a deny matches: case- and normalisation-insensitively, with Windows' reading
            # of names (a case-insensitive file system reads /Data/PAYROLL as /data/payroll)
            if any(g.match_folded(value) for g in taint.source_patterns):
                hits.append((taint, value))
                break
    return hits


def taints_read_by_resource(taints: Sequence[Taint], server: str, uri: str) -> list[tuple[Taint, str]]:
    """Taints that a relayed ``resources/read`` of ``uri`` sets: every taint with source
    patterns (and this server among its source servers) whose patterns match the URI, read
    as a source argument is. Whatever its ``source_tools`` say: a resource is the same data
    a source tool reads, reached without a tool, and the patterns say what data taints."""
    hits: list[tuple[Taint, str]] = []
    candidates: list[str] | None = None
    for taint in taints:
        if not taint.source_patterns:
            continue  # "any call of these tools": a resource read is no tool call
        if taint.source_servers and not name_matches(taint.source_servers, server):
            continue
        if candidates is None:
            candidates = _taint_candidates({"uri": uri})
        for value in candidates:
            if any(g.match_folded(value) for g in taint.source_patterns):
                hits.append((taint, value))
                break
    return hits


def _argument_readings(arguments: dict[str, Any]) -> list[dict[str, Any]]:
    """The arguments as sent, and as a server that JSON-decodes string parameters reads
    them (the evaluator judges both: visor/policy/readings.py). Every string parameter is
    decoded here, whatever the schema says: a taint raised by a reading no server takes
    only fails closed."""
    from visor.policy import readings

    out = [arguments]
    try:
        decoded = readings.decoded_reading(arguments)
    except readings.AmbiguousJson:
        decoded = None  # denied by the evaluator (arguments.ambiguous_json): never recorded
    if decoded is not None:
        out.append(decoded)
    return out


def _taint_candidates(arguments: dict[str, Any], bases: tuple[str, ...] = ()) -> list[str]:
    """Every reading of each argument that may name what the source read; a taint is set
    when any reading matches (strictest wins). A URL's path counts as the raw text after
    the host, the canonical path the fetching client sends (``/ok/../secrets/x`` is
    ``/secrets/x``) and the fully decoded path a decoding server serves (``/%69nternal/``
    is ``/internal/``).

    Not only path-shaped arguments: a server names what it reads by whatever its schema
    calls it (``name``, ``id``, ``key``, ``endpoint``), and a source read that Visor does
    not recognise as one would leave the session untainted while the data reached the
    model. So every string of the arguments (at any depth, member names too) is read as a
    URL when it looks like one, else as a path (relative to the working directory, as
    path arguments are); a reading no server takes only taints, which fails closed."""
    from visor.policy import urls  # imported here: only this function of chains.py reads URLs

    out: list[str] = []
    seen: set[str] = set()
    folders: list[str] = []
    relatives: list[str] = []
    for reading in _argument_readings(arguments):
        named = {raw for _name, raw in paths.iter_path_values(reading, ("url", "uri"))}
        for raw in (*named, *_strings(reading)):
            if raw in seen:
                continue
            seen.add(raw)
            out.append(raw)
            lowered = raw.lower()
            if ("://" in raw or urls.looks_like_url(raw)) and not lowered.lstrip().startswith("file:"):
                # a URL: match its path part (and the whole URL) against path globs
                rest = raw.split("://", 1)[1] if "://" in raw else ""
                slash = rest.find("/")
                if slash != -1:
                    out.append(rest[slash:].split("?", 1)[0].split("#", 1)[0])
                u = urls.read_url(raw.strip())
                for form in (u.path, u.decoded_path):
                    if form and form not in out:
                        out.append(form)
                continue
            if raw not in named and (not raw.strip() or "\n" in raw or len(raw) > 4096):
                continue  # free text, not a name any server opens
            try:
                out.extend(paths.forms(raw, bases=bases))
            except paths.PathError:
                continue
            if raw[:1] in ("/", "~") or raw[:5].lower() == "file:":
                folders.append(raw)
            else:
                relatives.append(raw)
    # A server may join a relative name to a folder given in another argument
    # (``read(folder="/srv", name="payroll/2026.csv")``): each relative value is read under
    # each absolute one too. Bounded; a call with more values is not read but taints, or
    # decoys placed first would hide the folder the server uses.
    folders = list(dict.fromkeys(folders))
    relatives = list(dict.fromkeys(relatives))
    if folders and relatives and (len(folders) > _MAX_BASES or len(relatives) > _MAX_RELATIVES):
        return [UNREAD]
    for base in folders:
        try:
            folder = paths.normalise(base)
        except paths.PathError:
            continue
        for rel in relatives:
            try:
                out.extend(paths.forms(rel, cwd=folder))
            except paths.PathError:
                continue
    return out


#: What a taint record says matched when a source call had too many values to join.
UNREAD = "(more folders and names than Visor joins: assumed to read a source)"
# How many absolute and relative values of one source call are joined (see _taint_candidates).
_MAX_BASES = 16
_MAX_RELATIVES = 256


def _strings(value: object) -> list[str]:
    """Every string in ``value`` at any depth, the members' names included."""
    found: list[str] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            found.append(v)
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, dict):
            for k, item in v.items():
                if isinstance(k, str):
                    found.append(k)
                stack.append(item)
    return found


def egress_hit(
    controls: Sequence[EgressControl], taints: set[str] | frozenset[str], server: str, tool: str
) -> EgressControl | None:
    for c in controls:
        if c.when_tainted not in taints:
            continue
        if not name_matches_any_case(c.sink_tools, tool):
            continue
        if c.sink_servers and not name_matches(c.sink_servers, server):
            continue
        return c
    return None


def identity_verdict(identities: Sequence[Identity], identity: str, server: str, tool: str) -> str | None:
    """A deny reason, or None when the identity may call the tool."""
    entry = next((i for i in identities if i.name == identity), None)
    if entry is None:
        return f"identity {identity!r} has no entry in the policy"
    if server not in entry.allowed_servers and "*" not in entry.allowed_servers:
        return f"server {server!r} is not allowed for identity {identity!r}"
    fq = f"{server}/{tool}"
    if not name_matches(entry.allowed_tools, fq):
        return f"tool {fq!r} is not allowed for identity {identity!r}"
    return None


def time_verdict(
    restrictions: Sequence[TimeRestriction], server: str, tool: str, now: datetime
) -> tuple[TimeRestriction, str] | None:
    """The first restriction that the call is outside of, with the reason."""
    for tr in restrictions:
        if tr.servers and server not in tr.servers and "*" not in tr.servers:
            continue
        if not any(rx.fullmatch(tool) for rx in tr.tools):
            continue
        # Imported here: only a policy with time restrictions needs it (start-up time).
        from zoneinfo import ZoneInfo

        if tr.denied_days:
            local = now.astimezone(ZoneInfo(tr.timezone))
            if local.isoweekday() in tr.denied_days:
                return tr, f"time restriction {tr.name!r}: {local.strftime('%A')} is a denied day"
        if tr.allowed_hours:
            inside = False
            for w in tr.allowed_hours:
                local = now.astimezone(ZoneInfo(w.timezone))
                if w.days and local.isoweekday() not in w.days:
                    continue
                minute = local.hour * 60 + local.minute
                if w.start_minute <= w.end_minute:
                    ok = w.start_minute <= minute < w.end_minute
                else:  # a window across midnight, e.g. 22:00-06:00
                    ok = minute >= w.start_minute or minute < w.end_minute
                if ok:
                    inside = True
                    break
            if not inside:
                return tr, f"time restriction {tr.name!r}: outside the allowed hours"
    return None
