"""The turn actor: one asyncio task per running turn.

A run is an explicit sequence of nodes chosen from the folded state
(assemble → request the model → stream → finalize → complete); every node's
effect is an appended event, and the next node is chosen from the view again, so
a resumed turn picks up exactly where its log ends.

Durability rules:
* state events are durable before the engine acts on them (``record`` awaits the
  commit: ``model.requested`` is committed before the request goes out);
* token deltas are published at once and written in batches (group commit):
  every ``flush_interval`` seconds, every ``flush_max_chunks`` chunks, or before
  the next non-delta event;
* cancellation is shielded: the partial output is committed as ``cancelled``
  before the cancel is acknowledged.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from engine.events import (
    TERMINAL_TYPES,
    Event,
    EventData,
    TurnCancelled,
    TurnCancelRequested,
    TurnCompleted,
    TurnFailed,
    TurnResumed,
    delta_event,
    make_event,
)
from engine.live import LiveDelta, LiveEvent, LiveRequest
from engine.ports import (
    ConcurrencyError,
    EventStore,
    IndexUpdate,
    LeaseLost,
    LiveBus,
    ModelCatalog,
    NoCodeExecutor,
)
from engine.projection import TurnView
from engine.upstream import LiveModelClient, ModelClient

log = logging.getLogger("turnlog.turn")

STATUS_EVENTS = {
    "turn.completed": "completed",
    "turn.cancelled": "cancelled",
    "turn.failed": "failed",
    "turn.interrupted": "interrupted",
    "turn.resumed": "running",
}


@dataclass(frozen=True)
class EngineConfig:
    owner: str
    lease_seconds: float = 10.0
    flush_interval: float = 0.05
    flush_max_chunks: int = 512
    max_inflight_flushes: int = 4
    max_tool_call_iterations: int = 256
    tool_timeout: float = 60.0
    direct_tool_timeout: float = 60.0
    responses_stateful: bool = False
    # Event payload strings above this size are stored as blobs and referenced.
    inline_limit: int = 64 * 1024


class TurnLost(Exception):
    """This actor may no longer write the turn (lease lost, or a log conflict)."""


# Events a live actor keeps for followers that join early (see TurnActor.history).
HISTORY_LIMIT = 16


class TurnActor:
    def __init__(
        self,
        *,
        view: TurnView,
        fencing: int,
        store: EventStore,
        bus: LiveBus,
        models: ModelCatalog,
        config: EngineConfig,
        tool_handles: dict[str, Any] | None = None,
        model_client: ModelClient | None = None,
        blobs: Any = None,
        history: list[Event] | None = None,
    ) -> None:
        self.view = view
        self.tool_handles: dict[str, Any] = dict(tool_handles or {})
        self.model_client: ModelClient = model_client or LiveModelClient()
        # Side-effect ports of the nodes; ``verify`` replaces them with recorded results.
        from engine import loop

        self.tool_runner: Any = loop.LiveToolRunner()
        self.code_runner: Any = NoCodeExecutor()
        self.assembler: Any = loop.live_assembly
        self.blobs = blobs
        self._client_waits: dict[str, asyncio.Future[Any]] = {}
        self.turn_id = view.id
        self.fencing = fencing
        self.store = store
        self.bus = bus
        self.models = models
        self.config = config
        self.task: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        # Delta batch (group commit window): the chunks as published, so that a
        # subscriber joining mid-window gets them exactly as the others did.
        self._batch: list[LiveDelta] = []
        self._batch_kind = "text"
        self._batch_pos = 0
        self._batch_seq = 0
        self._timer: asyncio.TimerHandle | None = None
        self._inflight: deque[asyncio.Future[None]] = deque()
        # In-order publication of committed events.
        self._next_publish = view.last_seq + 1
        self._committed: dict[int, Event] = {}
        # Every committed event of the turn while there are few (``history``: the
        # events ``view`` was folded from), so that a follower joining early —
        # the client that started the turn — starts without reading the log.
        self._history: list[Event] | None = list(history) if history is not None else None
        if self._history is not None and (
            len(self._history) != view.last_seq or any(e.seq != i for i, e in enumerate(self._history, 1))
        ):
            self._history = None
        self._cancel_by: str | None = None
        self._cancel_done: asyncio.Future[None] = self._loop.create_future()
        self.done: asyncio.Future[None] = self._loop.create_future()
        self._lost = False

    # -- lifecycle -------------------------------------------------------------

    def start(self, *, resume: bool = False) -> None:
        self.task = asyncio.create_task(self._main(resume), name=f"turn:{self.turn_id}")

    async def cancel(self, by: str | None = None) -> None:
        """Stop the turn; returns once ``turn.cancelled`` is durable."""
        if self.task is None or self.task.done():
            return
        if self._cancel_by is None:
            self._cancel_by = by or "client"
            self.task.cancel()
        await asyncio.shield(self._cancel_done)

    def history(self) -> list[Event] | None:
        """The committed (and published) events so far, or None once there are
        more than ``HISTORY_LIMIT``; taken with a subscription, it replaces a
        read of the log."""
        return list(self._history) if self._history is not None else None

    def open_batch(self) -> list[LiveDelta]:
        """The chunks already shown live but not yet sealed into an event.

        A subscriber that joins mid-window takes these together with its
        subscription (no await in between), so it misses nothing."""
        return list(self._batch)

    async def _main(self, resume: bool) -> None:
        try:
            if resume:
                await self.record(
                    TurnResumed(
                        from_seq=self.view.last_seq,
                        from_pos=self.view.last_event_pos,
                        epoch=self.view.epoch + 1,
                        owner=self.config.owner,
                    )
                )
            await self._drive()
        except asyncio.CancelledError:
            if self._cancel_by is None:
                raise  # shutdown: the turn stays running and is resumed later
            await asyncio.shield(self._save_cancelled())
        except TurnLost as exc:
            log.warning("turn %s: stopped writing: %s", self.turn_id, exc)
        except Exception as exc:  # a bug must still end the turn with a record
            log.exception("turn %s: internal error", self.turn_id)
            try:
                await self.fail({"message": f"internal error: {exc}", "type": "internal_error"})
            except Exception:
                log.exception("turn %s: could not record the failure", self.turn_id)
        finally:
            self._cancel_timer()
            if not self._cancel_done.done():
                self._cancel_done.set_result(None)
            if not self.done.done():
                self.done.set_result(None)

    async def _save_cancelled(self) -> None:
        try:
            await self.record(TurnCancelRequested(by=self._cancel_by))
            await self.record(TurnCancelled())
        except (TurnLost, Exception):
            log.exception("turn %s: could not save the cancellation", self.turn_id)
        finally:
            if not self._cancel_done.done():
                self._cancel_done.set_result(None)

    # -- the nodes ----------------------------------------------------------------

    async def _drive(self) -> None:
        from engine import loop

        v = self.view
        while not v.machine.terminal:
            state = v.state
            if state == "assembling":
                steps = [] if v.assembled else await loop.assemble_node(self)
                await loop.call_model_node(self, resume=False, preceding=steps)
            elif state == "streaming":
                if v.model_open:
                    await loop.call_model_node(self, resume=True)
                else:
                    await loop.after_model_node(self)
            elif state == "executing_tools":
                await loop.run_tools_node(self)
            elif state == "reinjecting":
                await loop.call_model_node(self, resume=False)
            elif state in ("finalizing", "outlet", "background"):
                await self.record(TurnCompleted())

    async def fail(self, error: dict[str, Any]) -> None:
        if self.view.machine.terminal or self._lost:
            return
        await self.record(TurnFailed(error={k: v for k, v in error.items() if v is not None}))

    def writes_behind(self) -> bool:
        """Whether ``backpressure`` would wait (checked per chunk, without a coroutine)."""
        return len(self._inflight) > self.config.max_inflight_flushes

    async def backpressure(self) -> None:
        """Let the writer catch up when delta batches pile up."""
        if self.writes_behind():
            oldest = self._inflight[0]
            await asyncio.wait((oldest,))
            if self._lost:
                raise TurnLost("this actor lost the turn")
            if not oldest.cancelled() and oldest.exception() is not None:
                raise oldest.exception()  # type: ignore[misc]

    async def externalize(self, payload: Any) -> Any:
        """Large strings in a payload go to the blob store; the event keeps a reference."""
        if self.blobs is None:
            return payload
        return await self.blobs.externalize(payload, limit=self.config.inline_limit)

    # -- direct tools (run by the client over the WebSocket) -------------------------

    async def ask_client(self, call_id: str, name: str, arguments: dict[str, Any], timeout: float) -> Any:
        """Send ``execute:tool`` to the turn's WebSocket clients and wait for a result."""
        if not self.bus.has_client(self.turn_id):  # type: ignore[attr-defined]
            return {"error": f"no client is connected to run the direct tool {name}"}
        future: asyncio.Future[Any] = self._loop.create_future()
        self._client_waits[call_id] = future
        self.bus.publish(
            self.turn_id,
            LiveRequest(
                {"type": "execute:tool", "turn_id": self.turn_id, "call_id": call_id, "name": name, "arguments": arguments}
            ),
        )
        try:
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            return {"error": f"the client did not answer the direct tool {name} within {timeout:g} s"}
        finally:
            self._client_waits.pop(call_id, None)

    def deliver(self, call_id: str, result: Any) -> bool:
        future = self._client_waits.get(call_id)
        if future is None or future.done():
            return False
        future.set_result(result)
        return True

    # -- deltas and group commit ---------------------------------------------------

    def chunk(self, kind: str, text: str) -> None:
        """The per-token hot path: show the chunk now, write it with its window."""
        if self._batch and kind != self._batch_kind:
            self._flush()
        v = self.view
        if not self._batch:
            self._batch_kind = kind
            self._batch_pos = v.next_pos
            self._batch_seq = v.last_seq + 1
            self._timer = self._loop.call_later(self.config.flush_interval, self._flush)
        pos = v.next_pos
        delta = LiveDelta(self._batch_seq, pos, kind, text, v.feed_chunk(kind, text))
        self._batch.append(delta)
        self.bus.publish(self.turn_id, delta)
        if len(self._batch) >= self.config.flush_max_chunks:
            self._flush()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _flush(self) -> None:
        """Seal the open batch as one ``model.delta`` event and start writing it."""
        self._cancel_timer()
        if not self._batch or self._lost:
            return
        texts = [delta.text for delta in self._batch]
        self._batch = []
        event = delta_event(self.turn_id, self._batch_seq, self._batch_kind, self._batch_pos, texts)
        self.view.apply(event, live_applied=True)
        # No task per window: the store's future, and the bookkeeping in its
        # callback (a window is sealed ~20 times a second per streaming turn).
        future = self.store.append_nowait([event], fencing=self.fencing)
        self._inflight.append(future)
        future.add_done_callback(functools.partial(self._flush_done, [event]))

    def _flush_done(self, events: list[Event], future: asyncio.Future[None]) -> None:
        try:
            self._inflight.remove(future)
        except ValueError:
            pass
        if future.cancelled():
            return
        exc = future.exception()
        if exc is None:
            self._published(events)
            return
        # A window that is not durable must not be followed by later ones (a gap
        # in the log): this actor stops writing; the store refuses its later
        # appends too, and the turn is resumed from what is durable.
        self._lost = True
        if isinstance(exc, (LeaseLost, ConcurrencyError)):
            log.warning("turn %s: delta batch refused, this actor stops: %s", self.turn_id, exc)
        else:
            log.error("turn %s: delta batch not written, this actor stops: %s", self.turn_id, exc)

    # -- appending ------------------------------------------------------------------

    async def record(self, data: EventData) -> Event:
        """Append one event and wait until it is durable."""
        if self._lost:
            raise TurnLost("this actor lost the turn")
        self._flush()
        event = make_event(self.turn_id, self.view.last_seq + 1, data)
        self.view.apply(event)  # raises IllegalTransition before anything is written
        index = None
        status = STATUS_EVENTS.get(event.type)
        if status is not None:
            index = IndexUpdate(
                status=status,
                view=self.view.public() if event.type in TERMINAL_TYPES else None,
            )
        await self._persist(event, index)
        return event

    async def record_many(self, datas: list[EventData]) -> list[Event]:
        """Append several events in one commit (e.g. every ``tool.started`` of a batch)."""
        if self._lost:
            raise TurnLost("this actor lost the turn")
        self._flush()
        events = []
        for data in datas:
            event = make_event(self.turn_id, self.view.last_seq + 1, data)
            self.view.apply(event)
            events.append(event)
        await self._persist_many(events)
        return events

    async def _persist(self, event: Event, index: IndexUpdate | None) -> None:
        await self._persist_many([event], index)

    async def _persist_many(self, events: list[Event], index: IndexUpdate | None = None) -> None:
        try:
            await self.store.append(events, fencing=self.fencing, index=index)
        except (LeaseLost, ConcurrencyError) as exc:
            self._lost = True
            raise TurnLost(str(exc)) from exc
        self._published(events)

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
