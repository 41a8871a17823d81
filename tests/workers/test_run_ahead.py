"""A read's first delivery runs before its claim, which goes with its outcome; a tool that
waits for its claim itself does its harmless part while the claim is out; everything else
runs only after the ledger's verdict. On a real Redis, in a worker's runtime."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from broker import keys
from broker.protocol import CallContext, CallEnvelope, CallOutcome, Group
from tests.conftest import Isolated
from workers.execute import WorkerRuntime
from workers.registry import Registry
from workers.tool import SideEffect, Tool, ToolContext, ToolInput, ToolResult

RUNS = Path()  # set by the fixture: where the tools count their runs


class CountInput(ToolInput):
    pass


class CountedRead(Tool[CountInput]):
    name = "counted_read"
    description = "Counts its runs."
    group = Group.fs
    input_model = CountInput
    side_effect = SideEffect.read

    def run(self, args: CountInput, ctx: ToolContext) -> ToolResult:
        with open(RUNS / "read", "a") as fh:
            fh.write("x")
        return ToolResult(for_llm="fresh")


class CountedWrite(CountedRead):
    name = "counted_write"
    side_effect = SideEffect.write

    def run(self, args: CountInput, ctx: ToolContext) -> ToolResult:
        with open(RUNS / "write", "a") as fh:
            fh.write("x")
        return ToolResult(for_llm="fresh")


class ClaimingWrite(CountedRead):
    """Prepares (counted) while its claim is out, acts (counted) once the claim lets it."""

    name = "claiming_write"
    side_effect = SideEffect.write
    waits_for_claim = True

    def run(self, args: CountInput, ctx: ToolContext) -> ToolResult:
        with open(RUNS / "prepared", "a") as fh:
            fh.write("x")
        ctx.claimed()
        with open(RUNS / "acted", "a") as fh:
            fh.write("x")
        return ToolResult(for_llm="fresh")


class SlowRead(CountedRead):
    name = "slow_read"

    def run(self, args: CountInput, ctx: ToolContext) -> ToolResult:
        time.sleep(1.0)
        return ToolResult(for_llm="slow")


@pytest.fixture
def runtime(isolated: Isolated, tmp_path: Path) -> Iterator[WorkerRuntime]:
    global RUNS
    RUNS = tmp_path
    tools = Registry([CountedRead, CountedWrite, SlowRead, ClaimingWrite])
    rt = WorkerRuntime.start(isolated.settings, tools, "fs", "n")
    yield rt
    rt.stop()


def runs(name: str) -> int:
    path = RUNS / name
    return len(path.read_text()) if path.exists() else 0


def envelope(tool: str, call_id: str, resent: bool = False) -> CallEnvelope:
    return CallEnvelope(
        call_id=call_id,
        job_id="j",
        session_id="s",
        tool=tool,
        input={},
        context=CallContext(workspace="/tmp"),
        timeout_s=5,
        deadline=time.time() + 60,
        reply_to="replies",
        resent=resent,
    )


def replies(client: redis.Redis) -> list[str]:
    return [CallOutcome.model_validate_json(r).for_llm for r in client.lrange("replies", 0, -1)]


def test_a_revoked_call_is_answered_as_revoked_whether_or_not_it_ran_ahead(
    runtime: WorkerRuntime,
) -> None:
    runtime.redis.set(keys.cancel("j"), "the job was cancelled")
    read = runtime.run_call(envelope("counted_read", "r"))
    write = runtime.run_call(envelope("counted_write", "w"))
    assert read is not None and read.is_error and "the job was cancelled" in read.for_llm
    assert write is not None and write.is_error and "the job was cancelled" in write.for_llm
    assert runs("read") == 1  # ran ahead of its verdict; its result was dropped
    assert runs("write") == 0  # a write waits for the verdict, and never ran


def test_a_call_already_answered_is_answered_from_the_ledger(runtime: WorkerRuntime) -> None:
    first = runtime.run_call(envelope("counted_read", "r"))
    assert first is not None and first.for_llm == "fresh" and runs("read") == 1
    stored = first.model_copy(update={"for_llm": "recorded"}).model_dump_json()
    runtime.redis.hset(keys.call("j", 0, "r"), "outcome", stored)
    runtime.redis.delete("replies")
    assert runtime.run_call(envelope("counted_read", "r")) is None  # a duplicate first delivery
    assert runs("read") == 2  # it ran ahead, and what it found was dropped
    assert runtime.run_call(envelope("counted_read", "r", resent=True)) is None
    assert runs("read") == 2  # sent again: the verdict comes first, and it did not run
    assert replies(runtime.redis) == ["recorded", "recorded"]


def test_a_read_sent_again_runs_only_when_the_ledger_lets_it(
    runtime: WorkerRuntime, isolated: Isolated
) -> None:
    """The delivery cap holds for reads: a read that keeps killing its worker is sent
    again by the watchdog (marked), and a marked read runs after its verdict."""
    for dead in ("w1", "w2", "w3"):  # three earlier runners, all dead
        runtime.ledger.begin("j", 0, "r", dead, 3, time.time())
    done = runtime.run_call(envelope("counted_read", "r", resent=True))
    assert done is not None and done.is_error and "died 3 times" in done.for_llm
    assert runs("read") == 0


def test_a_call_whose_runner_died_mid_run_tells_the_model_it_ran_again(
    runtime: WorkerRuntime,
) -> None:
    """A write found begun by a process that died may have taken effect: it runs again
    and its result says so. A read ran again changes nothing and says nothing."""
    runtime.ledger.begin("j", 0, "w", "dead", 3, time.time())
    runtime.ledger.begin("j", 0, "r", "dead", 3, time.time())
    write = runtime.run_call(envelope("counted_write", "w", resent=True))
    read = runtime.run_call(envelope("counted_read", "r", resent=True))
    assert write is not None and write.attempts == 2
    assert write.for_llm.startswith("[ran again after its worker died; its first run may")
    assert write.for_llm.endswith("fresh") and runs("write") == 1
    assert read is not None and read.for_llm == "fresh"
    first = runtime.run_call(envelope("counted_write", "w2"))  # never begun before
    assert first is not None and first.for_llm == "fresh"


def test_the_heartbeat_lists_the_calls_this_process_holds(runtime: WorkerRuntime) -> None:
    """Taken, running or waiting to be recorded: a watchdog that finds a call "running"
    under this live process and not listed knows it was dropped."""
    import json

    key = runtime.hold("j", 3, "c")
    runtime.heartbeat.beat()
    beat = json.loads(runtime.redis.get(keys.proc(runtime.proc_id)) or b"{}")
    assert key in beat["calls"] and beat["at"] > 0
    done = runtime.run_call(envelope("counted_write", "c2"))
    assert done is not None
    runtime.heartbeat.beat()
    beat = json.loads(runtime.redis.get(keys.proc(runtime.proc_id)) or b"{}")
    assert beat["calls"] == [key]  # the finished call is no longer held


def test_a_read_claimed_with_its_outcome_or_while_it_runs_long(runtime: WorkerRuntime) -> None:
    """A quick read is claimed and recorded in one step, its first claim. One still running
    after `read_claim_after_s` (0.2 s) is claimed while it runs, as the watchdog must see
    it, and recorded when it ends: one reply each, one attempt each."""
    import threading

    quick = runtime.run_call(envelope("counted_read", "q"))
    assert quick is not None and quick.attempts == 1
    assert runtime.redis.hmget(keys.call("j", 0, "q"), ["status", "attempts"]) == [b"done", b"1"]
    found: list[CallOutcome | None] = []
    slow = threading.Thread(
        target=lambda: found.append(runtime.run_call(envelope("slow_read", "s")))
    )
    slow.start()
    call = keys.call("j", 0, "s")
    seen = []
    while slow.is_alive():
        seen.append(runtime.redis.hmget(call, ["status", "proc"]))
        time.sleep(0.05)
    slow.join()
    assert [b"running", runtime.proc_id.encode()] in seen  # claimed while it ran
    assert seen[0] == [None, None]  # and not before
    assert found[0] is not None and (found[0].for_llm, found[0].attempts) == ("slow", 1)
    assert runtime.redis.hmget(call, ["status", "attempts"]) == [b"done", b"1"]
    assert replies(runtime.redis) == ["slow", "fresh"]  # pushed to the head


def test_a_tool_that_waits_for_its_claim_acts_only_when_the_ledger_lets_it(
    runtime: WorkerRuntime,
) -> None:
    """It prepares while its claim is out, every time; it acts once, on the delivery the
    ledger lets run. Revoked, answered already, or running elsewhere: it never acts."""
    first = runtime.run_call(envelope("claiming_write", "w"))
    assert first is not None and (first.for_llm, first.attempts) == ("fresh", 1)
    assert (runs("prepared"), runs("acted")) == (1, 1)
    runtime.redis.delete("replies")
    assert runtime.run_call(envelope("claiming_write", "w")) is None  # delivered twice
    assert replies(runtime.redis) == ["fresh"]  # answered from the ledger
    assert (runs("prepared"), runs("acted")) == (2, 1)

    runtime.ledger.begin("j", 0, "busy", "a-live-proc", 3, time.time())
    runtime.redis.set(keys.proc("a-live-proc"), "{}")
    assert runtime.run_call(envelope("claiming_write", "busy")) is None  # left to its runner
    assert (runs("prepared"), runs("acted")) == (3, 1)

    runtime.redis.set(keys.cancel_call("j", 0, "c"), "stopped by the user")
    revoked = runtime.run_call(envelope("claiming_write", "c"))
    assert revoked is not None and revoked.is_error and "stopped by the user" in revoked.for_llm
    assert (runs("prepared"), runs("acted")) == (4, 1)

    runtime.ledger.begin("j", 0, "again", "dead", 3, time.time())  # begun by a dead process
    again = runtime.run_call(envelope("claiming_write", "again"))
    assert again is not None and again.attempts == 2
    assert again.for_llm.startswith("[ran again after its worker died") and runs("acted") == 2
