"""An outcome is never dropped: a worker whose Redis is away keeps it, records it once Redis
is back, and past the cap spools it to disk and replays it. On a Redis of the test's own,
killed and started again."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.retry import Retry

from broker import keys
from broker.redis.ledger import Begin, Ledger
from tests.chaos.services import OwnRedis
from workers.outcomes import Outcomes


@pytest.fixture
def own() -> Iterator[OwnRedis]:
    server = OwnRedis()
    server.start()
    yield server
    server.stop()


def quick_client(server: OwnRedis) -> redis.Redis:
    """A client that fails at once when Redis is away (the waiting is the Outcomes')."""
    from redis.backoff import NoBackoff

    return redis.Redis(port=server.port, retry=Retry(NoBackoff(), 0), socket_timeout=2)


def test_an_outcome_waits_for_redis_and_is_recorded_once_it_is_back(
    own: OwnRedis, tmp_path: Path
) -> None:
    client = quick_client(own)
    ledger = Ledger(client, ttl_s=60)
    ledger.begin("j", 0, "c", "w", 3, 1.0)
    outcomes = Outcomes(ledger, client, str(tmp_path / "spool"), retry_s=60)
    own.kill()
    recording = threading.Thread(
        target=outcomes.record, args=("j", 0, "c", "replies", '{"x": 1}'), daemon=True
    )
    recording.start()
    time.sleep(1.5)
    assert recording.is_alive()  # kept, not dropped: the process takes no other call
    own.start()
    recording.join(30)
    assert not recording.is_alive()
    assert client.hmget(keys.call("j", 0, "c"), ["status", "outcome"]) == [b"done", b'{"x": 1}']
    assert client.lrange("replies", 0, -1) == [b'{"x": 1}']  # pushed to its orchestrator
    assert not list((tmp_path / "spool").glob("*"))  # nothing was spooled


def test_a_read_claimed_through_an_outage_runs_again_when_it_rested_on_a_value(
    own: OwnRedis, tmp_path: Path
) -> None:
    """Redis away at a read's claim: the claim alone is waited for, so nothing checked the
    values its result rests on (a cached listing's token); it is taken as moved."""
    client = quick_client(own)
    outcomes = Outcomes(Ledger(client, ttl_s=60), client, str(tmp_path / "spool"), retry_s=60)
    client.set("token", "t1")
    own.kill()
    verdicts: list[Begin] = []

    def claim(call: str, rests_on: dict[str, str]) -> None:
        claim = ("j", 0, call, "w", 3, 1.0)
        verdicts.append(outcomes.begin_finish(claim, 0, "replies", "{}", rests_on))

    claims = [
        threading.Thread(target=claim, args=("c1", {"token": "t1"}), daemon=True),
        threading.Thread(target=claim, args=("c2", {}), daemon=True),
    ]
    for thread in claims:
        thread.start()
    time.sleep(1.0)
    own.start()
    for thread in claims:
        thread.join(30)
    moved = {v.moved for v in verdicts}
    assert [v.verdict for v in verdicts] == ["run", "run"] and moved == {True, False}
    assert client.get("token") == b"t1"  # unchanged, kept across the restart: not checked
    assert client.llen("replies") == 0  # nothing recorded without its check


def test_past_the_cap_an_outcome_is_spooled_then_replayed(own: OwnRedis, tmp_path: Path) -> None:
    client = quick_client(own)
    ledger = Ledger(client, ttl_s=60)
    ledger.begin("j", 2, "c", "w", 3, 1.0)
    spool = tmp_path / "spool"
    outcomes = Outcomes(ledger, client, str(spool), retry_s=0.5)
    own.kill()
    outcomes.record("j", 2, "c", "replies", '{"x": 2}')  # returns: spooled
    (entry,) = spool.glob("*.json")
    assert json.loads(entry.read_text())["outcome"] == '{"x": 2}'
    assert outcomes.spooled() == ["j:2:c"]  # the heartbeat lists it: held, not resent
    assert outcomes.replay() == 0  # still away: kept
    own.start()
    # another process of the host (a sibling, or the worker started again) replays it
    sibling = Outcomes(Ledger(quick_client(own), 60), quick_client(own), str(spool), 60)
    assert sibling.replay() == 1
    assert client.hget(keys.call("j", 2, "c"), "status") == b"done"
    assert client.lrange("replies", 0, -1) == [b'{"x": 2}']
    assert not list(spool.glob("*.json")) and outcomes.spooled() == []
