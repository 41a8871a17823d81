"""The agents queue as orchestrators consume it, against a real Redis and messages that
Celery itself published."""

from __future__ import annotations

import asyncio

import redis
import redis.asyncio as aioredis

from broker import keys
from broker.celery.app import create_app
from broker.protocol import AGENT_RUN_TASK, AGENTS_QUEUE
from broker.redis.agent_queue import AgentQueue
from tests.conftest import Isolated


def send(iso: Isolated, job_id: str, **options: object) -> None:
    create_app(iso.settings).send_task(
        AGENT_RUN_TASK, kwargs={"job_id": job_id}, queue=AGENTS_QUEUE, task_id=job_id, **options
    )


def run(iso: Isolated, body):  # type: ignore[no-untyped-def]
    async def main():  # type: ignore[no-untyped-def]
        client = aioredis.Redis.from_url(iso.redis_url)
        blocking = aioredis.Redis.from_url(iso.redis_url)
        try:
            return await body(lambda taker: AgentQueue(client, blocking, taker))
        finally:
            await client.aclose()
            await blocking.aclose()

    return asyncio.run(main())


def test_runs_are_taken_in_order_and_settled(isolated: Isolated) -> None:
    for n in range(3):
        send(isolated, f"job{n}")

    async def body(queue):  # type: ignore[no-untyped-def]
        mine = queue("orch-a")
        first = await mine.take(2, block_s=1)
        rest = await mine.take(10, block_s=1)
        await mine.settle([*first, *rest])
        return first, rest

    first, rest = run(isolated, body)
    assert [r.job_id for r in first] == ["job0", "job1"]
    assert [r.job_id for r in rest] == ["job2"]
    plain = redis.Redis.from_url(isolated.redis_url)
    assert plain.llen(AGENTS_QUEUE) == 0
    assert plain.llen(keys.agents_taken("orch-a")) == 0


def test_a_chain_and_a_foreign_message_are_read(isolated: Isolated) -> None:
    send(isolated, "child", chain=[{"task": "clawq.announce", "args": []}])
    create_app(isolated.settings).send_task("something.else", queue=AGENTS_QUEUE)

    async def body(queue):  # type: ignore[no-untyped-def]
        return await queue("orch-a").take(10, block_s=1)

    child, foreign = run(isolated, body)
    assert child.job_id == "child" and child.chain[0]["task"] == "clawq.announce"
    assert foreign.job_id == ""  # not an agent run: the orchestrator drops it


def test_what_a_dead_orchestrator_took_is_queued_again(isolated: Isolated) -> None:
    for n in range(2):
        send(isolated, f"job{n}")
    plain = redis.Redis.from_url(isolated.redis_url)

    async def body(queue):  # type: ignore[no-untyped-def]
        dead, alive, other = queue("orch-dead"), queue("orch-alive"), queue("orch-c")
        await dead.take(1, block_s=1)
        await alive.take(1, block_s=1)
        plain.set(keys.proc("orch-alive"), "{}")
        restored = await other.restore_dead()
        again = await other.take(10, block_s=1)
        return restored, again

    restored, again = run(isolated, body)
    assert restored == 1
    assert [r.job_id for r in again] == ["job0"]  # the dead one's; the live one keeps job1
    assert plain.llen(keys.agents_taken("orch-alive")) == 1
    assert not plain.sismember(keys.AGENTS_TAKERS, "orch-dead")


def test_a_stopping_orchestrator_gives_back_what_it_did_not_settle(isolated: Isolated) -> None:
    send(isolated, "job0")

    async def body(queue):  # type: ignore[no-untyped-def]
        mine = queue("orch-a")
        await mine.take(10, block_s=1)
        returned = await mine.give_back()
        return returned, await queue("orch-b").take(10, block_s=1)

    returned, again = run(isolated, body)
    assert returned == 1 and [r.job_id for r in again] == ["job0"]
