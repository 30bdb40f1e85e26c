"""atheris target: the address reader (visor/policy/addresses.py) on arbitrary bytes.

Run through `python -m tests.fuzz.run` (FUZZ_TARGETS=addresses), or by hand:
    python -m tests.fuzz.fuzz_addresses WORK_CORPUS tests/fuzz/corpus/addresses -max_total_time=60
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["visor"]):
    from tests.fuzz import destination_invariants, invariants


def test_one_input(data: bytes) -> None:
    invariants.record_known(destination_invariants.check_address(data), data)


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
