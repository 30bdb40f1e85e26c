"""The paths fuzz target's invariants in the normal suite: its seeds, generated
inputs, and proof that the invariant catches a path reading Visor misses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz import fuzz_paths
from visor.policy import paths

SEEDS = sorted((Path(__file__).resolve().parent / "corpus" / "paths").iterdir())


def test_there_are_seeds() -> None:
    assert len(SEEDS) >= 20


@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: p.name)
def test_seeds_hold_the_invariants(seed: Path) -> None:
    assert fuzz_paths.check(seed.read_bytes()) == set()


@settings(max_examples=300, deadline=None, database=None)
@given(st.binary(min_size=1, max_size=24))
def test_generated_inputs_hold_the_invariants(data: bytes) -> None:
    assert fuzz_paths.check(data) == set()


def _lexical_only(raw: str, cwd: str | None = None, bases: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The pre-fix reading: Windows separators, lexical, then resolved; no kernel walk, no POSIX names."""
    lexical = paths.normalise(raw, cwd)
    real = os.path.realpath(lexical)
    return (lexical,) if real == lexical else (lexical, real)


@pytest.mark.parametrize(
    "tokens",
    [
        ("{sandbox}/", "link", "/", "..", "/", "a"),  # the kernel follows link before ".."
        ("{root}/", "other", "\\", "..", "\\", "sandbox", "/", "a"),  # "\" is a name on POSIX
    ],
)
def test_the_invariant_catches_a_reading_visor_misses(monkeypatch: pytest.MonkeyPatch, tokens) -> None:  # type: ignore[no-untyped-def]
    data = bytes([fuzz_paths.STARTS.index(tokens[0]), *(fuzz_paths.TOKENS.index(t) for t in tokens[1:])])
    assert fuzz_paths.check(data) == set()
    monkeypatch.setattr(paths, "forms", _lexical_only)
    with pytest.raises(AssertionError, match="a server could open"):
        fuzz_paths.check(data)


def test_a_case_variant_that_is_not_sensitive_would_be_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paths, "_builtin_sensitive", lambda p: paths._SENSITIVE_RE.fullmatch(p) is not None)
    with pytest.raises(AssertionError):
        fuzz_paths.check(bytes([0, 1, 1, 1, 1, 1]))  # .ENV... under /srv/Café
