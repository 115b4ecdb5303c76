"""Prometheus metrics (``GET /metrics``), fed by the engine's ``TurnObserver`` calls.

Each app has its own ``CollectorRegistry``: several apps in one process (the
tests) never share or collide on a metric. One ``turnlog serve`` is one
process (no worker processes, no fork), so its registry sees everything the
instance does and prometheus-client's multiprocess mode is not needed:
scrape every instance, as with any other service.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from engine.ports import ResolvedModel

# A turn's first token: from its start (request received) to the first streamed chunk.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# One group commit of the event store (many turns' events in one transaction).
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# One collection of Python's cyclic garbage collector: it stops the event loop,
# so every stream of the process waits that long.
GC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

FINISHED = ("completed", "failed", "cancelled")
TOOL_STATUSES = ("completed", "failed")


class Metrics:
    """The metrics of one app (``engine.ports.TurnObserver``)."""

    def __init__(self, registry: CollectorRegistry | None = None, *, process: bool = True) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        if process:  # RSS, CPU, open files; the interpreter and its GC
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)
        self.turns_started = Counter("turnlog_turns_started_total", "Turns started (new turns and forks; not resumes).", registry=r)
        self.turns_resumed = Counter("turnlog_turns_resumed_total", "Turns this process resumed after an interruption.", registry=r)
        self.turns_finished = Counter("turnlog_turns_finished_total", "Turns that ended, by their terminal status.", ["status"], registry=r)
        self.turns_running = Gauge("turnlog_turns_running", "Turns this process is running now.", registry=r)
        self.ttft = Histogram(
            "turnlog_time_to_first_token_seconds",
            "From a turn's start to its first streamed chunk.",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.model_calls = Counter("turnlog_model_calls_total", "Upstream model calls, by outcome.", ["outcome"], registry=r)
        self.tool_calls = Counter("turnlog_tool_calls_total", "Tool calls with a recorded result, by status.", ["status"], registry=r)
        self.events_appended = Counter("turnlog_events_appended_total", "Events made durable in the log.", registry=r)
        self.commit_seconds = Histogram("turnlog_store_commit_seconds", "One group commit of the event store.", buckets=COMMIT_BUCKETS, registry=r)
        self.store_wait = Histogram(
            "turnlog_store_wait_seconds",
            "A turn held back (it stops reading the upstream) until the oldest of its delta windows is durable: the store is behind.",
            buckets=COMMIT_BUCKETS,
            registry=r,
        )
        self.upstream_errors = Counter("turnlog_upstream_errors_total", "Model calls that failed at the upstream, by kind.", ["kind"], registry=r)
        self.gc_pause = Histogram(
            "turnlog_gc_pause_seconds",
            "One collection of the cyclic garbage collector (the event loop waits), by generation.",
            ["generation"],
            buckets=GC_BUCKETS,
            registry=r,
        )
        for generation in ("0", "1", "2"):
            self.gc_pause.labels(generation)
        # Timed from gc.callbacks, process-wide: only the app that owns the
        # process's figures (``process``) hooks in, and ``close`` unhooks it.
        self._gc_began = 0.0
        self._gc_hooked = process
        if process:
            gc.callbacks.append(self._on_gc)
        # Present at 0 from the start, so that rates and alerts have a series.
        for status in FINISHED:
            self.turns_finished.labels(status)
        for status in TOOL_STATUSES:
            self.tool_calls.labels(status)
        for outcome in ("completed", "failed"):
            self.model_calls.labels(outcome)
        self.upstream_errors.labels("upstream_error")

    def watch_delta_windows(self, window: Callable[[], float]) -> None:
        """``turnlog_delta_window_seconds``: read at each scrape, nothing per chunk."""
        Gauge(
            "turnlog_delta_window_seconds",
            "How long a delta window opened now may stay open: the flush interval, stretched up to its bound while the event loop runs late.",
            registry=self.registry,
        ).set_function(window)

    # -- engine.ports.TurnObserver ----------------------------------------------------

    def turn_started(self, turn_id: str, *, model: str, chat_id: str | None, started_at: float | None, resumed: bool) -> None:
        (self.turns_resumed if resumed else self.turns_started).inc()
        self.turns_running.inc()

    def turn_ended(self, turn_id: str, status: str) -> None:
        self.turns_running.dec()
        if status != "running":  # stopped here without ending: another process resumes it
            self.turns_finished.labels(status).inc()

    def first_token(self, turn_id: str, seconds: float) -> None:
        self.ttft.observe(seconds)

    def model_call_started(self, turn_id: str, *, model: str, resolved: ResolvedModel, iteration: int) -> None:
        pass

    def model_call_ended(
        self,
        turn_id: str,
        *,
        finish_reason: str | None = None,
        usage: dict[str, Any] | None = None,
        response_id: str | None = None,
        error: str | None = None,
    ) -> None:
        self.model_calls.labels("failed" if error else "completed").inc()

    def tool_call_started(self, turn_id: str, *, call_id: str, name: str) -> None:
        pass

    def tool_call_ended(self, turn_id: str, *, call_id: str, name: str, status: str, error: str | None = None) -> None:
        self.tool_calls.labels(status).inc()

    def upstream_error(self, turn_id: str, kind: str) -> None:
        self.upstream_errors.labels(kind).inc()

    def events_committed(self, count: int, seconds: float) -> None:
        if count:
            self.events_appended.inc(count)
        self.commit_seconds.observe(seconds)

    def store_waited(self, turn_id: str, seconds: float) -> None:
        self.store_wait.observe(seconds)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_began = time.perf_counter()
        elif self._gc_began:
            self.gc_pause.labels(str(info.get("generation", 2))).observe(time.perf_counter() - self._gc_began)
            self._gc_began = 0.0

    def close(self) -> None:
        """Stop timing collections (an app that stops leaves no hook behind)."""
        if self._gc_hooked:
            self._gc_hooked = False
            try:
                gc.callbacks.remove(self._on_gc)
            except ValueError:
                pass

    # -- GET /metrics -------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.Response:
        """The Prometheus text format (behind the API's auth middleware, like every route)."""
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
