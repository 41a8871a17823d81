"""OpenTelemetry through a real stack: with CLAWQ_OTLP_ENDPOINT set, the orchestrator and
the worker export spans by OTLP/HTTP to a local collector (a server that decodes the
protobuf requests with opentelemetry-proto), and one job is one trace: job → turn → call
→ the worker's execution, the last in another process, linked by the envelope's context."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Cluster, script, start_cluster, wait_until
from tests.sites import Reply, Seen, Site


class Collector:
    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.services: dict[bytes, str] = {}  # span id → the service that sent it
        self.lock = threading.Lock()

    def __call__(self, seen: Seen) -> Reply:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(seen.body)
        with self.lock:
            for resource_spans in request.resource_spans:
                service = next(
                    (
                        a.value.string_value
                        for a in resource_spans.resource.attributes
                        if a.key == "service.name"
                    ),
                    "",
                )
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        self.spans.append(span)
                        self.services[span.span_id] = service
        return Reply(200, b"", "application/x-protobuf")


@pytest.fixture(scope="module")
def collector() -> Iterator[tuple[Collector, Site]]:
    got = Collector()
    with Site({"/v1/traces": got}) as site:
        yield got, site


@pytest.fixture(scope="module")
def cluster(collector: tuple[Collector, Site]) -> Iterator[Cluster]:
    _, site = collector
    saved = os.environ.get("OTEL_BSP_SCHEDULE_DELAY")
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "200"  # export every 0.2 s, not every 5 s
    try:
        yield from start_cluster(groups=("fs",), otlp_endpoint=site.url + "/v1/traces")
    finally:
        if saved is None:
            os.environ.pop("OTEL_BSP_SCHEDULE_DELAY", None)
        else:
            os.environ["OTEL_BSP_SCHEDULE_DELAY"] = saved


def test_one_job_is_one_trace_across_processes(
    cluster: Cluster, collector: tuple[Collector, Site], workspace: Path
) -> None:
    got, _ = collector
    (workspace / "a.txt").write_text("alpha\n")
    job = cluster.client.submit(
        "read it",
        workspace=str(workspace),
        script=script(
            {"tool_calls": [{"id": "r", "name": "read_file", "input": {"path": "a.txt"}}]},
            {"text": "done"},
        ),
    )
    assert job.wait(timeout=60).status == "completed"

    def of_job() -> list[Any]:
        with got.lock:
            roots = [
                s
                for s in got.spans
                if s.name == "job" and any(a.value.string_value == job.id for a in s.attributes)
            ]
            if not roots:
                return []
            return [s for s in got.spans if s.trace_id == roots[0].trace_id]

    wait_until(
        lambda: (
            {s.name for s in of_job()} >= {"job", "turn", "call read_file", "execute read_file"}
        ),
        30,
        "the job's spans exported",
    )
    spans = {s.name: s for s in of_job()}
    job_span, call, execute = spans["job"], spans["call read_file"], spans["execute read_file"]
    turns = [s for s in of_job() if s.name == "turn"]
    assert len(turns) == 2 and all(t.parent_span_id == job_span.span_id for t in turns)
    assert call.parent_span_id in {t.span_id for t in turns}
    assert execute.parent_span_id == call.span_id  # across the queue, in the worker
    assert got.services[execute.span_id] == "clawq-worker-fs"
    assert got.services[call.span_id] == "clawq-orchestrator"
