"""The orchestrator process: takes agent runs off the `agents` queue and drives them all
on one asyncio event loop.

The `agents` queue is consumed on the loop too (broker/agent_queue.py: a reliable list,
taken in batches), as is everything else: model streams, tool dispatch, outcomes,
PostgreSQL.
Each running job holds a lease in Redis, refreshed by this process's heartbeat thread
(orchestrator/leases.py) while the loop is alive: a job whose orchestrator died loses its
lease within seconds and is resumed by another orchestrator from its transcript.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import signal
import time
import uuid
from typing import Any

import httpx
import psycopg
import redis.asyncio as aioredis
from celery import Celery

from broker import events, keys, metrics, outage, tracing
from broker.admission import RECLAIM
from broker.agent_queue import AgentQueue, AgentRun
from broker.announce import AnnounceItem, AnnounceQueue, batch_message
from broker.celery_app import create_app
from broker.connections import async_redis, patient_redis, retry_pause
from broker.messages import AGENT_RUN_TASK, AGENTS_QUEUE, FINAL_STATUSES, Event, Group, JobSpec
from broker.presence import process_id
from broker.ratelimit import RateLimiter
from broker.settings import Settings
from broker.store import AsyncStore
from orchestrator.approvals import ApprovalAnswer, Approvals
from orchestrator.custom_catalog import CustomCatalog
from orchestrator.dispatch import Dispatcher
from orchestrator.hooks import Hooks
from orchestrator.leases import LeaseKeeper
from orchestrator.live import LiveSettings
from orchestrator.loop import JobRun, Services
from orchestrator.policy import PolicyEngine
from orchestrator.task_events import AgentTaskEvents
from workers.registry import Registry, default_registry

log = logging.getLogger("clawq.orchestrator")

RECOVERY_INTERVAL_S = 5.0
RECOVERY_CHECK_S = 1.0  # how often the presence of the other orchestrators is looked at
ACCEPT_WINDOW = 1000  # agent runs being accepted at once (unacked on the agents queue)
ARTIFACT_PURGE_INTERVAL_S = 600.0  # retention is days; ten minutes late is nothing
ANNOUNCE_POLL_S = 0.2


def serve(settings: Settings) -> None:
    """Run an orchestrator until SIGTERM or SIGINT, on uvloop: its event loop costs a
    fraction of asyncio's per callback and socket operation, and one process drives
    thousands of jobs."""
    import uvloop

    # thousands of live jobs are many long-lived objects: what exists at start is never
    # collected, and young objects are collected less often (each full pass walks them all)
    gc.freeze()
    gc.set_threshold(20_000, 20, 50)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(Orchestrator(settings).run())


class Orchestrator:
    def __init__(
        self, settings: Settings, registry: Registry | None = None, hooks: Hooks | None = None
    ) -> None:
        self.settings = settings
        self.registry = registry or default_registry()
        self.policy = PolicyEngine(self.registry, settings.tool_policy)  # fails on bad config
        self.hooks = hooks or Hooks(settings.hooks, settings=settings)
        self.app: Celery = create_app(settings)
        self.id = process_id("orchestrator", settings.node())
        self.jobs: dict[str, asyncio.Task[None]] = {}
        self.cancelling: set[str] = set()
        self.steering: set[str] = set()
        self.children: set[str] = set()  # the subagents among self.jobs (they hold slots)
        self.accepting: set[str] = set()  # being claimed now (accepts run concurrently)
        self.claimed: set[str] = set()  # leased here, being started (not in self.jobs yet)
        self.slots = asyncio.Semaphore(settings.max_jobs_per_orchestrator)
        self.stopping = asyncio.Event()  # no more agent runs are taken
        self._lease_ms = int(settings.heartbeat_ttl_s * 1000)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
        tracing.setup(self.settings.otlp_endpoint, "orchestrator")
        queues = [g.value for g in Group] + [AGENTS_QUEUE]  # their depths, read at scrape
        metrics.serve(self.settings.metrics_port, self.settings.redis_url, queues)
        self.redis = async_redis(self.settings)
        listen_redis = aioredis.Redis.from_url(self.settings.redis_url)
        agents_redis = aioredis.Redis.from_url(self.settings.redis_url)  # its blocking take
        self.store = AsyncStore(
            self.settings.database_url,
            self.settings.database_pool_size,
            outage_s=self.settings.outage_retry_s,
        )
        await self.store.open()
        http = httpx.AsyncClient(timeout=self.settings.model_timeout_s)
        self.dispatcher = Dispatcher(self.app, self.redis, self.settings, self.id)
        self.approvals = Approvals(self.redis)
        self.services = Services(
            self.settings,
            self.store,
            self.redis,
            self.dispatcher,
            self.registry,
            http,
            self.policy,
            self.hooks,
            self.approvals,
            RateLimiter(self.redis, self.settings.rate_limit_per_hour),
            self.app,
            AgentTaskEvents(self.app, self.settings.agent_task_events),
            AnnounceQueue(
                patient_redis(self.settings.redis_url, self.settings.outage_retry_s),
                self.settings.announce_debounce_s,
                self.settings.announce_drain_at,
                inbox_ttl_s=self.settings.events_ttl_s,
            ),
            CustomCatalog(self.redis, self.store.pool),
            LiveSettings(self.settings),
        )
        self.announcements = self.services.announcements
        try:
            await asyncio.to_thread(self.services.task_events.prepare)
        except Exception as exc:  # Flower's events are best effort; jobs run regardless
            log.warning("task events unavailable: %s", exc)
        queue = self.agent_queue = AgentQueue(self.redis, agents_redis, self.id)
        keeper = LeaseKeeper(
            self.settings,
            self.id,
            {"kind": "orchestrator", "queue": AGENTS_QUEUE},
            lambda: [*self.jobs, *self.claimed],  # C-level copies: atomic under the GIL
            lambda: list(self.children),
        )
        await asyncio.to_thread(keeper.start)
        background = [
            asyncio.create_task(self.dispatcher.listen(listen_redis)),
            asyncio.create_task(self.dispatcher.watchdog()),
            asyncio.create_task(self.check_in(keeper)),
            asyncio.create_task(self.control()),
            asyncio.create_task(self.recover()),
            asyncio.create_task(self.deliver_announcements()),
            asyncio.create_task(self.archive_children()),
            asyncio.create_task(self.purge_artifacts()),
            asyncio.create_task(self.tick_cron()),
        ]
        consumer = asyncio.create_task(self.consume(queue))
        log.info("orchestrator %s ready", self.id)
        try:
            await stop.wait()
        finally:
            self.stopping.set()
            await asyncio.wait([consumer], timeout=6)
            for task in list(self.jobs.values()):
                task.cancel()
            await asyncio.gather(*self.jobs.values(), return_exceptions=True)
            self.dispatcher.stop()
            for task in background[1:]:
                task.cancel()
            # bounded: redis-py can lose a cancellation that lands in a blocking read
            await asyncio.wait(background, timeout=3)
            with contextlib.suppress(aioredis.RedisError):
                await queue.give_back()  # what it took and did not start: for the others
            await asyncio.to_thread(keeper.stop)  # and its presence goes
            await http.aclose()
            await self.store.close()
            await self.redis.aclose()
            await listen_redis.aclose()
            await agents_redis.aclose()
            self.announcements.client.close()
            self.services.task_events.close()

    # -- the agents queue ---------------------------------------------------------------

    async def consume(self, queue: AgentQueue) -> None:
        """Take agent runs (up to the accept window at once), accept them concurrently,
        and settle each once accepted; a run whose accept failed is queued again."""
        await queue.give_back()  # a taken list under this id is a dead incarnation's
        inflight: set[asyncio.Task[None]] = set()
        settled: list[AgentRun] = []
        settling: set[asyncio.Task[None]] = set()

        async def settle_soon() -> None:
            await asyncio.sleep(0.005)  # gather the batch of accepts finishing together
            batch = settled[:]
            del settled[:]
            try:
                await queue.settle(batch)
            except aioredis.RedisError as exc:  # taken again after this process dies
                log.warning("agent runs not settled (%s)", exc)

        async def accept(run: AgentRun) -> None:
            try:
                if run.job_id:
                    await self.accept(run.job_id, run.chain)
                else:
                    log.error("dropping a message that is not an agent run: %r", run.raw[:200])
            except Exception:
                log.exception("could not accept job %s; it is queued again", run.job_id)
                await queue.retry(run)
                return
            settled.append(run)
            if len(settled) == 1:
                settling.add(task := asyncio.create_task(settle_soon()))
                task.add_done_callback(settling.discard)

        while not self.stopping.is_set():
            room = ACCEPT_WINDOW - len(inflight)
            if room <= 0:
                await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
                continue
            try:
                runs = await queue.take(room, block_s=1)
            except aioredis.RedisError as exc:
                await retry_pause(exc, "agents queue", 1.0)
                continue
            for run in runs:
                task = asyncio.create_task(accept(run))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
        if inflight:
            await asyncio.wait(inflight, timeout=5)

    async def _orphans(self) -> list[str]:
        """Unfinished jobs that nobody holds: no lease, and started by no live orchestrator
        but this one (a live one's lease may lapse while its loop is slow to take a reply;
        it sweeps its own jobs, and a dead one's presence is gone). Looked at again in
        the database at the end: most of a long list finish while it is checked."""
        candidates = [
            (job, owner)
            for job, owner in await self.store.orphan_candidates()
            if job not in self.jobs
        ]
        if not candidates:
            return []
        others = sorted({owner for _, owner in candidates if owner and owner != self.id})
        async with self.redis.pipeline(transaction=False) as pipe:
            for job, _ in candidates:
                pipe.exists(keys.lease(job))
            for owner in others:
                pipe.exists(keys.proc(owner))
            found = await pipe.execute()
        leased = found[: len(candidates)]
        alive = {
            owner for owner, live in zip(others, found[len(candidates) :], strict=True) if live
        }
        unheld = [
            job
            for (job, owner), held in zip(candidates, leased, strict=True)
            if not held and owner not in alive
        ]
        if not unheld:
            return []
        return [job for job, _ in await self.store.orphan_candidates(unheld)]

    async def accept(self, job_id: str, chain: list[Any] | None = None) -> bool:
        """Claim the job's lease and start (or resume) it; a job leased elsewhere is left.

        `chain` (from the queue message) is the rest of its task graph; it is stored first,
        so the message can be acknowledged and a resumed run still continues the graph.
        A subagent also needs its running slot; with none free it waits (`recover`).
        Whether it started here."""
        if job_id in self.jobs or job_id in self.accepting:
            return False
        self.accepting.add(job_id)
        try:
            run = await self._claim(job_id, chain)
        finally:
            self.accepting.discard(job_id)
        if run is None:
            return False
        if run.spec.depth > 0:
            self.children.add(job_id)
        self.jobs[job_id] = asyncio.create_task(self._drive(run), name=f"job-{job_id}")
        return True

    async def _claim(self, job_id: str, chain: list[Any] | None) -> JobRun | None:
        """Slot, lease, then one statement that keeps the chain and starts the job (a
        subagent starts once it has its running slot); None when it is not ours to run.

        The slot is taken before the lease (a job waiting for a slot would let its lease
        lapse) and the lease before the start: a job leased elsewhere is left as it is."""
        await self.slots.acquire()
        claimed = await self.redis.set(keys.lease(job_id), self.id, nx=True, px=self._lease_ms)
        if not claimed:
            self.slots.release()
            if chain is not None:
                await self.store.save_chain(job_id, chain)
            return None
        run = None
        self.claimed.add(job_id)  # an accept that waits for the database keeps its lease
        try:
            run = await self._start(job_id, chain)
        finally:
            self.claimed.discard(job_id)
            if run is None:
                await self.redis.delete(keys.lease(job_id))
                self.slots.release()
        return run

    async def _start(self, job_id: str, chain: list[Any] | None) -> JobRun | None:
        row = await self.store.accept_job(job_id, self.id, chain)
        if row is None:
            log.error("agent run for unknown job %s dropped", job_id)
            return None
        if row["status"] in FINAL_STATUSES:
            return None
        spec = JobSpec.model_validate(row["spec"])
        if spec.depth > 0:
            if not await self._reclaim_slot(job_id):
                log.info("subagent %s waits for a free slot", job_id)
                return None
            if not await self.store.start_job(job_id, self.id):
                return None
        run = JobRun(self.services, job_id, row["session_id"], spec, transcript=row["transcript"])
        run.chain = row["chain"] or []
        return run

    async def _reclaim_slot(self, job_id: str) -> bool:
        """Keep the slot admission gave this subagent (or take a free one if it lapsed)."""
        now = int(time.time() * 1000)
        lease = int(self.settings.subagent_lease_s * 1000)
        limit = self.settings.max_concurrent_subagents
        return bool(
            await self.redis.eval(RECLAIM, 1, keys.SUBAGENTS_RUNNING, job_id, now, limit, lease)
        )

    async def _drive(self, run: JobRun) -> None:
        try:
            while True:
                try:
                    await run.run()
                    break
                except asyncio.CancelledError:
                    if run.job_id in self.steering:  # stop this turn's work, then go on
                        self.steering.discard(run.job_id)
                        asyncio.current_task().uncancel()  # type: ignore[union-attr]
                        await run.abandon_turn("the user steered the job elsewhere")
                        await asyncio.sleep(self.settings.steer_settle_s)
                        continue  # run() resumes; the steer message is the next input
                    if run.job_id in self.cancelling:
                        await run.abandon_turn("the job was cancelled")
                        await run.finish("cancelled", "", "cancelled by request")
                        break
                    with contextlib.suppress(aioredis.RedisError):
                        await run.flush()  # shutting down: what happened is still told
                    await self.redis.delete(keys.lease(run.job_id))
                    raise
        except (psycopg.OperationalError, aioredis.ConnectionError, aioredis.TimeoutError) as exc:
            # the database or Redis went away, or this process is too loaded to get a
            # connection in time: the job is not at fault, and its lease goes below, so the
            # recovery sweep resumes it from its transcript (here or elsewhere)
            log.warning(
                "job %s paused (%s: %s); resumed by recovery", run.job_id, type(exc).__name__, exc
            )
        except Exception as exc:
            log.exception("job %s crashed", run.job_id)
            await run.finish("failed", "", f"orchestrator error: {type(exc).__name__}: {exc}")
        finally:
            self.jobs.pop(run.job_id, None)
            self.children.discard(run.job_id)
            self.cancelling.discard(run.job_id)
            self.slots.release()
            if not run.finished:  # finish() gives the lease up with its last round trip
                await self.redis.delete(keys.lease(run.job_id))

    # -- background duties --------------------------------------------------------------

    async def check_in(self, keeper: LeaseKeeper) -> None:
        """Tell the lease keeper, every heartbeat interval, that this loop is alive."""
        while True:
            keeper.check_in()
            await asyncio.sleep(self.settings.heartbeat_interval_s)

    async def control(self) -> None:
        """Cancel requests, pushed on the control channel (a missed one is still seen: the
        loop checks the job's cancel key before every turn)."""
        while True:
            try:
                pubsub = self.redis.pubsub()
                await pubsub.subscribe(keys.CONTROL_CHANNEL)
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        self.on_control(json.loads(message["data"]))
            except aioredis.RedisError as exc:
                await retry_pause(exc, "control channel")

    def on_control(self, command: dict[str, Any]) -> None:
        if "approve" in command:
            self.approvals.on_answer(ApprovalAnswer.model_validate(command["approve"]))
            return
        if (job_id := command.get("cancel")) in self.jobs:
            self.cancelling.add(job_id)
            self.jobs[job_id].cancel()
        if (job_id := command.get("steer")) in self.jobs and job_id not in self.cancelling:
            self.steering.add(job_id)
            self.jobs[job_id].cancel()

    async def deliver_announcements(self) -> None:
        """Hand every due batch of announcements to its session: into the running job's
        inbox, or as a new job of the session when none runs."""
        while True:
            try:
                batches = await asyncio.to_thread(self.announcements.claim_due)
                for session, items in batches.items():
                    await self.deliver(session, items)
            except Exception as exc:  # the batch is due again shortly
                outage.report(log, "announce delivery", exc)
            await asyncio.sleep(ANNOUNCE_POLL_S)

    async def deliver(self, session: str, items: list[AnnounceItem]) -> None:
        text = batch_message(items)
        queue = self.announcements
        job_id = await asyncio.to_thread(queue.deliver, session, len(items), text)
        if job_id is None:
            latest = await self.store.latest_job(session)
            if latest is None or latest["status"] == "cancelled":
                log.info("announcements for %s dropped: its session is gone or cancelled", session)
                await asyncio.to_thread(queue.ack, session, len(items))
                return
            if latest["status"] in ("queued", "running"):  # about to start, or ending now:
                job_id = latest["id"]  # its next turn reads the inbox, or it hands it back
                args = (job_id, session, len(items), text)
                if await asyncio.to_thread(queue.deliver_to_job, *args):
                    return await self._announced(job_id, items)
                await asyncio.to_thread(queue.retry_soon, session)  # it has just ended
                return
            spec = JobSpec.model_validate(latest["spec"])
            script = (spec.script or {}).get("on_announce") if spec.model == "scripted" else None
            spec = spec.model_copy(update={"prompt": text, "script": script})
            # the same batch always makes the same job: a retried delivery adds nothing
            job_id = uuid.uuid5(uuid.NAMESPACE_URL, session + items[0].model_dump_json()).hex
            await self.store.create_job(job_id, session, spec)
            await asyncio.to_thread(
                self.app.send_task,
                AGENT_RUN_TASK,
                kwargs={"job_id": job_id},
                queue=AGENTS_QUEUE,
                task_id=job_id,
                parent_id=latest["id"],
            )
            await asyncio.to_thread(queue.ack, session, len(items))
        await self._announced(job_id, items)

    async def _announced(self, job_id: str, items: list[AnnounceItem]) -> None:
        children = [i.child for i in items if i.kind == "subagent"]
        data = {"to_job": job_id, "count": len(items), "children": children}
        ttl = self.settings.events_ttl_s
        for target in {job_id, *(i.parent_job for i in items if i.parent_job)}:
            await events.emit(
                self.redis, Event(type="announce_delivered", job_id=target, data=data), ttl
            )

    async def archive_children(self) -> None:
        """Finished subagents stop counting against their parent after the archive delay."""
        interval = min(60.0, self.settings.subagent_archive_after_s / 4)
        while True:
            await asyncio.sleep(interval)
            try:
                archived = await self.store.archive_finished_children(
                    self.settings.subagent_archive_after_s
                )
                for child, parent_session in archived:
                    await self.redis.srem(keys.subagent_children(parent_session), child)
            except Exception as exc:
                outage.report(log, "archiving subagents", exc)

    async def tick_cron(self) -> None:
        """The scheduler's ticker (orchestrator/cron_ticker.py): every orchestrator ticks,
        PostgreSQL makes each scheduled time start once."""
        from orchestrator.cron_ticker import Ticker

        ticker = Ticker(self.settings, self.app)
        try:
            while True:
                await asyncio.sleep(self.settings.cron_tick_s)
                try:
                    await asyncio.to_thread(ticker.tick)
                except Exception as exc:
                    outage.report(log, "cron tick", exc)
        finally:
            ticker.close()

    async def purge_artifacts(self) -> None:
        """Artifacts past their retention go, and the bytes no artifact uses any more."""
        from broker.artifacts import ArtifactStore
        from broker.store import Store

        def purge() -> int:
            store = Store(self.settings.database_url)
            try:
                return ArtifactStore(store.conn, self.settings).purge()
            finally:
                store.close()

        while True:
            await asyncio.sleep(ARTIFACT_PURGE_INTERVAL_S)
            try:
                if gone := await asyncio.to_thread(purge):
                    log.info("purged %d expired artifacts", gone)
            except Exception:
                log.exception("purging artifacts failed")

    async def recover(self) -> None:
        """Resume running jobs whose orchestrator stopped holding their lease, and queue
        again the agent runs a dead orchestrator had taken but not accepted; not while
        Redis has just come back (a missing presence then says nothing).

        The sweep reads PostgreSQL, so it runs every RECOVERY_INTERVAL_S; an orchestrator
        whose presence has just gone (seen every second, in Redis alone) brings it forward:
        its jobs are resumed within a second of its leases lapsing."""
        last, gone_before = 0.0, set[str]()
        while True:
            await asyncio.sleep(RECOVERY_CHECK_S)
            try:
                s = self.settings
                if not await outage.heartbeats_trusted(
                    self.redis, s.heartbeat_interval_s, s.heartbeat_ttl_s
                ):  # Redis has just come back: every presence lapsed, and is beating again
                    continue
                gone = await self._gone_orchestrators()
                now = time.monotonic()
                due = now - last >= RECOVERY_INTERVAL_S or bool(gone - gone_before)
                gone_before = gone
                if not due:
                    continue
                last = now
                await self.agent_queue.restore_dead()
                for job_id in await self._orphans():
                    if await self.accept(job_id):
                        log.warning("resumed job %s: no live orchestrator held it", job_id)
            except Exception as exc:
                outage.report(log, "recovery sweep", exc)

    async def _gone_orchestrators(self) -> set[str]:
        """Orchestrators known to take agent runs whose presence is gone."""
        takers = sorted(
            t.decode() if isinstance(t, bytes) else str(t)
            for t in await self.redis.smembers(keys.AGENTS_TAKERS)
        )
        async with self.redis.pipeline(transaction=False) as pipe:
            for taker in takers:
                pipe.exists(keys.proc(taker))
            alive = await pipe.execute()
        return {t for t, live in zip(takers, alive, strict=True) if not live}
