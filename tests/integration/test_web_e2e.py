"""A scripted job reads a local page through a real `web` worker: the call goes to the
`web` queue, the egress guard lets the one exempted server through, and another port on
127.0.0.1 stays blocked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Cluster, call, script, start_cluster
from tests.sites import Reply, Site

PAGE = (
    "<html><head><title>Opening Hours</title></head><body><article><h1>Opening Hours</h1>"
    + "<p>The library opens at eight and closes at six on weekdays; on Saturdays it "
    "closes at one.</p>" * 8 + "</article></body></html>"
)


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    with Site({"/hours": Reply(200, PAGE.encode(), "text/html")}) as s:
        yield s


@pytest.fixture(scope="module")
def victim() -> Iterator[Site]:
    with Site({"/": Reply(200, b"secret")}) as s:
        yield s


@pytest.fixture(scope="module")
def cluster(site: Site) -> Iterator[Cluster]:
    yield from start_cluster(groups=("web",), web_private_allow=[site.endpoint])


def test_a_job_fetches_a_page_as_markdown_through_the_web_queue(
    cluster: Cluster, site: Site, victim: Site, workspace: Path
) -> None:
    job = cluster.client.submit(
        "read the hours",
        workspace=str(workspace),
        allow=["web_fetch"],
        script=script(
            {
                "tool_calls": [
                    call("page", "web_fetch", url=f"{site.url}/hours"),
                    call("other", "web_fetch", url=f"{victim.url}/"),
                ]
            },
            {"text": "read"},
        ),
    )
    result = job.wait(timeout=60)
    page, other = result.tool_calls
    assert result.status == "completed"
    assert not page.is_error and page.queue == "web" and page.worker.startswith("worker@")
    assert "# Opening Hours" in page.output or "Opening Hours" in page.output
    assert "closes at one" in page.output
    assert page.output.startswith(f"[untrusted content from {site.url}/hours (id ")
    assert other.is_error and other.output == (
        "web_fetch refused (url_not_allowed): 127.0.0.1, a loopback address"
    )
    assert victim.seen == [] and site.paths() == ["/hours"]
