"""A store's connections after PostgreSQL restarts, on a cluster of the test's own: the
synchronous store (every worker's, the client's) and the orchestrator's pool are used
again at once, with no error and no process restarted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from broker.pg.store import AsyncStore, Store
from tests.chaos.services import OwnPostgres


@pytest.fixture(scope="module")
def pg() -> Iterator[OwnPostgres]:
    cluster = OwnPostgres()
    cluster.start()
    yield cluster
    cluster.stop()


def test_a_store_opens_its_connection_again_after_a_restart(pg: OwnPostgres) -> None:
    store = Store(pg.url)
    try:
        assert store.conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}
        pg.crash()
        pg.start()
        # the old connection is dead: seen without a round trip, opened again on use
        assert store.conn.execute("SELECT 2 AS two").fetchone() == {"two": 2}
    finally:
        store.close()


def test_the_pool_throws_away_connections_the_server_closed(pg: OwnPostgres) -> None:
    async def go() -> float:
        store = AsyncStore(pg.url, 4)
        await store.open()
        try:

            async def one() -> None:
                async with store.pool.connection() as conn:
                    await conn.execute("SELECT pg_sleep(0.05)")

            await asyncio.gather(*(one() for _ in range(8)))  # 4 connections in the pool
            pg.crash()
            pg.start()
            started = time.monotonic()
            for _ in range(8):  # every pooled connection is dead: none is handed out
                await one()
            return time.monotonic() - started
        finally:
            await store.close()

    assert asyncio.run(go()) < 5
