"""The hot ledger's Lua scripts against a real Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from broker import keys
from broker.redis.ledger import LOST, Ledger
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


def test_a_gated_call_is_claimed_only_through_its_open_gate(client: redis.Redis) -> None:
    """`begin` with a gate: nothing claimed while the turn's gate is shut; once it is open,
    the claim is made as any is, and answered as any is."""
    ledger = Ledger(client, ttl_s=60)
    shut = ledger.begin("job", 0, "c1", "w1", 3, 1.0, gate="g")
    assert shut.verdict == "shut"
    assert client.exists(keys.call("job", 0, "c1")) == 0
    client.rpush(keys.turn_gate("g"), "stored")
    begun = ledger.begin("job", 0, "c1", "w1", 3, 2.0, gate="g")
    assert (begun.verdict, begun.detail) == ("run", "1")
    assert client.hget(keys.call("job", 0, "c1"), "status") == b"running"
    client.set(keys.proc("w1"), "{}")
    assert ledger.begin("job", 0, "c1", "w2", 3, 3.0, gate="g").verdict == "busy"


def test_a_read_that_ran_is_claimed_and_recorded_in_one_step(client: redis.Redis) -> None:
    """`begin_finish`: the claim of a call that already ran, with its outcome recorded and
    pushed, when the claim is its first, unrevoked, under the configuration it ran under."""
    ledger = Ledger(client, ttl_s=60)
    client.set(keys.version(keys.CONFIG_TOPIC), 4)
    begun = ledger.begin_finish("job", 0, "c1", "w1", 3, 1.0, 4, "reply", '{"x": 1}')
    assert (begun.verdict, begun.detail) == ("recorded", "1")
    assert client.hmget(keys.call("job", 0, "c1"), ["status", "outcome", "attempts"]) == [
        b"done",
        b'{"x": 1}',
        b"1",
    ]
    assert client.lrange("reply", 0, -1) == [b'{"x": 1}']
    assert 0 < client.ttl("reply") <= 60
    # asked again (its reply was lost): the recorded outcome, nothing pushed twice
    again = ledger.begin_finish("job", 0, "c1", "w1", 3, 1.0, 4, "reply", '{"x": 2}')
    assert (again.verdict, again.detail) == ("done", '{"x": 1}')
    assert client.llen("reply") == 1


def test_a_read_ahead_is_only_claimed_when_its_result_cannot_stand(client: redis.Redis) -> None:
    """Revoked, run under another configuration, or running elsewhere: claimed as `begin`
    claims (or not at all when busy), nothing recorded, nothing pushed."""
    ledger = Ledger(client, ttl_s=60)
    client.set(keys.version(keys.CONFIG_TOPIC), 5)
    moved = ledger.begin_finish("job", 0, "c1", "w1", 3, 1.0, 4, "reply", "{}")
    assert (moved.verdict, moved.detail, moved.config_version) == ("run", "1", 5)
    assert client.hget(keys.call("job", 0, "c1"), "status") == b"running"
    client.set(keys.cancel_call("job", 0, "c2"), "stopped")
    revoked = ledger.begin_finish("job", 0, "c2", "w1", 3, 1.0, 5, "reply", "{}")
    assert (revoked.verdict, revoked.cancelled) == ("run", "stopped")
    client.set(keys.proc("w2"), "{}")
    ledger.begin("job", 0, "c3", "w2", 3, 1.0)
    busy = ledger.begin_finish("job", 0, "c3", "w1", 3, 2.0, 5, "reply", "{}")
    assert (busy.verdict, busy.detail) == ("busy", "w2")
    assert client.llen("reply") == 0


def test_a_read_ahead_is_recorded_only_while_what_it_rests_on_has_not_moved(
    client: redis.Redis,
) -> None:
    """`rests_on`: keys whose values a read's result was made under (a cache's token). All
    still there and equal: recorded. One changed or gone: claimed, not recorded, `moved`."""
    ledger = Ledger(client, ttl_s=60)
    client.mset({"token:a": "t1", "token:b": "t2"})
    still = {"token:a": "t1", "token:b": "t2"}
    kept = ledger.begin_finish("job", 0, "c1", "w1", 3, 1.0, 0, "reply", "{}", still)
    assert (kept.verdict, kept.moved) == ("recorded", False)
    client.set("token:b", "t3")
    moved = ledger.begin_finish("job", 0, "c2", "w1", 3, 1.0, 0, "reply", "{}", still)
    assert (moved.verdict, moved.detail, moved.moved) == ("run", "1", True)
    assert client.hget(keys.call("job", 0, "c2"), "status") == b"running"
    client.delete("token:a")  # a Redis that lost its keys: no value matches
    gone = ledger.begin_finish("job", 0, "c3", "w1", 3, 1.0, 0, "reply", "{}", {"token:a": "t1"})
    assert (gone.verdict, gone.moved) == ("run", True)
    assert client.llen("reply") == 1  # the first one's outcome alone


def test_a_read_ahead_to_a_redis_without_the_script_still_records_once(
    client: redis.Redis,
) -> None:
    client.script_flush()
    ledger = Ledger(client, ttl_s=60)
    begun = ledger.begin_finish("job", 0, "c", "w1", 3, 1.0, 0, "reply", "{}")
    assert begun.verdict == "recorded"
    assert client.hget(keys.call("job", 0, "c"), "attempts") == b"1"  # not twice
    assert client.llen("reply") == 1


def test_a_delivery_lost_before_its_claim_counts_toward_the_cap(client: redis.Redis) -> None:
    """LOST: its taker died before claiming it. The next claim is its second delivery, a
    read that kills each runner is given up at the cap, and a write (never run unclaimed)
    is not said to have run."""
    ledger = Ledger(client, ttl_s=60)
    call = keys.call("job", 0, "c")
    assert client.eval(LOST, 1, call, 60) == 1
    begun = ledger.begin("job", 0, "c", "w1", 3, 1.0)
    assert (begun.verdict, begun.detail, begun.again) == ("run", "2", False)
    assert client.eval(LOST, 1, call, 60) == 0  # running (w1 took it): not lost
    assert client.eval(LOST, 1, keys.call("job", 0, "d"), 60) == 1
    assert client.eval(LOST, 1, keys.call("job", 0, "d"), 60) == 1  # lost again
    assert ledger.begin("job", 0, "d", "w1", 2, 1.0).verdict == "exhausted"
    ledger.finish("job", 0, "c", "reply", "{}")
    assert client.eval(LOST, 1, call, 60) == 0  # done: not lost


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
