"""The seed corpus holds every invariant in the normal suite (no atheris needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz import invariants

CORPUS = Path(__file__).resolve().parent / "corpus"
WIRE = sorted((CORPUS / "wire").iterdir())
POLICY = sorted((CORPUS / "policy").iterdir())

# Open issues the seeds are expected to show (each has an xfail regression test).
EXPECTED_KNOWN = {"integer-beyond-64-bits", "unicode-line-separator"}


def test_corpus_is_there() -> None:
    assert len(WIRE) > 100 and len(POLICY) > 10


def test_wire_seeds_hold_the_invariants() -> None:
    seen: set[str] = set()
    for path in WIRE:
        seen |= invariants.check_stream(path.read_bytes())
    assert seen <= EXPECTED_KNOWN, seen


@pytest.mark.parametrize("path", POLICY, ids=lambda p: p.name)
def test_policy_seeds_load_or_raise_policy_error(path: Path) -> None:
    assert invariants.check_policy(path.read_bytes().decode("utf-8", "replace")) == set()
