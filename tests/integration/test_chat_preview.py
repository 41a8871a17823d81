"""A job's answer written live in the chat it came from (issue 33), end to end: a real
orchestrator streams a model's reply from a local server speaking the OpenAI and Anthropic
streaming wire, hands versions of it to a real Celery messaging worker, which writes them
to a local server speaking Telegram's Bot API (sendMessage, editMessageText) and Slack's
Web API (chat.postMessage, chat.update). Asserted: one message sent, then edited with a
growing text, never faster than the chat's interval, the last edit the final text; a
channel without `live_answers`, a subagent and an announce job post nothing; a final
woken again, or whose worker is SIGKILLed mid-way, is in the chat once."""

from __future__ import annotations

import itertools
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from broker import keys
from broker.celery.app import create_app
from broker.redis.presence import live_processes
from tests.integration.conftest import Cluster, call, script, start_cluster, wait_until
from tests.orchestrator.model_wire import Answer, Asked, WireServer, streamed
from tests.sites import Reply, Seen, Site
from workers.tools.messaging.preview import PREVIEW_TASK

TG_TOKEN = "123456:live-answers"
INTERVAL_S = 0.5  # chat_preview_interval_s of the cluster
WORDS = [f"w{i:02d} " for i in range(60)]
TEXT = "".join(WORDS)
DELAY_S = 0.05  # between words: 3 s of streaming, about 6 intervals

MODE: dict[str, Callable[[Asked], Answer]] = {}


@dataclass
class Request:
    method: str
    body: dict[str, Any]
    at: float  # time.time() as the server got it

    @property
    def chat(self) -> str:
        return str(self.body.get("chat_id") or self.body.get("channel") or "")


class Provider:
    """Telegram's and Slack's shapes, every request recorded; `kill_on[chat] = n`: the n-th
    sendMessage to that chat SIGKILLs the messaging worker processes first (the provider
    has the message; the worker never hears back)."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        self.kill_on: dict[str, int] = {}
        self.slow: dict[str, float] = {}  # chat → seconds before answering
        self.redis_url = ""

    def __call__(self, seen: Seen) -> Reply:
        method = seen.path.rsplit("/", 1)[1]
        got = Request(method, seen.json(), time.time())
        with self.lock:
            self.requests.append(got)
            count = len(self.requests)
            sends = sum(r.method == "sendMessage" and r.chat == got.chat for r in self.requests)
        if method == "sendMessage" and self.kill_on.get(got.chat) == sends:
            with redis.Redis.from_url(self.redis_url) as client:
                for proc in live_processes(client):
                    if proc.get("queue") == "messaging" and proc.get("kind") == "worker":
                        os.kill(int(proc["pid"]), signal.SIGKILL)
        time.sleep(self.slow.get(got.chat, 0.0))
        ts = f"1700000000.{count:06d}"
        if method == "sendMessage":
            body: dict[str, Any] = {"ok": True, "result": {"message_id": 700 + count}}
        elif method == "editMessageText":
            body = {"ok": True, "result": {"message_id": got.body.get("message_id")}}
        elif method == "chat.postMessage":
            body = {"ok": True, "ts": ts, "channel": got.chat}
        else:  # chat.update
            body = {"ok": True, "ts": got.body.get("ts"), "channel": got.chat}
        return Reply(200, json.dumps(body).encode(), "application/json")

    def to(self, chat: str) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.chat == chat]


@pytest.fixture(scope="module")
def provider() -> Iterator[tuple[Provider, Site]]:
    seen = Provider()
    routes: dict[str, Any] = {
        f"/bot{TG_TOKEN}/{m}": seen for m in ("sendMessage", "editMessageText")
    }
    routes |= {f"/slack/{m}": seen for m in ("chat.postMessage", "chat.update")}
    with Site(routes) as site:
        yield seen, site


@pytest.fixture(scope="module")
def models() -> Iterator[WireServer]:
    with WireServer(lambda asked: MODE["answer"](asked)) as srv:
        yield srv


@pytest.fixture(scope="module")
def cluster(provider: tuple[Provider, Site], models: WireServer) -> Iterator[Cluster]:
    seen, site = provider
    os.environ |= {"TEST_LIVE_TG_TOKEN": TG_TOKEN, "TEST_LIVE_SLACK_TOKEN": "xoxb-live"}
    tg = {"kind": "telegram", "token_env": "TEST_LIVE_TG_TOKEN", "api_base": site.url}
    channels = {
        "tg": tg | {"live_answers": True},
        "sl": {
            "kind": "slack",
            "token_env": "TEST_LIVE_SLACK_TOKEN",
            "api_base": site.url + "/slack",
            "live_answers": True,
        },
        "quiet": tg,  # the same bot, without live answers
    }
    for c in start_cluster(
        groups=("fs", "sessions", "messaging"),
        message_channels=channels,
        web_private_allow=[site.endpoint],
        chat_preview_interval_s=INTERVAL_S,
        chat_preview_retry_s=2,
        # a dead worker's hold on a job's preview lapses after its request's timeouts
        message_timeout_s=2,
        web_connect_timeout_s=1,
        web_read_timeout_s=3,
        openai_base_url=f"{models.url}/v1",
        openai_api_key="key-o",
        anthropic_base_url=models.url,
        anthropic_api_key="key-a",
        model_retry_attempts=2,
        model_retry_initial_s=0.05,
        model_retry_max_s=0.1,
    ):
        seen.redis_url = c.iso.redis_url
        yield c


def from_chat(cluster: Cluster, tmp: Path, channel: str, chat: str, **kwargs: Any) -> Any:
    return cluster.client.submit(
        "from the chat", workspace=str(tmp), user="alice", channel=channel, chat_id=chat, **kwargs
    )


def final_in_chat(seen: Provider, chat: str, text: str, edit: str) -> list[Request]:
    """The chat's requests once the last of them says `text` (the final is written after
    the job ended)."""

    def done() -> list[Request]:
        got = seen.to(chat)
        return got if got and got[-1].method == edit and got[-1].body["text"] == text else []

    return wait_until(done, 30, f"the final text in chat {chat}")  # type: ignore[no-any-return]


def assert_paced(requests: list[Request]) -> None:
    """Never faster than the chat's interval (a little slack for the request's own trip)."""
    gaps = [b.at - a.at for a, b in itertools.pairwise(requests)]
    assert gaps and min(gaps) >= INTERVAL_S - 0.1, gaps


def assert_growing_then_final(requests: list[Request], edit: str, final: str) -> None:
    previews = [r.body["text"] for r in requests[:-1]]
    assert all(final.startswith(t) for t in previews), previews  # each a part of the answer
    assert [len(t) for t in previews] == sorted({len(t) for t in previews})  # growing
    assert requests[-1].method == edit and requests[-1].body["text"] == final


def test_telegram_shows_the_answer_as_it_streams_and_ends_with_the_final(
    cluster: Cluster, provider: tuple[Provider, Site], tmp_path: Path
) -> None:
    seen, _ = provider
    MODE["answer"] = lambda a: streamed(a, WORDS, DELAY_S)
    job = from_chat(cluster, tmp_path, "tg", "5001", model="openai:gpt-s")
    result = job.wait(timeout=60)
    assert (result.status, result.final_text) == ("completed", TEXT)
    got = final_in_chat(seen, "5001", TEXT, "editMessageText")
    assert [r.method for r in got][:2] == ["sendMessage", "editMessageText"]
    assert [r.method for r in got].count("sendMessage") == 1  # one message, edited after
    message_id = 700 + seen.requests.index(got[0]) + 1
    assert all(r.body["message_id"] == message_id for r in got[1:])
    assert len(got) >= 4  # live: ~6 intervals of streaming
    assert_growing_then_final(got, "editMessageText", TEXT)
    assert_paced(got)
    ended = next(e for e in job.events() if e.type == "job_finished")
    assert got[0].at < ended.at - 1.0  # the chat saw text well before the job ended
    gaps = [b.at - a.at for a, b in itertools.pairwise(got)]
    print(
        f"\ntelegram: {len(got)} requests, {min(gaps):.3f} to {max(gaps):.3f} s apart, the"
        f" first {ended.at - got[0].at:.2f} s before the job ended,"
        f" the final {got[-1].at - ended.at:.2f} s after"
    )


def test_slack_shows_the_answer_as_it_streams_and_ends_with_the_final(
    cluster: Cluster, provider: tuple[Provider, Site], tmp_path: Path
) -> None:
    seen, _ = provider
    MODE["answer"] = lambda a: streamed(a, WORDS, DELAY_S)
    job = from_chat(cluster, tmp_path, "sl", "C7", model="anthropic:claude-s")
    assert job.wait(timeout=60).final_text == TEXT
    got = final_in_chat(seen, "C7", TEXT, "chat.update")
    methods = [r.method for r in got]
    assert methods[0] == "chat.postMessage" and set(methods[1:]) == {"chat.update"}
    ts = f"1700000000.{seen.requests.index(got[0]) + 1:06d}"
    assert all(r.body["ts"] == ts for r in got[1:]) and len(got) >= 4
    assert_growing_then_final(got, "chat.update", TEXT)
    assert_paced(got)


def test_two_jobs_in_one_chat_share_its_pace(
    cluster: Cluster, provider: tuple[Provider, Site], tmp_path: Path
) -> None:
    """The limit is the chat's: two answers streaming to it at once, each previewed in its
    own message, reach the provider an interval apart altogether."""
    seen, _ = provider
    MODE["answer"] = lambda a: streamed(a, WORDS, DELAY_S)
    jobs = [from_chat(cluster, tmp_path, "tg", "5002", model="openai:gpt-s") for _ in range(2)]
    assert all(j.wait(timeout=60).final_text == TEXT for j in jobs)

    def both() -> list[Request]:
        # each message ends showing the whole answer: by the final's edit, or, when the
        # chat's pace let a job's first post come only after its answer ended (a loaded
        # machine), by that post or a preview edit (the final then has nothing to change)
        got = seen.to("5002")
        finals = [r for r in got if r.body.get("text") == TEXT]
        return got if len(finals) == 2 else []

    got = wait_until(both, 30, "both finals")
    assert [r.method for r in got].count("sendMessage") == 2  # a message each
    assert len(got) >= 6
    assert_paced(got)


def test_an_answer_longer_than_a_message_goes_on_in_further_messages(
    cluster: Cluster, provider: tuple[Provider, Site], tmp_path: Path
) -> None:
    """The preview fills one message (4,000 characters, CLAWQ_MESSAGE_MAX_CHARS); the
    final leaves it as it is and sends the rest."""
    seen, _ = provider
    words = [f"n{i:03d} " for i in range(1000)]  # 5,000 characters
    MODE["answer"] = lambda a: streamed(a, words, 0.002)
    job = from_chat(cluster, tmp_path, "tg", "5008", model="openai:gpt-s")
    long = "".join(words)
    assert job.wait(timeout=60).final_text == long

    def whole() -> list[Request]:
        got = seen.to("5008")
        sends = [r for r in got if r.method == "sendMessage"]
        return got if len(sends) == 2 else []

    got = wait_until(whole, 30, "the rest of the answer")
    time.sleep(3 * INTERVAL_S)  # nothing more comes
    got = seen.to("5008")
    first = [r.body["text"] for r in got if r.method != "sendMessage" or r is got[0]]
    rest = [r.body["text"] for r in got[1:] if r.method == "sendMessage"]
    assert len(rest) == 1 and first[-1] + rest[0] == long
    assert all(len(t) <= 4000 for t in first + rest) and len(first[-1]) > 3900
    assert_paced(got)


def test_a_reply_asked_again_starts_the_preview_over(
    cluster: Cluster, provider: tuple[Provider, Site], tmp_path: Path
) -> None:
    """The first try overloads after 12 words (1.2 s: shown in the chat); failover asks
    again, and the chat never shows the words of the first try followed by the second's."""
    seen, _ = provider
    tries = {"n": 0}

    def flaky(asked: Asked) -> Answer:
        tries["n"] += 1
        if tries["n"] == 1:
            return streamed(asked, WORDS, 0.1, break_after=12)
        return streamed(asked, WORDS, DELAY_S)

    MODE["answer"] = flaky
    job = from_chat(cluster, tmp_path, "tg", "5007", model="anthropic:claude-s")
    assert job.wait(timeout=60).final_text == TEXT and tries["n"] == 2
    got = final_in_chat(seen, "5007", TEXT, "editMessageText")
    texts = [r.body["text"] for r in got]
    assert all(TEXT.startswith(t) for t in texts), texts  # never "w00 … w11 w00 …"
    assert sum(1 for t in texts if len(t) <= len("".join(WORDS[:12]))) >= 1  # the first try's
    assert_paced(got)


def test_a_channel_without_live_answers_and_subagents_post_nothing(
    cluster: Cluster, provider: tuple[Provider, Site], tmp_path: Path
) -> None:
    seen, _ = provider
    quiet = from_chat(
        cluster, tmp_path, "quiet", "5003", script=script({"text": "not for the chat"})
    )
    assert quiet.wait(timeout=60).status == "completed"
    parent = from_chat(
        cluster,
        tmp_path,
        "tg",
        "5004",
        script={
            "turns": [
                {"tool_calls": [call("s", "sessions_spawn", task="look", label="scout")]},
                {"text": "the parent's answer"},
            ],
            "subagents": {"scout": script({"text": "the child's answer"})},
            "on_announce": script({"text": "the announce job's answer"}),
        },
    )
    assert parent.wait(timeout=60).status == "completed"
    rows = wait_until(
        lambda: [
            r
            for r in cluster.client.store.conn.execute(
                "SELECT id, status FROM jobs WHERE session_id = %s", (parent.id,)
            ).fetchall()
            if r["id"] != parent.id and r["status"] == "completed"
        ],
        60,
        "the announce job",
    )
    assert cluster.client.job(rows[0]["id"]).result().final_text == "the announce job's answer"
    child = parent.subagents()[0]
    assert cluster.client.job(child.id).wait(timeout=30).final_text == "the child's answer"
    wait_until(
        lambda: any(r.body["text"] == "the parent's answer" for r in seen.to("5004")),
        30,
        "the parent's answer in its chat",
    )
    time.sleep(3 * INTERVAL_S + 1)  # a late post would have come by now
    assert [r.body["text"] for r in seen.to("5004")] == ["the parent's answer"]
    assert seen.to("5003") == []
    with redis.Redis.from_url(cluster.iso.redis_url) as client:  # not even handed over
        assert not client.exists(keys.chat_preview(quiet.id), keys.chat_preview(child.id))


def test_a_final_woken_again_is_posted_once(
    cluster: Cluster, provider: tuple[Provider, Site], tmp_path: Path
) -> None:
    """The provider answers slowly; the task is delivered twice more while the first is
    sending and twice after: one message."""
    seen, _ = provider
    seen.slow["5005"] = 1.5
    app = create_app(cluster.iso.settings)
    job = from_chat(cluster, tmp_path, "tg", "5005", script=script({"text": "the answer"}))
    assert job.wait(timeout=60).status == "completed"
    wait_until(lambda: seen.to("5005"), 30, "the send begun")
    for _ in range(2):
        app.send_task(PREVIEW_TASK, args=[job.id], queue="messaging")
    time.sleep(2.0)
    for _ in range(2):
        app.send_task(PREVIEW_TASK, args=[job.id], queue="messaging")
    time.sleep(3.0)
    assert [(r.method, r.body["text"]) for r in seen.to("5005")] == [("sendMessage", "the answer")]


def test_a_final_whose_worker_is_killed_mid_way_is_posted_once(
    cluster: Cluster, provider: tuple[Provider, Site], tmp_path: Path
) -> None:
    """A final of three messages; the provider takes the second and the messaging worker
    processes are SIGKILLed before they hear back. Their hold lapses, the sweeper wakes the
    final again: the second is not sent again (it may be there), the third is sent."""
    seen, _ = provider
    lines = [f"line {i:04d} of a long answer\n" for i in range(360)]  # 9,720 characters
    final = "".join(lines)
    seen.kill_on["5006"] = 2
    job = from_chat(cluster, tmp_path, "tg", "5006", script=script({"text": final}))
    assert job.wait(timeout=60).final_text == final

    def three() -> list[Request]:
        got = seen.to("5006")
        return got if len(got) >= 3 else []

    got = wait_until(three, 60, "the rest of the final after the kill")
    time.sleep(3.0)  # nothing more comes
    got = seen.to("5006")
    assert [r.method for r in got] == ["sendMessage"] * 3
    texts = [r.body["text"] for r in got]
    assert "".join(texts) == final and len(set(texts)) == 3  # each part once, in order
    assert all(len(t) <= 4000 for t in texts)
    assert_paced(got)
