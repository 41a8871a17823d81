"""Prometheus metrics (prometheus-client), one definition per measure, for every process.

Orchestrators are one asyncio process each: their registry is the default one, served on
`CLAWQ_METRICS_PORT`. A worker has several executing processes: each writes its samples
to files in `CLAWQ_METRICS_DIR` (prometheus-client's multiprocess mode, chosen by
`PROMETHEUS_MULTIPROC_DIR`, which `prepare_worker` sets before the library is imported),
and the worker's parent process serves the sum of every file of the host on
`CLAWQ_WORKER_METRICS_PORT`: a second worker on the same host finds the port taken, which is
fine, because the first one already serves its files too. Queue depths are read from Redis
at scrape time by the orchestrators' endpoint."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Iterator
from typing import Any

log = logging.getLogger("clawq.metrics")

SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


def prepare_worker(metrics_dir: str) -> None:
    """Multiprocess mode for this worker and the processes it forks; call before anything
    imports prometheus_client."""
    folder = os.path.join(metrics_dir, "workers")
    os.makedirs(folder, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder


class _Metrics:
    """Created on first use, so that importing this module decides nothing."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        # orchestrators
        self.jobs = Counter("clawq_jobs", "Jobs finished, by final status", ["status"])
        self.jobs_running = Gauge(
            "clawq_jobs_running", "Jobs running now", multiprocess_mode="livesum"
        )
        self.turns = Counter("clawq_turns", "Model turns taken")
        self.turn_seconds = Histogram(
            "clawq_turn_seconds", "A turn: model step and its calls", buckets=SECONDS
        )
        self.model_seconds = Histogram(
            "clawq_model_seconds", "One model request", ["provider"], buckets=SECONDS
        )
        self.model_tokens = Counter(
            "clawq_model_tokens", "Tokens the providers reported", ["provider", "kind"]
        )
        self.approvals_pending = Gauge(
            "clawq_approvals_pending", "Calls waiting for a person", multiprocess_mode="livesum"
        )
        self.rate_limited = Counter("clawq_rate_limit_refusals", "Calls refused by a rate limit")
        # workers
        self.calls = Counter("clawq_calls", "Tool calls executed", ["tool", "outcome"])
        self.call_seconds = Histogram(
            "clawq_call_seconds", "A tool call's execution", ["tool"], buckets=SECONDS
        )
        self.queue_wait = Histogram(
            "clawq_queue_wait_seconds", "From sent to started", ["queue"], buckets=SECONDS
        )
        self.redeliveries = Counter(
            "clawq_redeliveries", "Calls started again after their process died", ["queue"]
        )


_metrics: _Metrics | None = None
_lock = threading.Lock()


def metrics() -> _Metrics:
    """This process's metrics, made once (threads of a worker may ask at the same time)."""
    global _metrics
    if _metrics is None:
        with _lock:
            if _metrics is None:
                _metrics = _Metrics()
    return _metrics


class RedisCollector:
    """Gauges read from Redis at each scrape: the depth of each queue, the subagent slots
    in use. One pipeline per scrape."""

    def __init__(self, redis_url: str, queues: Iterable[str]) -> None:
        import redis

        self.client = redis.Redis.from_url(redis_url, socket_timeout=2)
        self.queues = sorted(set(queues))

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from broker import keys

        depth = GaugeMetricFamily(
            "clawq_queue_depth", "Messages waiting in a queue", labels=["queue"]
        )
        slots = GaugeMetricFamily("clawq_subagent_slots_in_use", "Subagents holding a slot")
        try:
            pipe = self.client.pipeline(transaction=False)
            for queue in self.queues:
                pipe.llen(queue)
            pipe.zcard(keys.SUBAGENTS_RUNNING)
            *lengths, running = pipe.execute()
        except Exception as exc:  # a scrape must not fail because Redis is away
            log.warning("queue depths not read: %s", exc)
            return
        for queue, n in zip(self.queues, lengths, strict=True):
            depth.add_metric([queue], float(n))
        slots.add_metric([], float(running))
        yield depth
        yield slots


def serve(port: int, redis_url: str = "", queues: Iterable[str] = ()) -> bool:
    """Serve /metrics on `port` from a thread (False: the port is taken). In multiprocess
    mode the samples of every process of the host are summed."""
    if port <= 0:
        return False
    from prometheus_client import CollectorRegistry, start_http_server

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    if redis_url:
        registry.register(RedisCollector(redis_url, queues))
    try:
        start_http_server(port, registry=registry)
    except OSError as exc:
        log.info("metrics port %d not served here (%s): another process serves it", port, exc)
        return False
    log.info("metrics on :%d/metrics", port)
    return True


def process_died(pid: int) -> None:
    """A forked process ended: its live gauges stop counting (multiprocess mode)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
