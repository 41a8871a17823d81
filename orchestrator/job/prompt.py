"""A job's system prompt: its agent's context files (the user's copies where the agent's
kind gives users their own), in a set order, each cut at a cap with a note, then the
job's own system text.

Read from PostgreSQL when the job starts, never cached in the process, so a change to
SOUL.md is seen by the next job on every orchestrator (jobs that start together share one
read, made after each of them asked)."""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from broker.config.settings import Settings
from broker.redis.batching import SharedReads
from broker.stores.context_files import PER_USER_WHEN_PREDEFINED, PROMPT_FILES_SQL

_reads = SharedReads()
HEADER = (
    "# Project context\n"
    "These context files say who you are and how to work; follow them. Change them with "
    "write_file or edit_file (SOUL.md, USER.md, …) when asked to."
)


def cut(name: str, content: str, cap: int) -> str:
    if len(content) <= cap:
        return content
    return (
        content[:cap].rstrip()
        + f"\n[{name} cut at {cap} of {len(content)} characters; read_file {name} for the rest]"
    )


def assemble(files: dict[str, str], settings: Settings, system: str = "") -> str:
    """The prompt from `files` (name → content): in `context_prompt_files` order, each
    at most `context_file_max_chars`, all at most `context_prompt_max_chars`."""
    parts: list[str] = []
    budget = settings.context_prompt_max_chars
    left_out: list[str] = []
    for name in settings.context_prompt_files:
        content = files.get(name, "").strip()
        if not content:
            continue
        section = f"## {name}\n{cut(name, content, settings.context_file_max_chars)}"
        if len(section) > budget:
            if budget > 200:
                section = f"## {name}\n{cut(name, content, budget - len(name) - 120)}"
            else:
                left_out.append(name)
                continue
        parts.append(section)
        budget -= len(section)
    if left_out:
        parts.append(
            f"[left out for the prompt's size cap: {', '.join(left_out)}; read them with read_file]"
        )
    context = "\n\n".join([HEADER, *parts]) if parts else ""
    return "\n\n".join(p for p in (context, system.strip()) if p)


async def context_files(
    pool: AsyncConnectionPool[Any], agent_id: str, user_id: str
) -> dict[str, str]:
    """name → content (shared with the jobs of the same agent and user that start in the
    same pass of the loop: read-only)."""

    async def fetch() -> dict[str, str]:
        async with pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                PROMPT_FILES_SQL, (agent_id, user_id, user_id, list(PER_USER_WHEN_PREDEFINED))
            )
            rows = await cur.fetchall()
        return {row["name"]: row["content"] for row in rows}

    return await _reads.read((pool, agent_id, user_id), fetch)


async def system_prompt(
    pool: AsyncConnectionPool[Any], settings: Settings, agent_id: str, user_id: str, system: str
) -> str:
    return assemble(await context_files(pool, agent_id, user_id), settings, system)
