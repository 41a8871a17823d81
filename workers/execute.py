"""Worker-side execution of one call: re-check, run once, record, push back.

The queue is a trust boundary: the worker validates the input again and the tool enforces
its own intrinsic rules (containment, limits). The ledger makes a redelivered call harmless:
a call whose outcome is recorded is answered from the ledger, never run twice.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import redis
from celery import Celery

from broker import keys, outage
from broker.celery.app import create_app
from broker.config.settings import Settings
from broker.obs import tracing
from broker.pg.store import Store
from broker.protocol import CallEnvelope, CallOutcome
from broker.redis.ledger import Ledger
from broker.redis.presence import Heartbeat, process_id
from workers.confine import host as confine
from workers.confine.sandbox import Sandbox
from workers.outcomes import Claim, Claiming, Outcomes, call_key, count
from workers.registry import Registry
from workers.scrub import Scrubber, scrub_logs, secrets_of
from workers.tool import NotClaimed, ToolContext, ToolError, ToolResult
from workers.upkeep import Upkeep

log = logging.getLogger("clawq.worker")

RAN_AGAIN = (
    "[ran again after its worker died; its first run may have taken effect: check before "
    "repeating it]\n"
)


@dataclass
class WorkerRuntime(Upkeep, Claiming):
    """What one executing process holds: its identity, Redis, ledger, heartbeat."""

    settings: Settings
    registry: Registry
    queue: str
    proc_id: str
    redis: redis.Redis
    ledger: Ledger
    heartbeat: Heartbeat
    scrub: Scrubber
    outcomes: Outcomes
    sandbox: Sandbox | None = None
    base_settings: Settings | None = None  # the environment's, under the live configuration
    config_version: int = -1  # the live configuration's change counter when last loaded
    held: dict[str, float] = field(default_factory=dict)  # calls taken here, not yet recorded
    _store: Store | None = None
    _celery: Celery | None = None
    _reloading: threading.Lock = field(default_factory=threading.Lock)
    claims: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="clawq-claim")
    )
    _retry_at: float = 0.0

    @classmethod
    def start(
        cls, settings: Settings, registry: Registry, queue: str, node: str, threads: int = 1
    ) -> WorkerRuntime:
        client = redis_for(settings, threads)
        proc_id = process_id("worker", settings.node())
        queues = queue.split(",")  # a worker of several light groups consumes each
        info: dict[str, Any] = {"kind": "worker", "queue": queue, "queues": queues, "node": node}
        if "runtime" in queues:
            info["confinement"] = confine.describe(confine.for_settings(settings))
        trust = outage.trust_after_s(settings.heartbeat_interval_s, settings.heartbeat_ttl_s)
        ledger = Ledger(client, settings.ledger_ttl_s, trust)
        outcomes = Outcomes(ledger, client, settings.spool_dir, settings.outage_retry_s)
        held: dict[str, float] = {}
        heartbeat = Heartbeat(
            client,
            proc_id,
            info,
            settings.heartbeat_interval_s,
            settings.heartbeat_ttl_s,
            node=settings.node(),
            also=tuple(keys.consumer(f"{q}.{settings.node()}") for q in queues),
            # what it holds: taken, running, or waiting to be recorded (here or spooled)
            state=lambda: {"calls": [*held, *outcomes.spooled()]},
        )
        heartbeat.start()
        tracing.setup(settings.otlp_endpoint, f"worker-{queue}")  # per process: after the fork
        scrub = Scrubber(secrets_of(settings))
        runtime = cls(
            settings, registry, queue, proc_id, client, ledger, heartbeat, scrub, outcomes
        )
        runtime.held = held
        runtime.base_settings = settings
        runtime.claims = ThreadPoolExecutor(threads, thread_name_prefix="clawq-claim")
        scrub_logs(lambda: runtime.scrub)  # what this process logs is scrubbed as results are
        outcomes.start_replaying()
        from broker.config import live as live_config
        from broker.redis.changes import Listener

        # live configuration (web domain lists, channels, …) reaches this process within
        # moments, and each call's claim reads its counter too (`follow_config`)
        Listener(settings.redis_url, [live_config.TOPIC], runtime.reload_settings).start()
        runtime.reload_settings()  # what was applied before this process began
        threading.Thread(
            target=outcomes.claim_long_reads,
            args=(settings.read_claim_after_s,),
            name="clawq-claims",
            daemon=True,
        ).start()
        if "runtime" in queues:
            threading.Thread(
                target=runtime.end_sessions, name="clawq-sessions", daemon=True
            ).start()
        if settings.sandbox_enabled:
            runtime.sandbox = Sandbox(settings, on_use=runtime.sandbox_used)
            threading.Thread(
                target=runtime.reap_sandboxes, name="clawq-reaper", daemon=True
            ).start()
        return runtime

    def hold(self, job_id: str, turn: int, call_id: str) -> str:
        """This process has the call (taken from its queue): its heartbeat says so."""
        key = call_key(job_id, turn, call_id)
        self.held.setdefault(key, time.time())
        return key

    def run_call(self, envelope: CallEnvelope, queue: str = "") -> CallOutcome | None:
        """Execute (or answer from the ledger) and push the outcome; None if skipped.
        `queue`: the one it came from (a worker may consume several).

        The call is listed as held from here until its outcome is recorded (or spooled),
        so a watchdog that finds it "running" under this live process but not held knows
        it was dropped (the task raised, its thread died) and sends it again."""
        key = self.hold(envelope.job_id, envelope.turn, envelope.call_id)
        try:
            return self._run_call(envelope, queue)
        finally:
            self.held.pop(key, None)

    def _run_call(self, envelope: CallEnvelope, queue: str = "") -> CallOutcome | None:
        """A read's first delivery runs before its claim, which then goes with its outcome
        (running it twice changes nothing); any other call, and a read sent again (its
        runner died: it may be what kills them), runs only once the ledger has said it
        may. Redis away at any step is waited for: the claim, the answer, the outcome."""
        queue = queue or self.queue
        claim: Claim = (
            envelope.job_id,
            envelope.turn,
            envelope.call_id,
            self.proc_id,
            envelope.max_deliveries,
            time.time(),
        )
        ahead: ToolResult | None = None
        ran: ToolResult | None = None
        if self.runs_ahead(envelope):
            found = self.run_ahead(envelope, claim, queue)
            if isinstance(found, CallOutcome):
                return found
            begun, ahead = found
        elif self.waits_for_claim(envelope):
            begun, ran = self.run_claiming(envelope, claim)
        else:
            begun = self.claim_when_stored(envelope, claim)
        if self.follow_config(begun.config_version):  # moved: a read ahead ran under the old
            ahead = None
        if ran is not None:  # (it acted once the claim let it)
            ahead = ran
        started = time.time()
        if begun.verdict == "done":
            self.outcomes.push(envelope.reply_to, begun.detail)  # a lost reply is re-sent
            return None
        if begun.verdict == "void":
            log.info("call %s: its turn was not stored; not run", envelope.call_id)
            return None
        if begun.verdict == "busy":
            log.info("call %s is running on live %s; skipped", envelope.call_id, begun.detail)
            return None
        attempts = int(begun.detail)
        if begun.verdict == "exhausted":
            result = ToolResult.error(
                f"{envelope.tool} was abandoned: the process running it died {begun.detail} "
                "times. Do not retry it unchanged.",
                abandoned=True,
            )
            self.dead_letter(envelope, attempts)
        elif ahead is not None and not begun.cancelled:
            result = ahead
        else:
            result = self.traced(envelope, begun.cancelled)
        if begun.again and not self.is_read(envelope) and not begun.cancelled:
            result = result.model_copy(update={"for_llm": RAN_AGAIN + result.for_llm})
        outcome = self.outcome(envelope, result, queue, attempts, started)
        count(envelope, outcome)
        self.outcomes.record(
            envelope.job_id,
            envelope.turn,
            envelope.call_id,
            envelope.reply_to,
            outcome.model_dump_json(),
        )
        return outcome

    def outcome(
        self, envelope: CallEnvelope, result: ToolResult, queue: str, attempts: int, started: float
    ) -> CallOutcome:
        """The call's outcome as it leaves the worker (scrubbed)."""
        return CallOutcome(
            call_id=envelope.call_id,
            job_id=envelope.job_id,
            turn=envelope.turn,
            for_llm=self.scrub(result.for_llm),  # secrets never leave the worker
            for_user=self.scrub(result.for_user),
            is_error=result.is_error,
            metadata=self.scrub.values(result.metadata),
            queue=queue,
            worker=self.proc_id,
            attempts=attempts,
            started_at=started,
        )

    def traced(
        self,
        envelope: CallEnvelope,
        revoked: str = "",
        claimed: Callable[[], None] | None = None,
        rests_on: dict[str, str] | None = None,
    ) -> ToolResult:
        with tracing.span(
            f"execute {envelope.tool}",
            {"clawq.job": envelope.job_id, "clawq.call": envelope.call_id},
            parent=envelope.trace,
        ):
            return self.execute(envelope, revoked, claimed, rests_on)

    def dead_letter(self, envelope: CallEnvelope, attempts: int) -> None:
        """The call used up its deliveries: keep it, with its envelope, for `clawq dlq`.
        The model still gets its error result; a failure here must not lose that."""
        from broker.stores.dead_letters import DeadLetters

        try:
            DeadLetters(self.store().conn).exhausted(
                envelope,
                self.queue,
                envelope.task or f"clawq.tool.{envelope.tool}",
                attempts,
                f"its process died on each of {attempts} deliveries",
            )
        except Exception as exc:
            log.error("dead letter for call %s not stored: %s", envelope.call_id, exc)

    def undecodable(self, body: Any, task: str, reason: str) -> None:
        """A message that is not an envelope: kept as it came, never retried."""
        from broker.stores.dead_letters import DeadLetters

        try:
            DeadLetters(self.store().conn).undecodable(body, self.queue, task, reason)
        except Exception as exc:
            log.error("dead letter for an undecodable %s not stored: %s", task, exc)

    def execute(
        self,
        envelope: CallEnvelope,
        revoked: str = "",
        claimed: Callable[[], None] | None = None,
        rests_on: dict[str, str] | None = None,
    ) -> ToolResult:
        """Run the tool unless it expired or was revoked (`revoked`: the cancel flag the
        ledger's begin read) while it waited in the queue (`claimed`: the claim it waits
        for itself, NotClaimed passing through; `rests_on`: a read's before its claim)."""
        if time.time() > envelope.deadline:
            return ToolResult.error(f"{envelope.tool} expired in the queue before a worker took it")
        if revoked:
            return ToolResult.error(f"{envelope.tool} was not run: {revoked}", cancelled=True)
        cancelled = cancel_check(self.redis, envelope)
        ctx = ToolContext(
            context=envelope.context,
            settings=self.settings,
            job_id=envelope.job_id,
            call_id=envelope.call_id,
            turn=envelope.turn,
            session_id=envelope.session_id,
            sandbox=self.sandbox,
            store=self.store,
            redis=self.redis,
            celery=self.celery,
            cancelled=cancelled,
            proc_id=self.proc_id,
            scrub=self.scrub,
            rests_on=rests_on,
        )
        if claimed is not None:
            ctx.claimed = claimed
        return run_tool(self.registry, envelope.tool, envelope.input, ctx)

    def store(self) -> Store:
        """This process's PostgreSQL connection, opened on first use."""
        if self._store is None:
            self._store = Store(self.settings.database_url)
        return self._store

    def celery(self) -> Celery:
        """A Celery app for sending task graphs (subagents), made on first use."""
        if self._celery is None:
            self._celery = create_app(self.settings)
        return self._celery

    def stop(self) -> None:
        self.outcomes.stopped.set()
        self.heartbeat.stop()


def run_tool(registry: Registry, name: str, raw_input: Any, ctx: ToolContext) -> ToolResult:
    """Validate and run one tool; every failure becomes an error result for the model."""
    parsed = registry.parse(name, raw_input, ctx.context.agent_id)
    if isinstance(parsed, ToolResult):
        return parsed
    tool, args = parsed
    try:
        return tool.run(args, ctx)
    except NotClaimed:
        raise  # not the tool's failure: the ledger's verdict says what follows
    except ToolError as exc:
        return ToolResult.error(str(exc))
    except Exception as exc:  # a tool bug or a time limit: the model still gets an answer
        if outage.down(exc):  # not the call's fault, and it passes: say so
            which = "Redis" if outage.redis_down(exc) else "PostgreSQL"
            log.warning("tool %s: %s away (%s)", name, which, exc)
            return ToolResult.error(
                f"{name} failed: {which} is unreachable right now (temporary); "
                "try the call again in a few seconds",
                retryable=True,
            )
        log.exception("tool %s failed", name)
        return ToolResult.error(f"{name} failed: {type(exc).__name__}: {exc}")


def cancel_check(client: redis.Redis, envelope: CallEnvelope) -> Callable[[], str | None]:
    """Why this call must stop now (its job was cancelled, or the call itself), or None.
    Tools poll it while they run; it is one Redis round trip."""
    names = [
        keys.cancel(envelope.job_id),
        keys.cancel_call(envelope.job_id, envelope.turn, envelope.call_id),
    ]

    def cancelled() -> str | None:
        try:
            found = client.mget(names)
        except redis.RedisError:
            return None
        reason = next((r for r in found if r), None)
        return reason.decode() if isinstance(reason, bytes) else reason

    return cancelled


_runtime: WorkerRuntime | None = None


def stop_runtime() -> None:
    """Remove this process's presence at a clean exit (a crash lets it expire)."""
    if _runtime is not None and _runtime.heartbeat.info["pid"] == os.getpid():
        _runtime.stop()


def runtime_for_process(
    settings: Settings, registry: Registry, queue: str, node: str, threads: int = 1
) -> WorkerRuntime:
    """This process's runtime, created once after fork (never inherited from a parent)."""
    global _runtime
    if _runtime is None or _runtime.heartbeat.info["pid"] != os.getpid():
        _runtime = WorkerRuntime.start(settings, registry, queue, node, threads)
    return _runtime


CONNECTIONS_PER_CALL = 2  # a call's claim and outcome, and the tool's own use
SPARE_CONNECTIONS = 8  # the process's threads: sessions, sandboxes, the spool
CONNECTION_WAIT_S = 10.0  # then the wait is an outage: retried, never a lost call


def redis_for(settings: Settings, threads: int) -> redis.Redis:
    """This process's client: a pool sized for the calls it runs at once, where a caller
    that finds none free waits (redis-py's default pool raises "Too many connections" at
    100, and a web worker of 100 threads lost calls to it); a wait past
    CONNECTION_WAIT_S raises a ConnectionError, which the outcome's retries treat as Redis
    away."""
    pool = redis.BlockingConnectionPool.from_url(
        settings.redis_url,
        max_connections=CONNECTIONS_PER_CALL * threads + SPARE_CONNECTIONS,
        timeout=CONNECTION_WAIT_S,
    )
    return redis.Redis(connection_pool=pool)
