"""A write sent while its turn was being stored (`CallEnvelope.gate`) acts only once the
turn is stored: its worker stores the file's checkpoint meanwhile, and claims the call and
writes once the orchestrator has opened the turn's gate. A gate still shut is answered by
the transcript: the call acts if it is stored there with this input, and never otherwise
(nothing claimed, nothing recorded, the file as it was). On a real Redis and PostgreSQL,
in a worker's runtime, as the fs worker runs calls; the effect is counted in the file."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from broker import keys
from broker.pg.store import Store
from broker.protocol import CallContext, CallEnvelope, CallOutcome, JobSpec
from tests.chaos.services import OwnRedis
from tests.conftest import Isolated
from workers import outcomes
from workers.execute import WorkerRuntime
from workers.registry import default_registry

LINE = {"path": "out.txt", "content": "a line\n", "append": True}


@pytest.fixture
def runtime(isolated: Isolated, monkeypatch: pytest.MonkeyPatch) -> Iterator[WorkerRuntime]:
    monkeypatch.setattr(outcomes, "GATE_WAIT_S", 1)
    rt = WorkerRuntime.start(isolated.settings, default_registry(), "fs", "n")
    yield rt
    rt.stop()


def envelope(workspace: Path, gate: str, **args: Any) -> CallEnvelope:
    return CallEnvelope(
        call_id="w",
        job_id="j",
        session_id="s",
        tool="write_file",
        input=args or LINE,
        context=CallContext(workspace=str(workspace)),
        timeout_s=5,
        deadline=time.time() + 60,
        reply_to="replies",
        gate=gate,
    )


class Running:
    """run_call on a thread of its own, as a worker's pool thread runs it."""

    def __init__(self, rt: WorkerRuntime, env: CallEnvelope) -> None:
        self.outcome: CallOutcome | None = None
        self.thread = threading.Thread(target=self._run, args=(rt, env))
        self.thread.start()

    def _run(self, rt: WorkerRuntime, env: CallEnvelope) -> None:
        self.outcome = rt.run_call(env)

    def done(self, timeout: float = 15) -> CallOutcome | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the call still runs"
        return self.outcome


def stored(db: Store, **args: Any) -> None:
    """Job j's turn 0 in the transcript, with call w and this input."""
    db.create_job("j", "s", JobSpec(prompt="p", workspace="/nowhere"))
    db.conn.execute(
        "INSERT INTO tool_calls (job_id, turn, call_id, seq, name, input, status, queue)"
        " VALUES ('j', 0, 'w', 0, 'write_file', %s::jsonb, 'queued', 'fs')",
        (json.dumps(args or LINE),),
    )


def test_a_write_sent_gated_acts_once_its_turn_is_stored(
    runtime: WorkerRuntime, workspace: Path
) -> None:
    (workspace / "out.txt").write_text("before\n")
    running = Running(runtime, envelope(workspace, "g1"))
    time.sleep(0.5)  # the gate shut: taken and held, neither claimed nor written
    assert (workspace / "out.txt").read_text() == "before\n"
    assert runtime.redis.exists(keys.call("j", 0, "w")) == 0
    assert "j:0:w" in runtime.held
    runtime.redis.rpush(keys.turn_gate("g1"), "stored")
    outcome = running.done()
    assert outcome is not None and not outcome.is_error, outcome
    assert (workspace / "out.txt").read_text() == "before\na line\n"
    # its checkpoint was stored while it waited: the file as it was
    prior = outcome.metadata["checkpoint"]["prior"]
    found = runtime.store().conn.execute("SELECT id FROM artifacts WHERE id = %s", (prior,))
    assert found.fetchone() is not None
    assert runtime.redis.lrange(keys.turn_gate("g1"), 0, -1) == [b"stored"]  # left open


def test_a_write_whose_turn_is_not_stored_never_acts(
    runtime: WorkerRuntime, workspace: Path
) -> None:
    started = time.monotonic()
    assert Running(runtime, envelope(workspace, "g2")).done() is None
    assert time.monotonic() - started >= 1  # the gate was waited for
    assert not (workspace / "out.txt").exists()
    assert runtime.redis.exists(keys.call("j", 0, "w")) == 0  # nothing claimed
    assert runtime.redis.llen("replies") == 0  # nor answered
    assert "j:0:w" not in runtime.held


def test_a_write_whose_gate_was_lost_acts_on_its_stored_turn(
    runtime: WorkerRuntime, workspace: Path, db: Store
) -> None:
    stored(db)  # stored, and the gate never opened (Redis lost it, the orchestrator died)
    outcome = Running(runtime, envelope(workspace, "g3")).done()
    assert outcome is not None and not outcome.is_error, outcome
    assert (workspace / "out.txt").read_text() == "a line\n"


def test_a_write_whose_turn_was_stored_with_another_input_never_acts(
    runtime: WorkerRuntime, workspace: Path, db: Store
) -> None:
    # the job resumed elsewhere and the model, asked again, gave the same id another input
    stored(db, path="out.txt", content="another\n", append=True)
    assert Running(runtime, envelope(workspace, "g4")).done() is None
    assert not (workspace / "out.txt").exists()
    assert runtime.redis.exists(keys.call("j", 0, "w")) == 0


def test_a_later_delivery_of_a_call_whose_turn_is_not_stored_claims_nothing(
    runtime: WorkerRuntime, workspace: Path
) -> None:
    """A delivery after one that was claimed and let go: the ledger is left as it was (the
    next delivery runs it, told it may have run), its count of deliveries unchanged."""
    call = keys.call("j", 0, "w")
    runtime.redis.hset(call, mapping={"status": "released", "attempts": 1})
    env = envelope(workspace, "g6").model_copy(update={"resent": True})
    assert Running(runtime, env).done() is None
    assert not (workspace / "out.txt").exists()
    assert runtime.redis.hmget(call, "status", "attempts") == [b"released", b"1"]


def test_a_call_sent_again_waits_for_its_gate_too(runtime: WorkerRuntime, workspace: Path) -> None:
    """A resend (its taker died before the turn was stored) is claimed, and acts, only
    once the turn is stored as well."""
    env = envelope(workspace, "g5").model_copy(update={"resent": True})
    running = Running(runtime, env)
    time.sleep(0.5)
    assert not (workspace / "out.txt").exists()
    assert runtime.redis.exists(keys.call("j", 0, "w")) == 0
    runtime.redis.rpush(keys.turn_gate("g5"), "stored")
    outcome = running.done()
    assert outcome is not None and not outcome.is_error, outcome
    assert (workspace / "out.txt").read_text() == "a line\n"


def test_a_call_that_fails_before_its_effect_waits_for_its_turn_too(
    runtime: WorkerRuntime, workspace: Path
) -> None:
    """An edit that finds nothing to edit fails before it would act: its error is recorded
    only if its turn is stored (a turn asked again may reuse the id)."""
    edit = {"path": "missing.txt", "old_string": "a", "new_string": "b"}
    env = envelope(workspace, "g7").model_copy(update={"tool": "edit_file", "input": edit})
    assert Running(runtime, env).done() is None
    assert runtime.redis.exists(keys.call("j", 0, "w")) == 0  # nothing recorded
    assert runtime.redis.llen("replies") == 0
    env = envelope(workspace, "g8").model_copy(update={"tool": "edit_file", "input": edit})
    running = Running(runtime, env)
    runtime.redis.rpush(keys.turn_gate("g8"), "stored")
    outcome = running.done()
    assert outcome is not None and outcome.is_error, outcome
    assert runtime.redis.hget(keys.call("j", 0, "w"), "status") == b"done"


def test_redis_killed_at_the_gate_the_stored_turn_answers(
    isolated: Isolated, workspace: Path, db: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis dies while a gated write waits at its gate (its opening lost with it): the
    transcript says the turn is stored, so it is claimed as soon as Redis is back, acts
    once, and its outcome is recorded. Nothing acts unclaimed meanwhile. On a Redis server
    of the test's own, killed with SIGKILL."""
    monkeypatch.setattr(outcomes, "GATE_WAIT_S", 1)
    own = OwnRedis()
    own.start()
    rt = WorkerRuntime.start(
        isolated.settings.model_copy(update={"redis_url": own.url}), default_registry(), "fs", "n"
    )
    try:
        running = Running(rt, envelope(workspace, "g9"))
        time.sleep(0.5)  # its checkpoint kept, waiting at the gate
        assert not (workspace / "out.txt").exists()
        stored(db)  # the turn's write committed, and Redis died before its gate opened
        own.kill()
        time.sleep(4)  # the gate unread, the transcript read: its claim waits for Redis
        assert not (workspace / "out.txt").exists()
        assert running.thread.is_alive()
        own.start()
        outcome = running.done(30)
        assert outcome is not None and not outcome.is_error, outcome
        assert (workspace / "out.txt").read_text() == "a line\n"
        client = redis.Redis.from_url(own.url)
        assert client.hget(keys.call("j", 0, "w"), "status") == b"done"
        assert client.llen("replies") == 1
        client.close()
    finally:
        rt.stop()
        own.stop()
