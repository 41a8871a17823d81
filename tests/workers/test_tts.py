"""tts on the real parts: espeak-ng, ffmpeg and ffprobe as installed, artifacts in
PostgreSQL, quotas in Redis, and local HTTP servers that speak the vendors' documented
APIs (OpenAI's POST /audio/speech, ElevenLabs' POST /v1/text-to-speech/{voice_id}), check
each request's shape and answer with real audio that ffmpeg made. Edge's service cannot be
reached from here: only its refusal by the egress policy is tested."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from broker.config.settings import Settings
from broker.pg.store import Store
from broker.protocol import CallContext
from broker.stores.artifacts import ArtifactStore
from tests.conftest import Isolated
from tests.sites import Reply, Seen, Site
from workers.execute import run_tool
from workers.registry import default_registry
from workers.tool import ToolContext, ToolResult
from workers.tools.media.tts import guarded_connector, sentences, split_text, voice_for

REGISTRY = default_registry()
OPENAI_KEY, ELEVEN_KEY = "sk-test-openai-tts", "xi-test-key"
SECONDS_PER_CHAR = 0.02  # what the local servers speak: a tone this long per character
FFMPEG = ["ffmpeg", "-nostdin", "-loglevel", "error"]
WPM = 175  # espeak-ng's default rate (`espeak-ng -s`, words per minute)

WEATHER = (
    "Good morning. The weather today is mild, with a light breeze from the west. Expect "
    "some clouds in the afternoon, and perhaps a short shower before sunset. Tomorrow will "
    "be warmer and mostly sunny. It is a good day for a walk by the river or a picnic in "
    "the park. Remember to bring water, and a hat if you burn easily."
)


def tone(seconds: float, fmt: str) -> bytes:
    """Real encoded audio (a 440 Hz tone) of a known length, as a vendor would answer."""
    codec = {
        "opus": ["-ac", "1", "-c:a", "libopus", "-f", "ogg", "-"],
        "mp3": ["-ac", "1", "-c:a", "libmp3lame", "-f", "mp3", "-"],
    }
    return subprocess.run(
        [*FFMPEG, "-f", "lavfi", "-i", f"sine=frequency=440:duration={seconds:.3f}", *codec[fmt]],
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout


def decoded_seconds(data: bytes) -> float:
    """The length of audio as decoded samples (16 kHz mono s16), not the container's word."""
    pcm = subprocess.run(
        [*FFMPEG, "-i", "-", "-f", "s16le", "-ac", "1", "-ar", "16000", "-"],
        input=data,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    return len(pcm) / 2 / 16000


def openai_speech(seen: Seen) -> Reply:
    if seen.headers.get("authorization") != f"Bearer {OPENAI_KEY}":
        return Reply(401, b'{"error": {"message": "Incorrect API key"}}', "application/json")
    asked = seen.json()
    if set(asked) != {"model", "input", "voice", "response_format"}:
        return Reply(400, b'{"error": {"message": "bad fields"}}', "application/json")
    fmt = asked["response_format"]
    mime = {"opus": "audio/ogg", "mp3": "audio/mpeg"}[fmt]
    return Reply(200, tone(len(asked["input"]) * SECONDS_PER_CHAR, fmt), mime)


def elevenlabs_speech(seen: Seen) -> Reply:
    if seen.headers.get("xi-api-key") != ELEVEN_KEY:
        body = b'{"detail": {"status": "invalid_api_key", "message": "Invalid API key"}}'
        return Reply(401, body, "application/json")
    asked = seen.json()
    assert set(asked) == {"text", "model_id"}
    return Reply(200, tone(len(asked["text"]) * SECONDS_PER_CHAR, "mp3"), "audio/mpeg")


def failing(seen: Seen) -> Reply:
    body = b'{"error": {"message": "The server had an error", "type": "server_error"}}'
    return Reply(500, body, "application/json")


@pytest.fixture
def vendor() -> Iterator[Site]:
    routes: dict[str, Any] = {
        "/v1/audio/speech": openai_speech,
        "/v1/text-to-speech/voice123": elevenlabs_speech,
        "/broken/v1/audio/speech": failing,
    }
    with Site(routes) as site:
        yield site


@pytest.fixture
def store(isolated: Isolated) -> Iterator[Store]:
    store = Store(isolated.database_url)
    yield store
    store.close()


def settings_for(isolated: Isolated, site: Site | None = None, **extra: Any) -> Settings:
    local = (
        {
            "web_private_allow": [site.endpoint],
            "openai_base_url": f"{site.url}/v1",
            "openai_api_key": OPENAI_KEY,
            "elevenlabs_base_url": site.url,
            "elevenlabs_api_key": ELEVEN_KEY,
            "elevenlabs_voice_id": "voice123",
        }
        if site
        else {}
    )
    return isolated.settings.model_copy(update={**local, **extra})


def tts(settings: Settings, store: Store, client: redis.Redis | None = None, **args: Any) -> Any:
    ctx = ToolContext(
        CallContext(workspace="/tmp", user_id="ann"),
        settings,
        job_id="job-1",
        session_id="s-1",
        store=lambda: store,
        redis=client,
    )
    result: ToolResult = run_tool(REGISTRY, "tts", args, ctx)
    return result


def audio_of(result: ToolResult, store: Store, settings: Settings) -> tuple[Any, bytes]:
    artifacts = ArtifactStore(store.conn, settings)
    found = artifacts.get(result.metadata["artifact_id"])
    assert found is not None
    return found, artifacts.read(found)


def test_espeak_speaks_about_as_long_as_the_text_predicts(isolated: Isolated, store: Store) -> None:
    settings = settings_for(isolated)  # the defaults: espeak, Ogg Opus
    result = tts(settings, store, text=WEATHER)
    assert not result.is_error, result.for_llm
    artifact, data = audio_of(result, store, settings)
    assert artifact.mime == "audio/ogg" and data[:4] == b"OggS"
    assert artifact.user_id == "ann" and artifact.session_id == "s-1" and artifact.job_id == "job-1"
    measured = decoded_seconds(data)
    predicted = len(WEATHER.split()) / WPM * 60  # 62 words at 175 wpm: 21.3 s
    # measured: espeak-ng 1.51 speaks it in 17.8 s, 0.84 of the nominal rate's prediction
    assert abs(measured - predicted) <= 0.3 * predicted, (measured, predicted)
    assert artifact.duration_s == pytest.approx(measured, abs=0.15)
    assert result.for_llm.startswith(f"artifact {artifact.id} (audio/ogg, {artifact.size} bytes")
    assert f", {artifact.duration_s:.1f} s)" in result.for_llm
    assert "spoken by espeak in 1 request" in result.for_llm
    assert result.metadata["provider"] == "espeak" and result.metadata["format"] == "opus"


def test_mp3_comes_out_as_mpeg_audio(isolated: Isolated, store: Store) -> None:
    settings = settings_for(isolated, tts_format="mp3")
    result = tts(settings, store, text="Hello there. This is the second format.")
    assert not result.is_error, result.for_llm
    artifact, data = audio_of(result, store, settings)
    assert artifact.mime == "audio/mpeg" and artifact.name == "speech.mp3"
    assert data[:3] == b"ID3" or data[0] == 0xFF
    assert decoded_seconds(data) == pytest.approx(artifact.duration_s, abs=0.15)
    # the call's format wins over the configured one
    opus = tts(settings, store, text="And back to opus.", format="opus")
    assert opus.metadata["mime"] == "audio/ogg"


@pytest.mark.parametrize("fmt", ["opus", "mp3"])
def test_long_text_goes_to_openai_in_sentence_sized_requests_and_is_joined(
    isolated: Isolated, store: Store, vendor: Site, fmt: str
) -> None:
    settings = settings_for(
        isolated, vendor, tts_providers=["openai"], tts_max_chars=100, tts_voice="openai:nova"
    )
    result = tts(settings, store, text=WEATHER, format=fmt)
    assert not result.is_error, result.for_llm
    asked = [s.json() for s in vendor.seen]
    assert len(asked) == len(split_text(WEATHER, 100)) == 5
    assert f"spoken by openai in {len(asked)} requests" in result.for_llm
    for request, body in zip(vendor.seen, asked, strict=True):
        assert request.method == "POST" and request.path == "/v1/audio/speech"
        assert request.headers["authorization"] == f"Bearer {OPENAI_KEY}"
        assert body["model"] == "gpt-4o-mini-tts" and body["voice"] == "nova"
        assert body["response_format"] == fmt and len(body["input"]) <= 100
        assert body["input"].endswith((".", "!", "?"))  # cut at sentence ends
    assert " ".join(b["input"] for b in asked) == WEATHER
    artifact, data = audio_of(result, store, settings)
    expected = sum(len(b["input"]) for b in asked) * SECONDS_PER_CHAR  # the tones' sum
    assert decoded_seconds(data) == pytest.approx(expected, abs=0.3)
    assert artifact.mime == {"opus": "audio/ogg", "mp3": "audio/mpeg"}[fmt]


def test_elevenlabs_is_asked_in_its_own_shape(
    isolated: Isolated, store: Store, vendor: Site
) -> None:
    settings = settings_for(isolated, vendor, tts_providers=["elevenlabs"], tts_voice="alloy")
    result = tts(settings, store, text="A short greeting from the lab.")
    assert not result.is_error, result.for_llm
    (request,) = vendor.seen
    assert request.path == "/v1/text-to-speech/voice123"  # the plain voice is not its own
    assert request.headers["xi-api-key"] == ELEVEN_KEY
    assert request.json() == {
        "text": "A short greeting from the lab.",
        "model_id": settings.elevenlabs_model,
    }
    artifact, data = audio_of(result, store, settings)
    assert artifact.mime == "audio/ogg"
    assert decoded_seconds(data) == pytest.approx(30 * SECONDS_PER_CHAR, abs=0.2)


def test_a_failing_provider_is_skipped_for_the_next(
    isolated: Isolated, store: Store, vendor: Site
) -> None:
    settings = settings_for(
        isolated,
        vendor,
        openai_base_url=f"{vendor.url}/broken/v1",
        tts_providers=["openai", "espeak"],
    )
    result = tts(settings, store, text="The first provider is down today.")
    assert not result.is_error, result.for_llm
    assert result.metadata["provider"] == "espeak"
    assert result.metadata["skipped"] == ["openai: HTTP 500: The server had an error"]
    assert "[note: skipped before it: openai: HTTP 500: The server had an error]" in result.for_llm
    assert [s.path for s in vendor.seen] == ["/broken/v1/audio/speech"]


def test_all_failing_gives_one_error_naming_each_reason(
    isolated: Isolated, store: Store, vendor: Site
) -> None:
    settings = settings_for(
        isolated,
        vendor,
        openai_base_url=f"{vendor.url}/broken/v1",
        elevenlabs_api_key="",
        tts_providers=["openai", "elevenlabs", "edge", "espeak"],
        tts_voice="espeak:nosuchvoice",
        # Edge's host is outside the allowed domains: refused before any connection
        web_allow_domains=["example.com", "127.0.0.1"],
    )
    result = tts(settings, store, text="Nobody can say this.")
    assert result.is_error
    assert result.for_llm == (
        "tts failed: openai: HTTP 500: The server had an error; "
        "elevenlabs: not configured (CLAWQ_ELEVENLABS_API_KEY is empty); "
        "edge: speech.platform.bing.com is not on the allowed domain list; "
        "espeak: espeak-ng failed: Error: The specified espeak-ng voice does not exist."
    )
    assert store.conn.execute("SELECT count(*) AS n FROM artifacts").fetchone() == {"n": 0}


def test_edge_connections_pass_the_egress_policy(vendor: Site) -> None:
    """Edge's websocket is aiohttp's, not the egress client's: the connector it gets
    resolves names through the policy. Shown here with a name for the local server."""
    import asyncio

    import aiohttp

    from workers.egress.netguard import EgressError, EgressPolicy, parse_private_allow

    def names(host: str, port: int) -> list[str]:
        return ["127.0.0.1"] if host == "tts.test" else []

    async def status(policy: EgressPolicy) -> int:
        async with (
            aiohttp.ClientSession(connector=guarded_connector(policy, names)) as session,
            session.get(f"http://tts.test:{vendor.port}/v1/audio/speech") as response,
        ):
            return response.status

    with pytest.raises(EgressError, match=re.escape("tts.test resolves to 127.0.0.1, a loopback")):
        asyncio.run(status(EgressPolicy()))
    assert vendor.seen == []
    allowed = EgressPolicy(private_endpoints=parse_private_allow([vendor.endpoint])[1])
    assert asyncio.run(status(allowed)) == 401  # reached (and refused for want of a key)
    assert [s.headers["host"] for s in vendor.seen] == [f"tts.test:{vendor.port}"]


def test_the_daily_quota_moves_a_call_to_the_next_provider(
    isolated: Isolated, store: Store, vendor: Site, day: Callable[[str], None]
) -> None:
    client = redis.Redis.from_url(isolated.redis_url)
    settings = settings_for(
        isolated,
        vendor,
        tts_providers=["openai", "espeak"],
        tts_max_chars=100,
        media_quota_per_day={"openai": 5},
    )
    first = tts(settings, store, client, text=WEATHER)  # 5 requests: the whole quota
    assert first.metadata["provider"] == "openai"
    second = tts(settings, store, client, text=WEATHER)  # its first request is refused
    assert second.metadata["provider"] == "espeak"
    assert second.metadata["skipped"] == ["openai: today's quota of 5 requests is used up"]
    assert len(vendor.seen) == 5
    client.close()


def test_text_over_the_call_limit_is_refused_with_the_limit(
    isolated: Isolated, store: Store
) -> None:
    settings = settings_for(isolated, tts_max_total_chars=100)
    result = tts(settings, store, text="word " * 30)
    assert result.is_error and result.for_llm == (
        "the text is 149 characters; tts takes at most 100 a call: split it over several calls"
    )


def test_sentences_and_the_splitter() -> None:
    cjk = "\u4f60\u597d\u3002\u518d\u89c1\uff01"  # two sentences, each ending in a CJK stop
    assert sentences(f'He said "Stop." Then left!  Pi is 3.14, ok? {cjk} a\nb') == [
        'He said "Stop."',
        "Then left!",
        "Pi is 3.14, ok?",
        cjk[:3],
        cjk[3:],
        "a",
        "b",
    ]
    text = "One two three. Four five six seven. Eight."
    assert split_text(text, 100) == [text]
    assert split_text(text, 20) == ["One two three.", "Four five six seven.", "Eight."]
    assert split_text(text, 30) == ["One two three.", "Four five six seven. Eight."]
    # a sentence longer than the limit is cut between words, a longer word inside itself
    long = "alpha beta gamma delta epsilon zeta eta theta iota kappa."
    parts = split_text(long, 20)
    assert parts == ["alpha beta gamma", "delta epsilon zeta", "eta theta iota", "kappa."]
    assert split_text("x" * 25 + " y.", 10) == ["xxxxxxxxxx", "xxxxxxxxxx", "xxxxx y."]
    # every chunk within the limit, every word kept in order, chunks end at sentence ends
    for limit in (100, 150, 400):
        chunks = split_text(" ".join([WEATHER] * 5), limit)
        assert all(len(c) <= limit for c in chunks)
        assert " ".join(chunks).split() == WEATHER.split() * 5
        assert all(re.search(r"[.!?]$", c) for c in chunks)
    assert split_text("  \n ", 100) == []


def test_voices_per_provider() -> None:
    assert voice_for("", "openai") == ""
    assert voice_for("en-us", "espeak") == "en-us" and voice_for("en-us", "elevenlabs") == ""
    setting = "openai:nova, espeak:mb-en1,elevenlabs:abc"
    assert [voice_for(setting, p) for p in ("openai", "espeak", "elevenlabs", "edge")] == [
        "nova",
        "mb-en1",
        "abc",
        "",
    ]
