"""Observability: Prometheus metrics and OpenTelemetry tracing."""
