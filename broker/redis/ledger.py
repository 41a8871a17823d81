"""The hot half of the tool-call ledger: at-least-once delivery, effect recorded once.

Each call has a hash keyed by job and call id. A worker `begin`s a call before running it
and `finish`es it after; both are single Lua scripts, so two deliveries of the same call
can never both run it while its first runner is alive, and the outcome is recorded and
pushed to the waiting orchestrator in one atomic step. `begin` also reads the call's
cancel flags, so a call revoked while it waited is refused without a round trip of its own,
and the live configuration's version, so a worker sees a change applied before the call
without a round trip of its own either.
A call that is harmless to run twice (a read) runs first and is claimed with its outcome:
`begin_finish` is `begin` and, when that claim is the call's first and nothing revoked it
or changed the configuration it ran under, `finish` too, in one round trip. A read runs
unclaimed meanwhile: its process's heartbeat lists it as held, and a taker that died
before any claim is counted as a delivery (`lost`), so a read that kills its runner is
still given up after `max_deliveries`.

A `begin` sent again with the same claim (its reply was lost to a dropped connection) gets
the same answer. A call whose earlier run began and never recorded an outcome is said to
run again (`Begin.again`): its first run may have taken effect, and the model is told.
A missing heartbeat is not taken for a dead owner until Redis has been up for
`trust_after_s`: while it was away, every heartbeat lapsed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import redis

from broker import keys

# KEYS: the call, the job's cancel flag, the call's, the configuration's version;
# ARGV: owner, max deliveries, TTL, when it started, the presence prefix, trust after
CLAIM = """
local cfg = redis.call('GET', KEYS[4]) or '0'
local st = redis.call('HGET', KEYS[1], 'status')
if st == 'done' then return {'done', redis.call('HGET', KEYS[1], 'outcome'), '', '', cfg} end
local again = ''
if st == 'running' then
  local owner = redis.call('HGET', KEYS[1], 'proc')
  if owner == ARGV[1] and redis.call('HGET', KEYS[1], 'started_at') == ARGV[4] then
    -- this very claim sent again (its reply was lost on the way): the same answer
    local cancelled = redis.call('GET', KEYS[2]) or redis.call('GET', KEYS[3]) or ''
    return {'run', redis.call('HGET', KEYS[1], 'attempts'), cancelled, '', cfg}
  end
  if owner ~= ARGV[1] then
    if redis.call('EXISTS', ARGV[5] .. owner) == 1 then return {'busy', owner, '', '', cfg} end
    -- no heartbeat: dead, unless Redis has just come back (every heartbeat lapsed)
    local up = string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)')
    if tonumber(up) < tonumber(ARGV[6]) then return {'busy', owner, '', '', cfg} end
  end
  again = 'ran'
elseif st == 'released' then
  again = 'ran'
elseif st == 'lost' then
  again = 'lost'  -- its taker died before claiming it: a read may have run, nothing else
end
local n = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
redis.call('EXPIRE', KEYS[1], ARGV[3])
if n > tonumber(ARGV[2]) then return {'exhausted', tostring(n - 1), '', '', cfg} end
redis.call('HSET', KEYS[1], 'status', 'running', 'proc', ARGV[1], 'started_at', ARGV[4])
local cancelled = redis.call('GET', KEYS[2]) or redis.call('GET', KEYS[3]) or ''
"""
BEGIN = CLAIM + "return {'run', tostring(n), cancelled, again, cfg}"

# BEGIN for a call sent while its turn was being stored: nothing claimed ('shut') while
# its turn's gate (KEYS[5]), which the orchestrator opens once the turn is stored, is not
BEGIN_OPENED = (
    "if redis.call('EXISTS', KEYS[5]) == 0 then return {'shut', '', '', '', ''} end\n" + BEGIN
)

# CLAIM, then, for a first claim nothing revoked whose configuration (ARGV[7]) is still in
# force and whose other values (KEYS[6..], each as ARGV[9..] says) did not move, FINISH's
# record and push of the outcome (ARGV[8]) to KEYS[5]; 'moved' when one of those moved
BEGIN_FINISH = (
    CLAIM
    + """
local moved = ''
for i = 6, #KEYS do
  if redis.call('GET', KEYS[i]) ~= ARGV[i + 3] then moved = 'moved' end
end
if n == 1 and again == '' and cancelled == '' and cfg == ARGV[7] and moved == '' then
  redis.call('HSET', KEYS[1], 'status', 'done', 'outcome', ARGV[8])
  redis.call('LPUSH', KEYS[5], ARGV[8])
  redis.call('EXPIRE', KEYS[5], ARGV[3])
  return {'recorded', '1', '', '', cfg}
end
return {'run', tostring(n), cancelled, again, cfg, moved}
"""
)

# KEYS: the call; ARGV: the TTL. A delivery taken from the queue by a process that died
# before claiming it: counted, as a claimed one that died would be (a read runs before its
# claim, and may be what killed it). 0 when the call is running or done meanwhile.
LOST = """
local st = redis.call('HGET', KEYS[1], 'status')
if st == 'running' or st == 'done' then return 0 end
redis.call('HINCRBY', KEYS[1], 'attempts', 1)
if not st then redis.call('HSET', KEYS[1], 'status', 'lost') end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
"""

UNCLAIMED = (None, b"lost", b"released")  # statuses of a call nobody is running

# KEYS: the call; ARGV: its owner, when it started. A live process that no longer holds
# the call it began (its heartbeat lists what it holds) lets it go: the next delivery runs.
RELEASE = """
if redis.call('HGET', KEYS[1], 'status') == 'running'
  and redis.call('HGET', KEYS[1], 'proc') == ARGV[1]
  and redis.call('HGET', KEYS[1], 'started_at') == ARGV[2] then
  redis.call('HSET', KEYS[1], 'status', 'released')
  return 1
end
return 0
"""

FINISH = """
if redis.call('HGET', KEYS[1], 'status') == 'done' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'done', 'outcome', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('LPUSH', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"""

# "shut": sent while its turn was being stored (CallEnvelope.gate), and not yet known
# stored; "void": that turn was not stored
Verdict = Literal["run", "done", "busy", "exhausted", "recorded", "shut", "void"]


@dataclass(frozen=True)
class Begin:
    verdict: Verdict
    detail: str  # attempt number, stored outcome JSON, or the busy owner ("recorded": 1)
    cancelled: str = ""  # with "run": why the call must not run (its job or it was revoked)
    again: bool = False  # with "run": an earlier run began and never recorded an outcome
    config_version: int = -1  # the live configuration's version as it was claimed (-1: unread)
    moved: bool = False  # with "run" for a read that ran: a value its result rests on moved


class Ledger:
    """Synchronous ledger operations, used inside worker processes."""

    def __init__(
        self,
        client: redis.Redis,
        ttl_s: int,
        trust_after_s: float = 5.0,
        config_key: str = keys.version(keys.CONFIG_TOPIC),
    ) -> None:
        self.client = client
        self.config_key = config_key  # its version comes with each verdict (`follow_config`)
        self.ttl_s = ttl_s
        self.trust_after_s = trust_after_s  # Redis up this long: a lapsed heartbeat is death
        self._begin = client.register_script(BEGIN)
        self._finish = client.register_script(FINISH)
        self._begin_finish = client.register_script(BEGIN_FINISH)
        self._begin_opened = client.register_script(BEGIN_OPENED)

    def begin(
        self,
        job_id: str,
        turn: int,
        call_id: str,
        proc_id: str,
        max_deliveries: int,
        now: float,
        gate: str = "",
    ) -> Begin:
        """Claim a call; with `gate` (`CallEnvelope.gate`), only if its turn's gate is open
        (else "shut", nothing claimed): one round trip for both."""
        names, args = self._begin_args(job_id, turn, call_id, proc_id, max_deliveries, now)
        if gate:
            return _verdict(self._begin_opened(keys=[*names, keys.turn_gate(gate)], args=args))
        return _verdict(self._begin(keys=names, args=args))

    def begin_finish(
        self,
        job_id: str,
        turn: int,
        call_id: str,
        proc_id: str,
        max_deliveries: int,
        now: float,
        config_version: int,
        reply_to: str,
        outcome_json: str,
        rests_on: dict[str, str] | None = None,
    ) -> Begin:
        """Claim a call that already ran, and record and push its outcome if the claim is
        its first, unrevoked, under `config_version`, with every key of `rests_on` still
        at the value the run found (verdict "recorded"); otherwise the verdict `begin`
        gives, the call claimed as `begin` claims it (`moved`: a key of `rests_on` moved)."""
        names, args = self._begin_args(job_id, turn, call_id, proc_id, max_deliveries, now)
        rests_on = rests_on or {}
        found = self._begin_finish(
            keys=[*names, reply_to, *rests_on],
            args=[*args, str(config_version), outcome_json, *rests_on.values()],
        )
        return _verdict(found)

    def finish(
        self, job_id: str, turn: int, call_id: str, reply_to: str, outcome_json: str
    ) -> bool:
        """Record the outcome and push it; False if an outcome was already recorded."""
        done = self._finish(
            keys=[keys.call(job_id, turn, call_id), reply_to], args=[outcome_json, self.ttl_s]
        )
        return bool(done)

    def _begin_args(
        self, job_id: str, turn: int, call_id: str, proc_id: str, max_deliveries: int, now: float
    ) -> tuple[list[str], list[Any]]:
        names = [
            keys.call(job_id, turn, call_id),
            keys.cancel(job_id),
            keys.cancel_call(job_id, turn, call_id),
            self.config_key,
        ]
        args = [proc_id, max_deliveries, self.ttl_s, now, keys.PROC_PREFIX, self.trust_after_s]
        return names, args


def _verdict(found: list[Any]) -> Begin:
    verdict, detail, cancelled, again, config, *moved = (v.decode() if v else "" for v in found)
    return Begin(
        verdict,  # type: ignore[arg-type]
        detail,
        cancelled,
        again == "ran",
        int(config or 0),
        moved == ["moved"],
    )
