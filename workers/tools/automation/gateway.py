"""gateway: the cluster and its live configuration (group automation; never offered to
subagents). Reading is free; apply, rollback and worker control are administration: they
run only in a job submitted with an admin's key, each once an admin approved it. A configuration is
validated before it is stored, keys that are not live are refused by name, and applying
restarts nothing: orchestrators take the new version before their next job."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from broker.config.live import (
    LIVE_KEYS,
    PEOPLE_ONLY,
    TOPIC,
    ConfigError,
    LiveConfigStore,
    diff,
    validate,
)
from broker.config.settings import Settings
from broker.protocol import Group
from broker.redis import changes
from broker.redis.presence import live_processes, queues_of
from workers.tool import Permission, SideEffect, Tool, ToolContext, ToolError, ToolInput, ToolResult

READS = ("status", "config.get", "config.schema", "config.validate", "config.history")


class GatewayInput(ToolInput):
    action: Literal[
        "status",
        "config.get",
        "config.schema",
        "config.validate",
        "config.apply",
        "config.history",
        "config.rollback",
        "workers",
    ]
    config: dict[str, Any] | None = Field(None, description="validate/apply: live keys → values")
    dry_run: bool = Field(False, description="apply: show the diff, store nothing")
    note: str = Field("", max_length=500, description="apply: why")
    version: int | None = Field(None, ge=1, description="rollback: to this version")
    op: Literal["ping", "active_queues", "pool_restart", "add_consumer", "cancel_consumer"] = "ping"
    queue: str | None = Field(None, description="add_consumer/cancel_consumer: the queue")
    destination: list[str] | None = Field(None, description="workers: node names (all: none)")


class Gateway(Tool[GatewayInput]):
    name = "gateway"
    description = (
        "The cluster and its live configuration: status; config.get/schema/validate; "
        "config.apply (with a diff, or dry_run); config.history and config.rollback; "
        "workers (Celery remote control: ping, active_queues, pool_restart, add/cancel "
        "a consumer)."
    )
    group = Group.automation
    input_model = GatewayInput
    side_effect = SideEffect.write
    default_permission = "ask"
    timeout_s = 20.0

    def summary(self, args: GatewayInput) -> str:
        return f"gateway({args.action}{' ' + args.op if args.action == 'workers' else ''})"

    def default_for(self, args: GatewayInput) -> Permission:
        return "ask" if self.administers(args) else "allow"

    def administers(self, args: GatewayInput) -> bool:
        """Every write (apply, rollback, worker control) is administration; a dry run
        stores nothing and so is a read."""
        if args.action == "config.apply" and args.dry_run:
            return False
        return not (
            args.action in READS
            or (args.action == "workers" and args.op in ("ping", "active_queues"))
        )

    def run(self, args: GatewayInput, ctx: ToolContext) -> ToolResult:
        if ctx.store is None or ctx.redis is None:
            raise ToolError("gateway needs the database and Redis; neither is configured here")
        store = LiveConfigStore(ctx.store().conn)
        try:
            return self._act(args, ctx, store)
        except ConfigError as exc:
            raise ToolError(f"refused: {exc.field}: {exc.message}") from None

    def _act(self, args: GatewayInput, ctx: ToolContext, store: LiveConfigStore) -> ToolResult:
        current = store.current()
        applied: dict[str, Any] = current.config if current else {}
        if args.action == "status":
            procs = live_processes(ctx.redis)  # type: ignore[arg-type]
            by_queue: dict[str, int] = {}
            for queue in (q for p in procs for q in queues_of(p)):
                by_queue[queue] = by_queue.get(queue, 0) + 1
            nodes = sorted({str(p.get("host")) for p in procs})
            text = (
                f"nodes: {', '.join(nodes) or 'none'}\nprocesses by queue: "
                + ", ".join(f"{q} {n}" for q, n in sorted(by_queue.items()))
                + f"\nlive configuration: version {current.version if current else 0}"
            )
            return ToolResult(for_llm=text, metadata={"processes": len(procs)})
        if args.action == "config.get":
            shown = {k: _value(ctx.settings, applied, k) for k in LIVE_KEYS}
            version = current.version if current else 0
            return ToolResult(
                for_llm=f"version {version}; applied keys: {json.dumps(applied)}\n"
                f"in force: {json.dumps(shown, default=str)}",
                metadata={"version": version},
            )
        if args.action == "config.schema":
            schema = Settings.model_json_schema()
            props = {k: schema["properties"][k] for k in LIVE_KEYS}
            body = {"properties": props, "$defs": schema.get("$defs", {})}
            return ToolResult(for_llm=json.dumps(body)[:20_000])
        if args.action == "config.history":
            rows = [
                f"{v.version} {v.status} by {v.applied_by or '?'} {v.created_at:%Y-%m-%d %H:%M}"
                f" {json.dumps(v.config)} {v.note}".rstrip()
                for v in store.history()
            ]
            return ToolResult(for_llm="\n".join(rows) or "no versions: the environment rules")
        if args.action in ("config.validate", "config.apply"):
            if args.config is None:
                raise ToolError(f"{args.action} needs config")
            for key in PEOPLE_ONLY:
                if key in args.config:
                    raise ToolError(
                        f"refused: {key}: only people change it (clawq config apply), not agents"
                    )
            merged = {**applied, **args.config}
            validate(ctx.settings, merged)
            changed = diff(applied, merged)
            if args.action == "config.validate" or args.dry_run:
                what = "valid" if args.action == "config.validate" else "dry run"
                return ToolResult(
                    for_llm=f"{what}; would change:\n" + ("\n".join(changed) or "nothing")
                )
            version = store.apply(ctx.settings, merged, _by(ctx), args.note)
            changes.announce(ctx.redis, TOPIC)  # type: ignore[arg-type]
            return ToolResult(
                for_llm=f"applied version {version}; orchestrators use it from their next job:\n"
                + ("\n".join(changed) or "nothing changed"),
                metadata={"version": version},
            )
        if args.action == "config.rollback":
            version = store.rollback(_by(ctx), args.version)
            changes.announce(ctx.redis, TOPIC)  # type: ignore[arg-type]
            return ToolResult(for_llm=f"rolled back: version {version} is in force")
        return self._workers(args, ctx)

    def _workers(self, args: GatewayInput, ctx: ToolContext) -> ToolResult:
        if ctx.celery is None:
            raise ToolError("no Celery app here")
        control = ctx.celery().control
        where = args.destination
        if args.op == "ping":
            answers = control.ping(destination=where, timeout=1.0)
            return ToolResult(
                for_llm=f"{len(answers)} workers answered: "
                + ", ".join(name for a in answers for name in a)
            )
        if args.op == "active_queues":
            queues = control.inspect(destination=where, timeout=1.0).active_queues() or {}
            lines = [f"{w}: {', '.join(q['name'] for q in qs)}" for w, qs in sorted(queues.items())]
            return ToolResult(for_llm="\n".join(lines) or "no worker answered")
        if args.op == "pool_restart":
            answers = control.pool_restart(destination=where, reply=True, timeout=2.0)
            return ToolResult(for_llm=_replies("pool restart", answers))
        if not args.queue:
            raise ToolError(f"{args.op} needs queue")
        if args.op == "add_consumer":
            answers = control.add_consumer(args.queue, destination=where, reply=True, timeout=1.0)
        else:
            answers = control.cancel_consumer(
                args.queue, destination=where, reply=True, timeout=1.0
            )
        return ToolResult(for_llm=_replies(f"{args.op} {args.queue}", answers))


def _replies(what: str, answers: list[dict[str, Any]] | None) -> str:
    """Each worker's answer to a control command, one line each (ok or its error)."""
    lines = [
        f"{worker}: {reply.get('ok') or 'error: ' + str(reply.get('error'))}"
        for answer in answers or []
        for worker, reply in answer.items()
    ]
    return f"{what}: {len(lines)} workers answered\n" + "\n".join(sorted(lines))


def _value(settings: Settings, applied: dict[str, Any], key: str) -> Any:
    if key in applied:
        return applied[key]
    value = getattr(settings, key)
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


def _by(ctx: ToolContext) -> str:
    return f"job {ctx.job_id} (agent {ctx.context.agent_id}, user {ctx.context.user_id or '-'})"
