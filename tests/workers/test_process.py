"""The process tool on the host: background commands with bounded output, stdin, signals,
scoped to their session and ended with it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from broker.config.settings import Settings
from broker.protocol import CallContext
from workers.execute import run_tool
from workers.registry import default_registry
from workers.tool import ToolContext, ToolResult
from workers.tools.runtime import process
from workers.tools.runtime.process import end_session

REGISTRY = default_registry()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        process_state_dir=str(tmp_path / "procs"),
        process_output_cap_bytes=1024,
        process_max_per_session=2,
    )


def call(settings: Settings, ws: Path, session: str = "s1", **args: Any) -> ToolResult:
    ctx = ToolContext(CallContext(workspace=str(ws)), settings, job_id="j", session_id=session)
    return run_tool(REGISTRY, "process", args, ctx)


def wait_output(settings: Settings, ws: Path, pid: str, needle: str) -> str:
    seen = ""
    for _ in range(100):
        seen += call(settings, ws, action="read", id=pid).for_llm
        if needle in seen:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} never appeared in {seen!r}")


def test_start_write_read_signal(settings: Settings, workspace: Path) -> None:
    started = call(
        settings, workspace, action="start", command="while read l; do echo got:$l; done"
    )
    pid = started.metadata["id"]
    assert not started.is_error and pid.count(".") == 1
    assert not call(settings, workspace, action="write", id=pid, input="hello\n").is_error
    assert "got:hello" in wait_output(settings, workspace, pid, "got:hello")
    again = call(settings, workspace, action="read", id=pid).for_llm
    assert "got:hello" not in again and "[still running]" in again  # only new output
    assert "running" in call(settings, workspace, action="list").for_llm
    assert "sent SIGTERM" in call(settings, workspace, action="signal", id=pid).for_llm
    assert "[exited" in wait_output(settings, workspace, pid, "[exited")
    assert "exited" in call(settings, workspace, action="list").for_llm


def test_output_is_bounded_and_drops_are_reported(settings: Settings, workspace: Path) -> None:
    pid = call(
        settings, workspace, action="start", command="yes abc | head -c 5000; echo END"
    ).metadata["id"]
    reads: list[str] = []
    for _ in range(100):
        reads.append(call(settings, workspace, action="read", id=pid).for_llm)
        if "[exited 0]" in reads[-1]:
            break
        time.sleep(0.05)
    text = "".join(reads)
    assert "[exited 0]" in text and "bytes of output were dropped" in text and "END" in text
    assert max(map(len, reads)) < 1500  # each read holds at most the 1024-byte cap


def test_sessions_are_separate_limited_and_ended(settings: Settings, workspace: Path) -> None:
    first = call(settings, workspace, action="start", command="sleep 30").metadata["id"]
    call(settings, workspace, action="start", command="sleep 30")
    third = call(settings, workspace, action="start", command="sleep 30")
    assert third.is_error and "limit" in third.for_llm
    other = call(settings, workspace, session="s2", action="read", id=first)
    assert other.is_error and "no process" in other.for_llm
    assert end_session(settings, "s1") == 2
    assert "no processes" in call(settings, workspace, action="list").for_llm


def sleeping(seconds: str) -> list[int]:
    """The pids of `sleep <seconds>` commands running on this host."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:2] == [b"sleep", seconds.encode()]:
            found.append(int(pid))
    return found


def test_a_process_still_starting_as_its_session_ends_is_ended_too(
    settings: Settings, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`start` answers before the command runs (a container's exec can take seconds):
    ending the session then waits for it and kills it, rather than leaving it running
    with its state removed."""
    monkeypatch.setattr(process, "START_WAIT_S", 0)
    started = call(settings, workspace, action="start", command="sleep 3007")
    state = Path(settings.process_state_dir) / "s1" / started.metadata["id"]
    assert not (state / "pid").exists()  # its supervisor has not started it yet
    try:
        assert end_session(settings, "s1") == 1
        for _ in range(100):
            if not sleeping("3007"):
                break
            time.sleep(0.05)
        assert sleeping("3007") == []
    finally:  # what a failure left running
        time.sleep(1)
        for pid in sleeping("3007"):
            os.kill(pid, signal.SIGKILL)


def test_dangerous_and_bad_requests(settings: Settings, workspace: Path) -> None:
    bad = call(settings, workspace, action="start", command="curl x | sh")
    assert bad.is_error and "remote code execution" in bad.for_llm
    assert call(settings, workspace, action="read").is_error  # no id
    assert call(settings, workspace, action="signal", id="x.y", signal="BOGUS").is_error
    assert call(settings, workspace, action="start", command="true", working_dir="../..").is_error


def test_a_read_beside_the_supervisors_writes_sees_its_output_whole_and_within_the_cap(
    tmp_path: Path,
) -> None:
    """The supervisor appends output and trims it to the cap (the file replaced, then the
    count of what it dropped written); reads made meanwhile must each see one state of the
    two: never more than the cap, and every byte at its place in the stream."""
    import re
    import threading

    from workers.tools.runtime.process import read_output
    from workers.tools.runtime.procsup import Sink

    cap, lines = 1024, 10_000
    stream = b"".join(b"%09d\n" % i for i in range(lines))
    sink = Sink(tmp_path, cap)

    def write() -> None:
        for at in range(0, len(stream), 100):
            sink.write(stream[at : at + 100])

    writer = threading.Thread(target=write)
    writer.start()
    position, reads = 0, 0
    while writer.is_alive() or position < len(stream):
        text = read_output(tmp_path, 1_000_000).for_llm
        reads += 1
        skipped = re.search(r"\[(\d+) bytes of output were dropped", text)
        position += int(skipped.group(1)) if skipped else 0
        chunk = text.split("\n[", 1)[0].encode() if not text.startswith("[") else b""
        if chunk:
            chunk += b"\n"
        assert len(chunk) <= cap, (reads, len(chunk))
        assert chunk == stream[position : position + len(chunk)], reads
        position += len(chunk)
    writer.join()
    assert reads > 50  # the reads did meet the writes
