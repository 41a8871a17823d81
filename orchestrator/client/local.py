"""The Python client: submit agent jobs, follow their events, wait, cancel.

from orchestrator.client import Client
client = Client()   # CLAWQ_REDIS_URL / CLAWQ_DATABASE_URL from the environment
client = Client(api_url="https://clawq.example", api_key="clawq_…")  # over the HTTP API
job = client.submit("tidy the notes", model="scripted", script=script,
                    workspace="/srv/ws", allow=["exec"])
for event in job.events():
    print(event)
result = job.wait(timeout=60)
"""

from __future__ import annotations

import getpass
import json
import os
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any, Unpack, get_args

import redis

from broker import keys
from broker.celery.app import create_app
from broker.config.live import TOPIC as LIVE_TOPIC
from broker.config.live import LiveConfigStore, effective
from broker.config.policy import PermissionMode, PermissionRules
from broker.config.settings import Settings
from broker.errors import NotFound
from broker.pg.store import Store
from broker.protocol import (
    AGENT_RUN_TASK,
    AGENTS_QUEUE,
    FINAL_STATUSES,
    Event,
    JobResult,
    JobSpec,
    ReplayOf,
    Subagent,
)
from broker.redis import changes, events
from broker.redis.budget import usage_of
from broker.redis.control import cancel_jobs
from broker.stores import requests
from broker.stores.custom_tools import TOPIC as CUSTOM_TOPIC
from broker.stores.replay import copy_session
from broker.stores.requests import AnswerValue, BadAnswer, PersonRequest, content, given
from orchestrator.admin.custom_tools import CustomAdmin
from orchestrator.admin.fork import Fork, find_point, fork_workspace, prepare
from orchestrator.admin.mcp import McpAdmin
from orchestrator.admin.replay import (
    ReplayDiff,
    ReplayOptions,
    diff,
    original_spec,
    replay_kwargs,
    sandbox_copy,
)
from orchestrator.calls.approvals import ANSWERS, ApprovalAnswer, answer_key, publish_answer
from orchestrator.calls.rules import RuleError, rules_from
from orchestrator.calls.tenancy import check, workspace_for
from orchestrator.client.base import Client, ClientError, Job, NotNow, ReplayChanges
from orchestrator.providers.base import ModelError
from orchestrator.providers.credentials import parse_chain
from orchestrator.providers.scripted import parse_script


class LocalJob(Job):
    """A handle on one submitted job, read from Redis and PostgreSQL."""

    def __init__(self, client: Client, job_id: str) -> None:
        if not isinstance(client, LocalClient):
            raise TypeError(f"a local job needs a LocalClient, not {type(client).__name__}")
        super().__init__(client, job_id)
        self.client = client

    def events(self, after: str | None = None) -> Iterator[Event]:
        last = after
        while True:
            for event in events.read(self.client.redis, self.id, after=last, block_ms=1000):
                last = event.id
                yield event
                if event.type == "job_finished":
                    return
            if self.client.store.job_status(self.id) in FINAL_STATUSES and not self._more(last):
                return

    def _more(self, last: str | None) -> bool:
        return bool(self.client.redis.xread({keys.events(self.id): last or "0-0"}, count=1))

    def wait(self, timeout: float | None = None) -> JobResult:
        deadline = None if timeout is None else time.monotonic() + timeout
        last: str | None = None
        while True:
            status = self.client.store.job_status(self.id)
            if status in FINAL_STATUSES:
                return self.result()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"job {self.id} still {status} after {timeout}s")
            block = int(min(1.0, remaining if remaining is not None else 1.0) * 1000) or 1
            for event in events.read(self.client.redis, self.id, after=last, block_ms=block):
                last = event.id
                if event.type == "job_finished":
                    break

    def result(self) -> JobResult:
        result = self.client.store.job_result(self.id)
        if result is None:
            raise ClientError(f"no job {self.id}")
        row = self.client.store.job(self.id)
        root = ((row or {}).get("spec") or {}).get("root_id") or self.id
        result.usage = usage_of(self.client.redis, root)
        return result

    def approve(self, request_id: str, decision: str, by: str = "", admin: bool = True) -> None:
        """Answer an `approval_requested` event: allow-once, allow-always or deny.
        `admin`: the answer is an admin's (the direct client is an operator's: it holds
        the database); only an admin's answer approves administration."""
        if decision not in ANSWERS:
            raise ClientError(f"decision must be one of {', '.join(ANSWERS)}, not '{decision}'")
        self._answer(request_id, "approval", decision, by, admin)

    def answer(
        self,
        request_id: str,
        answer: AnswerValue | None = None,
        by: str = "",
        admin: bool = True,
        *,
        decline: bool = False,
    ) -> None:
        """A question's answer (text, or its choices), or an MCP server's elicitation's: an
        object its schema accepts (or its JSON, or `name=value` texts), or `decline`."""
        request = self._request(request_id, ("question", "elicitation"))
        if decline:
            if request.kind != "elicitation":
                raise ClientError("only an MCP server's request (an elicitation) is declined")
            self._answer(request_id, request.kind, "declined", by, admin)
            return
        if answer is None:
            raise ClientError("give an answer (or, to an MCP server's request, decline)")
        try:
            if request.kind == "elicitation":
                value: Any = content(request, answer)
            elif isinstance(answer, dict):
                raise BadAnswer("a question's answer is text or its choices, not an object")
            else:
                value = given(request, answer)
        except BadAnswer as exc:
            raise ClientError(str(exc)) from None
        self._answer(request_id, request.kind, "answered", by, admin, value)

    def _request(self, request_id: str, kinds: tuple[str, ...]) -> PersonRequest:
        request = requests.request(self.client.store.conn, request_id)
        if request is None or request.job_id != self.id:
            raise NotNow(f"job {self.id} has no request {request_id}")
        if request.kind not in kinds:
            verb = "approve" if request.kind == "approval" else "answer"
            raise ClientError(f"request {request_id} is a {request.kind}: {verb} it")
        if request.status != "pending":
            raise NotNow(f"request {request_id} is already {request.status}")
        return request

    def _answer(
        self, request_id: str, kind: str, status: str, by: str, admin: bool, value: Any = None
    ) -> None:
        """The answer in PostgreSQL first (the first one wins), then the waiting process
        told; the job queued again when it was parked and this was its last request."""
        self._request(request_id, (kind,))
        who = by or getpass.getuser()
        conn = self.client.store.conn
        if not requests.answer(conn, request_id, status, who, admin, value):
            raise NotNow(f"request {request_id} was answered meanwhile")
        woken = requests.wake(conn, self.id)
        answer = ApprovalAnswer(
            request_id=request_id, decision=status, by=who, admin=admin, answer=value
        )
        stored, message = publish_answer(answer)
        pipe = self.client.redis.pipeline(transaction=False)
        pipe.set(answer_key(request_id), stored, ex=self.client.settings.events_ttl_s)
        pipe.publish(keys.CONTROL_CHANNEL, message)
        pipe.execute()
        if woken:
            self.client.resume(self.id)

    def steer(self, message: str) -> None:
        """Redirect a running job: its current work stops, and after a short settle it goes
        on with `message` as the user's next input."""
        if not message.strip():
            raise ClientError("steer message is empty")
        if self.client.store.job_status(self.id) in FINAL_STATUSES:
            raise NotNow(f"job {self.id} has ended; submit a new one instead")
        key = keys.steer(self.id)
        pipe = self.client.redis.pipeline()
        pipe.rpush(key, message)
        pipe.expire(key, self.client.settings.events_ttl_s)
        pipe.publish(keys.CONTROL_CHANNEL, json.dumps({"steer": self.id}))
        pipe.execute()

    def subagents(self) -> list[Subagent]:
        """The subagents this job spawned, each with its own children, oldest first."""
        rows = self.client.store.descendants(self.id)
        nodes = {r["id"]: Subagent.model_validate(dict(r)) for r in rows}
        top: list[Subagent] = []
        for row in rows:
            parent = nodes.get(row["parent_id"])
            (parent.children if parent else top).append(nodes[row["id"]])
        return top

    def cancel(self) -> None:
        """Ask for the job to stop: no further turns; the job ends `cancelled`. A parked
        job's requests are closed unanswered, and it runs again to end."""
        cancel_jobs(
            self.client.redis, [self.id], "the job was cancelled", self.client.settings.events_ttl_s
        )
        conn = self.client.store.conn
        if requests.close_unanswered(conn, self.id) and requests.wake(conn, self.id):
            self.client.resume(self.id)


class LocalClient(Client, kind="local"):
    """The direct client: Redis and PostgreSQL (the cluster's own processes, operators and
    tests). Made by `Client(settings)`."""

    job_kind = LocalJob

    def __init__(self, settings: Settings | None = None, **_: object) -> None:
        self.settings = settings or Settings()
        self.redis = redis.Redis.from_url(self.settings.redis_url)
        self.store = Store(self.settings.database_url)
        self.store.migrate()
        self.app = create_app(self.settings)
        self._live: tuple[int, Settings] | None = None

    def close(self) -> None:
        self.store.close()
        self.redis.close()

    def __enter__(self) -> LocalClient:
        return self

    def submit(
        self,
        prompt: str,
        *,
        workspace: str = "",
        model: str = "scripted",
        script: dict[str, Any] | None = None,
        allow: Iterable[str] = (),
        deny: Iterable[str] = (),
        ask: Iterable[str] = (),
        permission_mode: str = "default",
        agent: str = "main",
        user: str = "",
        max_iterations: int | None = None,
        system: str = "",
        job_id: str | None = None,
        channel: str = "",
        chat_id: str = "",
        budget: dict[str, Any] | None = None,
        approval_timeout_s: float | None = None,
        on_timeout: str | None = None,
        admin: bool = True,
        replay: ReplayOf | None = None,
    ) -> LocalJob:
        """Store the job and queue its agent run; returns at once.

        `allow`, `ask` and `deny` are the job's permission rules (`exec`,
        `exec(git status *)`, `read_file(./secrets/**)`, …). `channel` and `chat_id` say
        where the prompt came from (a configured message channel and its chat). `budget`
        (`turns`, `tokens`, `cost_usd`) bounds this job and all its subagents together.
        `admin`: the job is an admin's (this direct client holds the database, so it is an
        operator's by default); a user's job is bounded by the user's ceiling
        (`orchestrator.calls.tenancy`) and refused with `TenancyError` beyond it."""
        if not prompt.strip():
            raise ClientError("prompt is empty")
        if not os.path.isabs(workspace) and (admin or not user):
            raise ClientError(f"workspace must be an absolute path, got '{workspace}'")
        try:
            parse_chain(model)
        except ModelError as exc:
            raise ClientError(str(exc)) from None
        if model == "scripted":
            try:
                parse_script(script)
            except ModelError as exc:
                raise ClientError(str(exc)) from None
        rules = PermissionRules(allow=list(allow), ask=list(ask), deny=list(deny))
        try:
            rules_from(rules, "job")
        except RuleError as exc:
            raise ClientError(str(exc)) from None
        if on_timeout not in (None, "deny", "cancel"):
            raise ClientError(f"on_timeout must be deny or cancel, not '{on_timeout}'")
        if approval_timeout_s is not None and approval_timeout_s < 0:
            raise ClientError("approval_timeout_s must be 0 (as long as it takes) or more")
        if permission_mode not in get_args(PermissionMode):
            raise ClientError(
                f"permission_mode must be one of {', '.join(get_args(PermissionMode))}"
            )
        spec = JobSpec(
            prompt=prompt,
            model=model,
            script=script,
            workspace=workspace,
            allow=rules.allow,
            ask=rules.ask,
            deny=rules.deny,
            permission_mode=permission_mode,
            agent_id=agent,
            user_id=user,
            max_iterations=max_iterations or self.settings.max_iterations,
            system=system,
            channel=channel,
            chat_id=chat_id,
            budget=budget,
            approval_timeout_s=approval_timeout_s,
            on_timeout=on_timeout,
            admin=admin,
            replay=replay,
        )
        if not admin:
            settings = self.live_settings()
            spec.workspace = workspace_for(settings, user, workspace)
            check(spec, settings)
        job_id = job_id or uuid.uuid4().hex
        self.store.create_job(job_id, session_id=job_id, spec=spec, user_id=user)
        self.queue_run(job_id)
        return LocalJob(self, job_id)

    def replay(
        self,
        job_id: str,
        *,
        user: str = "",
        admin: bool = True,
        new_id: str = "",
        **changes: Unpack[ReplayChanges],
    ) -> LocalJob:
        """Run a recorded job again as a new job marked `replay_of` it: each call the
        original made is answered from its ledger, and runs nothing; what it never made
        runs only if it reads (`effects="sandbox"`: anything, against a copy of the
        workspace made now). `changes`: model, script, system, allow, ask, deny, agent,
        effects. `replay_diff(job.id)` compares the two once it ended."""
        options = ReplayOptions.model_validate(changes)
        original = original_spec(self.store.job(job_id), job_id)
        if not admin and original.user_id != user:
            raise NotFound(f"no job {job_id}")
        new_id = new_id or uuid.uuid4().hex
        of = ReplayOf(job_id=job_id, effects=options.effects)
        if options.effects == "sandbox":
            of.sandbox = sandbox_copy(self.settings, original.workspace, new_id)
        return self.submit(
            original.prompt,
            **replay_kwargs(original, options),
            user=original.user_id,
            admin=admin,
            job_id=new_id,
            replay=of,
        )

    def fork(
        self,
        job_id: str,
        at: int,
        *,
        message: str = "",
        workspace: str = "",
        model: str = "",
        script: dict[str, Any] | None = None,
        user: str = "",
        admin: bool = True,
        new_id: str = "",
    ) -> Fork:
        """A new job in a new session that goes on from a recorded job's turn `at`
        (1-based): its transcript up to there (then `message`, if given, as the next user
        input), in a copy of its workspace as it was after that turn (`workspace`: where;
        default beside the original). Changes no checkpoint covers (exec) are not undone:
        `Fork.untracked` names them. `model` and `script` go on instead of the
        original's (a script's turns count from the job's first: the fork asks it for
        turn `at + 1`). The job is queued at once."""
        original = original_spec(self.store.job(job_id), job_id)
        if not admin and original.user_id != user:
            raise NotFound(f"no job {job_id}")
        if at < 1:
            raise ClientError("a fork goes on after a turn: --at 1 or more")
        if workspace and not os.path.isabs(workspace) and admin:
            raise ClientError(f"workspace must be an absolute path, got '{workspace}'")
        upto = find_point(self.store.conn, job_id, at)
        new_id = new_id or uuid.uuid4().hex
        if not admin:
            settings = self.live_settings()
            wanted = workspace or fork_workspace(original.workspace, new_id)
            workspace = workspace_for(settings, user, wanted)
        spec, report = prepare(
            self.store.conn, self.settings, original, job_id, new_id, at, workspace
        )
        if message:
            spec.prompt = message
        if model:
            spec.model, spec.script = model, None
        if script is not None:
            try:
                parse_script(script)
            except ModelError as exc:
                raise ClientError(str(exc)) from None
            spec.script = script
        if not admin:
            check(spec, self.live_settings())
        copy_session(
            self.store.conn,
            job_id,
            new_id,
            new_id,
            spec.model_dump(),
            original.user_id,
            original.agent_id,
            upto,
            at,
            message,
        )
        self.queue_run(new_id)
        return report

    def queue_run(self, job_id: str) -> None:
        """The stored job's agent run, on the agents queue."""
        events.emit_sync(
            self.redis, Event(type="job_queued", job_id=job_id), self.settings.events_ttl_s
        )
        self.app.send_task(
            AGENT_RUN_TASK, kwargs={"job_id": job_id}, queue=AGENTS_QUEUE, task_id=job_id
        )

    def replay_diff(self, replay_id: str) -> ReplayDiff:
        """How a replay's run differs from its original's (each as it stands)."""
        row = self.store.job(replay_id)
        spec = JobSpec.model_validate(row["spec"]) if row else None
        if row is None or spec is None or spec.replay is None:
            raise NotFound(f"no replay {replay_id}")
        original = self.store.job(spec.replay.job_id)
        if original is None:
            raise NotFound(f"no job {spec.replay.job_id}")
        usages = (usage_of(self.redis, original["id"]), usage_of(self.redis, replay_id))
        return diff(self.store.conn, original, row, usages)

    def resume(self, job_id: str) -> None:
        """Queue a parked job's run again (its last request was answered)."""
        self.app.send_task(AGENT_RUN_TASK, kwargs={"job_id": job_id}, queue=AGENTS_QUEUE)

    def requests(self, user: str | None = None) -> list[PersonRequest]:
        """Pending approvals and questions across jobs, oldest first: one user's, or (None)
        everyone's."""
        return requests.pending(self.store.conn, user)

    def live_settings(self) -> Settings:
        """The settings in force: the environment's with the applied live configuration
        (read again only when its change counter moved)."""
        counter = changes.version(self.redis, LIVE_TOPIC)
        if self._live is None or self._live[0] != counter:
            current = LiveConfigStore(self.store.conn).current()
            self._live = (counter, effective(self.settings, current.config if current else {}))
        return self._live[1]

    @property
    def mcp(self) -> McpAdmin:
        """MCP servers, their tools, grants and access requests."""
        notify = lambda: changes.announce(self.redis, changes.MCP)  # noqa: E731
        return McpAdmin(self.store, notify, self.settings)

    @property
    def custom_tools(self) -> CustomAdmin:
        """Custom tools: define, list, show, disable, remove (each change announced)."""
        return CustomAdmin(
            self.store, self.settings, lambda: changes.announce(self.redis, CUSTOM_TOPIC)
        )

    def job(self, job_id: str) -> LocalJob:
        return LocalJob(self, job_id)
