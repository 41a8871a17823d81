"""One server's session in a worker process, and its state.

The session is owned by one task (anyio's rule: entered and left in the same task). The
protocol version is negotiated by the SDK (`mode="auto"`: the newest revision it speaks,
falling back to the initialize handshake of older servers). A session found dead is
reconnected with tenacity (2 s doubling to 60 s, 10 attempts); then the server is failed
and its calls get a clear error until the next health check.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any, Literal

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_not_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from broker.config.mcp import McpServer
from broker.config.settings import Settings
from workers.tools.mcp.calls import McpError, OAuthRefused, Progress, describe, innermost, limited
from workers.tools.mcp.catalog import Row, listing
from workers.tools.mcp.elicit import ASKING, Asker
from workers.tools.mcp.resources import ResourceCache

log = logging.getLogger("clawq.mcp")
CONNECT_TIMEOUT_S = 30.0
LEGACY_PING_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")

State = Literal["idle", "connecting", "connected", "failed"]
OnListed = Callable[[str, list[Row], dict[str, Any]], None]
OnState = Callable[[str, str, str], None]  # (server, state, error): for `clawq mcp list`
Auth = Callable[[McpServer], Any]  # the server's httpx2.Auth (OAuth), or None


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
        on_listed: OnListed,
        auth: Auth | None = None,
        on_state: OnState = lambda *_: None,
    ) -> None:
        self.config = config
        self.settings = settings
        self.on_listed = on_listed
        self.auth = auth
        self.on_state = on_state
        self.state: State = "idle"
        self.last_error = ""
        self.refused = False  # its OAuth grant was refused: no retry until it changes
        self.client: Any = None
        self.bearer: Any = None  # the OAuth of the current session, if the server has it
        self.resources = ResourceCache()
        self.roots: list[str] = []  # the workspace of the latest call, offered as the root
        self.askers: list[Asker] = []  # the calls in flight that may ask a person
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
        auth = self.bearer = self.auth(c) if self.auth is not None else None
        if c.transport == "sse":
            from mcp.client.sse import sse_client

            return sse_client(c.url, headers=c.headers, httpx_client_factory=guarded, auth=auth)
        from mcp.client.streamable_http import streamable_http_client

        # streamable HTTP takes headers (and the OAuth flow) through its HTTP client
        http = await stack.enter_async_context(guarded(headers=c.headers, auth=auth))
        return streamable_http_client(c.url, http_client=http)

    async def _list_roots(self, context: Any) -> Any:
        """The workspaces of the calls made on this session, as `file://` roots."""
        from pathlib import Path

        import mcp_types

        return mcp_types.ListRootsResult(
            roots=[mcp_types.Root(uri=Path(r).as_uri(), name=Path(r).name) for r in self.roots]
        )

    async def _elicit(self, context: Any, params: Any) -> Any:
        """A server asks a person during a call: the call's own task says which call (a
        2026-07-28 server's question comes with the call's result); an older server asks
        on the session's task, and the call is then the one in flight on this session (with
        several in flight, it cannot be told which: declined)."""
        import mcp_types

        asker = ASKING.get()
        if asker not in self.askers:
            asker = self.askers[0] if len(self.askers) == 1 else None
        if asker is None:
            log.info(
                "MCP server %s asked for input with %d calls in flight: declined",
                self.config.name, len(self.askers),
            )  # fmt: skip
            return mcp_types.ElicitResult(action="decline")
        return await asker.ask(params)

    async def _own(self, started: asyncio.Future[None]) -> None:
        """Hold the session until told to stop or until it dies."""
        from mcp import Client

        self._stop = asyncio.Event()
        try:
            async with AsyncExitStack() as stack:
                transport = await self._transport(stack)
                self.resources.clear()
                client = Client(
                    transport,
                    list_roots_callback=self._list_roots,
                    elicitation_callback=self._elicit,
                    message_handler=self.resources.on_message,
                )
                self.client = await stack.enter_async_context(client)
                started.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not started.done():
                inner = innermost(exc)
                started.set_exception(
                    inner if isinstance(inner, McpError) else McpError(describe(exc))
                )
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
                retry=retry_if_not_exception_type(OAuthRefused),  # a person must act first
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
            self.refused = isinstance(exc, OAuthRefused)
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

    def _refused(self) -> bool:
        """Failed for want of an OAuth grant: said as it is, no retry until it changes."""
        return self.state == "failed" and self.refused

    async def session(self, wait_s: float) -> Any:
        if self.state == "connected" and self.client is not None:
            return self.client
        name = self.config.name
        if self._refused():
            raise McpError(self.last_error)
        if self.state == "failed":
            raise McpError(
                f"MCP server '{name}' is unavailable: {self.settings.mcp_reconnect_attempts} "
                f"reconnection attempts failed (last: {self.last_error}). Do not retry now."
            )
        task = self.reconnect()
        await asyncio.wait({task}, timeout=wait_s)
        if self.state == "connected" and self.client is not None:
            return self.client
        if self._refused():
            raise McpError(self.last_error)
        raise McpError(
            f"MCP server '{name}' is not reachable ({self.last_error or 'connecting'}); "
            "it is being reconnected. Try again later."
        )

    async def offer_root(self, workspace: str) -> None:
        """Offer the calling job's workspace as the root (servers that ask for roots are told
        the list changed). Only the latest: a server shared by jobs of several users is
        never shown another user's workspace."""
        if not workspace or self.roots == [workspace]:
            return
        self.roots = [workspace]
        client = self.client
        if client is not None and client.protocol_version in LEGACY_PING_VERSIONS:
            import mcp_types

            await client.session.send_notification(mcp_types.RootsListChangedNotification())

    async def request(
        self,
        label: str,
        send: Callable[[Any, Progress, ResourceCache], Awaitable[Any]],
        progress: Progress | None = None,
        workspace: str = "",
        asker: Asker | None = None,
    ) -> Any:
        """One request on the session (`send(client, on_progress, resources)`), within the
        server's idle and total limits; a dead session is reconnected, and the error says
        so. `asker`: the call's way to a person, should the server ask for input."""
        idle, total = self.config.limits(self.settings)
        client = await self.session(min(total, CONNECT_TIMEOUT_S))
        with contextlib.suppress(Exception):  # roots are a courtesy; the call goes on
            await self.offer_root(workspace)
        if asker is not None:
            self.askers.append(asker)
        token = ASKING.set(asker)
        try:
            try:
                return await limited(
                    self.config.name,
                    label,
                    lambda p: send(client, p, self.resources),
                    idle,
                    total,
                    progress,
                    asker,
                )
            finally:  # before a reconnection below: that task is no call's
                ASKING.reset(token)
                if asker is not None:
                    self.askers.remove(asker)
        except McpError as exc:
            if exc.lost:
                self.lost(exc.lost)
            if getattr(self.bearer, "refused", ""):  # the session died of a refused grant
                raise McpError(self.bearer.refused) from None
            raise

    async def refresh_tools(self) -> None:
        rows, facts = await listing(self.client, self.config.name)
        await asyncio.to_thread(self.on_listed, self.config.name, rows, facts)

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
