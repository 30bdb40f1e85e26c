"""The shell fuzz target's invariants hold on its seed corpus (no atheris needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.fuzz_shell import check

SEEDS = sorted((Path(__file__).resolve().parent / "corpus" / "shell").iterdir())


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.name)
def test_shell_seed_holds_the_invariants(path: Path) -> None:
    assert check(path.read_bytes().decode("utf-8", "replace")) == set()
