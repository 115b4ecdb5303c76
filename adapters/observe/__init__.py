"""Seeing a running service: Prometheus metrics, OpenTelemetry traces, JSON logs.

The engine reports what its turns do through one port,
``engine.ports.TurnObserver`` (per turn, per model or tool call, per group
commit; never per streamed chunk). This package implements it twice —
``metrics`` (``GET /metrics``) and ``tracing`` (OTLP/HTTP, only with the
``otel`` extra and an endpoint set) — and ``observers.Observers`` hands each
call to both. ``logs`` formats the service's log lines (``TURNLOG_LOG_FORMAT``).

Nothing is imported here: the CLI's commands use ``logs`` alone and should not
pay for prometheus-client and OpenTelemetry at every start.
"""
