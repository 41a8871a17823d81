"""The hot ledger's Lua scripts against a real Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from broker import keys
from broker.redis.ledger import Ledger
from tests.conftest import Isolated


@pytest.fixture
def client(isolated: Isolated) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(isolated.redis_url) as conn:
        yield conn


def test_a_call_runs_once_and_repeats_are_answered_from_the_ledger(client: redis.Redis) -> None:
    ledger = Ledger(client, ttl_s=60)
    client.set(keys.proc("w1"), "{}")
    first = ledger.begin("job", 0, "c1", "w1", max_deliveries=3, now=1.0)
    assert (first.verdict, first.detail) == ("run", "1")
    client.set(keys.proc("w2"), "{}")
    assert ledger.begin("job", 0, "c1", "w2", 3, 2.0).verdict == "busy"  # owner alive
    assert ledger.finish("job", 0, "c1", "reply", '{"x": 1}') is True
    assert ledger.finish("job", 0, "c1", "reply", '{"x": 2}') is False  # recorded once
    assert client.lrange("reply", 0, -1) == [b'{"x": 1}']
    again = ledger.begin("job", 0, "c1", "w2", 3, 3.0)
    assert (again.verdict, again.detail) == ("done", '{"x": 1}')
    assert ledger.begin("job", 1, "c1", "w2", 3, 3.0).verdict == "run"  # a later turn's c1


def test_dead_owner_is_taken_over_until_the_delivery_cap(client: redis.Redis) -> None:
    ledger = Ledger(client, ttl_s=60)
    verdicts = [ledger.begin("job", 0, "c", f"dead{i}", 2, float(i)).verdict for i in range(3)]
    assert verdicts == ["run", "run", "exhausted"]
    assert client.ttl(keys.call("job", 0, "c")) > 0


def test_begin_reads_the_cancel_flags_of_the_job_and_of_the_call(client: redis.Redis) -> None:
    ledger = Ledger(client, ttl_s=60)
    assert ledger.begin("job", 0, "c1", "w1", 3, 1.0).cancelled == ""
    client.set(keys.cancel_call("job", 0, "c2"), "stopped by a steer")
    assert ledger.begin("job", 0, "c2", "w1", 3, 1.0).cancelled == "stopped by a steer"
    client.set(keys.cancel("job"), "job cancelled")
    revoked = ledger.begin("job", 0, "c3", "w1", 3, 1.0)
    assert (revoked.verdict, revoked.cancelled) == ("run", "job cancelled")


def test_a_begin_sent_ahead_claims_the_call_before_its_verdict_is_read(
    client: redis.Redis,
) -> None:
    """What runs meanwhile runs as the call's claimed runner: a death then is seen as one."""
    ledger = Ledger(client, ttl_s=60)
    client.set(keys.proc("w1"), "{}")
    ledger.begin("job", 0, "c0", "w1", 3, 1.0)  # the script is loaded
    verdict = ledger.begin_sent("job", 0, "c1", "w1", 3, 1.0)
    call = keys.call("job", 0, "c1")
    for _ in range(100):  # Redis runs it on its own, whether or not anyone reads the answer
        if client.hget(call, "status") == b"running":
            break
    assert client.hmget(call, ["status", "proc", "attempts"]) == [b"running", b"w1", b"1"]
    begun = verdict()
    assert (begun.verdict, begun.detail) == ("run", "1")
    client.set(keys.cancel("job"), "stop")
    assert ledger.begin_sent("job", 0, "c2", "w1", 3, 2.0)().cancelled == "stop"


def test_a_begin_sent_to_a_redis_without_the_script_still_claims_once(
    client: redis.Redis,
) -> None:
    client.script_flush()
    ledger = Ledger(client, ttl_s=60)
    begun = ledger.begin_sent("job", 0, "c", "w1", 3, 1.0)()
    assert (begun.verdict, begun.detail) == ("run", "1")
    assert client.hget(keys.call("job", 0, "c"), "attempts") == b"1"  # not twice


def test_the_same_claim_sent_again_gets_the_same_answer(client: redis.Redis) -> None:
    """A `begin` whose reply was lost to a dropped connection is sent again: it is not a
    second delivery (no attempt counted, not taken for a run that died)."""
    ledger = Ledger(client, ttl_s=60)
    client.set(keys.proc("w1"), "{}")
    first = ledger.begin("job", 0, "c", "w1", 3, 5.5)
    again = ledger.begin("job", 0, "c", "w1", 3, 5.5)
    assert (again.verdict, again.detail, again.again) == ("run", "1", False)
    assert first.detail == again.detail
    assert client.hget(keys.call("job", 0, "c"), "attempts") == b"1"


def test_a_call_whose_run_died_runs_again_and_says_so(client: redis.Redis) -> None:
    ledger = Ledger(client, ttl_s=60)
    assert ledger.begin("job", 0, "c", "dead", 3, 1.0).again is False  # its first run
    rerun = ledger.begin("job", 0, "c", "w2", 3, 2.0)  # "dead" has no heartbeat
    assert (rerun.verdict, rerun.detail, rerun.again) == ("run", "2", True)
    # the same process beginning it again (its first run raised) is a run again too
    client.set(keys.proc("w2"), "{}")
    assert ledger.begin("job", 0, "c", "w2", 3, 3.0).again is True


def test_a_released_call_runs_again_and_says_so(client: redis.Redis) -> None:
    """The watchdog releases a call its live owner no longer holds: the next delivery
    runs it, and its first run may have taken effect."""
    from broker.redis.ledger import RELEASE

    ledger = Ledger(client, ttl_s=60)
    client.set(keys.proc("w1"), "{}")
    ledger.begin("job", 0, "c", "w1", 3, 1.0)
    call = keys.call("job", 0, "c")
    assert client.eval(RELEASE, 1, call, "w1", "2.0") == 0  # another claim: left as it is
    assert client.eval(RELEASE, 1, call, "w1", "1.0") == 1
    rerun = ledger.begin("job", 0, "c", "w2", 3, 3.0)
    assert (rerun.verdict, rerun.again) == ("run", True)


def test_a_lapsed_heartbeat_is_not_death_while_redis_has_just_come_back(
    client: redis.Redis,
) -> None:
    """Every heartbeat lapses while Redis is away: until it has been up for a heartbeat
    TTL, a call whose owner has no heartbeat is left to that owner."""
    uptime = int(client.info("server")["uptime_in_seconds"])
    just_back = Ledger(client, ttl_s=60, trust_after_s=uptime + 3600)
    just_back.begin("job", 0, "c", "owner", 3, 1.0)
    assert just_back.begin("job", 0, "c", "w2", 3, 2.0).verdict == "busy"
    settled = Ledger(client, ttl_s=60, trust_after_s=5)
    assert settled.begin("job", 0, "c", "w2", 3, 2.0).verdict == "run"
