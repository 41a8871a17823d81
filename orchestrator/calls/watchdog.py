"""The watchdog of a dispatcher's calls, every heartbeat interval (see dispatch.py for what
it finds and does): calls nobody took, nobody began, or nobody holds any more."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import redis.asyncio as aioredis

from broker import keys, outage
from broker.config.settings import Settings
from broker.protocol import CallOutcome, Event
from broker.redis import events
from broker.redis.connections import retry_pause
from broker.redis.ledger import LOST, RELEASE, UNCLAIMED
from broker.redis.presence import stale
from orchestrator.calls.pending import Pending, call_field, cancelled_outcome, session_lost

log = logging.getLogger("clawq.dispatch")

LOOK_AGAIN_S = 5.0  # a call found waiting in its queue is looked for again after this
QUEUE_SCAN = 10_000  # messages from the queue's tail a search reads at most


class CallWatchdog:
    """Part of `Dispatcher`: what it keeps of its calls, and how it looks after them."""

    pending: dict[tuple[str, int, str], Pending]
    redis: aioredis.Redis
    settings: Settings
    _trust: bool | None

    async def _send(self, p: Pending) -> None:
        raise NotImplementedError

    async def held_calls(self) -> set[str]:
        """Every call a live worker process holds, from the heartbeats of every host (read
        only when an owner is gone or a call is resent: a scan of the presence keys)."""
        held: set[str] = set()
        async for key in self.redis.scan_iter(match=keys.PROC_PATTERN, count=500):
            raw = await self.redis.get(key)
            if raw:
                held.update(json.loads(raw).get("calls") or ())
        return held

    def _resolve(self, outcome: CallOutcome) -> None:
        pending = self.pending.get((outcome.job_id, outcome.turn, outcome.call_id))
        if pending and not pending.future.done():
            pending.future.set_result(outcome)

    async def _not_taken(self, items: list[Pending]) -> None:
        """Calls no worker has started. After `call_waiting_after_s` a `tool_call_waiting`
        event names the queue (and `clawq status` lists the call); after
        `schedule_to_start_timeout_s` the model is answered with an error and the message
        left in the queue is cancelled, so a worker that comes later skips it. A call a
        live process holds is taken, claimed or not (a read runs before its claim)."""
        s, now = self.settings, time.monotonic()
        for p in items:
            e, waited = p.envelope, now - p.sent_at
            if p.future.done() or p.held:
                continue
            if p.held is None and not p.pinned:  # not looked for in its queue yet
                continue
            if waited >= s.schedule_to_start_timeout_s:
                reason = (
                    f"no worker took {e.tool} from the '{p.queue}' queue within "
                    f"{s.schedule_to_start_timeout_s:g} s: is a worker for it running "
                    f"(clawq worker --group {p.queue.split('.')[0]})? Try later or another tool."
                )
                await self.redis.set(
                    keys.cancel_call(e.job_id, e.turn, e.call_id), reason, ex=s.events_ttl_s
                )
                self._resolve(cancelled_outcome(e.job_id, e.turn, e.call_id, reason))
            elif waited >= s.call_waiting_after_s and not p.told_waiting:
                p.told_waiting = True
                info = {"queue": p.queue, "tool": e.tool, "job": e.job_id, "since": time.time()}
                await self.redis.hset(keys.CALLS_WAITING, call_field(e), json.dumps(info))
                await events.emit(
                    self.redis,
                    Event(
                        type="tool_call_waiting",
                        job_id=e.job_id,
                        data={"call_id": e.call_id, "queue": p.queue, "waited_s": round(waited, 1)},
                    ),
                    s.events_ttl_s,
                )

    async def watchdog(self) -> None:
        """Every heartbeat interval: re-send calls whose executing process has died."""
        while True:
            await asyncio.sleep(self.settings.heartbeat_interval_s)
            try:
                await self._sweep()
            except aioredis.RedisError as exc:
                await retry_pause(exc, "watchdog sweep", 0)
            except Exception:  # a bug in one sweep must not end the watching of every call
                log.exception("watchdog sweep failed; the next one runs as usual")

    async def _sweep(self) -> None:
        # a call younger than one interval is looked at in the next sweep: thousands of
        # short calls in flight cost no Redis work, and a death is still seen in seconds
        young = time.monotonic() - self.settings.heartbeat_interval_s
        items = [p for p in self.pending.values() if p.sent_at <= young]
        if not items:
            return
        fields = ["status", "proc", "outcome", "started_at"]
        async with self.redis.pipeline(transaction=False) as pipe:
            for p in items:
                e = p.envelope
                pipe.hmget(keys.call(e.job_id, e.turn, e.call_id), fields)
            states = await pipe.execute()
        running = [
            (p, owner.decode(), started or b"")
            for p, (status, owner, _, started) in zip(items, states, strict=True)
            if status == b"running" and owner
        ]
        for status, _, outcome, _ in states:
            if status == b"done" and outcome:  # recorded, but the push was lost
                self._resolve(CallOutcome.model_validate_json(outcome))
        waiting = [p for p, (status, *_) in zip(items, states, strict=True) if status in UNCLAIMED]
        self._trust = None
        await self._not_begun(waiting)
        await self._not_taken(waiting)
        if running:
            await self._not_held(running)

    async def _beats(self, procs: set[str]) -> dict[str, tuple[dict[str, Any] | None, int]]:
        """Each process's heartbeat (None when gone) and its key's remaining life (ms)."""
        names = sorted(procs)
        async with self.redis.pipeline(transaction=False) as pipe:
            for proc in names:
                pipe.get(keys.proc(proc))
                pipe.pttl(keys.proc(proc))
            found = await pipe.execute()
        beats = {}
        for i, proc in enumerate(names):
            raw, pttl = found[2 * i], found[2 * i + 1]
            beats[proc] = (json.loads(raw) if raw else None, int(pttl or 0))
        return beats

    async def _trusted(self) -> bool:
        """Whether a missing or stale heartbeat means a dead process now (once a sweep)."""
        if self._trust is None:
            s = self.settings
            self._trust = await outage.heartbeats_trusted(
                self.redis, s.heartbeat_interval_s, s.heartbeat_ttl_s
            )
        return self._trust

    def _stale(self, pttl_ms: int) -> bool:
        s = self.settings
        return stale(pttl_ms, s.heartbeat_interval_s, s.heartbeat_ttl_s)

    async def _not_held(self, running: list[tuple[Pending, str, bytes]]) -> None:
        """Calls begun by a process that died, or that a live process dropped."""
        beats = await self._beats({owner for _, owner, _ in running})
        held: set[str] | None = None
        for p, owner, started in running:
            e = p.envelope
            info, pttl = beats[owner]
            claim = f"{owner}@{started.decode()}"
            if p.future.done() or claim in p.resent_for:
                continue
            if p.pinned and (info is None or self._stale(pttl)) and await self._trusted():
                self._resolve(session_lost(e, owner, began=True))  # its state died with it
                continue
            if info is None:  # the owner's heartbeat is gone
                if not await self._trusted():  # Redis has just come back: beats resume
                    continue
                if held is None:
                    held = await self.held_calls()
                if call_field(e) in held:  # its outcome waits in a live host's spool
                    continue
                p.resent_for.add(claim)
                log.warning("call %s: %s died; sending it again", e.call_id, owner)
            else:
                calls, at = info.get("calls"), info.get("at")
                if calls is None or at is None or call_field(e) in calls:
                    continue
                if not started or at <= float(started):  # beaten before the call began
                    continue
                call = keys.call(e.job_id, e.turn, e.call_id)
                if not await self.redis.eval(RELEASE, 1, call, owner, started):
                    continue  # finished or taken over meanwhile
                p.resent_for.add(claim)
                log.warning(
                    "call %s: live %s no longer holds it; sending it again", e.call_id, owner
                )
            e.resent = True
            await self._send(p)

    async def _not_begun(self, items: list[Pending]) -> None:
        """Calls no worker began: a pinned one whose process is gone is answered "session
        lost"; one gone from its queue that no live process holds (its taker died before
        claiming it) is counted as a delivery and sent again."""
        s, now = self.settings, time.monotonic()
        pinned = [p for p in items if p.pinned and not p.future.done()]
        if pinned and await self._trusted():
            beats = await self._beats({p.pinned for p in pinned})
            for p in pinned:
                info, pttl = beats[p.pinned]
                if info is None or self._stale(pttl):
                    self._resolve(session_lost(p.envelope, p.pinned))
                    await self.redis.lrem(p.queue, 1, p.raw)  # nobody will ever take it
        due = [
            p
            for p in items
            if not p.pinned
            and not p.future.done()
            and not p.shut
            and p.raw
            and now - p.looked_at >= max(2 * s.heartbeat_interval_s, 1.0)
        ]
        if not due:
            return
        queues = sorted({p.queue for p in due})
        async with self.redis.pipeline(transaction=False) as pipe:
            for p in due:
                p.looked_at = now + LOOK_AGAIN_S - max(2 * s.heartbeat_interval_s, 1.0)
                pipe.lpos(p.queue, p.raw, rank=-1, maxlen=QUEUE_SCAN)
            for queue in queues:
                pipe.llen(queue)
            found = await pipe.execute()
        # a queue longer than the scan may hold it beyond what was read: not known gone
        deep = {q for q, n in zip(queues, found[len(due) :], strict=True) if n > QUEUE_SCAN}
        positions = found[: len(due)]
        gone = [
            p for p, at in zip(due, positions, strict=True) if at is None and p.queue not in deep
        ]
        for p in due:
            p.held = False
        if not gone:
            return
        held = await self.held_calls()
        for p in gone:
            p.held = call_field(p.envelope) in held
        # held by nobody, twice: a process that took it just now is listed by its next beat
        lost = [p for p in gone if not p.held and not p.future.done() and p.unheld]
        for p in gone:
            if not p.held and not p.unheld:
                p.unheld, p.looked_at = True, now  # looked at again after two beats
            elif p.held:
                p.unheld = False
        if not lost:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for p in lost:  # its delivery counts: a read it ran may be what killed it
                e = p.envelope
                pipe.eval(LOST, 1, keys.call(e.job_id, e.turn, e.call_id), s.ledger_ttl_s)
            marked = await pipe.execute()
        for p, counted in zip(lost, marked, strict=True):
            e = p.envelope
            p.unheld = False
            if not counted:
                continue  # begun meanwhile
            log.warning(
                "call %s: taken from %s and never claimed; sending it again", e.call_id, p.queue
            )
            e.resent = True
            await self._send(p)
