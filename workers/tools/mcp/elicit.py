"""An MCP server's elicitation: during a call, the server asks a person for input.

The question becomes a request of the job like `ask_user`'s (kind `elicitation`, kept in
PostgreSQL, announced as `input_requested`, answered with `job.answer`, `clawq answer`, the
API or the inbox). Its key is the call's and a counter (`<call_id>#e<n>`), so a redelivered
call finds the answers it was given. The wait happens here, in the worker's call: the
session to the server is held by this process, so the job cannot be parked meanwhile. The
call's idle limit is paused while it waits; the wait ends at `mcp_elicitation_timeout_s` or
a second before the call's total limit, and the server then gets `cancel`.

A job nobody can answer (`CallContext.attended` is false: a subagent or a cron run with
neither a user nor a chat) gets `decline` at once, and so does a URL-mode elicitation
(which would send the person to a page clawq cannot show).

The answer is heard from its key in Redis (`LocalJob._answer` sets it) and read from
PostgreSQL, which decides, every `PG_EVERY` polls (and when the key appears).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from broker import keys
from broker.protocol import Event
from broker.redis import events
from broker.stores import requests
from broker.stores.requests import PersonRequest

if TYPE_CHECKING:
    from workers.tool import ToolContext

log = logging.getLogger("clawq.mcp")
POLL_S = 0.25  # how often the answer key is looked at
PG_EVERY = 8  # and PostgreSQL, every this many polls (2 s)
MARGIN_S = 1.0  # the wait ends this long before the call's total limit

# the call whose request is in flight on this task (a 2026-07-28 server's elicitation is
# answered within the call's own task); older servers ask on the session's task instead,
# and the connection then finds the call among those it runs (see `Connection.asker`)
ASKING: ContextVar[Asker | None] = ContextVar("clawq_mcp_asking", default=None)


class Asker:
    """One call's way to a person: opens its requests, announces them, waits for answers."""

    def __init__(self, ctx: ToolContext, tool: str, server: str) -> None:
        self.ctx = ctx
        self.tool = tool
        self.server = server
        self.count = 0
        # set by the call's limits (`calls.limited`): pause and resume its idle limit, and
        # the seconds left of its total
        self.pause: Callable[[], None] = lambda: None
        self.resume: Callable[[], None] = lambda: None
        self.remaining: Callable[[], float] = lambda: float("inf")

    async def ask(self, params: Any) -> Any:
        """The server's `elicitation/create`, answered: accept (with content), decline or
        cancel."""
        import mcp_types

        ctx = self.ctx
        why = ""
        if not isinstance(params, mcp_types.ElicitRequestFormParams):
            why = "a URL elicitation (clawq shows forms only)"
        elif not ctx.context.attended:
            why = "no person can answer this job (a subagent or cron run without a user)"
        elif ctx.store is None or ctx.redis is None or not ctx.job_id:
            why = "this worker has no store to ask a person through"
        if why:
            log.info("MCP server %s asked during %s: declined, %s", self.server, self.tool, why)
            return mcp_types.ElicitResult(action="decline")
        wait = min(ctx.settings.mcp_elicitation_timeout_s, self.remaining() - MARGIN_S)
        if wait <= 0:
            return mcp_types.ElicitResult(action="cancel")
        self.count += 1
        schema = dict(params.requested_schema)
        request = await asyncio.to_thread(self._open, params.message, schema, wait)
        if request.status == "pending":
            self.pause()
            try:
                request = await self._wait(request.id, wait)
            except asyncio.CancelledError:  # the call ended (cancelled, lost): so does this
                assert ctx.store is not None
                request = requests.close(ctx.store().conn, request.id, "timeout", "call ended")
                self._emit("input_resolved", request_id=request.id, call_id=ctx.call_id,
                           status=request.status)  # fmt: skip
                raise
            finally:
                self.resume()
        self._emit(
            "input_resolved", request_id=request.id, call_id=ctx.call_id, status=request.status
        )
        if request.status == "answered":
            return mcp_types.ElicitResult(action="accept", content=request.answer)
        if request.status == "declined":
            return mcp_types.ElicitResult(action="decline")
        return mcp_types.ElicitResult(action="cancel")  # timeout, or the job was cancelled

    def _open(self, message: str, schema: dict[str, Any], wait: float) -> PersonRequest:
        ctx = self.ctx
        assert ctx.store is not None
        request = requests.open_elicitation(
            ctx.store().conn,
            uuid.uuid4().hex,
            ctx.job_id,
            ctx.turn,
            f"{ctx.call_id}#e{self.count}",
            self.tool,
            message,
            schema,
            wait,
            ctx.context.user_id,
        )
        if request.status == "pending":
            self._emit(
                "input_requested",
                request_id=request.id,
                call_id=ctx.call_id,
                kind="elicitation",
                server=self.server,
                question=message,
                schema=schema,
                timeout_s=wait,
                expires_at=request.expires_at.timestamp() if request.expires_at else None,
            )
        return request

    def _emit(self, event_type: str, **data: Any) -> None:
        ctx = self.ctx
        if ctx.redis is not None:
            event = Event(type=event_type, job_id=ctx.job_id, data=data)
            events.emit_sync(ctx.redis, event, ctx.settings.events_ttl_s)

    async def _wait(self, request_id: str, wait: float) -> PersonRequest:
        """The request once answered, or closed as `timeout` after `wait` seconds (unless
        a person answered first: the first answer wins)."""
        ctx = self.ctx
        assert ctx.store is not None and ctx.redis is not None
        conn, client = ctx.store().conn, ctx.redis
        answer = keys.approval(request_id) + ":answer"  # orchestrator.calls.approvals
        loop = asyncio.get_running_loop()
        end = loop.time() + wait
        polls = 0
        while loop.time() < end:
            polls += 1
            heard = await asyncio.to_thread(client.exists, answer)
            if heard or polls % PG_EVERY == 0:
                found = await asyncio.to_thread(requests.request, conn, request_id)
                if found is not None and found.status != "pending":
                    return found
            await asyncio.sleep(min(POLL_S, max(0.0, end - loop.time())))
        return await asyncio.to_thread(requests.close, conn, request_id, "timeout", "clawq")
