"""One request to a server within its limits, its failures said for the model.

A call has an idle limit, reset by each progress notification the server sends, and a
total limit. Past either, or when the job is cancelled, the request's task is cancelled
and the SDK tells the server with `notifications/cancelled`. The SDK checks a result's
`structuredContent` against the tool's `outputSchema`; a result that does not match is
an error for the model, not a dead session.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from broker.errors import RunError

if TYPE_CHECKING:
    from workers.tools.mcp.elicit import Asker

Progress = Callable[[float, float | None, str | None], Awaitable[None]]


class McpError(RunError):
    """A call could not be made or failed at the protocol level; the message is for the
    model: short, and says what to do. `lost` says why the session is dead, if it is."""

    def __init__(self, message: str, lost: str = "") -> None:
        super().__init__(message)
        self.lost = lost


class OAuthRefused(McpError):
    """The server's OAuth grant is missing or was refused: a person must act first."""


def innermost(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def describe(exc: BaseException) -> str:
    """The innermost cause of an (often nested) exception group, in one line."""
    exc = innermost(exc)
    if isinstance(exc, McpError):
        return str(exc)
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


async def limited(
    server: str,
    label: str,
    send: Callable[[Progress], Awaitable[Any]],
    idle: float,
    total: float,
    progress: Progress | None = None,
    asker: Asker | None = None,
) -> Any:
    """`send(on_progress)` within `idle` (each progress resets it) and `total` seconds;
    `asker`, the call's way to a person, pauses the idle limit while a person answers."""
    from mcp import MCPError
    from mcp_types import CONNECTION_CLOSED

    loop = asyncio.get_running_loop()
    quiet = asyncio.timeout(idle)
    start = loop.time()

    def idle_until(when: float | None) -> None:
        with contextlib.suppress(RuntimeError):  # it fired meanwhile: the call is ending
            quiet.reschedule(when)

    if asker is not None:
        asker.pause = lambda: idle_until(None)
        asker.resume = lambda: idle_until(loop.time() + idle)
        asker.remaining = lambda: start + total - loop.time()

    async def on_progress(done: float, of: float | None, message: str | None) -> None:
        quiet.reschedule(loop.time() + idle)
        if progress is not None:
            await progress(done, of, message)

    whole = asyncio.timeout(total)
    try:
        async with whole, quiet:
            return await send(on_progress)
    except TimeoutError:
        if whole.expired():
            raise McpError(
                f"{label} on MCP server '{server}' ran past its total limit of {total:g}s and "
                "was cancelled"
            ) from None
        if quiet.expired():
            raise McpError(
                f"{label} on MCP server '{server}' timed out: no result and no progress for "
                f"{idle:g}s; it was cancelled"
            ) from None
        raise McpError(f"{label} on MCP server '{server}' timed out") from None
    except MCPError as exc:
        if exc.code == CONNECTION_CLOSED:
            raise McpError(
                f"the connection to MCP server '{server}' closed during {label}; it is being "
                "reconnected. The call may or may not have run.",
                lost=exc.message,
            ) from None
        raise McpError(f"MCP server '{server}' refused {label}: {exc.message}") from None
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # our own cancellation (the job's, or the caller's): the server was told
        raise McpError(
            f"the connection to MCP server '{server}' ended during {label}; it is being "
            "reconnected. The call may or may not have run.",
            lost="the session ended during a call",
        ) from None
    except RuntimeError as exc:
        if "structured content" in str(exc) or "output schema" in str(exc):
            raise McpError(
                f"MCP server '{server}' answered {label} with a result that does not match "
                f"the tool's outputSchema: {str(exc)[:300]}"
            ) from None
        raise McpError(
            f"MCP server '{server}' failed during {label}: {describe(exc)}", lost=describe(exc)
        ) from None
    except Exception as exc:
        raise McpError(
            f"MCP server '{server}' failed during {label}: {describe(exc)}", lost=describe(exc)
        ) from None
