"""The stdio relay and the `--url` relay as one MCP session of the gateway.

`visor run` is one session and owns the process's SIGINT, SIGTERM and SIGHUP. A gateway runs
many relays in one event loop, and each would install and then remove the process's handlers
under the others; the gateway's own handler ends every session instead. These are the same two
relays built with `handle_signals=False`, and nothing else changed: the client side is a pair of
the gateway's pipes, the core, the checks and the audit commits are the stdio relay's.
"""

from __future__ import annotations

from typing import Any

from visor.core.checks import Checks
from visor.http.relay import HttpRelay
from visor.http.upstream import HttpUpstreamConfig
from visor.relay.proxy import Relay, RelayConfig


class SessionRelay(Relay):
    """A stdio server for one MCP session: its own process, its own core."""

    def __init__(self, argv: list[str], config: RelayConfig, checks: Checks, **kwargs: Any) -> None:
        super().__init__(argv, config, checks, handle_signals=False, **kwargs)


class HttpSessionRelay(HttpRelay):
    """An HTTP server for one MCP session: its own upstream HTTP session, its own core."""

    def __init__(
        self,
        upstream: HttpUpstreamConfig,
        argv: list[str],
        config: RelayConfig,
        checks: Checks,
        **kwargs: Any,
    ) -> None:
        super().__init__(upstream, argv, config, checks, handle_signals=False, **kwargs)
