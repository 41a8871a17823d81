"""Pre- and post-tool hooks, speaking Claude Code's hook protocol.

A command hook gets a JSON object on stdin (`session_id`, `cwd`, `permission_mode`,
`hook_event_name`, `tool_name`, `tool_input`, `tool_use_id`, and `tool_response` after the
call). Exit 2 blocks, with stderr as the reason; exit 0 may print JSON with
`hookSpecificOutput.permissionDecision` (allow / deny / ask), `permissionDecisionReason`,
`updatedInput` and `additionalContext`; any other exit is a non-blocking error. In-process
hooks are Python callables taking the same input and returning the same output. All hooks
that match a call run concurrently; their decisions combine deny > ask > allow.

A command hook runs on the orchestrator's host, which holds the database URL, the secret key
and the providers' API keys, and it reads what the model wrote. So it runs the way `exec`
runs on a host (`workers.confine.host`, chosen by the same settings): with a short environment
(`HOOK_ENV` and the project dir), and under bubblewrap writable only in the job's workspace,
with a private /tmp, a PID namespace of its own, and no network unless exec has it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from broker.config.policy import HookCommand, HookMatcher, HooksConfig
from broker.config.settings import Settings
from orchestrator.calls.permissions import HookVerdict
from orchestrator.calls.rules import ALIASES
from workers.confine import host as confine

log = logging.getLogger("clawq.hooks")
Event = Literal["PreToolUse", "PostToolUse"]
RANK = {"deny": 3, "ask": 2, "allow": 1}
NAME_LIST = re.compile(r"^[A-Za-z0-9_-]+(\|[A-Za-z0-9_-]+)*$")
# all a hook inherits of the orchestrator's environment (the rest holds its secrets)
HOOK_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TERM")
PRIVATE = ("/tmp", "/dev/shm")  # empty inside bubblewrap (workers.confine.host)


class HookInput(BaseModel):
    session_id: str
    cwd: str
    permission_mode: str
    hook_event_name: Event
    tool_name: str
    tool_input: dict[str, Any]
    tool_use_id: str
    tool_response: dict[str, Any] | None = None


class HookSpecificOutput(BaseModel):
    hook_event_name: str | None = Field(None, alias="hookEventName")
    permission_decision: Literal["allow", "deny", "ask"] | None = Field(
        None, alias="permissionDecision"
    )
    permission_decision_reason: str | None = Field(None, alias="permissionDecisionReason")
    updated_input: dict[str, Any] | None = Field(None, alias="updatedInput")
    additional_context: str | None = Field(None, alias="additionalContext")


class HookOutput(BaseModel):
    """What a hook prints (or a Python hook returns)."""

    model_config = {"populate_by_name": True}

    hook_specific_output: HookSpecificOutput | None = Field(None, alias="hookSpecificOutput")
    decision: Literal["approve", "block"] | None = None  # the older top-level form
    reason: str | None = None


PythonHook = Callable[[HookInput], "HookOutput | Awaitable[HookOutput | None] | None"]


@dataclass
class HookOutcome:
    """The combination of every hook that ran for one call at one event."""

    verdict: HookVerdict | None = None
    updated_input: dict[str, Any] | None = None
    context: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)


def matches(matcher: str, tool_name: str) -> bool:
    """Empty or `*`: every tool; `a|b`: those names (Claude Code names too); else a regex."""
    if matcher in ("", "*"):
        return True
    if NAME_LIST.match(matcher):
        return tool_name in {ALIASES.get(n, n) for n in matcher.split("|")}
    try:
        return re.fullmatch(matcher, tool_name) is not None
    except re.error:
        log.error("hook matcher %r is not a valid regex; it matches nothing", matcher)
        return False


class Hooks:
    """`settings` chooses how command hooks are confined (`exec_confinement`, `exec_network`,
    `exec_hidden_paths`); without them, the defaults: bubblewrap where it works, no network."""

    def __init__(
        self,
        config: HooksConfig | None = None,
        pre: list[tuple[str, PythonHook]] | None = None,
        post: list[tuple[str, PythonHook]] | None = None,
        *,
        settings: Settings | None = None,
    ) -> None:
        self.config = config or HooksConfig()
        settings = settings or Settings.model_construct()  # the defaults, not the environment
        self.confinement = confine.for_settings(settings)
        self.network = settings.exec_network
        self.python: dict[Event, list[tuple[str, PythonHook]]] = {
            "PreToolUse": list(pre or []),
            "PostToolUse": list(post or []),
        }

    def problems(self) -> list[str]:
        """What this process cannot run: a matcher that is not a regex, a command whose
        program is not here (such a hook would fail open on every call it matches)."""
        found = []
        if self.confinement.unavailable and self._commands():
            found.append(f"hook commands cannot be confined: {self.confinement.unavailable}")
        for group in (*self.config.pre_tool_use, *self.config.post_tool_use):
            if not (group.matcher in ("", "*") or NAME_LIST.match(group.matcher)):
                try:
                    re.compile(group.matcher)
                except re.error as exc:
                    found.append(f"hook matcher {group.matcher!r} is not a regex: {exc}")
            for hook in group.hooks:
                program = _program(hook.command)
                if program and shutil.which(program) is None:
                    found.append(f"hook program {program!r} is not found on this host")
        return found

    def _commands(self) -> list[HookCommand]:
        groups = (*self.config.pre_tool_use, *self.config.post_tool_use)
        return [hook for group in groups for hook in group.hooks]

    def register(self, event: Event, matcher: str, hook: PythonHook) -> None:
        self.python[event].append((matcher, hook))

    async def run(self, data: HookInput) -> HookOutcome:
        event = data.hook_event_name
        groups: list[HookMatcher] = (
            self.config.pre_tool_use if event == "PreToolUse" else self.config.post_tool_use
        )
        jobs: list[tuple[str, Awaitable[Ran]]] = []
        for group in groups:
            if matches(group.matcher, data.tool_name):
                for hook in group.hooks:
                    run = _run_command(hook, data, self.confinement, self.network)
                    jobs.append((hook.command, run))
        for matcher, fn in self.python[event]:
            if matches(matcher, data.tool_name):
                jobs.append((getattr(fn, "__name__", "python hook"), _run_python(fn, data)))
        outcome = HookOutcome()
        if not jobs:
            return outcome
        results = await asyncio.gather(*(job for _, job in jobs))
        for (source, _), (output, forced) in zip(jobs, results, strict=True):
            outcome.ran.append(source)
            verdict = forced or _verdict(output, source)
            if verdict and (
                outcome.verdict is None
                or RANK[verdict.behavior or "allow"] > RANK[outcome.verdict.behavior or "allow"]
            ):
                outcome.verdict = verdict
            specific = output.hook_specific_output if output else None
            if specific and specific.updated_input is not None:
                outcome.updated_input = specific.updated_input
            if specific and specific.additional_context:
                outcome.context.append(specific.additional_context)
            if event == "PostToolUse" and output and output.decision == "block" and output.reason:
                outcome.context.append(output.reason)
        return outcome


def _program(command: str) -> str | None:
    """The program a shell command line starts, past `VAR=value` words (None: unsure)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    for word in words:
        if "=" in word.split("/")[0]:
            continue
        return None if any(c in word for c in "$`(;|&<>") else word
    return None


def _verdict(output: HookOutput | None, source: str) -> HookVerdict | None:
    if output is None:
        return None
    specific = output.hook_specific_output
    if specific and specific.permission_decision:
        return HookVerdict(
            specific.permission_decision,
            specific.permission_decision_reason or "",
            f"hook {source}",
        )
    if output.decision == "block":
        return HookVerdict("deny", output.reason or "", f"hook {source}")
    if output.decision == "approve":
        return HookVerdict("allow", output.reason or "", f"hook {source}")
    return None


Ran = tuple[HookOutput | None, HookVerdict | None]  # what it printed, or a verdict it forced


async def _run_python(fn: PythonHook, data: HookInput) -> Ran:
    result: Any = fn(data)
    if inspect.isawaitable(result):
        result = await result
    if isinstance(result, dict):
        result = HookOutput.model_validate(result)
    return result, None


def hook_env(project_dir: str) -> dict[str, str]:
    """A hook's environment: `HOOK_ENV` of the orchestrator's, and the project dir."""
    env = {k: os.environ[k] for k in HOOK_ENV if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    return {**env, "CLAWQ_PROJECT_DIR": project_dir, "CLAUDE_PROJECT_DIR": project_dir}


def readable(command: str, hidden: tuple[str, ...]) -> tuple[str, ...]:
    """What a confined hook may read although a hidden or private path (/tmp) holds it: the
    files its command names (an admin wrote it: `~/.claude/hooks/audit.py`) and the
    installation of the Python that runs this orchestrator (`python hook.py` may be one in
    the home). Never a whole hidden directory, nor one that holds it."""
    hidden = (*hidden, *PRIVATE)
    words: list[str] = []
    with contextlib.suppress(ValueError):
        words = shlex.split(command)
    program = _program(command)
    found = shutil.which(program) if program else None
    files = [w for w in [*words, found or ""] if os.path.isabs(w) and os.path.isfile(w)]
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    shown: dict[str, None] = {}
    for path in [*files, *sorted(prefixes)]:
        real = os.path.realpath(path)
        if any(_under(real, h) for h in hidden) and not any(_under(h, real) for h in hidden):
            shown.setdefault(real, None)
    return tuple(shown)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


async def _run_command(
    hook: HookCommand, data: HookInput, confinement: confine.Confinement, network: bool
) -> Ran:
    """Confined, a hook writes only in the job's workspace; one that is not on this host
    (its worker's is elsewhere) gets an empty scratch directory instead, removed after."""
    here = os.path.isdir(data.cwd)
    if here or not confinement.confined:
        return await _spawn(hook, data, confinement, network, data.cwd if here else None)
    with tempfile.TemporaryDirectory(prefix="clawq-hook-") as scratch:
        return await _spawn(hook, data, confinement, network, scratch)


async def _spawn(
    hook: HookCommand,
    data: HookInput,
    confinement: confine.Confinement,
    network: bool,
    cwd: str | None,
) -> Ran:
    """Exit 2 blocks with stderr as the reason; a hook that times out leaves the decision
    to a person (ask); any other failure is logged and does not change the decision. A hook
    that must be confined and cannot be is not run and denies (exec fails closed too)."""
    source = f"hook {hook.command}"
    try:
        shown = readable(hook.command, confinement.hidden) if confinement.confined else ()
        argv = confinement.argv(hook.command, cwd or "", cwd or "", network, readable=shown)
    except confine.ConfinementError as exc:
        return None, HookVerdict("deny", f"{source} was not run: {exc}", source)
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=hook_env(data.cwd),
        start_new_session=True,  # its own group, killed whole (bubblewrap: its namespace)
    )
    try:
        out, err = await asyncio.wait_for(
            proc.communicate(data.model_dump_json().encode()), hook.timeout
        )
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        return None, HookVerdict("ask", f"{source} timed out after {hook.timeout:g}s", source)
    if proc.returncode == 2:
        reason = err.decode(errors="replace").strip() or f"blocked by {source}"
        return None, HookVerdict("deny", reason, source)
    if proc.returncode != 0:
        log.warning("%s exited %s: %s", source, proc.returncode, err[:500])
        return None, None
    text = out.decode(errors="replace").strip()
    if not text.startswith("{"):
        return None, None  # plain output is not a decision
    try:
        return HookOutput.model_validate(json.loads(text)), None
    except ValueError:
        log.warning("%s printed JSON that is not hook output: %s", source, text[:500])
        return None, None
