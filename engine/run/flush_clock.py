"""Sealing the delta windows of every turn of an event loop on shared ticks.

A turn's delta window is sealed ``flush_interval`` after it opened (unless a
size bound or a durable record seals it first). With a timer per window, a
paced stream (a chunk every 0.5 s, so a window per chunk) costs one loop
timer per chunk, each firing on its own, and each sealed window reaches the
store's writer on its own. At thousands of streams that is thousands of
timer wake-ups a second on the one event-loop thread.

The clock puts each window's deadline on a grid of ``tick`` seconds,
rounded *down*, so a window is sealed at most ``flush_interval`` after it
opened (never later than with a timer of its own) and at least
``flush_interval - tick``. All windows due on one grid point are sealed by
one timer, in one loop callback, so their appends also reach the writer
together.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections.abc import Callable
from typing import Final

from engine.run.per_loop import PerLoop

#: The grid of deadlines: at most this much earlier than ``flush_interval``,
#: and at most a tenth of it (so a short interval keeps its windows apart).
MAX_TICK: Final = 0.005


class FlushClock:
    """Deadlines on a grid; one loop timer per grid point that has any."""

    __slots__ = ("_due", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weakly: the clock is its loop's value in ``_CLOCKS`` (see per_loop).
        self._loop = weakref.proxy(loop)
        # grid point (loop time) -> the callbacks due then, with their arguments
        self._due: dict[float, list[tuple[Callable[[int], None], int]]] = {}

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> FlushClock:
        """The clock of ``loop`` (one per loop, made on first use)."""
        return _CLOCKS.get(loop)

    def call_within(self, delay: float, callback: Callable[[int], None], token: int) -> None:
        """``callback(token)`` at most ``delay`` seconds from now, at least
        ``delay - min(delay / 10, MAX_TICK)``. Nothing cancels it: a caller
        that no longer wants it ignores a stale ``token``."""
        tick = min(delay / 10, MAX_TICK)
        if tick <= 0:
            self._loop.call_soon(callback, token)
            return
        at = math.floor((self._loop.time() + delay) / tick) * tick
        due = self._due.get(at)
        if due is None:
            due = self._due[at] = []
            self._loop.call_at(at, self._fire, at)
        due.append((callback, token))

    def _fire(self, at: float) -> None:
        for callback, token in self._due.pop(at, ()):
            try:
                callback(token)
            except Exception as exc:  # as the loop does for a timer's callback: the others still run
                self._loop.call_exception_handler(
                    {"message": "a flush clock callback failed", "exception": exc, "callback": callback}
                )


_CLOCKS: PerLoop[FlushClock] = PerLoop(FlushClock)
