"""Reading the policy again for a reload (SIGHUP): the file's side of it, run off the event loop.

The loader, its packs and its checks are the ones `visor run` starts with; what a running
session may not change (settings fixed at start, the launch measurement of an attested server)
is the core's to judge (`PolicyChecks.on_policy_reload`), so that it is tested without I/O.
This only turns the file into the event the driver feeds: `PolicyReloaded` or
`PolicyReloadFailed` with the loader's message (file, line, key).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from visor.core.events import PolicyReloaded, PolicyReloadFailed


@dataclass(frozen=True, slots=True)
class PolicySource:
    """Where the session's policy came from: a file, or None for the embedded default."""

    path: str | None
    # Reload when the file changes (`visor run --watch-policy`), besides on SIGHUP.
    watch: bool = False

    def load(self) -> PolicyReloaded | PolicyReloadFailed:
        """Load and validate the policy completely; never raises. Blocking: run it in a thread."""
        from visor.policy.loader import PolicyError, load_default_policy, load_policy

        source = self.path if self.path is not None else "<default>"
        try:
            policy = load_policy(self.path) if self.path is not None else load_default_policy()
        except PolicyError as exc:
            return PolicyReloadFailed(source, str(exc), self._digest(), self.path)
        except Exception as exc:  # the loader promises PolicyError; a bug still must not swap anything
            return PolicyReloadFailed(
                source, f"the policy cannot be used: {type(exc).__name__}: {exc}", path=self.path
            )
        return PolicyReloaded(policy, self.path)

    def stamp(self) -> tuple[int, int, int] | None:
        """What says the file changed: (mtime in ns, size, inode); None while it cannot be read.

        An editor that saves by renaming a new file over it changes the inode; one that
        writes in place changes the time or the size."""
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _digest(self) -> str | None:
        """SHA-256 of the refused file as it is now (for the record), when it can be read."""
        if self.path is None:
            return None
        try:
            with open(self.path, "rb") as f:
                return hashlib.sha256(f.read()).hexdigest()
        except OSError:
            return None
