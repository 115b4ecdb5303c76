"""The event sink of a direct SSE follower (``engine.run.follow``).

A paced stream seals one ``model.delta`` window per chunk or so. For a
follower with a direct output that already showed a window's chunks live, the
window's durable event renders nothing: ``tail``'s ``event_sink`` folds it
inside the actor's publish instead of waking the stream's generator and its
handler. What must hold: such an event is folded without a wake-up; one whose
chunks were not all shown live is not taken (the generator folds it and shows
its text); the client is shown exactly the answer; and the follower ends
equal to the fold of the log.

The turn is driven the way its actor drives it, through the real in-process
bus and store: chunks published one ``LiveChunks`` each with the pieces of
the sender's own fold, each window appended and then published as a
``LiveEvent``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from adapters.store import MemoryEventStore
from engine.events import (
    AssemblyCompleted,
    Event,
    EventData,
    ModelCompleted,
    ModelDelta,
    ModelRequested,
    TurnCompleted,
    TurnFinalized,
    TurnStarted,
    make_event,
)
from engine.fold.turn_view import ChunkOut, TurnView, fold
from engine.ports import LiveChunks, LiveEvent, TurnRecord
from engine.run.follow import EventOut, Out, TurnFollower, follow
from engine.run.live import InProcessBus, Joined


class Recorder:
    """A direct output that takes everything it is given (a client that reads).
    ``timeline`` is what the client was shown, in order, by either path."""

    def __init__(self, timeline: list[Out]) -> None:
        self.outs: list[Out] = []
        self.timeline = timeline

    def ready(self) -> bool:
        return True

    def deliver(self, follower: TurnFollower, outs: list[Out]) -> None:
        self.outs.extend(outs)
        self.timeline.extend(outs)


def shown(outs: list[Out]) -> str:
    """The answer text a client shows for ``outs``."""
    text: list[str] = []
    for out in outs:
        if isinstance(out, LiveChunks):
            text.extend(p.text for pieces in out.pieces for p in pieces if p.kind == "text")
        elif isinstance(out, (ChunkOut, EventOut)):
            text.extend(p.text for p in out.pieces if p.kind == "text")
    return "".join(text)


class Actor:
    """What a turn actor does with the log and the bus, by hand."""

    def __init__(self, store: MemoryEventStore, bus: InProcessBus, turn_id: str) -> None:
        self.store, self.bus, self.turn_id = store, bus, turn_id
        self.view = TurnView(turn_id)
        self.token = 0

    def _event(self, data: EventData) -> Event:
        return make_event(self.turn_id, self.view.last_seq + 1, data)

    async def start(self) -> None:
        request: dict[str, Any] = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]}
        started = self._event(TurnStarted(chat_id="c", user_id="u", model="m", stream=True, request=request))
        self.view.apply(started)
        now = time.time()
        record = TurnRecord(id=self.turn_id, chat_id="c", user_id="u", model="m", status="running", created_at=now, updated_at=now, owner="o")
        self.token = await self.store.start_turn(record, [started], lease_seconds=600)
        await self.record(AssemblyCompleted(messages=request["messages"], params={}, history_len=0, new_messages=request["messages"]))
        await self.record(ModelRequested(iteration=0))

    async def record(self, data: EventData) -> None:
        event = self._event(data)
        self.view.apply(event)
        await self.store.append([event], fencing=self.token)
        self.bus.publish(self.turn_id, LiveEvent(event))

    async def window(self, chunks: list[str], *, live: bool = True) -> None:
        """One delta window: its chunks shown live (unless ``live`` is False:
        a follower that missed them), then its durable event."""
        seq, first = self.view.last_seq + 1, self.view.next_pos
        for text in chunks:
            pos = self.view.next_pos
            pieces = self.view.feed_chunk("text", text)
            if live:
                self.bus.publish(self.turn_id, LiveChunks(seq, pos, "text", [text], [pieces]))
        event = make_event(self.turn_id, seq, ModelDelta(kind="text", pos=first, text="".join(chunks), lens=[len(c) for c in chunks]))
        self.view.apply(event, live_applied=True)
        await self.store.append([event], fencing=self.token)
        self.bus.publish(self.turn_id, LiveEvent(event))


async def _settle() -> None:
    """A few passes of the loop: a woken generator would run in them."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_window_shown_live_is_folded_without_waking_the_stream() -> None:
    store, bus = MemoryEventStore(), InProcessBus()
    turn_id = f"t-{uuid.uuid4().hex}"
    actor = Actor(store, bus, turn_id)
    await actor.start()
    timeline: list[Out] = []
    recorder = Recorder(timeline)
    yields: list[list[Out]] = []
    caught_up = asyncio.Event()
    follower: TurnFollower | None = None

    def join(tid: str) -> Joined:
        return Joined(bus.subscribe(tid), [], None)

    async def client() -> None:
        nonlocal follower
        async for f, outs in follow(store, join, turn_id, direct=recorder):
            follower = f
            yields.append(outs)
            timeline.extend(outs)
            caught_up.set()  # this task parks in the subscription before the test runs again

    task = asyncio.create_task(client())
    try:
        await asyncio.wait_for(caught_up.wait(), 5)
        assert len(yields) == 1 and follower is not None

        words = [f"w{i} " for i in range(12)]
        for i in range(0, 8, 2):  # four windows of two chunks, each shown live
            await actor.window(words[i : i + 2])
            await _settle()
        assert len(yields) == 1, "a window already shown live woke the stream"
        assert follower.view.last_seq == actor.view.last_seq  # folded inside the publish
        assert shown(recorder.outs) == "".join(words[:8])

        # A window whose chunks this follower never saw live is not the sink's:
        # the generator folds it and shows its text.
        await actor.window(words[8:10], live=False)
        await _settle()
        assert len(yields) == 2 and shown(yields[1]) == "".join(words[8:10])

        await actor.window(words[10:12])
        for data in (ModelCompleted(finish_reason="stop"), TurnFinalized(finish_reason="stop"), TurnCompleted()):
            await actor.record(data)
        await asyncio.wait_for(task, 5)
    finally:
        task.cancel()

    answer = "".join(words)
    assert shown(timeline) == answer
    logged = fold(turn_id, await store.read(turn_id))
    assert follower.view.last_seq == logged.last_seq and follower.finished
    assert follower.view.content == logged.content == answer
