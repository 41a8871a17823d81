"""Model credentials resting after a rate limit (429), shared by every orchestrator: a key
per credential that expires when the credential may be used again."""

from __future__ import annotations

import redis.asyncio as aioredis

from broker import keys


async def rest(client: aioredis.Redis, provider: str, label: str, seconds: float) -> None:
    """Rest this credential for `seconds` (the latest 429's word counts)."""
    await client.set(keys.cooldown(provider, label), "429", px=max(1, int(seconds * 1000)))


async def resting(client: aioredis.Redis, credentials: list[tuple[str, str]]) -> dict[str, float]:
    """Of these (provider, label) pairs, those resting: `provider:label` → seconds left."""
    if not credentials:
        return {}
    async with client.pipeline(transaction=False) as pipe:
        for provider, label in credentials:
            pipe.pttl(keys.cooldown(provider, label))
        left = await pipe.execute()
    return {
        f"{p}:{lbl}": ms / 1000 for (p, lbl), ms in zip(credentials, left, strict=True) if ms > 0
    }
