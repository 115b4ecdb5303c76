"""The turn actor: one asyncio task per running turn.

It runs the turn's nodes (``engine.run.nodes``) from wherever the log ends and
is their ``TurnContext``: it appends what they record, folds it into the view
and the loop state, and publishes it to live subscribers.

Durability rules:
* state events are durable before the engine acts on them (``record`` awaits the
  commit: ``model.requested`` is committed before the request goes out);
* a new turn's first commit creates it (``EventStore.start_turn``): ``turn.started``
  is staged, not written on its own, and goes with the first events recorded
  durably (normally the assembly and ``model.requested``: one commit, not two,
  before the model request). Nothing reaches a client before it (``started``);
  a turn that ends before it never existed in the log;
* token deltas are published at once and written in batches (group commit):
  a window is sealed at most ``flush_interval`` after its first chunk (on the
  loop's shared ``FlushClock``; up to ``flush_max_interval`` while the loop
  runs late), at ``flush_max_chunks`` chunks, or before the next non-delta
  event;
* cancellation is shielded: the partial output is committed as ``cancelled``
  before the cancel is acknowledged.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from bisect import bisect_left
from collections import deque
from itertools import accumulate

from engine.events import (
    Event,
    EventData,
    TurnCancelled,
    TurnCancelRequested,
    TurnFailed,
    TurnResumed,
    delta_event,
    make_event,
    parse_data,
)
from engine.fold.turn_view import TurnView
from engine.json_types import JsonObject
from engine.machine import STATUS_AFTER, TERMINAL_STATUSES
from engine.ports import (
    ConcurrencyError,
    EventStore,
    IndexUpdate,
    LeaseLost,
    LiveBus,
    LiveChunks,
    LiveEvent,
    ResumeMode,
    TurnRecord,
    observe,
)
from engine.run.context import END, End, TurnPorts
from engine.run.flush_clock import FlushClock
from engine.run.log_context import current_chat, current_turn, current_user
from engine.run.loop_state import LoopState
from engine.run.nodes import Node, RequestModel, entry_node
from engine.settings import EngineSettings

log = logging.getLogger("turnlog.turn")

# Events a live actor keeps for followers that join early (see TurnActor.history).
HISTORY_LIMIT = 16


class TurnLost(Exception):
    """This actor may no longer write the turn (lease lost, or a log conflict)."""


class NotStarted(Exception):
    """The actor of a new turn stopped before the turn's first commit (this
    process halts it): the turn never existed in the log."""


def _wake(waiter: asyncio.Future[None], _done: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def index_update(event: Event, view: TurnView) -> IndexUpdate | None:
    """What an event changes in the turn's index row (status, and the final view)."""
    if event.type not in STATUS_AFTER:
        return None
    # The fold's status: a decision while another call of the batch is
    # undecided leaves the turn waiting.
    status = view.status
    return IndexUpdate(status=status, view=view.public() if status in TERMINAL_STATUSES else None)


class TurnActor:
    def __init__(
        self,
        *,
        view: TurnView,
        state: LoopState,
        fencing: int,
        store: EventStore,
        bus: LiveBus,
        ports: TurnPorts,
        settings: EngineSettings,
        owner: str,
        history: list[Event] | None = None,
        start: tuple[TurnRecord, Event] | None = None,
    ) -> None:
        # The TurnContext the nodes see.
        self.turn_id = view.id
        self.view = view
        self.state = state
        self.ports = ports
        self.settings = settings
        self.owner = owner
        self.fencing = fencing
        self.store = store
        self.bus = bus
        self.task: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        # Delta batch (group commit window): the chunks as published, so that a
        # subscriber joining mid-window gets them exactly as the others did.
        self._batch: list[str] = []  # the open window's chunk texts
        # What was published of it: a message per read.
        self._batch_live: list[LiveChunks] = []
        self._batch_kind = "text"
        self._batch_call: str | None = None  # the call of a ``tool_arguments`` window
        self._batch_chars = 0  # the open window's text, in characters
        self._batch_pos = 0
        self._batch_seq = 0
        # The open window's number: the clock's call for an older one is stale.
        self._window = 0
        self._clock = FlushClock.of(self._loop)
        self._inflight: deque[asyncio.Future[None]] = deque()
        # Per window in flight: its events, found by its future in a bound
        # method's callback, run in one context per actor. No partial and no
        # context copy per window: a window waits seconds for its commit when
        # the store is behind, and every object it holds is walked by each
        # young collection of the garbage collector meanwhile (~0.7 µs each;
        # 12k windows were in flight at 2,000 streams). The bound method is
        # not kept on the actor: that would be a reference cycle, and a
        # finished turn's whole state would wait for the collector instead of
        # being freed at once.
        self._window_events: dict[asyncio.Future[None], list[Event]] = {}
        self._callback_context: contextvars.Context | None = None
        # Recorded with durable=False: committed with the next commit.
        self._staged: list[Event] = []
        # A new turn not yet in the log: its record and ``turn.started`` (folded
        # into ``view`` already) go with its first durable commit.
        self._start: TurnRecord | None = None
        self._start_write: asyncio.Future[int] | None = None
        # In-order publication of committed events.
        self._next_publish = view.last_seq + 1
        if start is not None:
            self._start, started = start
            self._staged.append(started)
            self._next_publish = started.seq
            history = []
        self._committed: dict[int, Event] = {}
        # Every committed event of the turn while there are few (``history``: the
        # events ``view`` was folded from), so that a follower joining early —
        # the client that started the turn — starts without reading the log.
        self._history: list[Event] | None = list(history) if history is not None else None
        if self._history is not None and (len(self._history) != self._next_publish - 1 or any(e.seq != i for i, e in enumerate(self._history, 1))):
            self._history = None
        self._cancel_by: str | None = None
        self._halting = False
        self._cancel_done: asyncio.Future[None] = self._loop.create_future()
        self.done: asyncio.Future[None] = self._loop.create_future()
        # The turn is in the log (its first commit is durable): what the caller
        # that started it waits for before it answers the client.
        self.started: asyncio.Future[None] = self._loop.create_future()
        if self._start is None:
            self.started.set_result(None)
        else:  # its caller may be gone (a client that hung up): not an unretrieved error
            self.started.add_done_callback(lambda f: f.cancelled() or f.exception())
        # The answer is final (outlet applied; background tasks may still run):
        # what a non-streaming client waits for.
        self.answered: asyncio.Future[None] = self._loop.create_future()
        # This actor stopped writing (its lease or a write failed): its view may
        # hold events the log does not; the log decides.
        self.lost = False
        # The write failure that stopped this actor (None: none did).
        self.write_error: BaseException | None = None
        # The first chunk of a new turn is reported once (time to first token).
        self._first_pending = False
        #: The lease went with the commit of the terminal event (the supervisor
        #: need not release it in a commit of its own).
        self.released = False

    @property
    def never_started(self) -> bool:
        """This new turn's first commit was not made (it failed, or the actor
        stopped before it): there is no turn in the log to release or resume."""
        return self._start is not None

    @property
    def store_fault(self) -> bool:
        """This actor stopped because a write failed in the store (the database
        down, its disk full), not because another owner took the turn: once
        the store answers again, the turn is to be resumed at once."""
        return self.lost and self.write_error is not None and not isinstance(self.write_error, (LeaseLost, ConcurrencyError))

    # -- lifecycle -------------------------------------------------------------

    def start(self, *, resume: bool = False) -> None:
        self._first_pending = not resume
        self.task = asyncio.create_task(self._main(resume), name=f"turn:{self.turn_id}")

    async def cancel(self, by: str | None = None) -> None:
        """Stop the turn; returns once ``turn.cancelled`` is durable."""
        if self.task is None or self.task.done():
            return
        if self._cancel_by is None:
            self._cancel_by = by or "client"
            self.task.cancel()
        await asyncio.shield(self._cancel_done)

    async def halt(self) -> None:
        """Stop writing, as a process that dies right now would, except that the
        open delta window is made durable first. (``verify`` replays a crash the
        log shows with it: the window the log has is the one that survived.)"""
        self._flush()
        while self._inflight:
            await asyncio.wait((self._inflight[0],))
        self._halting = True
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.wait((self.task,))

    def history(self) -> list[Event] | None:
        """The committed (and published) events so far, or None once there are
        more than ``HISTORY_LIMIT``; taken with a subscription, it replaces a
        read of the log."""
        return list(self._history) if self._history is not None else None

    def open_batch(self) -> list[LiveChunks]:
        """The chunks already shown live but not yet sealed into an event.

        A subscriber that joins mid-window takes these together with its
        subscription (no await in between), so it misses nothing."""
        return list(self._batch_live)

    async def _main(self, resume: bool) -> None:
        current_turn.set(self.turn_id)  # this task's context: its log lines name the turn
        current_user.set(self.view.user_id)
        current_chat.set(self.view.chat_id)
        self._callback_context = contextvars.copy_context()  # ... and its windows' callbacks' lines
        observer, view = self.ports.observer, self.view
        observe(observer.turn_started, self.turn_id, model=view.model or "", chat_id=view.chat_id, started_at=view.created_at, resumed=resume)
        try:
            node = await self._record_resume() if resume else entry_node(self.view, self.state)
            while not isinstance(node, End):
                node = await node.run(self)
        except asyncio.CancelledError:
            if self._cancel_by is None or self._halting:
                raise  # shutdown or halt: the turn stays running and is resumed later
            await asyncio.shield(self._save_cancelled())
        except TurnLost as exc:
            log.warning("turn %s: stopped writing: %s", self.turn_id, exc)
        except Exception as exc:  # a bug must still end the turn with a record
            log.exception("turn %s: internal error", self.turn_id)
            try:
                await self.fail(f"internal error: {exc}", "internal_error")
            except Exception:
                log.exception("turn %s: could not record the failure", self.turn_id)
        finally:
            self._window += 1  # no call of the clock seals a window from now on
            if not self._cancel_done.done():
                self._cancel_done.set_result(None)
            # Stopped before the turn's first commit (a drain halted it): no
            # turn. A first commit still in flight decides it instead (_started).
            if not self.started.done() and (self._start_write is None or self._start_write.done()):
                self.started.set_exception(self.write_error or NotStarted(f"turn {self.turn_id} was stopped before it started"))
            if not self.answered.done():
                self.answered.set_result(None)
            if not self.done.done():
                self.done.set_result(None)
            observe(observer.turn_ended, self.turn_id, self.view.status)

    async def _record_resume(self) -> Node | End:
        """Record ``turn.resumed`` and return where the turn goes on. A model
        call that was cut off goes on in its upstream's resume mode (recorded:
        a restart supersedes the partial answer in the fold)."""
        view = self.view
        node = entry_node(view, self.state)
        mode: ResumeMode = "continue"
        if isinstance(node, RequestModel) and node.resume:
            resolved = await self.ports.models.resolve(self.state.input.model)
            if resolved is not None:
                mode = resolved.resume
                node = RequestModel(resume=True, resolved=resolved)
        await self.record(TurnResumed(from_seq=view.last_seq, from_pos=view.last_event_pos, epoch=view.epoch + 1, owner=self.owner, mode=mode))
        return node

    async def _save_cancelled(self) -> None:
        try:
            await self.record(TurnCancelRequested(by=self._cancel_by))
            await self.record(TurnCancelled())
        except Exception:
            log.exception("turn %s: could not save the cancellation", self.turn_id)
        finally:
            if not self._cancel_done.done():
                self._cancel_done.set_result(None)

    async def fail(self, message: str, type: str, *, status: int | None = None, code: str | None = None, extra: JsonObject | None = None) -> End:
        if not self.view.terminal and not self.lost:
            error: JsonObject = {"message": message, "type": type}
            if status is not None:
                error["status"] = status
            if code is not None:
                error["code"] = code
            if extra:
                error.update(extra)
            await self.record(TurnFailed(error=error))
        return END

    def writes_behind(self) -> bool:
        return len(self._inflight) > self.settings.max_inflight_flushes

    async def catch_up(self) -> None:
        if self.writes_behind():
            oldest = self._inflight[0]
            # Wait for the write without taking it over: a cancel of this task
            # must not cancel the store's future. A bare waiter woken by the
            # write's callback, not ``asyncio.wait``: this runs once per window
            # of every turn while the store is behind (its set, closures and
            # callback removal were ~5 % of the event loop's time then).
            waiter = self._loop.create_future()
            oldest.add_done_callback(functools.partial(_wake, waiter))
            began = self._loop.time()
            try:
                await waiter
            finally:  # a cancelled wait was a wait too
                observe(self.ports.observer.store_waited, self.turn_id, self._loop.time() - began)
            if self.lost:
                raise TurnLost("this actor lost the turn")
            if not oldest.cancelled():
                exc = oldest.exception()
                if exc is not None:
                    raise exc

    # -- deltas and group commit ---------------------------------------------------

    def delta(self, kind: str, text: str) -> None:
        """One chunk: show it now, write it with its window."""
        self.deltas(kind, [text])

    def deltas(self, kind: str, texts: list[str], *, call_id: str | None = None) -> None:
        """The non-empty chunks of one read: shown now (published), written
        with their window (group commit).

        Per window the read's chunks are one ``LiveChunks`` message. Plain
        text chunks (the per-token case: no tag can start, nothing held back)
        are folded in one step (no object per chunk); anything else chunk by
        chunk, with the pieces of each. Either way the windows, positions and
        pieces are those of folding one chunk at a time.
        """
        v = self.view
        pos = v.pos
        acc = v.acc
        limit = self.settings.flush_max_chunks
        max_chars = self.settings.flush_max_chars
        publish, turn_id = self.bus.publish, self.turn_id
        fast = self.settings.live_fast_paths
        if self._batch and (kind != self._batch_kind or call_id != self._batch_call):
            self._flush()
        while texts:
            batch = self._batch
            if not batch:
                self._batch_kind = kind
                self._batch_call = call_id
                self._batch_pos = pos.next
                self._batch_seq = v.last_seq + 1
                self._window += 1
                self._clock.call_within(self.settings.flush_interval, self._flush_window, self._window, self.settings.flush_max_interval)
                if self._first_pending:  # once per window, not per chunk
                    self._first_token()
            seq = self._batch_seq
            # This window's share of the read: up to its chunk bound, and up to
            # the chunk that reaches its character bound.
            room = max(1, limit - len(batch))  # (a lost actor's window only grows)
            seg = texts if len(texts) <= room else texts[:room]
            ends = list(accumulate(map(len, seg)))
            cut = bisect_left(ends, max_chars - self._batch_chars) + 1
            if cut < len(seg):
                seg = seg[:cut]
            n = len(seg)
            at = pos.claim(n)
            if kind == "text" and fast and acc.feed_plain(seg):
                message = LiveChunks(seq, at, kind, seg)
            elif kind == "tool_arguments":
                message = LiveChunks(seq, at, kind, seg, [tuple(v.out.feed(kind, text, call_id)) for text in seg])
            else:
                feed = acc.feed_reasoning if kind == "reasoning" else acc.feed_text
                message = LiveChunks(seq, at, kind, seg, [tuple(feed(text)) for text in seg])
            batch.extend(seg)
            self._batch_live.append(message)
            self._batch_chars += ends[n - 1]
            publish(turn_id, message)
            if len(batch) >= limit or self._batch_chars >= max_chars:
                self._flush()
            if n == len(texts):
                break
            texts = texts[n:]

    def _first_token(self) -> None:
        self._first_pending = False
        if self.view.created_at is not None:
            observe(self.ports.observer.first_token, self.turn_id, max(0.0, time.time() - self.view.created_at))

    def _flush_window(self, window: int) -> None:
        """The clock's call: seal the window it was asked for, if still open."""
        if window == self._window:
            self._flush()

    def _flush(self) -> None:
        """Seal the open batch as one ``model.delta`` event and start writing it."""
        self._window += 1  # the clock's call for it (if any) is void from now on
        if not self._batch or self.lost:
            return
        texts = self._batch
        self._batch = []
        self._batch_live = []
        self._batch_chars = 0
        event = delta_event(self.turn_id, self._batch_seq, self._batch_kind, self._batch_pos, texts, self._batch_call)
        self.view.apply(event, live_applied=True)
        events, self._staged = [*self._staged, event], []
        # No task per window: the store's future, and the bookkeeping in its
        # callback (a window is sealed ~20 times a second per streaming turn).
        # Lazy (the store may let it wait to share a commit with other turns'
        # windows) unless staged events ride along, or this actor is about to
        # wait for its writes (``catch_up``): nobody awaits a window otherwise.
        lazy = len(events) == 1 and len(self._inflight) < self.settings.max_inflight_flushes
        future = self.store.append_nowait(events, fencing=self.fencing, lazy=lazy)
        self._inflight.append(future)
        self._window_events[future] = events
        future.add_done_callback(self._window_written, context=self._callback_context)

    def _stop_writing(self, exc: BaseException) -> None:
        self.lost = True
        if self.write_error is None:
            self.write_error = exc

    def _window_written(self, future: asyncio.Future[None]) -> None:
        self._written(self._window_events.pop(future), future)

    def _written(self, events: list[Event], future: asyncio.Future[None]) -> None:
        """A write finished: publish what it made durable, or stop writing."""
        if self._inflight and future in self._inflight:
            self._inflight.remove(future)
        if future.cancelled():
            return
        exc = future.exception()
        if exc is None:
            self._published(events)
            return
        # What is not durable must not be followed by later events (a gap in
        # the log): this actor stops writing; the store refuses its later
        # appends too, and the turn is resumed from what is durable.
        self._stop_writing(exc)
        if isinstance(exc, (LeaseLost, ConcurrencyError)):
            log.warning("turn %s: a write was refused, this actor stops: %s", self.turn_id, exc)
        else:
            log.error("turn %s: a write failed, this actor stops: %s", self.turn_id, exc)

    # -- appending ------------------------------------------------------------------

    async def record(self, *data: EventData, durable: bool = True) -> None:
        """Append events; with ``durable``, in one commit with any staged before
        them, and wait until they are. Each is folded first: an event the state
        machine refuses raises before anything is written."""
        if self.lost:
            raise TurnLost("this actor lost the turn")
        self._flush()
        for item in data:
            event = make_event(self.turn_id, self.view.last_seq + 1, item)
            typed = parse_data(event)  # once, for both folds
            self.view.apply(event, data=typed)
            self.state.apply(event, typed)
            self._staged.append(event)
        if not durable:
            return
        events, self._staged = self._staged, []
        if not events:
            return
        index = None
        for event in events:
            index = index_update(event, self.view) or index
        release = False
        if index is not None and index.status in TERMINAL_STATUSES:
            # The turn ends with this commit: its lease goes with it (one
            # commit less per turn; the supervisor releases it otherwise).
            index = IndexUpdate(status=index.status, view=index.view, release=self.owner)
            release = True
        recorded = events
        if self._start is not None:
            events = await self._first_commit(events)
        # Published from the write's own callback, not after this await: a cancel
        # that lands between the commit and this task's wake-up must not leave a
        # durable event unpublished (in-order publication would then hold back
        # everything after it). Shielded: a cancel does not withdraw the write.
        if events:
            future = self.store.append_nowait(events, fencing=self.fencing, index=index)
            future.add_done_callback(functools.partial(self._written, events))
            try:
                await asyncio.shield(future)
            except (LeaseLost, ConcurrencyError) as exc:
                raise TurnLost(str(exc)) from exc
            if release:
                self.released = True
        for event in recorded:
            if event.type == "background.started" and not self.answered.done():
                self.answered.set_result(None)
            elif event.type == "background.result":
                await self._chat_meta(event)

    async def _first_commit(self, events: list[Event]) -> list[Event]:
        """Create the turn with its first durable events (``turn.started`` first).

        The turn's row is created as running, so events that change its index
        (a failure or a cancel before the model request) are left out: the
        caller appends them with their index update, as any later event.
        Returns those left out."""
        record, self._start = self._start, None
        assert record is not None
        cut = next((i for i, e in enumerate(events) if index_update(e, self.view) is not None), len(events))
        first, rest = events[:cut], events[cut:]
        # A task, so the commit's outcome reaches ``started`` and the bus even
        # if this actor is cancelled while it waits (a drain): shielded below.
        write = self._start_write = self._loop.create_task(self.store.start_turn(record, first, lease_seconds=self.settings.lease_seconds))
        write.add_done_callback(functools.partial(self._started, first))
        try:
            self.fencing = await asyncio.shield(write)
        except Exception as exc:
            # The turn was not created: this actor stops; the caller that
            # started it answers with the error (e.g. the store is down).
            self._stop_writing(exc)
            self._start = record  # nothing in the log to release or resume
            raise TurnLost(f"the turn could not be started: {exc}") from exc
        return rest

    def _started(self, events: list[Event], write: asyncio.Future[int]) -> None:
        """The first commit finished: the turn exists (publish its events), or not."""
        if write.cancelled():  # shutdown
            if not self.started.done():
                self.started.set_exception(NotStarted(f"turn {self.turn_id} was stopped before it started"))
            return
        exc = write.exception()
        if exc is None:
            self.fencing = write.result()
            self._published(events)
            if not self.started.done():
                self.started.set_result(None)
        elif not self.started.done():
            self.started.set_exception(exc)

    async def _chat_meta(self, event: Event) -> None:
        """A title or tags for the chat listing (the log has them already)."""
        task, result = event.data.get("task"), event.data.get("result")
        try:
            if task == "title" and isinstance(result, str):
                await self.store.set_chat_meta(self.view.chat_id or "", title=result)
            elif task == "tags" and isinstance(result, list):
                await self.store.set_chat_meta(self.view.chat_id or "", tags=[str(t) for t in result])
        except Exception:
            log.exception("turn %s: could not update the chat's %s", self.turn_id, task)

    def _published(self, events: list[Event]) -> None:
        """Committed: publish, in seq order, every event whose predecessors are out."""
        for event in events:
            self._committed[event.seq] = event
        while self._next_publish in self._committed:
            committed = self._committed.pop(self._next_publish)
            self._next_publish += 1
            if self._history is not None:
                self._history.append(committed)
                if len(self._history) > HISTORY_LIMIT:
                    self._history = None
            self.bus.publish(self.turn_id, LiveEvent(committed))
