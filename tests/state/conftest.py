"""``redis_server``: the URL of a real redis-server for one test (others reuse it:
``from tests.state.conftest import redis_server, redis_process``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.state.redis_server import MISSING, RedisServer


@pytest.fixture
def redis_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """The running server itself, for tests that kill and restart it."""
    try:
        server = RedisServer(tmp_path_factory.mktemp("redis"))
    except FileNotFoundError:
        pytest.skip(MISSING)
    try:
        server.start()
        yield server
    finally:
        server.kill()


@pytest.fixture
def redis_server(redis_process: RedisServer) -> str:
    """``redis://127.0.0.1:PORT/0`` of a fresh server, killed after the test."""
    return redis_process.url
