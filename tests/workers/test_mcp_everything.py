"""The bridge against the reference server, `@modelcontextprotocol/server-everything` (npm,
installed by `make test`'s prerequisites into tests/mcp_servers/everything), over stdio and
over streamable HTTP: its tools, structured content, resource links, images, a long-running
operation with progress under idle and total limits, resources, resource templates,
prompts, roots, and the negotiated protocol version."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.workers.mcp_harness import Harness, Kept, endpoint, free_port, wait_for_port
from workers.tools.mcp.client import McpError
from workers.tools.mcp.results import to_result

PACKAGE = Path(__file__).resolve().parents[1] / "mcp_servers" / "everything"
EVERYTHING = PACKAGE / "node_modules" / ".bin" / "mcp-server-everything"


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    assert EVERYTHING.exists(), "server-everything is missing: run bash tests/system-packages.sh"
    port = free_port()
    proc = subprocess.Popen(
        [str(EVERYTHING), "streamableHttp"],
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for_port(proc, port)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(10)


@pytest.fixture(params=["stdio", "streamable-http"])
def everything(request: pytest.FixtureRequest, harness: Any) -> Any:
    """A harness on server-everything over one transport, as server `ev`."""

    def make(**limits: Any) -> Harness:
        assert EVERYTHING.exists(), "server-everything is missing: run tests/system-packages.sh"
        if request.param == "stdio":
            entry: dict[str, Any] = {"command": str(EVERYTHING), "args": ["stdio"]}
            allow: list[str] = []
        else:
            url = request.getfixturevalue("http_url")
            entry, allow = {"url": url}, [endpoint(url)]
        h: Harness = harness({"ev": {**entry, **limits}}, web_private_allow=allow)
        return h

    return make


def test_tools_structured_content_links_and_images(everything: Any) -> None:
    h = everything()
    assert to_result("ev", h.call("ev", "echo", message="hi"), 10_000).for_user == "Echo: hi"
    assert "5" in to_result("ev", h.call("ev", "get-sum", a=2, b=3), 10_000).for_user

    weather = to_result("ev", h.call("ev", "get-structured-content", location="Chicago"), 10_000)
    assert weather.for_user.startswith('{"temperature": ')  # the structure, as JSON
    assert weather.for_user.count("humidity") == 1  # the text that only repeats it is gone

    links = to_result("ev", h.call("ev", "get-resource-links", count=2), 10_000).for_user
    assert "[link Text Resource 2 <demo://resource/dynamic/text/2> (text/plain)" in links

    kept = Kept()
    image = to_result("ev", h.call("ev", "get-tiny-image"), 10_000, kept)
    ((data, mime, _),) = kept.items
    assert data.startswith(b"\x89PNG") and mime == "image/png"
    assert f"[image: artifact art_1 (image/png, {len(data)} bytes)]" in image.for_llm

    facts = h.facts["ev"]
    assert facts["protocol_version"] == "2025-11-25"  # the newest it speaks of what we offer
    assert {"prompts", "resources", "tools"} <= set(facts["capabilities"])
    prompts = {p["name"]: p for p in facts["prompts"]}
    assert "text" not in prompts["args-prompt"]  # it needs a city: not rendered
    assert prompts["simple-prompt"]["text"] == "This is a simple prompt without arguments."
    assert "demo://resource/dynamic/text/{resourceId}" in [
        t["uri_template"] for t in facts["resource_templates"]
    ]


def test_progress_resets_the_idle_limit_within_the_total(everything: Any) -> None:
    h = everything(idle_timeout_s=1.5, total_timeout_s=6)
    heard: list[tuple[float, float | None, str | None]] = []
    started = time.monotonic()
    done = h.manager.call(
        "ev",
        "trigger-long-running-operation",
        {"duration": 4, "steps": 8},
        progress=heard.extend,
    )
    assert time.monotonic() - started > 3.5  # longer than the idle limit, twice over
    assert "Long running operation completed" in done["content"][0]["text"]
    assert [p for p, _, _ in heard] == [1, 2, 3, 4, 5, 6, 7, 8] and heard[0][1] == 8

    with pytest.raises(McpError, match=r"no result and no progress for 1.5s; it was cancelled"):
        h.call("ev", "trigger-long-running-operation", duration=3, steps=1)  # silent for 3 s
    h2 = everything(idle_timeout_s=1.5, total_timeout_s=2.5)
    with pytest.raises(McpError, match=r"ran past its total limit of 2.5s and was cancelled"):
        h2.call("ev", "trigger-long-running-operation", duration=5, steps=10)
    assert not h.call("ev", "echo", message="after")["isError"]  # the session lives on


def test_resources_templates_and_prompts(everything: Any) -> None:
    h = everything()
    assert {"resources/list", "resources/read", "prompts/list", "prompts/get"} <= set(
        h.listing("ev")
    )
    listed = to_result("ev", h.call("ev", "resources/list"), 100_000).for_user
    assert "demo://resource/static/document/features.md" in listed
    assert "resource templates" in listed and "demo://resource/dynamic/blob/{resourceId}" in listed

    text = to_result(
        "ev", h.call("ev", "resources/read", uri="demo://resource/dynamic/text/3"), 1000
    )
    assert (
        "[resource demo://resource/dynamic/text/3]\nResource 3: This is a plaintext"
        in text.for_user
    )
    kept = Kept()
    blob = h.call("ev", "resources/read", uri="demo://resource/dynamic/blob/3")
    shown = to_result("ev", blob, 1000, kept).for_user
    assert "[resource demo://resource/dynamic/blob/3: artifact art_1 (" in shown and kept.items

    prompts = to_result("ev", h.call("ev", "prompts/list"), 10_000).for_user
    assert "- args-prompt(city, state?): A prompt with two arguments" in prompts
    got = h.call("ev", "prompts/get", name="args-prompt", arguments={"city": "Paris"})
    assert "[user]\nWhat's weather in Paris?" in to_result("ev", got, 10_000).for_user
    with pytest.raises(McpError, match="refused prompts/get"):
        h.call("ev", "prompts/get", name="no-such-prompt")


def test_the_workspace_of_the_call_is_offered_as_the_root(everything: Any, tmp_path: Path) -> None:
    h = everything()
    for workspace in (tmp_path / "a", tmp_path / "b"):
        deadline = time.monotonic() + 10
        while True:  # the server asks for roots when told they changed, on its own time
            text = h.manager.call("ev", "get-roots-list", {}, workspace=str(workspace))
            shown = text["content"][0]["text"]
            if f"URI: {workspace.as_uri()}\n" in shown:
                break
            assert time.monotonic() < deadline, shown
            time.sleep(0.2)
        assert "(1 total)" in shown  # never another job's workspace


def test_a_read_resource_is_kept_until_the_server_says_it_changed(everything: Any) -> None:
    h = everything()
    uri = "demo://resource/dynamic/text/7"  # its text says when it was made, to the second

    def read() -> str:
        return str(h.call("ev", "resources/read", uri=uri)["content"][0]["resource"]["text"])

    first = read()
    time.sleep(1.2)
    assert read() == first  # kept: the server was not asked again
    cache = h.manager.connections["ev"].resources
    assert cache.hits == 1 and uri in cache.subscribed
    h.call("ev", "toggle-subscriber-updates")  # it says our subscribed URIs changed
    deadline = time.monotonic() + 10
    while read() == first:  # the update dropped it: read anew
        assert time.monotonic() < deadline, "the update never reached the cache"
        time.sleep(0.3)
