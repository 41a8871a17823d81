"""The agent loop of one job: model turn, tool calls through the queues, repeat.

Every message is persisted, in order, before anything acts on it (a turn that only reads
is written while its reads run and the model is asked again; the next write waits for
it), so a job can be resumed from its transcript; tool calls are keyed by job, turn and
call id so a resumed turn is answered from the ledger instead of running its calls again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from broker import keys
from broker.config.policy import PermissionRules
from broker.obs import tracing
from broker.obs.metrics import metrics
from broker.stores.mcp import accessible_tools
from broker.stores.requests import OnTimeout
from orchestrator.calls import tenancy
from orchestrator.calls.gate import Gate, Unanswered
from orchestrator.calls.permissions import exec_approvals, hidden_paths, job_rules, network_allowed
from orchestrator.calls.policy import PolicyEngine, PolicyError
from orchestrator.calls.replay import Replay
from orchestrator.calls.rules import RuleError
from orchestrator.conversation import Message
from orchestrator.job.context import JobContext
from orchestrator.job.deltas import TurnDeltas
from orchestrator.job.loops import LoopGuard
from orchestrator.job.preview import ChatPreview, previewed
from orchestrator.job.prompt import system_prompt
from orchestrator.job.state import JobCancelled
from orchestrator.job.turn import JobParked, TurnCalls
from orchestrator.providers import (
    ContextOverflow,
    ModelError,
    ModelProvider,
    ModelRequest,
    provider_for,
)
from workers.tools.mcp.tool import tool_class

log = logging.getLogger("clawq.loop")


class JobRun(JobContext):
    answered: tuple[str, str] = ("", "")  # the model and credential of the last reply

    async def load_tools(self) -> None:
        """The agent's custom tools and the MCP tools granted to its agent or user join
        this job's registry."""
        s, spec = self.s, self.spec
        if s.live is not None:  # a new live configuration applies from the next job on
            await s.live.refresh(s)
        if self.preview is None and previewed(spec, s.settings):  # its answer, live in its chat
            self.preview = ChatPreview(s.redis, s.app, s.settings, self.job_id, spec)
        rows, custom, self.system = await asyncio.gather(  # independent: at once
            accessible_tools(s.store.pool, spec.agent_id, spec.user_id),
            s.custom.for_agent(spec.agent_id),
            system_prompt(s.store.pool, s.settings, spec.agent_id, spec.user_id, spec.system),
        )
        if spec.replay is not None:
            self.replay = await Replay.load(s.store.pool, spec.replay, self.job_id)
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
            spec.model.partition(":")[0].partition(",")[0],  # the chain's first provider
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
            *self.approval_wait(),
            self.emit,
            exec_approvals(s.settings)[1],
            s.contained,
            self.notify_chat,
        )

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
        last = self.messages[-1] if self.messages else None
        inflight = int(last is not None and last.role == "assistant" and bool(last.tool_calls))
        self.loops = LoopGuard(self.s.settings.loop_repeat_warn)  # its calls seen so far
        self.loops.replay(self.messages[: len(self.messages) - inflight], self.job_id)
        resumed = any(m.job_id == self.job_id for m in self.messages)
        self.defer("job_started", resumed=resumed)
        self.looked_at = -math.inf  # (a steered run: its first turn reads the steer list)
        await self.in_order()
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
                except Unanswered as exc:  # its choice: cancelled when no one answers
                    status, text, error = "cancelled", "", str(exc)
                except JobParked:  # in PostgreSQL, waiting: whoever answers queues it again
                    if self.preview is not None:  # a new run's preview goes on from here
                        self.preview.stop()
                    self.release()
                    return
                await self.finish(status, text, error)
        finally:
            m.jobs_running.dec()
        m.jobs.labels(status).inc()

    def approval_wait(self) -> tuple[float, OnTimeout]:
        """How long a person's request of this job waits (0: as long as it takes) and what
        its end does: the job's choice, else its agent's, else the live settings'."""
        s, spec = self.s.settings, self.spec
        timeout = spec.approval_timeout_s
        if timeout is None:
            timeout = s.agent_approval_timeout_s.get(spec.agent_id, s.approval_timeout_s)
        return timeout, spec.on_timeout or s.approval_on_timeout

    async def loop(self) -> tuple[str, str, str]:
        s, spec = self.s, self.spec
        provider = provider_for(
            spec.model, spec.script, s.settings, s.http, s.redis, spec.agent_id, self.defer
        )
        last = self.messages[-1]
        if last.role == "assistant" and last.tool_calls:  # resumed mid-turn
            self.resumed_turn = self.turns - 1  # its calls may have been sent: resends
            await self.run_calls(self.turns - 1, last.tool_calls)
            if self.looping:
                return "looping", "", self.looping
        elif last.role == "assistant":
            return "completed", last.text, ""
        m = metrics()
        limits, over = self.limits, ""
        while True:
            if self.turns >= spec.max_iterations:
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
                # reads start as the stream delivers them, effects once the turn is stored
                self.current = current = TurnCalls(self, turn)
                try:
                    asked = time.monotonic()
                    deltas = None
                    if s.settings.stream_model_deltas or self.preview is not None:
                        # the turn's start rides on its first delta, or on its first call
                        deltas = TurnDeltas(
                            s.redis, s.settings, self.job_id, turn + 1, self.preview, self
                        )
                    try:
                        reply, view = await self.ask(provider, turn, current, deltas)
                    finally:
                        if deltas is not None:  # every delta out before the turn's events
                            await deltas.close()
                    kind = reply.model.partition(":")[0] or spec.model.partition(":")[0]
                    m.model_seconds.labels(kind).observe(time.monotonic() - asked)
                    if reply.usage is not None:  # tokens, known once it answered
                        m.model_tokens.labels(kind, "input").inc(reply.usage.input)
                        m.model_tokens.labels(kind, "output").inc(reply.usage.output)
                        self.counted(view, reply.usage.input)
                        over = await self.charge(
                            turns=0 if limits else 1, usage=reply.usage, model=reply.model
                        )
                    reply.job_id = self.job_id
                    self.answered_by(turn, reply)
                    if reply.text:
                        self.defer("model_text", turn=turn + 1, text=reply.text)
                    # reads the stream started, and effects sent gated: published first
                    if current.storing_begins() or current.running():
                        await asyncio.sleep(0)
                    # a turn whose calls only read, all on their way, goes on while it is
                    # written: the next write waits for it, nothing acts before it is stored
                    await self.append(reply, turn=turn, wait=not current.reads_only(reply))
                    await current.stored_now()
                except BaseException:
                    current.cut()  # not stored: what waited for it never goes
                    raise
                if reply.tool_calls:
                    await self.current.finish(reply.tool_calls)
                self.current = None
            m.turns.inc()
            m.turn_seconds.observe(time.monotonic() - started)
            if self.looping:
                return "looping", "", self.looping
            if not reply.tool_calls and await self.close():
                return "completed", reply.text, ""

    async def ask(
        self,
        provider: ModelProvider,
        turn: int,
        current: TurnCalls,
        deltas: TurnDeltas | None,
    ) -> tuple[Message, list[Message]]:
        """The model's reply to the transcript fitted to its window (compacted first if
        needed, and once more if the provider still finds it too long)."""
        for again in (False, True):
            view = await self.fitted(provider, force=again)
            if again and deltas is not None:
                deltas.reset()  # (a refusal comes before any text; said if one did not)
            request = ModelRequest(
                system=self.system,
                messages=view,
                openai_tools=self.openai_tools,
                anthropic_tools=self.anthropic_tools,
                turn=turn,
            )
            try:
                return await provider.complete(request, current.add, deltas), view
            except ContextOverflow:
                if again:
                    raise
                self.learn(self.request_chars(view), self.window())  # more tokens than said
        raise AssertionError("unreachable")

    def answered_by(self, turn: int, reply: Message) -> None:
        """Say which model and credential answered, on the first turn and on a change."""
        who = (reply.model, reply.credential)
        if reply.credential and who != self.answered:
            self.answered = who
            self.defer(
                "model_answered", turn=turn + 1, model=reply.model, credential=reply.credential
            )
