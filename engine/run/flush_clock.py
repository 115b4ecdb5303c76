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

**Under load the windows stretch.** A loop that runs its timers late is
saturated, and every window it seals costs it the same again (an event, a
store append, a commit's callback, a durable message to each follower): with
thousands of paced streams a window per chunk is about an eighth of the
loop's time per chunk. A caller may allow its window a longer bound (``stretch_to``); the
clock then adds ``STRETCH`` times its recent lateness beyond ``SLACK`` to the
interval, up to that bound. Shown chunks are not delayed (they are published
before their window is sealed), only their durability; an idle loop keeps
the interval as it is.
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
#: Lateness of the clock's own timers below this is the loop's normal jitter.
SLACK: Final = 0.005
#: Seconds of window per second of lateness beyond ``SLACK``: 20 ms late gives
#: 0.8 s windows with a 0.2 s interval (two chunks of a 2 chunks/s stream
#: share one); from ~25 ms late, the bound (1 s). A saturated loop's timers run
#: ~10-30 ms late, and a smaller factor leaves most windows one chunk long.
STRETCH: Final = 40.0
#: How much each fired grid point moves the lateness the clock keeps
#: (an exponentially weighted mean over its last ~10 timers).
WEIGHT: Final = 0.1
#: A lateness older than this says nothing of the loop now (an idle spell).
STALE_AFTER: Final = 1.0


class FlushClock:
    """Deadlines on a grid; one loop timer per grid point that has any."""

    __slots__ = ("_due", "_lag", "_lag_at", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weakly: the clock is its loop's value in ``_CLOCKS`` (see per_loop).
        self._loop = weakref.proxy(loop)
        # grid point (loop time) -> the callbacks due then, with their arguments
        self._due: dict[float, list[tuple[Callable[[int], None], int]]] = {}
        # How late the last grid points fired (weighted mean), and when.
        self._lag = 0.0
        self._lag_at = 0.0

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> FlushClock:
        """The clock of ``loop`` (one per loop, made on first use)."""
        return _CLOCKS.get(loop)

    def call_within(self, delay: float, callback: Callable[[int], None], token: int, stretch_to: float = 0.0) -> None:
        """``callback(token)`` at most ``delay`` seconds from now, at least
        ``delay - min(delay / 10, MAX_TICK)``. Nothing cancels it: a caller
        that no longer wants it ignores a stale ``token``.

        With ``stretch_to`` above ``delay``, a late loop gets a longer delay
        (:meth:`stretched`), never more than ``stretch_to``."""
        tick = min(delay / 10, MAX_TICK)
        if tick <= 0:
            self._loop.call_soon(callback, token)
            return
        now = self._loop.time()
        if stretch_to > delay and self._lag > SLACK:
            delay = self.stretched(delay, stretch_to, now)
        at = math.floor((now + delay) / tick) * tick
        due = self._due.get(at)
        if due is None:
            due = self._due[at] = []
            self._loop.call_at(at, self._fire, at)
        due.append((callback, token))

    def stretched(self, delay: float, stretch_to: float, now: float) -> float:
        """The delay a window opened ``now`` gets: ``delay`` plus ``STRETCH``
        times the lateness beyond ``SLACK``, at most ``stretch_to`` (``delay``
        if that is not above it)."""
        if stretch_to <= delay or now - self._lag_at > STALE_AFTER:
            return delay
        return min(stretch_to, delay + STRETCH * max(0.0, self._lag - SLACK))

    def _fire(self, at: float) -> None:
        now = self._loop.time()
        # After an idle spell the mean starts again from this timer alone.
        lag = self._lag if now - self._lag_at <= STALE_AFTER else 0.0
        self._lag = lag + (max(0.0, now - at) - lag) * WEIGHT
        self._lag_at = now
        for callback, token in self._due.pop(at, ()):
            try:
                callback(token)
            except Exception as exc:  # as the loop does for a timer's callback: the others still run
                self._loop.call_exception_handler({"message": "a flush clock callback failed", "exception": exc, "callback": callback})


_CLOCKS: PerLoop[FlushClock] = PerLoop(FlushClock)
