"""The transcript's writes on a real PostgreSQL: a turn's results travel alone or with the
model's next message, in one statement either way, and the transcript has no gap."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import psycopg
import pytest

from broker.pg.store import AsyncStore, Store
from broker.pg.transcript_writes import WRITE_BATCH, Results, Write, batch_params
from broker.protocol import CallOutcome, JobSpec
from tests.conftest import Isolated


def outcome(call_id: str, turn: int, text: str) -> CallOutcome:
    return CallOutcome(call_id=call_id, job_id="j", turn=turn, for_llm=text, worker="w1")


def results(seq: int, turn: int, text: str) -> Results:
    content = {"results": [{"call_id": f"c{turn}", "content": text}]}
    return Results(seq, content, [outcome(f"c{turn}", turn, text)])


def run(isolated: Isolated, body: Any) -> Any:
    """Run `body` on an AsyncStore of a migrated schema holding job j of session s; the
    synchronous connection to look at what it wrote."""
    sync = Store(isolated.database_url)
    sync.migrate()
    sync.create_job("j", "s", JobSpec(prompt="p", workspace="/tmp"))

    async def go() -> None:
        store = AsyncStore(isolated.database_url, 2)
        await store.open()
        try:
            await body(store)
        finally:
            await store.close()

    try:
        asyncio.run(go())
    except BaseException:
        sync.close()
        raise
    return sync.conn


def test_results_written_with_the_next_message_land_before_it(isolated: Isolated) -> None:
    async def body(store: AsyncStore) -> None:
        call = [("c0", "read_file", {"path": "a"}, "fs")]
        await store.append_message("s", "j", 0, "assistant", {"text": ""}, 0, call, 1)
        # the results of turn 0 (seq 1) ride on the next assistant message (seq 2)
        nxt = [("c1", "read_file", {"path": "b"}, "fs")]
        await store.append_message(
            "s", "j", 2, "assistant", {"text": ""}, 1, nxt, 2, results=results(1, 0, "A")
        )
        await store.record_outcomes("s", "j", results(3, 1, "B"))  # alone, late

    conn = run(isolated, body)
    rows = conn.execute("SELECT seq, role FROM messages WHERE session_id = 's' ORDER BY seq")
    assert [(r["seq"], r["role"]) for r in rows.fetchall()] == [
        (0, "assistant"),
        (1, "tool"),
        (2, "assistant"),
        (3, "tool"),
    ]
    calls = conn.execute(
        "SELECT turn, call_id, status, for_llm FROM tool_calls WHERE job_id = 'j' ORDER BY turn"
    ).fetchall()
    assert [(c["turn"], c["call_id"], c["status"], c["for_llm"]) for c in calls] == [
        (0, "c0", "done", "A"),
        (1, "c1", "done", "B"),
    ]
    iterations = conn.execute("SELECT iterations FROM jobs WHERE id = 'j'").fetchone()
    assert iterations == {"iterations": 2}
    conn.close()


def test_a_result_written_twice_is_stored_once(isolated: Isolated) -> None:
    async def body(store: AsyncStore) -> None:
        call: list[tuple[str, str, dict[str, Any], str]] = [("c0", "x", {}, "fs")]
        await store.append_message("s", "j", 0, "assistant", {"text": ""}, 0, call)
        await store.record_outcomes("s", "j", results(1, 0, "first"))
        await store.append_message(  # a resumed job writing the same results again
            "s", "j", 2, "assistant", {"text": "done"}, 1, results=results(1, 0, "second")
        )

    conn = run(isolated, body)
    tool = conn.execute("SELECT content FROM messages WHERE session_id = 's' AND seq = 1")
    assert tool.fetchone()["content"]["results"][0]["content"] == "first"
    assert conn.execute("SELECT count(*) AS n FROM messages").fetchone() == {"n": 3}
    conn.close()


def test_concurrent_jobs_writes_go_as_one_statement(isolated: Isolated) -> None:
    sync = Store(isolated.database_url)
    for n in range(30):
        sync.create_job(f"j{n}", f"s{n}", JobSpec(prompt="p", workspace="/tmp"))
    sync.close()
    sent: list[int] = []

    async def body(store: AsyncStore) -> None:
        send = store.writes.send

        async def counted(items: list[Any]) -> list[Any]:
            sent.append(len(items))
            return await send(items)

        store.writes.send = counted  # type: ignore[method-assign]
        await asyncio.gather(
            *(
                store.append_message(
                    f"s{n}",
                    f"j{n}",
                    0,
                    "assistant",
                    {"text": f"t{n}"},
                    0,
                    [(f"c{n}", "x", {}, "fs")],
                    1,
                )
                for n in range(30)
            )
        )

    conn = run(isolated, body)
    assert sum(sent) == 30 and len(sent) <= 2  # not thirty statements
    rows = conn.execute("SELECT job_id, content->>'text' AS t FROM messages ORDER BY job_id")
    assert sorted((r["job_id"], r["t"]) for r in rows) == sorted(
        (f"j{n}", f"t{n}") for n in range(30)
    )
    queued = conn.execute("SELECT count(*) AS n FROM tool_calls WHERE status = 'queued'")
    assert queued.fetchone() == {"n": 30}
    assert conn.execute("SELECT count(*) AS n FROM jobs WHERE iterations = 1").fetchone() == {
        "n": 30
    }
    conn.close()


def test_a_bad_write_fails_alone_and_the_batch_is_stored(isolated: Isolated) -> None:
    failed: list[BaseException] = []

    async def body(store: AsyncStore) -> None:
        good = store.append_message("s", "j", 0, "assistant", {"text": "kept"}, 0, None, 1)
        bad = store.append_message("nowhere", "nojob", 0, "assistant", {"text": "x"})
        done = await asyncio.gather(good, bad, return_exceptions=True)
        failed.extend(d for d in done if isinstance(d, BaseException))
        assert done[0] is None

    conn = run(isolated, body)
    assert len(failed) == 1 and "foreign key" in str(failed[0])
    rows = conn.execute("SELECT job_id, content->>'text' AS t FROM messages").fetchall()
    assert [(r["job_id"], r["t"]) for r in rows] == [("j", "kept")]
    conn.close()


def test_a_jobs_end_rides_in_the_batch_of_other_jobs_turns(
    isolated: Isolated, monkeypatch: pytest.MonkeyPatch
) -> None:
    sync = Store(isolated.database_url)
    sync.create_job("k", "t", JobSpec(prompt="p", workspace="/tmp"))
    sync.close()
    statements: list[tuple[str, Any]] = []  # every statement the store sends meanwhile
    execute = psycopg.AsyncConnection.execute

    async def counted(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        statements.append((str(query), params))
        return await execute(self, query, params, **kwargs)

    async def body(store: AsyncStore) -> None:
        monkeypatch.setattr(psycopg.AsyncConnection, "execute", counted)
        await asyncio.gather(
            store.finish_job("j", "completed", "the answer", "", 3),
            store.append_message("t", "k", 0, "assistant", {"text": "go"}, 0, None, 1),
        )
        monkeypatch.undo()

    conn = run(isolated, body)
    # one statement carried both: the job's end and the other job's turn
    assert [q for q, _ in statements] == [WRITE_BATCH], statements
    batch = json.loads(statements[0][1]["batch"])
    assert sorted(item["job"] for item in batch) == ["j", "k"]
    jobs = conn.execute(
        "SELECT id, status, final_text, iterations, finished_at IS NOT NULL AS ended FROM jobs"
        " ORDER BY id"
    ).fetchall()
    assert [(j["id"], j["status"], j["final_text"], j["iterations"], j["ended"]) for j in jobs] == [
        ("j", "completed", "the answer", 3, True),
        ("k", "queued", "", 1, False),
    ]
    conn.close()


async def write_turns(store: AsyncStore, turns: int) -> None:
    """Job j's first `turns` turns, one call each, each turn's results riding on the next."""
    for turn in range(turns):
        call = [(f"c{turn}", "read_file", {"path": "a"}, "fs")]
        done = results(2 * turn - 1, turn - 1, "A") if turn else None
        await store.append_message(
            "s", "j", 2 * turn, "assistant", {"text": ""}, turn, call, turn + 1, done
        )


def test_a_write_planned_on_empty_tables_reads_only_its_rows_as_they_grow(
    isolated: Isolated,
) -> None:
    """The plan PostgreSQL keeps for the write is made in a new database's first seconds,
    while jobs and tool_calls are nearly empty; 5,000 rows later in each, recording a turn
    must still read only its job's row, and reach that turn's calls by their key
    (PostgreSQL's own account of the kept plan: EXPLAIN ANALYZE EXECUTE on the writer's
    connection). A plan made on the empty tables scanned both whole on every write."""
    turns = 20
    plan: dict[str, Any] = {}

    async def body(store: AsyncStore) -> None:
        await write_turns(store, turns)  # prepared, and its plan kept, on a near-empty ledger
        other = Store(isolated.database_url)
        other.create_job("k", "s2", JobSpec(prompt="p", workspace="/tmp"))
        other.conn.execute(
            "INSERT INTO tool_calls (job_id, turn, call_id, seq, name, input, status)"
            " SELECT 'k', n, 'c', 0, 'read_file', '{}', 'done' FROM generate_series(1, 5000) n"
        )
        other.conn.execute(
            "INSERT INTO jobs (id, session_id, status, spec)"
            " SELECT 'k' || n, 's2', 'queued', '{}' FROM generate_series(1, 5000) n"
        )
        other.close()
        last = Write("s", "j", iterations=turns, results=results(2 * turns - 1, turns - 1, "B"))
        params = batch_params([last])
        async with store.write_pool.connection() as conn:
            cur = conn.cursor(row_factory=psycopg.rows.dict_row)
            await cur.execute(
                "SELECT name FROM pg_prepared_statements"
                " WHERE statement LIKE 'WITH b AS MATERIALIZED%%' AND generic_plans > 0"
            )
            kept = await cur.fetchone()
            assert kept is not None, "the write was not prepared on this connection"
            explain = psycopg.sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {}({})").format(
                psycopg.sql.Identifier(kept["name"]),  # its parameters in the query's order
                psycopg.sql.SQL(", ").join(psycopg.sql.Literal(v) for v in params.values()),
            )
            await cur.execute(explain)
            row = await cur.fetchone()
            assert row is not None
            plan.update(next(iter(row.values()))[0]["Plan"])

    conn = run(isolated, body)
    read: list[tuple[str, int]] = []

    def walk(node: dict[str, Any]) -> None:
        if node.get("Relation Name") in ("jobs", "tool_calls") and "Scan" in node["Node Type"]:
            rows = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
            read.append((node["Relation Name"], rows * node["Actual Loops"]))
        for child in node.get("Plans", []):
            walk(child)

    walk(plan)
    assert read == [("jobs", 1)], read  # the calls are found by their key, not scanned
    status = conn.execute(
        "SELECT status, for_llm FROM tool_calls WHERE job_id = 'j' AND turn = %s", (turns - 1,)
    ).fetchone()
    assert status == {"status": "done", "for_llm": "B"}
    conn.close()


def test_a_call_id_the_model_repeated_in_a_turn_keeps_the_outcome_of_the_call_that_ran(
    isolated: Isolated,
) -> None:
    """The gate refuses a call whose id the turn already used: both outcomes come back under
    one id, and the write keeps the first (the one that ran) instead of failing."""

    async def body(store: AsyncStore) -> None:
        calls: list[tuple[str, str, dict[str, Any], str]] = [
            ("c0", "read_file", {"path": "a"}, "fs"),
            ("c0", "read_file", {"path": "b"}, "fs"),
        ]
        await store.append_message("s", "j", 0, "assistant", {"text": ""}, 0, calls, 1)
        both = [outcome("c0", 0, "ran"), outcome("c0", 0, "refused: the id was used")]
        await store.record_outcomes("s", "j", Results(1, {"results": []}, both))

    conn = run(isolated, body)
    rows = conn.execute("SELECT status, for_llm FROM tool_calls WHERE job_id = 'j'").fetchall()
    assert rows == [{"status": "done", "for_llm": "ran"}]
    conn.close()


def test_the_write_is_planned_once_per_connection(isolated: Isolated) -> None:
    """PostgreSQL's own count of the plans it made for the write (pg_prepared_statements):
    generic ones, never one per execution (it had chosen those, 0.5 ms each)."""
    found: list[dict[str, Any]] = []

    async def body(store: AsyncStore) -> None:
        await write_turns(store, 20)
        async with store.write_pool.connection() as conn:
            cur = conn.cursor(row_factory=psycopg.rows.dict_row)
            await cur.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE 'WITH b AS MATERIALIZED%%'"
            )
            found.extend(await cur.fetchall())

    run(isolated, body).close()
    assert len(found) == 1 and found[0]["custom_plans"] == 0, found
    assert found[0]["generic_plans"] >= 10, found
