"""Canonical e-mail addresses, so that every spelling of one mailbox is one key.

Provenance denies a destination that untrusted output showed. If a spelling
of that address reads as a *different* key, the deny becomes an ask whose text
tells the human the address never appeared in output: ``"eve"@x.example``,
``eve@x.example.``, ``EVE@X.EXAMPLE``, ``eve@xn--caf-dma.example`` versus
``eve@café.example``, ``eve(comment)@x.example`` all deliver to one mailbox.
``read_address`` folds them into one key (RFC 5321/5322 syntax, UTS 46 for
the domain, as mail software and WHATWG do).

A quoted local part that holds more than a plain atom (``"eve bob"``,
``"eve@evil.example"``) names a mailbox that mail software may read in more
than one way, so it is flagged ``special``: the caller treats it as opaque
(asked, never trusted) and its keys include every look-alike (the text without
quotes and spaces, an address inside the quotes) so it is never easier to send
to than any of them. Pure functions; linear in the length of the input.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from visor.policy import ada

# RFC 5322 atext: what an unquoted local part may hold besides "." (and any
# non-ASCII character: RFC 6531 addresses).
_ATEXT = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+-/=?^_`{|}~")
# What Visor has always accepted in an unquoted local part (the first class of
# destinations._EMAIL_RE): kept so that ordinary addresses read as before.
_LOCAL_RE = re.compile(r"[^\s@<>()\[\]\\,;:\"'`]+")
# A domain after UTS 46: letter-digit-hyphen labels (underscore tolerated, as
# resolvers tolerate it), at least two labels, the last not all digits.
_DOMAIN_RE = re.compile(r"(?:[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\.)+[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
# Quotes, comments, literals, escapes and folding white space: none of them in the common address.
_SIMPLE_SPECIAL_RE = re.compile(r'["()\[\]\\ \t\r\n]')
_MAX_DEPTH = 8  # nested comments deeper than this are not an address


@dataclass(frozen=True, slots=True)
class Address:
    """One mailbox. ``key`` is what trust lists and approvals compare;
    ``keys`` is every key the output index must be asked about."""

    local: str  # case-folded; unquoted when the quotes carried nothing
    domain: str  # ASCII (punycode), lower case, no trailing dot; "[1.2.3.4]" for literals
    special: bool  # a quoted local part with characters an atom cannot hold
    key: str
    keys: tuple[str, ...]


@lru_cache(maxsize=8192)
def domain_key(host: str) -> str:
    """A host or mail domain as one key: lower case, one trailing dot dropped,
    unicode labels in their punycode (xn--) form by UTS 46 (what WHATWG and
    browsers do), so ``café.example`` and ``xn--caf-dma.example`` are one key.
    Lenient: what UTS 46 refuses comes back case-folded, never raises."""
    h = host.strip()
    if h.endswith(".") and not h.endswith(".."):
        h = h[:-1]
    if h.isascii():
        return h.lower()
    lead = "." if h.startswith(".") else ""  # "*.suffix" entries arrive as ".suffix"
    try:
        out = ada.idna_to_ascii(h[len(lead) :])
    except (ValueError, UnicodeError):
        out = b""
    text = out.decode("ascii", "replace") if isinstance(out, bytes) else str(out)
    if not text:
        return h.casefold()
    return lead + text.lower()


def _literal(inner: str) -> str | None:
    """``[1.2.3.4]`` and ``[IPv6:...]`` (RFC 5321 section 4.1.3), canonical; else None."""
    try:
        if inner[:5].lower() == "ipv6:":
            return f"[ipv6:{ipaddress.IPv6Address(inner[5:]).compressed}]"
        return f"[{ipaddress.IPv4Address(inner)}]"
    except ValueError:
        return None


def _domain(raw: str) -> str | None:
    d = raw.strip()
    if d.startswith("[") and d.endswith("]"):
        return _literal(d[1:-1].strip())
    key = domain_key(d)
    return key if _DOMAIN_RE.fullmatch(key) and not key.rsplit(".", 1)[1].isdigit() else None


def _is_dot_atom(s: str) -> bool:
    if not s or s[0] == "." or s[-1] == "." or ".." in s:
        return False
    return all(c in _ATEXT or c == "." or not c.isascii() for c in s)


def _scan(s: str) -> tuple[list[tuple[str, bool]], list[tuple[str, bool]]] | None:
    """Split ``s`` at its one unquoted, uncommented "@" into local and domain
    pieces: (text, was_quoted). Comments and whitespace outside quotes are
    dropped (RFC 5322 CFWS). One pass; None when it is not one address."""
    local: list[tuple[str, bool]] = []
    domain: list[tuple[str, bool]] = []
    cur = local
    buf: list[str] = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == '"':
            if buf:
                cur.append(("".join(buf), False))
                buf = []
            j = i + 1
            q: list[str] = []
            while j < n and s[j] != '"':
                if s[j] == "\\" and j + 1 < n:
                    j += 1
                q.append(s[j])
                j += 1
            if j >= n:
                return None  # unterminated quote
            cur.append(("".join(q), True))
            i = j + 1
        elif c == "(":
            depth = 0
            while i < n:
                if s[i] == "\\":
                    i += 2
                    continue
                if s[i] == "(":
                    depth += 1
                    if depth > _MAX_DEPTH:
                        return None
                elif s[i] == ")":
                    depth -= 1
                    if depth == 0:
                        break
                i += 1
            if depth != 0:
                return None
            i += 1
        elif c in " \t\r\n":
            i += 1
        elif c == "@":
            if cur is domain:
                return None  # a second unquoted "@"
            if buf:
                cur.append(("".join(buf), False))
                buf = []
            cur = domain
            i += 1
        else:
            buf.append(c)
            i += 1
    if buf:
        cur.append(("".join(buf), False))
    if cur is not domain:
        return None
    return local, domain


def _fold(local: str) -> str:
    folded = local.casefold()
    return folded if folded.isascii() else unicodedata.normalize("NFKC", folded)


def _finish(local: str, domain: str, special: bool, extra: tuple[str, ...] = ()) -> Address:
    if special:
        esc = local.replace("\\", "\\\\").replace('"', '\\"')
        key = f'email:"{esc}"@{domain}'
    else:
        key = f"email:{local}@{domain}"
    keys = [key]
    if "+" in local and not special:  # sub-addressing delivers to the same mailbox
        keys.append(f"email:{local.split('+', 1)[0]}@{domain}")
    if domain.startswith("["):
        # an IP literal: output that showed the address shows the IP
        keys.append("token:" + domain[1:-1].removeprefix("ipv6:"))
    keys.extend(k for k in extra if k not in keys)
    return Address(local, domain, special, key, tuple(keys))


@lru_cache(maxsize=8192)
def read_address(raw: str) -> Address | None:
    """The canonical mailbox ``raw`` names, or None when it is not one address.

    Accepts what mail software accepts for one mailbox: quoted local parts,
    comments, folding whitespace, a trailing dot on the domain, unicode or
    punycode domains, ``[1.2.3.4]`` literals. Display names and ``mailto:``
    are the caller's business (destinations.parse strips them first).
    """
    s = raw.strip()
    if not s.isascii():
        # compatibility forms (fullwidth, modifier letters) are one mailbox
        # to a lenient mailer: NFKC, as destinations._clean applies to text
        s = unicodedata.normalize("NFKC", s)
    if s.isascii() and _SIMPLE_SPECIAL_RE.search(s) is None:
        # the common case: one "@", no quotes, comments or literals
        if s.count("@") != 1:
            return None
        lo, _, do = s.partition("@")
        if not _LOCAL_RE.fullmatch(lo):
            return None
        dom = _domain(do)
        return None if dom is None else _finish(_fold(lo), dom, False)
    parts = _scan(s)
    if parts is None:
        return None
    local_parts, domain_parts = parts
    if not local_parts or not domain_parts or any(q for _, q in domain_parts):
        return None
    dom_text = "".join(t for t, _ in domain_parts)
    dom = _domain(dom_text)
    if dom is None:
        return None
    text = "".join(t for t, _ in local_parts)
    quoted = any(q for _, q in local_parts)
    if not quoted:
        if not _LOCAL_RE.fullmatch(text):
            return None
        return _finish(_fold(text), dom, False)
    folded = _fold(text)
    if _is_dot_atom(text) and _LOCAL_RE.fullmatch(text):
        return _finish(folded, dom, False)  # "eve"@x is eve@x
    # A quoted local part an atom cannot spell. Keyed as itself, plus every
    # look-alike a lenient mailer might deliver to instead.
    extra: list[str] = []
    squeezed = "".join(c for c in folded if not c.isspace() and c not in '"\\')
    if squeezed and _LOCAL_RE.fullmatch(squeezed):
        extra.append(f"email:{squeezed}@{dom}")
        if "+" in squeezed:
            extra.append(f"email:{squeezed.split('+', 1)[0]}@{dom}")
    if "@" in folded:  # "eve@evil.example"@relay: source-routed to the inner address
        inner = read_address(folded.replace('"', ""))
        if inner is not None:
            extra.extend(inner.keys)
    return _finish(folded, dom, True, tuple(extra))
