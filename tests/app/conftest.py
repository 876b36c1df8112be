"""Fixtures the app tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from deploy.redis_server import RedisServer, find_redis
from tformer_app.class_store import ClassSettings, open_store


@pytest.fixture(scope="session", autouse=True)
def smollm2_converted_first(smollm2_if_installed):
    """Every run of the app starts converting smollm2 in its background when it is missing (caches.warm_up): the
    app tests have it converted once, before the first of them (tests/conftest.py), instead of in whichever AppTest
    or server came first, competing with its waits."""
    return smollm2_if_installed


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A redis-server of its own (Debian's), started, that the class store is then pointed at by the test; stopped
    afterwards and the store back in this process. Skips where redis-server is not installed."""
    if find_redis() is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
        open_store(ClassSettings(redis_url=None))


@pytest.fixture
def sweeper_paused() -> Iterator[None]:
    """The server's sweeper thread (started by any earlier AppTest in this process) waits while the test runs: it
    reads tformer_app.sessions' runtime, which the test replaces with its own, and would sweep the test's sessions
    between the test's own sweeps (CI: a full sweep released them between two of the test's looks)."""
    from tformer_app import sessions

    with sessions.SWEEPING:
        yield
