"""The tool contract: what every tool declares, what every call returns.

A tool is a class whose attributes are its whole declaration; the JSON schema shown to
models is derived from its pydantic input model. Everything left undeclared falls to the
restrictive side: not concurrency-safe, permission "ask", side effect "write".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from broker.config.settings import Settings
from broker.errors import RunError, Signal
from broker.protocol import CallContext, Group
from workers.confine.sandbox import Sandbox

if TYPE_CHECKING:
    import redis
    from celery import Celery

    from broker.pg.store import Store
    from broker.stores.requests import Question
    from workers.scrub import Scrubber

Permission = Literal["allow", "ask", "deny"]
# a tool's own verdict; "confined": allowed only where commands run confined, else asked
Verdict = Literal["allow", "ask", "deny", "confined"]
RuleKind = Literal["allow", "ask", "deny"]


class SideEffect(StrEnum):
    read = "read"  # observes only
    idempotent = "idempotent"  # changes state, but repeating it changes nothing more
    write = "write"  # changes state; repeating it may not be safe


class ToolInput(BaseModel):
    """Base of every input model: unknown fields are errors, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


class ToolResult(BaseModel):
    """What a tool returns: text for the model, text for the user, and facts about the run."""

    for_llm: str
    for_user: str = ""
    is_error: bool = False
    metadata: dict[str, Any] = {}

    @classmethod
    def error(cls, message: str, **metadata: Any) -> ToolResult:
        return cls(for_llm=message, for_user=message, is_error=True, metadata=metadata)


class NotClaimed(Signal):
    """The ledger did not let this process run the call (run elsewhere, done, revoked):
    a tool that `waits_for_claim` stops here, before its first effect."""


class ToolError(RunError):
    """Raised inside a tool for a failure the model can act on; becomes an error result."""


@dataclass
class ToolContext:
    """Per-call values: where the call runs, who asked, and the settings of this process."""

    context: CallContext
    settings: Settings
    job_id: str = ""
    call_id: str = ""
    turn: int = 0  # the model turn: with job_id and call_id, the call's unique key
    session_id: str = ""
    sandbox: Sandbox | None = None  # this process's sandbox when it is enabled
    store: Callable[[], Store] | None = None  # PostgreSQL, for tools that read sessions
    redis: redis.Redis | None = None  # for tools that count, signal or queue (subagents)
    celery: Callable[[], Celery] | None = None  # for tools that start task graphs
    cancelled: Callable[[], str | None] = lambda: None  # why to stop now, or None
    proc_id: str = ""  # this executing process (its heartbeat key), for pinned tools
    scrub: Scrubber | None = None  # this process's: for what a tool sends while it runs
    # returns once the ledger lets this process run the call (NotClaimed otherwise): a tool
    # that `waits_for_claim` calls it before its first effect; for the others, a no-op
    claimed: Callable[[], None] = lambda: None
    # a read running before its claim: the Redis keys its result rests on, with the values
    # it found (a cache's token); its claim checks them, and one that moved meanwhile makes
    # it run again, claimed (None: no claim to check them, so a cache is not to be trusted)
    rests_on: dict[str, str] | None = None

    def keep_artifact(self, data: bytes, mime: str, name: str = "", **facts: Any) -> Any:
        """Store `data` as an artifact of this call's user, session and job (`facts`:
        width, height, duration_s); returns the `broker.stores.artifacts.Artifact`."""
        from broker.stores.artifacts import ArtifactError, ArtifactStore

        if self.store is None:
            raise ToolError("no database here to keep the artifact")
        try:
            return ArtifactStore(self.store().conn, self.settings).put(
                data,
                mime,
                user_id=self.context.user_id,
                session_id=self.session_id,
                job_id=self.job_id,
                name=name,
                **facts,
            )
        except ArtifactError as exc:
            raise ToolError(str(exc)) from None


InputT = TypeVar("InputT", bound=ToolInput)


class Tool(Generic[InputT]):
    """Base class of every tool. Subclasses set the class attributes and implement `run`."""

    name: ClassVar[str]
    description: ClassVar[str]
    group: ClassVar[Group]
    input_model: ClassVar[type[ToolInput]]
    side_effect: ClassVar[SideEffect] = SideEffect.write
    default_permission: ClassVar[Permission] = "ask"
    timeout_s: ClassVar[float] = 60.0

    # a failure here means shared state is not as expected: running siblings are stopped
    cascades_on_error: ClassVar[bool] = False

    # its run begins while its claim is out, and waits for it (`ToolContext.claimed`)
    # before its first effect: what it does before is harmless if the ledger then says the
    # call is not this process's to run (a write's checkpoint overlaps the round trip)
    waits_for_claim: ClassVar[bool] = False

    # it reaches the network through the egress guard, whose domain lists are live
    # configuration: even as a read, it never runs before its claim has said which
    # configuration is in force (workers/outcomes.py `Claiming.runs_ahead`)
    uses_egress: ClassVar[bool] = False

    # it reads its job's transcript (PostgreSQL): it is sent once the turn is stored, so it
    # sees the turn and every result before it (a read otherwise starts as the model's
    # stream delivers it, before the write that carries the previous turn's results)
    reads_transcript: ClassVar[bool] = False

    # state held in one worker process (a browser): the tool pins its session there by
    # writing keys.pin(session, tool), and the orchestrator sends the session's later
    # calls to the pinned queue while that process lives
    pinned: ClassVar[bool] = False

    # tools declared elsewhere (MCP): their JSON schema as given, and one shared Celery task
    input_schema: ClassVar[dict[str, Any] | None] = None
    task: ClassVar[str] = ""

    def summary(self, args: InputT) -> str:
        """A short name for this call in messages, e.g. `exec(make test)`."""
        return self.name

    def route(self, args: InputT) -> str | None:
        """A queue other than the group's for this call (None: the group's queue)."""
        return None

    def concurrency_safe(self, args: InputT) -> bool:
        """Whether this call may run beside others; undeclared means no."""
        return False

    def timeout(self, args: InputT, settings: Settings) -> float:
        return self.timeout_s

    def run(self, args: InputT, ctx: ToolContext) -> ToolResult:
        raise NotImplementedError

    # -- permissions: each tool judges its own calls; the dispatcher knows none of this --

    rule_names: ClassVar[tuple[str, ...]] = ()  # other rule names that govern this tool

    def rule_matches(self, specifier: str, args: InputT, workspace: str, kind: RuleKind) -> bool:
        """Whether the rule `<name>(specifier)` covers this call. A tool that does not
        understand specifiers fails closed: deny and ask rules cover every call, allow
        rules none."""
        return kind != "allow"

    def allowed_by(self, specifiers: list[str | None], args: InputT, workspace: str) -> bool:
        """Whether these allow rules (None: the bare tool name) together cover the call."""
        return any(
            spec is None or self.rule_matches(spec, args, workspace, "allow") for spec in specifiers
        )

    def default_for(self, args: InputT) -> Permission:
        """The permission when no rule decides; a tool whose actions differ (a browser
        that asks to navigate but not to click) says so per call."""
        return self.default_permission

    def permission_check(self, args: InputT, workspace: str) -> tuple[Verdict, str] | None:
        """A tool-specific verdict (e.g. an unparseable command asks), or None."""
        return None

    def bypassable(self, args: InputT) -> bool:
        """Whether `bypassPermissions` may allow this call; a call that needs a rule of its
        own whatever the mode (exec aimed at another node) says no."""
        return True

    def administers(self, args: InputT) -> bool:
        """Whether this call changes the cluster for everyone (live configuration, hooks,
        queues): it runs only in an admin's job and only once an admin approved it, never
        by a rule, a mode, a hook or the job's own user."""
        return False

    def protected_paths(self, args: InputT, workspace: str) -> list[str]:
        """Protected paths (.git/, .clawq/) this call would write; never auto-approved."""
        return []

    def rules_for(self, args: InputT, workspace: str) -> list[str]:
        """The allow rules an "allow-always" answer stores for this call."""
        return [self.name]

    def question(self, args: InputT) -> Question | None:
        """A question a person answers in place of a worker running this call (ask_user):
        the orchestrator asks it and the answer is the call's result."""
        return None
