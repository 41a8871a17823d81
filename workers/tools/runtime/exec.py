"""Group runtime: exec runs a shell command in the workspace."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple

from pydantic import Field

from broker.config.settings import Settings
from broker.protocol import Group
from workers.confine import host as confine
from workers.confine.safety import check_line, judge_line
from workers.confine.sandbox import Sandbox, SandboxError
from workers.confine.shell import parse_shell
from workers.confine.shell_commands import ParsedShell, command_pattern
from workers.paths import PROTECTED_DIRS
from workers.processes import tie_to_parent
from workers.tool import (
    RuleKind,
    SideEffect,
    Tool,
    ToolContext,
    ToolError,
    ToolInput,
    ToolResult,
    Verdict,
)
from workers.tools.fs.common import workspace
from workers.tools.runtime.live_output import LiveOutput, live_output
from workers.tools.runtime.read_only import read_only, stays_inside

# Only these reach the command: the worker's own secrets (database and Redis URLs, API
# keys, CLAWQ_*) never do.
INHERITED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "SHELL", "HOME")
TRUNCATED = "\n[output truncated at {cap} bytes]"


class ExecInput(ToolInput):
    command: str = Field(description="Shell command, run with sh -c")
    working_dir: str = Field(".", description="Directory to run in, relative to the workspace")
    timeout_s: float | None = Field(None, gt=0, description="Seconds before the command is killed")
    node: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_-]{1,63}$",
        description="Run on this node of the cluster (see nodes list); needs exec(node:NAME)",
    )


class Exec(Tool[ExecInput]):
    name = "exec"
    description = (
        "Run a shell command (sh -c) in the workspace and return its stdout, stderr and exit "
        "code. Chain dependent commands with &&."
    )
    group = Group.runtime
    input_model = ExecInput
    side_effect = SideEffect.write
    default_permission = "ask"
    cascades_on_error = True  # a failed command usually leaves shared state unexpected

    def summary(self, args: ExecInput) -> str:
        return f"exec({args.command[:80]})"

    def route(self, args: ExecInput) -> str | None:
        """A call aimed at a node goes to that node's runtime queue."""
        return f"{Group.runtime.value}.{args.node}" if args.node else None

    def rule_matches(self, specifier: str, args: ExecInput, workspace: str, kind: RuleKind) -> bool:
        """An allow rule must cover every command the line runs (wrappers are judged by what
        they run; a command with assignments, file redirects or a computed name is never
        auto-allowed); a deny or ask rule covers the line if it covers any command.
        `exec(node:NAME)` is about where: it covers calls aimed at that node."""
        if specifier.startswith("node:"):
            return args.node == specifier[5:] if kind != "allow" else False
        if kind == "allow":
            return self.allowed_by([specifier], args, workspace)
        pattern = command_pattern(specifier)
        parsed = _judged(args)
        if not parsed.ok:
            return bool(pattern.fullmatch(" ".join(args.command.split())))
        return any(pattern.fullmatch(c.text) for c in parsed.commands)

    def allowed_by(self, specifiers: list[str | None], args: ExecInput, workspace: str) -> bool:
        """Each command may be allowed by a different rule, but every one must be; a call
        aimed at a node also needs `exec(node:NAME)` for it."""
        if args.node is not None:
            if f"node:{args.node}" not in specifiers:
                return False
            rest = [s for s in specifiers if not (s or "").startswith("node:")]
            return bool(rest) and self.allowed_by(
                rest, args.model_copy(update={"node": None}), workspace
            )
        if None in specifiers:
            return True
        patterns = [command_pattern(s) for s in specifiers if s is not None]
        parsed = _judged(args)
        judged = [c for c in parsed.commands if not c.wrapper]
        return (
            parsed.ok
            and bool(judged)
            and all(
                not (c.assignments or c.dynamic_name)
                and all(stays_inside(c.resolve(t)) for t in c.writes_to)
                and any(p.fullmatch(c.text) for p in patterns)
                for c in judged
            )
        )

    def bypassable(self, args: ExecInput) -> bool:
        """A command aimed at a node runs only under `exec(node:NAME)`, in any mode."""
        return args.node is None

    def concurrency_safe(self, args: ExecInput) -> bool:
        """Only a command that reads, judged command by command, may run beside others."""
        parsed = _judged(args)
        judged = [c for c in parsed.commands if not c.wrapper]
        return parsed.ok and bool(judged) and all(read_only(c) for c in judged)

    def permission_check(self, args: ExecInput, workspace: str) -> tuple[Verdict, str] | None:
        return check_line(args.command, args.working_dir)

    def protected_paths(self, args: ExecInput, workspace: str) -> list[str]:
        parsed = _judged(args)
        targets = [c.resolve(t) for c in parsed.commands for t in c.writes_to]
        return [t for t in targets if any(p in PROTECTED_DIRS for p in Path(t).parts)]

    def rules_for(self, args: ExecInput, workspace: str) -> list[str]:
        parsed = _judged(args)
        rules = [f"exec({c.text})" for c in parsed.commands if not c.wrapper] or ["exec"]
        return [*rules, f"exec(node:{args.node})"] if args.node else rules

    def timeout(self, args: ExecInput, settings: Settings) -> float:
        default = (
            settings.exec_sandbox_timeout_s if settings.sandbox_enabled else settings.exec_timeout_s
        )
        return min(args.timeout_s or default, settings.exec_max_timeout_s)

    def run(self, args: ExecInput, ctx: ToolContext) -> ToolResult:
        timeout = self.timeout(args, ctx.settings)
        return run_shell(ctx, args.command, args.working_dir, timeout, name=self.name)


def run_shell(
    ctx: ToolContext,
    command: str,
    working_dir: str,
    timeout: float,
    env: dict[str, str] | None = None,
    judged: str | None = None,
    name: str = "",
    secrets: list[str] | None = None,
) -> ToolResult:
    """Judge `command` again (the queue is a trust boundary), then run it in the sandbox
    or confined on this host, with `env` added, its output capped; exec and custom tools
    both run this way (a custom tool's line is judged as its preview, `judged`: its
    values quoted where the command reads them from `env`). A command confined on this
    host is told which paths it named it could not see (`confine.unseen`). Its output is
    also sent as it comes (`tool_output_delta`, live_output.py) as `name`, scrubbed of
    `secrets` too, on this host and in the sandbox alike."""
    if finding := judge_line(command if judged is None else judged, working_dir):
        raise ToolError(finding.message())
    require_containment(ctx)
    ws = workspace(ctx)
    cwd = ws.resolve(working_dir)
    if not os.path.isdir(cwd):
        raise ToolError(f"working_dir '{working_dir}' is not a directory")
    started = time.monotonic()
    if ctx.settings.sandbox_enabled and ctx.sandbox is None:
        raise ToolError("the sandbox is enabled but this worker has none; not running")
    sandbox = ctx.sandbox if ctx.settings.sandbox_enabled else None
    host = None if sandbox is not None else host_argv(ctx, ws.root, cwd, command, tied=True)
    live = live_output(ctx, name, secrets or []) if name else None
    try:
        if sandbox is not None:
            done = _in_sandbox(sandbox, ctx, ws.root, cwd, command, timeout, env or {}, live)
        else:
            assert host is not None
            cap = ctx.settings.exec_output_cap_bytes
            done = _on_host(host, cwd, timeout, cap, ctx.cancelled, env or {}, live)
            done.unseen = confine.unseen(confine.for_settings(ctx.settings), command, ws.root, cwd)
    finally:
        if live is not None:
            live.close()
    return _result(judged or command, done, timeout, time.monotonic() - started)


def require_containment(ctx: ToolContext) -> None:
    """A call allowed only because commands run confined (its targets cannot be known)
    never runs unconfined: the orchestrator counted on confinement this worker lacks."""
    if not ctx.context.confined or ctx.settings.sandbox_enabled:
        return
    if not confine.for_settings(ctx.settings).confined:
        raise ToolError(
            "not run: this command was allowed without approval because commands run "
            "confined, but this worker runs them unconfined (bubblewrap does not work "
            "here); name what it writes, or ask for approval"
        )


class HostCommand(NamedTuple):
    """How a command runs on this host: its argv, where that is (for results), and whether
    its stdin must be its worker's lifeline (`confine.TIED`)."""

    argv: list[str]
    where: str
    tied: bool


def host_argv(
    ctx: ToolContext,
    root: str,
    cwd: str,
    command: str,
    info_fd: int | None = None,
    tied: bool = False,
) -> HostCommand:
    """How `command` runs on this host (confined or not); `tied`: it dies with this worker
    even in bubblewrap's first milliseconds."""
    confinement = confine.for_settings(ctx.settings)
    tied = tied and confinement.confined
    try:
        argv = confinement.argv(command, root, cwd, ctx.context.network, info_fd, tied)
    except confine.ConfinementError as exc:
        raise ToolError(str(exc)) from exc
    return HostCommand(argv, "host (bwrap)" if confinement.confined else "host", tied)


CANCEL_POLL_S = 0.2  # how often a running command looks for a cancel


@dataclass
class _Done:
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    where: str
    cancelled: str | None = None
    unseen: list[str] = field(default_factory=list)  # paths it named that it could not see


def command_env(cwd: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a host command: the short inherited list (no worker secrets),
    and what the tool adds (a custom tool's own env)."""
    env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["PWD"] = cwd
    return {**env, **(extra or {})}


def _on_host(
    host: HostCommand,
    cwd: str,
    timeout: float,
    cap: int,
    cancelled: Callable[[], str | None],
    extra_env: dict[str, str] | None = None,
    live: LiveOutput | None = None,
) -> _Done:
    """Run the command in its own process group; a timeout or a cancel kills the group
    (under bubblewrap, killing it tears down the command's whole PID namespace)."""
    lifeline, held = os.pipe() if host.tied else (subprocess.DEVNULL, None)
    try:
        try:
            proc = subprocess.Popen(
                host.argv,
                cwd=cwd,
                env=command_env(cwd, extra_env),
                stdin=lifeline,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group, killed as a whole
                preexec_fn=functools.partial(tie_to_parent, os.getpid()),  # dies with its worker
            )
        finally:
            if held is not None:
                os.close(lifeline)  # the child has its copy; this process keeps `held`
        return _supervise(proc, host.where, timeout, cap, cancelled, live)
    finally:
        if held is not None:
            os.close(held)


def _supervise(
    proc: subprocess.Popen[bytes],
    where: str,
    timeout: float,
    cap: int,
    cancelled: Callable[[], str | None],
    live: LiveOutput | None = None,
) -> _Done:
    """Wait for `proc` with its output capped, killing its group at the deadline or a
    cancel; `live` hears the output as it is read."""
    assert proc.stdout is not None and proc.stderr is not None
    out = _Capture(proc.stdout, cap, live, "stdout")
    err = _Capture(proc.stderr, cap, live, "stderr")
    timed_out, stopped = False, None
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                proc.wait(timeout=min(CANCEL_POLL_S, max(deadline - time.monotonic(), 0.01)))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    timed_out = True
                    break
                if stopped := cancelled():
                    break
    finally:
        _kill_group(proc)
        proc.wait()
    out.join()
    err.join()
    code = None if timed_out or stopped else proc.returncode
    return _Done(code, out.text(), err.text(), timed_out, where, stopped)


def _in_sandbox(
    sandbox: Sandbox,
    ctx: ToolContext,
    root: str,
    cwd: str,
    command: str,
    timeout: float,
    env: dict[str, str],
    live: LiveOutput | None = None,
) -> _Done:
    """Run the command in the key's container; `live` hears its output as it is read."""
    cap = ctx.settings.exec_output_cap_bytes
    key = ctx.context.sandbox_key or ctx.job_id
    heard = live.chunk if live is not None else None
    try:
        run = sandbox.run(
            key, root, command, cwd, timeout, cap, {"HOME": "/tmp", **env}, ctx.cancelled, heard
        )
    except SandboxError as exc:
        raise ToolError(f"sandbox error, command not run: {exc}") from exc
    marker = TRUNCATED.format(cap=cap) if run.truncated else ""
    return _Done(
        run.exit_code,
        run.stdout.decode(errors="replace") + marker,
        run.stderr.decode(errors="replace"),
        run.timed_out,
        f"sandbox {run.container}",
        run.cancelled,
    )


def _result(command: str, done: _Done, timeout: float, elapsed: float) -> ToolResult:
    text = done.stdout
    if done.stderr:
        text += ("\n" if text and not text.endswith("\n") else "") + "[stderr]\n" + done.stderr
    if done.cancelled:
        message = f"{text}\n[stopped: {done.cancelled}]".lstrip()
        return ToolResult.error(message, cancelled=True, seconds=elapsed, where=done.where)
    if done.timed_out:
        message = f"{text}\n[command timed out after {timeout:g}s and was killed]".lstrip()
        return ToolResult.error(
            message, exit_code=None, timed_out=True, seconds=elapsed, where=done.where
        )
    text = (text.rstrip("\n") + "\n" if text else "") + f"[exit code {done.exit_code}]"
    if done.unseen:
        named = ", ".join(done.unseen)
        text += (
            f"\n[note: {named} {'is' if len(done.unseen) == 1 else 'are'} outside the "
            "workspace and not visible in the sandbox (a confined command sees the workspace, "
            "a private /tmp and the system read-only), so the command neither read nor "
            "changed it]"
        )
    return ToolResult(
        for_llm=text,
        for_user=f"$ {command}  (exit {done.exit_code})",
        is_error=done.exit_code != 0,
        metadata={"exit_code": done.exit_code, "seconds": round(elapsed, 3), "where": done.where},
    )


def _judged(args: ExecInput) -> ParsedShell:
    return parse_shell(args.command, args.working_dir)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


class _Capture:
    """Reads a pipe to its end in a thread, keeping at most `cap` bytes and a marker."""

    def __init__(
        self, stream: IO[bytes], cap: int, live: LiveOutput | None = None, name: str = ""
    ) -> None:
        self.stream = stream
        self.cap = cap
        self.live = live
        self.name = name
        self.data = bytearray()
        self.truncated = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while chunk := self.stream.read1(65536):  # type: ignore[attr-defined]
            if self.live is not None:
                self.live.chunk(self.name, chunk)
            room = self.cap - len(self.data)
            if room > 0:
                self.data += chunk[:room]
            if len(chunk) > room:
                self.truncated = True
        self.stream.close()

    def join(self) -> None:
        self._thread.join(timeout=5)

    def text(self) -> str:
        body = self.data.decode("utf-8", errors="replace")
        return body + (TRUNCATED.format(cap=self.cap) if self.truncated else "")


TOOLS: list[type[Tool[Any]]] = [Exec]
