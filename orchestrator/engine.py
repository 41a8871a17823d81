"""The orchestrator process: takes agent runs off the `agents` queue and drives them all
on one asyncio event loop.

The `agents` queue is consumed on the loop too (broker/redis/agent_queue.py: a reliable list,
taken in batches), as is everything else: model streams, tool dispatch, outcomes,
PostgreSQL.
Each running job holds a lease in Redis, refreshed by this process's heartbeat thread
(orchestrator/services/leases.py) while the loop is alive: a job whose orchestrator died loses its
lease within seconds and is resumed by another orchestrator from its transcript.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from typing import Any

import psycopg
import redis.asyncio as aioredis
from celery import Celery

from broker import keys
from broker.celery.app import create_app
from broker.config.settings import Settings
from broker.obs import metrics, tracing
from broker.pg.store import AsyncStore
from broker.protocol import AGENTS_QUEUE, FINAL_STATUSES, Group, JobSpec
from broker.redis.admission import reclaim_slot
from broker.redis.agent_queue import AgentQueue, AgentRun
from broker.redis.announce import AnnounceQueue
from broker.redis.connections import async_redis, patient_redis, retry_pause
from broker.redis.presence import process_id
from broker.redis.ratelimit import RateLimiter
from orchestrator.calls.approvals import ApprovalAnswer, Approvals
from orchestrator.calls.dispatch import Dispatcher
from orchestrator.calls.hooks import Hooks
from orchestrator.calls.policy import PolicyEngine
from orchestrator.job.run import JobRun
from orchestrator.job.state import Services
from orchestrator.job.tools import CustomCatalog
from orchestrator.live import LiveSettings
from orchestrator.providers.http import model_client
from orchestrator.services.announce import AnnounceDelivery
from orchestrator.services.artifacts import ArtifactPurge
from orchestrator.services.control import ControlChannel, Heard
from orchestrator.services.cron import CronService
from orchestrator.services.leases import LeaseKeeper, Leases
from orchestrator.services.recovery import Recovery
from orchestrator.services.requests import RequestExpiry
from orchestrator.services.service import Service
from orchestrator.services.subagents import SubagentArchive
from orchestrator.services.task_events import AgentTaskEvents
from workers.confine.host import contains
from workers.registry import Registry, default_registry

log = logging.getLogger("clawq.orchestrator")

ACCEPT_WINDOW = 1000  # agent runs being accepted at once (unacked on the agents queue)


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
        self.claimed: set[str] = set()  # leased here, its task not begun (`_drive`)
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
        http = model_client(self.settings.model_timeout_s, self.settings.model_connections)
        self.dispatcher = Dispatcher(self.app, self.redis, self.settings, self.id)
        self.approvals = Approvals(self.redis)
        self.heard = Heard(self.settings.turn_check_s)
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
            contained=contains(self.settings),
            heard=self.heard,
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
        self.duties: list[Service] = [
            Leases(keeper, self.settings.heartbeat_interval_s),
            ControlChannel(self.redis, self.on_control, self.heard),
            Recovery(
                self.settings, self.store, self.redis, queue, self.id, self.running, self.accept
            ),
            AnnounceDelivery(self.settings, self.store, self.redis, self.app, self.announcements),
            SubagentArchive(self.settings, self.store, self.redis),
            ArtifactPurge(self.settings),
            CronService(self.settings, self.app),
            RequestExpiry(self.store, self.app),
        ]
        for duty in self.duties:
            await duty.start()
        listening = [
            asyncio.create_task(self.dispatcher.listen(listen_redis)),
            asyncio.create_task(self.dispatcher.watchdog()),
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
            listening[1].cancel()
            # bounded: redis-py can lose a cancellation that lands in a blocking read
            await asyncio.wait(listening, timeout=3)
            with contextlib.suppress(aioredis.RedisError):
                await queue.give_back()  # what it took and did not start: for the others
            for duty in reversed(self.duties):  # the leases last: its presence goes
                await duty.stop()
            await http.aclose()
            await self.store.close()
            await self.redis.aclose()
            await listen_redis.aclose()
            await agents_redis.aclose()
            self.announcements.client.close()
            self.services.task_events.close()

    def running(self) -> list[str]:
        """The jobs this orchestrator drives or is starting."""
        return [*self.jobs, *self.accepting, *self.claimed]

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
            if run is None:
                self.claimed.discard(job_id)
                await self.redis.delete(keys.lease(job_id))
                self.slots.release()
        return run

    async def _start(self, job_id: str, chain: list[Any] | None) -> JobRun | None:
        row = await self.store.accept_job(job_id, self.id, chain)
        if row is None:
            log.error("agent run for unknown job %s dropped", job_id)
            return None
        if row["status"] in FINAL_STATUSES or row["status"] == "waiting":
            return None  # over, or parked: the answer to its last request queues it again
        spec = JobSpec.stored(row["spec"])
        if spec.depth > 0:
            if not await reclaim_slot(self.redis, job_id, self.settings):
                log.info("subagent %s waits for a free slot", job_id)
                return None
            if not await self.store.start_job(job_id, self.id):
                return None
        run = JobRun(self.services, job_id, row["session_id"], spec, transcript=row["transcript"])
        run.chain = row["chain"] or []
        return run

    async def _drive(self, run: JobRun) -> None:
        self.claimed.discard(run.job_id)  # begun: a cancel now reaches the cleanup below
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
                    await run.let_go()  # shutting down: its write lands, its events go
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
            self.heard.handed.discard(run.job_id)
            self.slots.release()
            if not run.finished:  # finish() gives the lease up with its last round trip
                await self.redis.delete(keys.lease(run.job_id))

    # -- commands from the control channel ---------------------------------------------

    def on_control(self, command: dict[str, Any]) -> None:
        """A job's task is cancelled only once begun: one cancelled before its first step never
        runs its cleanup. A job not begun (`claimed`) reads its cancel and steer at its start."""
        if "approve" in command:
            self.approvals.on_answer(ApprovalAnswer.model_validate(command["approve"]))
        elif (job_id := command.get("inbox")) in self.jobs:  # its next turn reads it
            self.heard.handed.add(job_id)
        elif (job_id := command.get("cancel")) in self.jobs:
            self.cancelling.add(job_id)
            if job_id not in self.claimed:
                self.jobs[job_id].cancel()
        elif (job_id := command.get("steer")) in self.jobs:
            if job_id in self.cancelling or job_id in self.claimed:
                return
            self.steering.add(job_id)
            self.jobs[job_id].cancel()
