"""Group sessions, the acting part: spawn subagents, manage them, message other sessions.

A subagent is a child job in its own session, run by an orchestrator like any job, and
started as a Celery task graph: the agent run (`agents` queue) chained to the announce step
(`sessions` queue), carrying Celery's parent and root ids. Admission (depth, cluster-wide
concurrency, children per parent) is one Lua call on Redis before anything is created.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

import redis
from celery import chain
from pydantic import Field, field_validator

from broker.pg.store import Store
from broker.protocol import (
    AGENT_RUN_TASK,
    ANNOUNCE_TASK,
    FINAL_STATUSES,
    Event,
    Group,
    JobSpec,
)
from broker.redis import events
from broker.redis.admission import Limits, SubagentSlots
from broker.redis.announce import AnnounceItem, AnnounceQueue
from broker.redis.control import cancel_jobs
from workers.tool import SideEffect, Tool, ToolContext, ToolError, ToolInput, ToolResult

POLL_S = 0.25
STOP_WAIT_S = 10.0  # how long cancel and steer wait for a child to stop


def _need(ctx: ToolContext) -> tuple[Store, redis.Redis]:
    if ctx.store is None or ctx.redis is None or ctx.celery is None:
        raise ToolError("this worker cannot manage subagents (no store, Redis or Celery)")
    return ctx.store(), ctx.redis


def cut_utf8(text: str, max_bytes: int) -> str:
    """At most `max_bytes` of UTF-8, never splitting a character."""
    return text.encode()[:max_bytes].decode(errors="ignore")


def child_of(ctx: ToolContext) -> str:
    """The id of the child this call spawns: the same for every run of the call, so a run
    the ledger repeats (its process was taken for dead) finds the child the first made."""
    if not (ctx.job_id and ctx.call_id):
        return uuid.uuid4().hex
    return uuid.uuid5(uuid.NAMESPACE_URL, f"clawq:{ctx.job_id}/{ctx.turn}/{ctx.call_id}").hex


def spawn(ctx: ToolContext, task: str, label: str, announce: bool) -> str:
    """Admit, record and start one child of the calling job; returns its id. Run again for
    the same call, it admits, records and starts that same child: each step is idempotent
    (admission knows the child, the row is inserted once, an agent run already taken is
    left as it is)."""
    store, client = _need(ctx)
    row = store.job(ctx.job_id)
    if row is None:
        raise ToolError(f"no job {ctx.job_id}")
    parent = JobSpec.model_validate(row["spec"])
    depth = parent.depth + 1
    script = None
    if parent.model == "scripted":
        subagents = (parent.script or {}).get("subagents", {})
        script = subagents.get(label) or subagents.get("*")
        if script is None:
            raise ToolError(f"the scripted model has no script for a subagent labelled '{label}'")
    s = ctx.settings
    slots = SubagentSlots(
        client,
        Limits(
            max_depth=s.max_spawn_depth,
            max_concurrent=s.max_concurrent_subagents,
            max_children=s.max_children_per_agent,
            lease_s=s.subagent_queue_lease_s,  # until an orchestrator takes it
        ),
    )
    child = child_of(ctx)
    admission = slots.admit(child, ctx.session_id, depth)
    if not admission.admitted:
        raise ToolError(admission.message())
    root = parent.root_id or ctx.job_id
    spec = parent.model_copy(
        update={
            "prompt": task,
            "script": script,
            "max_iterations": s.subagent_max_iterations,
            "parent_id": ctx.job_id,
            "root_id": root,
            "parent_session": ctx.session_id,
            "root_session": parent.root_session or ctx.session_id,
            "depth": depth,
            "label": label,
        }
    )
    try:
        store.create_job(child, session_id=child, spec=spec, user_id=parent.user_id)
        assert ctx.celery is not None
        app = ctx.celery()
        run = app.signature(
            AGENT_RUN_TASK,
            kwargs={"job_id": child, "label": label, "depth": depth, "parent": ctx.job_id},
            task_id=child,
            parent_id=ctx.job_id,
            root_id=root,
        )
        if announce:
            step = app.signature(
                ANNOUNCE_TASK,
                kwargs={"parent_session": ctx.session_id, "child": child, "label": label},
            )
            chain(run, step).apply_async()
        else:
            run.apply_async()
    except Exception:
        slots.release(child)
        slots.archive(ctx.session_id, child)
        raise
    events.emit_sync(
        client,
        Event(
            type="subagent_spawned",
            job_id=ctx.job_id,
            data={
                "child": child,
                "label": label,
                "depth": depth,
                "mode": "async" if announce else "sync",
            },
        ),
        s.events_ttl_s,
    )
    return child


def wait_for(ctx: ToolContext, job_id: str, timeout: float) -> dict[str, Any] | None:
    """The child's row once it has ended; None if this call was cancelled or timed out."""
    store, _ = _need(ctx)
    deadline = time.monotonic() + timeout
    while True:
        row = store.job(job_id)
        if row is not None and row["status"] in FINAL_STATUSES:
            return dict(row)
        if ctx.cancelled() or time.monotonic() >= deadline:
            return None
        time.sleep(POLL_S)


class SpawnInput(ToolInput):
    task: str = Field(min_length=1, description="what the subagent is to do, self-contained")
    label: str = Field("", max_length=80, description="a short name for it")
    mode: Literal["async", "sync"] = Field(
        "async",
        description="async: return at once, its result is announced to you when it is done; "
        "sync (run): wait for it and return its result",
    )

    @field_validator("mode", mode="before")
    @classmethod
    def seed_names(cls, value: Any) -> Any:
        return {"run": "sync", "spawn": "async"}.get(value, value)


class SessionsSpawn(Tool[SpawnInput]):
    name = "sessions_spawn"
    description = (
        "Start a subagent: a child agent with its own session working on `task`. async "
        "returns at once and its result is announced to you later (do not poll); sync waits."
    )
    group = Group.sessions
    input_model = SpawnInput
    side_effect = SideEffect.write
    default_permission = "allow"
    timeout_s = 30.0

    def concurrency_safe(self, args: SpawnInput) -> bool:
        return True  # admission is atomic; children are independent

    def timeout(self, args: SpawnInput, settings: Any) -> float:
        return settings.subagent_run_timeout_s + 30 if args.mode == "sync" else self.timeout_s

    def summary(self, args: SpawnInput) -> str:
        return f"{self.name}({args.label or args.task[:40]})"

    def run(self, args: SpawnInput, ctx: ToolContext) -> ToolResult:
        label = args.label or args.task[:40]
        child = spawn(ctx, args.task, label, announce=args.mode == "async")
        if args.mode == "async":
            return ToolResult(
                for_llm=f"Subagent '{label}' ({child}) started. Its result will be announced "
                "to you when it finishes; do not wait or poll for it.",
                metadata={"child": child},
            )
        row = wait_for(ctx, child, ctx.settings.subagent_run_timeout_s)
        if row is None:
            cancel_jobs(ctx.redis, [child], "the spawning call stopped", ctx.settings.events_ttl_s)  # type: ignore[arg-type]
            raise ToolError(
                f"subagent '{label}' ({child}) did not finish in time and was cancelled"
            )
        if row["status"] != "completed":
            raise ToolError(f"subagent '{label}' ({child}) {row['status']}: {row['error']}")
        return ToolResult(for_llm=row["final_text"] or "(no result)", metadata={"child": child})


class Spawn(SessionsSpawn):
    name = "spawn"
    description = "Alias of sessions_spawn: start a subagent on `task` (async or sync)."


class SubagentsInput(ToolInput):
    action: Literal["list", "cancel", "steer"]
    target: str = Field(
        "", description='cancel and steer: a subagent id or label, "last", or (cancel) "all"'
    )
    message: str = Field("", description="steer: the subagent's new instructions")


class Subagents(Tool[SubagentsInput]):
    name = "subagents"
    description = (
        "Manage the subagents this session spawned: list them, cancel one (id, last) or all, "
        "or steer one (it is stopped and started again on your new message)."
    )
    group = Group.sessions
    input_model = SubagentsInput
    side_effect = SideEffect.write
    default_permission = "allow"
    timeout_s = 60.0

    def summary(self, args: SubagentsInput) -> str:
        return f"subagents({args.action} {args.target})".replace(" )", ")")

    def concurrency_safe(self, args: SubagentsInput) -> bool:
        return args.action == "list"

    def run(self, args: SubagentsInput, ctx: ToolContext) -> ToolResult:
        store, _ = _need(ctx)
        children = [dict(r) for r in store.children(ctx.session_id)]
        if args.action == "list":
            return ToolResult(for_llm=_listing(children), metadata={"count": len(children)})
        if not args.target:
            raise ToolError(f'{args.action} needs a target: a subagent id or "last"')
        if args.action == "cancel":
            return self.cancel(ctx, children, args.target)
        return self.steer(ctx, children, args.target, args.message)

    def cancel(self, ctx: ToolContext, children: list[dict[str, Any]], target: str) -> ToolResult:
        if target == "all":
            chosen = [c for c in children if c["status"] not in FINAL_STATUSES]
        else:
            chosen = [_find(children, target)]
        running = [c for c in chosen if c["status"] not in FINAL_STATUSES]
        if not running:
            raise ToolError("no running subagent to cancel (subagents action=list shows them)")
        ids = [c["id"] for c in running]
        _, client = _need(ctx)
        cancel_jobs(client, ids, "cancelled by its parent", ctx.settings.events_ttl_s)
        deadline = time.monotonic() + STOP_WAIT_S  # report what happened, not what was asked
        stopping = [c for c in running if not wait_for(ctx, c["id"], deadline - time.monotonic())]
        names = ", ".join(f"{c['label']} ({c['id']})" for c in running)
        text = f"cancelled {len(ids)} subagent(s): {names}"
        if stopping:
            text += "; still stopping: " + ", ".join(c["label"] for c in stopping)
        return ToolResult(for_llm=text)

    def steer(
        self, ctx: ToolContext, children: list[dict[str, Any]], target: str, message: str
    ) -> ToolResult:
        """Cancel, let it settle, start it again on the new message (cut to the limit)."""
        if target == "all":
            raise ToolError('steer takes one subagent: an id or "last"')
        if not message.strip():
            raise ToolError("steer needs a message: the subagent's new instructions")
        s = ctx.settings
        store, client = _need(ctx)
        old = _find(children, target)
        if old["status"] not in FINAL_STATUSES:
            cancel_jobs(client, [old["id"]], "steered by its parent", s.events_ttl_s)
            wait_for(ctx, old["id"], STOP_WAIT_S)
        time.sleep(s.subagent_steer_settle_s)
        SubagentSlots(client, Limits()).archive(ctx.session_id, old["id"])  # replaced, not added
        store.archive(old["id"])
        task = cut_utf8(message, s.subagent_steer_max_bytes)
        child = spawn(ctx, task, old["label"], announce=True)
        return ToolResult(
            for_llm=f"steered '{old['label']}': {old['id']} stopped, {child} started on the "
            "new message; its result will be announced to you.",
            metadata={"child": child, "replaced": old["id"]},
        )


def _find(children: list[dict[str, Any]], target: str) -> dict[str, Any]:
    """`last`, an id (or a unique prefix of 6+ characters), or a label (its latest child)."""
    if not children:
        raise ToolError("this session has no subagents")
    if target == "last":
        return children[-1]
    by_id = [
        c
        for c in children
        if c["id"] == target or (len(target) >= 6 and c["id"].startswith(target))
    ]
    if len(by_id) == 1:
        return by_id[0]
    by_label = [c for c in children if c["label"] == target]
    if by_label:
        return by_label[-1]
    raise ToolError(f"no subagent '{target}' here (subagents action=list shows them)")


def _listing(children: list[dict[str, Any]]) -> str:
    if not children:
        return "no subagents"
    lines = []
    for c in children:
        state = "archived" if c["archived"] else c["status"]
        line = f"{c['id']}  {c['label']!r}  {state}  depth {c['depth']}"
        if c["status"] in FINAL_STATUSES and (c["final_text"] or c["error"]):
            line += f"  → {(c['final_text'] or c['error']).splitlines()[0][:120]}"
        lines.append(line)
    return "\n".join(lines)


class SessionsSendInput(ToolInput):
    session_id: str = Field(min_length=1, description="the session to send to")
    message: str = Field(min_length=1)


class SessionsSend(Tool[SessionsSendInput]):
    name = "sessions_send"
    description = (
        "Send a message to another of your sessions: its running job reads it at its next "
        "turn, or, if none runs, the message starts a new turn there."
    )
    group = Group.sessions
    input_model = SessionsSendInput
    side_effect = SideEffect.write
    default_permission = "allow"
    timeout_s = 15.0

    def run(self, args: SessionsSendInput, ctx: ToolContext) -> ToolResult:
        store, client = _need(ctx)
        if args.session_id == ctx.session_id:
            raise ToolError("that is this session; just answer here")
        target = store.session_owner(args.session_id)
        if target is None or target != ctx.context.user_id:
            raise ToolError(f"no session {args.session_id} of yours (sessions_list shows them)")
        s = ctx.settings
        queue = AnnounceQueue(client, s.announce_debounce_s, s.announce_drain_at)
        item = AnnounceItem(kind="message", sender=ctx.session_id, result=args.message)
        queue.push(args.session_id, item)
        return ToolResult(for_llm=f"sent to session {args.session_id}")


TOOLS: list[type[Tool[Any]]] = [SessionsSpawn, Spawn, Subagents, SessionsSend]
