"""Redaction of secrets in what crosses the relay. Pure and synchronous.

Strings (or parsed JSON values) go in; redacted copies and a list of
`Finding`s (JSON path and pattern name, never the secret) come out. Nothing
here does I/O or knows about the relay: the relay's `DataGuard` decides which
parts of which message are passed through which `PatternSet`.

Why it is shaped this way:

* Most messages hold no secret, and a 1 MiB tool result must cost little.
  Every `PatternSet` therefore has a prefilter over the raw line: each
  built-in pattern names literal fragments that any match must contain
  (``akia``, ``ghp_``, ``private key-----``...), checked with ``bytes in``
  on the lower-cased line (memchr speed). Only when a fragment is present, or
  when the set holds a policy pattern (whose literals we cannot know), are the
  strings walked, and then one combined alternation decides whether any
  pattern can match a string before the patterns run one by one.
  A fragment is searched as the JSON line spells it (``password=\\"`` for
  ``password="``, see `_json_spelling`), and a line with ``\\u`` or ``\\/``
  escapes, which can spell anything, is always walked.
* Containers are copied only where something changed, so an unchanged value
  is returned as the very same object and callers can test with ``is``.
* Patterns run in order (built-ins first, then the policy's in listing
  order), each over the output of the previous one: overlapping patterns give
  one deterministic result, and the first pattern to claim a secret names it.
* Replacements are literal text. A replacement that could refer to groups
  could also put the secret straight back.
* A pattern with a group named ``secret`` replaces only that group, so the
  context it needed to recognise the secret (``aws_secret_access_key=``,
  ``postgres://user:``) stays readable.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

DEFAULT_REPLACEMENT = "[REDACTED]"


@dataclass(frozen=True, slots=True)
class Pattern:
    name: str
    regex: re.Pattern[str]
    replacement: str
    # Case-sensitive fragments one of which every match contains; () = unknown.
    literals: tuple[str, ...] = ()
    # The match must not follow a word character. Checked in the replacement
    # callback rather than with a leading \b, which would stop the regex
    # engine from skipping ahead to the literal prefix (50x slower on 1 MiB).
    boundary: bool = False
    # Fragments checked with `in` before the regex runs on a string: for a
    # regex that does not start with a literal (so the engine cannot skip).
    gate: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Finding:
    path: str  # JSON path of the string, e.g. $.config.token or $.content[0].text
    pattern: str
    count: int = 1

    def as_json(self) -> dict[str, Any]:
        return {"path": self.path, "pattern": self.pattern, "count": self.count}


def _p(
    name: str,
    regex: str,
    literals: tuple[str, ...],
    replacement: str | None = None,
    boundary: bool = True,
    gate: tuple[str, ...] = (),
) -> Pattern:
    return Pattern(
        name,
        re.compile(regex),
        replacement if replacement is not None else f"[REDACTED:{name}]",
        literals,
        boundary,
        gate,
    )


# The built-in set. Each is narrow on purpose: a false positive silently
# changes what a server receives. Every regex starts with a literal, so that
# the regex engine can skip to candidates.
BUILTIN: tuple[Pattern, ...] = (
    _p(
        "private_key",
        # The whole block, BEGIN through END; a block cut off before its END
        # (a truncated output) is redacted to the end of the string.
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
        r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\Z)",
        ("PRIVATE KEY",),
        boundary=False,
    ),
    _p(
        "aws_access_key_id",
        r"(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Za-z0-9])",
        ("AKIA", "ASIA", "ABIA", "ACCA"),
    ),
    _p(
        "aws_secret_access_key",
        # 40 characters of base64 alone are too common to redact; only in context. The keyword
        # in the letter cases people write it (secret_access_key, SECRET_ACCESS_KEY,
        # SecretAccessKey, Secret_Key...), each holding "ecret" or "ECRET": the prefilter and
        # the gate find every form the regex reads (a case-insensitive screen costs 5x).
        # The quotes may be escaped: JSON text inside a string (a tool's JSON result that
        # holds a command's JSON output, a log line) spells them \" or \\\".
        r"(?:[Ss]ecret_?[Aa]ccess_?[Kk]ey|SECRET_?ACCESS_?KEY|[Ss]ecret_?[Kk]ey|SECRET_?KEY)(?:\\{0,8}[\"'])?\s*[:=]\s*(?:\\{0,8}[\"'])?"
        r"(?P<secret>[A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])",
        ("ecret", "ECRET"),
        boundary=False,
        gate=("ecret", "ECRET"),
    ),
    _p(
        "github_token",
        r"gh[pousr]_[A-Za-z0-9]{36,255}(?![A-Za-z0-9])",
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    ),
    _p("github_fine_grained_token", r"github_pat_[A-Za-z0-9_]{22,255}", ("github_pat_",)),
    _p("gitlab_token", r"glpat-[A-Za-z0-9_\-]{20,}", ("glpat-",)),
    # Literals without the leading x: a run of x's (a common filler) would
    # otherwise make the raw prefilter try every position.
    _p("slack_token", r"xox[abposr]-[A-Za-z0-9-]{10,}", ("oxa-", "oxb-", "oxp-", "oxo-", "oxs-", "oxr-")),
    _p(
        "slack_webhook",
        r"https://hooks\.slack\.com/services/[A-Za-z0-9_/]+",
        ("hooks.slack.com",),
        boundary=False,
    ),
    # Anthropic before OpenAI: both start with sk-.
    _p("anthropic_key", r"sk-ant-[A-Za-z0-9_\-]{20,}", ("sk-ant-",)),
    _p("openai_key", r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}", ("sk-",)),
    _p("jwt", r"eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{10,}", ("eyJ",)),
    _p(
        "connection_string_password",
        # scheme://user:password@host -- only the password goes. Matched from
        # "://" (a literal start); the scheme is not needed to know it is one.
        r"://[^\s:/@\"'<>]+:(?P<secret>[^\s@/\"'<>]+)@",
        ("://",),
        "[REDACTED:password]",
        boundary=False,
    ),
)
BUILTIN_NAMES: frozenset[str] = frozenset(p.name for p in BUILTIN)


def literal_prefix(regex: re.Pattern[str]) -> str:
    """The literal text every match of `regex` starts with ("" if none or unsure).

    Lets a policy pattern such as ``TOK-[A-Z0-9]{16}`` join the prefilter.
    This is decoded text, as the regex sees it; `build_set` turns it into the
    bytes a JSON line holds (`_json_spelling`).

    Only the leading run of LITERAL nodes counts, so anything that makes a
    match's first characters vary ends it: an alternation (the parser keeps
    only a prefix common to all branches as literals), a class of more than
    one character, a repeat (``abc?`` gives ``ab``), a group, an anchor or
    lookaround. Case-insensitive patterns (``(?i)`` or re.IGNORECASE) give
    "": their LITERAL nodes match other cases too. A scoped ``(?i:...)`` is a
    group, so the prefix ends before it.
    """
    if regex.flags & re.IGNORECASE:
        return ""
    try:
        # typeshed has no stub for re._parser (private); the ignore is for that alone
        from re import _parser  # type: ignore[attr-defined]

        parsed = _parser.parse(regex.pattern, regex.flags)
    except Exception:  # a private module: if it moves, patterns just lose the prefilter
        return ""
    out: list[str] = []
    for op, arg in parsed:
        if str(op) != "LITERAL":
            break
        out.append(chr(arg))
    text = "".join(out)
    return text if len(text) >= 3 else ""


@dataclass(frozen=True, slots=True)
class PatternSet:
    """Patterns for one direction, compiled once at policy load."""

    patterns: tuple[Pattern, ...] = ()
    # One alternation of every pattern's literals, each reversed, searched in
    # the reversed raw line; None when some pattern has no known literal
    # (every message is walked). Reversed, because the regex engine stops at
    # every byte that can start an alternative: the literals' first bytes
    # (e, s, g, o...) are common in text, their last bytes (y, _, -, A...) are
    # not, so the reversed search runs 2-3x faster and costs one copy.
    raw_screen: re.Pattern[bytes] | None = None
    # For long lines: (byte, literals that contain it). A literal is absent
    # when its rarest byte is, and a byte test is a memchr: most long lines
    # are ruled out without the regex.
    anchors: tuple[tuple[bytes, tuple[bytes, ...]], ...] = ()

    @property
    def empty(self) -> bool:
        return not self.patterns

    def may_match(self, raw: bytes) -> bool:
        """False only when no pattern can match any string in the JSON line `raw`."""
        if not self.patterns:
            return False
        screen = self.raw_screen
        if screen is None:
            return True
        # An escaped character could hide a literal from the byte test
        # (\\u0041KIA, :\\/\\/): such lines are walked. Every other
        # escape has one spelling, which the screen searches (_json_spelling).
        if b"\\" in raw and (b"\\u" in raw or b"\\/" in raw):
            return True
        if len(raw) > _LONG:
            candidates = [lits for byte, lits in self.anchors if byte in raw]
            if not candidates:
                return False
            if sum(map(len, candidates)) <= 4:
                return any(lit in raw for lits in candidates for lit in lits)
        return screen.search(raw[::-1]) is not None

    def redact_text(self, text: str) -> tuple[str, list[tuple[str, int]]]:
        """`text` with every match replaced, and (pattern name, count) for each pattern that matched.

        Each regex runs on its own: one that starts with a literal lets the
        engine skip ahead (about 0.3 ms per MiB), while one alternation of
        them all is tried at every position (ten times slower).
        """
        hits: list[tuple[str, int]] = []
        for pat in self.patterns:
            if pat.gate and not any(g in text for g in pat.gate):
                continue
            count = [0]
            new = pat.regex.sub(_replacer(pat, count), text)
            if count[0]:
                text = new
                hits.append((pat.name, count[0]))
        if "\\" in text and _HIDING_ESCAPE.search(text) is not None:
            text = self._redact_escaped(text, hits)
        return text, hits

    def _redact_escaped(self, text: str, hits: list[tuple[str, int]]) -> str:
        """Secrets that JSON escapes inside the string spell (``\\u0067hp_...``, ``:\\/\\/``).

        A string that is itself JSON text is read again by its consumer (the MCP SDK parses a
        string argument for a non-string parameter with json.loads), which turns the escapes
        into the secret. The patterns run over the unescaped reading; each match's escape
        tokens are replaced in `text`, so the string stays the same JSON text with the secret
        gone. Only strings with a \\u or \\/ escape come here.
        """
        # A quick reading first (C speed; it also reads escapes JSON has not, which only
        # widens it): most such strings spell no secret, and then nothing else is done.
        # A malformed escape ("\\u12", "\\x") spells nothing to a JSON parser either: "replace".
        quick = (
            text.replace("\\/", "/").encode("ascii", "backslashreplace").decode("unicode_escape", "replace")
        )
        if not any(
            (not p.gate or any(g in quick for g in p.gate)) and p.regex.search(quick) is not None
            for p in self.patterns
        ):
            return text
        # The exact reading. Token k of the escapes: view index dpos[k] came from
        # text[opos[k]:oend[k]]; an unescaped view index i maps to i + shift of the
        # last token before it.
        dpos: list[int] = []
        opos: list[int] = []
        oend: list[int] = []
        out: list[str] = []
        pos = 0
        n_view = 0
        for m in _JSON_ESCAPE.finditer(text):
            s0 = m.start()
            if s0 > pos:
                out.append(text[pos:s0])
                n_view += s0 - pos
            code = m.group(1)
            out.append(chr(int(code, 16)) if code is not None else _UNESCAPE.get(m.group(2), m.group(2)))
            dpos.append(n_view)
            opos.append(s0)
            oend.append(m.end())
            n_view += 1
            pos = m.end()
        out.append(text[pos:])
        view = "".join(out)

        def span(i: int) -> tuple[int, int]:
            k = bisect.bisect_right(dpos, i) - 1
            if k < 0:
                return i, i + 1
            if dpos[k] == i:
                return opos[k], oend[k]
            o = i - dpos[k] - 1 + oend[k]
            return o, o + 1

        spans: list[tuple[int, int, str]] = []
        for pat in self.patterns:
            if pat.gate and not any(g in view for g in pat.gate):
                continue
            keep = "secret" in pat.regex.groupindex
            n = 0
            for m in pat.regex.finditer(view):
                a, b = m.span("secret") if keep and m.start("secret") >= 0 else m.span()
                if b <= a:
                    continue
                if pat.boundary and m.start() > 0 and _is_word(view[m.start() - 1]):
                    continue
                spans.append((span(a)[0], span(b - 1)[1], pat.replacement))
                n += 1
            if n:
                hits.append((pat.name, n))
        if not spans:
            return text
        # Replaced right to left; an overlapping later span is folded into the earlier one.
        spans.sort()
        merged: list[tuple[int, int, str]] = []
        for a, b, rep in spans:
            if merged and a < merged[-1][1]:
                pa, pb, prep = merged[-1]
                merged[-1] = (pa, max(pb, b), prep)
            else:
                merged.append((a, b, rep))
        for a, b, rep in reversed(merged):
            text = text[:a] + rep + text[b:]
        return text


# An escape that can spell a pattern's literal in a string that is JSON text itself.
_HIDING_ESCAPE = re.compile(r"\\(?:u[0-9a-fA-F]{4}|/)")
# One JSON escape, as a JSON parser reads it (``\\\\`` is one token, so ``\\\\u0067`` is no g).
_JSON_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|([\"\\/bfnrt]))")
_UNESCAPE = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _is_word(ch: str) -> bool:
    # ASCII only: a token glued to CJK text ("令牌是ghp_...") or to an accented letter is
    # still a token, and every built-in key format is ASCII.
    return ch.isascii() and (ch.isalnum() or ch == "_")


def _replacer(pat: Pattern, count: list[int]) -> Callable[[re.Match[str]], str]:
    replacement = pat.replacement
    keep = "secret" in pat.regex.groupindex
    boundary = pat.boundary

    def sub(m: re.Match[str]) -> str:
        start = m.start()
        if boundary and start > 0 and _is_word(m.string[start - 1]):
            return m.group(0)
        count[0] += 1
        if keep:
            s0, e0 = m.span("secret")
            if s0 >= 0:
                whole = m.group(0)
                return whole[: s0 - start] + replacement + whole[e0 - start :]
        return replacement

    return sub


def build_set(patterns: Iterable[Pattern]) -> PatternSet:
    pats = tuple(patterns)
    if not pats:
        return PatternSet()
    literals: list[str] = []
    screened = True
    for p in pats:
        lits = p.literals or tuple(x for x in (literal_prefix(p.regex),) if x)
        if not lits:
            screened = False
        literals.extend(lits)
    if not screened:
        return PatternSet(pats, None)
    # Longest first, so that the alternation never stops early on a prefix.
    spelled = dict.fromkeys(_json_spelling(lit) for lit in literals)
    ordered = sorted(spelled, key=len, reverse=True)
    groups: dict[bytes, list[bytes]] = {}
    for lit in ordered:
        anchor = min(lit, key=lambda b: (_COMMONNESS.get(b, 0), b))
        groups.setdefault(bytes((anchor,)), []).append(lit)
    return PatternSet(
        pats,
        re.compile(b"|".join(re.escape(lit[::-1]) for lit in ordered)),
        tuple((b, tuple(lits)) for b, lits in groups.items()),
    )


# How a character of a decoded string is written in a JSON line that holds no
# ``\u`` and no ``\/`` (PatternSet.may_match walks every line that does).
# In such a line each character has exactly ONE spelling, whatever the encoder
# (json.dumps, orjson, JSON.stringify, serde_json, Go...):
#
# * ``"`` and ``\`` must be escaped, and without \u only as ``\"`` and ``\\``;
# * control characters U+0000-U+001F must be escaped (the line was parsed by
#   orjson, which refuses them raw); without \u only these five can be, as
#   ``\b \f \n \r \t``; the others cannot occur at all, so a literal holding
#   one can only be in a line with \u, and is left as it is (never found);
# * ``/`` is ``/`` (``\/`` means the line is walked);
# * anything else is its own UTF-8 bytes (orjson refuses any other encoding;
#   ``\uXXXX``, surrogate pairs included, means the line is walked). A lone
#   surrogate cannot be written raw, so its "surrogatepass" bytes, which no
#   valid line holds, are never found: right, as only \u can spell it.
#
# So a decoded string holds a literal only if the line holds the literal's
# spelling: escaping is character by character. Searching the unescaped
# literal instead (as before) missed every match of a policy pattern such as
# ``password="[^"]+"``, whose quote the line holds as ``\"``. Patterns without
# these characters (all built-ins) are spelled as before, at the same speed.
# (Leaving such patterns out of the prefilter would be sound too, but one
# pattern like ``"password":\s*"`` would then make every message be walked.)
_JSON_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _json_spelling(literal: str) -> bytes:
    """`literal` as the raw bytes of a JSON string holding it (see _JSON_ESCAPES)."""
    return "".join(_JSON_ESCAPES.get(ch, ch) for ch in literal).encode("utf-8", "surrogatepass")


# Lines longer than this are screened byte by byte first (see PatternSet.anchors).
_LONG = 4096
# How common a byte is in tool output (JSON, prose, paths, base64): the
# anchor of a literal is its least common byte. Only speed depends on it.
_COMMON_ORDER = b' ex"tao:insrh,ldcu.mfpgwy/bv0123456789-_kTSAICEjBPMRDNLOFHGWqUzVKJYQXZ'
_COMMONNESS: dict[int, int] = {b: len(_COMMON_ORDER) - i for i, b in enumerate(_COMMON_ORDER)}


@dataclass(frozen=True, slots=True)
class Redactor:
    """Both directions of one policy."""

    arguments: PatternSet = PatternSet()
    outputs: PatternSet = PatternSet()


def build_redactor(
    *,
    builtin: bool,
    disable: Iterable[str],
    patterns: Iterable[Pattern],
    output_patterns: Iterable[Pattern],
    outputs: bool = True,
) -> Redactor:
    """Built-ins (minus `disable`) first, then the policy's patterns, per direction.

    The loader has already refused a policy pattern whose name shadows a
    built-in that is not disabled.
    """
    off = frozenset(disable)
    base = tuple(p for p in BUILTIN if p.name not in off) if builtin else ()
    args = build_set(base + tuple(patterns))
    outs = build_set(base + tuple(output_patterns)) if outputs else PatternSet()
    return Redactor(args, outs)


DEFAULT_REDACTOR = build_redactor(builtin=True, disable=(), patterns=(), output_patterns=())


# --------------------------------------------------------------- values


def redact_value(
    value: Any, pset: PatternSet, path: str, findings: list[Finding], *, skip_binary: bool = False
) -> Any:
    """Every string at any depth; containers are copied only where something changed.

    Keys are left alone (a key is structure, and changing it would change
    what the schema sees); only string values are rewritten, so types and
    shape never change.
    """
    t = type(value)
    if t is str:
        new, hits = pset.redact_text(value)
        for name, n in hits:
            findings.append(Finding(path, name, n))
        return new
    if t is dict:
        # With `skip_binary` (a server's output): an image's or audio's `data` and a resource's
        # `blob` are base64, not text a model reads; a replacement inside them would corrupt them.
        # Only where MCP puts them (a content block, resource contents): a `blob` or an
        # image-shaped object inside structuredContent, `_meta` or a log message is text.
        image = blob = False
        if skip_binary and ("data" in value or "blob" in value) and _BINARY_AT.match(path):
            image = "mimeType" in value and value.get("type") in ("image", "audio")
            blob = "uri" in value
        out: dict[str, Any] | None = None
        for k, v in value.items():
            if type(v) not in (str, dict, list):
                continue
            if (image and k == "data") or (blob and k == "blob" and type(v) is str):
                continue
            nv = redact_value(v, pset, f"{path}{_key(k)}", findings, skip_binary=skip_binary)
            if nv is not v:
                if out is None:
                    out = dict(value)
                out[k] = nv
        return value if out is None else out
    if t is list:
        lst: list[Any] | None = None
        for i, v in enumerate(value):
            if type(v) in (str, dict, list):
                nv = redact_value(v, pset, f"{path}[{i}]", findings, skip_binary=skip_binary)
                if nv is not v:
                    if lst is None:
                        lst = list(value)
                    lst[i] = nv
        return value if lst is None else lst
    return value


# The JSON paths (as `redact_output` names them) of the objects that may hold a binary payload:
# a tool result's content blocks (path "$" for a tool result, "$.result" for other answers), an
# embedded resource in one, resources/read's contents, and the content of prompts/get's and
# sampling's messages (one block or a list; a tool_result block holds its own content list).
_BINARY_AT = re.compile(
    r"\$(?:\.result)?\.content\[\d+\](?:\.resource)?\Z"
    r"|\$\.result\.contents\[\d+\]\Z"
    r"|\$\.(?:result|params)\.messages\[\d+\]\.content(?:\[\d+\](?:\.content\[\d+\])?)?(?:\.resource)?\Z"
)
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _key(k: str) -> str:
    return f".{k}" if _PLAIN_KEY.match(k) else f"[{_quote(k)}]"


def _quote(k: str) -> str:
    return '"' + k.replace("\\", "\\\\").replace('"', '\\"') + '"'


def redact_arguments(pset: PatternSet, arguments: dict[str, Any]) -> tuple[dict[str, Any], list[Finding]]:
    findings: list[Finding] = []
    new = redact_value(arguments, pset, "$", findings)
    return new, findings


# -------------------------------------------------------------- outputs


def redact_output(value: Any, pset: PatternSet, path: str, findings: list[Finding]) -> Any:
    """Every string a server sent, at any depth (a result's content and `_meta`, a link's
    description, an error's message and data, a notification's text), except binary payloads."""
    return redact_value(value, pset, path, findings, skip_binary=True)


# ------------------------------------------------------- schema checks


def schema_conflicts(value: Any, schema: Any, path: str = "$.structuredContent") -> list[str]:
    """Paths where a string in `value` breaks a constraint of `schema` that Visor can check.

    Checked: ``maxLength``, ``minLength``, ``pattern``, ``enum``, ``const``,
    following ``properties``, ``items``, ``additionalProperties``, ``allOf``
    and local ``$ref``s. Not checked: ``format``, and anything under
    ``anyOf``/``oneOf`` (which branch applies is not decidable here).
    """
    root = schema if type(schema) is dict else {}
    out: list[str] = []
    _conflicts(value, root, root, path, out, 0)
    return out


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    seen = 0
    while type(schema.get("$ref")) is str and seen < 16:
        ref = schema["$ref"]
        if not ref.startswith("#/"):
            return {}
        node: Any = root
        for part in ref[2:].split("/"):
            node = node.get(part.replace("~1", "/").replace("~0", "~")) if type(node) is dict else None
        if type(node) is not dict:
            return {}
        schema = node
        seen += 1
    return schema


def _conflicts(value: Any, schema: Any, root: dict[str, Any], path: str, out: list[str], depth: int) -> None:
    if type(schema) is not dict or depth > 64:
        return
    schema = _resolve(schema, root)
    for sub in schema.get("allOf") or ():
        _conflicts(value, sub, root, path, out, depth + 1)
    t = type(value)
    if t is str:
        if _string_conflict(value, schema):
            out.append(path)
    elif t is dict:
        props = schema.get("properties") if type(schema.get("properties")) is dict else {}
        extra = schema.get("additionalProperties")
        for k, v in value.items():
            sub = props.get(k, extra if type(extra) is dict else None)
            _conflicts(v, sub, root, f"{path}{_key(k)}", out, depth + 1)
    elif t is list:
        items = schema.get("items")
        for i, v in enumerate(value):
            _conflicts(v, items, root, f"{path}[{i}]", out, depth + 1)


def _string_conflict(value: str, schema: dict[str, Any]) -> bool:
    mx = schema.get("maxLength")
    if type(mx) is int and len(value) > mx:
        return True
    mn = schema.get("minLength")
    if type(mn) is int and len(value) < mn:
        return True
    if "const" in schema and schema["const"] != value:
        return True
    enum = schema.get("enum")
    if type(enum) is list and value not in enum:
        return True
    pat = schema.get("pattern")
    if type(pat) is str:
        try:
            if re.search(pat, value) is None:
                return True
        except re.error:
            return False  # an ECMA pattern Python cannot read: not checkable
    return False


# ------------------------------------------------------------ truncation

TRUNCATION_NOTE = "\n[Visor: output truncated to {shown} of {total} bytes]"


def truncate_utf8(text: str, max_bytes: int) -> str:
    """The longest prefix of `text` whose UTF-8 form fits in `max_bytes`; never splits a character."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= max_bytes:
        return text
    # A cut inside a multi-byte sequence leaves a partial character at the
    # end; "ignore" drops exactly that partial character.
    return data[:max_bytes].decode("utf-8", "ignore")


def truncate_content(result: dict[str, Any], max_bytes: int) -> tuple[dict[str, Any], int, int]:
    """Cut `content[].text` so that all text together fits in `max_bytes`.

    Returns the new result, the bytes of text kept and the bytes there were.
    Text items after the budget is spent become empty strings (kept, so that
    indices and types stay valid); the first cut item says it was cut.
    `structuredContent` is never cut: a cut value could break the tool's
    outputSchema.
    """
    content = result.get("content")
    if type(content) is not list:
        return result, 0, 0
    sizes = [
        len(item["text"].encode("utf-8", "surrogatepass"))
        if type(item) is dict and type(item.get("text")) is str
        else 0
        for item in content
    ]
    total = sum(sizes)
    if total <= max_bytes:
        return result, total, total
    budget = max_bytes
    out: list[Any] = []
    noted = False
    for item, size in zip(content, sizes, strict=True):
        if not size:
            out.append(item)
            continue
        if size <= budget:
            out.append(item)
            budget -= size
            continue
        kept = truncate_utf8(item["text"], budget)
        budget = 0
        if not noted:
            noted = True
            kept += TRUNCATION_NOTE.format(shown=max_bytes, total=total)
        out.append({**item, "text": kept})
    return {**result, "content": out}, max_bytes, total
