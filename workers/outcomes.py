"""An outcome is never dropped: recorded in the ledger whatever it takes.

`Ledger.finish` records a call's outcome and pushes it to its orchestrator in one step.
When Redis is away at that moment, the outcome is kept: retried with a backoff (a second
at most between tries) for `outage_retry_s`, while this process takes no other call. What
still cannot be recorded is written to the spool (`spool_dir`, one file per call, fsynced)
and replayed when Redis answers again: at the process's start and every few seconds. While
an outcome waits, in memory or in the spool, the call is listed in this host's heartbeats
as held, so no watchdog sends it again.

A claim (`begin`) and a repeat's answer are retried the same way: the message was taken
off its queue, and only this process knows of it.

A read runs before its claim, which then goes with its outcome in one step
(`begin_finish`); while it runs it is listed as `unclaimed`, and one still running after
`read_claim_after_s` is claimed on its own (`claim_long_reads`), so the ledger says who
runs it as for any call. A tool that `waits_for_claim` runs while its claim is out, and
acts only once the verdict lets it (`Claiming`, the part of the worker's runtime that says
when a call runs against its claim).

Such a call may be sent while its turn is being stored (`CallEnvelope.gate`): it runs up to
its first effect meanwhile, and is claimed, and acts, only once the turn is stored, so a
turn is stored before any of its effects acts (`claim_when_stored`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg
import redis

from broker import keys, outage
from broker.obs.metrics import metrics
from broker.pg.store import Store
from broker.protocol import CallEnvelope, CallOutcome
from broker.redis.ledger import Begin, Ledger
from workers.registry import Registry
from workers.tool import NotClaimed, SideEffect, Tool, ToolResult

log = logging.getLogger("clawq.outcomes")

REPLAY_EVERY_S = 2.0
GATE_WAIT_S = 2  # a turn's gate shut this long: its call is looked for in the transcript
STORED_INPUT = "SELECT input FROM tool_calls WHERE job_id = %s AND turn = %s AND call_id = %s"


Claim = tuple[str, int, str, str, int, float]  # job, turn, call, process, max deliveries, now


def call_key(job_id: str, turn: int, call_id: str) -> str:
    """How heartbeats name a call they hold (the ledger key without its prefix)."""
    return f"{job_id}:{turn}:{call_id}"


@dataclass
class Unclaimed:
    """A read running before its claim; `verdict`: its claim's answer, once it ran long."""

    claim: Claim
    since: float
    verdict: Future[Begin] | None = None


class Outcomes:
    """Claims and outcomes of one process, retried through an outage, spooled past it."""

    def __init__(self, ledger: Ledger, client: redis.Redis, spool_dir: str, retry_s: float) -> None:
        self.ledger, self.client = ledger, client
        self.spool = Path(spool_dir)
        self.retry_s = retry_s
        self.stopped = threading.Event()
        self.unclaimed: dict[str, Unclaimed] = {}
        self._unclaimed_lock = threading.Lock()

    def begin(self, claim: Claim, gate: str = "") -> Begin:
        """The ledger's verdict, waiting for Redis if it is away (the same claim sent again
        gets the same answer); `gate`: only if its turn is stored (`Ledger.begin`)."""
        try:  # the common case costs no retry machinery
            return self.ledger.begin(*claim, gate)
        except redis.RedisError as exc:
            if not outage.redis_down(exc):
                raise
        for attempt in outage.retrying("claiming a call", self.retry_s, outage.redis_down):
            with attempt:
                return self.ledger.begin(*claim, gate)
        raise AssertionError("unreachable")

    def begin_finish(
        self,
        claim: Claim,
        version: int,
        reply_to: str,
        outcome_json: str,
        rests_on: dict[str, str] | None = None,
    ) -> Begin:
        """Claim a read that ran with its outcome: "recorded" when that claim was its first
        and what it rests on did not move, else the verdict. Redis away: the claim alone
        is waited for (a result that rests on values is then taken as moved), and the
        outcome recorded after it as for any call."""
        try:
            return self.ledger.begin_finish(*claim, version, reply_to, outcome_json, rests_on)
        except redis.RedisError as exc:
            if not outage.redis_down(exc):
                raise
        return replace(self.begin(claim), moved=bool(rests_on))

    @contextlib.contextmanager
    def running_unclaimed(self, claim: Claim) -> Iterator[Unclaimed]:
        """A read runs unclaimed for the length of the block (held all along: the
        heartbeat lists it)."""
        key, running = call_key(*claim[:3]), Unclaimed(claim, time.time())
        with self._unclaimed_lock:
            self.unclaimed[key] = running
        try:
            yield running
        finally:
            with self._unclaimed_lock:
                self.unclaimed.pop(key, None)

    def claim_long_reads(self, after: float) -> None:
        """Claim each read still running unclaimed after `after` seconds: from then on the
        ledger says who runs it (the watchdog sees it running), and its outcome is
        recorded on its own when it ends. Runs on its own thread until stopped."""
        while not self.stopped.wait(after / 2):
            now = time.time()
            with self._unclaimed_lock:
                due = [
                    u
                    for u in self.unclaimed.values()
                    if u.verdict is None and now - u.since >= after
                ]
                for u in due:
                    u.verdict = Future()
            for u in due:
                assert u.verdict is not None
                try:  # waits for a Redis that is away, as any claim does
                    u.verdict.set_result(self.begin(u.claim))
                except BaseException as exc:
                    u.verdict.set_exception(exc)

    def push(self, reply_to: str, outcome_json: str) -> None:
        """A repeat's answer, read from the ledger, pushed to its orchestrator again."""
        try:
            self.client.lpush(reply_to, outcome_json)
            return
        except redis.RedisError as exc:
            if not outage.redis_down(exc):
                raise
        for attempt in outage.retrying("answering a repeat", self.retry_s, outage.redis_down):
            with attempt:
                self.client.lpush(reply_to, outcome_json)

    def record(
        self, job_id: str, turn: int, call_id: str, reply_to: str, outcome_json: str
    ) -> None:
        """Record and push the outcome; spooled when Redis stays away past the cap."""
        try:
            self.ledger.finish(job_id, turn, call_id, reply_to, outcome_json)
            return
        except redis.RedisError as exc:
            if not outage.redis_down(exc):
                raise
        try:
            for attempt in outage.retrying("recording an outcome", self.retry_s, outage.redis_down):
                with attempt:
                    self.ledger.finish(job_id, turn, call_id, reply_to, outcome_json)
        except redis.RedisError as exc:
            log.error("outcome of call %s not recorded (%s): spooled", call_id, exc)
            self.write(job_id, turn, call_id, reply_to, outcome_json)

    # -- the spool -----------------------------------------------------------------------

    def _file(self, job_id: str, turn: int, call_id: str) -> Path:
        name = hashlib.sha256(call_key(job_id, turn, call_id).encode()).hexdigest()[:32]
        return self.spool / f"{name}.json"

    def write(self, job_id: str, turn: int, call_id: str, reply_to: str, outcome_json: str) -> None:
        entry = {
            "job_id": job_id,
            "turn": turn,
            "call_id": call_id,
            "reply_to": reply_to,
            "outcome": outcome_json,
        }
        try:
            self.spool.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.spool, prefix=".", suffix=".tmp")
            with os.fdopen(fd, "w") as fh:
                json.dump(entry, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self._file(job_id, turn, call_id))
        except OSError as exc:  # nowhere to keep it: say so loudly, with what was lost
            log.critical("outcome of call %s lost: the spool is unusable (%s)", call_id, exc)

    def spooled(self) -> list[str]:
        """The calls whose outcome waits in the spool (heartbeats list them as held)."""
        found = []
        for path in self._entries():
            with contextlib.suppress(OSError, ValueError, KeyError):
                entry = json.loads(path.read_text())
                found.append(call_key(entry["job_id"], entry["turn"], entry["call_id"]))
        return found

    def _entries(self) -> list[Path]:
        try:
            return sorted(self.spool.glob("*.json"))
        except OSError:
            return []

    def replay(self) -> int:
        """Record what the spool holds (any process of this host may); how many."""
        done = 0
        for path in self._entries():
            try:
                entry = json.loads(path.read_text())
            except FileNotFoundError:  # a sibling process replayed it
                continue
            except (OSError, ValueError) as exc:
                log.error("unreadable spool entry %s left in place: %s", path.name, exc)
                continue
            try:
                self.ledger.finish(
                    entry["job_id"],
                    entry["turn"],
                    entry["call_id"],
                    entry["reply_to"],
                    entry["outcome"],
                )
            except redis.RedisError:
                return done  # still away: the next round
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            log.warning("spooled outcome of call %s recorded", entry["call_id"])
            done += 1
        return done

    def start_replaying(self) -> None:
        """Replay now, then every few seconds while anything is spooled."""
        self.replay()
        threading.Thread(target=self._replaying, name="clawq-spool", daemon=True).start()

    def _replaying(self) -> None:
        while not self.stopped.wait(REPLAY_EVERY_S):
            try:
                if self._entries():
                    self.replay()
            except Exception:
                log.exception("replaying the spool failed; trying again shortly")


def count(envelope: CallEnvelope, outcome: CallOutcome) -> None:
    """The metrics of a call whose outcome is final."""
    m, started = metrics(), outcome.started_at
    if envelope.sent_at:
        m.queue_wait.labels(outcome.queue).observe(max(0.0, started - envelope.sent_at))
    if outcome.attempts > 1:
        m.redeliveries.labels(outcome.queue).inc()
    m.calls.labels(envelope.tool, "error" if outcome.is_error else "ok").inc()
    m.call_seconds.labels(envelope.tool).observe(time.time() - started)


class Claiming:
    """When a call runs against its claim: after the verdict (any call), before it (a
    read's first delivery, claimed with its outcome), or beside it (a tool that
    `waits_for_claim`, acting only once the verdict lets it). A part of `WorkerRuntime`."""

    registry: Registry
    outcomes: Outcomes
    claims: ThreadPoolExecutor
    config_version: int

    def store(self) -> Store:
        raise NotImplementedError

    def traced(
        self,
        envelope: CallEnvelope,
        revoked: str = "",
        claimed: Callable[[], None] | None = None,
        rests_on: dict[str, str] | None = None,
    ) -> ToolResult:
        raise NotImplementedError

    def outcome(
        self, envelope: CallEnvelope, result: ToolResult, queue: str, attempts: int, started: float
    ) -> CallOutcome:
        raise NotImplementedError

    def run_ahead(
        self, envelope: CallEnvelope, claim: Claim, queue: str
    ) -> CallOutcome | tuple[Begin, ToolResult | None]:
        """Run a read, then claim it with its outcome: the outcome when that recorded it
        (one round trip), else the claim's verdict and the result (None: what the result
        rests on, `ToolContext.rests_on`, may have moved, so it runs again)."""
        version, started, rests_on = self.config_version, time.time(), dict[str, str]()
        with self.outcomes.running_unclaimed(claim) as running:
            result = self.traced(envelope, rests_on=rests_on)
        if running.verdict is not None:  # it ran long, and was claimed meanwhile
            return running.verdict.result(), None if rests_on else result
        outcome = self.outcome(envelope, result, queue, 1, started)
        begun = self.outcomes.begin_finish(
            claim, version, envelope.reply_to, outcome.model_dump_json(), rests_on
        )
        if begun.verdict == "recorded":
            count(envelope, outcome)
            return outcome
        return begun, None if begun.moved else result

    def run_claiming(self, envelope: CallEnvelope, claim: Claim) -> tuple[Begin, ToolResult | None]:
        """Run a tool that `waits_for_claim` while its claim is out: the verdict, and the
        result if the claim let it act (its run waited for the verdict at
        `ToolContext.claimed`). Claimed meanwhile on a thread of the process's own; a call
        sent while its turn was being stored, at its first effect (its checkpoint stored by
        then), in one step with the look at its turn's gate."""
        verdict: Callable[[], Begin]
        if envelope.gate:
            verdict = functools.cache(lambda: self.claim_when_stored(envelope, claim))
        else:
            verdict = self.claims.submit(self.outcomes.begin, claim).result

        def lets_it_act() -> bool:
            begun = verdict()
            return begun.verdict == "run" and not begun.cancelled

        def claimed() -> None:
            if not lets_it_act():
                raise NotClaimed(verdict().verdict)

        try:
            result = self.traced(envelope, claimed=claimed)
        except NotClaimed:
            return verdict(), None
        # (a run that failed before it asked: the verdict decides, once its turn is stored)
        return verdict(), result if lets_it_act() else None

    def claim_when_stored(self, envelope: CallEnvelope, claim: Claim) -> Begin:
        """The ledger's verdict, claimed only once the call's turn is stored: a call sent
        while it was being stored is claimed at once if its turn's gate is open, else once
        `opened` says the turn is stored; "void" (nothing claimed) if it never is."""
        if not envelope.gate:
            return self.outcomes.begin(claim)
        begun = self.outcomes.begin(claim, gate=envelope.gate)
        if begun.verdict != "shut":
            return begun
        if self.opened(envelope):
            return self.outcomes.begin(claim)
        return Begin("void", "its turn was not stored")

    def opened(self, envelope: CallEnvelope) -> bool:
        """Whether the turn of a call sent while it was being stored is stored: its gate,
        which the orchestrator opens once the write has committed, is waited on (and left
        open for a delivery after this one). A gate still shut after GATE_WAIT_S (the
        orchestrator died before its write committed, the write failed, Redis lost the
        key) is answered by the transcript: the call acts if it is stored with this input.
        Else it never does; if its turn is stored later all the same, the watchdog finds
        this delivery gone unclaimed and sends the call again."""
        key = keys.turn_gate(envelope.gate)
        call = (envelope.job_id, envelope.turn, envelope.call_id)
        while True:
            try:
                if self.outcomes.client.blmove(key, key, GATE_WAIT_S, "RIGHT", "LEFT"):
                    return True
            except redis.RedisError as exc:  # as long as a shut gate is waited on
                log.warning("call %s: its turn's gate unread (%s)", envelope.call_id, exc)
                time.sleep(GATE_WAIT_S)
            try:
                stored = self.store().conn.execute(STORED_INPUT, call).fetchone()
            except psycopg.Error as exc:  # PostgreSQL away as well: looked at again
                log.warning("call %s: its turn unread (%s)", envelope.call_id, exc)
                if time.time() > envelope.deadline:
                    return False
                time.sleep(GATE_WAIT_S)
                continue
            return stored is not None and stored["input"] == envelope.input

    def first_delivery(self, envelope: CallEnvelope) -> Tool[Any] | None:
        """The call's declared tool, on its first delivery and not yet expired: only then
        may it run before its verdict, or beside it."""
        if envelope.resent or time.time() > envelope.deadline:
            return None
        return self.registry.declared(envelope.tool)

    def waits_for_claim(self, envelope: CallEnvelope) -> bool:
        """Whether the call's tool runs while its claim is out (`Tool.waits_for_claim`)."""
        tool = self.first_delivery(envelope)
        return tool is not None and tool.waits_for_claim

    def is_read(self, envelope: CallEnvelope) -> bool:
        tool = self.registry.declared(envelope.tool)
        return tool is not None and tool.side_effect == SideEffect.read

    def runs_ahead(self, envelope: CallEnvelope) -> bool:
        """Whether the call may run before the ledger's verdict: a declared read that does
        not reach the network (the verdict says which live configuration is in force)."""
        tool = self.first_delivery(envelope)
        return tool is not None and tool.side_effect == SideEffect.read and not tool.uses_egress
