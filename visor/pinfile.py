"""The pin file: tool definitions trusted on first use, kept across restarts."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def read_pins(path: str | os.PathLike[str]) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("tools"), dict):
        raise ValueError("not a Visor pin file (no 'tools' mapping)")
    return data


def unwritable(path: str | os.PathLike[str]) -> str | None:
    """Why pins could not be saved at `path` (its folder created if need be), or None."""
    folder = Path(path).resolve().parent
    if folder.exists() and not folder.is_dir():
        return f"{folder} is not a directory"
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        return f"cannot create the directory {folder}: {exc.strerror or exc}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"the directory {folder} is not writable"
    return None


def write_pins(path: str | os.PathLike[str], data: dict[str, Any]) -> None:
    """Replace the file atomically: a crash leaves the old pins or the new, never half."""
    folder = Path(path).resolve().parent
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=".pins-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
