"""A job's tool calls: each to its queue (or the worker process its session is pinned to),
answered locally when the gate refused it, and seen through the post-tool hooks and the
events a client reads."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from broker import keys, outage
from broker.obs import tracing
from broker.protocol import (
    CallContext,
    CallEnvelope,
    CallOutcome,
    Event,
    JobSpec,
)
from broker.redis.presence import stale
from broker.stores import requests
from orchestrator.calls.dispatch import NotAdmitted
from orchestrator.calls.gate import Ready, Refused
from orchestrator.calls.pending import cancelled_outcome
from orchestrator.conversation import ToolCall
from orchestrator.job.people import JobPeople
from orchestrator.job.turn import TurnCalls

log = logging.getLogger("clawq.loop")

EVENT_OUTPUT_CHARS = 2000


def attended(spec: JobSpec) -> bool:
    """Whether a person can answer the job's requests: not a subagent's or a cron run's
    that has neither a user (whose inbox lists it) nor a chat (where it is asked)."""
    unattended = spec.parent_id or spec.label.startswith("cron:")
    return bool(spec.user_id or spec.channel or not unattended)


class JobCalls(JobPeople):
    async def run_calls(self, turn: int, calls: list[ToolCall]) -> None:
        """Check, schedule and await a turn's calls; record their results in model order."""
        self.current = TurnCalls(self, turn)
        if turn == self.resumed_turn:  # it may have been parked: what ran is kept
            self.current.kept = await requests.kept_outcomes(self.s.store.pool, self.job_id, turn)
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

    def error_outcome(self, turn: int, call: ToolCall, text: str) -> CallOutcome:
        """An error result the orchestrator gives without running the call."""
        return CallOutcome(
            call_id=call.id,
            job_id=self.job_id,
            turn=turn,
            for_llm=text,
            for_user=text,
            is_error=True,
            worker="orchestrator",
            attempts=0,
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

    async def pinned(self, tool: str) -> tuple[str, str] | None:
        """The queue and process holding this session's state for `tool`; None when there
        is none or it died (the tool then says its state was lost). A process that died
        stops beating: a beat older than two intervals and a half is a dead one's, though
        its key lives on for the TTL (unless Redis itself has just come back): the tool,
        on whichever worker takes the call, judges it the same way (browser._lost)."""
        redis, s = self.s.redis, self.s.settings
        raw = await redis.get(keys.pin(self.session_id, tool))
        if not raw:
            return None
        pin = json.loads(raw)
        proc = str(pin.get("proc", ""))
        pttl = await redis.pttl(keys.proc(proc))
        if pttl is None or pttl < 0:
            return None
        if stale(pttl, s.heartbeat_interval_s, s.heartbeat_ttl_s) and (
            await outage.heartbeats_trusted(redis, s.heartbeat_interval_s, s.heartbeat_ttl_s)
        ):
            return None
        return str(pin["queue"]), proc

    async def dispatch(
        self, turn: int, ready: Ready, index: int = 0, early: bool = False
    ) -> CallOutcome:
        """A call the gate allowed: sent to its queue, or, in a replay, through the replay
        layer first (`orchestrator.calls.replay`), which answers what the original did."""
        if self.replay is not None:
            return await self.replay.through(self, turn, index, ready)
        return await self.send(turn, ready, early=early)

    def may_gate(self, turn: int) -> bool:
        """Whether the turn's calls may be sent while it is being stored (`TurnCalls`): not
        a replay's, nor a resumed turn's (those are stored, and may have been sent)."""
        return self.replay is None and turn != self.resumed_turn

    async def send(
        self, turn: int, ready: Ready, workspace: str = "", early: bool = False
    ) -> CallOutcome:
        """Send the call to its queue (`workspace`: another than the job's, a replay's
        sandbox; `early`: it may go while its turn is being stored, gated) and await its
        outcome."""
        async with self.parallel:
            timeout = ready.tool.timeout(ready.args, self.s.settings)
            queue = ready.tool.route(ready.args) or ready.tool.group.value
            pinned = ""
            if ready.tool.pinned and (pin := await self.pinned(ready.tool.name)):
                queue, pinned = pin
            envelope = CallEnvelope(
                call_id=ready.call.id,
                job_id=self.job_id,
                turn=turn,
                session_id=self.session_id,
                tool=ready.tool.name,
                task=ready.tool.task,
                input=ready.args.model_dump(mode="json", exclude_unset=True),
                context=CallContext(
                    workspace=workspace or self.spec.workspace,
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
                    attended=attended(self.spec),
                ),
                timeout_s=timeout,
                deadline=time.time() + self.s.settings.visibility_timeout_s,
                reply_to=self.s.dispatcher.reply_key,
                max_deliveries=self.s.settings.max_deliveries,
                sent_at=time.time(),
                resent=turn == self.resumed_turn,  # sent before, by the job's last run
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
                outcome = self.error_outcome(turn, ready.call, unreachable)
            else:  # the queued event goes out with the publish, after what is pending
                # a subagent tree shares its root session's limit: spawning does not multiply it
                session = self.spec.root_session or self.session_id
                ttl = self.s.settings.events_ttl_s
                if (admit := self.s.limiter.push(session, queued, ttl)) is None:
                    self.pending.append(queued)
                with tracing.span(f"call {ready.tool.name}", {"clawq.call": ready.call.id}):
                    envelope.trace = tracing.carrier()  # the worker's span is a child of this
                    sent = asyncio.get_running_loop().create_future()
                    try:
                        await self.in_order()
                        if early and self.current is not None:  # no wait from here
                            envelope.gate = self.current.gate_for(ready.call.id)
                        outcome = await self.s.dispatcher.call(
                            envelope, queue, self.carry_pending(sent), admit, pinned, sent
                        )
                    except NotAdmitted as refused:
                        limited = await self.gate.rate_limited(ready, refused.used)
                        return self.local_outcome(turn, ready.call, limited)
            if outcome.metadata.get("session_lost"):  # the next call starts a new one
                await self.s.redis.delete(keys.pin(self.session_id, ready.tool.name))
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
