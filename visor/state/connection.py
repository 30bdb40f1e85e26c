"""The Redis client the shared state uses: short timeouts, no retries.

A store that does not answer must fail a request in about a second, never hold
it: redis-py's default retries (three, with backoff) would triple that for every
read, and a gateway blocked on a dead store serves nobody.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import redis

#: Seconds to connect, and to wait for a reply, before the store counts as unavailable.
DEFAULT_TIMEOUT_S = 1.0
SCHEMES = ("redis", "rediss", "unix")
_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


class StateConfigError(ValueError):
    """A store URL, prefix or client Visor cannot use: the message says what."""


def check_prefix(prefix: str) -> str:
    # No braces: Visor's keys put a Redis Cluster hash tag right after the prefix.
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise StateConfigError(
            f"key prefix {prefix!r} is not allowed: 1 to 64 letters, digits, '.', '_', ':' or '-',"
            " starting with a letter or digit"
        )
    return prefix


def connect(url: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> redis.Redis:
    """A client for ``url`` (redis://, rediss:// or unix://) that replies in bytes,
    gives up after ``timeout`` seconds and never retries. Does not connect yet."""
    scheme = urlsplit(url).scheme.lower() if isinstance(url, str) else ""
    if scheme not in SCHEMES:
        shown = url.split("@")[-1] if isinstance(url, str) else type(url).__name__
        raise StateConfigError(
            f"state store {shown!r}: expected redis://HOST:PORT/DB, rediss://... or unix:///PATH"
        )
    if not timeout > 0:
        raise StateConfigError(f"state store timeout {timeout!r}: must be a positive number of seconds")
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError as exc:  # the optional 'state' extra
        raise StateConfigError(
            "a Redis/Valkey state store needs the redis client: pip install 'visor-mcp-proxy[state]'"
        ) from exc
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
        decode_responses=False,
    )


def client_of(client_or_url: redis.Redis | str, timeout: float) -> tuple[redis.Redis, bool]:
    """The client to use and whether we made it (and so close it)."""
    if isinstance(client_or_url, str):
        return connect(client_or_url, timeout=timeout), True
    kwargs = client_or_url.get_connection_kwargs()
    if kwargs.get("decode_responses"):
        # keys are binary digests and the group's secret is raw bytes
        raise StateConfigError("the Redis client must reply in bytes (decode_responses=False)")
    return client_or_url, False
