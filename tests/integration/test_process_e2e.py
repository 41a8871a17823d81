"""The process tool through real runtime workers: calls after `start` go to the host's own
queue, and the session's processes are killed when its job ends."""

from __future__ import annotations

import time
from pathlib import Path

from tests.integration.conftest import Cluster, call
from tests.processes import gone_within, token, wait_for_pids


def test_background_process_lives_with_its_session(cluster: Cluster, workspace: Path) -> None:
    mark = token()

    job = cluster.client.submit(
        "serve",
        workspace=str(workspace),
        allow=["process"],
        script={
            "turns": [
                {
                    "tool_calls": [
                        call(
                            "start",
                            "process",
                            action="start",
                            command=f"sleep {mark} & while read l; do echo got:$l; done",
                        )
                    ]
                },
                {
                    "tool_calls": [
                        call("write", "process", action="write", id="last", input="ping\n")
                    ]
                },
                {"tool_calls": [call("sleep", "process", action="list")]},
                {"tool_calls": [call("read", "process", action="read", id="last")]},
                {"text": "served"},
            ]
        },
    )
    wait_for_pids(mark, seconds=30)  # alive while the session is
    result = job.wait(timeout=60)
    by_id = {c.id: c for c in result.tool_calls}
    assert result.status == "completed", result
    assert not any(c.is_error for c in result.tool_calls), result.tool_calls
    assert "got:ping" in by_id["read"].output and "[still running]" in by_id["read"].output
    assert "running" in by_id["sleep"].output
    assert by_id["start"].queue == "runtime"
    gone_within(mark, 10.0)  # the job ended: its session's processes are killed within seconds


def test_calls_about_a_process_reach_its_hosts_queue(cluster: Cluster, workspace: Path) -> None:
    import asyncio
    import socket

    from broker.protocol import CallContext, CallEnvelope
    from orchestrator.calls.dispatch import running_dispatcher
    from workers.registry import default_registry

    tool = default_registry().get("process")
    assert tool is not None
    process_id = f"{socket.gethostname()}.0000dead"
    args = tool.input_model.model_validate({"action": "read", "id": process_id})
    queue = tool.route(args)
    assert queue == f"runtime.{socket.gethostname()}"

    async def send() -> str:
        async with running_dispatcher(cluster.iso.settings, "test-route") as dispatcher:
            envelope = CallEnvelope(
                call_id="r",
                job_id="route-test",
                session_id="s",
                tool="process",
                input={"action": "read", "id": process_id},
                context=CallContext(workspace=str(workspace)),
                timeout_s=10,
                deadline=time.time() + 60,
                reply_to=dispatcher.reply_key,
            )
            outcome = await asyncio.wait_for(dispatcher.call(envelope, queue or ""), 30)
            return outcome.for_llm

    assert "no process" in asyncio.run(send())
