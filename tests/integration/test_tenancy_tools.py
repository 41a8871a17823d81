"""Tenancy through the tools, walked from the registry (issue 26): every tool is classified
below by the objects its input names, so a new tool that is not fails the walk.

Alice's objects are made for real by her own job, which then waits on an approval with all
of them alive: her session and transcript, a subagent parked on its own approval, a message
sent to a local Telegram, a tts artifact (its bytes in the files store), a cron entry, a
memory note and a USER.md, a file in her workspace, and a background process. Bob's job then
calls every object-naming tool with her ids (and his commands name her files by path): each
call is refused, lists nothing of hers, or sees nothing of hers, as the tool's contract is;
and afterwards each of her objects is unchanged, counted by its own side effects: her
process still echoes what she wrote and nothing of bob's, her message was edited only by
her, her cron entry still runs her prompt, her note and transcript hold no word of his and
nothing waits for her sessions, her subagent still waits.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pytest

from broker import keys as broker_keys
from broker.protocol import FINAL_STATUSES, Event, JobResult
from broker.stores.cron import CronStore
from broker.stores.memory import MemoryStore
from tests.integration.conftest import Cluster, call, script, start_cluster, wait_until
from tests.sites import Reply, Seen, Site
from workers.registry import default_registry

# Not under /tmp: a confined command gets a /tmp of its own, which would hide the
# workspaces there by accident; production's roots lie under /var/lib/clawq.
ROOT = Path("/var/tmp") / f"clawq-tenancy-tools-{os.getpid()}"
TOKEN = "424242:tenancy-token"
CHAT = "5001"  # the channel's default target: where alice's message went

# Every tool of the registry, by what its input names that another user may own: field →
# kinds of object ("*": the tool lists objects of that kind), or why it names none.
NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "sessions_history": {"session_id": ("session",)},
    "sessions_send": {"session_id": ("session",)},
    "sessions_list": {"*": ("session",)},
    "subagents": {"target": ("job",), "*": ("job",)},
    "message": {"message_id": ("message",), "attachments": ("artifact",)},
    "cron": {"name": ("cron",), "*": ("cron",)},
    "memory_get": {"path": ("memory",)},
    "memory_search": {"query": ("memory",)},
    "read_file": {"path": ("memory",)},  # memory/… and the context files: the database
    "write_file": {"path": ("memory",)},
    "edit_file": {"path": ("memory",)},
    "list_files": {"path": ("memory",)},
    "process": {"id": ("process",), "*": ("process",), "command": ("workspace",)},
    "nodes": {"node": ("node",)},
    "exec": {"node": ("node",), "command": ("workspace", "artifact")},  # any path on the host
}
NAMES_NONE: dict[str, str] = {
    "browser": "one browser per session, its own; `tab` is an index into its own tabs",
    "canvas": "this session's canvas only",
    "session_status": "this session only",
    "sessions_spawn": "starts a child of this job",
    "spawn": "starts a child of this job",
    "gateway": "the cluster's configuration: administration (test_tenancy)",
    "glob": "the job's workspace, under its user's roots (test_tenancy)",
    "search": "the job's workspace, under its user's roots (test_tenancy)",
    "image": "makes an artifact of this call's user",
    "tts": "makes an artifact of this call's user",
    "skill_search": "the cluster's skills, shared",
    "ask_user": "a question to this job's own user; answered through its owned requests",
    "read_result": "a cut result of this session's own jobs (the query names the session)",
    "web_fetch": "the web",
    "web_search": "the web",
}

ALICE_PROMPT = "ALICE-SESSION-TEXT: plan the garden"
NOTE = "ALICE-NOTE: the heron nests at dawn by the old mill\n"
USER_FILE = "ALICE-USER-FILE: prefers tea\n"
MESSAGE = "ALICE-MESSAGE: the build is green"
CRON_PROMPT = "ALICE-CRON: water the plants"
CRON_RAN = "ALICE-CRON-RAN"
SECRET = "ALICE-WORKSPACE-FILE: the safe code is 1234\n"
MARKERS = ("ALICE-", "got:alice")  # nothing of hers may reach bob's job
BOB = "BOB-WAS-HERE"
ECHO = "while read l; do echo got:$l; done"


class Telegram:
    """The Bot API's sendMessage, sendDocument and editMessageText, each call recorded;
    message ids count up from 1001."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def __call__(self, seen: Seen) -> Reply:
        method = seen.path.rsplit("/", 1)[1]
        body = seen.json() if method != "sendDocument" else {"bytes": len(seen.body)}
        with self.lock:
            self.calls.append((method, body))
            answer = {"ok": True, "result": {"message_id": 1000 + len(self.calls)}}
        return Reply(200, json.dumps(answer).encode(), "application/json")

    def made(self, method: str) -> list[dict[str, Any]]:
        with self.lock:
            return [body for m, body in self.calls if m == method]


@pytest.fixture(scope="module")
def telegram() -> Iterator[tuple[Telegram, Site]]:
    handler = Telegram()
    methods = ("sendMessage", "sendDocument", "editMessageText")
    with Site({f"/bot{TOKEN}/{m}": handler for m in methods}) as site:
        yield handler, site


@pytest.fixture(scope="module")
def cluster(telegram: tuple[Telegram, Site]) -> Iterator[Cluster]:
    _, site = telegram
    ROOT.mkdir(parents=True, exist_ok=True)
    os.environ["TEST_TENANCY_TG_TOKEN"] = TOKEN  # the workers inherit it
    channels = {
        "tg": {
            "kind": "telegram",
            "token_env": "TEST_TENANCY_TG_TOKEN",
            "api_base": site.url,
            "default_target": CHAT,
        }
    }
    try:
        yield from start_cluster(
            groups=("fs", "runtime", "sessions", "automation", "messaging", "memory", "media"),
            concurrency=1,
            approval_timeout_s=600,
            workspace_root=str(ROOT),
            user_ceilings={},  # the default ceiling: each user's workspaces under ROOT/<user>
            message_channels=channels,
            web_private_allow=[site.endpoint],
            memory_embedder="none",  # full text is enough to find her note
            artifact_store="files",  # bytes on the host, as exec would see them
            artifact_dir=str(ROOT / "artifacts"),
        )
    finally:
        shutil.rmtree(ROOT, ignore_errors=True)


def submit(cluster: Cluster, user: str, *turns: dict[str, Any], **spec: Any) -> str:
    """A job of `user` (not an admin's), bounded by the user's ceiling."""
    spec.setdefault("script", script(*turns))
    job = cluster.client.submit(
        spec.pop("prompt", "go"), workspace="", user=user, admin=False, **spec
    )
    return job.id


def one(call_id: str, tool: str, input_: dict[str, Any]) -> dict[str, Any]:
    """A turn of one call (`call` cannot take a field called `name`)."""
    return {"tool_calls": [{"id": call_id, "name": tool, "input": input_}]}


def approval_of(cluster: Cluster, job_id: str) -> str | None:
    """The pending approval request of a job, if it asked."""
    raw: Any = cluster.client.redis.xrange(broker_keys.events(job_id))
    for _, fields in raw:
        event = Event.model_validate_json(fields[b"e"])
        if event.type == "approval_requested":
            request = str(event.data["request_id"])
            row = cluster.client.store.approval(request)
            if row is not None and row["status"] == "pending":
                return request
    return None


def indexed(cluster: Cluster, path: str) -> bool:
    row = cluster.client.store.conn.execute(
        "SELECT indexed_version = version AS done FROM memory_documents"
        " WHERE user_id = 'alice' AND path = %s",
        (path,),
    ).fetchone()
    return bool(row and row["done"])


def result(cluster: Cluster, job_id: str) -> JobResult:
    found = cluster.client.store.job_result(job_id)
    assert found is not None
    return found


def outputs(cluster: Cluster, job_id: str) -> dict[str, Any]:
    return {c.id: c for c in result(cluster, job_id).tool_calls}


@pytest.fixture(scope="module")
def alices(cluster: Cluster) -> dict[str, str]:
    """Alice's objects, made by her own job, which then waits on an approval (so her
    session, its process and its subagent stay alive while bob walks)."""
    child = script({"tool_calls": [call("c", "exec", command="touch child-waits")]}, {"text": "x"})
    turns = (
        {
            "tool_calls": [
                call("note", "write_file", path="memory/alice-note.md", content=NOTE),
                call("user", "write_file", path="USER.md", content=USER_FILE),
                call("secret", "write_file", path="secret.txt", content=SECRET),
            ]
        },
        {"tool_calls": [call("tts", "tts", text="alice speaks")]},
        {"tool_calls": [call("msg", "message", channel="tg", text=MESSAGE)]},
        one(
            "cron",
            "cron",
            {
                "action": "add",
                "name": "alice-nightly",
                "kind": "at",  # not due while the test runs: only a `run` starts it
                "at": (datetime.now(UTC) + timedelta(days=1)).isoformat(),
                "prompt": CRON_PROMPT,
                "script": script({"text": CRON_RAN}),
            },
        ),
        {"tool_calls": [call("proc", "process", action="start", command=ECHO)]},
        {"tool_calls": [call("feed", "process", action="write", id="last", input="alice-1\n")]},
        {"tool_calls": [call("spawn", "sessions_spawn", task="help", label="helper")]},
        {"tool_calls": [call("wait", "exec", command="touch alice-go")]},  # asks: she waits
        # after bob's walk, with her approval: her objects as she left them
        {"tool_calls": [call("read", "process", action="read", id="last")]},
        {"tool_calls": [call("kids", "subagents", action="list")]},
        {
            "tool_calls": [
                call(
                    "edit",
                    "message",
                    action="edit",
                    channel="tg",
                    message_id="1001",
                    text=MESSAGE + " (edited)",
                )
            ]
        },
        {"tool_calls": [call("get", "memory_get", path="memory/alice-note.md")]},
        {"tool_calls": [call("crons", "cron", action="list")]},
        {"text": "alice done"},
    )
    job = submit(
        cluster,
        "alice",
        *turns,
        prompt=ALICE_PROMPT,
        allow=["write_file", "message", "cron", "process"],
        script={**script(*turns), "subagents": {"helper": child}},
    )
    request = wait_until(lambda: approval_of(cluster, job), 90, "alice's job to wait")
    made = outputs(cluster, job)
    assert not any(c.is_error for c in made.values()), made
    (kid,) = cluster.client.store.children(job)
    wait_until(lambda: approval_of(cluster, kid["id"]), 60, "alice's subagent to wait")
    store = cluster.client.store
    wait_until(lambda: indexed(cluster, "memory/alice-note.md"), 60, "her note indexed")
    artifact = store.conn.execute(
        "SELECT id, hash FROM artifacts WHERE job_id = %s AND user_id = 'alice'", (job,)
    ).fetchone()
    spec = store.job(job)
    message_id = re.search(r"message id (\S+)", made["msg"].output)
    process = re.search(r"started (\S+):", made["proc"].output)
    assert artifact and message_id and process and spec, made
    assert message_id[1] == "1001"  # her edit, scripted before the send, names it
    return {
        "job": job,
        "session": job,
        "request": request,
        "child": kid["id"],
        "child_session": kid["id"],  # a subagent's session is its own id
        "artifact": artifact["id"],
        "artifact_file": str(ROOT / "artifacts" / artifact["hash"][:2] / artifact["hash"]),
        "workspace": spec["spec"]["workspace"],
        "message_id": message_id[1],
        "process": process[1],
        "node": process[1].split(".", 1)[0],
        "cron": "alice-nightly",
        "note": "memory/alice-note.md",
    }


# -- the walk ---------------------------------------------------------------------------

Expect = Literal["refused", "listing", "own", "blind", "asked"]


@dataclass
class Step:
    """refused: is_error; listing: answered, nothing of hers in it; own: acts on bob's own
    (his copy, his process); blind: a command of his runs and sees nothing of hers (it may
    fail); asked: not run, the job's own approval is asked for. Whatever the outcome,
    nothing of hers (`unseen` too) is shown."""

    kind: str
    tool: str
    input: dict[str, Any]
    expect: Expect
    unseen: str = ""


def walk(a: dict[str, str]) -> list[Step]:
    """Bob's calls, each naming alice's object (or listing objects of its kind)."""
    pid, art, msg = a["process"], a["artifact"], a["message_id"]
    secret = f"{a['workspace']}/secret.txt"
    return [
        Step("session", "sessions_history", {"session_id": a["session"]}, "refused"),
        Step("session", "sessions_history", {"session_id": a["child_session"]}, "refused"),
        Step("session", "sessions_send", {"session_id": a["session"], "message": BOB}, "refused"),
        Step(
            "session",
            "sessions_send",
            {"session_id": a["child_session"], "message": BOB},
            "refused",
        ),
        Step("session", "sessions_list", {"limit": 100}, "listing"),
        Step("job", "subagents", {"action": "list"}, "listing"),
        Step("job", "subagents", {"action": "cancel", "target": a["child"]}, "refused"),
        Step("job", "subagents", {"action": "cancel", "target": a["child"][:8]}, "refused"),
        Step(
            "job", "subagents", {"action": "steer", "target": a["child"], "message": BOB}, "refused"
        ),
        Step(
            "message",
            "message",
            {"action": "edit", "channel": "tg", "message_id": msg, "text": BOB},
            "refused",
        ),
        Step(
            "message",
            "message",
            {
                "action": "edit",
                "channel": "tg",
                "target": CHAT,
                "message_id": msg,
                "text": BOB,
                "forward": True,
                "reason": "bob",
            },
            "refused",
        ),
        Step(
            "artifact", "message", {"channel": "tg", "text": BOB, "attachments": [art]}, "refused"
        ),
        Step("cron", "cron", {"action": "list"}, "listing"),
        Step("cron", "cron", {"action": "status"}, "listing"),
        Step("cron", "cron", {"action": "runs", "name": a["cron"]}, "refused"),
        Step("cron", "cron", {"action": "update", "name": a["cron"], "prompt": BOB}, "refused"),
        Step("cron", "cron", {"action": "run", "name": a["cron"]}, "refused"),
        Step("cron", "cron", {"action": "remove", "name": a["cron"]}, "refused"),
        Step("memory", "memory_get", {"path": a["note"]}, "refused"),
        Step("memory", "memory_search", {"query": "heron nests"}, "listing"),
        Step(
            "memory", "memory_search", {"query": "heron nests at dawn by the old mill"}, "listing"
        ),
        Step("memory", "read_file", {"path": a["note"]}, "refused"),
        Step("memory", "read_file", {"path": "USER.md"}, "refused"),
        Step("memory", "list_files", {"path": "memory"}, "listing"),
        Step(
            "memory",
            "edit_file",
            {"path": a["note"], "old_string": "heron", "new_string": BOB},
            "refused",
        ),
        Step(
            "memory",
            "edit_file",
            {"path": "USER.md", "old_string": "tea", "new_string": BOB},
            "refused",
        ),
        Step("memory", "write_file", {"path": a["note"], "content": BOB}, "own"),
        Step("process", "process", {"action": "list"}, "listing"),
        Step("workspace", "process", {"action": "start", "command": f"cat {secret}"}, "own"),
        Step("process", "process", {"action": "read", "id": pid}, "refused"),
        Step("process", "process", {"action": "write", "id": pid, "input": BOB + "\n"}, "refused"),
        Step("process", "process", {"action": "signal", "id": pid, "signal": "KILL"}, "refused"),
        Step("workspace", "exec", {"command": f"cat {secret}"}, "blind"),
        Step("workspace", "exec", {"command": f"ls {ROOT}"}, "blind", unseen="alice"),
        Step(
            "artifact",
            "exec",
            {"command": f"head -c 4 {a['artifact_file']}"},
            "blind",
            unseen="OggS",
        ),
        Step("workspace", "process", {"action": "read", "id": "last"}, "blind", unseen="[still"),
        Step("node", "nodes", {"action": "describe", "node": a["node"]}, "listing"),
        Step("node", "exec", {"command": f"echo {BOB}", "node": a["node"]}, "asked"),
    ]


def test_every_tool_is_classified() -> None:
    tools = {t.name: t for t in default_registry()._select(None)}
    assert not set(NAMES) & set(NAMES_NONE)
    assert set(NAMES) | set(NAMES_NONE) == set(tools), "classify the new tool in NAMES"
    for name, fields in NAMES.items():
        for field in fields:
            assert field == "*" or field in tools[name].input_model.model_fields, (name, field)


def test_the_walk_covers_every_object_naming_tool() -> None:
    names = ("session", "child_session", "child", "process", "artifact", "artifact_file")
    ids = {k: f"x{k}" for k in names}
    steps = walk(
        {**ids, "message_id": "1", "node": "n", "cron": "c", "note": "m/n.md", "workspace": "/w"}
    )
    walked = {(s.tool, s.kind) for s in steps}
    classified = {(t, kind) for t, fields in NAMES.items() for ks in fields.values() for kind in ks}
    assert walked == classified
    for tool, fields in NAMES.items():  # every field that names an object is walked
        for field, kinds in fields.items():
            for kind in kinds:
                assert any(
                    s.tool == tool and s.kind == kind and (field in s.input or field == "*")
                    for s in steps
                ), (tool, field, kind)


BOBS_RULES = ["message", "cron", "process", "write_file", "edit_file"] + [
    f"exec({c} *)" for c in ("echo", "cat", "ls", "head")
]


def test_bobs_job_reaches_nothing_of_alices(
    cluster: Cluster, telegram: tuple[Telegram, Site], alices: dict[str, str]
) -> None:
    handler, _ = telegram
    steps = walk(alices)
    before = alices_state(cluster, alices)
    turns = [one(f"s{n}", s.tool, s.input) for n, s in enumerate(steps)]
    bob = submit(
        cluster,
        "bob",
        *turns,
        {"text": "bob done"},
        allow=BOBS_RULES,
        max_iterations=len(steps) + 5,
    )
    # aiming exec at a node needs the job's own exec(node:NAME): asked, and bob says no
    request = wait_until(lambda: approval_of(cluster, bob), 90, "bob's exec on the node")
    cluster.client.job(bob).approve(request, "deny", by="bob", admin=False)
    done = cluster.client.job(bob).wait(timeout=60)
    assert done.status == "completed", done
    made = {c.id: c for c in done.tool_calls}
    secret = [alices[k] for k in ("session", "child", "process", "artifact", "cron", "note")]
    for n, s in enumerate(steps):
        got = made[f"s{n}"]
        where = (s.tool, s.input, got.output)
        assert not any(m in got.output for m in MARKERS), where
        assert not s.unseen or s.unseen not in got.output, where
        if s.expect == "refused":
            assert got.is_error, where
        elif s.expect == "blind":
            pass
        elif s.expect == "asked":
            assert got.is_error and got.decision == "deny:approval", where
        else:
            assert not got.is_error, where
            if s.expect == "listing":
                assert not any(x in got.output for x in secret), where
    pairs = {(s.tool, s.kind) for s in steps}
    print(
        f"tenancy walk: {len(pairs)} (tool, object kind) pairs over "
        f"{len({s.tool for s in steps})} tools x {len({s.kind for s in steps})} kinds, "
        f"{len(steps)} calls"
    )

    # alice goes on: her objects are as she left them
    cluster.client.job(alices["job"]).approve(
        alices["request"], "allow-once", by="alice", admin=False
    )
    hers = cluster.client.job(alices["job"]).wait(timeout=90)
    assert hers.status == "completed", hers
    after = {c.id: c for c in hers.tool_calls}
    assert not any(c.is_error for c in hers.tool_calls), hers.tool_calls
    read = after["read"].output
    assert "got:alice-1" in read and "[still running]" in read and BOB not in read, read
    kids = after["kids"].output
    assert alices["child"] in kids and "cancelled" not in kids and "archived" not in kids, kids
    assert after["get"].output == NOTE.rstrip("\n")
    assert "alice-nightly" in after["crons"].output
    assert handler.made("sendMessage") == [{"chat_id": CHAT, "text": MESSAGE}]  # bob sent none
    assert handler.made("sendDocument") == []
    edits = handler.made("editMessageText")
    assert [e["text"] for e in edits] == [MESSAGE + " (edited)"]  # hers alone
    assert alices_state(cluster, alices) == before

    # and what needs her ids: her artifact is hers to send, her session hers to read, her
    # cron entry still runs her prompt, her note is found by her search
    later = submit(
        cluster,
        "alice",
        {
            "tool_calls": [
                call("send", "message", channel="tg", text="file", attachments=[alices["artifact"]])
            ]
        },
        {"tool_calls": [call("hist", "sessions_history", session_id=alices["session"], last=200)]},
        {"tool_calls": [call("find", "memory_search", query="heron nests")]},
        one("run", "cron", {"action": "run", "name": alices["cron"]}),
        {"text": "ok"},
        allow=["message", "cron"],
    )
    own = cluster.client.job(later).wait(timeout=60)
    assert not any(c.is_error for c in own.tool_calls), own.tool_calls
    calls = {c.id: c for c in own.tool_calls}
    assert len(handler.made("sendDocument")) == 1
    assert ALICE_PROMPT in calls["hist"].output and BOB not in calls["hist"].output
    assert "memory/alice-note.md" in calls["find"].output
    ran = re.search(r"as job (\S+)", calls["run"].output)
    assert ran, calls["run"].output
    run = cluster.client.job(ran[1]).wait(timeout=60)
    assert run.final_text == CRON_RAN, run


def alices_state(cluster: Cluster, a: dict[str, str]) -> dict[str, Any]:
    """What bob's calls could have changed of alice's, read from the stores."""
    store = cluster.client.store
    cron = CronStore(store.conn).get("main", "alice", a["cron"])
    note = MemoryStore(store.conn).exact("main", "alice", a["note"])
    (child,) = store.children(a["session"])
    assert cron is not None and note is not None
    transcripts = [
        json.dumps(store.transcript(s, 1000)) for s in (a["session"], a["child_session"])
    ]
    assert not any(BOB in t for t in transcripts)
    assert child["status"] not in FINAL_STATUSES and not child["archived"]
    r = cluster.client.redis
    waiting = [  # sent to her sessions, not read yet: in the announce queue or an inbox
        *(r.llen(broker_keys.announce(s)) for s in (a["session"], a["child_session"])),
        *(r.llen(broker_keys.inbox(j)) for j in (a["job"], a["child"])),
    ]
    return {
        "waiting": waiting,
        "cron": (
            cron.prompt,
            cron.enabled,
            cron.rules,
            cron.next_at,
            len(CronStore(store.conn).runs(cron.id)),
        ),
        "note": (note.content, note.version),
        "child": (child["id"], child["status"], child["label"]),
        "jobs": store.conn.execute(
            "SELECT count(*) AS n FROM jobs WHERE spec->>'user_id' = 'alice'"
        ).fetchone(),
        "user_file": store.conn.execute(
            "SELECT content, version FROM context_files WHERE user_id = 'alice'"
        ).fetchall(),
    }
