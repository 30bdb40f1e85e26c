"""The redaction pre-check never says "no secret here" when a literal is in the line.

(Kept with the policy tests: these are the fast paths of the per-call checks.)
The screen searches reversed literals in the reversed line, and long lines are
first ruled out byte by byte; both must agree with a plain substring test.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from visor import redact

SETS = [
    redact.DEFAULT_REDACTOR.outputs,
    redact.DEFAULT_REDACTOR.arguments,
    redact.build_set([*redact.BUILTIN, redact._p("tok", r"TOK-[A-Z0-9]{16}", ())]),
]
LITERALS = sorted({lit for s in SETS for p in s.patterns for lit in (p.literals or ("TOK-",))})


def expected(pset: redact.PatternSet, raw: bytes) -> bool:
    lits = [lit for p in pset.patterns for lit in (p.literals or (redact.literal_prefix(p.regex),))]
    return any(lit.encode() in raw for lit in lits)


pieces = st.sampled_from([*LITERALS, "x", "xxxx", "e", "_", "-", "k", "Y", " ", '"', "A", "I", "/", ":"])
lines = st.lists(pieces, max_size=40).map("".join)


@settings(max_examples=500, deadline=None)
@given(lines, st.integers(min_value=0, max_value=6000))
def test_screen_agrees_with_substring_test(body: str, pad: int) -> None:
    for filler in ("x" * pad, "e" * pad):
        for raw in ((body + filler).encode(), (filler + body).encode()):
            for pset in SETS:
                assert pset.may_match(raw) or not expected(pset, raw)
                if not re.search(rb"\\[u/]", raw):
                    assert pset.may_match(raw) == expected(pset, raw)


def test_every_literal_is_found_in_a_long_line_at_either_end() -> None:
    for lit in LITERALS:
        for pset in SETS:
            lits = {x for p in pset.patterns for x in (p.literals or (redact.literal_prefix(p.regex),))}
            if lit not in lits:
                continue
            for raw in (("x" * 10_000 + lit).encode(), (lit + "e" * 10_000).encode(), lit.encode()):
                assert pset.may_match(raw), (lit, len(raw))
