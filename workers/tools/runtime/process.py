"""process: background commands of a session — start, list, read new output, write to
stdin, signal.

Each process runs under a detached supervisor (`workers.tools.runtime.procsup`) whose state is a
directory on the worker's host; every call after `start` is routed to that host's own
queue (`runtime.<host>`), so any runtime worker there can serve it. Output is bounded,
and comes as `tool_output_delta` events of the starting job while it runs (`process_live`).
Processes end with their session: runtime workers kill those of sessions that ended.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from broker.config.settings import Settings
from broker.protocol import Group
from workers.confine.safety import check_line, judge_line
from workers.confine.sandbox import Sandbox, SandboxError
from workers.tool import SideEffect, Tool, ToolContext, ToolError, ToolInput, ToolResult, Verdict
from workers.tools.fs.common import workspace
from workers.tools.runtime import process_live
from workers.tools.runtime.exec import host_argv, require_containment
from workers.tools.runtime.procsup import INFO_FD, output_locked

log = logging.getLogger("clawq.process")

START_WAIT_S = 2.0  # `start` answers once the command runs, or after this long
ENDING_WAIT_S = 15.0  # a process still starting as its session ends is waited for this long

SIGNALS = {
    "TERM": signal.SIGTERM,
    "KILL": signal.SIGKILL,
    "INT": signal.SIGINT,
    "HUP": signal.SIGHUP,
    "QUIT": signal.SIGQUIT,
    "USR1": signal.SIGUSR1,
    "USR2": signal.SIGUSR2,
    "STOP": signal.SIGSTOP,
    "CONT": signal.SIGCONT,
}


def host_queue(host: str) -> str:
    return f"{Group.runtime.value}.{host}"


def state_root(settings: Settings) -> Path:
    return Path(settings.process_state_dir)


class ProcessInput(ToolInput):
    action: Literal["start", "list", "read", "write", "signal"]
    command: str | None = Field(None, description="start: the shell command")
    working_dir: str = Field(".", description="start: directory, relative to the workspace")
    id: str | None = Field(
        None, description="read / write / signal: the process id (or `last`, this host's newest)"
    )
    input: str | None = Field(None, description="write: text for the process's stdin")
    signal: str = Field("TERM", description="signal: TERM, KILL, INT, HUP, …")
    max_bytes: int = Field(32768, ge=1, le=1_048_576, description="read: at most this much")

    @model_validator(mode="after")
    def _needs(self) -> ProcessInput:
        if self.action == "start" and not self.command:
            raise ValueError("start needs a command")
        if self.action in ("read", "write", "signal") and not self.id:
            raise ValueError(f"{self.action} needs the process id")
        if self.action == "write" and self.input is None:
            raise ValueError("write needs input")
        if self.signal.upper().removeprefix("SIG") not in SIGNALS:
            raise ValueError(f"signal must be one of {', '.join(SIGNALS)}")
        return self


class Process(Tool[ProcessInput]):
    name = "process"
    description = (
        "Manage background commands of this session: start (returns an id), list, read new "
        "output, write to stdin, signal (TERM, KILL, …). Use it for servers and long jobs."
    )
    group = Group.runtime
    input_model = ProcessInput
    side_effect = SideEffect.write
    default_permission = "ask"

    def route(self, args: ProcessInput) -> str | None:
        """Calls about a started process go to the host that runs it."""
        if args.action == "start" or not args.id or "." not in args.id:
            return None
        return host_queue(args.id.split(".", 1)[0])

    def concurrency_safe(self, args: ProcessInput) -> bool:
        return args.action in ("list", "read")

    def permission_check(self, args: ProcessInput, workspace: str) -> tuple[Verdict, str] | None:
        if args.action != "start" or not args.command:
            return None
        return check_line(args.command, args.working_dir)

    def run(self, args: ProcessInput, ctx: ToolContext) -> ToolResult:
        session = session_of(ctx)
        home = state_root(ctx.settings) / _safe(session)
        if args.action == "start":
            return self.start(args, ctx, home)
        if args.action == "list":
            return self.list(home)
        if args.id == "last":
            states = _states(home)
            if not states:
                raise ToolError("no process has been started in this session")
            state = states[-1]
        else:
            state = home / _safe(args.id or "")
        if not (state / "cmd").exists():
            raise ToolError(f"no process {args.id} in this session; list shows the ones there are")
        if args.action == "read":
            return read_output(state, args.max_bytes)
        if args.action == "write":
            return write_input(state, args.input or "")
        return send_signal(state, args.signal, ctx.sandbox)

    def start(self, args: ProcessInput, ctx: ToolContext, home: Path) -> ToolResult:
        if finding := judge_line(args.command or "", args.working_dir):  # a trust boundary
            raise ToolError(finding.message())
        require_containment(ctx)
        cwd = workspace(ctx).resolve(args.working_dir)
        running = [p for p in _states(home) if not (p / "code").exists()]
        if len(running) >= ctx.settings.process_max_per_session:
            raise ToolError(
                f"{len(running)} processes are running in this session (the limit); "
                "signal one before starting another"
            )
        process_id = f"{ctx.settings.node()}.{uuid.uuid4().hex[:8]}"
        state = home / process_id
        state.mkdir(parents=True)
        (state / "cmd").write_text(args.command or "")
        (state / "cwd").write_text(cwd)
        if not ctx.settings.sandbox_enabled:  # on this host, confined as exec is
            argv = host_argv(ctx, workspace(ctx).root, cwd, args.command or "", INFO_FD).argv
            (state / "argv").write_text(json.dumps(argv))
        else:  # run it in the session's container
            (state / "sandbox_key").write_text(ctx.context.sandbox_key or session_of(ctx))
            (state / "workspace").write_text(workspace(ctx).root)
            sandbox_settings = {
                k: v for k, v in ctx.settings.model_dump().items() if k.startswith("sandbox_")
            }  # no secrets
            (state / "sandbox.json").write_text(json.dumps(sandbox_settings))
        supervisor = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "workers.tools.runtime.procsup",
                str(state),
                str(ctx.settings.process_output_cap_bytes),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
            env=process_live.prepare(ctx, state, process_id),  # the Redis URL never in argv
        )
        threading.Thread(target=supervisor.wait, daemon=True).start()  # reaped at its end
        _started(state, START_WAIT_S)
        return ToolResult(
            for_llm=f"started {process_id}: {args.command}\nread its output with "
            f'{{"action": "read", "id": "{process_id}"}}',
            metadata={"id": process_id},
        )

    def list(self, home: Path) -> ToolResult:
        lines = []
        for state in _states(home):
            code = _text(state / "code")
            status = f"exited {code}" if code is not None else "running"
            lines.append(f"{state.name}  {status}  {_text(state / 'cmd')}")
        return ToolResult(for_llm="\n".join(lines) or "no processes in this session")


def session_of(ctx: ToolContext) -> str:
    return ctx.session_id or ctx.job_id


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in ".-_" else "_" for c in name)[:128] or "_"


def _states(home: Path) -> list[Path]:
    return sorted(
        (p for p in home.glob("*") if (p / "cmd").exists()), key=lambda p: p.stat().st_mtime
    )


def _text(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def read_output(state: Path, max_bytes: int) -> ToolResult:
    """Output since the last read (bounded); says how much was dropped and whether it ended."""
    with output_locked(state):  # the output and its dropped count as one state
        dropped = int(_text(state / "dropped") or 0)
        data = (state / "out").read_bytes() if (state / "out").exists() else b""
    cursor = int(_text(state / "cursor") or 0)
    notes = []
    if cursor < dropped:
        notes.append(f"[{dropped - cursor} bytes of output were dropped (buffer limit)]")
        cursor = dropped
    chunk = data[cursor - dropped : cursor - dropped + max_bytes]
    new_cursor = cursor + len(chunk)
    (state / "cursor").write_text(str(new_cursor))
    remaining = dropped + len(data) - new_cursor
    code = _text(state / "code")
    if remaining:
        notes.append(f"[{remaining} more bytes: read again]")
    notes.append(f"[exited {code}]" if code is not None else "[still running]")
    text = chunk.decode(errors="replace")
    return ToolResult(
        for_llm=(text + ("\n" if text and not text.endswith("\n") else "") + "\n".join(notes)),
        metadata={"exited": code is not None},
    )


def write_input(state: Path, text: str) -> ToolResult:
    if (state / "code").exists():
        raise ToolError(f"{state.name} has exited; nothing reads its stdin")
    try:
        fd = os.open(state / "in", os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ToolError(f"cannot write to {state.name}: {exc.strerror}") from None
    try:
        os.write(fd, text.encode())
    except BlockingIOError:
        raise ToolError(f"{state.name} is not reading its stdin (pipe full)") from None
    finally:
        os.close(fd)
    return ToolResult(for_llm=f"wrote {len(text.encode())} bytes to {state.name}")


def send_signal(state: Path, name: str, sandbox: Sandbox | None = None) -> ToolResult:
    sig = SIGNALS[name.upper().removeprefix("SIG")]
    if (state / "code").exists():
        return ToolResult(for_llm=f"{state.name} had already exited {_text(state / 'code')}")
    if _text(state / "pid") == "sandbox":
        if sandbox is None:
            raise ToolError(f"{state.name} runs in the sandbox, which this worker lacks")
        try:
            sandbox.signal_group(
                _text(state / "container") or "",
                _text(state / "pidfile") or "",
                sig.name.removeprefix("SIG"),
            )
        except SandboxError as exc:
            raise ToolError(str(exc)) from None
        return ToolResult(for_llm=f"sent {sig.name} to {state.name}")
    pid = int(_text(state / "pid") or 0)
    if not pid:
        raise ToolError(f"{state.name} has not started yet")
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:  # just started, not yet leading its group: itself
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return ToolResult(for_llm=f"{state.name} had already exited")
    return ToolResult(for_llm=f"sent {sig.name} to {state.name}")


def _started(state: Path, wait_s: float) -> bool:
    """Whether the process has started (its supervisor writes the pid once the command
    runs) or ended, waiting up to `wait_s` for it."""
    deadline = time.monotonic() + wait_s
    while not ((state / "pid").exists() or (state / "code").exists()):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def end_session(settings: Settings, session: str, sandbox: Sandbox | None = None) -> int:
    """Kill every process of an ended session and remove its state; returns how many. A
    process still starting (a container's exec can take seconds) is waited for, so that it
    is not left running once its state is gone."""
    home = state_root(settings) / _safe(session)
    killed = 0
    for state in _states(home):
        if not _started(state, ENDING_WAIT_S):
            log.warning("process %s had not started %gs on: not ended", state.name, ENDING_WAIT_S)
            continue
        if (state / "code").exists():
            continue
        try:
            send_signal(state, "KILL", sandbox)
            killed += 1
        except ToolError:
            pass
    shutil.rmtree(home, ignore_errors=True)
    return killed


TOOLS: list[type[Tool[ProcessInput]]] = [Process]
