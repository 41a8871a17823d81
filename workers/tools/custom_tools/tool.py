"""Custom tools on the `runtime` queue: one declaration per stored definition.

A declaration validates a call's arguments against the definition's JSON Schema (on the
orchestrator, and again on the worker); its values reach the command in the environment
(`workers.tools.custom_tools.template`), and the line with each value quoted in its word
(the preview) is judged as `exec` judges a command (shell safety, what must be asked) and
shown for approval; it runs the way `exec` runs one: confined or in the sandbox, output
capped. A stored tool whose template breaks the rule (stored before templates were checked)
is refused at every call, with the reason. On the worker the definition is read afresh (its
version decides, not a cache), its env secrets are opened only there, for the one call, and
their values are scrubbed from what the call returns. Every custom tool shares the Celery
task `clawq.tool.custom`."""

from __future__ import annotations

import logging
import threading
from typing import Any, ClassVar

from pydantic import ConfigDict, model_validator

from broker.config.settings import Settings
from broker.protocol import Group
from broker.stores.custom_tools import CustomTool, CustomToolError
from workers.registry import Registry
from workers.tool import (
    SideEffect,
    Tool,
    ToolContext,
    ToolError,
    ToolInput,
    ToolResult,
    Verdict,
)
from workers.tools.custom_tools.template import Template, TemplateError, check, value_text
from workers.tools.runtime.exec import Exec, ExecInput

log = logging.getLogger("clawq.custom")
CUSTOM_TASK = "clawq.tool.custom"
_EXEC = Exec()


class CustomInput(ToolInput):
    """The arguments, checked against the definition's schema by the declaration."""

    model_config = ConfigDict(extra="allow")
    definition: ClassVar[CustomTool]

    @model_validator(mode="before")
    @classmethod
    def _schema(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError("the arguments must be an object")
        try:
            cls.definition.validate_arguments(data)
            for key, value in data.items():
                value_text(key, value)
        except (CustomToolError, TemplateError) as exc:
            raise ValueError(str(exc)) from None
        return data


class CustomToolBase(Tool[CustomInput]):
    group = Group.runtime
    input_model = CustomInput
    side_effect = SideEffect.write
    default_permission = "ask"
    cascades_on_error = True  # like exec: a failed command leaves shared state unexpected
    task = CUSTOM_TASK
    definition: ClassVar[CustomTool]
    template: ClassVar[Template | None]  # None: the stored template breaks the rule

    def rendered(self, args: CustomInput) -> ExecInput:
        """The preview (values quoted in their words): what is judged and shown."""
        preview = self.template.preview(args.model_dump()) if self.template else "false"
        return ExecInput(command=preview, working_dir=self.definition.working_dir)

    def summary(self, args: CustomInput) -> str:
        return f"{self.name}({self.rendered(args).command[:80]})"

    def concurrency_safe(self, args: CustomInput) -> bool:
        return _EXEC.concurrency_safe(self.rendered(args))

    def refusal(self) -> str:
        return (
            f"{self.name} cannot run: its template was stored before templates were checked "
            f"and breaks the rule ({self.definition.problem}); an admin must redefine it "
            "(clawq tools add)"
        )

    def permission_check(self, args: CustomInput, workspace: str) -> tuple[Verdict, str] | None:
        if self.template is None:
            return "deny", self.refusal()
        return _EXEC.permission_check(self.rendered(args), workspace)

    def protected_paths(self, args: CustomInput, workspace: str) -> list[str]:
        return _EXEC.protected_paths(self.rendered(args), workspace)

    def timeout(self, args: CustomInput, settings: Settings) -> float:
        return float(min(self.definition.timeout_seconds, settings.custom_tool_max_timeout_s))

    def run(self, args: CustomInput, ctx: ToolContext) -> ToolResult:
        from broker.config.secretbox import SecretBox, SecretError
        from workers.scrub import Scrubber
        from workers.tools.runtime.exec import run_shell

        if self.template is None:
            raise ToolError(self.refusal())
        try:
            env = self.definition.secrets(SecretBox.from_settings(ctx.settings))
        except SecretError as exc:
            raise ToolError(
                f"{self.name} was not run: its env secrets do not open ({exc})"
            ) from None
        command, values = self.template.render(args.model_dump())
        preview = self.rendered(args).command
        timeout = self.timeout(args, ctx.settings)
        wd = self.definition.working_dir
        result = run_shell(
            ctx,
            command,
            wd,
            timeout,
            {**env, **values},
            judged=preview,
            name=self.name,
            secrets=list(env.values()),
        )
        scrub = Scrubber(env.values())  # the call's own secrets never leave it
        return result.model_copy(
            update={"for_llm": scrub(result.for_llm), "for_user": scrub(result.for_user)}
        )


_classes: dict[str, type[CustomToolBase]] = {}
_lock = threading.Lock()


def template_of(definition: CustomTool) -> tuple[Template | None, str]:
    """The definition's checked template, or None and why it breaks the rule."""
    try:
        return check(definition.command, definition.parameters), ""
    except TemplateError as exc:
        return None, str(exc)


def tool_class(definition: CustomTool) -> type[CustomToolBase]:
    """The declaration of one definition (made once per distinct definition)."""
    key = definition.model_dump_json() + definition.env_sealed
    with _lock:
        if key not in _classes:
            template, problem = template_of(definition)
            if problem:
                log.warning("custom tool %s is refused: %s", definition.name, problem)
                definition = definition.model_copy(update={"problem": problem})
            schema = {"type": "object", "properties": {}, **definition.parameters}
            model = type(
                f"Custom_{definition.name}_Input", (CustomInput,), {"definition": definition}
            )
            _classes[key] = type(
                f"Custom_{definition.name}",
                (CustomToolBase,),
                {
                    "name": definition.name,
                    "description": definition.description,
                    "input_model": model,
                    "input_schema": schema,
                    "timeout_s": float(definition.timeout_seconds),
                    "definition": definition,
                    "template": template,
                },
            )
        return _classes[key]


class CustomRegistry(Registry):
    """The runtime worker's registry: native tools, and custom tools resolved from
    PostgreSQL by the job's agent and the tool's name when a call arrives."""

    def __init__(self, base: Registry, settings: Settings) -> None:
        super().__init__()
        self._tools = dict(base._tools)
        self._schemas = base._schemas
        self.settings = settings
        self._local = threading.local()  # one connection per executing thread

    def resolve(self, name: str, agent_id: str) -> Tool[Any] | None:
        from broker.pg.store import Store
        from broker.stores.custom_tools import CustomToolStore

        store = getattr(self._local, "store", None)
        if store is None:
            store = self._local.store = Store(self.settings.database_url)
        for definition in CustomToolStore(store).for_agent(agent_id):
            if definition.name == name:
                return tool_class(definition)()
        return None
