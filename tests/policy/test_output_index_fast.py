"""The fast output indexer finds exactly the keys of the straightforward one.

``reference_keys`` is the indexer as it was before the fast paths (every
regex over every chunk, the phone regex over the whole text): any key it
finds and the fast one misses would turn a deny into an ask, so the two must
agree on every input, adversarial ones included.
"""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from visor.policy import destinations as d


def reference_keys(text: str) -> set[str]:
    keys: set[str] = set()
    if not text:
        return keys
    cleaned = d._clean(text)
    variants: tuple[str, ...] = (text,) if cleaned == text.strip() else (text, cleaned)
    if d._loosen(cleaned) != cleaned:
        variants = (*variants, d._loosen(cleaned))
    chunks: set[str] = set()
    for v in variants:
        chunks.update(v.split())
    for chunk in chunks:
        if chunk.isalpha():
            continue
        if "://" in chunk:
            for m in d._URL_RE.finditer(chunk):
                k = d._url_keys(m.group(0).rstrip(".,;:!?)]}'\""))
                if k:
                    keys.update(k)
        if "@" in chunk:
            for m in d._EMAIL_RE.finditer(chunk):
                for spelling in d._address_spellings(m.group(0)):
                    e = d._email(spelling)
                    if e is not None:
                        keys.update(e.keys)
        if "." in chunk:
            for m in d._HOST_RE.finditer(chunk):
                keys.add("host:" + d._host_key(m.group(0)))
        if "#" in chunk or "@" in chunk:
            for m in d._TAGGED_RE.finditer(chunk):
                keys.add("token:" + m.group(1).casefold())
        for piece in d._PIECE_SPLIT.split(chunk.casefold()):
            tok = piece.strip(d._EDGE)
            if tok and not tok.isalpha():
                keys.add("token:" + tok)
                if "/" in tok or ":" in tok:
                    for sub in d._SUBTOKEN.split(tok):
                        sub = sub.strip(d._EDGE)
                        if sub and not sub.isalpha():
                            keys.add("token:" + sub)
    for v in variants:
        if d._HAS_DIGIT.search(v):
            for m in d._PHONE_RE.finditer(v):
                digits = "".join(c for c in m.group(0) if c.isdigit())
                if len(digits) >= 7:
                    keys.add("phone:" + digits)
    return keys


def fast_keys(*texts: str) -> set[str]:
    return d.extract_keys(*texts)


# Characters every extractor cares about, so that random text is dense in near-misses.
ALPHABET = "ab.z0123456789 +-()@:/#?&%;,<>\"'`[]\\_=!\t\n\x1c\u00e9\u0663\u00b2\uff10"
texts = st.text(alphabet=ALPHABET, max_size=200)


@settings(max_examples=600, deadline=None)
@given(texts)
def test_fast_index_equals_reference(text: str) -> None:
    assert fast_keys(text) == reference_keys(text)


@settings(max_examples=200, deadline=None)
@given(st.lists(texts, min_size=1, max_size=6))
def test_chunk_memory_never_loses_keys(parts: list[str]) -> None:
    # indexing several outputs in one index: every output's keys are there
    want: set[str] = set()
    for p in parts:
        want |= reference_keys(p)
    assert fast_keys(*parts) == want


CASES = [
    "call +1 (555) 010-0999 or 555.010.1234 now",
    "ids 1234567 12 34 56 7 and 1-2-3-4-5-6-7-8-9-0-1-2-3-4-5-6-7-8-9",
    "x1234567x 12345678901234567890123456789012345 tail",
    'mail a@b.c/x@d.e and a@b.cx@d.e and "q"@x.example, first.last+tag@sub.example.org.',
    "see https://user:pw@host.example:8443/p?q=1#f and ftp://files.example/a.",
    "plain words only",
    "%65ve%40attacker.example &lt;eve@attacker.example&gt;",
    "\u0661\u0662\u0663\u0664\u0665\u0666\u0667 \u00e9mile@caf\u00e9.example",
    "+ 1234567",
    "++1234567",
    "(((1234567)))",
    "a@" * 50 + "b.example",
    "#general @ops-team #ops/team: leak-room",
]


def test_fixed_cases_equal_reference() -> None:
    for text in CASES:
        assert fast_keys(text) == reference_keys(text), text


def test_long_chunk_with_at_sign_is_linear() -> None:
    # finditer on such a chunk was quadratic (40 KB: seconds; 1 MiB: hours)
    for text in ("a" * 200_000 + "@", "a" * 200_000 + "@b." + "c" * 200_000, "a@" * 100_000):
        start = time.perf_counter()
        keys = fast_keys(text)
        assert time.perf_counter() - start < 2.0
        assert keys == fast_keys(text)  # deterministic
    small = "a" * 3000 + "@" + "b" * 10 + ".example"
    assert fast_keys(small) == reference_keys(small)


def test_a_chunk_seen_inside_a_longer_text_still_yields_its_own_phone_keys() -> None:
    # the phone regex splits "1 2 3 ... 555-0100-999" into 24-character
    # windows; the same number alone later must still be indexed on its own
    first = "1 2 3 4 5 6 7 8 9 0 1 2 555-0100-999"
    second = "555-0100-999"
    assert fast_keys(first, second) == reference_keys(first) | reference_keys(second)
    assert "phone:5550100999" in fast_keys(first, second)
