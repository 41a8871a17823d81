"""image on the real parts: artifacts in PostgreSQL, quotas in Redis, and local HTTP
servers that speak OpenAI's documented images API (POST /images/generations, answers with
`data[].b64_json` or `data[].url`, errors as `{"error": {message, type, code}}`), check
each request's shape and answer with real PNGs that Pillow drew."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from PIL import Image

from broker.config.sections import ImageEndpoint
from broker.config.settings import Settings
from broker.pg.store import Store
from broker.protocol import CallContext
from broker.stores.artifacts import ArtifactStore
from tests.conftest import Isolated
from tests.sites import Reply, Seen, Site
from workers.execute import run_tool
from workers.registry import default_registry
from workers.tool import ToolContext, ToolResult

REGISTRY = default_registry()
OPENAI_KEY, OTHER_KEY = "sk-test-openai-images", "other-endpoint-key"
COLOURS = ["red", "green", "blue", "yellow"]


def png(width: int, height: int, colour: str) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(out, "PNG")
    return out.getvalue()


PNGS = [png(64, 48, c) for c in COLOURS]


def as_json(status: int, payload: Any) -> Reply:
    return Reply(status, json.dumps(payload).encode(), "application/json")


def generations(key: str | None, mode: str, base: list[str]) -> Any:
    """POST /images/generations as OpenAI documents it; `mode` b64, url or junk (not an
    image); `key` None takes any caller."""

    def route(seen: Seen) -> Reply:
        if key is not None and seen.headers.get("authorization") != f"Bearer {key}":
            return as_json(401, {"error": {"message": "Incorrect API key", "type": "auth"}})
        asked = seen.json()
        if set(asked) != {"model", "prompt", "size", "quality", "n"}:
            return as_json(400, {"error": {"message": f"bad fields {sorted(asked)}"}})
        if "forbidden" in asked["prompt"]:
            error = {
                "message": "Your request was rejected by the safety system.",
                "type": "image_generation_user_error",
                "code": "moderation_blocked",
            }
            return as_json(400, {"error": error})
        if mode == "b64":
            data = [{"b64_json": base64.b64encode(p).decode()} for p in PNGS[: asked["n"]]]
        elif mode == "junk":
            data = [{"b64_json": base64.b64encode(b"no picture here").decode()}]
        else:
            data = [{"url": f"{base[0]}/files/{n}.png"} for n in range(asked["n"])]
        return as_json(200, {"created": 1760000000, "data": data})

    return route


def files(seen: Seen) -> Reply:
    n = int(seen.path.rsplit("/", 1)[1].split(".")[0])
    return Reply(200, PNGS[n], "image/png")


@pytest.fixture
def vendor() -> Iterator[Site]:
    base: list[str] = []
    routes: dict[str, Any] = {
        "/v1/images/generations": generations(OPENAI_KEY, "b64", base),
        "/urls/v1/images/generations": generations(OPENAI_KEY, "url", base),
        "/junk/v1/images/generations": generations(None, "junk", base),
        "/other/v1/images/generations": generations(OTHER_KEY, "b64", base),
        "/down/v1/images/generations": lambda s: as_json(
            500, {"error": {"message": "The server had an error", "type": "server_error"}}
        ),
        **{f"/files/{n}.png": files for n in range(4)},
    }
    with Site(routes) as site:
        base.append(site.url)
        yield site


@pytest.fixture
def store(isolated: Isolated) -> Iterator[Store]:
    store = Store(isolated.database_url)
    yield store
    store.close()


def settings_for(isolated: Isolated, site: Site, **extra: Any) -> Settings:
    return isolated.settings.model_copy(
        update={
            "web_private_allow": [site.endpoint],
            "openai_base_url": f"{site.url}/v1",
            "openai_api_key": OPENAI_KEY,
            **extra,
        }
    )


def image(
    settings: Settings, store: Store, client: redis.Redis | None = None, **args: Any
) -> ToolResult:
    ctx = ToolContext(
        CallContext(workspace="/tmp", user_id="ann"),
        settings,
        session_id="s-1",
        store=lambda: store,
        redis=client,
    )
    return run_tool(REGISTRY, "image", args, ctx)


def stored(result: ToolResult, store: Store, settings: Settings) -> list[tuple[Any, bytes]]:
    artifacts = ArtifactStore(store.conn, settings)
    found = [artifacts.get(a["id"]) for a in result.metadata["artifacts"]]
    return [(a, artifacts.read(a)) for a in found if a is not None]


@pytest.mark.parametrize("mode", ["b64", "url"])
def test_two_images_become_two_artifacts_with_their_size_and_hash(
    isolated: Isolated, store: Store, vendor: Site, mode: str
) -> None:
    base = f"{vendor.url}/v1" if mode == "b64" else f"{vendor.url}/urls/v1"
    settings = settings_for(isolated, vendor, openai_base_url=base)
    result = image(settings, store, prompt="a lighthouse at dusk", n=2, size="1536x1024")
    assert not result.is_error, result.for_llm
    request = vendor.seen[0]
    assert request.method == "POST" and request.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert request.json() == {
        "model": "gpt-image-1",
        "prompt": "a lighthouse at dusk",
        "size": "1536x1024",
        "quality": "auto",
        "n": 2,
    }
    kept = stored(result, store, settings)
    assert len(kept) == 2
    for (artifact, data), original in zip(kept, PNGS, strict=False):
        assert data == original and artifact.mime == "image/png"
        assert (artifact.width, artifact.height) == (64, 48)
        assert artifact.hash == hashlib.sha256(original).hexdigest()
        assert f"{artifact.describe()} sha256 {artifact.hash}" in result.for_llm
        assert "64x48" in artifact.describe() and artifact.user_id == "ann"
    assert result.for_llm.startswith("2 images by openai (gpt-image-1):")
    if mode == "url":  # fetched through the egress client, without the API key
        fetched = [s for s in vendor.seen if s.path.startswith("/files/")]
        assert [s.path for s in fetched] == ["/files/0.png", "/files/1.png"]
        assert all("authorization" not in s.headers for s in fetched)


def test_a_content_policy_refusal_is_said_and_no_other_provider_is_asked(
    isolated: Isolated, store: Store, vendor: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_OTHER_IMAGE_KEY", OTHER_KEY)
    other = ImageEndpoint(base_url=f"{vendor.url}/other/v1", api_key_env="TEST_OTHER_IMAGE_KEY")
    settings = settings_for(
        isolated, vendor, image_providers=["openai", "other"], image_endpoints={"other": other}
    )
    result = image(settings, store, prompt="something forbidden")
    assert result.is_error and result.for_llm == (
        "refused by the provider's content policy: Your request was rejected by the safety system."
    )
    assert result.metadata == {"provider": "openai"}
    assert [s.path for s in vendor.seen] == ["/v1/images/generations"]


def test_a_failing_endpoint_falls_back_to_the_next(
    isolated: Isolated, store: Store, vendor: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_OTHER_IMAGE_KEY", OTHER_KEY)
    endpoints = {
        "down": ImageEndpoint(base_url=f"{vendor.url}/down/v1"),
        "other": ImageEndpoint(
            base_url=f"{vendor.url}/other/v1", api_key_env="TEST_OTHER_IMAGE_KEY", model="flux-1"
        ),
    }
    settings = settings_for(
        isolated, vendor, image_providers=["down", "other"], image_endpoints=endpoints
    )
    result = image(settings, store, prompt="a fox", quality="low")
    assert not result.is_error, result.for_llm
    assert result.metadata["provider"] == "other" and result.metadata["model"] == "flux-1"
    assert result.metadata["skipped"] == ["down: HTTP 500: The server had an error"]
    down, other = vendor.seen
    assert "authorization" not in down.headers  # that endpoint names no key
    assert other.headers["authorization"] == f"Bearer {OTHER_KEY}"
    assert other.json()["model"] == "flux-1" and other.json()["quality"] == "low"
    assert len(stored(result, store, settings)) == 1


def test_the_daily_quota_refuses_when_used_up(
    isolated: Isolated, store: Store, vendor: Site, day: Callable[[str], None]
) -> None:
    client = redis.Redis.from_url(isolated.redis_url)
    settings = settings_for(isolated, vendor, media_quota_per_day={"openai": 2})
    assert not image(settings, store, client, prompt="one", n=2).is_error  # a request, 2 images
    assert not image(settings, store, client, prompt="two").is_error
    third = image(settings, store, client, prompt="three")
    assert third.is_error and third.for_llm == (
        "image failed: openai: today's quota of 2 requests is used up"
    )
    assert len(vendor.seen) == 2
    day("20260602")  # a new UTC day: a new quota
    assert not image(settings, store, client, prompt="four").is_error
    client.close()


def test_what_is_not_configured_or_not_an_image_is_a_reason(
    isolated: Isolated, store: Store, vendor: Site
) -> None:
    endpoints = {
        "junk": ImageEndpoint(base_url=f"{vendor.url}/junk/v1"),
        "keyless": ImageEndpoint(base_url=vendor.url, api_key_env="TEST_UNSET_IMAGE_KEY"),
    }
    settings = settings_for(
        isolated,
        vendor,
        openai_api_key="",
        image_providers=["openai", "nowhere", "keyless", "junk"],
        image_endpoints=endpoints,
    )
    result = image(settings, store, prompt="anything")
    assert result.is_error and result.for_llm == (
        "image failed: openai: not configured (CLAWQ_OPENAI_API_KEY is empty); "
        "nowhere: not configured (no such entry in CLAWQ_IMAGE_ENDPOINTS); "
        "keyless: not configured (the environment variable TEST_UNSET_IMAGE_KEY is empty); "
        "junk: an answer is not a readable image"
    )
    assert store.conn.execute("SELECT count(*) AS n FROM artifacts").fetchone() == {"n": 0}


def test_n_is_bounded_by_the_configuration(isolated: Isolated, store: Store, vendor: Site) -> None:
    settings = settings_for(isolated, vendor)
    over = image(settings, store, prompt="many", n=5)
    assert over.is_error and over.for_llm == "n is 5; at most 4 images a call"
    assert vendor.seen == []
    four = image(settings, store, prompt="many", n=4)
    assert len(stored(four, store, settings)) == 4
    bad = image(settings, store, prompt="odd", size="640x480")
    assert bad.is_error and "size" in bad.for_llm
