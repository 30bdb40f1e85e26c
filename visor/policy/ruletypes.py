"""The rule types of a tool's ``rules:`` list, each said once.

A ``RuleType`` declares the keys a rule of its type takes, how those keys are
read and validated into a compiled ``Rule``, and the check the evaluator runs
for it (visor/policy/rules.py). The loader reads a rule through ``read_rule``,
the evaluator finds the check through ``RULE_TYPES``: a new rule type is one
entry here and one check function, nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from yaml.nodes import MappingNode, Node, ScalarNode

from visor.policy import paths, rules
from visor.policy.reader import Reader, kind_of
from visor.policy.schema import Rule

#: (reader, the rule's keys, key path of the rule, its type, its line) -> the compiled rule
RuleRead = Callable[[Reader, Mapping[str, Node], str, str, int], Rule]
ArgumentCheck = Callable[[Rule, rules.CallView], "str | None"]
PathCheck = Callable[[Rule, Sequence[rules.PathValue]], "str | None"]


@dataclass(frozen=True, slots=True)
class RuleType:
    name: str
    keys: frozenset[str]  # its own keys (besides type, name, description); all required
    read: RuleRead
    # At most one of the two checks: an argument check reads the call's
    # arguments, a path check the normalised readings of its path arguments.
    argument_check: ArgumentCheck | None = None
    path_check: PathCheck | None = None
    # the tool's calls always ask a human (after every deny had its chance)
    always_asks: bool = False
    # deny patterns combined into one regex (ToolPolicy.screens), searched
    # over the call's "commands" or "queries" before any single pattern runs
    screen: str | None = None
    # a deny list over commands: alone, it cannot vouch for a command Visor
    # cannot read with certainty, so such a command is asked about
    denies_commands: bool = False
    # an allow list over commands: it refuses what it cannot read itself
    admits_commands: bool = False


# ------------------------------------------------------------ readers


def _regexes(r: Reader, m: Mapping[str, Node], key: str, rtype: str, line: int) -> Rule:
    pkey = f"{key}.patterns"
    pats = r.strs(m["patterns"], pkey, nonempty=True)
    items = r.list_(m["patterns"], pkey)
    # mcp-visor compiles command and query patterns case-insensitively; so does Visor.
    regexes = tuple(r.regex(n, f"{pkey}[{i}]", re.IGNORECASE) for i, n in enumerate(items))
    return Rule(rtype, line, patterns=pats, regexes=regexes)


def _globs(r: Reader, m: Mapping[str, Node], key: str, rtype: str, line: int) -> Rule:
    pkey = f"{key}.patterns"
    pats = r.strs(m["patterns"], pkey, nonempty=True)
    globs = tuple(r.glob(n, f"{pkey}[{i}]") for i, n in enumerate(r.list_(m["patterns"], pkey)))
    return Rule(rtype, line, patterns=pats, globs=globs)


def _keywords(r: Reader, m: Mapping[str, Node], key: str, rtype: str, line: int) -> Rule:
    kws = r.strs(m["keywords"], f"{key}.keywords", nonempty=True)
    return Rule(rtype, line, keywords=tuple(" ".join(k.casefold().split()) for k in kws))


def _domains(r: Reader, m: Mapping[str, Node], key: str, rtype: str, line: int) -> Rule:
    doms = r.strs(m["domains"], f"{key}.domains", nonempty=True)
    for i, d in enumerate(doms):
        if "@" in d.lstrip("@") or "/" in d or " " in d.strip():
            r.fail(m["domains"].value[i], f"{key}.domains[{i}]", f"{d!r} is not a domain")
    return Rule(rtype, line, domains=tuple(d.strip().lstrip("@").rstrip(".").lower() for d in doms))


def _repos(r: Reader, m: Mapping[str, Node], key: str, rtype: str, line: int) -> Rule:
    repos = r.strs(m["repos"], f"{key}.repos", nonempty=True)
    rx = tuple(re.compile(paths.translate_glob(x.strip().casefold())) for x in repos)
    return Rule(rtype, line, repos=repos, repo_regexes=rx)


def _limit(name: str) -> RuleRead:
    def read(r: Reader, m: Mapping[str, Node], key: str, rtype: str, line: int) -> Rule:
        return Rule(rtype, line, limit=r.int_(m[name], f"{key}.{name}", minimum=1))

    return read


def _nothing(r: Reader, m: Mapping[str, Node], key: str, rtype: str, line: int) -> Rule:
    return Rule(rtype, line)


# ------------------------------------------------------------ the registry

_PATTERNS = frozenset({"patterns"})

RULE_TYPES: dict[str, RuleType] = {
    t.name: t
    for t in (
        RuleType("deny_path", _PATTERNS, _globs, path_check=rules.deny_path),
        RuleType("allow_path", _PATTERNS, _globs, path_check=rules.allow_path),
        RuleType(
            "deny_command_pattern",
            _PATTERNS,
            _regexes,
            argument_check=rules.deny_command_pattern,
            screen="commands",
            denies_commands=True,
        ),
        RuleType(
            "allow_command_pattern",
            _PATTERNS,
            _regexes,
            argument_check=rules.allow_command_pattern,
            admits_commands=True,
        ),
        RuleType(
            "deny_command_keyword",
            frozenset({"keywords"}),
            _keywords,
            argument_check=rules.deny_command_keyword,
            denies_commands=True,
        ),
        RuleType(
            "deny_query_pattern",
            _PATTERNS,
            _regexes,
            argument_check=rules.deny_query_pattern,
            screen="queries",
        ),
        RuleType("allow_query_pattern", _PATTERNS, _regexes, argument_check=rules.allow_query_pattern),
        RuleType(
            "deny_recipient_domain",
            frozenset({"domains"}),
            _domains,
            argument_check=rules.deny_recipient_domain,
        ),
        RuleType(
            "allow_recipient_domain",
            frozenset({"domains"}),
            _domains,
            argument_check=rules.allow_recipient_domain,
        ),
        RuleType("allowed_repos", frozenset({"repos"}), _repos, argument_check=rules.allowed_repos),
        RuleType("max_file_size", frozenset({"bytes"}), _limit("bytes"), argument_check=rules.max_file_size),
        RuleType(
            "max_result_rows", frozenset({"rows"}), _limit("rows"), argument_check=rules.max_result_rows
        ),
        # mcp-visor: the same check as max_result_rows
        RuleType(
            "max_export_rows", frozenset({"rows"}), _limit("rows"), argument_check=rules.max_export_rows
        ),
        RuleType("require_approval_always", frozenset(), _nothing, always_asks=True),
    )
}


def read_rule(r: Reader, node: Node, key: str) -> Rule:
    """One entry of a tool's ``rules:`` list, read and validated by its type."""
    if not isinstance(node, MappingNode):
        r.fail(node, key, f"expected a mapping, got {kind_of(node)}")
    tnode = next((v for k, v in node.value if isinstance(k, ScalarNode) and k.value == "type"), None)
    if tnode is None:
        r.fail(node, f"{key}.type", "missing required key 'type'")
    rtype = r.str_(tnode, f"{key}.type")
    spec = RULE_TYPES.get(rtype)
    if spec is None:
        r.fail(
            tnode,
            f"{key}.type",
            f"unknown rule type {rtype!r}; expected one of: {', '.join(sorted(RULE_TYPES))}",
        )
    m = r.mapping(
        node,
        key,
        spec.keys | {"type", "name", "description"},
        tuple(sorted(spec.keys)),
        kind=f"{rtype} rule",
    )
    return spec.read(r, m, key, rtype, node.start_mark.line + 1)


# ------------------------------------------------------------ compiled forms

#: Argument rules grouped by type, in order of first appearance: (type, check, rules).
Plan = tuple[tuple[str, ArgumentCheck, tuple[Rule, ...]], ...]


def build_plan(rules: tuple[Rule, ...]) -> Plan:
    """A tool's argument rules grouped by type (first appearance order) with their check."""
    groups: dict[str, list[Rule]] = {}
    for r in rules:
        if RULE_TYPES[r.type].argument_check is not None:
            groups.setdefault(r.type, []).append(r)
    out: list[tuple[str, ArgumentCheck, tuple[Rule, ...]]] = []
    for t, g in groups.items():
        check = RULE_TYPES[t].argument_check
        assert check is not None
        out.append((t, check, tuple(g)))
    return tuple(out)


_UNCOMBINABLE = re.compile(r"\\[1-9]|\(\?[aiLmsux]+\)|\(\?P=|\(\?\(")


def build_screens(rules: tuple[Rule, ...]) -> dict[str, re.Pattern[str]]:
    """One alternation per screened deny pattern type, so a call that matches
    none of thirty patterns costs one regex search. Patterns that cannot be
    combined (a backreference, a conditional group, an inline global flag) leave
    the type unscreened: a screen that misses what one pattern matches alone
    skips the deny list."""
    out: dict[str, re.Pattern[str]] = {}
    for rtype in (t.name for t in RULE_TYPES.values() if t.screen is not None):
        pats = [p for r in rules if r.type == rtype for p in r.patterns]
        # `(?(1)...)` and `\1` name a group by number, which is another pattern's
        # once the patterns are one alternation
        if len(pats) < 2 or any(_UNCOMBINABLE.search(p) for p in pats):
            continue
        try:
            out[rtype] = re.compile("|".join(f"(?:{p})" for p in pats), re.IGNORECASE)
        except re.error:
            continue
    return out
