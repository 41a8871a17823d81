"""A person's answers, as the orchestrator waiting in memory hears of them.

A request (an approval, a question) is stored in PostgreSQL and announced on the job's
event stream; whoever answers records the answer there first (broker/stores/requests.py:
the first answer wins), then tells the orchestrators through Redis (an answer key, then a
push on the control channel), so that one waiting for it is woken at once, and an answer
given before the wait began, or while a push was missed, is still found. A job parked
while it waited reads its answers from PostgreSQL when it runs again.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import redis.asyncio as aioredis
from pydantic import BaseModel

from broker import keys

# answered: a question's or an elicitation's; declined: an elicitation's
Answer = Literal["allow-once", "allow-always", "deny", "answered", "declined"]
ANSWERS: tuple[str, ...] = ("allow-once", "allow-always", "deny")


class ApprovalAnswer(BaseModel):
    request_id: str
    decision: Answer
    by: str = ""
    admin: bool = False  # answered with an admin's key (or an operator's direct client)
    answer: Any = None  # a question's answer


def answer_key(request_id: str) -> str:
    return keys.approval(request_id) + ":answer"


class Approvals:
    """The waiting side, one per orchestrator process."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis
        self.waiting: dict[str, asyncio.Future[ApprovalAnswer]] = {}

    def on_answer(self, answer: ApprovalAnswer) -> None:
        future = self.waiting.get(answer.request_id)
        if future and not future.done():
            future.set_result(answer)

    async def _stored(self, request_id: str) -> ApprovalAnswer | None:
        raw = await self.redis.get(answer_key(request_id))
        return ApprovalAnswer.model_validate_json(raw) if raw else None

    async def wait(self, request_id: str, timeout_s: float) -> ApprovalAnswer | None:
        """The answer, or None when nobody answered within `timeout_s`."""
        future: asyncio.Future[ApprovalAnswer] = asyncio.get_running_loop().create_future()
        self.waiting[request_id] = future
        try:
            if stored := await self._stored(request_id):
                return stored
            try:
                return await asyncio.wait_for(future, timeout_s)
            except TimeoutError:
                return await self._stored(request_id)
        finally:
            self.waiting.pop(request_id, None)


def publish_answer(answer: ApprovalAnswer) -> tuple[str, str]:
    """(answer key value, control message) a client writes to answer a request."""
    raw = answer.model_dump_json()
    return raw, json.dumps({"approve": json.loads(raw)})
