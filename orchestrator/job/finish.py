"""How a job ends: its budget charged and checked, its final status, result and events in
one round trip, its session released, and the rest of its task graph (a subagent's
announce) continued."""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

from celery import signature

from broker import keys
from broker.protocol import (
    Event,
    Limits,
)
from broker.redis.announce import CLOSE, RELEASE, AnnounceItem
from broker.redis.budget import Budget, price
from broker.redis.control import cancel_jobs_async
from orchestrator.conversation import TokenUsage
from orchestrator.job.calls import JobCalls

log = logging.getLogger("clawq.loop")


class JobFinish(JobCalls):
    @property
    def limits(self) -> Limits | None:
        """This tree's budget (the job's, else the settings'), or None when unlimited."""
        s = self.s.settings
        limits = self.spec.budget or Limits(
            turns=s.budget_turns, tokens=s.budget_tokens, cost_usd=s.budget_cost_usd
        )
        return limits if (limits.turns or limits.tokens or limits.cost_usd) else None

    async def charge(self, turns: int = 0, usage: TokenUsage | None = None, model: str = "") -> str:
        """Charge model turns and tokens to the tree (one Lua call); why the tree is over
        its budget, or ''. A turn is charged before its request, so a turn limit is never
        passed; tokens are known after, so the turn whose reply went over still runs its
        calls (the transcript stays whole) and the next turn does not start. Tokens are
        priced as the model that answered (`model`, `provider:name`: failover) charges."""
        limits = self.limits or Limits()
        tokens = usage.total if usage else 0
        model = model or self.spec.model
        cost = (
            price(
                self.s.settings.model_prices,
                model.partition(":")[2] or model,
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
        await self.in_order()
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
        if not closed:  # the next turn reads what waits
            self.looked_at = -math.inf
        return bool(closed)

    async def finish(self, status: str, text: str, error: str) -> None:
        """Record the end, continue the task graph, free what the job held.

        The next step of the graph is sent before the status is final: a crash in between
        resumes the job and sends it again, and the announce step counts a child once."""
        spec, redis, ttl = self.spec, self.s.redis, self.s.settings.events_ttl_s
        await self.settle()  # the last results are stored before anything says it ended
        if self.preview is not None:  # before the status is final: a resumed end says it again
            await self.preview.final(status, text)
        if self.chain:
            result = {"job_id": self.job_id, "status": status, "final_text": text, "error": error}
            await asyncio.to_thread(self._continue_chain, result | {"parent_id": spec.parent_id})
        await self.s.store.finish_job(self.job_id, status, text, error, self.turns)
        await self.in_order()
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
        await self.in_order()
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
