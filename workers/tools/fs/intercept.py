"""Interceptors: paths the fs tools route to PostgreSQL instead of the disk (goclaw §3).

The seven context files (SOUL.md, …) at the workspace root go to the context-file store,
MEMORY.md, memory.md and memory/** to the memory store. The fs tools declare them
(`interceptors`); the dispatcher knows nothing of this, and an intercepted call never
touches the workspace disk.

A write names the version the job last read (kept per job in Redis), so a concurrent
write fails with a conflict instead of being lost; a database error refuses the call and
never falls back to the disk.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import PurePosixPath
from typing import Protocol

import psycopg
import redis
from psycopg.rows import tuple_row

from broker import keys
from broker.stores.context_files import (
    CONTEXT_FILES,
    NAMES_SQL,
    AgentKind,
    ContextFileStore,
    VersionConflict,
    jobs_may_write,
    owner_of,
)
from broker.stores.memory import PATHS_UNDER_SQL, ROOT_NAMES_SQL, MemoryStore
from workers.tool import ToolContext, ToolError
from workers.tools.fs import listing_cache
from workers.tools.fs.listing_cache import Entry, ListingCache

log = logging.getLogger(__name__)

INDEX_TASK = "clawq.memory.index"
READS_TTL_S = 24 * 3600
MEMORY_FILES = ("MEMORY.md", "memory.md")


def virtual_path(path: str, workspace: str) -> str | None:
    """The path relative to the workspace root, normalised, or None when outside it."""
    if os.path.isabs(path):
        path = os.path.relpath(os.path.normpath(path), os.path.normpath(workspace))
    rel = os.path.normpath(path or ".")
    if rel == ".." or rel.startswith("../"):
        return None
    return PurePosixPath(rel).as_posix()


@dataclass
class Seen:
    """What a job has read of a routed document: its version per write target."""

    redis: redis.Redis | None
    job_id: str

    def key(self) -> str:
        return f"clawq:reads:{self.job_id}"

    def get(self, target: str) -> int | None:
        if self.redis is None:
            return None
        raw = self.redis.hget(self.key(), target)
        return int(raw) if raw is not None else None

    def set(self, target: str, version: int, written_by: str = "") -> None:
        """`written_by`: the agent whose routed file this job wrote (its token changes)."""
        if self.redis is None:
            return
        pipe = self.redis.pipeline()
        pipe.hset(self.key(), target, version)
        pipe.expire(self.key(), READS_TTL_S)
        if written_by:
            listing_cache.changed(pipe, written_by)
        pipe.execute()


@dataclass
class Found:
    """A routed document as a job sees it: its text, and the version of the copy the job
    would write (0: none yet, e.g. an open agent's user reading the template)."""

    content: str
    target: str
    target_version: int


class Interceptor(Protocol):
    def claims(self, rel: str) -> bool: ...

    def read(self, rel: str, ctx: ToolContext) -> Found: ...

    def write(self, rel: str, content: str, ctx: ToolContext, *, append: bool) -> str: ...

    def edit(
        self, rel: str, ctx: ToolContext, change: Callable[[str], tuple[str, int]]
    ) -> tuple[str, int]: ...

    def listing(self, rel: str, ctx: ToolContext) -> Listing | None: ...

    def owns_directory(self, rel: str) -> bool: ...


@dataclass(frozen=True)
class Listing:
    """What an interceptor reads to list a directory: a query of one text column, and the
    names it makes of its values. list_files reads every interceptor's in one statement
    (`listed`)."""

    sql: str
    params: tuple[object, ...]
    names: Callable[[list[str]], list[str]] = sorted


LISTINGS = ListingCache()  # this process's


def listed(listings: list[Listing], rel: str, ctx: ToolContext) -> list[str]:
    """The names of all the listings, read in one statement: each listing's query is a
    branch of a UNION ALL, its rows tagged with its place (one PostgreSQL exchange, where
    a pipeline of several statements cost a quarter more). A read running before its
    claim is answered from this process's cache, the claim checking the entry's token."""
    if not listings:
        return []
    sql = " UNION ALL ".join(
        f"SELECT {i}, v FROM ({item.sql}) AS listing{i}(v)" for i, item in enumerate(listings)
    )
    params = tuple(p for item in listings for p in item.params)
    agent, max_age = ctx.context.agent_id, ctx.settings.list_cache_s
    if ctx.rests_on is not None and (hit := LISTINGS.get((sql, params), max_age)):
        ctx.rests_on[keys.routed_files(agent)] = hit.token
        return list(hit.names)
    began, token = time.monotonic(), _token(ctx, agent)
    with database("list", rel):
        rows = _store(ctx).cursor(row_factory=tuple_row).execute(sql, params).fetchall()
    values: list[list[str]] = [[] for _ in listings]
    for i, value in rows:
        values[i].append(value)
    names = [
        name for item, found in zip(listings, values, strict=True) for name in item.names(found)
    ]
    if token:
        LISTINGS.put((sql, params), Entry(token, tuple(names), began))
    return names


def _token(ctx: ToolContext, agent: str) -> str:
    """The agent's token to cache a listing under ("": none, so no entry)."""
    if ctx.redis is None or ctx.settings.list_cache_s <= 0:
        return ""
    try:
        return listing_cache.token(ctx.redis, agent)
    except redis.RedisError:  # the listing itself needs only PostgreSQL
        return ""


@contextmanager
def database(action: str, rel: str) -> Iterator[None]:
    """psycopg errors become a refusal the model can read; nothing falls back to disk."""
    try:
        yield
    except VersionConflict as exc:
        raise ToolError(
            f"'{rel}' changed since you read it (now version {exc.current}); read it again "
            "and make your change on what is there now"
        ) from None
    except psycopg.Error as exc:
        log.warning("store error on %s of %s: %s", action, rel, exc)
        raise ToolError(
            f"could not {action} '{rel}': the store is unavailable ({type(exc).__name__}); "
            "nothing was changed, try again later"
        ) from None


def _store(ctx: ToolContext) -> psycopg.Connection[object]:
    if ctx.store is None:
        raise ToolError("this worker has no database; routed files cannot be used here")
    return ctx.store().conn


def target_of(kind: str, agent: str, owner: str, rel: str) -> str:
    """The key of a routed document in a job's read versions."""
    return "\x1f".join((kind, agent, owner, rel))


def remember(ctx: ToolContext, target: str, version: int) -> None:
    Seen(ctx.redis, ctx.job_id).set(target, version)


def wrote(ctx: ToolContext, target: str, version: int) -> None:
    """After a write committed, before its outcome is recorded: the version the job now
    holds, and a new token for the agent's routed files (`listing_cache`)."""
    Seen(ctx.redis, ctx.job_id).set(target, version, written_by=ctx.context.agent_id)


def writable(kind: AgentKind, rel: str, agent: str) -> None:
    if not jobs_may_write(kind, rel):
        raise ToolError(
            f"'{rel}' belongs to agent {agent} (a predefined agent) and a job cannot change "
            "it; only USER.md and BOOTSTRAP.md are yours to write"
        )


def _expected(ctx: ToolContext, rel: str, target: str, current: int) -> int:
    """The version a whole-file write must find: the one this job read."""
    seen = Seen(ctx.redis, ctx.job_id).get(target)
    if seen is None:
        if current:
            raise ToolError(f"'{rel}' exists; read it first, then write it")
        return 0
    return seen


class ContextFiles:
    """SOUL.md, IDENTITY.md, AGENTS.md, TOOLS.md, HEARTBEAT.md, USER.md, BOOTSTRAP.md."""

    def claims(self, rel: str) -> bool:
        return rel in CONTEXT_FILES

    def owns_directory(self, rel: str) -> bool:
        return False

    def _where(self, rel: str, ctx: ToolContext) -> tuple[ContextFileStore, str, AgentKind]:
        c = ctx.context
        store = ContextFileStore(_store(ctx))
        kind = store.kind(c.agent_id)
        return store, owner_of(kind, rel, c.user_id), kind

    def read(self, rel: str, ctx: ToolContext) -> Found:
        c = ctx.context
        with database("read", rel):
            store, owner, _ = self._where(rel, ctx)
            mine = store.get(c.agent_id, owner, rel)
            shown = mine or (store.get(c.agent_id, "", rel) if owner else None)
        if shown is None:
            raise ToolError(f"'{rel}' does not exist")
        target = target_of("ctx", c.agent_id, owner, rel)
        found = Found(shown.content, target, mine.version if mine else 0)
        remember(ctx, target, found.target_version)
        return found

    def write(self, rel: str, content: str, ctx: ToolContext, *, append: bool) -> str:
        c = ctx.context
        with database("write", rel):
            store, owner, kind = self._where(rel, ctx)
            writable(kind, rel, c.agent_id)
            target = target_of("ctx", c.agent_id, owner, rel)
            current = store.version(c.agent_id, owner, rel)
            if rel == "BOOTSTRAP.md" and not append and not content.strip():
                existed = store.delete(c.agent_id, owner, rel)
                wrote(ctx, target, 0)
                return "deleted BOOTSTRAP.md" if existed else "BOOTSTRAP.md did not exist"
            if append:
                base = self._shown(store, c.agent_id, owner, rel)
                version = store.put(c.agent_id, owner, rel, base + content, current)
            else:
                expected = _expected(ctx, rel, target, current)
                version = store.put(c.agent_id, owner, rel, content, expected)
        wrote(ctx, target, version)
        scope = "your copy of" if owner else "the agent's"
        return f"{'appended to' if append else 'wrote'} {scope} {rel} (version {version})"

    def edit(
        self, rel: str, ctx: ToolContext, change: Callable[[str], tuple[str, int]]
    ) -> tuple[str, int]:
        c = ctx.context
        with database("edit", rel):
            store, owner, kind = self._where(rel, ctx)
            writable(kind, rel, c.agent_id)
            current = store.version(c.agent_id, owner, rel)
            base = self._shown(store, c.agent_id, owner, rel, missing_ok=False)
            updated, count = change(base)
            version = store.put(c.agent_id, owner, rel, updated, current)
        wrote(ctx, target_of("ctx", c.agent_id, owner, rel), version)
        return f"edited {rel} (version {version})", count

    @staticmethod
    def _shown(
        store: ContextFileStore, agent: str, owner: str, rel: str, missing_ok: bool = True
    ) -> str:
        found = store.get(agent, owner, rel) or (store.get(agent, "", rel) if owner else None)
        if found is None and not missing_ok:
            raise ToolError(f"'{rel}' does not exist")
        return found.content if found else ""

    def listing(self, rel: str, ctx: ToolContext) -> Listing | None:
        if rel != "." or ctx.store is None:  # no database here: the disk's listing alone
            return None
        c = ctx.context
        return Listing(NAMES_SQL, (c.agent_id, c.user_id))


class Memory:
    """MEMORY.md, memory.md and memory/**: the user's copy first, then the agent's global
    memory; a write goes to the user's copy (the global one when the job has no user)."""

    def claims(self, rel: str) -> bool:
        return rel in MEMORY_FILES or rel.startswith("memory/")

    def owns_directory(self, rel: str) -> bool:
        return rel == "memory" or rel.startswith("memory/")

    def read(self, rel: str, ctx: ToolContext) -> Found:
        c = ctx.context
        with database("read", rel):
            store = MemoryStore(_store(ctx))
            shown = store.get(c.agent_id, c.user_id, rel)
            mine = shown if shown and shown.user_id == c.user_id else None
            if shown is not None and mine is None:
                mine = store.exact(c.agent_id, c.user_id, rel)
        if shown is None:
            raise ToolError(f"'{rel}' does not exist")
        target = target_of("mem", c.agent_id, c.user_id, rel)
        found = Found(shown.content, target, mine.version if mine else 0)
        remember(ctx, target, found.target_version)
        return found

    def write(self, rel: str, content: str, ctx: ToolContext, *, append: bool) -> str:
        c = ctx.context
        cap = ctx.settings.memory_max_document_bytes
        target = target_of("mem", c.agent_id, c.user_id, rel)
        index = rel.endswith(".md")
        with database("write", rel):
            store = MemoryStore(_store(ctx))
            mine = store.exact(c.agent_id, c.user_id, rel)
            if append:
                base = mine or store.get(c.agent_id, c.user_id, rel)
                text = (base.content if base else "") + content
                expected: int | None = mine.version if mine else 0
            else:
                text = content
                expected = _expected(ctx, rel, target, mine.version if mine else 0)
            if len(text.encode()) > cap:
                raise ToolError(f"'{rel}' would be larger than {cap} bytes; split it")
            doc = store.put(
                c.agent_id, c.user_id, rel, text, expected, index=index, job_id=ctx.job_id
            )
        wrote(ctx, target, doc.version)
        if index:
            queue_index(ctx, doc.id, doc.version)
        scope = "your memory" if c.user_id else "the agent's memory"
        return f"{'appended to' if append else 'wrote'} {rel} in {scope} (version {doc.version})"

    def edit(
        self, rel: str, ctx: ToolContext, change: Callable[[str], tuple[str, int]]
    ) -> tuple[str, int]:
        c = ctx.context
        index = rel.endswith(".md")
        with database("edit", rel):
            store = MemoryStore(_store(ctx))
            mine = store.exact(c.agent_id, c.user_id, rel)
            base = mine or store.get(c.agent_id, c.user_id, rel)
            if base is None:
                raise ToolError(f"'{rel}' does not exist")
            updated, count = change(base.content)
            if len(updated.encode()) > ctx.settings.memory_max_document_bytes:
                raise ToolError(f"'{rel}' would be too large; split it")
            doc = store.put(
                c.agent_id,
                c.user_id,
                rel,
                updated,
                mine.version if mine else 0,
                index=index,
                job_id=ctx.job_id,
            )
        wrote(ctx, target_of("mem", c.agent_id, c.user_id, rel), doc.version)
        if index:
            queue_index(ctx, doc.id, doc.version)
        return f"edited {rel} (version {doc.version})", count

    def listing(self, rel: str, ctx: ToolContext) -> Listing | None:
        c = ctx.context
        if rel != "." and not self.owns_directory(rel):
            return None
        if rel == ".":
            if ctx.store is None:
                return None
            return Listing(ROOT_NAMES_SQL, (c.agent_id, c.user_id) * 2)
        prefix = rel.rstrip("/") + "/"
        return Listing(
            PATHS_UNDER_SQL, (c.agent_id, c.user_id, prefix), partial(self._names, prefix)
        )

    @staticmethod
    def _names(prefix: str, paths: list[str]) -> list[str]:
        """The entries of the directory `prefix`: its documents, and its subdirectories
        (ending in '/')."""
        below = {p[len(prefix) :] for p in paths}
        return sorted({b.split("/", 1)[0] + ("/" if "/" in b else "") for b in below})


def queue_index(ctx: ToolContext, document_id: int, version: int) -> None:
    """Send the index task; if that fails the outbox row stays and the sweeper sends it."""
    if ctx.celery is None:
        return
    try:
        ctx.celery().send_task(INDEX_TASK, args=[document_id, version], queue="memory")
    except Exception as exc:  # the broker is down: the sweeper will send it
        log.warning("index task for document %s not sent (%s); the sweeper will", document_id, exc)


ROUTED: tuple[Interceptor, ...] = (ContextFiles(), Memory())


def routed(
    interceptors: tuple[Interceptor, ...], path: str, ctx: ToolContext
) -> Interceptor | None:
    rel = virtual_path(path, ctx.context.workspace)
    if rel is None:
        return None
    return next((i for i in interceptors if i.claims(rel)), None)
