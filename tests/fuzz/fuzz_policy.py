"""atheris target: the policy loader on arbitrary text.

Any input must load or raise PolicyError; never another exception, never hang
(libFuzzer's -timeout), never run out of memory (-rss_limit_mb).
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["visor", "yaml"]):
    from tests.fuzz import invariants


def test_one_input(data: bytes) -> None:
    # A policy file is read as strict UTF-8 (load_policy refuses anything
    # else with a PolicyError); replacement keeps every input useful.
    text = data.decode("utf-8", "replace")
    invariants.record_known(invariants.check_policy(text), data)


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
