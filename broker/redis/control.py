"""Stopping jobs from anywhere: the cancel flag (seen before every turn) and a push on the
control channel (so the orchestrator running the job stops its work at once)."""

from __future__ import annotations

import json

import redis
import redis.asyncio as aioredis

from broker import keys


def cancel_jobs(client: redis.Redis, job_ids: list[str], reason: str, ttl_s: int) -> None:
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.set(keys.cancel(job_id), reason, ex=ttl_s)
        pipe.publish(keys.CONTROL_CHANNEL, json.dumps({"cancel": job_id}))
    pipe.execute()


async def cancel_jobs_async(
    client: aioredis.Redis, job_ids: list[str], reason: str, ttl_s: int
) -> None:
    async with client.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.set(keys.cancel(job_id), reason, ex=ttl_s)
            pipe.publish(keys.CONTROL_CHANNEL, json.dumps({"cancel": job_id}))
        await pipe.execute()
