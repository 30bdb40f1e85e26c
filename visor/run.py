"""`visor run`: wire the configuration, the gate and the relay together."""

from __future__ import annotations

import argparse
import os
import sys

import uvloop

from visor import logs
from visor.gate import Gate
from visor.relay.proxy import Relay, RelayConfig
from visor.relay.upstream import SpawnError

# The client's pipes, moved off fds 0 and 1 by protect_stdio().
_WIRE_IN: int | None = None
_WIRE_OUT: int | None = None


def protect_stdio() -> None:
    """Keep private copies of the wire fds and point 0 and 1 elsewhere.

    Any stray print (a library, a crash handler, argparse) then lands on
    stderr instead of corrupting the protocol stream, and nothing but the
    relay can read the client's stdin: approval answers can never come from it.
    """
    global _WIRE_IN, _WIRE_OUT
    if _WIRE_IN is not None:
        return
    _WIRE_IN = os.dup(0)
    _WIRE_OUT = os.dup(1)
    os.set_inheritable(_WIRE_IN, False)
    os.set_inheritable(_WIRE_OUT, False)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout.flush()
    os.dup2(2, 1)


def run_command(args: argparse.Namespace, command: list[str]) -> int:
    logs.configure(args.log_level, args.log_format)
    log = logs.get_logger("visor.run")
    protect_stdio()
    assert _WIRE_IN is not None and _WIRE_OUT is not None
    config = RelayConfig(
        server_name=args.server_name,
        max_message_bytes=args.max_message_bytes,
        shutdown_grace=args.shutdown_grace,
    )
    gate = Gate()
    relay = Relay(command, config, gate)
    try:
        return uvloop.run(relay.run(_WIRE_IN, _WIRE_OUT))
    except SpawnError as exc:
        log.error("server_spawn_failed", error=str(exc))
        return 1
    except Exception:
        log.exception("visor_failed")
        return 1
