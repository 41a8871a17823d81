"""MCP sessions of one worker process: one long-lived session per server, on an event loop
of its own (a thread), made after fork and reused by every call (a new session costs
~0.9 s, a call on a held one ~1.5 ms).

Each session is owned by one task (anyio's rule: entered and left in the same task);
calls from the worker's thread run on the loop through `run_coroutine_threadsafe`. A
health check every `mcp_health_interval_s` pings the server (older protocol) or lists its
tools (2026-07-28, which has no ping), which also refreshes the catalog in PostgreSQL. A
session found dead is reconnected with tenacity (2 s doubling to 60 s, 10 attempts); then
the server is failed and its calls get a clear error until the next health check.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import threading
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any, Literal

import psycopg
from tenacity import AsyncRetrying, RetryCallState, stop_after_attempt, wait_exponential

from broker.config.mcp import McpServer
from broker.config.settings import Settings
from broker.errors import RunError
from broker.pg.store import StoreNotReady
from broker.redis import changes
from broker.redis.changes import Listener

log = logging.getLogger("clawq.mcp")
CONNECT_TIMEOUT_S = 30.0
LEGACY_PING_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")

State = Literal["idle", "connecting", "connected", "failed"]


class McpError(RunError):
    """A call could not be made or failed at the protocol level; the message is for the
    model: short, and says what to do."""


def describe(exc: BaseException) -> str:
    """The innermost cause of an (often nested) exception group, in one line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, McpError):
        return str(exc)
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


def resolve_command(command: str) -> str:
    """A stdio server's command as a path: a bare name is looked up on this process's PATH
    and then beside its own interpreter (a venv's console scripts, when clawq was started
    as `.venv/bin/clawq` without the venv on the PATH)."""
    if os.sep in command:
        return command
    here = os.path.dirname(sys.executable)
    search = os.pathsep.join(p for p in (os.environ.get("PATH", ""), here) if p)
    found = shutil.which(command, path=search)
    if found is None:
        raise McpError(f"command '{command}' not found on the PATH ({search})")
    return found


class Connection:
    """One server's session and its state."""

    def __init__(
        self,
        config: McpServer,
        settings: Settings,
        on_tools: Callable[..., None],
        on_state: Callable[[str, str, str], None] = lambda *_: None,
    ):
        self.config = config
        self.settings = settings
        self.on_tools = on_tools
        self.on_state = on_state  # (server, state, error): for `clawq mcp list`
        self.state: State = "idle"
        self.last_error = ""
        self.client: Any = None
        self._stop: asyncio.Event | None = None
        self._owner: asyncio.Task[None] | None = None
        self._reconnecting: asyncio.Task[None] | None = None

    async def _transport(self, stack: AsyncExitStack) -> Any:
        """The server's transport; what it needs to be closed with goes on `stack`."""
        from mcp import StdioServerParameters, stdio_client

        c = self.config
        if c.transport == "stdio":
            command = resolve_command(c.command)
            params = StdioServerParameters(command=command, args=c.args, env=c.env, cwd=c.cwd)
            # the process's real stderr: under Celery, sys.stderr is a proxy without a fileno
            return stdio_client(params, errlog=sys.__stderr__ or sys.stderr)
        from workers.egress.async_client import client_factory
        from workers.egress.netguard import EgressPolicy

        # over HTTP, the guarded client: the server's address is checked like any request
        guarded = client_factory(lambda: EgressPolicy.from_settings(self.settings))
        if c.transport == "sse":
            from mcp.client.sse import sse_client

            return sse_client(c.url, headers=c.headers, httpx_client_factory=guarded)
        from mcp.client.streamable_http import streamable_http_client

        # streamable HTTP takes headers through its HTTP client
        http = await stack.enter_async_context(guarded(headers=c.headers))
        return streamable_http_client(c.url, http_client=http)

    async def _own(self, started: asyncio.Future[None]) -> None:
        """Hold the session until told to stop or until it dies."""
        from mcp import Client

        self._stop = asyncio.Event()
        try:
            async with AsyncExitStack() as stack:
                transport = await self._transport(stack)
                client = await stack.enter_async_context(Client(transport))
                self.client = client
                started.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not started.done():
                started.set_exception(McpError(describe(exc)))
            elif self.state == "connected":
                self.lost(describe(exc))
            if isinstance(exc, asyncio.CancelledError) and self._stop and self._stop.is_set():
                raise
        finally:
            self.client = None

    async def _connect_once(self) -> None:
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._owner = asyncio.create_task(self._own(started), name=f"mcp-{self.config.name}")
        await asyncio.wait_for(started, CONNECT_TIMEOUT_S)
        await self.refresh_tools()

    async def _reconnect(self) -> None:
        s = self.settings
        self.state = "connecting"
        name = self.config.name

        async def retrying(state: RetryCallState) -> None:
            """Each failed attempt is said at once, in the log and in the store."""
            failed = state.outcome.exception() if state.outcome else None
            error = describe(failed) if failed else "?"
            self.last_error = error
            wait = state.next_action.sleep if state.next_action else 0
            log.warning(
                "MCP server %s did not start (attempt %d of %d, again in %gs): %s",
                name, state.attempt_number, s.mcp_reconnect_attempts, wait, error,
            )  # fmt: skip
            await self._said("retrying", error)

        try:
            async for attempt in AsyncRetrying(
                wait=wait_exponential(
                    multiplier=s.mcp_reconnect_initial_s, max=s.mcp_reconnect_max_s
                ),
                stop=stop_after_attempt(s.mcp_reconnect_attempts),
                before_sleep=retrying,
                reraise=True,
            ):
                with attempt:
                    await self._connect_once()
            self.state = "connected"
            self.last_error = ""
            log.info("MCP server %s connected", name)
            await self._said("connected", "")
        except Exception as exc:
            self.state = "failed"
            self.last_error = describe(exc)
            log.warning("MCP server %s failed: %s", name, self.last_error)
            await self._said("failed", self.last_error)

    async def _said(self, state: str, error: str) -> None:
        try:
            await asyncio.to_thread(self.on_state, self.config.name, state, error)
        except Exception as exc:  # the store away: the log has said it
            log.debug("MCP server %s: state not stored: %s", self.config.name, exc)

    def reconnect(self) -> asyncio.Task[None]:
        if self._reconnecting is None or self._reconnecting.done():
            self._reconnecting = asyncio.create_task(self._reconnect())
        return self._reconnecting

    def lost(self, reason: str) -> None:
        """The session died: reconnect in the background."""
        if self.state != "connected":
            return
        log.warning("MCP server %s lost: %s", self.config.name, reason)
        self.last_error = reason
        self.close_session()
        self.reconnect()

    def close_session(self) -> None:
        if self._stop is not None:
            self._stop.set()
        self.client = None

    async def session(self, wait_s: float) -> Any:
        if self.state == "connected" and self.client is not None:
            return self.client
        name = self.config.name
        if self.state == "failed":
            raise McpError(
                f"MCP server '{name}' is unavailable: {self.settings.mcp_reconnect_attempts} "
                f"reconnection attempts failed (last: {self.last_error}). Do not retry now."
            )
        task = self.reconnect()
        await asyncio.wait({task}, timeout=wait_s)
        if self.state == "connected" and self.client is not None:
            return self.client
        raise McpError(
            f"MCP server '{name}' is not reachable ({self.last_error or 'connecting'}); "
            "it is being reconnected. Try again later."
        )

    async def call(self, tool: str, arguments: dict[str, Any], timeout_s: float) -> Any:
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        client = await self.session(timeout_s)
        name = self.config.name
        try:
            result = await client.call_tool(tool, arguments, read_timeout_seconds=timeout_s)
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                raise McpError(
                    f"{tool} on MCP server '{name}' timed out after {timeout_s:g}s"
                ) from None
            if exc.code == CONNECTION_CLOSED:
                self.lost(exc.message)
                raise McpError(
                    f"the connection to MCP server '{name}' closed during {tool}; it is being "
                    "reconnected. The call may or may not have run."
                ) from None
            raise McpError(f"MCP server '{name}' refused {tool}: {exc.message}") from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our own cancellation
            self.lost("the session ended during a call")
            raise McpError(
                f"the connection to MCP server '{name}' ended during {tool}; it is being "
                "reconnected. The call may or may not have run."
            ) from None
        except Exception as exc:
            self.lost(describe(exc))
            raise McpError(f"MCP server '{name}' failed during {tool}: {describe(exc)}") from None
        return result.model_dump(mode="json", by_alias=True)

    async def list_tools(self) -> list[Any]:
        tools: list[Any] = []
        cursor = None
        while True:
            page = await self.client.list_tools(cursor=cursor, cache_mode="bypass")
            tools += page.tools
            cursor = page.next_cursor
            if cursor is None:
                return tools

    async def refresh_tools(self) -> None:
        tools = await self.list_tools()
        rows = [(t.name, t.description or "", dict(t.input_schema)) for t in tools]
        await asyncio.to_thread(self.on_tools, self.config.name, rows)

    async def check(self) -> None:
        """The health check: ping where the protocol has it, else list (and refresh)."""
        if self.state == "failed":
            self.reconnect()  # a new round of attempts
            return
        if self.state != "connected" or self.client is None:
            return
        try:
            if self.client.protocol_version in LEGACY_PING_VERSIONS:
                await asyncio.wait_for(self.client.session.send_ping(), CONNECT_TIMEOUT_S)
            else:
                await asyncio.wait_for(self.refresh_tools(), CONNECT_TIMEOUT_S)
        except Exception as exc:
            self.lost(f"health check: {describe(exc)}")


class McpManager:
    """All sessions of this process, on a loop in a thread of its own."""

    def __init__(
        self,
        settings: Settings,
        load_servers: Callable[[], list[McpServer]],
        on_tools: Callable[[str, list[tuple[str, str, dict[str, Any]]]], None],
        on_state: Callable[[str, str, str], None] = lambda *_: None,
    ) -> None:
        self.settings = settings
        self.load_servers = load_servers
        self.on_tools = on_tools
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

    def call(self, server: str, tool: str, arguments: dict[str, Any], timeout_s: float) -> Any:
        future = asyncio.run_coroutine_threadsafe(
            self._call(server, tool, arguments, timeout_s), self.loop
        )
        return future.result(timeout_s + CONNECT_TIMEOUT_S)

    async def _call(
        self, server: str, tool: str, arguments: dict[str, Any], timeout_s: float
    ) -> Any:
        connection = self.connections.get(server)
        if connection is None or connection.state != "connected":  # else: the health loop
            connection = await self._sync_one(server)  # follows configuration changes
        return await connection.call(tool, arguments, timeout_s)

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
            current = Connection(config, self.settings, self.on_tools, self.on_state)
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
        self.lock = threading.Lock()

    def load(self) -> list[McpServer]:
        from broker.stores.mcp import McpStore

        with self.lock:
            try:
                return McpStore(self.store).servers(enabled_only=True)
            except psycopg.errors.UndefinedTable as exc:
                raise StoreNotReady("the schema is not there yet") from exc

    def on_tools(self, server: str, rows: list[tuple[str, str, dict[str, Any]]]) -> None:
        from broker.stores.mcp import McpStore

        with self.lock:
            McpStore(self.store).replace_tools(server, rows)

    def on_state(self, server: str, state: str, error: str) -> None:
        from broker.stores.mcp import McpStore

        with self.lock:
            McpStore(self.store).set_state(server, state, error)

    def close(self) -> None:
        self.store.close()


def manager_for_process(settings: Settings) -> McpManager:
    """This process's manager, made on first use after fork (never inherited); a change
    notice (topic `mcp`) makes it check every server at once."""
    import os

    global _manager, _manager_pid
    if _manager is None or _manager_pid != os.getpid():
        catalog = CatalogStore(settings)
        _manager = McpManager(settings, catalog.load, catalog.on_tools, catalog.on_state)
        _manager_pid = os.getpid()
        nudge = _manager.nudge
        Listener(settings.redis_url, [changes.MCP], lambda _: nudge()).start()
    return _manager
