"""The instruments of one app as one ``engine.ports.TurnObserver``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

from adapters.observe.metrics import Metrics
from adapters.observe.tracing import Tracing, open_tracing
from engine.ports import ResolvedModel, TurnObserver, observe

__all__ = ["Metrics", "Observers", "Tracing", "open_observers"]


class Observers:
    """Every instrument of one app, as one ``TurnObserver``: each call goes to
    each (one failing never keeps the call from the others)."""

    def __init__(self, metrics: Metrics, tracing: Tracing | None = None) -> None:
        self.metrics = metrics
        self.tracing = tracing
        self._all: tuple[TurnObserver, ...] = (metrics,) if tracing is None else (metrics, tracing)

    def turn_started(self, turn_id: str, *, model: str, chat_id: str | None, started_at: float | None, resumed: bool) -> None:
        for o in self._all:
            observe(o.turn_started, turn_id, model=model, chat_id=chat_id, started_at=started_at, resumed=resumed)

    def turn_ended(self, turn_id: str, status: str) -> None:
        for o in self._all:
            observe(o.turn_ended, turn_id, status)

    def first_token(self, turn_id: str, seconds: float) -> None:
        for o in self._all:
            observe(o.first_token, turn_id, seconds)

    def model_call_started(self, turn_id: str, *, model: str, resolved: ResolvedModel, iteration: int) -> None:
        for o in self._all:
            observe(o.model_call_started, turn_id, model=model, resolved=resolved, iteration=iteration)

    def model_call_ended(
        self,
        turn_id: str,
        *,
        finish_reason: str | None = None,
        usage: dict[str, Any] | None = None,
        response_id: str | None = None,
        error: str | None = None,
    ) -> None:
        for o in self._all:
            observe(o.model_call_ended, turn_id, finish_reason=finish_reason, usage=usage, response_id=response_id, error=error)

    def tool_call_started(self, turn_id: str, *, call_id: str, name: str) -> None:
        for o in self._all:
            observe(o.tool_call_started, turn_id, call_id=call_id, name=name)

    def tool_call_ended(self, turn_id: str, *, call_id: str, name: str, status: str, error: str | None = None) -> None:
        for o in self._all:
            observe(o.tool_call_ended, turn_id, call_id=call_id, name=name, status=status, error=error)

    def upstream_error(self, turn_id: str, kind: str) -> None:
        for o in self._all:
            observe(o.upstream_error, turn_id, kind)

    def events_committed(self, count: int, seconds: float) -> None:
        # Metrics only: the store's writer calls this once per group commit.
        observe(self.metrics.events_committed, count, seconds)

    async def close(self) -> None:
        """Flush the traces still queued (the exporter blocks: in a thread)."""
        if self.tracing is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.tracing.close)


def open_observers(env: Mapping[str, str] = os.environ) -> Observers:
    """Metrics always; traces when the ``OTEL_*`` variables ask for them."""
    return Observers(Metrics(), open_tracing(env))
