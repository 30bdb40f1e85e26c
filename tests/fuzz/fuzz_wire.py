"""atheris target: framer plus validator on arbitrary bytes.

Run through `python -m tests.fuzz.run`, or by hand:
    python -m tests.fuzz.fuzz_wire WORK_CORPUS tests/fuzz/corpus/wire -max_total_time=60
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["visor"]):
    from tests.fuzz import invariants


def test_one_input(data: bytes) -> None:
    invariants.record_known(invariants.check_stream(data), data)


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
