"""Everything a call passes before it may be sent to a worker, in order:

1. extraction and validation — duplicate id, arguments that are not an object, unknown tool,
   a tool the policy hides from this agent, input that fails the tool's model;
2. pre-tool hooks — may deny, ask, allow, or rewrite the input (validated again);
3. permission — rules of every source, the tool's own checks, protected paths, the mode;
   "ask" is answered by an allow-always grant or by a person (approval), else denied.
   A person is asked once the turn is stored (`confirm`, from the call's own task), so
   the request outlives the process: a resumed turn finds it, answered or not.

The session's rate limit (a subagent tree shares its root session's) is the last check,
made as the call is sent, in the same round trip (JobRun.dispatch). A refused call
becomes an error result for the model and a `tool_call_denied` event that names the layer
and the rule or hook that decided; no worker ever sees it.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from broker.obs.metrics import metrics
from broker.pg.store import AsyncStore
from broker.protocol import JobSpec
from broker.stores import requests
from broker.stores.mcp import catalog_entry
from broker.stores.requests import OnTimeout, PersonRequest
from orchestrator.calls.approvals import Approvals
from orchestrator.calls.hooks import Event, HookInput, Hooks
from orchestrator.calls.permissions import Behavior, Decision, decide
from orchestrator.calls.rules import Rule
from orchestrator.conversation import ToolCall
from workers.registry import Registry
from workers.tool import Tool, ToolInput, ToolResult

Emit = Callable[..., Awaitable[None]]
# waits for a person to answer a request (its expiry, or None); the request as answered
WaitForPerson = Callable[[str, "datetime | None"], Awaitable[PersonRequest]]


class Unanswered(Exception):
    """A person's request ran out of time and the job's choice is to be cancelled."""


@dataclass
class Ready:
    call: ToolCall
    tool: Tool[Any]
    args: ToolInput
    decision: Decision
    writable: list[str] = field(default_factory=list)  # protected paths a person approved
    confined: bool = False  # allowed only because commands run confined (Decision.confined)
    asked: Decision | None = None  # a person must approve it first (Gate.confirm)


@dataclass
class Refused:
    result: ToolResult
    decision: Decision


@dataclass
class Gate:
    job_id: str
    session_id: str
    spec: JobSpec
    registry: Registry
    visible: frozenset[str]
    rules: list[Rule]
    hooks: Hooks
    approvals: Approvals
    store: AsyncStore
    approval_timeout_s: float  # 0: as long as it takes
    on_timeout: OnTimeout
    emit: Emit
    defaults: dict[str, Behavior] = field(default_factory=dict)  # tool default overrides
    contained: bool = False  # commands run confined here (`workers.confine.host.contains`)
    notify: Callable[[str], Awaitable[None]] | None = None  # a request asked in the job's chat

    async def check(self, turn: int, call: ToolCall, seen: set[str]) -> Ready | Refused:
        if call.id in seen:
            return await self.refuse(call, "validation", f"duplicate tool call id '{call.id}'")
        if call.raw_input is not None:
            return await self.refuse(
                call, "validation", f"the arguments of {call.name} are not a JSON object"
            )
        if call.name in self.registry and call.name not in self.visible:
            return await self.refuse(
                call, "policy", f"{call.name} is not available to this agent", "tool policy"
            )
        parsed = self.registry.parse(call.name, call.input)
        if isinstance(parsed, ToolResult):
            return await self.refuse(call, "validation", await self.not_granted(call, parsed))
        tool, args = parsed
        hooked = await self.hooks.run(self.hook_input(call, "PreToolUse", call.input))
        if hooked.updated_input is not None:
            reparsed = self.registry.parse(call.name, hooked.updated_input)
            if isinstance(reparsed, ToolResult):
                return await self.refuse(
                    call, "hook", f"a hook rewrote the input badly: {reparsed.for_llm}"
                )
            args = reparsed[1]
            call = call.model_copy(update={"input": hooked.updated_input})
        decision = decide(
            tool,
            args,
            self.rules,
            self.spec.permission_mode,
            self.spec.workspace,
            hooked.verdict,
            self.defaults,
            self.contained,
        )
        if tool.administers(args) and decision.behavior != "deny":
            decision = self.administration(tool, args)
        elif decision.behavior == "ask" and decision.layer == "default":
            decision = await self.granted(tool, args) or decision
        if decision.behavior == "ask":
            return Ready(call, tool, args, decision, asked=decision)
        if decision.behavior != "allow":
            return await self.refuse(call, decision.layer, decision.reason, decision.by)
        return Ready(call, tool, args, decision, [], decision.confined)

    async def confirm(self, turn: int, ready: Ready, person: WaitForPerson) -> Ready | Refused:
        """A call that asks: a person's answer (however long it takes) allows or refuses it."""
        if ready.asked is None:
            return ready
        decision = await self.approval(
            turn, ready.call, ready.tool, ready.args, ready.asked, person
        )
        if decision.behavior != "allow":
            return await self.refuse(ready.call, decision.layer, decision.reason, decision.by)
        writable = ready.tool.protected_paths(ready.args, self.spec.workspace)
        return Ready(ready.call, ready.tool, ready.args, decision, writable, decision.confined)

    async def rate_limited(self, ready: Ready, used: int) -> Refused:
        """The session's rate limit refused the call as it was sent."""
        metrics().rate_limited.inc()
        return await self.refuse(
            ready.call,
            "rate_limit",
            f"rate limit reached: {used} tool calls in the last hour for this session; "
            "wait before calling more tools",
            "rate limiter",
        )

    def administration(self, tool: Tool[Any], args: ToolInput) -> Decision:
        """A call that changes the cluster for everyone: refused in a user's job; in an
        admin's job it waits for an admin's approval, whatever the rules, mode or hooks."""
        if not self.spec.admin:
            return Decision(
                "deny",
                "tenancy",
                f"{tool.summary(args)} is administration: only a job submitted with an "
                "admin's key may ask for it; ask an admin",
                "administration is people only",
            )
        return Decision(
            "ask",
            "tenancy",
            f"{tool.summary(args)} is administration: an admin must approve it",
            "administration is people only",
        )

    async def not_granted(self, call: ToolCall, refused: ToolResult) -> str:
        """Why the call is refused: an MCP tool that exists but is not granted to this
        agent or user says so, and how it is granted."""
        if call.name in self.registry or not call.name.startswith("mcp_"):
            return refused.for_llm
        row = await catalog_entry(self.store.pool, call.name)
        if row is None:
            return refused.for_llm
        agent = self.spec.agent_id
        head, _, available = refused.for_llm.partition(" Available tools: ")
        return (
            f"{head} It is the tool '{row.tool}' of MCP server '{row.server}', not granted to"
            f" agent '{agent}': an admin grants it with `clawq mcp grant {row.server}"
            f" --agent {agent}` (or `--user U`); ask the user rather than retry."
            + (f" Available tools: {available}" if available else "")
        )

    async def granted(self, tool: Tool[Any], args: ToolInput) -> Decision | None:
        """An earlier allow-always answer (any orchestrator's) that covers this call: the
        same user's, for the same agent."""
        owned = await self.store.grants(self.spec.user_id, self.spec.agent_id)
        grants = [Rule.parse(r, "allow", "grant") for r in owned]
        if grants and tool.allowed_by(
            [g.specifier for g in grants if g.names(tool)], args, self.spec.workspace
        ):
            return Decision("allow", "grant", "allowed always by an earlier approval", "grant")
        return None

    async def approval(
        self,
        turn: int,
        call: ToolCall,
        tool: Tool[Any],
        args: ToolInput,
        asked: Decision,
        person: WaitForPerson,
    ) -> Decision:
        request, new = await requests.open_request(
            self.store.pool,
            uuid.uuid4().hex,
            self.job_id,
            turn,
            call.id,
            tool.name,
            call.input,
            asked.reason,
            timeout_s=self.approval_timeout_s,
            on_timeout=self.on_timeout,
            user_id=self.spec.user_id,
        )
        if new:  # a resumed turn's request was announced when it was opened
            if self.notify is not None:
                await self.notify(request.id)
            await self.emit(
                "approval_requested",
                request_id=request.id,
                call_id=call.id,
                name=tool.name,
                input=call.input,
                reason=asked.reason,
                layer=asked.layer,
                by=asked.by,
                summary=tool.summary(args),
                timeout_s=self.approval_timeout_s or None,
                expires_at=request.expires_at.timestamp() if request.expires_at else None,
            )
        if request.status == "pending":
            pending = metrics().approvals_pending
            pending.inc()
            try:
                request = await person(request.id, request.expires_at)
            finally:
                pending.dec()
        who = request.answered_by or "unknown"
        await self.emit(
            "approval_resolved",
            request_id=request.id,
            call_id=call.id,
            decision=request.status,
            by=who,
        )
        if request.status == "timeout":
            if request.on_timeout == "cancel":
                raise Unanswered(f"{tool.name} was not approved in time")
            return Decision(
                "deny",
                "approval",
                f"{tool.name} was not approved within {self.approval_timeout_s:g}s "
                f"(it needs approval: {asked.reason}); ask the user or try another way",
                "timeout",
            )
        if request.status == "deny":
            return Decision("deny", "approval", f"{who} denied {tool.name}", f"user {who}")
        if asked.layer == "tenancy":  # administration: an admin's answer, never a grant
            if not request.answered_admin:
                return Decision(
                    "deny",
                    "tenancy",
                    f"{who} may not approve {tool.name}: administration needs an admin",
                    f"user {who}",
                )
            return Decision("allow", "approval", f"allowed once by admin {who}", f"admin {who}")
        if request.status == "allow-always":  # stored once: a grant is a set member
            rules = tool.rules_for(args, self.spec.workspace)
            await self.store.add_grants(
                self.spec.user_id, self.spec.agent_id, rules, who, self.job_id
            )
        return Decision("allow", "approval", f"{request.status} by {who}", f"user {who}")

    async def refuse(self, call: ToolCall, layer: str, reason: str, by: str = "") -> Refused:
        await self.emit(
            "tool_call_denied", call_id=call.id, name=call.name, layer=layer, by=by, reason=reason
        )
        return Refused(ToolResult.error(reason), Decision("deny", layer, reason, by))

    def hook_input(
        self,
        call: ToolCall,
        event: Event,
        tool_input: dict[str, Any],
        response: dict[str, Any] | None = None,
    ) -> HookInput:
        return HookInput(
            session_id=self.session_id,
            cwd=self.spec.workspace,
            permission_mode=self.spec.permission_mode,
            hook_event_name=event,
            tool_name=call.name,
            tool_input=tool_input,
            tool_use_id=call.id,
            tool_response=response,
        )
