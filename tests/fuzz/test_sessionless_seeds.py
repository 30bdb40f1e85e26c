"""The sessionless target's seeds hold its invariants in the normal suite (no atheris needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.fuzz_sessionless import check

SEEDS = sorted((Path(__file__).resolve().parent / "corpus" / "sessionless").iterdir())


def test_there_are_seeds_of_both_kinds() -> None:
    assert {p.read_bytes()[0] % 2 for p in SEEDS} == {0, 1}


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.name)
def test_seed(path: Path) -> None:
    assert check(path.read_bytes()) == set()
