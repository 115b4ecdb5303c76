"""Following a turn: catch-up from the log, then the live tail, in position order.

A follower is what every streaming client connection runs. It folds the turn's
durable events with its own ``TurnView`` and lets live deltas run ahead of their
(later) durable event, showing the pieces the actor's fold made of each chunk
(one fold per chunk for the actor and all its followers: the follower folds the
chunks it showed live into its own view once per window, as one text, when
their ``model.delta`` event arrives), but only contiguously: a delta whose position is not the
next one waits in a small buffer until the events before it arrive. The output is
therefore the same sequence whether a client follows from the first byte, joins
mid-stream, or reconnects: each position exactly once, in order.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from engine.events import TERMINAL_TYPES, Event
from engine.fold.accumulator import Piece
from engine.fold.turn_view import ChunkOut, ResumePoint, TurnView
from engine.json_types import JsonObject
from engine.ports import WAKE, EventStore, LiveChunks, LiveEvent, LiveMessage, LiveRequest, LiveSink
from engine.run.live import Joined


@dataclass(frozen=True)
class EventOut:
    """A durable non-delta event at its stream position."""

    pos: int
    event: Event
    # Text the event released (a held-back tag prefix at the end of a stream).
    pieces: tuple[Piece, ...] = ()
    # Copies of the output items the event changed, as they were right after it
    # (rendering later must not see later states).
    items: tuple[JsonObject, ...] = ()
    # For ``turn.resumed``: where the durable answer ended (rendered later, after
    # the view may have folded more, so it is taken when the event is folded).
    resume: ResumePoint | None = None


# Live chunks are their own output (their positions and the actor's pieces):
# no copy per chunk and follower.
Out = ChunkOut | LiveChunks | EventOut


class Gap(Exception):
    """An event arrived out of order (a lagged subscription): re-read from the log."""


class TurnFollower:
    def __init__(self, turn_id: str) -> None:
        self.view = TurnView(turn_id)
        # Live chunks past the next position, by their first position.
        self._ahead: dict[int, LiveChunks] = {}
        self._fed_live = 0  # chunks fed from live deltas beyond the durable log

    @property
    def finished(self) -> bool:
        return self.view.machine.terminal

    def on_event(self, event: Event) -> list[Out]:
        v = self.view
        if event.seq <= v.last_seq:
            return []
        if event.seq != v.last_seq + 1:
            raise Gap(f"expected seq {v.last_seq + 1}, got {event.seq}")
        if event.type == "model.delta":
            out = self._delta_event(event)
        elif event.type == "turn.resumed" and self._fed_live:
            # Live text of a dead owner that never became durable: the view must be
            # rebuilt from the log, and the client told where the log ends.
            raise Gap("resumed after a lost tail")
        else:
            released = tuple(p for chunk in v.apply(event) for p in chunk.pieces)
            resume = v.resume_point if event.type == "turn.resumed" else None
            out = [EventOut(v.last_event_pos, event, released, tuple(v.items_touched(event)), resume)]
            if event.type == "turn.resumed":
                self._ahead = {p: m for p, m in self._ahead.items() if m.end > v.next_pos}
        out.extend(self._drain())
        return out

    def _delta_event(self, event: Event) -> list[Out]:
        v = self.view
        data = event.data
        first = data["pos"]
        lens: list[int] = data["lens"]
        already = max(0, min(len(lens), v.next_pos - first))  # chunks fed live
        if already == 0:
            return list(v.apply(event))
        if already == len(lens):
            self.fold_shown_event(event)
            return []
        # Some chunks were shown from live deltas (the actor's pieces, not folded
        # here): fold their text at once (the accumulator's items and text do
        # not depend on how a text is cut), feed the rest chunk by chunk, then
        # let the view record the event as applied.
        out: list[Out] = []
        text: str = data["text"]
        kind = data.get("kind", "text")
        call_id = data.get("call_id")
        offset = sum(lens[:already])
        v.fold_shown(kind, text[:offset], call_id)
        for n in lens[already:]:
            pos = v.next_pos
            out.append(ChunkOut(pos, v.feed_chunk(kind, text[offset : offset + n], call_id)))
            offset += n
        self._fed_live = max(0, self._fed_live - already)
        v.apply(event, live_applied=True)
        return out

    def fold_shown_event(self, event: Event) -> None:
        """The next ``model.delta``, all of whose chunks were shown live: it
        renders nothing; its text goes to the view's accumulator at once (its
        items and text do not depend on how a text is cut)."""
        v = self.view
        data = event.data
        n = len(data["lens"])
        v.fold_shown(data.get("kind", "text"), data["text"], data.get("call_id"))
        self._fed_live = max(0, self._fed_live - n)
        v.apply(event, live_applied=True)

    def on_chunks(self, message: LiveChunks) -> list[Out]:
        """Live chunks: shown now if they start at the next position (those
        shown already are dropped), else kept until the events before them
        arrive. Per read and client: no drain call while nothing waits ahead."""
        pos = self.view.pos
        nxt = pos.next
        if message.pos != nxt:
            if message.pos > nxt:
                self._ahead[message.pos] = message
                return []
            later = message.since(nxt)
            if later is None:
                return []
            message = later
        n = len(message.texts)
        pos.claim(n)
        self._fed_live += n
        if not self._ahead:
            return [message]
        return [message, *self._drain()]

    def _drain(self) -> list[Out]:
        """What waited ahead and now starts at (or spans) the next position."""
        out: list[Out] = []
        ahead, pos = self._ahead, self.view.pos
        while ahead:
            nxt = pos.next
            found = None
            for start in sorted(p for p in ahead if p <= nxt):  # stale ones go too
                found = ahead.pop(start).since(nxt)
                if found is not None:
                    break
            if found is None:
                break
            n = len(found.texts)
            pos.claim(n)
            self._fed_live += n
            out.append(found)
        return out


def chunk_outs(chunks: LiveChunks) -> list[ChunkOut]:
    """Live chunks one by one, as the fold of their event gives them."""
    return [ChunkOut(pos, pieces) for pos, pieces in zip(range(chunks.pos, chunks.end), chunks.pieces)]


# --------------------------------------------------------------------------- catch-up reads
#
# Catch-up reads of a turn's log, shared and in batches.
#
# Every streaming client falls back on the log when its live subscription cannot
# serve it (it joined late, lagged, or the loop fell behind its quiet-spell
# timer). Under load that is thousands of reads at once: the same turn's
# followers at the same position share one read here (one round trip for a
# turn's many viewers reconnecting together), and a read returns at most
# ``BATCH`` events, so a follower far behind gets its durable events batch by
# batch, each sent before the next is read, instead of one whole log in memory
# per follower. How many reads run at once is the store's business (its read
# pool: ``adapters.store.sql``); a read waits there, it never fails for being
# queued.

#: Events per catch-up read.
BATCH = 512

_Key = tuple[str, int, int]
# Reads in flight per store: (turn, after, limit) -> the shared read.
_inflight: weakref.WeakKeyDictionary[EventStore, dict[_Key, asyncio.Task[list[Event]]]] = weakref.WeakKeyDictionary()


async def read_batch(store: EventStore, turn_id: str, after: int) -> list[Event]:
    """Up to ``BATCH`` events of ``turn_id`` after seq ``after``, in seq order.

    Concurrent callers asking for the same batch share one store read (the
    result list is shared: callers must not modify it). A caller cancelled
    while waiting does not cancel the read for the others.
    """
    limit = BATCH
    try:
        reads = _inflight[store]
    except KeyError:
        reads = _inflight[store] = {}
    except TypeError:  # a store without weak references: no sharing
        return await store.read(turn_id, after=after, limit=limit)
    key = (turn_id, after, limit)
    task = reads.get(key)
    if task is None:
        task = asyncio.ensure_future(store.read(turn_id, after=after, limit=limit))
        reads[key] = task
        task.add_done_callback(lambda t: _done(reads, key, t))
    return await asyncio.shield(task)


def _done(reads: dict[_Key, asyncio.Task[list[Event]]], key: _Key, task: asyncio.Task[list[Event]]) -> None:
    if reads.get(key) is task:
        del reads[key]
    if not task.cancelled():
        task.exception()  # retrieved: every waiter may have been cancelled


#: Quiet-spell re-reads (a safety net: the live subscription normally has
#: everything) running at once in this process; more are skipped (tried again
#: next spell), not queued: thousands of followers of turns waiting for a slow
#: model would otherwise all queue such a read, and a follower waiting for its
#: read delivers nothing meanwhile (bench ``thousands_ws``: up to 18 s).
QUIET_READS_AT_ONCE = 8
_quiet_reads = 0

POLL_SECONDS = 1.0
QUIET_READS_MAX = 4  # a quiet turn's log is re-read at least every 4 poll periods
log = logging.getLogger("turnlog.follow")


class DirectOutput(Protocol):
    """A consumer that can take live output synchronously (see ``follow``)."""

    def ready(self) -> bool:
        """Whether ``deliver`` may be called now (e.g. the socket is not backed up)."""
        ...

    def deliver(self, follower: TurnFollower, outs: list[Out]) -> None:
        """Send ``outs`` now, without awaiting."""
        ...


Tailed = Event | LiveChunks | LiveRequest


class Phase(Enum):
    """Where a ``tail`` is; ``_Tail.after_batch`` moves it on after each batch
    it yields (the bus closing ends ``LIVE`` too)::

        CATCHING_UP ──► LIVE ⇄ READING_LOG     (each ──► DONE after a terminal event)

    ``CATCHING_UP`` and ``READING_LOG`` stay while each read fills its batch;
    ``LIVE`` turns to ``READING_LOG`` when one of its reads did."""

    # The actor's history when it still holds it, else the log, batch by batch;
    # the last batch with the chunks of the actor's open window.
    CATCHING_UP = "catching up"
    # The subscription's messages. A wake-up or a missed event reads the log
    # before the messages after it; a lagged subscription or a quiet spell of
    # ``poll_seconds`` may read it too (``_Tail.quiet_spell``).
    LIVE = "live"
    # A read in ``LIVE`` filled its batch: the rest of the log, batch by batch.
    READING_LOG = "reading the log"
    # A terminal event was yielded, or the turn's bus closed.
    DONE = "done"


# Plain names: an enum member's lookup costs ~90 ns on CPython 3.11 (per message here).
CATCHING_UP, LIVE, READING_LOG, DONE = Phase


async def tail(
    store: EventStore,
    join: Callable[[str], Joined],
    turn_id: str,
    *,
    after: int = 0,
    poll_seconds: float = POLL_SECONDS,
    sink: LiveSink | None = None,
) -> AsyncGenerator[list[Tailed], None]:
    """A turn's durable events after seq ``after`` — each exactly once, in seq
    order — and its live messages, until a terminal event (or shutdown), in
    the phases of ``Phase``.

    Every client connection of a turn reads it through here: SSE followers fold
    it (``follow``), WebSocket pumps render it as it comes. The log stays the
    source of truth: a lagged subscription, an event past the next seq, a
    wake-up from another process or a quiet spell (``_Tail.quiet_spell``)
    each lead to a re-read of the log after the last seq, so a missed live
    message delays output but never loses it. An empty list is a heartbeat
    (the consumer may send a keep-alive). A live chunk whose durable event was
    already yielded is dropped.

    ``sink``: the client's ``LiveSink``, offered live chunks and the next
    durable ``model.delta`` event while this generator waits with nothing
    queued (a paced stream's window is sealed per chunk: waking this
    generator and its consumer for an event that renders nothing cost more
    than the chunk itself); an event it takes counts as yielded.
    """
    t = _Tail(store, join(turn_id), turn_id, after, poll_seconds)
    sub = t.sub
    t.install(sink)
    time = asyncio.get_running_loop().time
    out: list[Tailed]
    try:
        while t.phase is not DONE:
            if t.phase is CATCHING_UP:
                out = await t.catching_up()
            elif t.phase is READING_LOG:
                out = await t.reread()
            else:
                # LIVE, the per-chunk path: a queued or awaited message, then
                # ``_Tail.live`` (synchronous); each rarer branch is one method.
                messages: list[LiveMessage] | None = sub.drain()
                if not messages:
                    asked = time()
                    message = await sub.get(poll_seconds)
                    messages = [message, *sub.drain()] if message is not None else await t.settle()
                if messages is None:  # a quiet spell, or the end
                    if sub.closed:
                        t.phase = DONE
                        continue
                    out = await t.quiet_spell(asked)
                elif not messages:
                    continue  # the sink took them
                else:
                    out = t.live(messages)
                    if t.rest is not None:
                        out = await t.read_on(out)
            t.after_batch()
            yield out
    finally:
        sub.sink = None
        sub.close()


class _Tail:
    """One ``tail``'s state: its phase, where it is in the turn's log (the
    last seq yielded, whether that was terminal, whether the log may hold
    more) and its quiet-spell counters."""

    def __init__(self, store: EventStore, joined: Joined, turn_id: str, after: int, poll_seconds: float) -> None:
        self.store = store
        self.joined = joined
        self.sub = joined.subscription
        self.history = joined.history  # taken by the catch-up's first batch
        self.turn_id = turn_id
        self.poll_seconds = poll_seconds
        self.phase = CATCHING_UP
        self.last = after  # the seq of the last durable event yielded
        self.done = False  # a terminal event was yielded
        self.more = False  # the last read filled its batch: the log may hold more
        # Re-reads in a row that found nothing, and quiet spells since the last
        # one: a turn that stays quiet is re-read after 1, 2, then every
        # QUIET_READS_MAX spells (heartbeats still every spell), so thousands of
        # quiet followers (turns waiting for a slow model) do not each read the
        # log every second.
        self.idle_reads = 0
        self.quiet = 0
        # Live messages left for after a read of the log (``live``), and
        # whether a wake-up among them asked for it (or was read already).
        self.rest: list[LiveMessage] | None = None
        self.woken = False

    def after_batch(self) -> None:
        """The phase once a batch is out (see ``Phase``)."""
        if self.done:
            self.phase = DONE
        elif not self.more:
            self.phase = LIVE
        elif self.phase is LIVE:
            self.phase = READING_LOG

    def install(self, sink: LiveSink | None) -> None:
        """Offer the subscription's messages to ``sink``: live chunks, and the
        next durable ``model.delta``."""
        if sink is None:
            return

        def take(message: LiveMessage) -> bool:
            if type(message) is LiveChunks:
                return sink.chunks(message)
            if type(message) is not LiveEvent:
                return False
            event = message.event
            if event.seq != self.last + 1 or self.done or event.type != "model.delta" or not sink.durable(event):
                return False
            self.last = event.seq  # taken: it counts as yielded
            return True

        self.sub.sink = take

    def durable(self, events: list[Event]) -> list[Tailed]:
        out: list[Tailed] = []
        for event in events:
            if event.seq <= self.last or self.done:
                continue
            out.append(event)
            self.last = event.seq
            self.done = event.type in TERMINAL_TYPES
        return out

    async def reread(self) -> list[Tailed]:
        # Shared with the turn's other followers at the same seq, one batch at
        # a time (``read_batch``); ``more`` says whether to read on.
        batch = await read_batch(self.store, self.turn_id, self.last)
        self.more = len(batch) >= BATCH
        return self.durable(batch)

    async def catching_up(self) -> list[Tailed]:
        history, self.history = self.history, None
        out = self.durable(history) if history is not None else await self.reread()
        if not self.more or self.done:  # the last batch: the open window's chunks whose event was not yielded
            out.extend(m for m in self.joined.window if m.seq > self.last)
        return out

    def live(self, messages: list[LiveMessage]) -> list[Tailed]:
        """What live messages bring, in order: events past the last seq, chunks
        whose event was not yielded, requests. Synchronous (it runs per
        chunk): a message that needs the log (a wake-up, an event past the
        next seq) leaves the messages to take after the read in ``rest``, for
        ``read_on``."""
        self.idle_reads = self.quiet = 0
        out: list[Tailed] = []
        if not self.woken and any(item is WAKE for item in messages):
            # Appended elsewhere: the log has it (and this process's own
            # live items are in the log too); read it before them all.
            self.rest = messages
            self.woken = True
            return out
        for item in messages:
            if isinstance(item, LiveEvent):
                if item.event.seq > self.last + 1:  # missed something: the log has it
                    self.rest = messages[next(i for i, m in enumerate(messages) if m is item) + 1 :]
                    return out
                out.extend(self.durable([item.event]))
            elif isinstance(item, LiveChunks):
                if item.seq > self.last:  # else their event was yielded already
                    out.append(item)
            elif isinstance(item, LiveRequest):
                out.append(item)
            if self.done:
                break
        return out

    async def read_on(self, out: list[Tailed]) -> list[Tailed]:
        """Read the log for ``live``, then go on with the messages it left."""
        # After a missed event, nothing more once the read ended the turn (as
        # after any message); a wake-up's read comes before all the messages.
        check_done = not self.woken
        self.woken = True  # the messages' wake-ups are read: not again
        while self.rest is not None:
            rest, self.rest = self.rest, None
            out.extend(await self.reread())
            if check_done and self.done:
                break
            check_done = True
            out.extend(self.live(rest))
        self.woken = False
        return out

    async def settle(self) -> list[LiveMessage] | None:
        """The poll timer fired with nothing queued: what came in one more pass
        of the loop (empty if the sink took it all), or None for a quiet spell
        (or a lagged or closed subscription)."""
        sub = self.sub
        if sub.closed or sub.lagged:
            return None
        # The timer may have fired only because this loop fell behind (timers
        # run before the publisher's pending I/O): after one more pass, a turn
        # that still moves is no quiet spell. Re-reading the log for every
        # follower at once would deepen the lag (thousands of followers would
        # drain the read pool).
        seen = sub.received
        await asyncio.sleep(0)
        if sub.received == seen or sub.lagged or sub.closed:
            return None
        messages = sub.drain()
        if not messages:
            self.idle_reads = self.quiet = 0
        return messages

    async def quiet_spell(self, asked: float) -> list[Tailed]:
        """A poll period without messages (``asked``: when the wait began): a
        heartbeat (``[]``) or what a re-read of the log found."""
        global _quiet_reads
        sub = self.sub
        self.quiet += 1
        # A timer half a period late: this loop is behind, so the spell says
        # nothing about the turn (its chunks wait in the loop's queue), and a
        # re-read now would queue behind every other follower's for many
        # seconds, delivering nothing meanwhile (with 2,000 followers, up to
        # 32 s). Re-read once the loop keeps time again.
        behind = asyncio.get_running_loop().time() - asked > 1.5 * self.poll_seconds
        if behind:
            self.quiet -= 1
        if not sub.lagged and (behind or self.quiet < min(2**self.idle_reads, QUIET_READS_MAX)):
            return []  # a heartbeat
        if sub.lagged:
            sub.reset()
            found = await self.reread()
        elif _quiet_reads >= QUIET_READS_AT_ONCE:
            return []  # enough safety-net reads run: next spell
        else:
            _quiet_reads += 1
            try:
                found = await self.reread()
            finally:
                _quiet_reads -= 1
        self.quiet = 0
        self.idle_reads = 0 if found else self.idle_reads + 1
        return found


async def follow(
    store: EventStore,
    join: Callable[[str], Joined],
    turn_id: str,
    *,
    poll_seconds: float = POLL_SECONDS,
    direct: DirectOutput | None = None,
) -> AsyncIterator[tuple[TurnFollower, list[Out]]]:
    """``tail`` folded: the turn's output (chunks and events at stream
    positions) as one client shows it, from the first position on.

    Yields ``(follower, outs)``; an empty ``outs`` is a heartbeat. A follower that
    falls out of step with the log (a gap, or live text that the log lost in a
    crash) is rebuilt from the log.

    With ``direct``, a live delta that arrives while the caller is waiting for
    the next item (everything before it already consumed) is folded and handed
    to ``direct.deliver`` at once, inside the publisher's call, instead of
    waking this generator: the same output in the same order, one event-loop
    hop sooner. Events (and anything while ``direct`` is not ready) take the
    normal path.
    """
    state = _DirectSink(direct)
    follower = state.follower = TurnFollower(turn_id)
    async with aclosing(tail(store, join, turn_id, poll_seconds=poll_seconds, sink=state if direct is not None else None)) as tailed:
        async for items in tailed:
            outs, state.undelivered = state.undelivered, []
            if state.broken:  # the direct path failed to fold a delta
                follower, rebuilt = await state.rebuild(store, turn_id)
                outs.extend(rebuilt)
            try:
                for item in items:
                    if isinstance(item, LiveChunks):
                        outs.extend(follower.on_chunks(item))
                    elif isinstance(item, Event):
                        outs.extend(follower.on_event(item))
            except (Gap, ValueError):
                # Out of step with the log (a gap, or live text that does not
                # line up): the log decides; rebuild from it.
                yield follower, outs
                follower, outs = await state.rebuild(store, turn_id)
            yield follower, outs
            state.live = True
            if follower.finished:
                return


class _DirectSink:
    """``follow``'s ``LiveSink``: live chunks folded by the follower and
    handed to the client's ``DirectOutput`` inside the publisher's call."""

    def __init__(self, direct: DirectOutput | None) -> None:
        self.direct = direct
        self.follower: TurnFollower | None = None
        self.live = False  # the catch-up was yielded: the caller can render
        self.broken = False  # a chunk failed to fold on the direct path: resync
        self.off = False  # the direct output failed once: not used again
        self.undelivered: list[Out] = []  # folded, not sent: the generator yields them

    def chunks(self, message: LiveChunks) -> bool:
        follower, direct = self.follower, self.direct
        if not self.live or self.broken or self.off or follower is None or direct is None or not direct.ready():
            return False
        # This runs inside the actor's publish: nothing may escape into the actor.
        try:
            outs = follower.on_chunks(message)
        except (Gap, ValueError):
            self.broken = True  # the generator rebuilds from the log when it wakes
            return False
        if not outs:
            return True
        try:
            direct.deliver(follower, outs)
        except Exception:
            # The follower has taken the chunks: their output goes out through
            # the generator instead (queueing the message wakes it), and this
            # stream stays on the plain path from now on.
            log.exception("turn %s: direct output failed; the handler takes over", follower.view.id)
            self.undelivered.extend(outs)
            self.off = True
            return False
        return True

    def durable(self, event: Event) -> bool:
        """A ``model.delta`` whose chunks this follower already showed live
        (nothing waiting ahead) renders nothing, so it is folded here, inside
        the actor's publish, instead of waking the generator and the handler."""
        follower = self.follower
        if not self.live or self.broken or self.off or follower is None or follower._ahead:
            return False
        v = follower.view
        data = event.data
        if event.seq != v.last_seq + 1 or v.pos.next - data["pos"] < len(data["lens"]):
            return False
        try:
            follower.fold_shown_event(event)  # what ``on_event`` does for it, without the dispatch
        except (Gap, ValueError):
            self.broken = True  # the generator rebuilds from the log when it wakes
            return False
        return True

    async def rebuild(self, store: EventStore, turn_id: str) -> tuple[TurnFollower, list[Out]]:
        """A new follower of the whole log, and its output (what it yields
        again, the renderer's position filter drops)."""
        self.broken = False
        fresh = self.follower = TurnFollower(turn_id)
        return fresh, [out for event in await store.read(turn_id) for out in fresh.on_event(event)]
