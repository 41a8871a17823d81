"""One job of 200 concurrent `web_fetch` calls of a page that answers after 200 ms, through
one web worker of 100 threads: every call is answered. Each thread may hold two Redis
connections at once (a read's claim read after the fetch, and the fetch's own use), so a
pool sized for fewer lost calls to "Too many connections", and the job waited 300 s."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Cluster, call, script, start_cluster
from tests.sites import Reply, Site

CALLS = 200
PAGE = b"<html><body><article><p>" + b"slow words " * 60 + b"</p></article></body></html>"


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    with Site({"/slow": Reply(200, PAGE, "text/html", delay_s=0.2)}) as s:
        s.httpd.request_queue_size = 512
        yield s


@pytest.fixture(scope="module")
def cluster(site: Site) -> Iterator[Cluster]:
    yield from start_cluster(
        groups=("web",),
        concurrency=0,  # the web worker's own default: 100 threads
        web_private_allow=[site.endpoint],
        max_parallel_calls=CALLS,
        rate_limit_per_hour=0,
        web_cache_ttl_s=0,
    )


@pytest.mark.timeout(240)
def test_two_hundred_fetches_at_once_through_one_web_worker_are_all_answered(
    cluster: Cluster, site: Site, workspace: Path
) -> None:
    calls = [call(f"f{i}", "web_fetch", url=f"{site.url}/slow?n={i}") for i in range(CALLS)]
    job = cluster.client.submit(
        "read them all",
        workspace=str(workspace),
        allow=["web_fetch"],
        script=script({"tool_calls": calls}, {"text": "read"}),
    )
    result = job.wait(timeout=120)
    assert result.status == "completed"
    failed = [c.output[:120] for c in result.tool_calls if c.is_error]
    assert failed == [] and len(result.tool_calls) == CALLS
    assert all("slow words" in c.output for c in result.tool_calls)
