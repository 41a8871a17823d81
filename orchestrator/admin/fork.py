"""Forks, written once for the CLI, the API and both clients: a new job in a new session
whose transcript is a recorded job's up to a turn, in a copy of its workspace brought back
to how it was after that turn.

The copy starts from the workspace as it is now; every file that write_file or edit_file
changed after the turn is put back from the first later change's checkpoint (the version
it replaced: workers/tools/fs/checkpoint.py), or removed if it did not exist then. What no
checkpoint covers (an `exec`, any other call with an effect, an expired checkpoint) is not
undone, and the fork says so in `untracked`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import psycopg
from pydantic import BaseModel, Field

from broker.config.settings import Settings
from broker.errors import Invalid
from broker.protocol import ForkOf, JobSpec
from broker.stores.artifacts import ArtifactGone, ArtifactStore
from broker.stores.replay import RecordedCall, fork_point, recorded_calls, session_messages
from workers.registry import default_registry
from workers.tool import SideEffect


class Fork(BaseModel):
    job_id: str
    session_id: str
    forked_from: str
    turn: int
    workspace: str
    restored: list[str] = Field(default_factory=list, description="files put back")
    removed: list[str] = Field(default_factory=list, description="files that did not exist")
    untracked: list[str] = Field(
        default_factory=list, description="changes after the turn that were not undone"
    )


def fork_workspace(original: str, job_id: str) -> str:
    return f"{original.rstrip(os.sep)}-fork-{job_id[:8]}"


def find_point(conn: psycopg.Connection[Any], job_id: str, turn: int) -> int:
    messages = session_messages(conn, job_id)
    upto = fork_point(messages, job_id, turn)
    if upto < 0:
        ran = sum(1 for m in messages if m["role"] == "assistant" and m["job_id"] == job_id)
        raise Invalid(f"job {job_id} has no stored turn {turn} to fork after (it has {ran})")
    return upto


def _effects_of(call: RecordedCall) -> bool:
    """Whether the call may have changed something here: it ran on a worker (not answered
    from a ledger, not blocked, not refused) and its tool is not a read."""
    source = (call.metadata.get("replay") or {}).get("source")
    if not call.ran or source in ("ledger", "blocked", "sandbox"):
        return False
    tool = default_registry().get(call.name)
    return tool is None or tool.side_effect is not SideEffect.read


def restore(
    conn: psycopg.Connection[Any],
    settings: Settings,
    calls: list[RecordedCall],
    turn: int,
    target: str,
) -> tuple[list[str], list[str], list[str]]:
    """Undo in `target` what the calls after `turn` (1-based) changed, where checkpoints
    allow: (restored, removed, untracked)."""
    artifacts = ArtifactStore(conn, settings)
    restored: list[str] = []
    removed: list[str] = []
    untracked: list[str] = []
    done: set[str] = set()
    for call in calls:
        if call.turn < turn or not _effects_of(call):
            continue
        point = call.metadata.get("checkpoint")
        where = f"{call.name} at turn {call.turn + 1} ({call.call_id})"
        if not point:
            if not (call.is_error and call.name in ("write_file", "edit_file")):
                kind = "exec changes are not tracked" if call.name == "exec" else "no checkpoint"
                untracked.append(f"{where}: {kind}")
            continue
        path = str(point["path"])
        if path in done:
            continue
        done.add(path)
        dest = Path(target, path)
        if point.get("missing"):
            untracked.append(f"{where}: {path} has no checkpoint ({point['missing']})")
            continue
        if point.get("prior") is None:
            if dest.is_file() or dest.is_symlink():
                dest.unlink()
            removed.append(path)
            continue
        found = artifacts.get(str(point["prior"]))
        try:
            data = artifacts.read(found) if found is not None else None
        except ArtifactGone:
            data = None
        if data is None:
            untracked.append(f"{where}: the checkpoint of {path} has expired")
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.is_symlink():
            dest.unlink()
        dest.write_bytes(data)
        restored.append(path)
    return restored, removed, untracked


def prepare(
    conn: psycopg.Connection[Any],
    settings: Settings,
    original: JobSpec,
    job_id: str,
    new_id: str,
    turn: int,
    workspace: str,
) -> tuple[JobSpec, Fork]:
    """The fork's workspace made and brought back, and its spec (not yet stored)."""
    target = workspace or fork_workspace(original.workspace, new_id)
    if os.path.exists(target):
        raise Invalid(f"the fork's workspace {target} exists already: name another")
    if os.path.isdir(original.workspace):
        shutil.copytree(original.workspace, target, symlinks=True)
    else:
        os.makedirs(target)
    restored, removed, untracked = restore(
        conn, settings, recorded_calls(conn, job_id), turn, target
    )
    spec = original.model_copy(
        update={
            "workspace": target,
            "fork": ForkOf(job_id=job_id, turn=turn, untracked=untracked),
            "replay": None,
        }
    )
    report = Fork(
        job_id=new_id,
        session_id=new_id,
        forked_from=job_id,
        turn=turn,
        workspace=target,
        restored=restored,
        removed=removed,
        untracked=untracked,
    )
    return spec, report
