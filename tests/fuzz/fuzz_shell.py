"""atheris target: the shell reader on arbitrary text.

Invariants: read_command never raises (an unreadable command is a result, not
an exception), and, when bash is installed, a command read as certain is
accepted by `bash -n` (checked on a sample of inputs to keep the target fast).

Run through `python -m tests.fuzz.run` (FUZZ_TARGETS=shell), or by hand:
    python -m tests.fuzz.fuzz_shell WORK_CORPUS tests/fuzz/corpus/shell -max_total_time=60
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zlib

try:
    import atheris
except ImportError:  # the hypothesis fallback (tests/fuzz/fallback.py) imports check() without it
    atheris = None

if atheris is not None:
    with atheris.instrument_imports(include=["visor"]):
        from visor.policy.shell import Reading, read_command
else:
    from visor.policy.shell import Reading, read_command

BASH = shutil.which("bash")
SAMPLE = 64  # one input in SAMPLE (by checksum, so reproducible) is cross-checked with bash -n


def check(text: str) -> set[str]:
    """The invariants for one input; an AssertionError is a violation. Returns
    the known open issues hit (none: the fuzz runner's interface)."""
    reading = read_command(text)
    assert isinstance(reading, Reading)
    if reading.certain and BASH and zlib.crc32(text.encode("utf-8", "surrogatepass")) % SAMPLE == 0:
        p = subprocess.run([BASH, "--norc", "--noprofile", "-n", "-c", text], capture_output=True, timeout=10)
        assert p.returncode == 0, f"read as certain, but bash -n rejects {text!r}"
    return set()


def test_one_input(data: bytes) -> None:
    check(data.decode("utf-8", "replace"))


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
