"""The bench's scratch folder, made in the working directory.

The durable rows time the audit log's fsync, so the log must sit on the disk the user
runs the bench from, not in a temporary folder that may be memory (tmpfs), where fsync
costs nothing.
"""

from __future__ import annotations

import os
import tempfile


class ScratchError(Exception):
    """No scratch folder can be made where the bench runs; the message says what to do."""


def scratch_folder(prefix: str) -> tempfile.TemporaryDirectory[str]:
    """A temporary folder in the working directory, removed when its context ends."""
    here = os.getcwd()
    try:
        return tempfile.TemporaryDirectory(prefix=prefix, dir=here)
    except OSError as exc:
        raise ScratchError(
            f"cannot make a scratch folder in the working directory {here} ({exc.strerror or exc}); "
            "the bench times the audit log's fsync on the disk it runs from: run it from a folder you can write"
        ) from exc
