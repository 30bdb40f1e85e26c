"""Server attestation of kind ``stdio_invocation_sha256_v1``, as mcp-visor defines it.

A server entry may pin the digest of the stdio invocation that starts it::

    attestation:
      kind: "stdio_invocation_sha256_v1"
      digest: "sha256:<64 lower-case hex digits>"
      entry_arg_positions: [0]     # optional: args whose file content is bound too

The digest is SHA-256 over a sequence of framed fields, each
``tag (1 byte) | index (8 bytes, big-endian) | length (8 bytes, big-endian) | data``:

1. tag 0x01, index 0: the kind name ``stdio_invocation_sha256_v1`` (format marker);
2. tag 0x02, index 0: the bytes of the launcher executable, found on ``PATH``
   like ``exec`` finds it, symlinks resolved, a regular file with an
   execute bit;
3. for each argument ``i`` after the executable, in order: tag 0x03, index
   ``i``, the argument's literal bytes; and when ``i`` is one of
   ``entry_arg_positions``, right after it tag 0x04, index ``i``, the bytes of
   the regular file the argument names (symlinks resolved).

The result is written ``sha256:`` + hex. Launchers that fetch what they run
from a registry (``npx``, ``uvx``, ``bunx``, ``pnpx``, ``pnx``, ``npm exec``,
``npm x``, ``yarn dlx``, ``pnpm dlx``, ``bun x``, ``uv tool run``) cannot be
pinned: their invocation is unresolved, and an attested server started by one
has every call denied. (Contract: mcp-visor ``internal/serveridentity``, read
and re-implemented here, and its docs/architecture.md "Server Identity
Attestation".)

This module is pure: the encoding, the launcher classification and the
policy update. The file system reads happen once at start-up, in
``visor.run.measure_invocation``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from visor.policy.schema import Policy

KIND = "stdio_invocation_sha256_v1"

TAG_FORMAT = 0x01
TAG_EXECUTABLE = 0x02
TAG_ARGUMENT = 0x03
TAG_ENTRY_PAYLOAD = 0x04

#: Launchers whose own name makes them registry runners.
_RUNNERS = frozenset({"npx", "uvx", "bunx", "pnpx", "pnx"})
#: Launchers that are registry runners with these leading arguments.
_RUNNER_SUBCOMMANDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "npm": (("exec",), ("x",)),
    "yarn": (("dlx",),),
    "pnpm": (("dlx",),),
    "bun": (("x",),),
    "uv": (("tool", "run"),),
}


def field_header(tag: int, index: int, length: int) -> bytes:
    """The fixed 17-byte head of one framed field."""
    return bytes((tag,)) + index.to_bytes(8, "big") + length.to_bytes(8, "big")


def field(tag: int, index: int, data: bytes) -> bytes:
    return field_header(tag, index, len(data)) + data


class Digest:
    """The running SHA-256 of one invocation, fed field by field (file
    contents may come in chunks after their header)."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self._h.update(field(TAG_FORMAT, 0, KIND.encode()))

    def header(self, tag: int, index: int, length: int) -> None:
        self._h.update(field_header(tag, index, length))

    def data(self, chunk: bytes) -> None:
        self._h.update(chunk)

    def argument(self, index: int, value: str) -> None:
        self._h.update(field(TAG_ARGUMENT, index, encode_argument(value)))

    def result(self) -> str:
        return "sha256:" + self._h.hexdigest()


def encode_argument(value: str) -> bytes:
    """An argv value's bytes as the operating system passes them (undecodable
    bytes that Python carried as surrogates go back to what they were)."""
    return os.fsencode(value)


def digest_invocation(executable: bytes, args: Iterable[str], payloads: Mapping[int, bytes]) -> str:
    """The digest of an invocation whose files are already read: ``payloads``
    holds the content of each declared entry argument by position."""
    d = Digest()
    d.header(TAG_EXECUTABLE, 0, len(executable))
    d.data(executable)
    for i, arg in enumerate(args):
        d.argument(i, arg)
        if i in payloads:
            d.header(TAG_ENTRY_PAYLOAD, i, len(payloads[i]))
            d.data(payloads[i])
    return d.result()


def unpinnable_launcher(names: Iterable[str], args: list[str]) -> str | None:
    """The registry runner an invocation uses, or None.

    ``names`` are the base names to classify: the command as given and the
    file ``PATH`` lookup found (before symlinks). Only the exact names and
    exact leading subcommands are recognised, as in mcp-visor.
    """
    for name in names:
        if name in _RUNNERS:
            return name
        for sub in _RUNNER_SUBCOMMANDS.get(name, ()):
            if tuple(args[: len(sub)]) == sub:
                return " ".join((name, *sub))
    return None


#: measure(entry_arg_positions) -> (digest, None) or (None, why it cannot be measured)
Measure = Callable[[tuple[int, ...]], tuple[str | None, str | None]]


def observe(policy: Policy, server_name: str, measure: Measure) -> Policy:
    """The policy with the launched invocation's digest recorded on the
    server entry that applies to ``server_name``.

    ``measure`` is called only when that entry pins an attestation (a policy
    without one costs nothing). The evaluator compares the recorded digest
    with the pinned one on every tools/call (``servers[NAME].attestation``).
    """
    entry = policy.server(server_name)
    if entry is None or entry.attestation is None:
        return policy
    observed, unresolved = measure(entry.attestation.entry_arg_positions)
    att = replace(entry.attestation, observed=observed, unresolved=unresolved)
    new_entry = replace(entry, attestation=att)
    index = dict(policy.server_index)
    index[entry.name] = new_entry
    servers = tuple(new_entry if s is entry else s for s in policy.servers)
    return replace(policy, servers=servers, server_index=index)


def verdict(observed: str | None, unresolved: str | None, pinned: str) -> str | None:
    """Why calls must be denied, or None when the launched invocation is the pinned one."""
    if observed is not None and observed == pinned:
        return None
    if observed is None:
        why = unresolved or "it was not measured when the server started"
        return f"the server's invocation cannot be attested: {why}"
    return f"the launched server's invocation is {observed}, the policy pins {pinned}"
