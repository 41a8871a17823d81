"""The accepts of one pass of the loop on a real PostgreSQL: one statement for all of them,
each caller its own row, as if it had been accepted alone."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from broker.pg.store import AsyncStore, Store
from broker.protocol import JobSpec
from tests.conftest import Isolated

# a statement-level trigger: one row per UPDATE of jobs, however many rows it changes
COUNT_UPDATES = (
    "CREATE TABLE updates (n serial);"
    " CREATE FUNCTION count_update() RETURNS trigger LANGUAGE plpgsql AS"
    " $$ BEGIN INSERT INTO updates DEFAULT VALUES; RETURN NULL; END $$;"
    " CREATE TRIGGER count_update AFTER UPDATE ON jobs"
    " FOR EACH STATEMENT EXECUTE FUNCTION count_update()"
)


def accepted(isolated: Isolated, setup: Any, body: Any) -> tuple[Any, int]:
    """`setup(sync store)`, then `body(async store)`'s result and how many UPDATE
    statements reached the jobs table while it ran."""
    sync = Store(isolated.database_url)
    sync.migrate()
    try:
        setup(sync)
        sync.conn.execute(COUNT_UPDATES)

        async def go() -> Any:
            store = AsyncStore(isolated.database_url, 2)
            await store.open()
            try:
                return await body(store)
            finally:
                await store.close()

        result = asyncio.run(go())
        row = sync.conn.execute("SELECT count(*) AS n FROM updates").fetchone()
        return result, row["n"] if row else 0
    finally:
        sync.close()


def spec(**fields: Any) -> JobSpec:
    return JobSpec(prompt="p", workspace="/tmp", **fields)


def test_the_accepts_of_one_pass_are_one_statement_and_each_gets_its_own_row(
    isolated: Isolated,
) -> None:
    def setup(sync: Store) -> None:
        for n in range(30):
            sync.create_job(f"j{n}", f"s{n}", spec(depth=1) if n == 7 else spec())
        sync.conn.execute(
            "INSERT INTO messages (session_id, seq, job_id, role, content) VALUES"
            " ('s5', 0, 'j5', 'user', '{\"text\": \"hi\"}'),"
            " ('s5', 1, 'j5', 'assistant', '{\"text\": \"hello\"}')"
        )
        sync.conn.execute("UPDATE jobs SET status = 'completed' WHERE id = 'j9'")
        sync.conn.execute("UPDATE jobs SET chain = '[\"kept\"]' WHERE id = 'j12'")

    async def body(store: AsyncStore) -> list[dict[str, Any] | None]:
        accepts = [
            store.accept_job(f"j{n}", "o1", ["given"] if n in (11, 12) else None) for n in range(30)
        ]
        return await asyncio.gather(*accepts, store.accept_job("nope", "o1", None))

    rows, statements = accepted(isolated, setup, body)
    assert statements == 1
    assert rows[-1] is None  # no such job
    assert [row["id"] for row in rows[:-1]] == [f"j{n}" for n in range(30)]
    assert [row["session_id"] for row in rows[:-1]] == [f"s{n}" for n in range(30)]
    status = {row["id"]: row["status"] for row in rows[:-1]}
    assert status["j7"] == "queued"  # a subagent starts once it has its running slot
    assert status["j9"] == "completed"  # a final job stays final
    assert {s for j, s in status.items() if j not in ("j7", "j9")} == {"running"}
    assert [m["content"]["text"] for m in rows[5]["transcript"]] == ["hi", "hello"]
    assert rows[4]["transcript"] == []
    assert rows[11]["chain"] == ["given"]  # kept from this delivery
    assert rows[12]["chain"] == ["kept"]  # the first delivery's, not this one's
    assert rows[3]["chain"] is None


def test_a_job_accepted_twice_in_one_pass_is_accepted_as_if_one_after_the_other(
    isolated: Isolated,
) -> None:
    async def body(store: AsyncStore) -> tuple[Any, Any]:
        looked = store.accept_job("j", "o1", None, start=False)
        return await asyncio.gather(looked, store.accept_job("j", "o2", None))

    (looked, started), statements = accepted(
        isolated, lambda sync: sync.create_job("j", "s", spec()), body
    )
    assert looked["status"] == "queued"
    assert started["status"] == "running"
    assert statements == 2


def test_a_job_at_fault_fails_its_own_accept_and_no_other(isolated: Isolated) -> None:
    def setup(sync: Store) -> None:
        for n in range(3):
            sync.create_job(f"j{n}", f"s{n}", spec())
        # a spec PostgreSQL cannot read a depth from: the statement fails on this row
        sync.conn.execute("UPDATE jobs SET spec = spec || '{\"depth\": \"deep\"}' WHERE id = 'j1'")

    async def body(store: AsyncStore) -> list[Any]:
        return await asyncio.gather(
            *(store.accept_job(f"j{n}", "o1", None) for n in range(3)), return_exceptions=True
        )

    (first, bad, last), _ = accepted(isolated, setup, body)
    assert isinstance(bad, psycopg.errors.InvalidTextRepresentation)
    assert (first["status"], last["status"]) == ("running", "running")


def test_a_lone_accept_is_not_held_for_company(isolated: Isolated) -> None:
    async def body(store: AsyncStore) -> Any:
        return await asyncio.wait_for(store.accept_job("j", "o1", None), timeout=5)

    row, statements = accepted(isolated, lambda sync: sync.create_job("j", "s", spec()), body)
    assert (row["status"], statements) == ("running", 1)
