"""The URL and address fuzz invariants hold on their seed corpora and on
generated input (no atheris needed); and they can fail."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz import destination_invariants as di
from tests.fuzz.invariants import InvariantViolation

CORPUS = Path(__file__).resolve().parent / "corpus"
URL_SEEDS = sorted((CORPUS / "urls").iterdir())
ADDRESS_SEEDS = sorted((CORPUS / "addresses").iterdir())


def test_seed_corpora_are_there() -> None:
    assert len(URL_SEEDS) > 100 and len(ADDRESS_SEEDS) > 20


@pytest.mark.parametrize("path", URL_SEEDS, ids=lambda p: p.name)
def test_url_seeds_hold(path: Path) -> None:
    assert di.check_url(path.read_bytes()) == set()


@pytest.mark.parametrize("path", ADDRESS_SEEDS, ids=lambda p: p.name)
def test_address_seeds_hold(path: Path) -> None:
    assert di.check_address(path.read_bytes()) == set()


_URL_ALPHABET = "aAzZ09.-_~:/?#[]@!$&'()*+,;=%\\\t\n 2eEfF．ü"
_urlish = st.builds(
    lambda scheme, rest: scheme + rest,
    st.sampled_from(["https://", "http://", "HTTP://", "https:", "ws://", "foo://", "file://", ""]),
    st.text(alphabet=_URL_ALPHABET, max_size=40),
)


@given(_urlish)
def test_url_invariants_on_generated_urls(raw: str) -> None:
    di.check_url(raw.encode())


_ADDR_ALPHABET = 'aeEvV09.+-_"()<>@[] \\xn-é．'


@given(st.text(alphabet=_ADDR_ALPHABET, max_size=30))
def test_address_invariants_on_generated_text(raw: str) -> None:
    di.check_address(raw.encode())


@given(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=10),
    st.sampled_from(["x.example", "café.example", "bücher.example", "mx.corp.example"]),
)
def test_every_known_respelling_keeps_the_key(local: str, domain: str) -> None:
    di.check_address(f"{local}@{domain}".encode())


def test_the_invariants_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    # a reader that forgets trailing dots breaks the address invariant
    from visor.policy import addresses

    real = addresses.domain_key.__wrapped__

    def broken(host: str) -> str:
        return host.lower() if host.endswith(".") else real(host)

    monkeypatch.setattr(addresses, "domain_key", broken)
    addresses.read_address.cache_clear()
    try:
        with pytest.raises(InvariantViolation):
            di.check_address(b"eve@x.example")
    finally:
        addresses.read_address.cache_clear()
