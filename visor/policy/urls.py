"""Reading a URL the way the clients that fetch it do.

A destination check is only as good as its agreement with the program that
will act on the URL. Visor used to percent-decode and tidy a URL before
parsing it, so ``https://trusted.example%2F@evil.example/`` was judged by a
host (``trusted.example``) that no client would ever connect to. Here a URL is
read twice, raw, by two real parsers:

* the WHATWG URL standard (browsers, Node, Deno, most JavaScript MCP servers),
  through ``ada-url``, the C++ parser Node itself uses: it strips tabs and
  newlines, treats ``\\`` as ``/`` in special schemes, resolves ``%2e%2e``
  segments, applies UTS 46 to hosts and canonicalises IPv4 forms;
* RFC 3986 as Python's ``urllib.parse`` reads it (servers written in Python
  fetch with httpx, requests or urllib, which all split on that reading).

When the two disagree on scheme, host, port or whether there is userinfo, or
the URL is not absolute, the URL is *ambiguous*: Visor cannot know which
reading the fetching program will use, so it is never trusted and never
allowed silently (the caller makes it an ``opaque`` destination). Otherwise the
WHATWG reading is the one keyed, in a canonical form that trust prefixes and
taint globs are compared on. Pure functions; nothing here does I/O.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import unquote, urlsplit

from visor.policy import ada

# WHATWG "special" schemes: their URLs always have a host and treat "\" as "/".
SPECIAL_SCHEMES: frozenset[str] = frozenset({"http", "https", "ws", "wss", "ftp", "file"})
DEFAULT_PORTS: dict[str, int] = {"http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": 21}

# What WHATWG removes before parsing: leading/trailing C0 controls and spaces,
# and every tab and newline anywhere. Used only to decide whether a string is
# URL-shaped; the parsers themselves always get the raw text.
_C0_SPACE = "".join(chr(c) for c in range(0x21))
_TAB_NL = str.maketrans("", "", "\t\n\r")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
# Percent-escapes: unreserved characters (RFC 3986 section 2.3) decode to
# themselves without changing the meaning of a path; everything else (%2F,
# %40, %5C, %25, ...) must stay encoded or the path changes.
# A bare "%" (no two hex digits after it) becomes "%25": otherwise decoding
# "%%36" would make a new escape "%6..." and the form would not be a fixed point.
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})?")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


@dataclass(frozen=True, slots=True)
class Reading:
    """One parser's view of the parts that decide where a request goes."""

    scheme: str  # lower case, no ":"
    host: str  # canonical: lower case, punycode, no trailing dot; IPv6 in brackets
    port: int | None  # None for the scheme's default port
    userinfo: bool  # the URL carries user[:password]@


@dataclass(frozen=True, slots=True)
class UrlRead:
    """A URL as Visor keys it. ``ambiguous`` URLs must never be trusted."""

    raw: str
    ambiguous: bool
    reason: str  # why it is ambiguous; "" when it is not
    whatwg: Reading | None  # None when WHATWG cannot parse it
    rfc3986: Reading | None  # None when urllib cannot parse it
    canonical: str | None  # scheme://[user@]host[:port]/path[?query]; None when ambiguous
    path: str  # canonical path (see canonical_path); "" when WHATWG cannot parse it
    decoded_path: str  # the path fully percent-decoded, "\" as "/", dot segments removed

    @property
    def host(self) -> str | None:
        """The host a WHATWG client connects to (None without one)."""
        return self.whatwg.host if self.whatwg is not None and self.whatwg.host else None

    def hosts(self) -> tuple[str, ...]:
        """Every host any reading names: what output provenance must look up."""
        out: list[str] = []
        for r in (self.whatwg, self.rfc3986):
            if r is not None and r.host and r.host not in out:
                out.append(r.host)
        return tuple(out)


def looks_like_url(s: str) -> bool:
    """Would a WHATWG client read ``s`` as an absolute URL with an authority?

    True for ``scheme://...``, for ``scheme:\\\\...`` and ``http:host`` in the
    special schemes (WHATWG reads both as ``scheme://host``), with tabs and
    newlines anywhere ignored, as WHATWG ignores them.
    """
    t = s.strip(_C0_SPACE).translate(_TAB_NL)
    m = _SCHEME.match(t)
    if m is None:
        return False
    scheme = m.group(0)[:-1].lower()
    rest = t[m.end() :]
    if scheme in SPECIAL_SCHEMES:
        return scheme != "file" or rest[:2] in ("//", "\\\\", "/\\", "\\/")
    return rest.startswith("//")


def _strip_dot(host: str) -> str:
    # "example.com." and "example.com" are the same DNS name and the same destination.
    return host[:-1] if host.endswith(".") and not host.endswith("..") else host


@lru_cache(maxsize=1024)
def _punycode_ok(label: str) -> bool:
    """Is an ``xn--`` label valid punycode that UTS 46 maps back to itself?

    Newer ada releases accept ``xn--zz``; Node's (and the standard's
    CheckHyphens/validity rules) refuse it. Where WHATWG parsers disagree
    with each other, Visor takes the URL as unreadable."""
    try:
        decoded = label[4:].encode("ascii").decode("punycode")
    except (UnicodeError, ValueError):
        return False
    if not decoded or decoded.isascii():
        return False
    try:
        again = ada.idna_to_ascii(decoded)
    except (ValueError, UnicodeError):
        return False
    return (again.decode("ascii", "replace") if isinstance(again, bytes) else str(again)) == label


# The components `_whatwg` reads.
_WHATWG_PARTS = ("protocol", "hostname", "port", "username", "password", "pathname", "search")


def _whatwg(raw: str) -> tuple[Reading, str, str] | None:
    try:
        parts = ada.parse_url(raw, _WHATWG_PARTS)
    except ValueError:
        return None
    scheme = parts["protocol"][:-1].lower()
    if "xn--" in parts["hostname"] and not all(
        _punycode_ok(label) for label in parts["hostname"].split(".") if label.startswith("xn--")
    ):
        return None
    host = _strip_dot(parts["hostname"])
    if scheme not in SPECIAL_SCHEMES:
        # Opaque hosts keep their case in WHATWG; DNS does not care.
        host = host.lower()
    port = int(parts["port"]) if parts["port"] else None
    if port is not None and DEFAULT_PORTS.get(scheme) == port:
        port = None
    userinfo = bool(parts["username"] or parts["password"])
    return Reading(scheme, host, port, userinfo), parts["pathname"], parts["search"]


def _python_host(host: str) -> str | None:
    """A host as Python clients resolve it: IDNA 2003 (http.client, urllib),
    IPv6 compressed. None when Python could not encode it at all."""
    host = _strip_dot(host.lower())
    if ":" in host:
        try:
            return f"[{ipaddress.IPv6Address(host).compressed}]"
        except ValueError:
            return None
    if host.isascii():
        return host
    try:
        return _strip_dot(host.encode("idna").decode("ascii"))
    except UnicodeError:
        return None


def _rfc3986(raw: str) -> Reading | None:
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if not scheme:
        return None
    host = _python_host(parts.hostname or "")
    if host is None:
        return None
    if port is not None and DEFAULT_PORTS.get(scheme) == port:
        port = None
    return Reading(scheme, host, port, "@" in parts.netloc)


# Where an authority ends to any client: a path, query or fragment ("\\" is
# a path to WHATWG, and never part of a host a client resolves).
_AUTHORITY_END = re.compile(r"[/\\?#]")


def _loose_host(text: str) -> str | None:
    """A host as a lenient client resolves it: percent-decoded, lower case,
    no trailing dot, unicode by UTS 46 (else IDNA 2003). None if empty."""
    h = _strip_dot(unquote(text).strip().lower())
    if not h:
        return None
    if h.isascii():
        return h
    for encode in (ada.idna_to_ascii, lambda t: t.encode("idna")):
        try:
            out = encode(h)
        except (ValueError, UnicodeError):
            continue
        text_out = out.decode("ascii", "replace") if isinstance(out, bytes) else str(out)
        if text_out:
            return _strip_dot(text_out.lower())
    return h


@lru_cache(maxsize=1024)
def loose_hosts(raw: str) -> tuple[str, ...]:
    """Every host a lenient client may connect to for ``raw``, read by cutting
    its authority by hand: what a client that validates less than WHATWG and
    urllib do (httpx, aiohttp and urllib.request take ``host:+443``,
    ``host:44_3`` and ``host:-0`` as ``host``) still fetches from. For URLs
    the two readers do not agree on, so that what no reader can place is
    still judged by its host. Empty when there is no authority."""
    t = raw.strip(_C0_SPACE).translate(_TAB_NL)
    m = _SCHEME.match(t)
    if m is None:
        return ()
    auth = _AUTHORITY_END.split(t[m.end() :].lstrip("/\\"), 1)[0]
    out: list[str] = []
    # userinfo ends at the last "@" (WHATWG, urllib) or at the first (a naive split)
    for cut in (auth.rpartition("@")[2], auth.partition("@")[2] or auth):
        if cut.startswith("["):
            end = cut.find("]")
            host = _python_host(cut[1:end]) if end > 0 else None
        else:
            host = _loose_host(cut.partition(":")[0])
        if host and host not in out:
            out.append(host)
    return tuple(out)


def _decode_unreserved(m: re.Match[str]) -> str:
    if m.group(1) is None:
        return "%25"
    c = chr(int(m.group(1), 16))
    return c if c in _UNRESERVED else "%" + m.group(1).upper()


def remove_dot_segments(path: str) -> str:
    """RFC 3986 section 5.2.4, on "/"-separated segments."""
    if "." not in path:
        return path
    out: list[str] = []
    segments = path.split("/")
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg == ".":
            if last:
                out.append("")
        elif seg == "..":
            if len(out) > 1:
                out.pop()
            if last:
                out.append("")
        else:
            out.append(seg)
    result = "/".join(out)
    if path.startswith("/") and not result.startswith("/"):
        result = "/" + result
    return result


def canonical_path(pathname: str) -> str:
    """A WHATWG pathname made comparable: escapes of unreserved characters
    decoded (``%7E`` is ``~``), every other escape kept with upper-case hex
    (``%2f`` is ``%2F``: an encoded slash is not a separator), dot segments
    removed (WHATWG has already removed them; repeated so the form is
    idempotent), empty path as "/"."""
    path = _ESCAPE.sub(_decode_unreserved, pathname) if "%" in pathname else pathname
    return remove_dot_segments(path) or "/"


def decoded_path(pathname: str) -> str:
    """The most generous reading of a path: what a server that percent-decodes
    (repeatedly), treats "\\" as "/" and then resolves dot segments would
    serve. Used where the strictest reading wins (taints, trust prefixes)."""
    s = pathname
    for _ in range(3):  # nested encoding, bounded
        t = unquote(s)
        if t == s:
            break
        s = t
    return remove_dot_segments(s.replace("\\", "/")) or "/"


def _ambiguous(raw: str, reason: str, w: Reading | None, r: Reading | None, pathname: str = "") -> UrlRead:
    if not pathname:
        return UrlRead(raw, True, reason, w, r, None, "", "")
    return UrlRead(raw, True, reason, w, r, None, canonical_path(pathname), decoded_path(pathname))


@lru_cache(maxsize=4096)
def read_url(raw: str) -> UrlRead:
    """Both readings of ``raw`` (taken as given: never decoded first), and the
    canonical form when they agree. Never raises."""
    got = _whatwg(raw)
    r = _rfc3986(raw)
    if got is None:
        return _ambiguous(raw, "not an absolute URL to a WHATWG parser", None, r)
    w, pathname, search = got
    if r is None:
        return _ambiguous(raw, "Python's urllib cannot read it", w, None, pathname)
    if w.scheme != r.scheme:
        return _ambiguous(raw, f"scheme {w.scheme!r} or {r.scheme!r}", w, r, pathname)
    if w.host != r.host:
        return _ambiguous(raw, f"host {w.host!r} or {r.host!r}", w, r, pathname)
    if w.port != r.port:
        return _ambiguous(raw, f"port {w.port} or {r.port}", w, r, pathname)
    if w.userinfo != r.userinfo:
        return _ambiguous(raw, "userinfo to one reader, not to the other", w, r, pathname)
    if not w.host:
        return _ambiguous(raw, "no host", w, r, pathname)
    netloc = w.host if w.port is None else f"{w.host}:{w.port}"
    if w.userinfo:
        # Kept (as "user@", never the secret) so the canonical URL differs from
        # the plain one: a URL-prefix trust entry does not cover a URL that
        # smuggles credentials or look-alike text before the real host.
        netloc = "user@" + netloc
    path = canonical_path(pathname)
    query = _ESCAPE.sub(_decode_unreserved, search) if "%" in search else search
    canonical = f"{w.scheme}://{netloc}{path}{query}"
    return UrlRead(raw, False, "", w, r, canonical, path, decoded_path(pathname))


def canonical(raw: str) -> str | None:
    """The canonical form of an unambiguous URL, else None."""
    return read_url(raw).canonical


def _split_prefix(url: str) -> tuple[str, str]:
    # "https://h/p?q" -> ("https://h", "/p?q"); the authority of a canonical
    # URL never holds "/" (WHATWG percent-encodes it in userinfo).
    i = url.find("/", url.find("://") + 3)
    return (url, "/") if i < 0 else (url[:i], url[i:])


def under_prefix(url: str, prefix: str) -> bool:
    """Is the canonical URL ``url`` inside the trusted canonical prefix ``prefix``?

    Segment-aware: ``https://h/ok/`` covers ``https://h/ok``, ``https://h/ok/x``
    and ``https://h/ok/x?y``, never ``https://h/okay``, nor ``https://h/ok/../x``
    (canonicalisation removed the dots), nor ``https://h/ok/..%2Fx`` (the path
    as a decoding server reads it must be inside too). Only canonical forms
    of unambiguous URLs reach here.
    """
    p_origin, p_path = _split_prefix(prefix)
    origin, rest = _split_prefix(url)
    if origin != p_origin:
        return False
    path = rest.split("?", 1)[0]
    p_dir = p_path.split("?", 1)[0]
    # each reading of the path against the same reading of the prefix
    for candidate, base in ((path, p_dir), (decoded_path(path), decoded_path(p_dir))):
        c = candidate if candidate.endswith("/") else candidate + "/"
        b = base if base.endswith("/") else base + "/"
        if not c.startswith(b):
            return False
    if "?" in p_path:  # a prefix with a query: the whole URL must start with it
        return url.startswith(prefix)
    return True
