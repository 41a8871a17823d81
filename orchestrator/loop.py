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

from broker import events, keys
from broker.announce import CLOSE, RELEASE, AnnounceItem, AnnounceQueue
from broker.control import cancel_jobs_async
from broker.mcp_store import accessible_tools
from broker.messages import (
    CallContext,
    CallEnvelope,
    CallOutcome,
    Event,
    EventType,
    JobSpec,
)
from broker.policy_config import PermissionRules
from broker.ratelimit import RateLimiter
from broker.settings import Settings
from broker.store import AsyncStore
from orchestrator.approvals import Approvals
from orchestrator.conversation import Message, ToolCall, ToolResultBlock
from orchestrator.custom_catalog import CustomCatalog
from orchestrator.dispatch import Dispatcher, cancelled_outcome
from orchestrator.gate import Gate, Ready, Refused
from orchestrator.hooks import Hooks
from orchestrator.permissions import exec_approvals, hidden_paths, job_rules, network_allowed
from orchestrator.policy import PolicyEngine, PolicyError
from orchestrator.prompt import system_prompt
from orchestrator.providers import ModelError, ModelRequest, provider_for
from orchestrator.rules import RuleError
from orchestrator.task_events import AgentTaskEvents
from orchestrator.turn import TurnCalls
from workers.registry import Registry
from workers.tools.mcp import tool_class

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


class JobCancelled(Exception):
    pass


class JobRun:
    def __init__(self, services: Services, job_id: str, session_id: str, spec: JobSpec) -> None:
        self.s = services
        self.job_id = job_id
        self.session_id = session_id
        self.spec = spec
        self.messages: list[Message] = []
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
        rows = await accessible_tools(s.store.pool, spec.agent_id, spec.user_id)
        timeout = s.settings.mcp_call_timeout_s
        extra = [*await s.custom.for_agent(spec.agent_id), *(tool_class(r, timeout) for r in rows)]
        self.registry, self.policy = s.registry, s.policy
        self.system = await system_prompt(
            s.store.pool, s.settings, spec.agent_id, spec.user_id, spec.system
        )
        if extra:
            self.registry = s.registry.extended(extra)
            self.policy = PolicyEngine(self.registry, s.settings.tool_policy)

    def prepare(self) -> None:
        """What this job may see and do; a bad rule or policy fails the job clearly."""
        s, spec = self.s, self.spec
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
            s.limiter,
            s.settings.approval_timeout_s,
            self.emit,
            exec_approvals(s.settings)[1],
        )

    async def emit(self, type_: EventType, **data: Any) -> None:
        event = Event(type=type_, job_id=self.job_id, data=data)
        await events.emit(self.s.redis, event, self.s.settings.events_ttl_s)

    @property
    def turns(self) -> int:
        return sum(1 for m in self.messages if m.role == "assistant" and m.job_id == self.job_id)

    async def run(self) -> None:
        """Run (or resume) the job to a final status, persisting each step."""
        rows = await self.s.store.transcript(self.session_id)
        self.messages = [
            Message.from_row(r["role"], r["content"], r.get("job_id", "")) for r in rows
        ]
        resumed = any(m.job_id == self.job_id for m in self.messages)
        async with self.s.redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.session_active(self.session_id), self.job_id)  # where messages go
            pipe.delete(keys.session_ended(self.session_id))  # a later job of the session
            await pipe.execute()
        await self.s.task_events.started(self.job_id, self.spec)
        await self.emit("job_started", resumed=resumed)
        if not resumed:
            await self.append(Message(role="user", text=self.spec.prompt, job_id=self.job_id))
        try:
            await self.load_tools()
            self.prepare()
            status, text, error = await self.loop()
        except (ModelError, RuleError, PolicyError) as exc:
            status, text, error = "failed", "", str(exc)
        except JobCancelled:
            status, text, error = "cancelled", "", "cancelled by request"
        await self.finish(status, text, error)

    async def loop(self) -> tuple[str, str, str]:
        provider = provider_for(self.spec.model, self.spec.script, self.s.settings, self.s.http)
        last = self.messages[-1]
        if last.role == "assistant" and last.tool_calls:  # resumed mid-turn
            await self.run_calls(self.turns - 1, last.tool_calls)
        elif last.role == "assistant":
            return "completed", last.text, ""
        while True:
            if self.turns >= self.spec.max_iterations:
                return "max_iterations", "", f"stopped after {self.turns} model turns"
            await self.check_cancelled()
            await self.take_steering()
            turn = self.turns
            await self.emit("turn_started", turn=turn + 1)
            request = ModelRequest(
                system=self.system,
                messages=self.messages,
                openai_tools=self.registry.openai_tools(self.tools),
                anthropic_tools=self.registry.anthropic_tools(self.tools),
                turn=turn,
            )
            self.current = TurnCalls(self, turn)  # calls start as the stream delivers them
            reply = await provider.complete(request, on_tool_call=self.current.add)
            reply.job_id = self.job_id
            if reply.text:
                await self.emit("model_text", turn=turn + 1, text=reply.text)
            await self.append(reply, turn=turn)
            if reply.tool_calls:
                await self.current.finish(reply.tool_calls)
            self.current = None
            if not reply.tool_calls and await self.close():
                return "completed", reply.text, ""

    async def close(self) -> bool:
        """Whether the job may end now: nothing waits in its inbox or steer list (else the
        next turn takes it), and then new messages for the session start a new job."""
        closed = await self.s.redis.eval(
            CLOSE,
            3,
            keys.inbox(self.job_id),
            keys.steer(self.job_id),
            keys.session_active(self.session_id),
            self.job_id,
        )
        return bool(closed)

    async def take_steering(self) -> None:
        """Messages the user sent to redirect the job, and announcements delivered to it,
        become its next user input."""
        steer, inbox = keys.steer(self.job_id), keys.inbox(self.job_id)
        async with self.s.redis.pipeline(transaction=True) as pipe:
            pipe.lrange(steer, 0, -1)
            pipe.lrange(inbox, 0, -1)
            pipe.delete(steer, inbox)
            steered, delivered, _ = await pipe.execute()
        texts = [m.decode() if isinstance(m, bytes) else m for m in [*delivered, *steered]]
        if texts:
            await self.append(Message(role="user", text="\n\n".join(texts), job_id=self.job_id))
        if steered:
            await self.emit("steered", text="\n\n".join(texts[len(delivered) :])[:2000])

    async def check_cancelled(self) -> None:
        if await self.s.redis.exists(keys.cancel(self.job_id)):
            raise JobCancelled

    async def append(self, message: Message, turn: int = 0) -> None:
        calls = [(c.id, c.name, c.input, self._queue_of(c.name)) for c in message.tool_calls]
        await self.s.store.append_message(
            self.session_id,
            self.job_id,
            len(self.messages),
            message.role,
            message.content(),
            turn=turn,
            calls=calls,
            iterations=self.turns + 1 if message.role == "assistant" else None,
        )
        self.messages.append(message)

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
        await self.s.store.record_outcomes(
            self.session_id, self.job_id, len(self.messages), message.content(), ordered
        )
        self.messages.append(message)

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
                ),
                timeout_s=timeout,
                deadline=time.time() + self.s.settings.visibility_timeout_s,
                reply_to=self.s.dispatcher.reply_key,
                max_deliveries=self.s.settings.max_deliveries,
            )
            await self.emit(
                "tool_call_queued",
                call_id=ready.call.id,
                name=ready.tool.name,
                input=envelope.input,
                queue=queue,
            )
            if unreachable := await self.unreachable(ready.tool, queue):
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
            else:
                outcome = await self.s.dispatcher.call(envelope, queue)
            outcome = await self.after(ready, outcome)
            await self.emit_finished(ready.call, outcome)
            return outcome

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

    async def emit_finished(self, call: ToolCall, outcome: CallOutcome) -> None:
        await self.emit(
            "tool_call_finished",
            call_id=call.id,
            name=call.name,
            is_error=outcome.is_error,
            output=outcome.for_llm[:EVENT_OUTPUT_CHARS],
            queue=outcome.queue,
            worker=outcome.worker,
        )

    async def finish(self, status: str, text: str, error: str) -> None:
        """Record the end, continue the task graph, free what the job held.

        The next step of the graph is sent before the status is final: a crash in between
        resumes the job and sends it again, and the announce step counts a child once."""
        spec, redis, ttl = self.spec, self.s.redis, self.s.settings.events_ttl_s
        if self.chain:
            result = {"job_id": self.job_id, "status": status, "final_text": text, "error": error}
            await asyncio.to_thread(self._continue_chain, result | {"parent_id": spec.parent_id})
        await self.s.store.finish_job(self.job_id, status, text, error, self.turns)
        async with redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.session_ended(self.session_id), status, ex=ttl)  # its processes end
            if spec.depth > 0:
                pipe.zrem(keys.SUBAGENTS_RUNNING, self.job_id)
            await pipe.execute()
        await self.release_session(status)
        if status == "cancelled":  # its children go with it
            children = await self.s.store.unfinished_children(self.job_id)
            if children:
                await cancel_jobs_async(redis, children, "its parent was cancelled", ttl)
        await self.emit(
            "job_finished", status=status, final_text=text, error=error, iterations=self.turns
        )
        if spec.parent_id:
            parent_event = Event(
                type="subagent_finished",
                job_id=spec.parent_id,
                data={"child": self.job_id, "label": spec.label, "status": status},
            )
            await events.emit(redis, parent_event, ttl)
        await self.s.task_events.finished(self.job_id, status, text, error)
        log.info("job %s %s after %d turns", self.job_id, status, self.turns)

    async def release_session(self, status: str) -> None:
        """New messages for the session now start a new job; those that reached this job's
        inbox too late go back to the announce queue (unless the job was cancelled)."""
        left = await self.s.redis.eval(
            RELEASE,
            3,
            keys.session_active(self.session_id),
            keys.inbox(self.job_id),
            keys.released(self.job_id),
            self.job_id,
            self.s.settings.events_ttl_s,
        )
        if left and status != "cancelled":
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
