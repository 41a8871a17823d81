"""A job's state as its run holds it, and its events: what every part of the run (its
transcript, its calls, its end) reads and adds to."""

from __future__ import annotations

import asyncio
import gc
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import redis.asyncio as aioredis
from celery import Celery

from broker.config.settings import Settings
from broker.errors import Signal
from broker.pg.store import AsyncStore
from broker.pg.transcript_writes import Results
from broker.protocol import (
    Event,
    EventType,
    JobSpec,
)
from broker.redis import events
from broker.redis.announce import AnnounceQueue
from broker.redis.budget import Budget
from broker.redis.ratelimit import RateLimiter
from orchestrator.calls.approvals import Approvals
from orchestrator.calls.dispatch import Dispatcher
from orchestrator.calls.gate import Gate
from orchestrator.calls.hooks import Hooks
from orchestrator.calls.policy import PolicyEngine
from orchestrator.calls.replay import Replay
from orchestrator.conversation import Message
from orchestrator.job.loops import LoopGuard
from orchestrator.job.preview import ChatPreview
from orchestrator.job.tools import CustomCatalog
from orchestrator.job.turn import TurnCalls
from orchestrator.services.control import Heard
from orchestrator.services.task_events import AgentTaskEvents
from workers.registry import Registry


@dataclass
class Services:
    """What every job of one orchestrator process shares."""

    settings: Settings
    store: AsyncStore
    redis: aioredis.Redis
    dispatcher: Dispatcher
    registry: Registry
    http: httpx.AsyncClient
    policy: PolicyEngine
    hooks: Hooks
    approvals: Approvals
    limiter: RateLimiter
    app: Celery
    task_events: AgentTaskEvents
    announcements: AnnounceQueue  # synchronous (shared with workers): call it in a thread
    custom: CustomCatalog
    live: Any = None  # orchestrator.live.LiveSettings: swaps settings/policy/hooks/limiter
    # whether commands run contained (`workers.confine.host.contains`), worked out with the
    # settings rather than per job (it resolves a dozen paths)
    contained: bool = False
    budget: Budget | None = None  # made on the first charge (its script's hash, once)
    heard: Heard | None = None  # what the control channel heard (None: each turn looks)


EVENTS_HELD_S = 0.02  # a turn's start waits this long for the round trip it rides on
COLLECT_AFTER_S = 2.0
_collection: list[asyncio.TimerHandle] = []


def collect_soon() -> None:
    """A full collection shortly after jobs leave the process (parked): their parts form
    cycles (a turn's tasks and their frames) that the orchestrator's rare full passes
    (engine.serve's thresholds) would keep for long, and parked jobs must cost nothing.
    At most one per COLLECT_AFTER_S, however many park."""
    if not _collection:
        loop = asyncio.get_running_loop()
        _collection.append(loop.call_later(COLLECT_AFTER_S, _collect))


def _collect() -> None:
    _collection.clear()
    gc.collect()


class JobCancelled(Signal):
    pass


class JobState:
    # what `JobRun.prepare` decides for the job's calls
    rules: Any
    hidden: Any
    network: bool
    tools: list[str]
    openai_tools: list[dict[str, Any]]
    anthropic_tools: list[dict[str, Any]]
    gate: Gate

    def __init__(
        self,
        services: Services,
        job_id: str,
        session_id: str,
        spec: JobSpec,
        transcript: list[dict[str, Any]] | None = None,
    ) -> None:
        self.s = services
        self.job_id = job_id
        self.session_id = session_id
        self.spec = spec
        self.messages: list[Message] = []
        self._turns = 0
        self.transcript = transcript  # read when the job was accepted; used by its first run
        self.pending: list[Event] = []  # events that ride on the job's next round trip
        self.held: asyncio.TimerHandle | None = None  # their own write, if that one is late
        self.sending: asyncio.Future[None] | None = None  # that write, in flight
        self.carrying: asyncio.Future[None] | None = None  # a publish that took them, in flight
        self.looked_at = -math.inf  # when its cancel flag and inbox were last read (monotonic)
        self.finished = False  # its end is recorded and its lease given up
        self.writing: asyncio.Future[None] | None = None  # the transcript write in flight
        self.unwritten: Results | None = None  # a turn's results held for the next write
        self.write_timer: asyncio.TimerHandle | None = None
        self.current: TurnCalls | None = None  # the calls of the turn in flight
        self.resumed_turn = -1  # a turn found unanswered in the transcript when resumed
        self.parallel = asyncio.Semaphore(services.settings.max_parallel_calls)
        self.chain: list[Any] = []  # the rest of its task graph (a subagent's announce step)
        self.registry, self.policy = services.registry, services.policy  # + its MCP tools
        self.system = spec.system  # + its agent's context files (load_tools)
        self.loops = LoopGuard(services.settings.loop_repeat_warn)
        self.looping = ""  # why the job stops, looping (a call repeated 2N times)
        self.replay: Replay | None = None  # a replay's layer over the original's ledger
        self.preview: ChatPreview | None = None  # its answer written live in its chat

    def release(self) -> None:
        """Drop what the job holds, once it has left this process (parked): the cycles
        between its parts (the gate's emit, the turn's tasks) wait for the collector's
        rare full pass, and what they reach is freed now instead."""
        self.messages = []
        self.transcript = None
        self.current = None
        self.take_events()
        self.openai_tools = []
        self.anthropic_tools = []
        self.tools = []
        collect_soon()

    async def emit(self, type_: EventType, **data: Any) -> None:
        """Emit now (after what is pending, in order)."""
        self.defer(type_, **data)
        await self.flush()

    def defer(self, type_: EventType, **data: Any) -> None:
        """Emit with the job's next round trip to Redis: a turn's start, a call's publish,
        the job's end. Only for events that nothing waits on in between."""
        self.pending.append(Event(type=type_, job_id=self.job_id, data=data))

    def send_soon(self) -> None:
        """The pending events ride on the job's next round trip if it comes within
        EVENTS_HELD_S, else go on their own: a model that takes its time does not keep the
        turn's start from those who watch the job."""
        if self.held is None:
            self.held = asyncio.get_running_loop().call_later(EVENTS_HELD_S, self._send_held)

    def _send_held(self) -> None:
        self.held = None
        if batch := self.take_events():
            self.sending = asyncio.ensure_future(self._send(batch, self.sending))

    async def _send(self, batch: list[Event], after: asyncio.Future[None] | None) -> None:
        if after is not None:
            await after
        async with self.s.redis.pipeline(transaction=False) as pipe:
            events.add(pipe, batch, self.s.settings.events_ttl_s)
            await pipe.execute()

    async def in_order(self) -> None:
        """Before a round trip that takes the pending events: the held events' own write,
        if one is in flight, is done (what comes next is after them on the stream); its
        failure surfaces here."""
        if self.sending is not None:
            sending, self.sending = self.sending, None
            await sending

    def take_events(self) -> list[Event]:
        """The pending events, taken for a round trip (after `in_order`): they no longer
        wait for a write of their own."""
        if self.held is not None:
            self.held.cancel()
            self.held = None
        batch, self.pending = self.pending, []
        return batch

    def take_pending(self, pipe: Any) -> None:
        """Put the pending events in `pipe`, first (after `in_order`)."""
        events.add(pipe, self.take_events(), self.s.settings.events_ttl_s)

    def carry_pending(self, sent: asyncio.Future[None]) -> Callable[[Any], None]:
        """`take_pending` for a call's publish, whose round trip is over once `sent` is
        done: a write that must follow its events (`lead`) waits for it. Only such a
        write does: calls sent together go out together."""

        def take(pipe: Any) -> None:
            self.take_pending(pipe)
            self.carrying = sent

        return take

    async def lead(self, pipe: Any) -> None:
        """Put the pending events first in `pipe`, once every round trip that took the
        events before them is over (their own write, a call's publish): a turn's model
        deltas come after its start on the stream, which goes with them if still pending."""
        await self.in_order()
        if self.carrying is not None:
            carrying, self.carrying = self.carrying, None
            await carrying
        self.take_pending(pipe)

    async def flush(self) -> None:
        await self.in_order()
        if self.pending:
            async with self.s.redis.pipeline(transaction=False) as pipe:
                self.take_pending(pipe)
                await pipe.execute()

    def _queue_of(self, name: str) -> str:
        tool = self.registry.get(name)
        return tool.group.value if tool else ""
