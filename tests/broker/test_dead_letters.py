"""The dead-letter store on real PostgreSQL: an exhausted call lands once with its
envelope however often it is found, undecodable bodies are kept as text, and purge works."""

from __future__ import annotations

import time

from broker.pg.store import Store
from broker.protocol import CallContext, CallEnvelope
from broker.stores.dead_letters import DeadLetters
from tests.conftest import Isolated


def envelope() -> CallEnvelope:
    return CallEnvelope(
        call_id="c1",
        job_id="j1",
        turn=2,
        session_id="s1",
        tool="exec",
        input={"command": "poison"},
        context=CallContext(workspace="/tmp/ws"),
        timeout_s=60,
        deadline=time.time() + 60,
        reply_to="clawq:reply:o1",
    )


def test_an_exhausted_call_lands_once_with_its_envelope(isolated: Isolated) -> None:
    store = Store(isolated.database_url)
    try:
        letters = DeadLetters(store.conn)
        for attempts in (3, 4):  # found exhausted by two redeliveries
            letters.exhausted(envelope(), "runtime", "clawq.tool.exec", attempts, "died 3 times")
        letters.undecodable({"envelope": {"tool": 1}}, "fs", "clawq.tool.read_file", "bad tool")
        letters.undecodable("not json at all", "fs", "", "not a task message")
        listed = letters.list()
        assert [d.kind for d in listed] == ["undecodable", "undecodable", "exhausted"]
        dead = listed[-1]
        assert dead.attempts == 4 and dead.tool == "exec" and dead.queue == "runtime"
        assert dead.envelope is not None and dead.envelope["input"] == {"command": "poison"}
        assert listed[1].raw == '{"envelope": {"tool": 1}}' and listed[0].envelope is None
        letters.mark_retried(dead.id)
        got = letters.get(dead.id)
        assert got is not None and got.status == "retried" and got.retried_at is not None
        assert [d.id for d in letters.list(status="dead")] == [listed[0].id, listed[1].id]
        assert letters.purge(older_than_s=3600) == 0
        assert letters.purge() == 3 and letters.list() == []
    finally:
        store.close()


def test_a_dead_call_with_an_outcome_anywhere_is_not_sent_again(isolated: Isolated) -> None:
    """Before `clawq dlq retry` resends: the hot ledger, the live workers' heartbeats (what
    they hold, spool included) and the stored results are looked at; the abandonment
    itself is no outcome."""
    import json

    import redis

    from broker import keys
    from broker.protocol import CallOutcome, JobSpec
    from broker.stores.dead_letters import outcome_found

    e = envelope()
    store = Store(isolated.database_url)
    client = redis.Redis.from_url(isolated.redis_url)
    try:
        store.create_job("j1", "s1", JobSpec(prompt="p", workspace="/tmp"))
        assert outcome_found(client, store.conn, e) == ""
        call = keys.call("j1", 2, "c1")
        abandoned = CallOutcome(
            call_id="c1", job_id="j1", turn=2, for_llm="abandoned", metadata={"abandoned": True}
        )
        client.hset(call, mapping={"status": "done", "outcome": abandoned.model_dump_json()})
        assert outcome_found(client, store.conn, e) == ""  # the abandonment: retry it
        ran = abandoned.model_copy(update={"metadata": {}, "worker": "worker@h:7"})
        client.hset(call, "outcome", ran.model_dump_json())
        assert "ledger" in outcome_found(client, store.conn, e)
        client.delete(call)
        client.set(keys.proc("worker@h:8"), json.dumps({"id": "worker@h:8", "calls": ["j1:2:c1"]}))
        assert "worker@h:8 holds it" in outcome_found(client, store.conn, e)
        client.delete(keys.proc("worker@h:8"))
        store.conn.execute(
            "INSERT INTO tool_calls (job_id, turn, call_id, seq, name, input, status, worker)"
            " VALUES ('j1', 2, 'c1', 0, 'exec', '{}', 'done', 'worker@h:9')"
        )
        assert "transcript" in outcome_found(client, store.conn, e)
    finally:
        client.close()
        store.close()
