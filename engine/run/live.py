"""In-process live fan-out: what a running turn tells its subscribers.

The bus carries ``LiveChunks``, the chunks of one upstream read that fall in
one delta window (sent at once, before they are durable), and a ``LiveEvent``
per committed event (sent in seq order after its commit). Subscribers are a convenience, never the truth: a
subscriber that falls behind is marked ``lagged`` and catches up from the log.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from engine.events import Event
from engine.ports import WAKE, LiveChunks, LiveEvent, LiveMessage
from engine.ports import Subscription as SubscriptionPort


@dataclass(frozen=True)
class Joined:
    """What a new follower of a turn takes at once: its live subscription, the
    chunks of the actor's open window and, while the actor still holds them, the
    committed events so far (None: read the log)."""

    subscription: SubscriptionPort
    window: list[LiveChunks]
    history: list[Event] | None


class Subscription:
    """A bounded mailbox for one subscriber of one turn."""

    def __init__(self, bus: InProcessBus, turn_id: str, limit: int, *, runs_tools: bool = False) -> None:
        self._bus = bus
        # A WebSocket client that can run direct tools (``execute:tool``).
        self.runs_tools = runs_tools
        self.turn_id = turn_id
        self._items: deque[LiveMessage] = deque()
        self._waiter: asyncio.Future[object] | None = None
        self._limit = limit
        # Chunks queued beyond one per message (a read's ``LiveChunks`` holds
        # many): the limit bounds chunks, not messages.
        self._extra = 0
        # Kept, not looked up per wait: get_running_loop() costs a getpid()
        # system call on CPython 3.11, once per streamed chunk here.
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self.lagged = False
        self.closed = False
        self.received = 0
        # Optional synchronous consumer, tried while the reader is parked in
        # ``get`` with nothing queued: returning True means it delivered the
        # message itself, so the reader is not woken for it (one event-loop
        # hop and one task switch less per streamed chunk).
        self.sink: Callable[[LiveMessage], bool] | None = None
        self._sunk = False

    def put(self, message: LiveMessage) -> None:
        if self.lagged:
            return
        self.received += 1
        sink = self.sink
        if sink is not None and not self._items:
            waiter = self._waiter
            if waiter is not None and not waiter.done() and sink(message):
                self._sunk = True
                return
        extra = len(message) - 1 if type(message) is LiveChunks else 0
        if len(self._items) + self._extra + extra >= self._limit:
            # A slow reader: stop buffering; it must re-read from the log.
            self.lagged = True
            self._items.clear()
            self._extra = 0
        else:
            self._items.append(message)
            self._extra += extra
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self, timeout: float | None = None) -> LiveMessage | None:
        """The next message, or None once the subscription is lagged or closed, or
        after ``timeout`` seconds without one.

        A plain timer instead of ``asyncio.timeout``: this wait happens once per
        streamed chunk of every followed turn.
        """
        timer: asyncio.TimerHandle | None = None
        self._sunk = False
        try:
            while not self._items:
                if self.lagged or self.closed:
                    return None
                loop = self._loop or asyncio.get_running_loop()
                waiter = self._waiter = loop.create_future()
                if timeout is not None and timer is None:
                    timer = loop.call_later(timeout, _expire, waiter)
                try:
                    await waiter
                finally:
                    self._waiter = None
                if waiter.result() is _EXPIRED:
                    if self._sunk:  # the sink delivered meanwhile: not a quiet spell
                        self._sunk = False
                        timer = None
                        continue
                    return None
            item = self._items.popleft()
            if type(item) is LiveChunks:
                self._extra -= len(item) - 1
            return item
        finally:
            if timer is not None:
                timer.cancel()

    def drain(self) -> list[LiveMessage]:
        items = list(self._items)
        self._items.clear()
        self._extra = 0
        return items

    def reset(self) -> None:
        """After a catch-up from the log, start buffering again."""
        self.lagged = False
        self._items.clear()
        self._extra = 0

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._bus._remove(self)
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)


_EXPIRED = object()


def _expire(waiter: asyncio.Future[object]) -> None:
    if not waiter.done():
        waiter.set_result(_EXPIRED)


#: Live chunks and events a subscriber may have queued before it is marked lagged and
#: catches up from the log instead: a client that stops reading (or a loop
#: that falls behind) costs a bounded buffer, not the turn's whole stream per
#: connection; the log, read in batches, serves it when it reads again.
SUBSCRIPTION_LIMIT = 4096


class InProcessBus:
    """Fan-out inside one process (the PostgreSQL deployment adds a cross-process one)."""

    def __init__(self, limit: int = SUBSCRIPTION_LIMIT) -> None:
        self._subs: dict[str, list[Subscription]] = {}
        self._limit = limit
        # Called with the turn id after a committed event is published (the
        # PostgreSQL deployment tells the other processes).
        self.on_committed: Callable[[str], None] | None = None

    def subscribe(self, turn_id: str, *, runs_tools: bool = False) -> Subscription:
        sub = Subscription(self, turn_id, self._limit, runs_tools=runs_tools)
        self._subs.setdefault(turn_id, []).append(sub)
        return sub

    def publish(self, turn_id: str, message: LiveMessage) -> None:
        subs = self._subs.get(turn_id)
        if subs:
            for sub in subs:
                sub.put(message)
        if self.on_committed is not None and isinstance(message, LiveEvent):
            self.on_committed(turn_id)

    def wake(self, turn_id: str) -> None:
        """Another process appended to ``turn_id``: its subscribers re-read the log."""
        for sub in self._subs.get(turn_id, ()):
            sub.put(WAKE)

    def has_client(self, turn_id: str) -> bool:
        """Whether a subscriber that runs direct tools follows this turn."""
        return any(sub.runs_tools and not sub.closed for sub in self._subs.get(turn_id, ()))

    def close_turn(self, turn_id: str) -> None:
        """Wake every subscriber of a turn that will publish no more (shutdown)."""
        for sub in list(self._subs.get(turn_id, ())):
            sub.closed = True
            waiter = sub._waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def _remove(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.turn_id)
        if subs and sub in subs:
            subs.remove(sub)
            if not subs:
                del self._subs[sub.turn_id]
