"""Where audit logs live and how rotated files are named.

Rotation renames the live file ``audit.jsonl`` to ``audit.jsonl.N`` where N is
one more than the highest number already present, so ``.1`` is the oldest file.
A rotated file is renamed exactly once and keeps its name forever after (unlike
logrotate's shifting ``.1``), which keeps references to it stable and makes a
crash mid-rotation leave at most one rename to reason about.
"""

from __future__ import annotations

import os
import re
from pathlib import Path


def visor_home() -> Path:
    return Path(os.environ.get("VISOR_HOME") or Path.home() / ".visor")


def audit_dir() -> Path:
    """`visor run` keeps one log per server here: a log has a single writer."""
    return visor_home() / "audit"


def default_audit_logs() -> list[Path]:
    """Every live log in the default directory (rotated files follow from each)."""
    try:
        return sorted(p for p in audit_dir().iterdir() if p.name.endswith(".jsonl") and p.is_file())
    except FileNotFoundError:
        return []


def default_audit_chains() -> list[Path]:
    """Every chain in the default directory, named by its live file, even one that was deleted.

    `visor audit verify` checks these: rotated files whose live file is gone
    must fail the check, not drop out of it.
    """
    try:
        names = {p.name for p in audit_dir().iterdir()}
    except FileNotFoundError:
        return []
    lives = {n for n in names if n.endswith(".jsonl")}
    for n in names:
        m = re.match(r"(.+\.jsonl)\.[1-9][0-9]*\Z", n)
        if m:
            lives.add(m.group(1))
    return [audit_dir() / n for n in sorted(lives)]


def lock_path(path: Path) -> Path:
    # A separate lock file, because the live file itself is renamed on rotation.
    return path.with_name(path.name + ".lock")


def rotated_files(path: Path) -> list[Path]:
    """``path.1``, ``path.2``, ... that exist, oldest first."""
    pattern = re.compile(re.escape(path.name) + r"\.([1-9][0-9]*)\Z")
    try:
        names = os.listdir(path.parent)
    except FileNotFoundError:
        return []
    found = sorted((int(m.group(1)), n) for n in names if (m := pattern.match(n)))
    return [path.parent / n for _, n in found]


def next_rotated_name(path: Path) -> Path:
    existing = rotated_files(path)
    n = int(existing[-1].name.rsplit(".", 1)[1]) + 1 if existing else 1
    return path.with_name(f"{path.name}.{n}")


def chain_files(path: Path) -> list[Path]:
    """Every file of one chain, in chain order: rotated files, then the live file.

    A path that is itself a rotated file (``audit.jsonl.3``) stands alone.
    """
    if re.search(r"\.[1-9][0-9]*\Z", path.name):
        return [path]
    files = rotated_files(path)
    if path.exists() or path.is_symlink() or not files:
        files.append(path)
    return files
