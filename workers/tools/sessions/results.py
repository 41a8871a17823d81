"""read_result: a tool result the model was sent cut (it was longer than
`tool_result_context_chars`), read page by page from the ledger: the hot half in Redis,
else the durable half in PostgreSQL. Only results of this session's jobs."""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from broker import keys
from broker.protocol import Group
from workers.tool import SideEffect, Tool, ToolContext, ToolError, ToolInput, ToolResult

DURABLE = (
    "SELECT c.for_llm FROM tool_calls c JOIN jobs j ON j.id = c.job_id"
    " WHERE c.job_id = %s AND c.turn = %s AND c.call_id = %s AND j.session_id = %s"
)


class ReadResultInput(ToolInput):
    call_id: str = Field(min_length=1, description="the id of the call whose result was cut")
    turn: int = Field(ge=0, description="as the cut result says")
    job_id: str = Field("", description="as the cut result says; '': this job")
    start_index: int = Field(0, ge=0, description="where to start: page on with the next index")
    max_chars: int = Field(0, ge=0, description="0: what fits in the context uncut")


class ReadResult(Tool[ReadResultInput]):
    name = "read_result"
    description = (
        "Read a tool result that was cut in your context, from start_index on (the cut "
        "result names the call to make)."
    )
    group = Group.sessions
    input_model = ReadResultInput
    side_effect = SideEffect.read
    default_permission = "allow"
    timeout_s = 15.0

    def concurrency_safe(self, args: ReadResultInput) -> bool:
        return True

    def run(self, args: ReadResultInput, ctx: ToolContext) -> ToolResult:
        text = self._stored(args.job_id or ctx.job_id, args, ctx)
        if text is None:
            raise ToolError(f"no result of call {args.call_id} in turn {args.turn} of this session")
        # a page and its note fit under the cut, so a page is never cut again
        limit = args.max_chars or max(100, ctx.settings.tool_result_context_chars - 100)
        page = text[args.start_index : args.start_index + limit]
        end = args.start_index + len(page)
        if end < len(text):
            page += f"\n\n[{len(text) - end} more characters: call again with start_index={end}]"
        elif args.start_index >= len(text):
            page = f"[start_index {args.start_index} is past the end ({len(text)} characters)]"
        return ToolResult(for_llm=page, metadata={"chars": len(text), "end": end})

    def _stored(self, job_id: str, args: ReadResultInput, ctx: ToolContext) -> str | None:
        if job_id == ctx.job_id and ctx.redis is not None:  # this job's: the hot ledger
            raw: Any = ctx.redis.hget(keys.call(job_id, args.turn, args.call_id), "outcome")
            if raw:
                return str(json.loads(raw)["for_llm"])
        if ctx.store is None:
            raise ToolError("this worker has no session store")
        row = (
            ctx.store()
            .conn.execute(DURABLE, (job_id, args.turn, args.call_id, ctx.session_id))
            .fetchone()
        )
        return str(row["for_llm"]) if row else None


TOOLS: list[type[Tool[Any]]] = [ReadResult]
