"""Streaming through the whole stack: a local server speaking the OpenAI and Anthropic
streaming wire sends a reply word by word, a little apart; the orchestrator coalesces the
words into `model_delta` events, the API serves them as SSE, and the clients fold them
into typed deltas. Measured: the time from the server's send of a word to an SSE client
holding it (printed; the target is under 100 ms, asserted generously)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse

from broker.config.secretbox import new_key
from broker.stores.api_keys import ApiKeyStore
from orchestrator.client import Client
from orchestrator.client.deltas import JobEnded, TextDelta, TextReset, ToolOutputDelta
from tests.integration.conftest import Cluster, call, script, serve_api, start_cluster
from tests.orchestrator.model_wire import Answer, Asked, WireServer, streamed

WORDS = [f"w{i:02d} " for i in range(40)]
TEXT = "".join(WORDS)
DELAY_S = 0.02  # between words: 40 words in 0.8 s, about 16 batches of 50 ms

# what the server answers now (the tests set it)
MODE: dict[str, Callable[[Asked], Answer]] = {}


def answer(asked: Asked) -> Answer:
    return MODE["answer"](asked)


def slow_start(reply: Answer, wait_s: float = 0.4) -> Answer:
    """The first word only after `wait_s`: time for an SSE client to connect."""
    reply.pieces.insert(0, (wait_s, ""))
    return reply


@pytest.fixture(scope="module")
def server() -> Iterator[WireServer]:
    with WireServer(answer) as srv:
        yield srv


@pytest.fixture(scope="module")
def cluster(server: WireServer) -> Iterator[Cluster]:
    yield from start_cluster(
        groups=("fs", "runtime"),
        tool_output_stream_max_bytes=2000,
        secret_key=new_key(),
        openai_base_url=f"{server.url}/v1",
        openai_api_key="key-o",
        anthropic_base_url=server.url,
        anthropic_api_key="key-a",
        model_retry_attempts=2,
        model_retry_initial_s=0.05,
        model_retry_max_s=0.1,
    )


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Iterator[str]:
    yield from serve_api(cluster)


@pytest.fixture(scope="module")
def key(cluster: Cluster) -> str:
    return ApiKeyStore(cluster.client.store).create("alice", admin=True)[1]


def sse_events(
    api: str, key: str, job_id: str, last: str | None = None, stop: int = 0
) -> list[tuple[float, Any]]:
    """(arrival time, event) of the job's SSE stream; after `stop` model_deltas, it hangs
    up (a client that drops)."""
    headers = {"Authorization": f"Bearer {key}"} | ({"Last-Event-ID": last} if last else {})
    got: list[tuple[float, Any]] = []
    deltas = 0
    with (
        httpx.Client(base_url=api, headers=headers, timeout=httpx.Timeout(30.0)) as http,
        connect_sse(http, "GET", f"/v1/jobs/{job_id}/events") as source,
    ):
        assert source.response.status_code == 200
        for sse in source.iter_sse():
            event = json.loads(sse.data)
            assert event["id"] == sse.id  # the SSE id is the stream id
            got.append((time.time(), event))
            deltas += event["type"] == "model_delta"
            if event["type"] == "job_finished" or (stop and deltas == stop):
                break
    return got


def latencies(sent: list[tuple[float, str]], got: list[tuple[float, Any]]) -> list[float]:
    """For each word the server sent: when the first delta holding its end arrived."""
    ends, offset = [], 0
    for at, piece in sent:
        for word in WORDS:
            if json.dumps(word) in piece:
                offset += len(word)
                ends.append((at, offset))
    arrivals, have = [], 0
    for at, event in got:
        if event["type"] == "model_delta":
            have += len(event["data"]["text"])
            arrivals.append((at, have))
    return [next(a for a, h in arrivals if h >= end) - sent_at for sent_at, end in ends]


def test_openai_deltas_reach_an_sse_client_fast(
    cluster: Cluster, server: WireServer, api: str, key: str, tmp_path: Any
) -> None:
    MODE["answer"] = lambda a: slow_start(streamed(a, WORDS, DELAY_S))
    server.sent.clear()
    job = cluster.client.submit("talk", model="openai:gpt-s", workspace=str(tmp_path))
    got = sse_events(api, key, job.id)
    result = job.wait(timeout=30)
    assert (result.status, result.final_text) == ("completed", TEXT)
    deltas = [e["data"] for _, e in got if e["type"] == "model_delta"]
    assert "".join(d["text"] for d in deltas) == TEXT  # in order, nothing twice
    assert [d["offset"] for d in deltas] == [
        sum(len(x["text"]) for x in deltas[:i]) for i in range(len(deltas))
    ]
    assert 3 <= len(deltas) <= len(WORDS) // 2  # coalesced, yet streamed
    types = [e["type"] for _, e in got]
    assert types.index("model_text") > max(i for i, t in enumerate(types) if t == "model_delta")
    waits = latencies(server.sent, got)
    assert len(waits) == len(WORDS)
    median = statistics.median(waits)
    print(
        f"\nprovider send → SSE client: median {median * 1000:.1f} ms, "
        f"max {max(waits) * 1000:.1f} ms over {len(waits)} words, {len(deltas)} deltas"
    )
    assert median < 1.0
    # the transcript keeps the final text only: the prompt, then the reply
    session = (cluster.client.store.job(job.id) or {})["session_id"]
    rows = cluster.client.store.transcript(session, 100)
    assert [r["role"] for r in rows] == ["user", "assistant"]
    assert json.dumps(TEXT) in json.dumps(rows[1]["content"])


def test_a_reconnect_with_last_event_id_gets_the_rest(
    cluster: Cluster, server: WireServer, api: str, key: str, tmp_path: Any
) -> None:
    MODE["answer"] = lambda a: slow_start(streamed(a, WORDS, DELAY_S))
    job = cluster.client.submit("talk", model="openai:gpt-s", workspace=str(tmp_path))
    first = sse_events(api, key, job.id, stop=2)  # hangs up mid-reply
    assert job.result().status == "running"
    rest = sse_events(api, key, job.id, last=first[-1][1]["id"])
    assert rest[-1][1]["type"] == "job_finished"
    ids = [e["id"] for _, e in first + rest]
    assert len(ids) == len(set(ids))  # nothing twice
    text = "".join(e["data"]["text"] for _, e in first + rest if e["type"] == "model_delta")
    assert text == TEXT  # nothing missed


@pytest.mark.parametrize("remote", [False, True])
def test_job_stream_yields_anthropic_text_in_order(
    cluster: Cluster, api: str, key: str, tmp_path: Any, remote: bool
) -> None:
    MODE["answer"] = lambda a: streamed(a, WORDS, DELAY_S / 4)
    client = Client(api_url=api, api_key=key) if remote else cluster.client
    job = client.submit("talk", model="anthropic:claude-s", workspace=str(tmp_path))
    items = list(job.stream())
    texts = [d for d in items if isinstance(d, TextDelta)]
    assert len(texts) > 1 and not any(d.final for d in texts)  # streamed, not filled in
    assert "".join(d.text for d in texts) == TEXT
    ended = items[-1]
    assert isinstance(ended, JobEnded) and ended.status == "completed"
    assert ended.final_text == TEXT
    # a reader that goes on after a delta misses nothing after it
    after = list(job.stream(after=texts[0].event_id))
    assert "".join(d.text for d in after if isinstance(d, TextDelta)) == TEXT[len(texts[0].text) :]
    if remote:
        client.close()


def test_a_reply_asked_again_resets_what_was_streamed(
    cluster: Cluster, server: WireServer, tmp_path: Any
) -> None:
    """The first try overloads after 10 words; failover asks again: a reset delta comes
    before the second try's text, so a client never shows the words twice."""
    tries = {"n": 0}

    def flaky(asked: Asked) -> Answer:
        tries["n"] += 1
        return streamed(asked, WORDS, DELAY_S / 2, break_after=10 if tries["n"] == 1 else -1)

    MODE["answer"] = flaky
    job = cluster.client.submit("talk", model="anthropic:claude-s", workspace=str(tmp_path))
    assert job.wait(timeout=30).final_text == TEXT
    deltas = [e.data for e in job.events() if e.type == "model_delta"]
    resets = [i for i, d in enumerate(deltas) if d.get("reset")]
    assert len(resets) == 1 and tries["n"] == 2
    before = "".join(d["text"] for d in deltas[: resets[0]])
    assert before and before == TEXT[: len(before)]
    assert "".join(d["text"] for d in deltas[resets[0] + 1 :]) == TEXT
    items = list(job.stream())
    shown = ""
    for item in items:
        if isinstance(item, TextReset):
            shown = ""
        elif isinstance(item, TextDelta):
            assert not item.final
            shown += item.text
    assert shown == TEXT


def test_clawq_run_prints_the_text_as_it_comes(cluster: Cluster, tmp_path: Any) -> None:
    """Live (as on a terminal): the words reach stderr while the reply still streams, the
    final text goes to stdout once; with --json, stdout is the one JSON object, as ever."""
    MODE["answer"] = lambda a: streamed(a, WORDS, DELAY_S)
    env = {**os.environ, **cluster.env}
    base = [sys.executable, "-m", "orchestrator.cli", "run", "--model", "openai:gpt-s"]
    base += ["--workspace", str(tmp_path)]
    seen: dict[str, float] = {}
    err = b""
    with subprocess.Popen(
        [*base, "--live", "talk"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as proc:
        assert proc.stderr is not None and proc.stdout is not None
        while chunk := proc.stderr.read1(4096):
            err += chunk
            for word in ("w00", "w39", "completed after"):
                if word.encode() in err and word not in seen:
                    seen[word] = time.monotonic()
        out = proc.stdout.read().decode()
        assert proc.wait(30) == 0, err.decode()
    assert out.strip() == TEXT.strip()
    said = err.decode()
    assert "model: " + TEXT in said  # the streamed text, once, as one paragraph
    assert said.count("w17") == 1
    assert seen["w39"] - seen["w00"] > 0.3  # as it came: 40 words, 20 ms apart
    done = subprocess.run([*base, "--json", "talk"], env=env, capture_output=True, timeout=60)
    assert json.loads(done.stdout)["final_text"] == TEXT
    assert b"w17" not in done.stderr


KEY_TAIL = "Ab3dE" * 19 + "AA"  # an Anthropic key's, after its prefix
SECRETS = (  # each secret split across writes 0.3 s apart: across coalesced batches
    f"printf 'key is sk-ant-api03-'; sleep 0.3; echo {KEY_TAIL}; "
    "printf '%s\\n' '-----BEGIN PRIVATE KEY-----' MIIEvQIBADANBgkqhkiG9w0BAQEFAASC; "
    "sleep 0.3; printf '%s\\n' '-----END PRIVATE KEY-----'"
)


def test_exec_output_streams_while_it_runs(cluster: Cluster, tmp_path: Any) -> None:
    """An exec's stdout and stderr come as `tool_output_delta` events while it runs, in
    order, bounded per call; its result has the whole output as before."""
    slow = "for i in 1 2 3; do echo line$i; sleep 0.3; done; echo oops >&2"
    loud = "head -c 5000 /dev/zero | tr '\\0' x"
    job = cluster.client.submit(
        "run",
        script=script(
            {"text": "", "tool_calls": [call("c1", "exec", command=slow)]},
            {"text": "", "tool_calls": [call("c2", "exec", command=loud)]},
            {"text": "", "tool_calls": [call("c3", "exec", command=SECRETS)]},
            {"text": "done"},
        ),
        workspace=str(tmp_path),
        allow=["exec"],
    )
    assert job.wait(timeout=60).status == "completed"
    events = list(job.events())
    out = [e for e in events if e.type == "tool_output_delta" and e.data["call_id"] == "c1"]
    said = {
        s: "".join(e.data["text"] for e in out if e.data["stream"] == s)
        for s in ("stdout", "stderr")
    }
    assert said == {"stdout": "line1\nline2\nline3\n", "stderr": "oops\n"}
    finished = next(
        e for e in events if e.type == "tool_call_finished" and e.data["call_id"] == "c1"
    )
    assert finished.at - out[0].at > 0.4  # the first line came while it ran (0.9 s)
    assert len(out) >= 3  # line by line, not at the end
    big = [e.data for e in events if e.type == "tool_output_delta" and e.data["call_id"] == "c2"]
    assert sum(len(d["text"]) for d in big) == 2000  # tool_output_stream_max_bytes
    assert big[-1].get("truncated") and len(big) < 20
    record = next(c for c in job.result().tool_calls if c.id == "c2")
    assert "x" * 5000 in record.output  # the result keeps it all
    hidden = [e.data for e in events if e.type == "tool_output_delta" and e.data["call_id"] == "c3"]
    shown = "".join(d["text"] for d in hidden)
    assert shown.count("[REDACTED]") == 2, shown  # scrubbed as the result is
    assert KEY_TAIL not in shown and "MIIEv" not in shown and "sk-ant" not in shown
    items = [d for d in job.stream() if isinstance(d, ToolOutputDelta) and d.call_id == "c1"]
    assert "".join(d.text for d in items if d.stream == "stdout") == "line1\nline2\nline3\n"


def test_clawq_run_shows_exec_output_as_it_comes(cluster: Cluster, tmp_path: Any) -> None:
    slow = "for i in 1 2 3; do printf li; sleep 0.2; echo ne$i; done"
    plan = script({"text": "", "tool_calls": [call("c1", "exec", command=slow)]}, {"text": "ok"})
    (tmp_path / "script.json").write_text(json.dumps(plan))
    done = subprocess.run(
        [
            *(sys.executable, "-m", "orchestrator.cli", "run", "--live", "--allow", "exec"),
            *("--script", str(tmp_path / "script.json"), "--workspace", str(tmp_path), "go"),
        ],
        env={**os.environ, **cluster.env},
        capture_output=True,
        timeout=60,
    )
    said = done.stderr.decode()
    assert done.returncode == 0, said
    shown = [line for line in said.splitlines() if line.startswith("  │ ")]
    assert shown == ["  │ line1", "  │ line2", "  │ line3"]  # whole lines, though sent in parts
    assert said.index("│ line3") < said.index("✓ exec")
