"""A job's transcript as its run writes it: messages appended as they come, a turn's tool
results held and written with the next round trip (one statement for the whole turn), so
a resumed job finds every step it took."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import redis.asyncio as aioredis

from broker.pg.transcript_writes import Results
from broker.protocol import (
    CallOutcome,
    Event,
)
from broker.redis import events
from orchestrator.conversation import Message, ToolCall, ToolResultBlock
from orchestrator.job.state import JobCancelled, JobState

log = logging.getLogger("clawq.loop")


class JobTranscript(JobState):
    @property
    def turns(self) -> int:
        """This job's model turns so far (counted as messages are added, not re-counted)."""
        return self._turns

    def _counts(self, message: Message) -> int:
        return int(message.role == "assistant" and message.job_id == self.job_id)

    async def begin_turn(self, turn: int) -> None:
        """No round trip of its own when the control channel heard nothing for the job
        since its last look (a cancel or steer is pushed, and a delivery announced there):
        `turn_started` rides on the turn's next round trip. Otherwise one: pending events
        out, the cancel check, and `turn_started`. Messages the user sent to redirect the
        job, and announcements delivered to it, become its next user input first."""
        heard = self.s.heard
        if heard is not None and heard.nothing_new(self.job_id, self.looked_at):
            self.defer("turn_started", turn=turn + 1)
            self.send_soon()
            return
        started = Event(type="turn_started", job_id=self.job_id, data={"turn": turn + 1})
        await self.in_order()
        batch = self.take_events()
        if heard is not None:
            heard.handed.discard(self.job_id)  # what was handed until now is read here
        looked = time.monotonic()
        begun = await events.begin_turn(self.s.redis, batch, started, self.s.settings.events_ttl_s)
        self.looked_at = looked
        if begun.cancelled:
            raise JobCancelled
        if begun.started:
            return
        texts = [*begun.delivered, *begun.steered]
        await self.append(Message(role="user", text="\n\n".join(texts), job_id=self.job_id))
        if begun.steered:
            self.defer("steered", text="\n\n".join(begun.steered)[:2000])
        await self.emit("turn_started", turn=turn + 1)

    async def append(self, message: Message, turn: int = 0, wait: bool = True) -> None:
        """Store one message (a model turn with the calls it queues), after the write
        before it, and wait for it. `wait=False` (a turn whose calls only read): the job
        goes on while it is written; the next write, or the job's end, waits for it."""
        calls = [(c.id, c.name, c.input, self._queue_of(c.name)) for c in message.tool_calls]
        await self.written()  # the write before: in order, at most one in flight
        results = self.take_results()
        self.writing = asyncio.ensure_future(
            self.s.store.append_message(
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
        )
        self.messages.append(message)
        self._turns += self._counts(message)
        if wait:
            await self.written()

    async def record(
        self,
        turn: int,
        calls: list[ToolCall],
        outcomes: dict[int, CallOutcome],
        notes: dict[int, str] | None = None,
    ) -> None:
        ordered = [outcomes[i] for i in range(len(calls))]
        notes = notes or {}
        message = Message(
            role="tool",
            job_id=self.job_id,
            results=[
                ToolResultBlock(
                    call_id=c.id,
                    name=c.name,
                    content=o.for_llm + notes.get(i, ""),
                    is_error=o.is_error,
                )
                for i, (c, o) in enumerate(zip(calls, ordered, strict=True))
            ],
        )
        if self.unwritten is not None:  # one turn's results are held at a time
            await self.settle()
        # held for the model's next message (one statement for both), or written after
        # `results_write_delay_s` if that comes later: the job goes on meanwhile, the next
        # write of the job includes or waits for them (the transcript never has a gap), and
        # the outcomes are in the ledger (a resumed turn is answered from there). The
        # turn's own write may still be in flight (a turn that only read): its results
        # are written after it.
        self.unwritten = Results(len(self.messages), message.content(), ordered)
        delay = self.s.settings.results_write_delay_s
        self.write_timer = asyncio.get_running_loop().call_later(delay, self.write_results)
        self.messages.append(message)

    def write_results(self) -> None:
        """Start writing the held results on their own (the next message is late), after
        the write in flight."""
        if (results := self.take_results()) is not None:
            self.writing = asyncio.ensure_future(self._write_results(self.writing, results))

    async def _write_results(self, before: asyncio.Future[None] | None, results: Results) -> None:
        if before is not None:
            await before  # its failure is this one's: nothing is written past a gap
        await self.s.store.record_outcomes(self.session_id, self.job_id, results)

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

    async def let_go(self) -> None:
        """Before this process lets the job go (its lease deleted, for another to resume):
        its transcript write in flight lands, and what happened is still told."""
        await self.written()
        with contextlib.suppress(aioredis.RedisError):
            await self.flush()

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
