"""Custom tool declarations for an orchestrator's jobs, per agent, cached until the
`custom_tools` version counter moves (one Redis read per job), so a tool defined on any
process is seen by the next job of every orchestrator, with no stale cache."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from psycopg_pool import AsyncConnectionPool

from broker import keys
from broker.stores.custom_tools import TOPIC, tools_for_agent
from workers.tool import Tool
from workers.tools.custom_tools.tool import tool_class


class CustomCatalog:
    def __init__(self, redis: aioredis.Redis, pool: AsyncConnectionPool) -> None:
        self.redis = redis
        self.pool = pool
        self.version: bytes | str | None = None
        self.by_agent: dict[str, list[type[Tool[Any]]]] = {}

    async def for_agent(self, agent_id: str) -> list[type[Tool[Any]]]:
        version = await self.redis.get(keys.version(TOPIC))
        if version != self.version:
            self.by_agent, self.version = {}, version
        if agent_id not in self.by_agent:
            rows = await tools_for_agent(self.pool, agent_id)
            self.by_agent[agent_id] = [tool_class(r) for r in rows]
        return self.by_agent[agent_id]
