"""What an importer hands back: the Visor policy text and what it could not carry over."""

from __future__ import annotations

from dataclasses import dataclass


class MigrationError(Exception):
    """An input that cannot be converted at all; the message names the file and why."""


@dataclass(frozen=True, slots=True)
class Note:
    """One thing the importer changed or could not map, for stderr."""

    where: str  # "tool 'send_email'", "servers[1].risk", ...
    message: str
    narrowed: bool  # True: the Visor policy is stricter here than the original

    def render(self, source: str) -> str:
        return f"{source}: {self.where}: {self.message}"


@dataclass(frozen=True, slots=True)
class Imported:
    text: str  # the Visor policy, YAML
    notes: tuple[Note, ...]
