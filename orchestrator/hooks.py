"""Pre- and post-tool hooks, speaking Claude Code's hook protocol.

A command hook gets a JSON object on stdin (`session_id`, `cwd`, `permission_mode`,
`hook_event_name`, `tool_name`, `tool_input`, `tool_use_id`, and `tool_response` after the
call). Exit 2 blocks, with stderr as the reason; exit 0 may print JSON with
`hookSpecificOutput.permissionDecision` (allow / deny / ask), `permissionDecisionReason`,
`updatedInput` and `additionalContext`; any other exit is a non-blocking error. In-process
hooks are Python callables taking the same input and returning the same output. All hooks
that match a call run concurrently; their decisions combine deny > ask > allow.
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from broker.policy_config import HookCommand, HookMatcher, HooksConfig
from orchestrator.permissions import HookVerdict
from orchestrator.rules import ALIASES

log = logging.getLogger("clawq.hooks")
Event = Literal["PreToolUse", "PostToolUse"]
RANK = {"deny": 3, "ask": 2, "allow": 1}
NAME_LIST = re.compile(r"^[A-Za-z0-9_-]+(\|[A-Za-z0-9_-]+)*$")


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
    def __init__(
        self,
        config: HooksConfig | None = None,
        pre: list[tuple[str, PythonHook]] | None = None,
        post: list[tuple[str, PythonHook]] | None = None,
    ) -> None:
        self.config = config or HooksConfig()
        self.python: dict[Event, list[tuple[str, PythonHook]]] = {
            "PreToolUse": list(pre or []),
            "PostToolUse": list(post or []),
        }

    def problems(self) -> list[str]:
        """What this process cannot run: a matcher that is not a regex, a command whose
        program is not here (such a hook would fail open on every call it matches)."""
        found = []
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
                    jobs.append((hook.command, _run_command(hook, data)))
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


async def _run_command(hook: HookCommand, data: HookInput) -> Ran:
    """Exit 2 blocks with stderr as the reason; a hook that times out leaves the decision
    to a person (ask); any other failure is logged and does not change the decision."""
    source = f"hook {hook.command}"
    env = {**os.environ, "CLAWQ_PROJECT_DIR": data.cwd, "CLAUDE_PROJECT_DIR": data.cwd}
    proc = await asyncio.create_subprocess_shell(
        hook.command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=data.cwd if os.path.isdir(data.cwd) else None,
        env=env,
        start_new_session=True,
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
