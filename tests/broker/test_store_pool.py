"""The orchestrator's pool under a storm of accepts (a thousand agent runs taken at once):
the accepts go as batches on connections of their own, so the statements of the jobs
already running still get one of the pool's at once."""

from __future__ import annotations

import asyncio

import psycopg

from broker.pg.store import AsyncStore, Store
from broker.protocol import JobSpec
from tests.conftest import Isolated


def test_a_storm_of_accepts_leaves_the_running_jobs_room_in_the_pool(
    isolated: Isolated,
) -> None:
    """Ten accepts of a job whose row another transaction holds all block (in batches, on
    the batched statements' connections); a running job's read gets a connection at once."""
    sync = Store(isolated.database_url)
    sync.migrate()
    sync.create_job("j", "s", JobSpec(prompt="p", workspace="/tmp"))
    blocker = psycopg.connect(isolated.database_url)

    async def storm() -> None:
        store = AsyncStore(isolated.database_url, 4)
        await store.open()
        try:
            blocker.execute("SELECT 1 FROM jobs WHERE id = 'j' FOR UPDATE")  # till rollback
            accepts = [asyncio.create_task(store.accept_job("j", "o1", None)) for _ in range(10)]
            await asyncio.sleep(0.3)  # every accept has asked for its connection
            try:
                rows = await asyncio.wait_for(store.transcript("s"), timeout=5)
            finally:
                blocker.rollback()
            assert rows == []
            assert all(r is not None for r in await asyncio.gather(*accepts))
        finally:
            await store.close()

    try:
        asyncio.run(storm())
    finally:
        blocker.close()
        sync.close()
