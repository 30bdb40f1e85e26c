"""Go ``encoding/json``'s case folding of object member names. Pure.

A Go server matches a JSON member to a struct field case-insensitively,
with Unicode simple case folding (``ſ`` matches ``s``, the Kelvin sign
``k``). Two names that ``go_fold`` maps to the same string are the same
member to such a server; the wire rules and the policy use this to refuse
or to read such variants, never to miss them.
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=8192)
def _fold_rune(c: str) -> str:
    """The smallest code point in ``c``'s simple case-folding orbit (Go's ``foldRune``).

    Python has no simple-fold table, so the orbit is the closure of the
    single-code-point lower, upper and case-fold mappings. Where a full
    mapping is several code points (``ß`` -> ``SS``) it is not a simple
    fold and is left out, as Go leaves it out. ``tests/differential``
    checks this against a real Go binary over every code point.
    """
    orbit = {c}
    todo = [c]
    while todo:
        x = todo.pop()
        for y in (x.lower(), x.upper(), x.casefold()):
            if len(y) == 1 and y not in orbit:
                orbit.add(y)
                todo.append(y)
    return min(orbit)


# Orbits that the closure above cannot join because no Python mapping leads
# back to one of their members (``µ`` upper-cases to ``Μ``, but nothing maps
# to ``µ``). Found by the differential against a real Go binary over every
# code point (tests/differential/test_go_server.py); each maps to Go's own
# representative, the orbit's smallest code point.
_FOLD_EXCEPTIONS: dict[str, str] = {
    **dict.fromkeys("\u00b5\u039c\u03bc", "\u00b5"),
    **dict.fromkeys("\u0345\u0399\u03b9\u1fbe", "\u0345"),
    **dict.fromkeys("\u1c88\ua64a\ua64b", "\u1c88"),
}


@lru_cache(maxsize=8192)
def go_fold(name: str) -> str:
    """Go ``encoding/json``'s folded form of a member name: two names fold
    equal exactly when a Go server matches one to the other."""
    if name.isascii():
        return name.upper()
    out = []
    for c in name:
        if c.isascii():
            out.append(c.upper())
        else:
            out.append(_FOLD_EXCEPTIONS.get(c) or _fold_rune(c))
    return "".join(out)


def fold_lower(name: str) -> str:
    """A name in lower case after Go's folding, for matching against
    Visor's own lower-case vocabularies (``paTH`` and ``paᵀh`` alike)."""
    if name.isascii():
        return name.lower()
    return go_fold(name).lower()
