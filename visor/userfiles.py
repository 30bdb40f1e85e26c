"""Where Visor's own user files go, and making their folders.

Every command that writes a file creates the folders above it first. Folders
inside ``$VISOR_HOME`` (default ``~/.visor``) are created 0700: they hold audit
logs, pins, approvals and config backups, which are nobody else's business.
"""

from __future__ import annotations

import os
from pathlib import Path

from visor.audit.paths import visor_home


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder)
    except ValueError:
        return False
    return True


def ensure_dir(folder: Path) -> Path:
    """Create `folder` and any missing parents; those under $VISOR_HOME (and it) are 0700."""
    folder = Path(os.path.abspath(os.path.expanduser(folder)))
    home = Path(os.path.abspath(visor_home()))
    missing: list[Path] = []
    d = folder
    while not d.exists():
        missing.append(d)
        if d.parent == d:
            break
        d = d.parent
    for d in reversed(missing):
        private = d == home or _inside(d, home)
        try:
            d.mkdir(mode=0o700 if private else 0o777)
        except FileExistsError:
            continue
        if private:
            os.chmod(d, 0o700)  # whatever the umask says
    return folder


def ensure_parent(path: Path | str) -> Path:
    """Create the folders above `path` (see ensure_dir); returns `path` unchanged."""
    p = Path(path)
    ensure_dir(Path(os.path.abspath(os.path.expanduser(p))).parent)
    return p


def backups_dir() -> Path:
    return visor_home() / "backups"


def pins_dir() -> Path:
    return visor_home() / "pins"


def run_dir() -> Path:
    """One small file per running `visor run` that has an approval directory."""
    return visor_home() / "run"


def safe_name(name: str) -> str:
    """A server name as a file name (same rule as the default audit log names)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).lstrip(".")
    return safe or "server"
