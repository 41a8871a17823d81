"""MCP sessions of one worker process: one long-lived session per server
(`connection.py`), on an event loop of its own (a thread), made after fork and reused by
every call (a new session costs ~0.9 s, a call on a held one ~1.5 ms).

Calls from the worker's thread run on the loop through `run_coroutine_threadsafe`; the
caller polls its job's cancel flag meanwhile, and a cancelled call is cancelled on the
loop, which tells the server. A health check every `mcp_health_interval_s` pings the
server (older protocol) or lists its tools (2026-07-28, which has no ping), which also
refreshes the catalog in PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from broker.config.mcp import McpServer
from broker.config.settings import Settings
from broker.pg.store import StoreNotReady
from broker.redis import changes
from broker.redis.changes import Listener
from workers.tools.mcp.calls import McpError, Progress
from workers.tools.mcp.catalog import Row
from workers.tools.mcp.connection import CONNECT_TIMEOUT_S, Auth, Connection, OnListed, OnState
from workers.tools.mcp.elicit import Asker
from workers.tools.mcp.oauth import OAuthAuth, Rows
from workers.tools.mcp.requests import send

__all__ = ["McpError", "McpManager", "manager_for_process"]
log = logging.getLogger("clawq.mcp")
POLL_S = 0.2  # how often a waiting call looks at its job's cancel flag
BATCH = 100  # progress notifications passed on at once, at most
Heard = tuple[float, float | None, str | None]  # a progress notification: done, of, message


class McpManager:
    """All sessions of this process, on a loop in a thread of its own."""

    def __init__(
        self,
        settings: Settings,
        load_servers: Callable[[], list[McpServer]],
        on_listed: OnListed,
        auth: Auth | None = None,
        on_state: OnState = lambda *_: None,
    ) -> None:
        self.settings = settings
        self.load_servers = load_servers
        self.on_listed = on_listed
        self.auth = auth
        self.on_state = on_state
        self.connections: dict[str, Connection] = {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="clawq-mcp", daemon=True)
        self.thread.start()
        self._wake = asyncio.Event()
        self._health = asyncio.run_coroutine_threadsafe(self._health_loop(), self.loop)

    def nudge(self) -> None:
        """The configuration changed: check every server now, not at the next interval."""
        self.loop.call_soon_threadsafe(self._wake.set)

    def call(
        self,
        server: str,
        tool: str,
        arguments: dict[str, Any],
        *,
        progress: Callable[[list[Heard]], None] | None = None,
        workspace: str = "",
        cancelled: Callable[[], str | None] = lambda: None,
        asker: Asker | None = None,
    ) -> Any:
        """A tool (or a built-in: `resources/read`, ...) of `server`, from the worker's
        thread; `progress` hears the server's progress notifications in order, in this
        thread (which waits anyway: the loop only queues them), as many at a time as came
        meanwhile; a cancel seen by `cancelled()` cancels the request on the server;
        `asker` puts the server's questions to a person (`elicit.py`)."""
        heard: queue.SimpleQueue[Heard | None] = queue.SimpleQueue()
        on_progress: Progress | None = None
        if progress is not None:

            async def on_progress(done: float, of: float | None, message: str | None) -> None:
                heard.put((done, of, message))

        future = asyncio.run_coroutine_threadsafe(
            self._call(server, tool, arguments, on_progress, workspace, asker), self.loop
        )
        future.add_done_callback(lambda _: heard.put(None))  # after every progress put
        checked = time.monotonic()
        while True:
            batch: list[Heard | None] = []
            with contextlib.suppress(queue.Empty):
                batch.append(heard.get(timeout=POLL_S))
                while len(batch) < BATCH:
                    batch.append(heard.get_nowait())
            done = None in batch
            items = [b for b in batch if b is not None]
            if items and progress is not None:
                progress(items)
            if done:
                return future.result()
            if time.monotonic() - checked < POLL_S:
                continue
            checked = time.monotonic()
            why = cancelled()
            if why is not None:
                future.cancel()  # on the loop: the SDK tells the server
                with contextlib.suppress(BaseException):
                    future.result(CONNECT_TIMEOUT_S)
                raise McpError(f"{tool} on MCP server '{server}' was cancelled: {why}") from None

    async def _call(
        self,
        server: str,
        tool: str,
        arguments: dict[str, Any],
        progress: Progress | None,
        workspace: str,
        asker: Asker | None = None,
    ) -> Any:
        connection = self.connections.get(server)
        if connection is None or connection.state != "connected":  # else: the health loop
            connection = await self._sync_one(server)  # follows configuration changes
        return await connection.request(
            tool,
            lambda c, p, kept: send(c, tool, arguments, p, kept),
            progress,
            workspace,
            asker,
        )

    async def _sync_one(self, name: str) -> Connection:
        servers = {s.name: s for s in await asyncio.to_thread(self.load_servers)}
        if name not in servers:
            raise McpError(f"MCP server '{name}' is not configured or is disabled")
        return self._connection(servers[name])

    def _connection(self, config: McpServer) -> Connection:
        current = self.connections.get(config.name)
        if current is not None and current.config != config:  # reconfigured
            current.close_session()
            current = None
        if current is None:
            current = Connection(config, self.settings, self.on_listed, self.auth, self.on_state)
            self.connections[config.name] = current
        return current

    async def _health_loop(self) -> None:
        """Connect to every enabled server, then check them at the interval (or at once
        when nudged). Until the schema exists (a fresh database) there is nothing to do."""
        waiting_for_schema = False
        while True:
            try:
                servers = await asyncio.to_thread(self.load_servers)
                waiting_for_schema = False
                for gone in set(self.connections) - {s.name for s in servers}:
                    self.connections.pop(gone).close_session()
                for config in servers:
                    connection = self._connection(config)
                    if connection.state == "idle":
                        connection.reconnect()
                    else:
                        await connection.check()
            except StoreNotReady as exc:
                if not waiting_for_schema:
                    log.info("MCP servers: %s; waiting for the migrations", exc)
                waiting_for_schema = True
            except Exception:
                log.exception("MCP health check failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.mcp_health_interval_s)
            self._wake.clear()

    def state(self) -> dict[str, str]:
        return {name: c.state for name, c in self.connections.items()}

    def close(self) -> None:
        """End every session (each in its owning task), then the loop."""

        async def stop_all() -> None:
            self._health.cancel()
            owners = [c._owner for c in self.connections.values() if c._owner is not None]
            for connection in self.connections.values():
                connection.state = "idle"
                connection.close_session()
            if owners:
                await asyncio.wait(owners, timeout=5)
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop_all(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()


_manager: McpManager | None = None
_manager_pid = 0


class CatalogStore:
    """The manager's reads of the configured servers and writes of the catalog, on one
    connection of its own. Until the migrations ran, reading says `StoreNotReady`."""

    def __init__(self, settings: Settings) -> None:
        from broker.pg.store import Store

        self.store = Store(settings.database_url)
        self.settings = settings
        self.lock = threading.Lock()

    def load(self) -> list[McpServer]:
        from broker.stores.mcp import McpStore

        with self.lock:
            try:
                return McpStore(self.store).servers(enabled_only=True)
            except psycopg.errors.UndefinedTable as exc:
                raise StoreNotReady("the schema is not there yet") from exc

    def on_listed(self, server: str, rows: list[Row], facts: dict[str, Any]) -> None:
        from broker.stores.mcp import McpStore

        with self.lock:
            McpStore(self.store).replace_tools(server, rows)
            McpStore(self.store).set_facts(server, facts)

    def on_state(self, server: str, state: str, error: str) -> None:
        from broker.stores.mcp import McpStore

        with self.lock:
            McpStore(self.store).set_state(server, state, error)

    def oauth_rows(self) -> Rows:
        """The servers' OAuth grants, on this same connection."""
        from broker.config.secretbox import SecretBox
        from broker.stores.mcp_oauth import McpOAuthStore, OAuthGrant, Status, StoredGrant

        grants = McpOAuthStore(self.store, SecretBox.from_settings(self.settings))

        def load(server: str) -> StoredGrant | None:
            with self.lock:
                return grants.load(server)

        def save(server: str, grant: OAuthGrant, replaces: int | None) -> int | None:
            with self.lock:
                return grants.save(server, grant, replaces=replaces)

        def mark(server: str, status: Status, detail: str) -> None:
            with self.lock:
                grants.mark(server, status, detail)

        return Rows(load, save, mark)

    def close(self) -> None:
        self.store.close()


def manager_for_process(settings: Settings) -> McpManager:
    """This process's manager, made on first use after fork (never inherited); a change
    notice (topic `mcp`) makes it check every server at once."""
    import os

    global _manager, _manager_pid
    if _manager is None or _manager_pid != os.getpid():
        catalog = CatalogStore(settings)
        auth = OAuthAuth(settings, catalog.oauth_rows())
        _manager = McpManager(settings, catalog.load, catalog.on_listed, auth, catalog.on_state)
        _manager_pid = os.getpid()
        nudge = _manager.nudge
        Listener(settings.redis_url, [changes.MCP], lambda _: nudge()).start()
    return _manager
