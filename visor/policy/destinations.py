"""Destinations: recognising them in arguments, normalising them, and indexing
what untrusted output has shown.

A destination is reduced to a small set of keys (``email:a@b.c``,
``url:https://h/p``, ``host:h``, ``channel:general``, ``user:alice``,
``phone:15551234``, ``iban:DE89370400440532013000``). A bare name is read as
the kind the argument holding it names (``read_as``): ``alice`` in a
``recipient`` or ``user`` argument is a user, not a channel of that name.
Output is indexed into hash sets at observe time, so checking a destination
costs the same after ten thousand outputs as after one.
"""

from __future__ import annotations

import json
import re
import unicodedata
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import parse_qsl, unquote

from visor.policy import addresses, urls
from visor.policy.paths import snake

# snake_case words that make an argument name destination-shaped, alone or as a
# part: ``to``, ``recipient_email``, ``toAddress``, ``webhook_url``, ``channel_id``.
_DEST_WORDS: frozenset[str] = frozenset(
    {
        "to",
        "cc",
        "bcc",
        "recipient",
        "recipients",
        "email",
        "emails",
        "mail",
        "url",
        "urls",
        "webhook",
        "webhooks",
        "channel",
        "channels",
        "address",
        "addresses",
        "endpoint",
        "host",
        "hostname",
        "domain",
        "invitee",
        "invitees",
        "attendee",
        "attendees",
        "share",
        "phone",
        "destination",
        "dest",
        "callback",
        "mailto",
    }
)
# Words that disqualify: ``image_url`` to read, ``from`` address, a ``base_url`` to fetch from.
_NOT_DEST_WORDS: frozenset[str] = frozenset({"from", "sender", "image", "avatar", "thumbnail", "source"})


@lru_cache(maxsize=4096)
def is_destination_name(name: str) -> bool:
    words = snake(name).split("_")
    if any(w in _NOT_DEST_WORDS for w in words):
        return False
    return any(w in _DEST_WORDS for w in words)


def declared_arguments(
    sink_params: tuple[str, ...], sink_kinds: tuple[tuple[str, str], ...]
) -> tuple[set[str], set[str]]:
    """What a tool entry declares of its arguments: ``(destinations, not destinations)``.

    An argument named by ``sink_params`` or given a kind in ``sink_kinds`` is a destination;
    one given ``none`` is not, even when its name reads like one (the channel a user is added
    to), unless ``sink_params`` also names it. An argument the entry says nothing of is read by
    its name (``is_destination_name``). The evaluator and ``visor lint`` both read entries so.
    """
    sinks = set(sink_params)
    sinks.update(a for a, k in sink_kinds if k != "none")
    return sinks, {a for a, k in sink_kinds if k == "none"} - sinks


def names_destination(sinks: set[str], not_sinks: set[str], argument: str) -> bool:
    """Whether ``argument`` is read as a destination under ``declared_arguments``' two sets."""
    return argument in sinks or (argument not in not_sinks and is_destination_name(argument))


# snake_case words by which an argument says what kind of name it holds: a
# person (a message's recipient, a member added, an invitee) or a channel.
_USER_WORDS: frozenset[str] = frozenset(
    {
        "user", "users", "username", "usernames", "member", "members", "recipient", "recipients",
        "to", "cc", "bcc", "invitee", "invitees", "attendee", "attendees", "participant",
        "participants", "assignee", "assignees", "reviewer", "reviewers", "person", "people",
        "contact", "contacts",
    }
)  # fmt: skip
_CHANNEL_WORDS: frozenset[str] = frozenset(
    {"channel", "channels", "room", "rooms", "conversation", "conversations"}
)


@lru_cache(maxsize=4096)
def named_kind(argument: str) -> str | None:
    """``"user"`` or ``"channel"``: the kind of name an argument holds, by its
    name (``recipient``, ``user_id``; ``channel_id``); None when the name says
    neither, or both (``channel_user``)."""
    words = set(snake(argument).split("_"))
    user, channel = not words.isdisjoint(_USER_WORDS), not words.isdisjoint(_CHANNEL_WORDS)
    if user == channel:
        return None
    return "user" if user else "channel"


def read_as(d: Dest, kind: str | None) -> Dest:
    """``d`` as the argument it was found in names it. A bare or ``@`` name in
    an argument that holds users is the user of that name (``user:alice``),
    not a channel: a trust entry ``#alice`` or an approval of the channel
    ``alice`` does not place it. An argument declared to hold one shape
    (``email``, ``url``, ``phone``, ``iban``: ``sink_kinds``) reads a value of
    another shape as opaque (asked, never placed, denied if seen). Everything
    else is what it was read as: an address, URL or number whatever the
    argument, and a ``#name`` a channel wherever it is written."""
    if kind == "user" and d.kind == "channel" and d.sigil != "#":
        return Dest("user", f"user:{d.value}", d.keys, None, d.sigil)
    shapes = _SHAPES.get(kind or "")
    if shapes is not None and d.kind not in shapes and d.kind != "opaque":
        # an account argument holding a phone-shaped number, a mail argument
        # holding a bare name: the server reads it as something Visor cannot
        # place with certainty
        return Dest("opaque", f"opaque:{d.value}", d.keys, d.domain, d.sigil)
    return d


def readings(d: Dest, kind: str | None) -> tuple[Dest, ...]:
    """Every destination ``d`` may be, read in an argument of ``kind`` (a
    ``sink_kinds`` kind, or ``named_kind`` of the argument's name, or None).

    A bare name in an argument whose kind is not known (None or ``any``) may
    be a user or a channel: both readings come back, and the name is placed
    only when each of them is (fail closed: the broadest kind). Otherwise one
    reading, as ``read_as`` gives it."""
    if kind in (None, "any") and d.kind == "channel" and d.sigil != "#":
        return (d, Dest("user", f"user:{d.value}", d.keys, None, d.sigil))
    return (read_as(d, kind),)


def field_name_read(d: Dest, kind: str | None) -> Dest | None:
    """What a trusted output field of ``kind`` (``FieldPath.kind``: declared,
    or said by the field's name) asserts by ``d``; None when it asserts nothing
    with certainty: a bare or ``@`` name in a field that says neither users nor
    channels (a service listing ``names`` has not said which)."""
    if d.kind != "channel" or d.sigil == "#":
        return d
    if kind == "user":
        return Dest("user", f"user:{d.value}", d.keys, None, d.sigil)
    if kind == "channel":
        return d
    return None


#: ``sink_kinds`` values: what one argument of a sending tool names. ``any``
#: is a name of either kind (both must be placed); ``none`` says the argument
#: is no destination of data (the channel a user is added to).
SINK_KINDS: tuple[str, ...] = ("user", "channel", "email", "url", "phone", "iban", "any", "none")
#: Kinds an argument declared to hold one shape accepts as read.
_SHAPES: dict[str, frozenset[str]] = {
    "email": frozenset({"email"}),
    "url": frozenset({"url", "host"}),
    "phone": frozenset({"phone"}),
    "iban": frozenset({"iban"}),
}


# ------------------------------------------------------------- normalising

_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"), None)
_EMAIL_RE = re.compile(r"[^\s@<>()\[\]\\,;:\"'`]+@[^\s@<>()\[\]\\,;:\"'`/?#]+\.[^\s@<>()\[\]\\,;:\"'`/?#.]+")
_URL_RE = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s<>\"'`]+")
_HOST_RE = re.compile(
    r"(?<![\w.-])(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z][a-z0-9-]{0,62}(?![\w-])", re.I
)
_FULL_HOST_RE = re.compile(r"(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z][a-z0-9-]{0,62}\.?")
_CHANNEL_RE = re.compile(r"[#@]?[\w.\-]{1,80}")
_PHONE_RE = re.compile(r"\+?[\d\s().\-]{7,24}")
# An account number (IBAN, ISO 13616): country, two check digits, 11 to 30
# letters and digits; written in groups of four or run together. Compared
# without spaces, upper case. The check digits are not verified: an
# IBAN-shaped string that fails them is still someone's idea of an account.
_IBAN_RE = re.compile(r"[A-Z]{2}[0-9]{2}[A-Z0-9]{11,30}")
# In output text: the grouped form ("DE89 3704 0044 0532 0130 00"), which
# whitespace splits into chunks. Every length from 15 on is indexed, so a
# word that follows the number cannot hide it.
_IBAN_TEXT = re.compile(r"(?<![A-Za-z0-9])[A-Za-z]{2}[0-9]{2}(?: ?[A-Za-z0-9]){11,32}")
_LIST_SEP = re.compile(r"[,;]")
_LIST_SPLIT = re.compile(r"[,;\s]+")
_BRACKETS = re.compile(r"<([^<>]*)>")
_SUBTOKEN = re.compile(r"[/:=&?]+")
# Identifier-like tokens: anything with a digit or one of - _ . / : in it
# (channel ids, "leak-room", hostnames). Plain words are indexed only when
# marked with # or @, which keeps the index small on ordinary prose; an
# unmarked plain name in a call is then unknown (ask), not denied.
_PIECE_SPLIT = re.compile(r"[,;<>()\[\]{}\"'`|]+")
_HAS_DIGIT = re.compile(r"\d")
_TAGGED_RE = re.compile(r"(?<![\w])[#@]([\w][\w.\-]{0,79})")
_EDGE = ".:!?*#@/\\=&"


# Spellings of one mailbox that output text may use and _EMAIL_RE cannot
# match: a quoted plain local part ("eve"@x) and a comment next to the "@"
# (eve(c)@x, eve@(c)x). The cleaned variant of a text spells them plainly, so
# the output index holds the same key the argument side computes. Bounded
# classes: linear in the text.
_QUOTED_ATOM = re.compile(r"\\?\"((?:[A-Za-z0-9!#$%&*+/=?^_{|}~.\-]|[^\x00-\x7f\s]){1,254})\\?\"(?=@)")
_AT_COMMENT = re.compile(r"\([^()@\s]{0,64}\)(?=@)|(?<=@)\([^()@\s]{0,64}\)")


# Spellings of an address that a reader of output (the model) takes for the
# plain address, which _EMAIL_RE reads otherwise: markdown and key=value text
# glue characters that are legal in an address to its edges (``**eve@x.example**``,
# ``|eve@x.example|``, ``to=eve@x.example``, ``_eve@x.example_``); a markdown
# ``\@``, spaces around "@", ``'eve'@``, JSON escapes (``\n``) left in text,
# and the ideographic full stops UTS 46 reads as "." (``eve@x。example``).
# Output only (indexing is generous: a false hit costs a deny); arguments are
# read as a mail library reads them. Bounded classes: linear in the text.
_LOCAL_CUT = re.compile(r"[=/|{}*~^!#$%&?]")
_DOMAIN_HEAD = re.compile(r"[^\W_](?:[\w.-]*[^\W_])?")
_LOOSE_AT = re.compile(r"\\@|[ \t]{1,8}@[ \t]{0,8}|@[ \t]{1,8}")
_LOOSE_QUOTED = re.compile(r"['`]([^\s'`@]{1,64})['`](?=@)")
_LOOSE_ESCAPES = re.compile(r"\\[ntr]")
_LOOSE_DOTS = str.maketrans({"\u3002": ".", "\uff61": "."})
# A chunk (of a text split at blanks) that shows a loose spelling: "@" at its edge (blanks
# around it), `\@`, `'eve'@`.
_LOOSE_CHUNK = re.compile(r"^@|@$|[\\'`]@")


def _address_spellings(match: str) -> Iterator[str]:
    """What one _EMAIL_RE match in output may be read as: itself, and the
    address without the delimiters glued to its edges."""
    addr = match.rstrip(".")
    yield addr
    local, _, domain = addr.rpartition("@")
    tail = _LOCAL_CUT.split(local)[-1].lstrip("_-+.")
    head = _DOMAIN_HEAD.match(domain)
    dom = head.group(0) if head is not None else domain
    if tail and (tail != local or dom != domain):
        yield f"{tail}@{dom}"


def _loosen(text: str) -> str:
    """``text`` with the loose spellings of addresses above made plain (output only; called for
    the texts that show one, `OutputIndex.add`: its substitutions try every blank)."""
    s = text
    if "\\" in s:
        s = _LOOSE_ESCAPES.sub(" ", s)
    if not s.isascii():
        s = s.translate(_LOOSE_DOTS)
    if "@" in s:
        s = _LOOSE_AT.sub("@", s)
        if "'@" in s or "`@" in s:
            s = _LOOSE_QUOTED.sub(r"\1", s)
    return s


# JSON string escapes left in text (a server that json.dumps its result into a
# text field writes "b\u00fccher.example"): the cleaned variant holds the
# characters, so a unicode address it showed is indexed as itself.
_JSON_ESCAPES = re.compile(r"(?:\\u[0-9A-Fa-f]{4})+")


def _json_unescape(m: re.Match[str]) -> str:
    try:
        text: str = json.loads('"' + m.group(0) + '"')
        return text
    except ValueError:
        return m.group(0)


def _clean(raw: str) -> str:
    """Text as a lenient reader sees it: JSON \\u escapes, NFKC, invisible
    characters dropped, percent- and HTML-decoded, plain spellings of quoted
    or commented addresses. For indexing output and for non-URL arguments
    only: a URL is never decoded before it is parsed (urls.read_url reads it
    raw)."""
    if (
        raw.isascii()
        and "%" not in raw
        and "&" not in raw
        and '"@' not in raw
        and ")@" not in raw
        and "@(" not in raw
        and "\\u" not in raw
    ):
        return raw.strip()  # nothing to normalise or decode
    s = _JSON_ESCAPES.sub(_json_unescape, raw) if "\\u" in raw else raw
    s = unicodedata.normalize("NFKC", s).translate(_INVISIBLE)
    for _ in range(3):  # nested percent-encoding, bounded
        t = unquote(s)
        if t == s:
            break
        s = t
    import html  # here, not at the top: its entity table costs start-up time, and few texts get here

    s = html.unescape(s)
    if "@" in s:
        if '"@' in s:
            s = _QUOTED_ATOM.sub(r"\1", s)
        if ")@" in s or "@(" in s:
            s = _AT_COMMENT.sub("", s)
    return s.strip()


def _host_key(host: str) -> str:
    return addresses.domain_key(host)


def _read_keys(u: urls.UrlRead) -> list[str]:
    keys: list[str] = []
    if u.canonical is not None:
        keys.append(f"url:{u.canonical}")
        if u.whatwg is not None and u.whatwg.userinfo:
            keys.append("url:" + u.canonical.replace("://user@", "://", 1))
    keys.extend(f"host:{h}" for h in u.hosts())
    return keys


def _url_keys(value: str) -> list[str] | None:
    """Index keys of a URL: ``url:`` its canonical form and ``host:`` every
    host any reader finds in it (an ambiguous URL names each of them), or
    None without a host. Read raw: never percent-decoded first."""
    keys = _read_keys(urls.read_url(value))
    return keys or None


@dataclass(frozen=True, slots=True)
class Dest:
    """One destination found in an argument value."""

    kind: str  # email | url | host | channel | user | phone | iban | opaque
    key: str  # "kind:value"; what approvals and trust lists compare
    keys: tuple[str, ...]  # every key to look up in the output index
    domain: str | None = None  # for emails and URLs
    sigil: str = ""  # for names: "#" or "@" when written with one

    @property
    def value(self) -> str:
        return self.key.split(":", 1)[1]


def _email(addr: str) -> Dest | None:
    """One address, canonical (addresses.read_address): every spelling of a
    mailbox is one key. A quoted local part an atom cannot spell is opaque:
    asked, never trusted, and denied if any look-alike was seen."""
    a = addresses.read_address(addr)
    if a is None:
        return None
    return Dest("opaque" if a.special else "email", a.key, a.keys, a.domain)


def _opaque(s: str, extra: tuple[str, ...] | list[str] = (), domain: str | None = None) -> Dest:
    folded = s.casefold()
    return Dest("opaque", f"opaque:{folded}", (*extra, f"token:{folded}"), domain)


def _url_dests(raw: str) -> list[Dest]:
    """A URL read raw by both readers. Unambiguous: keyed by its canonical
    form and WHATWG host. Ambiguous (the readers disagree, or no host): opaque,
    never trusted, denied if any reading's host was seen in output.

    An ambiguous URL comes back once for every host some client may connect
    to (each reader's, and the authority as a lenient client cuts it: httpx,
    aiohttp and urllib fetch ``https://evil.example:+443/`` from
    ``evil.example``, which neither reader accepts), each with that host as
    its ``domain``: a recipient-domain rule or a denied destination judges
    every one of them, not only the WHATWG reading."""
    u = urls.read_url(raw)
    keys = _read_keys(u)
    if not u.ambiguous and u.canonical is not None:
        return [Dest("url", keys[0], tuple(keys), u.host)]
    hosts = list(u.hosts())
    for h in urls.loose_hosts(raw):
        if h not in hosts:
            hosts.append(h)
            keys.append(f"host:{h}")
    if not hosts:
        return [_opaque(raw, keys)]
    return [_opaque(raw, keys, h) for h in hosts]


def _decoded_urls(s: str) -> list[Dest]:
    # "://" that only decoding produced (https%3A%2F%2F..., fullwidth colons):
    # no client reads the raw text as this URL, so it is placed by nobody; a
    # server that decodes it would fetch from its hosts, which domain rules judge.
    keys: list[str] = []
    domains: list[str] = []
    for d in _url_dests(s):
        keys.extend(k for k in d.keys if k not in keys)
        if d.domain is not None and d.domain not in domains:
            domains.append(d.domain)
    keys = [k for k in keys if not k.startswith("token:")]
    if not domains:
        return [_opaque(s, keys)]
    return [_opaque(s, keys, h) for h in domains]


# A scheme and ":" followed by "/" or "\", or a special scheme and ":": a URL
# as WHATWG may read it (tabs and newlines inside are ignored, as WHATWG does).
_URLISH = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:[\t\r\n]*[/\\]|(?i:(?:https?|wss?|ftp)[\t\r\n]*:)")


def _urlish(s: str) -> bool:
    return _URLISH.search(s.translate(_TAB_NL) if "\t" in s or "\n" in s or "\r" in s else s) is not None


_URL_BODY = re.compile(r"[^\s<>\"'`]+")
_TAB_NL = str.maketrans("", "", "\t\n\r")


def parse(raw: str) -> list[Dest]:
    """Every destination in one argument string; never empty for a non-empty string.

    What cannot be placed (an assembled, encoded or malformed value) comes back
    as an ``opaque`` destination, which the provenance check sends to a human.
    A string that holds a URL is split and read raw; anything else is read
    after _clean (decoded), since addresses are compared decoded.
    """
    s0 = raw.strip()
    if not s0:
        return []
    if s0[:7].lower() != "mailto:" and _urlish(s0):
        return _parse_raw(s0)
    return _parse_decoded(raw)


def _parse_raw(s: str) -> list[Dest]:
    if urls.looks_like_url(s) and _URL_BODY.fullmatch(s.translate(_TAB_NL)):
        return _url_dests(s)
    out: list[Dest] = []
    rest = s
    if "<" in s:  # "Name <addr>, Other <https://...>"
        for inner in _BRACKETS.findall(s):
            out.extend(_raw_piece(inner))
        rest = _BRACKETS.sub(" ", s)
        for part in _LIST_SEP.split(rest):
            part = part.strip().strip('"')
            if "@" in part or _urlish(part):
                out.extend(_raw_piece(part))
        return out or [_opaque(s)]
    for part in _LIST_SPLIT.split(rest):
        out.extend(_raw_piece(part))
    return out or [_opaque(s)]


def _raw_piece(p: str) -> list[Dest]:
    p = p.strip()
    if not p:
        return []
    if urls.looks_like_url(p):
        return _url_dests(p)
    return _parse_decoded(p)


def _parse_decoded(raw: str) -> list[Dest]:
    # Recursion stays here: a URL that appears only after decoding is never
    # read as a URL a client would fetch (see _decoded_urls).
    s = _clean(raw)
    if not s:
        # "%20", "%0C": something that decodes to nothing is still asked about
        return [_opaque(raw.strip())] if raw.strip() else []
    if s[:7].lower() == "mailto:":
        body, _, query = s[7:].partition("?")
        pieces = [p for p in _LIST_SEP.split(body) if p.strip()]
        pieces += [v for k, v in parse_qsl(query) if k.lower() in ("to", "cc", "bcc")]
        out: list[Dest] = []
        for p in pieces:
            out.extend(_parse_decoded(p))
        return out or [_opaque(s)]
    if "://" in s and _URL_RE.fullmatch(s):
        return _decoded_urls(s)
    brackets = _BRACKETS.findall(s) if "<" in s else []
    if brackets:  # "Name <addr>, Other <addr2>"
        out = []
        for inner in brackets:
            out.extend(_parse_decoded(inner))
        rest = _BRACKETS.sub(" ", s)
        out.extend(d for part in _LIST_SEP.split(rest) for d in _parse_piece_if_address(part))
        return out or [_opaque(s)]  # "<>": nothing placeable is still something to ask about
    if "," in s or ";" in s or (" " in s and s.count("@") > 1):
        out = []
        for part in _LIST_SPLIT.split(s):
            if part:
                out.extend(_parse_decoded(part))
        return out or [_opaque(s)]
    return _parse_piece(s)


@lru_cache(maxsize=4096)
def _parse_short(raw: str) -> tuple[Dest, ...]:
    return tuple(parse(raw))


def parse_cached(raw: str) -> tuple[Dest, ...]:
    """``parse``, memoised for short values: a pure function of the string, and
    the same recipients recur from call to call. ``Dest`` is immutable."""
    if len(raw) <= 256:
        return _parse_short(raw)
    return tuple(parse(raw))


def _parse_piece_if_address(part: str) -> list[Dest]:
    # text outside angle brackets is a display name unless it is itself an address
    part = part.strip().strip('"')
    if "@" in part or "://" in part:
        return _parse_piece(part)
    return []


def _parse_piece(s: str) -> list[Dest]:
    """One decoded piece (see _parse_decoded): never a raw URL."""
    if "://" in s:
        return _decoded_urls(s)
    return [_parse_one(s)]


def _parse_one(s: str) -> Dest:
    folded = s.casefold()
    if "@" in s and not s.startswith("@"):
        d = _email(s)
        return d or _opaque(s)
    if _FULL_HOST_RE.fullmatch(folded) and not folded.replace(".", "").isdigit():
        host = _host_key(folded)
        return Dest("host", f"host:{host}", (f"host:{host}", f"token:{host}"), host)
    compact = s.replace(" ", "").upper() if len(s) <= 48 else ""
    if _IBAN_RE.fullmatch(compact):
        return Dest("iban", f"iban:{compact}", (f"iban:{compact}", f"token:{compact.casefold()}"))
    if _PHONE_RE.fullmatch(s) and sum(c.isdigit() for c in s) >= 7:
        digits = "".join(c for c in s if c.isdigit())
        return Dest("phone", f"phone:{digits}", (f"phone:{digits}",))
    if _CHANNEL_RE.fullmatch(s):
        name = folded.lstrip("#@")
        sigil = s[0] if s[0] in "#@" else ""
        return Dest("channel", f"channel:{name}", (f"token:{name}",), None, sigil)
    return Dest("opaque", f"opaque:{folded}", (f"token:{folded}",))


def iter_values(value: object) -> Iterator[str]:
    """Every string inside a (possibly nested) argument value."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, int | float) and not isinstance(v, bool):
            yield str(v)  # a numeric channel or phone id


def domain_matches(domain: str, pattern: str) -> bool:
    """Exact, case-insensitive; ``*.acme.com`` matches strict subdomains only."""
    if pattern.startswith("*."):
        return domain.endswith(pattern[1:])
    return domain == pattern


def domain_within(domain: str, pattern: str) -> bool:
    """For deny lists: the domain itself or any subdomain of it."""
    p = pattern[2:] if pattern.startswith("*.") else pattern
    return domain == p or domain.endswith("." + p)


# ------------------------------------------------------------- trust lists


@dataclass(frozen=True, slots=True)
class TrustList:
    """Destinations an operator vouches for, pre-split for O(1) lookups."""

    keys: frozenset[str]  # exact keys: email:, host:, channel:, user:, phone:, opaque:
    domains: frozenset[str]  # "acme.com": email or URL at exactly that domain
    suffixes: tuple[str, ...]  # ".acme.com": strict subdomains
    url_prefixes: tuple[str, ...]  # "url:https://hooks.example.com/services/T0/"

    def covers(self, d: Dest) -> bool:
        if d.key in self.keys:
            return True
        if d.domain is not None and d.kind in ("email", "url", "host"):
            if d.domain in self.domains:
                return True
            if any(d.domain.endswith(s) for s in self.suffixes):
                return True
        if d.kind == "url":
            # canonical forms on both sides (urls.read_url), segment-aware;
            # ambiguous URLs are opaque and never reach here
            url = d.key[4:]
            return any(urls.under_prefix(url, p[4:]) for p in self.url_prefixes)
        return False


def build_trust(entries: tuple[str, ...] | list[str]) -> TrustList:
    keys: set[str] = set()
    domains: set[str] = set()
    suffixes: list[str] = []
    prefixes: list[str] = []
    for raw in entries:
        s = raw.strip()
        if s.startswith("*."):
            suffixes.append(_host_key(s[1:]))
            continue
        if s.startswith("@") and "." in s:
            domains.add(_host_key(s[1:]))
            continue
        for d in parse(s):
            if d.kind == "opaque" and ("@" in d.value or _urlish(d.value)):
                continue  # an ambiguous URL or a special quoted address: never trusted
            if d.kind == "host":
                domains.add(d.value)
            elif d.kind == "url":
                url = d.key
                prefixes.append(url if url.endswith("/") else url + "/")
                keys.add(url)
            else:
                keys.add(d.key)
                if d.kind == "channel" and d.sigil != "#":
                    # a bare or @ name vouches for the user of that name too;
                    # a #name is a channel only
                    keys.add(f"user:{d.value}")
    return TrustList(frozenset(keys), frozenset(domains), tuple(suffixes), tuple(prefixes))


EMPTY_TRUST = TrustList(frozenset(), frozenset(), (), ())


# ------------------------------------------------------------- output index


# Phone candidates in ASCII text: digits become "0", the other characters a
# phone match may hold (the class of _PHONE_RE, and "+") become " ", the rest
# "x". A run without an "x" that holds seven zeros is the only place a phone
# key can come from; _PHONE_RE itself then runs on that run alone.
_PHONE_TABLE = bytes(
    ord("0")
    if re.fullmatch(r"\d", chr(c))
    else ord(" ")
    if chr(c) == "+" or re.fullmatch(r"[\d\s().\-]", chr(c))
    else ord("x")
    for c in range(256)
)
_PHONE_RUN = re.compile(rb"0(?: *0){6}")
# The bytes that map to " ": deleted, a run with seven digits becomes "0000000".
_PHONE_GAPS = bytes(c for c in range(256) if _PHONE_TABLE[c] == ord(" "))
# What may stand in the local part of an address (_EMAIL_RE's first class).
# A chunk holds no whitespace, so these are the only characters that end one.
_NOT_LOCAL = "@<>()[]\\,;:\"'`"


def _emails(chunk: str) -> Iterator[str]:
    """Exactly what ``_EMAIL_RE.finditer(chunk)`` yields (chunk: no whitespace), in linear time.

    A match holds one "@" and its local part is a run of local-part
    characters that ends at that "@", so a match starts at the start of that
    run (or where the previous match ended). finditer would try every position
    of a long run that no "@" ends: quadratic in the run's length (a 40 KB
    chunk took 2.5 s). Here each "@" costs one anchored match.
    """
    pos = 0
    n = len(chunk)
    while pos < n:
        at = chunk.find("@", pos)
        if at < 0:
            return
        start = pos
        for c in _NOT_LOCAL:
            i = chunk.rfind(c, start, at)
            if i >= start:
                start = i + 1
        m = _EMAIL_RE.match(chunk, start) if start < at else None
        if m is None:
            pos = at + 1
            continue
        yield m.group(0)
        pos = m.end()


def _alpha(chunk: str) -> bool:
    if len(chunk) > 256 and chunk.isascii():
        return chunk.encode("ascii").isalpha()  # a table lookup per byte: 5x faster
    return chunk.isalpha()


class DigestTable:
    """A bounded set of 64-bit digests of keys: 8 bytes a slot, at most half full.

    The output index holds a key for every destination-like token the server
    ever showed; as strings in a set that costs about 20 bytes of memory per
    byte of output. Only membership is ever asked, so a digest does: Python's
    per-process keyed string hash (SipHash, seeded at random on every start,
    so output cannot be crafted to collide). A collision can only make an
    unseen key look seen: a deny, never an allow.

    The table grows by doubling up to ``max_keys``; past that it stops adding
    and says so (``saturated``): from then on an unseen destination cannot be
    told from a seen one that was dropped, and the evaluator asks instead of
    trusting (visor/policy/evaluate.py, ``check_provenance``).
    """

    __slots__ = ("_mask", "_slots", "count", "max_keys", "saturated")

    def __init__(self, max_keys: int) -> None:
        self.max_keys = max_keys
        self.count = 0
        self.saturated = False
        self._slots = array("q", bytes(8 * 1024))
        self._mask = 1023

    def __len__(self) -> int:
        return self.count

    def __contains__(self, key: str) -> bool:
        h = hash(key) or 1
        slots, mask = self._slots, self._mask
        i = h & mask
        while True:
            v = slots[i]
            if v == h:
                return True
            if v == 0:
                return False
            i = (i + 1) & mask

    def add(self, key: str) -> None:
        h = hash(key) or 1
        slots, mask = self._slots, self._mask
        i = h & mask
        while True:
            v = slots[i]
            if v == h:
                return
            if v == 0:
                break
            i = (i + 1) & mask
        if self.count >= self.max_keys:
            self.saturated = True
            return
        slots[i] = h
        self.count += 1
        if self.count * 2 > mask:
            self._grow()

    def update(self, keys: Iterable[str]) -> None:
        for k in keys:
            self.add(k)

    def _grow(self) -> None:
        old = self._slots
        size = len(old) * 2
        slots = array("q", bytes(8 * size))
        mask = size - 1
        for h in old:
            if h:
                i = h & mask
                while slots[i]:
                    i = (i + 1) & mask
                slots[i] = h
        self._slots, self._mask = slots, mask

    @property
    def nbytes(self) -> int:
        return len(self._slots) * 8


class TracingTable(DigestTable):
    """A DigestTable that also remembers, for the first ``WHERE_CAP`` keys it
    holds, where each was first seen (``now``: tool and field). Bounded: past
    the cap a key is still held, only its place is not (the question then
    says the place was not recorded)."""

    __slots__ = ("first", "now")
    WHERE_CAP = 65_536

    def __init__(self, max_keys: int) -> None:
        super().__init__(max_keys)
        self.first: dict[int, tuple[str, str]] = {}
        self.now: tuple[str, str] = ("?", "?")

    def add(self, key: str) -> None:
        before = self.count
        super().add(key)
        if self.count != before and len(self.first) < self.WHERE_CAP:
            self.first.setdefault(hash(key) or 1, self.now)


#: Kinds of place in output a key was seen in: free text (``OutputIndex``), a
#: field the service asserts, a field a third party writes. The session keeps
#: one index of each; the group store (visor/groups/) keeps them apart.
OUTPUT, ASSERTED, ATTRIBUTED = 0, 1, 2
KINDS = (OUTPUT, ASSERTED, ATTRIBUTED)

#: Keys the output index holds at most (each 8-16 bytes): 16 MiB at the bound
#: (``settings.output_index_max_keys``).
DEFAULT_INDEX_MAX_KEYS = 1_000_000


class OutputIndex:
    """Keys of every destination-like token seen in untrusted output.

    ``add`` extracts once; ``seen`` is a handful of table lookups, so the cost
    of a check does not grow with history. Extraction is generous (emails,
    URLs, hosts, phone numbers, #/@ names and every identifier-like token)
    because a false hit costs a deny, while a miss only turns a deny into an
    ask. Keys are kept as digests in a bounded table (``DigestTable``).
    """

    __slots__ = ("_keys", "_seen_chunks", "_seen_texts", "where")

    # Chunks recur from one result to the next (field names, ids, status
    # words). The keys of a chunk depend on the chunk alone and keys are never
    # removed, so a chunk already indexed adds nothing and is skipped; so does
    # a whole short text indexed before (its phone numbers included: those
    # depend on the whole text, which is why texts and chunks are remembered
    # apart). Only short ones are remembered, and the memory is bounded.
    _SHORT = 128
    _SHORT_CAP = 32_768

    def __init__(
        self, max_keys: int = DEFAULT_INDEX_MAX_KEYS, trace: bool = False, table: TracingTable | None = None
    ) -> None:
        # ``table``: a key table made by the caller (the group's, which also
        # shares every new key with the other servers of the client: visor/groups/).
        if table is not None:
            tracing = table if trace else None
            self._keys: DigestTable | set[str] = table
        else:
            tracing = TracingTable(max_keys) if trace else None
            self._keys = tracing if tracing is not None else DigestTable(max_keys)
        self._seen_chunks: set[str] = set()
        self._seen_texts: set[str] = set()
        # With ``trace``: where each key was first seen (``TracingTable``), for
        # the text of a question; None otherwise (nothing is recorded).
        self.where: TracingTable | None = tracing

    def set_where(self, where: tuple[str, str]) -> None:
        """The (tool, field) the next ``add`` calls index; a no-op without ``trace``."""
        if self.where is not None:
            self.where.now = where

    def where_of(self, d: Dest) -> tuple[str, str] | None:
        """Where output first showed one of ``d``'s keys, if that was recorded."""
        t = self.where
        if t is None:
            return None
        for k in d.keys:
            w = t.first.get(hash(k) or 1)
            if w is not None:
                return w
        return None

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def saturated(self) -> bool:
        """The bound was reached and some key was not kept: absence proves nothing now."""
        keys = self._keys
        return isinstance(keys, DigestTable) and keys.saturated

    @property
    def nbytes(self) -> int:
        keys = self._keys
        return keys.nbytes if isinstance(keys, DigestTable) else 0

    def add(self, text: str) -> None:
        if not text or (text.isascii() and text.isalpha()):
            # nothing to decode, no digit, no separator: no key at all
            # ("content", "text", "isError", "ok" in every result)
            return
        if text in self._seen_texts:
            return  # a short text indexed before, phone numbers and all
        cleaned = _clean(text)
        variants: tuple[str, ...] = (text,) if cleaned == text.strip() else (text, cleaned)
        # Whitespace-separated chunks first (a C-speed split, each distinct
        # chunk once), then the regexes only on chunks that can hold a match.
        chunks: set[str] = set()
        for v in variants:
            chunks.update(v.split())
        grouped, loose_spelled = self._index_chunks(chunks)
        if loose_spelled or "\\" in cleaned or not cleaned.isascii():
            # An address spelled loosely (`eve @ x.example`, `\@`, `'eve'@`, JSON escapes, an
            # ideographic full stop): the text once more with it made plain.
            loose = _loosen(cleaned)
            if loose != cleaned:
                variants = (*variants, loose)
                grouped |= self._index_chunks(set(loose.split()) - chunks)[0]
        for v in variants:
            self._phones(v)
            if grouped:
                self._ibans(v)
        if len(text) <= self._SHORT:
            texts = self._seen_texts
            if len(texts) >= self._SHORT_CAP:
                texts.clear()
            texts.add(text)

    def _index_chunks(self, chunks: set[str]) -> tuple[bool, bool]:
        """Index each chunk not seen before. (Whether one looks like the head of a grouped IBAN,
        and whether one shows an address spelled loosely, which `_loosen` makes plain.)"""
        seen = self._seen_chunks
        short = self._SHORT
        chunk_keys = self._chunk
        grouped = False  # a chunk like "DE89": perhaps the head of a grouped IBAN
        loose = False
        for chunk in chunks:
            if len(chunk) == 4 and chunk[2:].isdigit() and chunk[:2].isalpha():
                grouped = True
            if not loose and "@" in chunk and _LOOSE_CHUNK.search(chunk) is not None:
                loose = True  # (before the seen short cut: the spelling spans chunks)
            if chunk in seen or _alpha(chunk):
                continue
            chunk_keys(chunk)
            if len(chunk) <= short:
                if len(seen) >= self._SHORT_CAP:
                    seen.clear()
                seen.add(chunk)
        return grouped, loose

    def _phones(self, v: str) -> None:
        keys = self._keys
        if v.isascii():
            if not any(c in v for c in "0123456789"):
                return  # ten memchr passes: cheaper than translating a digit-free text
            # C-speed passes find the runs that hold seven digits; the
            # regex runs on those runs only (the same matches: no match
            # crosses an "x", and scanning starts afresh after one).
            raw = v.encode("ascii")
            if b"0000000" not in raw.translate(_PHONE_TABLE, _PHONE_GAPS):
                return  # no run holds seven digits: one translate and one search said so
            t = raw.translate(_PHONE_TABLE)
            pos = 0
            search = _PHONE_RUN.search
            while True:
                m = search(t, pos)
                if m is None:
                    return
                start = t.rfind(b"x", 0, m.start()) + 1
                end = t.find(b"x", m.end())
                if end < 0:
                    end = len(t)
                for pm in _PHONE_RE.finditer(v, start, end):
                    digits = "".join(c for c in pm.group(0) if c.isdigit())
                    if len(digits) >= 7:
                        keys.add("phone:" + digits)
                pos = end
        elif _HAS_DIGIT.search(v):
            for pm in _PHONE_RE.finditer(v):
                digits = "".join(c for c in pm.group(0) if c.isdigit())
                if len(digits) >= 7:
                    keys.add("phone:" + digits)

    def _ibans(self, v: str) -> None:
        keys = self._keys
        for m in _IBAN_TEXT.finditer(v):
            compact = m.group(0).replace(" ", "").upper()
            for n in range(15, min(len(compact), 34) + 1):
                keys.add("iban:" + compact[:n])

    def _chunk(self, chunk: str) -> None:
        keys = self._keys
        if "://" in chunk:
            for m in _URL_RE.finditer(chunk):
                k = _url_keys(m.group(0).rstrip(".,;:!?)]}'\""))
                if k:
                    keys.update(k)
        if "@" in chunk:
            for addr in _emails(chunk):
                for spelling in _address_spellings(addr):
                    d = _email(spelling)
                    if d is not None:
                        keys.update(d.keys)
        if "." in chunk:
            for m in _HOST_RE.finditer(chunk):
                keys.add("host:" + _host_key(m.group(0)))
        if "#" in chunk or "@" in chunk:
            # "#general", "@ops-team": plain names marked as places
            for m in _TAGGED_RE.finditer(chunk):
                keys.add("token:" + m.group(1).casefold())
        for piece in _PIECE_SPLIT.split(chunk.casefold()):
            tok = piece.strip(_EDGE)
            if tok and not tok.isalpha():
                keys.add("token:" + tok)
                if "/" in tok or ":" in tok:  # "see #ops/team:" style fragments
                    for sub in _SUBTOKEN.split(tok):
                        sub = sub.strip(_EDGE)
                        if sub and not sub.isalpha():
                            keys.add("token:" + sub)

    def seen(self, d: Dest) -> bool:
        keys = self._keys
        return any(k in keys for k in d.keys)


def extract_keys(*texts: str) -> set[str]:
    """Every key ``OutputIndex.add`` would index for ``texts``, in order, as strings
    (for tests and tools: the index itself keeps only digests)."""
    idx = OutputIndex()
    keys: set[str] = set()
    idx._keys = keys
    for text in texts:
        idx.add(text)
    return keys
