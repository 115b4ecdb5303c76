"""``tail``'s rarer paths (``engine.run.follow``): what sends a follower back
to the log, and what ends it.

Every streaming test covers the per-chunk path; these are the branches a
client meets when something goes wrong: its subscription lagged, a live event
was missed (a gap), another process appended (a wake-up), a quiet spell passed
with an event the bus never carried, the turn's bus closed. The oracle is the
store's own read: the follower gets every durable event exactly once, in seq
order. The turn is driven as its actor drives it (``Actor`` of
``tests.test_event_sink``), through the real in-process bus and memory store.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator

import pytest

import engine.run.follow as catchup  # the catch-up reads
from adapters.store import MemoryEventStore
from engine.events import Event, ModelCompleted, TurnCompleted, TurnFinalized
from engine.ports import LiveChunks, LiveRequest, Subscription
from engine.run.follow import Tailed, tail
from engine.run.live import InProcessBus, Joined
from tests.test_event_sink import Actor

Tail = AsyncGenerator[list[Tailed], None]


def seqs(batches: list[list[Tailed]]) -> list[int]:
    return [item.seq for batch in batches for item in batch if isinstance(item, Event)]


class CountingStore(MemoryEventStore):
    """The memory store, counting its reads."""

    reads = 0

    async def read(self, turn_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        self.reads += 1
        return await super().read(turn_id, after, limit)


async def started(store: MemoryEventStore, bus: InProcessBus, *, limit: int = 0, poll_seconds: float = 60.0) -> tuple[Actor, Tail, list[Subscription]]:
    """A turn's actor after its first three events, and a ``tail`` of the turn
    from the start (its first list taken: events 1-3, from the log)."""
    actor = Actor(store, bus, f"t-{uuid.uuid4().hex}")
    await actor.start()
    subs: list[Subscription] = []

    def join(turn_id: str) -> Joined:
        subs.append(bus.subscribe(turn_id))
        return Joined(subs[-1], [], None)

    tailed = tail(store, join, actor.turn_id, poll_seconds=poll_seconds)
    first = [await asyncio.wait_for(tailed.__anext__(), 5)]
    while seqs(first)[-1:] != [3]:
        first.append(await asyncio.wait_for(tailed.__anext__(), 5))
    assert seqs(first) == [1, 2, 3]
    return actor, tailed, subs


async def unpublished(actor: Actor, text: str) -> None:
    """A delta window the log has but this process's bus never carried."""
    bus, actor.bus = actor.bus, InProcessBus()
    try:
        await actor.window([text])
    finally:
        actor.bus = bus


async def finish(actor: Actor) -> None:
    for data in (ModelCompleted(finish_reason="stop"), TurnFinalized(finish_reason="stop"), TurnCompleted()):
        await actor.record(data)


async def rest(tailed: Tail) -> list[list[Tailed]]:
    async def collect() -> list[list[Tailed]]:
        return [batch async for batch in tailed]

    return await asyncio.wait_for(collect(), 10)


async def test_a_lagged_follower_reads_what_it_missed_from_the_log_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catchup, "BATCH", 2)
    store, bus = MemoryEventStore(), InProcessBus(limit=3)
    actor, tailed, subs = await started(store, bus)
    for i in range(4):  # four windows of a chunk and an event: past the limit of 3
        await actor.window([f"w{i} "])
    await finish(actor)
    assert subs[0].lagged
    batches = await rest(tailed)
    assert seqs(batches) == list(range(4, 11)) == [e.seq for e in await store.read(actor.turn_id)][3:]
    assert all(len(batch) <= 2 for batch in batches)


async def test_a_missed_live_event_and_a_wake_up_read_the_log() -> None:
    store, bus = MemoryEventStore(), InProcessBus()
    actor, tailed, _ = await started(store, bus)
    await unpublished(actor, "a ")  # seq 4
    await actor.window(["b "])  # seq 5, live: 4 is missing
    bus.publish(actor.turn_id, LiveRequest({"type": "execute:tool"}))  # after the gap, in the same batch
    got = await asyncio.wait_for(tailed.__anext__(), 5)
    assert seqs([got]) == [4, 5]
    assert [(d.seq, d.texts) for d in got if isinstance(d, LiveChunks)] == [(5, ["b "])]
    assert isinstance(got[-1], LiveRequest) and len(got) == 4
    await unpublished(actor, "c ")  # seq 6, appended "elsewhere"
    bus.wake(actor.turn_id)
    assert seqs([await asyncio.wait_for(tailed.__anext__(), 5)]) == [6]
    await finish(actor)
    assert seqs(await rest(tailed)) == [7, 8, 9]


async def test_chunks_whose_event_was_yielded_are_dropped_and_requests_pass() -> None:
    store, bus = MemoryEventStore(), InProcessBus()
    actor, tailed, _ = await started(store, bus)
    await actor.window(["a ", "b "])  # two chunks, then their event (seq 4)
    got = await asyncio.wait_for(tailed.__anext__(), 5)
    assert [type(item).__name__ for item in got] == ["LiveChunks", "LiveChunks", "Event"]
    turn = actor.turn_id
    bus.publish(turn, LiveChunks(4, 0, "text", ["a ", "b "]))  # seq 4 was yielded: dropped
    bus.publish(turn, LiveChunks(5, 2, "text", ["c "]))
    bus.publish(turn, LiveRequest({"type": "execute:tool"}))
    got = await asyncio.wait_for(tailed.__anext__(), 5)
    assert [(d.seq, d.texts) for d in got if isinstance(d, LiveChunks)] == [(5, ["c "])]
    assert [item.payload for item in got if isinstance(item, LiveRequest)] == [{"type": "execute:tool"}]
    assert len(got) == 2
    await tailed.aclose()


async def test_quiet_spells_read_the_log_ever_less_often_and_find_a_missed_event() -> None:
    store, bus = CountingStore(), InProcessBus()
    actor, tailed, _ = await started(store, bus, poll_seconds=0.01)
    before = store.reads
    for _ in range(12):  # nothing new: heartbeats
        assert await asyncio.wait_for(tailed.__anext__(), 5) == []
    # Re-read on spells 1, 3, 7 and 11 at most (fewer while timers run late).
    assert store.reads - before <= 4
    await unpublished(actor, "late ")  # seq 4: only a re-read finds it
    got: list[list[Tailed]] = []
    while not seqs(got):
        got.append(await asyncio.wait_for(tailed.__anext__(), 5))
    assert seqs(got) == [4] and all(batch == [] for batch in got[:-1])
    await tailed.aclose()


async def test_a_closed_bus_ends_the_tail() -> None:
    store, bus = MemoryEventStore(), InProcessBus()
    actor, tailed, _ = await started(store, bus)
    bus.close_turn(actor.turn_id)
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(tailed.__anext__(), 5)
