"""Tree-wide budgets on real Redis: charges from many tasks add up atomically, the
measure that goes over is named, and a tree over its budget stays over it."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from broker.protocol import Limits
from broker.redis.budget import Budget, price
from tests.conftest import Isolated


def test_charges_add_up_and_the_first_measure_over_is_named(isolated: Isolated) -> None:
    async def go() -> None:
        client = aioredis.Redis.from_url(isolated.redis_url)
        try:
            budget = Budget(client)
            limits = Limits(turns=10, tokens=1000)
            # 8 "orchestrators" charging the same tree at once
            usages = await asyncio.gather(
                *(budget.charge("root-1", limits, turns=1, tokens=100) for _ in range(8))
            )
            assert sorted(u.turns for u in usages) == list(range(1, 9))
            assert all(u.over == "" for u in usages)
            last = await budget.charge("root-1", limits, turns=1, tokens=300)
            assert (last.turns, last.tokens, last.over) == (9, 1100, "tokens")
            again = await budget.charge("root-1", limits)  # a later check: still over
            assert again.over == "tokens"
            other = await budget.charge("root-2", limits, turns=1)
            assert other.turns == 1 and other.over == ""  # trees do not share
            turns = await budget.charge("root-3", Limits(turns=2), turns=3)
            assert turns.over == "model turns"
            costly = await budget.charge("root-4", Limits(cost_usd=0.01), cost=0.0125)
            assert costly.over == "cost" and costly.cost_usd == 0.0125
        finally:
            await client.aclose()

    asyncio.run(go())


def test_price_of_tokens_from_the_table() -> None:
    table = {"gpt-4o-mini": (0.15, 0.60)}
    assert price(table, "gpt-4o-mini", 1_000_000, 500_000) == pytest.approx(0.45)
    assert price(table, "unknown", 10, 10) == 0.0


def test_a_refused_turn_is_not_counted_however_many_race_for_the_last_one(
    isolated: Isolated,
) -> None:
    """A 10-turn budget reports 10 turns (it said 11: the refused turn was counted before
    the comparison), even with 30 jobs of the tree asking at once."""

    async def go() -> None:
        client = aioredis.Redis.from_url(isolated.redis_url)
        try:
            budget = Budget(client)
            limits = Limits(turns=10)
            usages = await asyncio.gather(
                *(budget.charge("tree", limits, turns=1) for _ in range(30))
            )
            allowed = [u for u in usages if not u.over]
            assert len(allowed) == 10 and sorted(u.turns for u in allowed) == list(range(1, 11))
            assert all(u.over == "model turns" and u.turns == 10 for u in usages if u.over)
            tokens = await budget.charge("tree", limits, tokens=5)  # the 10th turn's reply
            assert (tokens.turns, tokens.over) == (10, "")  # at the limit, not over it
            assert (await budget.charge("tree", limits, turns=1)).turns == 10
        finally:
            await client.aclose()

    asyncio.run(go())
