"""The instruments of one app as one ``engine.ports.TurnObserver``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from typing import Any

from adapters.observe.metrics import Metrics
from adapters.observe.tracing import Tracing, open_tracing
from engine.ports import TurnObserver, observe

__all__ = ["Metrics", "Observers", "Tracing", "open_observers"]


def _fan_out(name: str) -> Callable[..., None]:
    """``Observers.<name>``: the call handed to every instrument, each through
    ``observe`` (one failing never keeps it from the others)."""

    def call(self: Observers, *args: Any, **kwargs: Any) -> None:
        for instrument in self._all:
            observe(getattr(instrument, name), *args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


class Observers:
    """Every instrument of one app, as one ``TurnObserver``: each call goes to
    each (one failing never keeps the call from the others)."""

    def __init__(self, metrics: Metrics, tracing: Tracing | None = None) -> None:
        self.metrics = metrics
        self.tracing = tracing
        self._all: tuple[TurnObserver, ...] = (metrics,) if tracing is None else (metrics, tracing)

    # Each call of the port goes to each instrument, whatever its arguments.
    turn_started = _fan_out("turn_started")
    turn_ended = _fan_out("turn_ended")
    first_token = _fan_out("first_token")
    model_call_started = _fan_out("model_call_started")
    model_call_ended = _fan_out("model_call_ended")
    tool_call_started = _fan_out("tool_call_started")
    tool_call_ended = _fan_out("tool_call_ended")
    upstream_error = _fan_out("upstream_error")

    def events_committed(self, count: int, seconds: float) -> None:
        # Metrics only: the store's writer calls this once per group commit.
        observe(self.metrics.events_committed, count, seconds)

    def store_waited(self, turn_id: str, seconds: float) -> None:
        # Metrics only: how long turns were held back, not a step of the turn.
        observe(self.metrics.store_waited, turn_id, seconds)

    async def close(self) -> None:
        """Unhook the metrics from the process; flush the traces still queued
        (the exporter blocks: in a thread)."""
        self.metrics.close()
        if self.tracing is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.tracing.close)


def open_observers(env: Mapping[str, str] = os.environ) -> Observers:
    """Metrics always; traces when the ``OTEL_*`` variables ask for them."""
    return Observers(Metrics(), open_tracing(env))
