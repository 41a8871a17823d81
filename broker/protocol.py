"""Typed messages that cross process boundaries (queue, Redis, client)."""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from broker.config.policy import PermissionMode


class Limits(BaseModel):
    """A tree's budget; 0 means no limit on that measure."""

    model_config = ConfigDict(extra="forbid")  # a typo'd limit would be no limit

    turns: int = 0
    tokens: int = 0
    cost_usd: float = 0.0


class Usage(BaseModel):
    turns: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    over: str = ""  # the measure that went over its limit, or ''

    def describe(self, limits: Limits) -> str:
        parts = [f"{self.turns} model turns", f"{self.tokens} tokens"]
        if limits.cost_usd or self.cost_usd:
            parts.append(f"${self.cost_usd:.4f}")
        return ", ".join(parts)


class Group(StrEnum):
    """Tool groups; each is one Celery queue. `agents` carries agent runs, not tools."""

    fs = "fs"
    runtime = "runtime"
    web = "web"
    memory = "memory"
    sessions = "sessions"
    ui = "ui"
    automation = "automation"
    messaging = "messaging"
    media = "media"  # image, tts, skill_search, nodes: the seed's "other tools"
    mcp = "mcp"


AGENTS_QUEUE = "agents"
AGENT_RUN_TASK = "clawq.agent_run"
ANNOUNCE_TASK = "clawq.announce"


class CallContext(BaseModel):
    """Per-call values a tool may read; never shared mutable state (goclaw §1)."""

    workspace: str
    user_id: str = ""
    agent_id: str = "main"
    channel: str = ""
    chat_id: str = ""
    peer_kind: str = ""
    sandbox_key: str = ""
    writable_paths: list[str] = Field(
        default_factory=list, description="protected patterns (e.g. .git/**) made writable"
    )
    hidden_paths: list[str] = Field(
        default_factory=list, description="workspace globs that read tools must not read"
    )
    network: bool = Field(False, description="confined commands may use the network")
    confined: bool = Field(
        False,
        description="allowed only because commands run confined: never run it unconfined",
    )
    attended: bool = Field(
        True,
        description="a person can answer the job's requests (an MCP server's elicitation)",
    )


class CallEnvelope(BaseModel):
    """What a worker receives for one tool call."""

    call_id: str
    job_id: str
    turn: int = Field(0, description="model turn of the job; with call_id, the ledger key")
    session_id: str
    agent_id: str = "main"
    user_id: str = ""
    depth: int = 0
    tool: str
    task: str = ""  # the Celery task; empty: clawq.tool.<tool> (MCP tools share one)
    input: dict[str, Any]
    context: CallContext
    timeout_s: float
    deadline: float = Field(description="epoch seconds after which the result is useless")
    reply_to: str = Field(description="Redis list the awaiting orchestrator reads")
    max_deliveries: int = 3
    sent_at: float = Field(0.0, description="epoch seconds it was sent (queue wait metrics)")
    resent: bool = Field(
        False, description="sent again (its runner died, a dead letter's retry): claimed first"
    )
    trace: dict[str, str] = Field(default_factory=dict, description="W3C trace context")
    gate: str = Field(
        "",
        description="sent while its turn was being stored: it acts only once the turn is"
        " (keys.turn_gate(gate) says so, else the stored call is looked for)",
    )


class CallOutcome(BaseModel):
    """A finished call as pushed back to the orchestrator and kept in the ledger."""

    call_id: str
    job_id: str
    turn: int = 0
    for_llm: str
    for_user: str = ""
    is_error: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)
    queue: str = ""
    worker: str = ""
    attempts: int = 1
    decision: str = ""  # how the call was permitted (or refused): the audit trail
    decided_by: str = ""
    decision_reason: str = ""
    started_at: float = 0.0
    finished_at: float = Field(default_factory=time.time)


JobStatus = Literal[
    "queued",
    "running",
    "waiting",  # parked: every pending call waits for a person; no process holds it
    "completed",
    "failed",
    "cancelled",
    "max_iterations",
    "budget_exceeded",
    "looping",  # the model repeated one call (tool and input) too many times in a row
]
FINAL_STATUSES: frozenset[str] = frozenset(
    {"completed", "failed", "cancelled", "max_iterations", "budget_exceeded", "looping"}
)


class ReplayOf(BaseModel):
    """A replay: its calls that match the original's are answered from the original's
    ledger (orchestrator/calls/replay.py)."""

    job_id: str
    effects: Literal["block", "sandbox"] = "block"
    # effects "sandbox": the copy of the workspace, made as the replay was submitted, that
    # the calls the original never made run against
    sandbox: str = ""


class ForkOf(BaseModel):
    """A fork: a new job whose session starts with the original's transcript up to a turn."""

    job_id: str
    turn: int
    untracked: list[str] = Field(default_factory=list, description="changes not undone")


class JobSpec(BaseModel):
    """Everything needed to run a job; stored in PostgreSQL, referenced by id on the queue."""

    prompt: str
    model: str = "scripted"
    script: dict[str, Any] | None = None
    workspace: str
    allow: list[str] = Field(default_factory=list)
    ask: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)
    permission_mode: PermissionMode = "default"
    agent_id: str = "main"
    user_id: str = ""
    # submitted with an admin's key (or by an operator's direct client): no user ceiling,
    # and it may ask for what only admins may do (an admin still approves each such call)
    admin: bool = False
    max_iterations: int = 20
    system: str = ""
    # where the job's input came from: `message` answers there by default and refuses to
    # send text to it (that is the job's answer)
    channel: str = ""
    chat_id: str = ""
    # a job made to take subagents' results to its session (its answer is not the chat's)
    announce: bool = False
    # the tree's budget (this job and every subagent below it); None: the settings'
    budget: Limits | None = None
    # a subagent: the job that spawned it, the root of its tree, the parent's session
    parent_id: str = ""
    root_id: str = ""
    parent_session: str = ""
    root_session: str = ""  # whose rate limit the whole tree shares
    depth: int = 0
    label: str = ""
    # how long a person's request of this job waits, and what its end does (None: the
    # agent's choice, else the settings'); 0 s: as long as it takes
    approval_timeout_s: float | None = Field(None, ge=0)
    on_timeout: Literal["deny", "cancel"] | None = None
    replay: ReplayOf | None = None
    fork: ForkOf | None = None

    @classmethod
    def stored(cls, raw: dict[str, Any]) -> JobSpec:
        """A spec as stored (every field written out): the fields left at their default
        are left out before it is read, so the spec remembers only the few that were set
        (a set of all 27 names was 2 KB of each running job's memory)."""
        set_here = {k: v for k, v in raw.items() if k not in _DEFAULTS or _DEFAULTS[k] != v}
        return cls.model_validate(set_here)


_DEFAULTS: dict[str, Any] = {
    name: field.get_default(call_default_factory=True)
    for name, field in JobSpec.model_fields.items()
    if not field.is_required()
}


class Subagent(BaseModel):
    """One node of a job's subagent tree (`Job.subagents()`)."""

    id: str
    label: str
    depth: int
    status: JobStatus
    archived: bool = False
    parent_id: str
    final_text: str = ""
    error: str = ""
    children: list[Subagent] = Field(default_factory=list)


class ToolCallRecord(BaseModel):
    id: str
    name: str
    input: dict[str, Any]
    is_error: bool
    output: str
    queue: str = ""
    worker: str = ""
    attempts: int = 0
    decision: str = ""
    decided_by: str = ""
    started_at: float = 0.0  # on the worker (epoch seconds); 0 when no worker ran it
    finished_at: float = 0.0


class JobResult(BaseModel):
    job_id: str
    session_id: str = ""  # its canvas, its history, sessions_send
    status: JobStatus
    final_text: str = ""
    error: str = ""
    iterations: int = 0
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    usage: Usage | None = None  # the whole tree's, from its budget counters


EventType = Literal[
    "job_queued",
    "job_started",
    "turn_started",
    "model_text",
    "model_delta",  # the model's text as it arrives, coalesced; never in the transcript
    "model_answered",  # which model and credential (its label) answered, when it changes
    "model_failover",  # a model and credential failed; the next is tried
    "context_compacted",  # older turns summarised for the requests that follow
    "loop_warning",  # the same call again and again: the model was warned
    "tool_call_queued",
    "tool_call_finished",
    "tool_call_denied",
    "approval_requested",
    "approval_resolved",
    "input_requested",
    "input_resolved",
    "job_waiting",
    "steered",
    "subagent_spawned",
    "subagent_finished",
    "announce_delivered",
    "memory_index_failed",
    "tool_call_waiting",
    "tool_call_progress",
    "tool_output_delta",  # a running command's stdout/stderr, coalesced, bounded per call
    "budget_exceeded",
    "job_finished",
]


class Event(BaseModel):
    """One entry of a job's event stream; `id` is the Redis stream id (resume point)."""

    id: str = ""
    type: EventType
    job_id: str
    at: float = Field(default_factory=time.time)
    data: dict[str, Any] = Field(default_factory=dict)
