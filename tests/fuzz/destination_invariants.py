"""Invariants of the URL and address readers (visor/policy/urls.py and
addresses.py), shared by the atheris targets fuzz_urls/fuzz_addresses, the
hypothesis fallback driver and tests/fuzz/test_destination_fuzz_seeds.py.

A broken invariant raises InvariantViolation. Both checks return the set of
known open issue ids (none today), like invariants.check_stream.
"""

from __future__ import annotations

from tests.fuzz.invariants import InvariantViolation
from visor.policy import addresses, destinations, urls


def _fail(message: str, value: str) -> InvariantViolation:
    return InvariantViolation(f"{message}: {value!r}")


def check_url(data: bytes) -> set[str]:
    """Never raises; canonical forms are fixed points; a URL not marked
    ambiguous has one host to both readers; parse() and the trust list never
    trust an ambiguous URL."""
    raw = data.decode("utf-8", "replace")
    u = urls.read_url(raw)
    if not u.ambiguous:
        if u.whatwg is None or u.rfc3986 is None or u.canonical is None:
            raise _fail("unambiguous without both readings", raw)
        if u.whatwg.host != u.rfc3986.host or u.whatwg.host == "":
            raise _fail(f"unambiguous with hosts {u.whatwg.host!r} / {u.rfc3986.host!r}", raw)
        again = urls.read_url(u.canonical)
        if again.ambiguous or again.canonical != u.canonical:
            raise _fail(f"canonical form {u.canonical!r} reads as {again.canonical!r} ({again.reason})", raw)
        if not urls.under_prefix(u.canonical, u.canonical):
            raise _fail("a URL is not under its own prefix", raw)
    if u.path and urls.canonical_path(u.path) != u.path:
        raise _fail("canonical_path is not idempotent", raw)
    dests = destinations.parse(raw)
    if raw.strip() and not dests:
        raise _fail("parse found nothing in a non-empty string", raw)
    if u.ambiguous and urls.looks_like_url(raw) and raw.strip() == raw and " " not in raw:
        trust = destinations.build_trust([raw])
        if any(trust.covers(d) for d in dests if d.kind == "opaque" and urls.looks_like_url(d.value)):
            raise _fail("an ambiguous URL is trusted by listing it", raw)
    destinations.OutputIndex().add(raw)
    return set()


# The transformations that must not change a mailbox's key.
def _variants(local: str, domain: str) -> list[str]:
    out = [
        f'"{local}"@{domain}',
        f"{local}@{domain}.",
        f"{local.upper()}@{domain.upper()}",
        f"{local}(c)@{domain}",
        f"Name <{local}@{domain}>",
    ]
    try:
        puny = domain.encode("idna").decode("ascii")
    except UnicodeError:
        puny = None
    if puny is not None and puny != domain:
        out.append(f"{local}@{puny}")
    return out


def check_address(data: bytes) -> set[str]:
    """Never raises; keys are fixed points; a known respelling of a plain
    address maps to the same key, in call arguments and in indexed output."""
    raw = data.decode("utf-8", "replace")
    a = addresses.read_address(raw)
    destinations.parse(raw)
    destinations.OutputIndex().add(raw)
    if a is None:
        return set()
    if not a.special:
        again = addresses.read_address(a.key[len("email:") :])
        if again is None or again.key != a.key:
            raise _fail(f"key {a.key!r} reads as {again.key if again else None!r}", raw)
        if (
            a.domain.startswith("[")
            or not addresses._is_dot_atom(a.local)
            or "%" in a.local
            or len(a.local) > 64
        ):
            # literals and odd local parts have no respellings to check; "%" is
            # percent-decoded in arguments (destinations._clean), so it is no
            # plain spelling either; a local part over 64 characters (RFC
            # 5321's limit) is not respelled
            return set()
        for v in _variants(a.local, a.domain):
            keys = {k for d in destinations.parse(v) for k in d.keys}
            if a.key not in keys:
                raise _fail(f"variant {v!r} of {a.key!r} has keys {sorted(keys)}", raw)
            idx = destinations.OutputIndex()
            idx.add(f"reply to {v} today")
            if not any(idx.seen(d) for d in destinations.parse(a.key[len("email:") :])):
                raise _fail(f"variant {v!r} in output does not mark {a.key!r} as seen", raw)
    return set()
