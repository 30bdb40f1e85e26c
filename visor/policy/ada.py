"""ada, the WHATWG URL parser and UTS 46 mapping (through ``ada_url``), loaded on first use.

``ada_url`` is a cffi library: importing it maps about 2 MB that stay resident
for the life of the process. Most sessions never read a non-ASCII host or a
URL-shaped argument, so the library is imported the first time one is read,
not when the policy package is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the type only: the library itself is imported on first use
    from ada_url.ada_adapter import ParseAttributes


def idna_to_ascii(text: str) -> bytes | str:
    """UTS 46 ToASCII of ``text`` as ada computes it (raises ``ValueError`` where it refuses)."""
    import ada_url

    result: bytes | str = ada_url.idna_to_ascii(text)
    return result


def parse_url(raw: str, attributes: tuple[str, ...]) -> ParseAttributes:
    """ada's WHATWG parse of ``raw``: the named components (raises ``ValueError`` if invalid).

    Only the components asked for are copied out of the library: each is a call across
    cffi, and all thirteen cost twice what a reader of seven needs."""
    import ada_url

    return ada_url.parse_url(raw, attributes=attributes)
