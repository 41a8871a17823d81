"""The dispatcher's watchdog finds the calls nobody holds, on a real Redis: heartbeats and
ledger entries are written as worker processes write them, and one sweep is run."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

from broker import keys
from broker.celery.app import create_app
from broker.protocol import CallContext, CallEnvelope
from broker.redis.connections import async_redis
from orchestrator.calls.dispatch import Dispatcher
from orchestrator.calls.pending import Pending
from tests.conftest import Isolated

INTERVAL = 0.2


def envelope(call_id: str) -> CallEnvelope:
    return CallEnvelope(
        call_id=call_id,
        job_id="j",
        session_id="s",
        tool="exec",
        input={"command": "true"},
        context=CallContext(workspace="/tmp"),
        timeout_s=5,
        deadline=time.time() + 60,
        reply_to="replies",
    )


def run(isolated: Isolated, body: Callable[[Dispatcher], Awaitable[None]]) -> None:
    """`body` with a dispatcher on the test's Redis (its calls go to queues nobody reads)."""
    settings = isolated.settings.model_copy(
        update={"heartbeat_interval_s": INTERVAL, "heartbeat_ttl_s": 4.0}
    )

    async def go() -> None:
        client = async_redis(settings)
        try:
            await body(Dispatcher(create_app(settings), client, settings, "orch"))
        finally:
            for p in client_pending.pop(id(client), []):
                p.cancel()
            await client.aclose()

    asyncio.run(go())


client_pending: dict[int, list[asyncio.Future[Any]]] = {}


async def sent(d: Dispatcher, call_id: str, queue: str = "runtime", pinned: str = "") -> Pending:
    """The call sent as the orchestrator sends it, waiting for its outcome."""
    e = envelope(call_id)
    waiting = asyncio.ensure_future(d.call(e, queue, pinned=pinned))
    client_pending.setdefault(id(d.redis), []).append(waiting)
    await asyncio.sleep(INTERVAL + 0.05)  # old enough to be looked at
    return d.pending[("j", 0, call_id)]


async def beat(r: aioredis.Redis, proc: str, **info: Any) -> None:
    await r.set(keys.proc(proc), json.dumps({"id": proc, **info}), px=4000)


async def begun(r: aioredis.Redis, call_id: str, proc: str, started: float) -> None:
    await r.hset(
        keys.call("j", 0, call_id),
        mapping={"status": "running", "proc": proc, "started_at": repr(started), "attempts": 1},
    )


async def messages(r: aioredis.Redis, queue: str) -> list[dict[str, Any]]:
    """The envelopes waiting in a queue (as workers would decode them)."""
    import base64

    found = []
    for raw in await r.lrange(queue, 0, -1):
        body = json.loads(base64.b64decode(json.loads(raw)["body"]))
        found.append(body[1]["envelope"])
    return found


def test_a_call_its_live_owner_dropped_is_released_and_sent_again(isolated: Isolated) -> None:
    async def body(dispatcher: Dispatcher) -> None:
        r = dispatcher.redis
        p = await sent(dispatcher, "dropped")
        started = time.time() - 1
        await begun(r, "dropped", "w1", started)
        await r.delete("runtime")
        await beat(r, "w1", calls=["j:0:other"], at=time.time())  # beaten after it began
        await dispatcher._sweep()
        assert await r.hget(keys.call("j", 0, "dropped"), "status") == b"released"
        (again,) = await messages(r, "runtime")
        assert again["call_id"] == "dropped" and again["resent"] is True
        assert p.envelope.resent

    run(isolated, body)


def test_a_call_sent_again_waits_for_a_worker_anew(isolated: Isolated) -> None:
    """Released after a long run and sent again, it is a call waiting in its queue from
    its new sending, not one that waited past the schedule-to-start timeout."""

    async def body(dispatcher: Dispatcher) -> None:
        r = dispatcher.redis
        p = await sent(dispatcher, "long")
        p.sent_at -= 2 * isolated.settings.schedule_to_start_timeout_s  # it ran that long
        await begun(r, "long", "w1", time.time() - 1)
        await r.delete("runtime")
        await beat(r, "w1", calls=[], at=time.time())  # dropped by its live owner
        await dispatcher._sweep()
        assert [m["call_id"] for m in await messages(r, "runtime")] == ["long"]
        await asyncio.sleep(INTERVAL + 0.05)
        p.looked_at = 0
        await dispatcher._sweep()  # released: unclaimed, and found in its queue
        assert p.held is False and not p.future.done()
        assert await r.hget(keys.call("j", 0, "long"), "status") == b"released"

    run(isolated, body)


def test_a_call_its_live_owner_holds_is_left_alone(isolated: Isolated) -> None:
    async def body(dispatcher: Dispatcher) -> None:
        r = dispatcher.redis
        await sent(dispatcher, "held")
        await begun(r, "held", "w1", time.time() - 1)
        await r.delete("runtime")
        await beat(r, "w1", calls=["j:0:held"], at=time.time())
        await dispatcher._sweep()
        # nor when its last beat was made before the call began (it may not list it yet)
        await beat(r, "w1", calls=[], at=time.time() - 5)
        await dispatcher._sweep()
        assert await r.hget(keys.call("j", 0, "held"), "status") == b"running"
        assert await messages(r, "runtime") == []

    run(isolated, body)


def test_a_dead_owners_call_is_sent_again_unless_its_outcome_waits_in_a_spool(
    isolated: Isolated,
) -> None:
    async def body(dispatcher: Dispatcher) -> None:
        r = dispatcher.redis
        await sent(dispatcher, "spooled")
        await sent(dispatcher, "lost")
        for call in ("spooled", "lost"):
            await begun(r, call, "dead", time.time() - 1)
        await r.delete("runtime")
        await beat(r, "sibling", calls=["j:0:spooled"], at=time.time())  # replays it shortly
        await dispatcher._sweep()
        (again,) = await messages(r, "runtime")
        assert again["call_id"] == "lost" and again["resent"] is True

    run(isolated, body)


def test_no_call_is_sent_again_while_redis_has_just_come_back(isolated: Isolated) -> None:
    """Every heartbeat lapsed while Redis was away: a missing one means nothing until the
    live processes have had a TTL to beat again."""

    async def body(dispatcher: Dispatcher) -> None:
        r = dispatcher.redis
        uptime = int((await r.info("server"))["uptime_in_seconds"])
        dispatcher.settings = dispatcher.settings.model_copy(
            update={"heartbeat_ttl_s": uptime + 3600.0}
        )
        await sent(dispatcher, "c")
        await begun(r, "c", "away", time.time() - 1)
        await r.delete("runtime")
        await dispatcher._sweep()
        assert await messages(r, "runtime") == []

    run(isolated, body)


def test_a_call_taken_and_never_begun_is_sent_again(isolated: Isolated) -> None:
    """Its taker died between taking it off the queue and claiming it: it is in no
    queue, in no ledger entry and in no heartbeat, at two looks a heartbeat apart (a
    process that took it just now is listed by its next beat). Sent again, and counted
    as a delivery (a read runs before its claim, and may be what killed its taker)."""

    async def body(dispatcher: Dispatcher) -> None:
        r = dispatcher.redis
        p = await sent(dispatcher, "taken")
        await r.delete("runtime")  # taken by a worker that died at once
        p.looked_at = 0
        await dispatcher._sweep()
        assert await messages(r, "runtime") == []  # once: maybe just taken
        assert p.looked_at > 0
        p.looked_at = 0
        await dispatcher._sweep()
        (again,) = await messages(r, "runtime")
        assert again["call_id"] == "taken" and again["resent"] is True
        ledger = await r.hmget(keys.call("j", 0, "taken"), ["status", "attempts"])
        assert ledger == [b"lost", b"1"]
        p2 = await sent(dispatcher, "queued")  # still in its queue: waits for a worker
        p2.looked_at = 0
        await dispatcher._sweep()
        assert [m["call_id"] for m in await messages(r, "runtime")] == ["queued", "taken"]

    run(isolated, body)


def test_a_pinned_call_whose_process_died_is_answered_session_lost_at_once(
    isolated: Isolated,
) -> None:
    """Its queue is that process's own: nobody else will take it. Its heartbeat key still
    lives (the TTL), but its last beat is old: the process is gone."""

    async def body(dispatcher: Dispatcher) -> None:
        r = dispatcher.redis
        await r.set(keys.proc("ui1"), json.dumps({"id": "ui1"}), px=1000)  # beaten 3 s ago
        p = await sent(dispatcher, "click", queue="ui.host.123", pinned="ui1")
        await dispatcher._sweep()
        outcome = await asyncio.wait_for(p.future, 1)
        assert outcome.is_error and outcome.metadata == {"session_lost": True}
        assert "ui1" in outcome.for_llm and "lost" in outcome.for_llm
        assert await r.llen("ui.host.123") == 0  # its message is taken away too

    run(isolated, body)


def test_a_resent_call_is_answered_from_the_ledger_or_left_to_its_runner(
    isolated: Isolated,
) -> None:
    """A resumed turn sends its calls again marked `resent`: one whose outcome is in the
    ledger is answered from there, one running is left to its runner; neither is sent."""
    from broker.protocol import CallOutcome

    async def body(dispatcher: Dispatcher) -> None:
        r = dispatcher.redis
        done = CallOutcome(call_id="d", job_id="j", turn=0, for_llm="ran once")
        await r.hset(
            keys.call("j", 0, "d"), mapping={"status": "done", "outcome": done.model_dump_json()}
        )
        e = envelope("d").model_copy(update={"resent": True})
        outcome = await asyncio.wait_for(dispatcher.call(e, "runtime"), 2)
        assert outcome.for_llm == "ran once"
        await begun(r, "r", "w1", time.time())
        running = envelope("r").model_copy(update={"resent": True})
        waiting = asyncio.ensure_future(dispatcher.call(running, "runtime"))
        await asyncio.sleep(0.1)
        assert not waiting.done() and await r.llen("runtime") == 0
        fresh = envelope("new").model_copy(update={"resent": True})  # never begun: sent
        sending = asyncio.ensure_future(dispatcher.call(fresh, "runtime"))
        await asyncio.sleep(0.1)
        assert [m["call_id"] for m in await messages(r, "runtime")] == ["new"]
        for task in (waiting, sending):
            task.cancel()

    run(isolated, body)


def test_the_reply_listener_resolves_every_outcome_pushed_and_drops_what_is_unreadable(
    isolated: Isolated,
) -> None:
    """Outcomes pushed as workers push them (LPUSH), several before the listener reads:
    every waiting call gets its own, an unreadable entry is dropped, the list is drained."""
    from broker.protocol import CallOutcome

    async def body(dispatcher: Dispatcher) -> None:
        r = dispatcher.redis
        waiting = [await sent(dispatcher, c) for c in ("a", "b", "c")]
        for raw in ("a", "b", "not json", "c"):
            if raw == "not json":
                await r.lpush(dispatcher.reply_key, raw)
                continue
            outcome = CallOutcome(call_id=raw, job_id="j", turn=0, for_llm=f"out {raw}")
            await r.lpush(dispatcher.reply_key, outcome.model_dump_json())
        listener = aioredis.Redis.from_url(isolated.redis_url)
        listening = asyncio.create_task(dispatcher.listen(listener))
        try:
            done = await asyncio.wait_for(asyncio.gather(*(p.future for p in waiting)), 5)
            assert [o.for_llm for o in done] == ["out a", "out b", "out c"]
            assert await r.llen(dispatcher.reply_key) == 0
        finally:
            dispatcher.stop()
            await listening
            await listener.aclose()

    run(isolated, body)
