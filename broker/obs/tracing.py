"""OpenTelemetry tracing: job → turn → call → worker execution, one trace per job.

Off by default, and free when off (the API's no-op tracer). With `CLAWQ_OTLP_ENDPOINT` set,
each process exports its spans by OTLP over HTTP in batches, as service `clawq-<kind>`.
A call's trace context travels in its envelope (`trace`, W3C traceparent), so the worker's
span is a child of the orchestrator's call span wherever the worker runs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from opentelemetry import context, propagate, trace

_tracer: trace.Tracer = trace.get_tracer("clawq")
_provider: Any = None


def setup(endpoint: str, service: str) -> None:
    """Export this process's spans to `endpoint` (an OTLP/HTTP traces URL); '' leaves
    tracing off. Idempotent."""
    global _tracer, _provider
    if not endpoint or _provider is not None:
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    _provider = TracerProvider(resource=Resource.create({"service.name": f"clawq-{service}"}))
    _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    _tracer = _provider.get_tracer("clawq")


def enabled() -> bool:
    return _provider is not None


@contextlib.contextmanager
def span(
    name: str, attributes: dict[str, Any] | None = None, parent: dict[str, str] | None = None
) -> Iterator[Any]:
    """A span under the current one, or under the context carried in `parent`."""
    if _provider is None:
        yield None
        return
    ctx = propagate.extract(parent) if parent else None
    with _tracer.start_as_current_span(name, context=ctx, attributes=attributes) as current:
        yield current


def carrier() -> dict[str, str]:
    """The current trace context, to put in an envelope ({} when tracing is off)."""
    if _provider is None:
        return {}
    out: dict[str, str] = {}
    propagate.inject(out, context=context.get_current())
    return out


def flush() -> None:
    if _provider is not None:
        _provider.force_flush()
