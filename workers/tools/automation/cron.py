"""cron: scheduled agent jobs of the calling agent and user (group automation).

The orchestrators' ticker starts them (orchestrator/services/cron.py); this tool only reads
and writes their rows, so listing never moves a next run."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import Field, ValidationError

from broker.protocol import AGENT_RUN_TASK, AGENTS_QUEUE, Group
from broker.stores.cron import CronError, CronJob, CronRules, CronStore, run_job_id
from broker.stores.cron.schedule import Schedule, describe, upcoming
from workers.tool import Permission, SideEffect, Tool, ToolContext, ToolError, ToolInput, ToolResult

READS = ("status", "list", "runs")


class CronInput(ToolInput):
    action: Literal["status", "list", "add", "update", "remove", "run", "runs"]
    name: str | None = Field(None, description="the job's name, a slug (all but status/list)")
    kind: Literal["at", "every", "cron"] | None = Field(None, description="add: schedule kind")
    at: datetime | None = Field(None, description="at: ISO time with an offset")
    every_s: int | None = Field(None, ge=60, description="every: seconds, at least 60")
    cron: str | None = Field(None, description="cron: five fields, e.g. '0 9 * * 1-5'")
    timezone: str | None = Field(None, description="cron: IANA zone (UTC)")
    prompt: str | None = Field(None, description="add: what the scheduled run is asked")
    model: str | None = Field(None, description="default: this job's model")
    script: dict[str, Any] | None = Field(None, description="scripted model turns (tests)")
    session: Literal["isolated", "this"] | None = Field(
        None, description="isolated: a new session per run; this: run in this session"
    )
    delivery: Literal["session", "webhook", "none"] | None = None
    webhook_url: str | None = None
    missed: Literal["skip", "run_once"] | None = Field(None, description="after downtime")
    grace_s: int | None = Field(None, ge=0, description="late by less than this: on time")
    enabled: bool | None = None


def _render(job: CronJob, now: datetime) -> str:
    nxt = ", ".join(t.isoformat() for t in upcoming(job.schedule, now, job.anchor)) or "none"
    state = "" if job.enabled else " [disabled]"
    return f"{job.name}{state}: {describe(job.schedule)}; next: {nxt}"


class Cron(Tool[CronInput]):
    name = "cron"
    description = (
        "Schedule agent jobs: add (at a time, every N seconds, or a cron expression in a "
        "timezone), update, remove, run now, list, status, runs. A run is a new job with "
        "the prompt; it runs once per scheduled time."
    )
    group = Group.automation
    input_model = CronInput
    side_effect = SideEffect.write
    default_permission = "ask"
    timeout_s = 20.0

    def summary(self, args: CronInput) -> str:
        return f"cron({args.action}{' ' + args.name if args.name else ''})"

    def default_for(self, args: CronInput) -> Permission:
        """Reading asks nothing; making or changing autonomous work asks."""
        return "allow" if args.action in READS else "ask"

    def concurrency_safe(self, args: CronInput) -> bool:
        return args.action in READS

    def run(self, args: CronInput, ctx: ToolContext) -> ToolResult:
        if ctx.store is None:
            raise ToolError("cron needs the database; none is configured here")
        store = CronStore(ctx.store().conn)
        agent, user = ctx.context.agent_id, ctx.context.user_id
        now = datetime.now(UTC)
        try:
            return self._act(args, ctx, store, agent, user, now)
        except CronError as exc:
            raise ToolError(str(exc)) from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "schedule"
            raise ToolError(f"{where}: {first['msg']}") from None

    def _act(
        self,
        args: CronInput,
        ctx: ToolContext,
        store: CronStore,
        agent: str,
        user: str,
        now: datetime,
    ) -> ToolResult:
        if args.action in ("status", "list"):
            jobs = store.jobs(agent, user)
            if args.action == "status":
                due = min((j.next_at for j in jobs if j.next_at and j.enabled), default=None)
                text = f"{len(jobs)} scheduled jobs; next run {due.isoformat() if due else 'none'}"
            else:
                text = "\n".join(_render(j, now) for j in jobs) or "no scheduled jobs"
            return ToolResult(for_llm=text, metadata={"jobs": len(jobs)})
        if not args.name:
            raise ToolError(f"{args.action} needs name")
        found = store.get(agent, user, args.name)
        if args.action == "add":
            job = self._new(args, ctx, agent, user)
            added = store.add(job, now, ctx.settings.cron_max_jobs_per_agent)
            return ToolResult(for_llm=f"added {_render(added, now)}", metadata={"id": added.id})
        if found is None:
            raise ToolError(f"no scheduled job named {args.name}; list shows them")
        if args.action == "remove":
            store.remove(found.id)
            return ToolResult(for_llm=f"removed {args.name}")
        if args.action == "runs":
            runs = store.runs(found.id)
            lines = [
                f"{r.scheduled_at.isoformat()} {r.status} (attempt {r.attempt})"
                + (f": {r.error}" if r.error else "")
                for r in runs
            ]
            return ToolResult(for_llm="\n".join(lines) or "no runs yet")
        if args.action == "run":
            job_id = store.run_now(found, now)
            if ctx.celery is not None:
                ctx.celery().send_task(
                    AGENT_RUN_TASK, kwargs={"job_id": job_id}, queue=AGENTS_QUEUE, task_id=job_id
                )
            return ToolResult(for_llm=f"started {args.name} now as job {job_id}")
        updated = self._merged(found, args, ctx)
        store.update(updated, now)
        return ToolResult(for_llm=f"updated {_render(updated, now)}")

    def _schedule(self, args: CronInput, base: Schedule | None = None) -> Schedule:
        fields = {k: getattr(args, k) for k in ("kind", "at", "every_s", "cron", "timezone")}
        given = {k: v for k, v in fields.items() if v is not None}
        if base is None and "kind" not in given:
            raise ToolError("add needs kind: at, every or cron")
        return Schedule.model_validate({**(base.model_dump() if base else {}), **given})

    def _new(self, args: CronInput, ctx: ToolContext, agent: str, user: str) -> CronJob:
        if not args.prompt:
            raise ToolError("add needs prompt: what each run is asked")
        self._payload(args, ctx)
        model = args.model or self._job_model(ctx)
        return CronJob(
            agent_id=agent,
            user_id=user,
            name=args.name or "",
            schedule=self._schedule(args),
            prompt=args.prompt,
            model=model,
            script=args.script,
            workspace=ctx.context.workspace,
            session_id=ctx.session_id if args.session == "this" else "",
            origin_session=ctx.session_id,
            delivery=args.delivery or "session",
            webhook_url=args.webhook_url or "",
            missed=args.missed or "run_once",
            grace_s=300 if args.grace_s is None else args.grace_s,
            enabled=True if args.enabled is None else args.enabled,
            rules=self._job_rules(ctx),
        )

    def _merged(self, job: CronJob, args: CronInput, ctx: ToolContext) -> CronJob:
        """The entry as updated. The updating job is now the one that scheduled it: its
        runs carry that job's rules and workspace, so a job may not reshape an entry made
        with wider rules (a person's, another job's) into work it may not do itself."""
        self._payload(args, ctx)
        changes: dict[str, Any] = {
            k: getattr(args, k)
            for k in ("prompt", "model", "script", "delivery", "webhook_url", "missed", "grace_s")
            if getattr(args, k) is not None
        }
        changes["rules"] = self._job_rules(ctx)
        changes["workspace"] = ctx.context.workspace
        if args.enabled is not None:
            changes["enabled"] = args.enabled
        if args.session is not None:
            changes["session_id"] = ctx.session_id if args.session == "this" else ""
        if any(getattr(args, k) is not None for k in ("kind", "at", "every_s", "cron", "timezone")):
            changes["schedule"] = self._schedule(args, job.schedule)
        return CronJob.model_validate({**job.model_dump(), **changes})

    def _payload(self, args: CronInput, ctx: ToolContext) -> None:
        cap = ctx.settings.cron_max_payload_bytes
        if args.prompt and len(args.prompt.encode()) > cap:
            raise ToolError(f"prompt: at most {cap} bytes")

    def _job_rules(self, ctx: ToolContext) -> CronRules:
        """The scheduling job's rules: its runs carry them, never more. A job whose spec
        cannot be read schedules nothing (no rules would be fewer than it has)."""
        row = ctx.store().job(ctx.job_id) if ctx.store and ctx.job_id else None
        if row is None:
            raise ToolError(f"cannot read the rules of job {ctx.job_id or '(none)'}")
        return CronRules.model_validate(row["spec"])  # the spec's other fields: ignored

    def _job_model(self, ctx: ToolContext) -> str:
        row = ctx.store().job(ctx.job_id) if ctx.store and ctx.job_id else None
        return str(row["spec"].get("model", "scripted")) if row else "scripted"


__all__ = ["Cron", "CronInput", "run_job_id"]
