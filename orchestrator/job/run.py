"""The agent loop of one job: model turn, tool calls through the queues, repeat.

Every message is persisted before the next step, so a job can be resumed from its
transcript; tool calls are keyed by job, turn and call id so a resumed turn is answered
from the ledger instead of running its calls again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx
import redis.asyncio as aioredis
from celery import Celery, signature

from broker import keys
from broker.config.policy import PermissionRules
from broker.config.settings import Settings
from broker.errors import Signal
from broker.obs import tracing
from broker.obs.metrics import metrics
from broker.pg.store import AsyncStore
from broker.pg.transcript_writes import Results
from broker.protocol import (
    CallContext,
    CallEnvelope,
    CallOutcome,
    Event,
    EventType,
    JobSpec,
    Limits,
)
from broker.redis import events
from broker.redis.announce import CLOSE, RELEASE, AnnounceItem, AnnounceQueue
from broker.redis.budget import Budget, price
from broker.redis.control import cancel_jobs_async
from broker.redis.ratelimit import RateLimiter
from broker.stores.mcp import accessible_tools
from orchestrator.calls import tenancy
from orchestrator.calls.approvals import Approvals
from orchestrator.calls.dispatch import Dispatcher, NotAdmitted, cancelled_outcome
from orchestrator.calls.gate import Gate, Ready, Refused
from orchestrator.calls.hooks import Hooks
from orchestrator.calls.permissions import exec_approvals, hidden_paths, job_rules, network_allowed
from orchestrator.calls.policy import PolicyEngine, PolicyError
from orchestrator.calls.rules import RuleError
from orchestrator.conversation import Message, TokenUsage, ToolCall, ToolResultBlock
from orchestrator.job.prompt import system_prompt
from orchestrator.job.tools import CustomCatalog
from orchestrator.job.turn import TurnCalls
from orchestrator.providers import ModelError, ModelRequest, provider_for
from orchestrator.services.task_events import AgentTaskEvents
from workers.confine.host import contains
from workers.registry import Registry
from workers.tools.mcp.tool import tool_class

log = logging.getLogger("clawq.loop")

EVENT_OUTPUT_CHARS = 2000


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
    budget: Budget | None = None  # made on the first charge (its script's hash, once)


class JobCancelled(Signal):
    pass


class JobRun:
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
        self.finished = False  # its end is recorded and its lease given up
        self.writing: asyncio.Future[None] | None = None  # the transcript write in flight
        self.unwritten: Results | None = None  # a turn's results held for the next write
        self.write_timer: asyncio.TimerHandle | None = None
        self.current: TurnCalls | None = None  # the calls of the turn in flight
        self.parallel = asyncio.Semaphore(services.settings.max_parallel_calls)
        self.chain: list[Any] = []  # the rest of its task graph (a subagent's announce step)
        self.registry, self.policy = services.registry, services.policy  # + its MCP tools
        self.system = spec.system  # + its agent's context files (load_tools)

    async def load_tools(self) -> None:
        """The agent's custom tools and the MCP tools granted to its agent or user join
        this job's registry."""
        s, spec = self.s, self.spec
        if s.live is not None:  # a new live configuration applies from the next job on
            await s.live.refresh(s)
        rows, custom, self.system = await asyncio.gather(  # independent: at once
            accessible_tools(s.store.pool, spec.agent_id, spec.user_id),
            s.custom.for_agent(spec.agent_id),
            system_prompt(s.store.pool, s.settings, spec.agent_id, spec.user_id, spec.system),
        )
        timeout = s.settings.mcp_call_total_s
        extra = [*custom, *(tool_class(r, timeout) for r in rows)]
        self.registry, self.policy = s.registry, s.policy
        if extra:
            self.registry = s.registry.extended(extra)
            self.policy = PolicyEngine(self.registry, s.settings.tool_policy)

    def prepare(self) -> None:
        """What this job may see and do; a bad rule or policy fails the job clearly."""
        s, spec = self.s, self.spec
        tenancy.check(spec, s.settings)  # every way a job is made passes here
        visible = self.policy.visible(
            spec.agent_id,
            spec.model.partition(":")[0],
            depth=spec.depth,
            max_depth=s.settings.max_spawn_depth,
        )
        job = PermissionRules(allow=spec.allow, ask=spec.ask, deny=spec.deny)
        self.rules = job_rules(s.settings, job, spec.agent_id, spec.user_id)
        self.hidden = hidden_paths(self.rules, spec.workspace)
        self.network = network_allowed(s.settings, self.rules)
        self.tools = sorted(visible)
        # what the model is told about them, built once per job rather than every turn
        self.openai_tools = self.registry.openai_tools(self.tools)
        self.anthropic_tools = self.registry.anthropic_tools(self.tools)
        self.gate = Gate(
            self.job_id,
            self.session_id,
            spec,
            self.registry,
            visible,
            self.rules,
            s.hooks,
            s.approvals,
            s.store,
            s.settings.approval_timeout_s,
            self.emit,
            exec_approvals(s.settings)[1],
            contains(s.settings),
        )

    async def emit(self, type_: EventType, **data: Any) -> None:
        """Emit now (after what is pending, in order)."""
        self.defer(type_, **data)
        await self.flush()

    def defer(self, type_: EventType, **data: Any) -> None:
        """Emit with the job's next round trip to Redis: a turn's start, a call's publish,
        the job's end. Only for events that nothing waits on in between."""
        self.pending.append(Event(type=type_, job_id=self.job_id, data=data))

    def take_pending(self, pipe: Any) -> None:
        """Put the pending events in `pipe`, first."""
        batch, self.pending = self.pending, []
        events.add(pipe, batch, self.s.settings.events_ttl_s)

    async def flush(self) -> None:
        if self.pending:
            async with self.s.redis.pipeline(transaction=False) as pipe:
                self.take_pending(pipe)
                await pipe.execute()

    @property
    def turns(self) -> int:
        """This job's model turns so far (counted as messages are added, not re-counted)."""
        return self._turns

    def _counts(self, message: Message) -> int:
        return int(message.role == "assistant" and message.job_id == self.job_id)

    async def run(self) -> None:
        """Run (or resume) the job to a final status, persisting each step."""
        rows, self.transcript = self.transcript, None
        if rows is None:  # a run after the first (steered): read it again
            await self.settle()
            rows = await self.s.store.transcript(self.session_id)
        self.messages = [
            Message.from_row(r["role"], r["content"], r.get("job_id", "")) for r in rows
        ]
        self._turns = sum(self._counts(m) for m in self.messages)
        resumed = any(m.job_id == self.job_id for m in self.messages)
        self.defer("job_started", resumed=resumed)
        async with self.s.redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.session_active(self.session_id), self.job_id)  # where messages go
            pipe.delete(keys.session_ended(self.session_id))  # a later job of the session
            self.take_pending(pipe)
            self.s.task_events.started(pipe, self.job_id, self.spec)
            await pipe.execute()
        if not resumed:
            await self.append(Message(role="user", text=self.spec.prompt, job_id=self.job_id))
        m = metrics()
        m.jobs_running.inc()
        try:
            with tracing.span("job", {"clawq.job": self.job_id, "clawq.agent": self.spec.agent_id}):
                try:
                    await self.load_tools()
                    self.prepare()
                    status, text, error = await self.loop()
                except (ModelError, RuleError, PolicyError, tenancy.TenancyError) as exc:
                    status, text, error = "failed", "", str(exc)
                except JobCancelled:
                    status, text, error = "cancelled", "", "cancelled by request"
                await self.finish(status, text, error)
        finally:
            m.jobs_running.dec()
        m.jobs.labels(status).inc()

    async def loop(self) -> tuple[str, str, str]:
        provider = provider_for(self.spec.model, self.spec.script, self.s.settings, self.s.http)
        last = self.messages[-1]
        if last.role == "assistant" and last.tool_calls:  # resumed mid-turn
            await self.run_calls(self.turns - 1, last.tool_calls)
        elif last.role == "assistant":
            return "completed", last.text, ""
        m, kind = metrics(), self.spec.model.partition(":")[0]
        limits, over = self.limits, ""
        while True:
            if self.turns >= self.spec.max_iterations:
                return "max_iterations", "", f"stopped after {self.turns} model turns"
            if limits and not over:  # the turn is charged before the model is asked
                over = await self.charge(turns=1)
            if over:
                self.defer("budget_exceeded", reason=over)
                return "budget_exceeded", "", over
            turn = self.turns
            started = time.monotonic()
            with tracing.span("turn", {"clawq.turn": turn + 1}):
                await self.begin_turn(turn)
                request = ModelRequest(
                    system=self.system,
                    messages=self.messages,
                    openai_tools=self.openai_tools,
                    anthropic_tools=self.anthropic_tools,
                    turn=turn,
                )
                # reads start as the stream delivers them, effects once the turn is stored
                self.current = current = TurnCalls(self, turn)
                try:
                    asked = time.monotonic()
                    reply = await provider.complete(request, on_tool_call=current.add)
                    m.model_seconds.labels(kind).observe(time.monotonic() - asked)
                    if reply.usage is not None:  # tokens, known once it answered
                        m.model_tokens.labels(kind, "input").inc(reply.usage.input)
                        m.model_tokens.labels(kind, "output").inc(reply.usage.output)
                        over = await self.charge(turns=0 if limits else 1, usage=reply.usage)
                    reply.job_id = self.job_id
                    if reply.text:
                        self.defer("model_text", turn=turn + 1, text=reply.text)
                    await self.append(reply, turn=turn)
                except BaseException:
                    current.cut()  # not stored: what waited for it never goes
                    raise
                if reply.tool_calls:
                    await self.current.finish(reply.tool_calls)
                self.current = None
            m.turns.inc()
            m.turn_seconds.observe(time.monotonic() - started)
            if not reply.tool_calls and await self.close():
                return "completed", reply.text, ""

    @property
    def limits(self) -> Limits | None:
        """This tree's budget (the job's, else the settings'), or None when unlimited."""
        s = self.s.settings
        limits = self.spec.budget or Limits(
            turns=s.budget_turns, tokens=s.budget_tokens, cost_usd=s.budget_cost_usd
        )
        return limits if (limits.turns or limits.tokens or limits.cost_usd) else None

    async def charge(self, turns: int = 0, usage: TokenUsage | None = None) -> str:
        """Charge model turns and tokens to the tree (one Lua call); why the tree is over
        its budget, or ''. A turn is charged before its request, so a turn limit is never
        passed; tokens are known after, so the turn whose reply went over still runs its
        calls (the transcript stays whole) and the next turn does not start."""
        limits = self.limits or Limits()
        tokens = usage.total if usage else 0
        cost = (
            price(
                self.s.settings.model_prices,
                self.spec.model.partition(":")[2] or self.spec.model,
                usage.input,
                usage.output,
            )
            if usage
            else 0.0
        )
        if self.s.budget is None:
            self.s.budget = Budget(self.s.redis)
        used = await self.s.budget.charge(
            self.spec.root_id or self.job_id, limits, turns, tokens, cost
        )
        if not used.over:
            return ""
        return f"the job's tree went over its budget of {used.over}: {used.describe(limits)}"

    async def close(self) -> bool:
        """Whether the job may end now: nothing waits in its inbox or steer list (else the
        next turn takes it), and then new messages for the session start a new job."""
        async with self.s.redis.pipeline(transaction=False) as pipe:
            self.take_pending(pipe)
            pipe.eval(
                CLOSE,
                3,
                keys.inbox(self.job_id),
                keys.steer(self.job_id),
                keys.session_active(self.session_id),
                self.job_id,
            )
            closed = (await pipe.execute())[-1]
        return bool(closed)

    async def begin_turn(self, turn: int) -> None:
        """One round trip in the common case: pending events out, the cancel check, and
        `turn_started`. Messages the user sent to redirect the job, and announcements
        delivered to it, become its next user input first."""
        started = Event(type="turn_started", job_id=self.job_id, data={"turn": turn + 1})
        batch, self.pending = self.pending, []
        begun = await events.begin_turn(self.s.redis, batch, started, self.s.settings.events_ttl_s)
        if begun.cancelled:
            raise JobCancelled
        if begun.started:
            return
        texts = [*begun.delivered, *begun.steered]
        await self.append(Message(role="user", text="\n\n".join(texts), job_id=self.job_id))
        if begun.steered:
            self.defer("steered", text="\n\n".join(begun.steered)[:2000])
        await self.emit("turn_started", turn=turn + 1)

    async def append(self, message: Message, turn: int = 0) -> None:
        """Store one message (a model turn with the calls it queues) and wait for it."""
        calls = [(c.id, c.name, c.input, self._queue_of(c.name)) for c in message.tool_calls]
        await self.written()  # results whose next message came late: being written alone
        results = self.take_results()
        await self.s.store.append_message(
            self.session_id,
            self.job_id,
            len(self.messages),
            message.role,
            message.content(),
            turn=turn,
            calls=calls,
            iterations=self.turns + 1 if message.role == "assistant" else None,
            results=results,
        )
        self.messages.append(message)
        self._turns += self._counts(message)

    def _queue_of(self, name: str) -> str:
        tool = self.registry.get(name)
        return tool.group.value if tool else ""

    async def run_calls(self, turn: int, calls: list[ToolCall]) -> None:
        """Check, schedule and await a turn's calls; record their results in model order."""
        self.current = TurnCalls(self, turn)
        await self.current.finish(calls)
        self.current = None

    def cancel_key(self, turn: int, call_id: str) -> str:
        return keys.cancel_call(self.job_id, turn, call_id)

    async def abandon_turn(self, reason: str) -> None:
        """Stop the calls of the turn in flight; record a result for every one of them
        once the model's message is in the transcript (a cut stream records nothing)."""
        current, self.current = self.current, None
        if current is None:
            return
        await current.stop_all(reason)
        last = self.messages[-1] if self.messages else None
        if last is not None and last.role == "assistant" and last.tool_calls:
            for index, call in enumerate(last.tool_calls):
                current.outcomes.setdefault(
                    index, cancelled_outcome(self.job_id, current.turn, call.id, reason)
                )
            await self.record(current.turn, last.tool_calls, current.outcomes)
        await self.flush()

    async def record(
        self, turn: int, calls: list[ToolCall], outcomes: dict[int, CallOutcome]
    ) -> None:
        ordered = [outcomes[i] for i in range(len(calls))]
        message = Message(
            role="tool",
            job_id=self.job_id,
            results=[
                ToolResultBlock(call_id=c.id, name=c.name, content=o.for_llm, is_error=o.is_error)
                for c, o in zip(calls, ordered, strict=True)
            ],
        )
        await self.settle()
        # held for the model's next message (one statement for both), or written after
        # `results_write_delay_s` if that comes later: the job goes on meanwhile, the next
        # write of the job includes or waits for them (the transcript never has a gap), and
        # the outcomes are in the ledger (a resumed turn is answered from there)
        self.unwritten = Results(len(self.messages), message.content(), ordered)
        delay = self.s.settings.results_write_delay_s
        self.write_timer = asyncio.get_running_loop().call_later(delay, self.write_results)
        self.messages.append(message)

    def write_results(self) -> None:
        """Start writing the held results on their own (the next message is late)."""
        if self.writing is None and (results := self.take_results()) is not None:
            self.writing = asyncio.ensure_future(
                self.s.store.record_outcomes(self.session_id, self.job_id, results)
            )

    def take_results(self) -> Results | None:
        """The held results, for the next write to carry."""
        if self.write_timer is not None:
            self.write_timer.cancel()
            self.write_timer = None
        results, self.unwritten = self.unwritten, None
        return results

    async def settle(self) -> None:
        """The transcript is whole in PostgreSQL: held results are written now, and the
        write in flight is waited for; its failure surfaces here, once."""
        await self.written()
        if self.unwritten is not None:
            self.write_results()
            await self.written()

    async def written(self) -> None:
        """Wait for the transcript write in flight; its failure surfaces here, once."""
        if self.writing is None:
            return
        try:
            await asyncio.shield(self.writing)  # a cancelled job still completes its write
        except asyncio.CancelledError:
            if not self.writing.done():
                raise
            self.writing = None
            raise
        except BaseException:
            self.writing = None
            raise
        self.writing = None

    def local_outcome(self, turn: int, call: ToolCall, refused: Refused) -> CallOutcome:
        result, decision = refused.result, refused.decision
        return CallOutcome(
            call_id=call.id,
            job_id=self.job_id,
            turn=turn,
            for_llm=result.for_llm,
            for_user=result.for_user,
            is_error=True,
            worker="orchestrator",
            attempts=0,
            decision=f"deny:{decision.layer}",
            decided_by=decision.by,
            decision_reason=decision.reason,
        )

    async def unreachable(self, tool: Any, queue: str) -> str:
        """Why a call routed to one node's queue (`<group>.<node>`) cannot be answered: no
        live worker of the group heartbeats on that node. Said at once, never waited on."""
        group = tool.group.value
        if queue == group or tool.pinned or not queue.startswith(group + "."):
            return ""
        if await self.s.redis.exists(keys.consumer(queue)):
            return ""
        node = queue[len(group) + 1 :]
        return (
            f"{tool.name} was not run: no live {group} worker on node {node} (down or "
            "unknown); nodes list shows the live ones"
        )

    async def pinned_queue(self, tool: str) -> str | None:
        """The queue of the live process holding this session's state for `tool`; None
        when there is none or it died (the tool then says its state was lost)."""
        raw = await self.s.redis.get(keys.pin(self.session_id, tool))
        if not raw:
            return None
        pin = json.loads(raw)
        alive = await self.s.redis.exists(keys.proc(pin.get("proc", "")))
        return str(pin["queue"]) if alive else None

    async def dispatch(self, turn: int, ready: Ready) -> CallOutcome:
        async with self.parallel:
            timeout = ready.tool.timeout(ready.args, self.s.settings)
            queue = ready.tool.route(ready.args) or ready.tool.group.value
            if ready.tool.pinned:
                queue = await self.pinned_queue(ready.tool.name) or queue
            envelope = CallEnvelope(
                call_id=ready.call.id,
                job_id=self.job_id,
                turn=turn,
                session_id=self.session_id,
                tool=ready.tool.name,
                task=ready.tool.task,
                input=ready.args.model_dump(mode="json", exclude_unset=True),
                context=CallContext(
                    workspace=self.spec.workspace,
                    user_id=self.spec.user_id,
                    agent_id=self.spec.agent_id,
                    channel=self.spec.channel,
                    chat_id=self.spec.chat_id,
                    sandbox_key=(
                        self.session_id
                        if self.s.settings.sandbox_scope == "session"
                        else self.spec.agent_id
                    ),
                    writable_paths=ready.writable,
                    hidden_paths=self.hidden,
                    network=self.network,
                    confined=ready.confined,
                ),
                timeout_s=timeout,
                deadline=time.time() + self.s.settings.visibility_timeout_s,
                reply_to=self.s.dispatcher.reply_key,
                max_deliveries=self.s.settings.max_deliveries,
                sent_at=time.time(),
            )
            queued = Event(
                type="tool_call_queued",
                job_id=self.job_id,
                data={
                    "call_id": ready.call.id,
                    "name": ready.tool.name,
                    "input": envelope.input,
                    "queue": queue,
                },
            )
            if unreachable := await self.unreachable(ready.tool, queue):
                self.pending.append(queued)
                await self.flush()
                outcome = CallOutcome(
                    call_id=ready.call.id,
                    job_id=self.job_id,
                    turn=turn,
                    for_llm=unreachable,
                    for_user=unreachable,
                    is_error=True,
                    worker="orchestrator",
                    attempts=0,
                )
            else:  # the queued event goes out with the publish, after what is pending
                # a subagent tree shares its root session's limit: spawning does not multiply it
                session = self.spec.root_session or self.session_id
                ttl = self.s.settings.events_ttl_s
                if (admit := self.s.limiter.push(session, queued, ttl)) is None:
                    self.pending.append(queued)
                with tracing.span(f"call {ready.tool.name}", {"clawq.call": ready.call.id}):
                    envelope.trace = tracing.carrier()  # the worker's span is a child of this
                    try:
                        outcome = await self.s.dispatcher.call(
                            envelope, queue, self.take_pending, admit
                        )
                    except NotAdmitted as refused:
                        limited = await self.gate.rate_limited(ready, refused.used)
                        return self.local_outcome(turn, ready.call, limited)
            return await self.after(ready, outcome)

    async def after(self, ready: Ready, outcome: CallOutcome) -> CallOutcome:
        """Post-tool hooks (their context is added for the model) and the audit fields."""
        response = {"for_llm": outcome.for_llm, "is_error": outcome.is_error}
        hooked = await self.s.hooks.run(
            self.gate.hook_input(ready.call, "PostToolUse", ready.call.input, response)
        )
        text = outcome.for_llm
        if hooked.context:
            text += "".join(f"\n[hook] {line}" for line in hooked.context)
        d = ready.decision
        return outcome.model_copy(
            update={
                "for_llm": text,
                "decision": f"allow:{d.layer}",
                "decided_by": d.by,
                "decision_reason": d.reason,
            }
        )

    async def emit_finished(self, call: ToolCall, outcome: CallOutcome, now: bool = True) -> None:
        """Now, or (`now=False`: the turn's last call) with the job's next round trip."""
        data = {
            "call_id": call.id,
            "name": call.name,
            "is_error": outcome.is_error,
            "output": outcome.for_llm[:EVENT_OUTPUT_CHARS],
            "queue": outcome.queue,
            "worker": outcome.worker,
        }
        self.defer("tool_call_finished", **data)
        if now:
            await self.flush()

    async def finish(self, status: str, text: str, error: str) -> None:
        """Record the end, continue the task graph, free what the job held.

        The next step of the graph is sent before the status is final: a crash in between
        resumes the job and sends it again, and the announce step counts a child once."""
        spec, redis, ttl = self.spec, self.s.redis, self.s.settings.events_ttl_s
        await self.settle()  # the last results are stored before anything says it ended
        if self.chain:
            result = {"job_id": self.job_id, "status": status, "final_text": text, "error": error}
            await asyncio.to_thread(self._continue_chain, result | {"parent_id": spec.parent_id})
        await self.s.store.finish_job(self.job_id, status, text, error, self.turns)
        async with redis.pipeline(transaction=False) as pipe:
            self.take_pending(pipe)
            pipe.set(keys.session_ended(self.session_id), status, ex=ttl)  # its processes end
            if spec.depth > 0:
                pipe.zrem(keys.SUBAGENTS_RUNNING, self.job_id)
            self.release_session(pipe)
            left = (await pipe.execute())[-1]
        if left and status != "cancelled":
            await self.hand_back(left)
        if status in ("cancelled", "budget_exceeded"):  # its children go with it
            children = await self.s.store.unfinished_children(self.job_id)
            why = "its parent was cancelled" if status == "cancelled" else "over the budget"
            if children:
                await cancel_jobs_async(redis, children, why, ttl)
        self.defer(
            "job_finished", status=status, final_text=text, error=error, iterations=self.turns
        )
        if spec.parent_id:
            self.pending.append(
                Event(
                    type="subagent_finished",
                    job_id=spec.parent_id,
                    data={"child": self.job_id, "label": spec.label, "status": status},
                )
            )
        async with redis.pipeline(transaction=False) as pipe:
            self.take_pending(pipe)
            pipe.delete(keys.lease(self.job_id))  # the job is over: nothing to resume
            self.s.task_events.finished(pipe, self.job_id, status, text, error)
            await pipe.execute()
        self.finished = True
        log.info("job %s %s after %d turns", self.job_id, status, self.turns)

    def release_session(self, pipe: Any) -> None:
        """New messages for the session now start a new job; what reached this job's inbox
        too late is returned (last in `pipe`'s results) to go back to the announce queue."""
        pipe.eval(
            RELEASE,
            3,
            keys.session_active(self.session_id),
            keys.inbox(self.job_id),
            keys.released(self.job_id),
            self.job_id,
            self.s.settings.events_ttl_s,
        )

    async def hand_back(self, left: list[Any]) -> None:
        for text in left:
            item = AnnounceItem(
                kind="text", result=text.decode() if isinstance(text, bytes) else text
            )
            await asyncio.to_thread(self.s.announcements.push, self.session_id, item)

    def _continue_chain(self, result: dict[str, Any]) -> None:
        """What a Celery worker does after a task of a chain: send the next signature with
        this result, this task as its parent and the same root."""
        rest = list(self.chain)
        following = signature(rest.pop(), app=self.s.app)
        following.apply_async(
            (result,),
            chain=rest or None,
            parent_id=self.job_id,
            root_id=self.spec.root_id or self.job_id,
        )
