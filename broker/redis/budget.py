"""Tree-wide budgets: one per root job, shared by the job and every subagent below it, held
in Redis so every orchestrator charges the same counters atomically.

A charge adds model turns, tokens (from the providers' usage) and cost (micro-dollars from
the price table) in one Lua call and answers whether the tree is now over any limit; a
tree over its budget stays over it, so each of its jobs ends `budget_exceeded` at its next
step. A turn the limit refuses is not counted: a 10-turn budget reports 10 turns."""

from __future__ import annotations

from broker import keys
from broker.protocol import Limits, Usage

# KEYS: the tree's hash; ARGV: turns, tokens, cost (micro-dollars), the three limits
# (0: none), ttl. Answers {turns, tokens, cost, over} after the charge. A turn that would
# pass the turn limit is refused and not counted: `turns` is what the tree ran, and racing
# jobs of one tree cannot count past it (one script, one check).
CHARGE = """
local t = tonumber(redis.call('HGET', KEYS[1], 'turns') or '0')
local asked, limit = tonumber(ARGV[1]), tonumber(ARGV[4])
local over = ''
if asked > 0 and limit > 0 and t + asked > limit then
  over = 'model turns'
else
  t = redis.call('HINCRBY', KEYS[1], 'turns', ARGV[1])
end
local k = redis.call('HINCRBY', KEYS[1], 'tokens', ARGV[2])
local c = redis.call('HINCRBY', KEYS[1], 'cost', ARGV[3])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[7]))
if over ~= '' then
elseif tonumber(ARGV[5]) > 0 and k > tonumber(ARGV[5]) then over = 'tokens'
elseif tonumber(ARGV[6]) > 0 and c > tonumber(ARGV[6]) then over = 'cost' end
return {t, k, c, over}
"""


def price(table: dict[str, tuple[float, float]], model: str, inp: int, out: int) -> float:
    """Dollars for a model's tokens; `table` maps a model to (input, output) dollars per
    million tokens. An unknown model costs nothing (and the token limit still holds)."""
    per_in, per_out = table.get(model, (0.0, 0.0))
    return (inp * per_in + out * per_out) / 1_000_000


class Budget:
    def __init__(self, client: object, ttl_s: int = 7 * 24 * 3600) -> None:
        self.ttl_s = ttl_s
        self._charge = client.register_script(CHARGE)  # type: ignore[attr-defined]

    async def charge(
        self, root_job: str, limits: Limits, turns: int = 0, tokens: int = 0, cost: float = 0.0
    ) -> Usage:
        t, k, c, over = await self._charge(
            keys=[keys.budget(root_job)],
            args=[
                turns,
                tokens,
                round(cost * 1_000_000),
                limits.turns,
                limits.tokens,
                round(limits.cost_usd * 1_000_000),
                self.ttl_s,
            ],
        )
        return Usage(
            turns=int(t),
            tokens=int(k),
            cost_usd=int(c) / 1_000_000,
            over=over.decode() if isinstance(over, bytes) else str(over or ""),
        )


def usage_of(client: object, root_job: str) -> Usage | None:
    """A tree's counters as they stand (a synchronous client), or None if nothing was
    charged to it (no budget set and no provider reported usage)."""
    raw: dict[bytes, bytes] = client.hgetall(keys.budget(root_job))  # type: ignore[attr-defined]
    if not raw:
        return None
    return Usage(
        turns=int(raw.get(b"turns", 0)),
        tokens=int(raw.get(b"tokens", 0)),
        cost_usd=int(raw.get(b"cost", 0)) / 1_000_000,
    )
