"""The policy as immutable data.

Everything here is built once by the loader: regular expressions and globs are
compiled at load time so that the evaluator never compiles anything on the hot
path. All containers are tuples or dicts that nobody mutates after loading.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from visor.policy.evaluate import Compiled
    from visor.policy.fields import FieldPath
    from visor.redact import Redactor

Action = Literal["allow", "deny", "ask"]

#: Attestation kinds of a server entry that Visor can measure.
ATTESTATION_KINDS: tuple[str, ...] = ("stdio_invocation_sha256_v1",)


# A name that Windows reads differently: a trailing dot or space, or a `:stream`.
_WIN_NAME_END = re.compile(r"[ .](?:/|$)|.:")


@dataclass(frozen=True, slots=True)
class Glob:
    """A doublestar glob compiled to a regular expression.

    ``alt`` is the same glob with the literal directory prefix resolved through
    symlinks (``/tmp`` may really be ``/private/tmp``), so that a resolved path
    still matches the pattern its author wrote.
    """

    pattern: str
    regex: re.Pattern[str]
    alt: re.Pattern[str] | None = None

    def match(self, path: str) -> bool:
        if self.regex.fullmatch(path) is not None:
            return True
        return self.alt is not None and self.alt.fullmatch(path) is not None

    def match_folded(self, path: str) -> bool:
        """``match`` as a case-insensitive, normalisation-insensitive file system reads names.

        For deny rules: macOS and Windows file systems ignore case, APFS
        ignores NFC/NFD, Windows drops trailing dots and spaces of a name and
        reads ``name:stream`` as ``name``. Any of ``Glob.variants`` matching
        the pattern (NFC, case ignored) is a match.
        """
        if self.match(path):
            return True
        rx = Glob._folded(self.regex.pattern)
        alt = Glob._folded(self.alt.pattern) if self.alt is not None else None
        for v in Glob.variants(path):
            if rx.fullmatch(v) is not None or (alt is not None and alt.fullmatch(v) is not None):
                return True
        return False

    @staticmethod
    @lru_cache(maxsize=1024)
    def _folded(source: str) -> re.Pattern[str]:
        # compiled once per pattern (the loader's globs live as long as the policy)
        return re.compile(unicodedata.normalize("NFC", source), re.DOTALL | re.IGNORECASE)

    @staticmethod
    def variants(path: str) -> tuple[str, ...]:
        """The spellings under which a path may name the same file on some file system.

        NFC-normalised (APFS does not tell NFC from NFD); and, when it
        differs, with every name's trailing dots and spaces dropped and any
        ``:stream`` suffix cut (Windows: ``.env.``, ``.env ``, ``.env::$DATA``
        are ``.env``). Case is left alone: compare with ``re.IGNORECASE`` or
        ``casefold``.
        """
        # A huge argument is not cached: it must not pin memory.
        return Glob._variants_cached(path) if len(path) <= 1024 else Glob._variants(path)

    @staticmethod
    def _variants(path: str) -> tuple[str, ...]:
        nfc = path if path.isascii() else unicodedata.normalize("NFC", path)
        if not _WIN_NAME_END.search(nfc):
            return (nfc,)
        names = []
        for name in nfc.split("/"):
            if name not in ("", ".", ".."):
                cut = name.split(":", 1)[0] if ":" in name[1:] else name
                stripped = cut.rstrip(" .")
                if stripped:
                    name = stripped
                elif cut.startswith(".."):
                    name = ".."
                elif cut:
                    name = "."
            names.append(name)
        win = "/".join(names)
        return (nfc,) if win == nfc else (nfc, win)

    @staticmethod
    @lru_cache(maxsize=8192)
    def _variants_cached(path: str) -> tuple[str, ...]:
        return Glob._variants(path)


@dataclass(frozen=True, slots=True)
class Rule:
    """One entry of a tool's ``rules:`` list."""

    type: str
    line: int
    patterns: tuple[str, ...] = ()
    regexes: tuple[re.Pattern[str], ...] = ()
    globs: tuple[Glob, ...] = ()
    keywords: tuple[str, ...] = ()  # already casefolded
    domains: tuple[str, ...] = ()  # already lower-cased, trailing dot removed
    repos: tuple[str, ...] = ()
    repo_regexes: tuple[re.Pattern[str], ...] = ()
    limit: int | None = None  # bytes for max_file_size, rows for max_result_rows


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """A tool entry after loading (and, in a session, after merging with a pack).

    ``None`` means "not said": merging keeps the other side's value, and the
    evaluator applies its documented default.
    """

    name: str
    allowed: bool | None = None
    risk: str | None = None
    approval_required: bool = False
    # who may answer this tool's asks: "any" channel, or "out_of_band" only
    # (--approval-dir / --approval-tty, never the client's elicitation); None: not said (any)
    approval: str | None = None
    description: str = ""
    rules: tuple[Rule, ...] = ()
    exfiltrating: bool | None = None
    sink_params: tuple[str, ...] = ()
    # (argument, kind): what an argument of a sending tool names (``sink_kinds``:
    # destinations.SINK_KINDS); "none" says it is no destination of data
    sink_kinds: tuple[tuple[str, str], ...] = ()
    trusted_destinations: tuple[str, ...] = ()  # normalised
    write_params: tuple[str, ...] = ()
    allowed_path_prefixes: tuple[str, ...] = ()  # absolute, normalised
    prefix_alts: tuple[str, ...] = ()  # the same prefixes with symlinks resolved
    arg_patterns: tuple[tuple[str, re.Pattern[str]], ...] = ()
    max_calls: int | None = None
    # Destination provenance by field (visor/policy/fields.py): paths of this
    # tool's structured output the service asserts (a destination there is a
    # known correspondent) and paths a third party writes (asked about).
    trusted_output_fields: tuple[FieldPath, ...] = ()
    sender_fields: tuple[FieldPath, ...] = ()
    # "deny" | "ask": a destination seen in untrusted output; None: not said
    # (settings.untrusted_output decides)
    untrusted_output: str | None = None
    # (packs) the arguments of the tool the pack was verified against: the entry describes
    # only a listed tool whose schema takes no others (None: any tool of that name)
    arguments: tuple[str, ...] | None = None
    # per deny rule type, all its patterns in one regex: a quick "can any match?"
    screens: dict[str, re.Pattern[str]] = field(default_factory=dict)
    # argument rules grouped by type, in order of first appearance: (type, check, rules)
    plan: tuple[tuple[str, Callable[..., str | None], tuple[Rule, ...]], ...] = ()
    origin: str = "policy"  # "policy", "pack:NAME" or "policy+pack:NAME"
    line: int = 0


@dataclass(frozen=True, slots=True)
class AccessList:
    """``resources:`` or ``prompts:`` of a server: URI or name globs.

    ``allow`` None: everything not denied is allowed; a tuple (even empty):
    only what matches it.
    """

    allow: tuple[Glob, ...] | None = None
    deny: tuple[Glob, ...] = ()
    line: int = 0


@dataclass(frozen=True, slots=True)
class Attestation:
    """``attestation:`` of a server entry: a pinned digest of the launched stdio invocation.

    ``observed`` and ``unresolved`` are filled in at start-up by `visor run`
    (``visor.policy.attestation.observe``): the digest of the invocation it
    launched, or why none could be measured. Until then neither is set and
    every call to the server is denied.
    """

    kind: str
    digest: str  # "sha256:" + 64 lower-case hex digits
    entry_arg_positions: tuple[int, ...] = ()  # sorted, unique, zero-based into the server's args
    line: int = 0
    observed: str | None = None
    unresolved: str | None = None


@dataclass(frozen=True, slots=True)
class ServerPolicy:
    name: str
    allowed: bool
    transport: str | None = None
    description: str = ""
    allowed_destinations: tuple[str, ...] = ()
    denied_destinations: tuple[str, ...] = ()
    packs: tuple[str, ...] | None = None  # None: automatic selection
    tools: dict[str, ToolPolicy] = field(default_factory=dict)
    line: int = 0
    resources: AccessList | None = None
    prompts: AccessList | None = None
    # "sampling" / "elicitation" -> "allow" | "deny"; absent: allow. "sampling_tools": a sampling
    # request that offers the client's model tools; absent: deny
    server_requests: dict[str, str] = field(default_factory=dict)
    hide_denied_tools: bool = False
    attestation: Attestation | None = None


@dataclass(frozen=True, slots=True)
class ChainMatch:
    server: str
    tool_pattern: str
    regex: re.Pattern[str]

    def matches(self, server: str, tool: str) -> bool:
        return (self.server == "*" or self.server == server) and self.regex.fullmatch(tool) is not None


@dataclass(frozen=True, slots=True)
class ToolChain:
    name: str
    sources: tuple[ChainMatch, ...]
    sinks: tuple[ChainMatch, ...]
    action: Action
    within_calls: int | None
    description: str = ""
    line: int = 0


@dataclass(frozen=True, slots=True)
class Taint:
    name: str
    source_tools: tuple[str, ...]
    source_servers: tuple[str, ...] = ()
    source_patterns: tuple[Glob, ...] = ()
    description: str = ""
    line: int = 0


@dataclass(frozen=True, slots=True)
class EgressControl:
    name: str
    when_tainted: str
    sink_tools: tuple[str, ...]
    action: Action
    sink_servers: tuple[str, ...] = ()
    reason: str = ""
    description: str = ""
    line: int = 0


@dataclass(frozen=True, slots=True)
class Identity:
    name: str
    allowed_servers: tuple[str, ...]
    allowed_tools: tuple[str, ...]
    description: str = ""
    line: int = 0


@dataclass(frozen=True, slots=True)
class TimeWindow:
    start_minute: int  # minutes after midnight, inclusive
    end_minute: int  # exclusive
    timezone: str
    days: frozenset[int]  # ISO weekday numbers 1..7; empty means every day


@dataclass(frozen=True, slots=True)
class TimeRestriction:
    name: str
    servers: tuple[str, ...]
    tools: tuple[re.Pattern[str], ...]
    tool_names: tuple[str, ...]
    allowed_hours: tuple[TimeWindow, ...]
    denied_days: frozenset[int]
    outside_action: Action
    timezone: str = "UTC"  # for denied_days
    description: str = ""
    line: int = 0


@dataclass(frozen=True, slots=True)
class RedactionPattern:
    name: str
    regex: re.Pattern[str]
    replacement: str


@dataclass(frozen=True, slots=True)
class Redaction:
    output_redaction: bool = True  # False only when the policy says so
    sensitive_files: tuple[Glob, ...] = ()
    patterns: tuple[RedactionPattern, ...] = ()
    output_patterns: tuple[RedactionPattern, ...] = ()
    builtin: bool = True  # visor.redact.BUILTIN, minus `disable`
    disable: tuple[str, ...] = ()
    # built by the loader (None: the built-in default)
    engine: Redactor | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    # Defaults are mcp-visor's (internal/policy/loader.go DefaultPolicy), so an
    # omitted key means what it means there. None: no limit (an explicit 0).
    max_argument_size_bytes: int = 1_048_576
    max_output_size_bytes: int | None = 10_485_760
    session_max_calls: int | None = 100  # mcp-visor: session_max_tools
    session_timeout_seconds: int | None = 3600
    approval_timeout_seconds: int = 300
    chain_window_size: int = 10
    log_level: str = "info"
    identity: str | None = None
    packs: tuple[str, ...] | None = None  # None: all built-in packs, auto-selected
    sensitive_paths: tuple[Glob, ...] = ()  # added to the built-in list, never replacing it
    # Destination keys the provenance index keeps (8-16 bytes each); past it,
    # destinations trusted only by domain or prefix are asked (docs/limits.md).
    output_index_max_keys: int = 1_000_000
    # A destination seen in untrusted output: "deny" (default), or "ask" a
    # human when an approval channel is configured (denied without one).
    untrusted_output: str = "deny"


@dataclass(frozen=True, slots=True)
class Pack:
    """A built-in description of a known server's sending and writing tools."""

    name: str
    servers: tuple[str, ...]  # server names (lower-case) that select the pack
    tools: dict[str, ToolPolicy]
    description: str = ""


@dataclass(frozen=True, slots=True)
class Policy:
    source: str
    sha256: str
    version: str = "1.0"
    description: str = ""
    default_action: Literal["allow", "deny"] = "deny"
    settings: Settings = field(default_factory=Settings)
    servers: tuple[ServerPolicy, ...] = ()
    server_index: dict[str, ServerPolicy] = field(default_factory=dict)
    tool_chains: tuple[ToolChain, ...] = ()
    taints: tuple[Taint, ...] = ()
    egress_controls: tuple[EgressControl, ...] = ()
    identities: tuple[Identity, ...] = ()
    time_restrictions: tuple[TimeRestriction, ...] = ()
    redaction: Redaction = field(default_factory=Redaction)
    packs: dict[str, Pack] = field(default_factory=dict)
    # The evaluator's plan for this policy (visor/policy/evaluate.py), compiled
    # once by the loader. Only the checks' presence depends on the policy's
    # contents: a copy made with ``replace`` that changes rules, chains or
    # settings must be given a new one (``evaluate.compile_policy``).
    compiled: Compiled | None = field(default=None, compare=False, repr=False)

    def server(self, name: str) -> ServerPolicy | None:
        """The entry for a server name, falling back to the ``"*"`` entry."""
        entry = self.server_index.get(name)
        if entry is None:
            entry = self.server_index.get("*")
        return entry
