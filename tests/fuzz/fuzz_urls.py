"""atheris target: the URL reader (visor/policy/urls.py) on arbitrary bytes.

Run through `python -m tests.fuzz.run` (FUZZ_TARGETS=urls), or by hand:
    python -m tests.fuzz.fuzz_urls WORK_CORPUS tests/fuzz/corpus/urls -max_total_time=60
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["visor"]):
    from tests.fuzz import destination_invariants, invariants


def test_one_input(data: bytes) -> None:
    invariants.record_known(destination_invariants.check_url(data), data)


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
