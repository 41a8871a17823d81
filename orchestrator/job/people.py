"""A job's dealings with people: a question asked in place of a worker (ask_user), a
request asked in the chat the job came from too, and the park once the turn waits for
people only (orchestrator/job/turn.py decides when)."""

from __future__ import annotations

import asyncio
import logging
import uuid

from broker import keys
from broker.protocol import CallOutcome, Group
from broker.stores import requests
from broker.stores.requests import Question
from orchestrator.calls.gate import Ready, Unanswered, WaitForPerson
from orchestrator.job.transcript import JobTranscript
from workers.tools.messaging.requests import NOTIFY_TASK

log = logging.getLogger("clawq.loop")


class JobPeople(JobTranscript):
    async def park(self) -> bool:
        """Leave memory while people answer, if a request is still pending (else the turn
        goes on: its answers are in PostgreSQL). The lease goes with the same round trip
        as the `job_waiting` event; whoever answers the last request queues the job."""
        await self.settle()
        if not await requests.park(self.s.store.pool, self.job_id):
            return False
        self.defer("job_waiting", turn=self.turns)
        await self.in_order()
        async with self.s.redis.pipeline(transaction=False) as pipe:
            self.take_pending(pipe)
            pipe.delete(keys.lease(self.job_id))
            await pipe.execute()
        self.finished = True  # its lease is given up: another process may resume it now
        self.s.task_events.parked(self.job_id)
        log.info("job %s parked: waiting for people", self.job_id)
        return True

    async def notify_chat(self, request_id: str) -> None:
        """A request of a job that came from a chat is asked there too, with a button per
        answer (a messaging worker sends it: workers/tools/messaging/requests.py)."""
        spec = self.spec
        if spec.channel and spec.chat_id:
            await asyncio.to_thread(
                self.s.app.send_task,
                NOTIFY_TASK,
                args=[request_id, spec.channel, spec.chat_id],
                queue=Group.messaging.value,
            )

    async def ask_person(
        self, turn: int, ready: Ready, question: Question, person: WaitForPerson
    ) -> CallOutcome:
        """A call a person answers (ask_user): the question is opened once (a resumed turn
        finds it), announced as `input_requested`, and its answer is the call's result."""
        gate, call = self.gate, ready.call
        request, new = await requests.open_request(
            self.s.store.pool,
            uuid.uuid4().hex,
            self.job_id,
            turn,
            call.id,
            ready.tool.name,
            call.input,
            question.question,
            kind="question",
            question=question,
            timeout_s=gate.approval_timeout_s,
            on_timeout=gate.on_timeout,
            user_id=self.spec.user_id,
        )
        if new:
            await self.notify_chat(request.id)
            await self.emit(
                "input_requested",
                request_id=request.id,
                call_id=call.id,
                question=question.question,
                choices=question.choices,
                multi=question.multi,
                timeout_s=gate.approval_timeout_s or None,
                expires_at=request.expires_at.timestamp() if request.expires_at else None,
            )
        if request.status == "pending":
            request = await person(request.id, request.expires_at)
        who = request.answered_by or "unknown"
        self.defer("input_resolved", request_id=request.id, call_id=call.id, status=request.status)
        if request.status == "timeout" and request.on_timeout == "cancel":
            raise Unanswered(f"the user did not answer '{question.question}' in time")
        if request.status == "answered":
            given = request.answer
            text = ", ".join(map(str, given)) if isinstance(given, list) else str(given)
            result, failed = f"{who} answered: {text}", False
        elif request.status == "timeout":
            result, failed = (
                f"no answer within {gate.approval_timeout_s:g}s; go on without it or ask later",
                True,
            )
        else:  # closed unanswered (the job was cancelled)
            result, failed = f"the question was closed unanswered ({request.status})", True
        return CallOutcome(  # the caller runs the post-tool hooks on it, as on any call's
            call_id=call.id,
            job_id=self.job_id,
            turn=turn,
            for_llm=result,
            for_user=result,
            is_error=failed,
            worker="person",
            attempts=0,
        )
