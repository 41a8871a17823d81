"""The order of a job's events when its model streams: the turn's start must be on the stream
before the turn's first model delta. The start waits for the turn's first round trip; the
deltas' first write puts it first when it still waits, and otherwise waits for the round
trip that took it (a call's publish). The pipelines here record what was put in them, in
order: the logic under test is which write carries what, and what waits for what."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from broker.config.settings import Settings
from broker.protocol import JobSpec
from orchestrator.job.state import JobState


class Pipe:
    """What a pipeline was given: the events' types, in order."""

    def __init__(self) -> None:
        self.types: list[str] = []

    def xadd(self, key: str, fields: dict[str, str], **_: Any) -> None:
        self.types.append(json.loads(fields["e"])["type"])

    def expire(self, key: str, ttl: int) -> None:
        pass


def job() -> JobState:
    settings = Settings()
    services = SimpleNamespace(settings=settings, registry=None, policy=None)
    return JobState(services, "job-1", "session-1", JobSpec(prompt="p", workspace="/tmp"))  # type: ignore[arg-type]


def test_the_first_delta_write_carries_the_start_that_still_waits() -> None:
    async def go() -> list[str]:
        state = job()
        state.defer("turn_started", turn=1)
        pipe = Pipe()
        await asyncio.wait_for(state.lead(pipe), 1)
        return pipe.types

    assert asyncio.run(go()) == ["turn_started"]


def test_the_first_delta_write_waits_for_the_publish_that_took_the_start() -> None:
    async def go() -> tuple[list[str], bool, list[str]]:
        state = job()
        state.defer("turn_started", turn=1)
        sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        publish = Pipe()
        state.carry_pending(sent)(publish)  # the call's publish takes the start
        deltas = Pipe()
        lead = asyncio.ensure_future(state.lead(deltas))
        await asyncio.sleep(0.05)
        waited = not lead.done()  # its round trip is not over: the deltas wait
        sent.set_result(None)
        await asyncio.wait_for(lead, 1)
        return publish.types, waited, deltas.types

    publish, waited, deltas = asyncio.run(go())
    assert publish == ["turn_started"]
    assert waited
    assert deltas == []
