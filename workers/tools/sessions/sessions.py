"""Group sessions, the reading part: this session's status, an agent's sessions, and a
session's history, from PostgreSQL (the transcripts the orchestrators keep)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from broker.protocol import Group
from workers.tool import SideEffect, Tool, ToolContext, ToolError, ToolInput, ToolResult

HISTORY_CHARS = 500  # per message


def _store(ctx: ToolContext) -> Any:
    if ctx.store is None:
        raise ToolError("this worker has no session store")
    return ctx.store()


class SessionStatusInput(ToolInput):
    pass


class SessionStatus(Tool[SessionStatusInput]):
    name = "session_status"
    description = "Status of the current session: its jobs, messages and tool calls so far."
    group = Group.sessions
    input_model = SessionStatusInput
    side_effect = SideEffect.read
    reads_transcript = True
    default_permission = "allow"
    timeout_s = 15.0

    def concurrency_safe(self, args: SessionStatusInput) -> bool:
        return True

    def run(self, args: SessionStatusInput, ctx: ToolContext) -> ToolResult:
        row = _store(ctx).session_status(ctx.session_id)
        if row is None:
            raise ToolError(f"no session {ctx.session_id}")
        text = (
            f"session {row['id']} (agent {row['agent_id']}), "
            f"started {row['created_at']:%Y-%m-%d %H:%M:%S}: "
            f"{row['jobs']} jobs, {row['messages']} messages, {row['tool_calls']} tool calls"
        )
        return ToolResult(for_llm=text, metadata={k: str(v) for k, v in row.items()})


class SessionsListInput(ToolInput):
    limit: int = Field(20, ge=1, le=100)


class SessionsList(Tool[SessionsListInput]):
    name = "sessions_list"
    description = "List this agent's recent sessions with their latest job and status."
    group = Group.sessions
    input_model = SessionsListInput
    side_effect = SideEffect.read
    reads_transcript = True
    default_permission = "allow"
    timeout_s = 15.0

    def concurrency_safe(self, args: SessionsListInput) -> bool:
        return True

    def run(self, args: SessionsListInput, ctx: ToolContext) -> ToolResult:
        status = _store(ctx).session_status(ctx.session_id)
        agent = status["agent_id"] if status else "main"
        rows = _store(ctx).sessions(agent, ctx.context.user_id, args.limit)
        lines = [
            f"{r['id']}  {r['status']}  {r['iterations']} turns  {r['prompt']!r}" for r in rows
        ]
        return ToolResult(for_llm="\n".join(lines) or "no sessions")


class SessionsHistoryInput(ToolInput):
    session_id: str | None = Field(None, description="default: the current session")
    last: int = Field(20, ge=1, le=200, description="how many of the latest messages")


class SessionsHistory(Tool[SessionsHistoryInput]):
    name = "sessions_history"
    description = "The latest messages of a session (default: this one), oldest first."
    group = Group.sessions
    input_model = SessionsHistoryInput
    side_effect = SideEffect.read
    reads_transcript = True
    default_permission = "allow"
    timeout_s = 15.0

    def concurrency_safe(self, args: SessionsHistoryInput) -> bool:
        return True

    def run(self, args: SessionsHistoryInput, ctx: ToolContext) -> ToolResult:
        session = args.session_id or ctx.session_id
        store = _store(ctx)
        if session != ctx.session_id and store.session_owner(session) != ctx.context.user_id:
            raise ToolError(f"no session {session}")  # another user's: as if it were not
        rows = store.transcript(session, args.last)
        if not rows:
            raise ToolError(f"no messages in session {session}")
        return ToolResult(for_llm="\n".join(_line(r) for r in rows))


def _line(row: dict[str, Any]) -> str:
    content = row["content"]
    if row["role"] == "tool":
        parts = [f"{r['name']} → {r['content']}" for r in content.get("results", [])]
        text = "; ".join(parts)
    else:
        calls = [
            f"{c['name']}({json.dumps(c.get('input', {}))})" for c in content.get("tool_calls", [])
        ]
        text = " ".join([content.get("text", ""), *calls]).strip()
    return f"#{row['seq']} {row['role']}: {text[:HISTORY_CHARS]}"


TOOLS: list[type[Tool[Any]]] = [SessionStatus, SessionsList, SessionsHistory]
