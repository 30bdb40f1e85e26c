"""The loop the raw-pipe test servers share: JSON-RPC lines in on stdin, answers out on stdout.

The servers run as scripts (``python tests/servers/NAME.py``), so they import
this module by its bare name from their own folder. It does only what every
one of them did alike: append each received line, byte for byte, to a log
file when one is named; skip what is not a JSON object with a method; write
answers as compact JSON lines. What a server answers stays in the server.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

_out = sys.stdout.buffer


@dataclass(frozen=True, slots=True)
class Message:
    """A message from the client that has a method: a request, or a notification (no id)."""

    method: str
    params: dict[str, Any]
    raw: dict[str, Any]

    @property
    def is_request(self) -> bool:
        return "id" in self.raw

    @property
    def id(self) -> Any:
        return self.raw["id"]


def open_log(env_var: str) -> BinaryIO | None:
    """The file named by `env_var`, appended to unbuffered (a test reads it while we run); None if unset."""
    path = os.environ.get(env_var)
    return open(path, "ab", buffering=0) if path else None


def reply(obj: dict[str, Any]) -> None:
    _out.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
    _out.flush()


def messages(log: BinaryIO | None = None) -> Iterator[Message]:
    """Every message with a method the client sends, until stdin closes (each line logged first)."""
    for raw in sys.stdin.buffer:
        if log:
            log.write(raw)
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        if isinstance(msg, dict) and "method" in msg:
            yield Message(msg["method"], msg.get("params") or {}, msg)


def requests(log: BinaryIO | None = None) -> Iterator[Message]:
    """The requests among `messages` (notifications are only logged)."""
    return (m for m in messages(log) if m.is_request)


def read_line() -> bytes:
    """The client's next line, read in the middle of a call: its answer to a request we sent."""
    return sys.stdin.buffer.readline()
