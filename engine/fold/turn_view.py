"""The turn view: a pure fold from a turn's events to what clients see (status,
output items, content, usage, sources...).

Replay is running this fold again; ``replay?upto=SEQ`` stops it early. The live
actor folds its own events through the same class, and so does every client
connection (``engine.run.follow``), so what a client sees while the turn runs and
what a reader rebuilds later cannot drift apart. What the agent loop needs to
decide its next step is not here: that is ``engine.run.loop_state``.

Each event type has one handler (``_HANDLERS``); an event type without one is
only checked against the state machine. Events reach the fold upcast to the
current data version (the store's read path does it; see ``engine.events``).

Stream positions: every upstream chunk and every non-delta event gets a
position, strictly increasing within the turn. They are not stored per chunk;
the fold derives them (a ``model.delta`` carries only its first chunk's position
and the chunk lengths). After a resume, positions jump to the new epoch so that
nothing a dead owner handed out live can collide with what the new owner
produces; the ``turn.resumed`` event is the new epoch's first position, and the
view records where the durable answer ended then (``ResumePoint``), for clients
that were shown more than that.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict

from engine.context.assemble import legacy_code_interpreter
from engine.context.unsupported import STEP as UNSUPPORTED_STEP
from engine.context.unsupported import file_warnings, warnings_of
from engine.events import (
    AssemblyCompleted,
    AssemblyStep,
    BackgroundResult,
    ContextReinjected,
    Event,
    EventData,
    EventHandlers,
    IterationLimit,
    ModelCompleted,
    ModelDeltaData,
    ModelItem,
    ModelRequested,
    ModelWarning,
    OutletApplied,
    ToolApproval,
    ToolApprovalRequested,
    ToolCompleted,
    ToolsBatch,
    ToolStarted,
    TurnCancelled,
    TurnFailed,
    TurnFinalized,
    TurnForked,
    TurnInterrupted,
    TurnResumed,
    TurnStarted,
    data_of,
    delta_data,
    parse_data,
)
from engine.fold.accumulator import USAGE_ESTIMATED, Accumulator, Piece, merge_usage, normalize_usage
from engine.fold.output_items import Item, OutputItems, call_id_of
from engine.json_types import JsonObject
from engine.machine import STATUS_AFTER, TurnMachine

EPOCH_SHIFT = 32


class Approval(TypedDict):
    """A call asked for a person's decision, as ``GET /v1/turns/{id}`` lists it."""

    call_id: str
    name: str
    arguments: str
    status: Literal["pending", "approved", "rejected", "cancelled"]
    reason: NotRequired[str]


def epoch_base(epoch: int) -> int:
    """First position of an epoch: positions of different epochs never overlap."""
    return epoch << EPOCH_SHIFT


@dataclass(slots=True)  # immutable by convention (frozen init is 4x slower, per chunk)
class ChunkOut:
    """What one upstream chunk contributes to a client's stream."""

    pos: int
    pieces: tuple[Piece, ...]


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where the durable answer ended when a turn was resumed after its owner died.

    A client that was shown output past ``from_pos`` (in the dead owner's epoch)
    holds text the log never got; the resumed turn re-generates from the durable
    end, so the client must keep only the first ``content_length`` code points of
    the content (``reasoning_length`` of the reasoning) it shows, then append
    what follows (docs/reconnecting.md).

    ``from_pos`` is the last position whose output is durable. It can be one less
    than the ``turn.resumed`` event's own ``from_pos``, which also counts the
    ``turn.interrupted`` record (that record takes the position right after the
    durable end, a position the dead owner may have handed out live).

    ``mode`` ``restart``: the cut-off round's partial answer was superseded, so
    the lengths are where that round started, and a client that was shown
    anything after ``keep_pos`` (the round's start) must drop it. Otherwise
    ``keep_pos`` is ``from_pos``.
    """

    seq: int  # the turn.resumed event
    pos: int  # its stream position: the first of the new epoch
    from_pos: int
    epoch: int
    content_length: int
    reasoning_length: int
    mode: str = "continue"
    keep_pos: int = 0

    def notice(self) -> dict[str, int | str]:
        """The client-facing shape (SSE ``turnlog.resumed``, WebSocket ``resumed``)."""
        return {
            "from_pos": self.from_pos,
            "epoch": self.epoch,
            "content_length": self.content_length,
            "reasoning_length": self.reasoning_length,
            "mode": self.mode,
        }

    def drops(self, last_shown: int) -> bool:
        """Whether a client shown output up to position ``last_shown`` holds
        text that is not part of the answer (it needs the notice)."""
        return last_shown > self.keep_pos


class Positions:
    """The turn's stream-position counter (see the module docstring). Only
    this module moves it: the actor and the followers ``claim`` positions for
    live chunks."""

    __slots__ = ("next", "last_event", "epoch")

    def __init__(self) -> None:
        self.next = 1  # the position the next chunk or event takes
        self.last_event = 0  # position of the last durable event or chunk
        self.epoch = 0

    def claim(self, n: int) -> int:
        """``n`` positions for live chunks (their ``model.delta`` comes later):
        the first of them."""
        at = self.next
        self.next = at + n
        return at

    def take(self) -> int:
        """A position for a non-delta event."""
        self.last_event = self.next
        self.next += 1
        return self.last_event

    def new_epoch(self, epoch: int) -> None:
        """The resume itself takes the first position of the new epoch: above
        anything the dead owner handed out live, so a client whose Last-Event-ID
        is such a position still gets it (and the notice)."""
        self.epoch = epoch
        self.last_event = epoch_base(epoch)
        self.next = self.last_event + 1


class TurnView:
    """Folds one turn's events. ``apply`` returns the chunks a renderer should show.

    The view holds the turn's state; its output items are built by ``out``
    (``engine.fold.output_items``), which the handlers tell what each event
    means for the answer."""

    def __init__(self, turn_id: str, *, enforce: bool = False) -> None:
        self.id = turn_id
        self.machine = TurnMachine(enforce=enforce)
        self.chat_id: str | None = None
        self.user_id: str | None = None
        self.model: str | None = None
        self.stream = True
        self.request: JsonObject = {}  # the client's request body, read all over the adapters
        self.status = "running"
        self.error: JsonObject | None = None
        self.usage: JsonObject | None = None
        # ``usage`` when the answer was final: what the answer's own response
        # reports (background task-model calls after it count in ``usage`` only).
        self.answer_usage: JsonObject | None = None
        self._answered = False
        self.usage_estimated = False  # some of ``usage`` was counted by turnlog, not reported
        self.response_ids: list[str] = []
        self.finish_reason: str | None = None
        self.warnings: list[str] = []
        self.created_at: float | None = None
        self.updated_at: float | None = None
        # A fork (``turn.forked``): the turn it continues and the parent's seq
        # it diverged at.
        self.parent_turn_id: str | None = None
        self.forked_at: int | None = None
        # The messages this turn adds to its chat (the new user message, tool results...).
        self.new_messages: list[JsonObject] = []
        self.history_reset = False  # the chat's history restarts at this turn
        # {"index", "turn_id"}: new_messages[index] is a client's copy of that turn's answer.
        self.turn_refs: list[JsonObject] = []
        self.last_seq = 0
        self.pos = Positions()
        # The last durable position before a ``turn.interrupted`` record (which
        # takes a position of its own), and the latest resume.
        self._durable_before: int = 0
        self.interrupted_after = 0
        self.resume_point: ResumePoint | None = None
        # Where the open round's output begins (its model.requested, or the
        # restart that superseded what it had).
        self._round_pos = 0
        self.title: str | None = None
        self.tags: list[str] | None = None
        self.follow_ups: list[str] | None = None
        self.sources: list[JsonObject] = []
        # Calls the client must run (the turn ended with finish_reason tool_calls).
        self.client_calls: list[JsonObject] = []
        self.out = OutputItems(turn_id)
        # Tool approval: call_id -> {"call_id", "name", "arguments", "status", "reason"?},
        # status pending | approved | rejected | cancelled.
        self.approvals: dict[str, Approval] = {}

    # -- the output's parts the agent loop and the live path read ---------------

    @property
    def acc(self) -> Accumulator:
        """The open round's text fold."""
        return self.out.acc

    @property
    def round_closed(self) -> bool:
        return self.out.round_closed

    @property
    def calls(self) -> dict[str, Item]:
        return self.out.calls

    @property
    def superseded(self) -> list[Item]:
        return self.out.superseded

    @property
    def pending_code(self) -> Item | None:
        return self.out.pending_code

    def round_output(self) -> list[Item]:
        return self.out.round_output()

    # -- the fold --------------------------------------------------------------

    @property
    def state(self) -> str:
        return self.machine.state

    @property
    def terminal(self) -> bool:
        return self.machine.terminal

    @property
    def epoch(self) -> int:
        return self.pos.epoch

    @property
    def next_pos(self) -> int:
        return self.pos.next

    @property
    def last_event_pos(self) -> int:
        return self.pos.last_event

    def apply(self, event: Event, *, live_applied: bool = False, data: EventData | None = None) -> list[ChunkOut]:
        """Fold one event. ``live_applied`` marks a ``model.delta`` whose chunks the
        live engine already fed through ``feed_chunk``. ``data``: the event's
        ``parse_data``, when the caller has it (it folds the event twice)."""
        if event.seq != self.last_seq + 1:
            raise ValueError(f"turn {self.id}: expected seq {self.last_seq + 1}, got {event.seq}")
        self.machine.apply(event.type)
        self.last_seq = event.seq
        self.updated_at = event.at
        if event.type == "model.delta":
            delta = delta_data(event)
            if live_applied:
                self.pos.last_event = delta["pos"] + len(delta["lens"]) - 1
                return []
            return self._fold_delta(delta)
        self._durable_before = self.pos.last_event
        self.pos.take()
        if event.type == "turn.forked" or (event.type == "turn.started" and self.parent_turn_id is None):
            # A fork was created when it was forked, not when its parent started.
            self.created_at = event.at
        handler = _HANDLERS.get(event.type)
        out = (handler(self, data if data is not None else parse_data(event)) or []) if handler is not None else []
        status = STATUS_AFTER.get(event.type)
        if status is not None:
            self.status = status
            if status == "running" and self.machine.state == "awaiting_approval" and self.pending_approvals:
                # A decision (or a resume) while another call of the batch is
                # still undecided: the turn goes on waiting.
                self.status = "waiting"
        return out

    @property
    def pending_approvals(self) -> list[Approval]:
        return [a for a in self.approvals.values() if a["status"] == "pending"]

    # -- handlers, one per event type ------------------------------------------------

    def _on_forked(self, data: TurnForked) -> None:
        self.parent_turn_id = data.parent_turn_id
        self.forked_at = data.at

    def _on_started(self, data: TurnStarted) -> None:
        self.chat_id = data.chat_id
        self.user_id = data.user_id
        self.model = data.model
        self.stream = data.stream
        self.request = data.request
        params = self.request.get("params")
        tags = params.get("reasoning_tags") if isinstance(params, dict) else None
        # The assembly's decision replaces this guess; only logs written before
        # it was recorded go by it, and in those "legacy" still meant native.
        self.out.configure(code_interpreter=legacy_code_interpreter(self.request, legacy_name=False), code_cut=False, reasoning_tags=tags)

    def _on_assembled(self, data: AssemblyCompleted) -> None:
        out = self.out
        decided = data.code_interpreter
        # The assembly decided (the model's mode, the filtered features, an
        # executor configured); nothing has streamed into the answer yet.
        out.configure(code_interpreter=out.code_interpreter if decided is None else decided, code_cut=data.code_cut, reasoning_tags=out.reasoning_tags)
        self.sources.extend(data.sources)
        self.new_messages = data.new_messages
        self.history_reset = data.history_reset
        self.turn_refs = list(data.turn_refs)

    def _on_model_requested(self, data: ModelRequested) -> None:
        if not data.resumed:
            self._round_pos = self.pos.last_event
            self.out.open_round()

    def _on_model_item(self, data: ModelItem) -> None:
        self.out.model_item(data.item)

    def _on_model_warning(self, data: ModelWarning) -> None:
        self.warnings.append(data.message)

    def _on_assembly_step(self, data: AssemblyStep) -> None:
        query_usage = data.detail.get("query_usage")  # a task model call for search queries
        self._add_usage(query_usage if isinstance(query_usage, dict) else None)
        step, detail = data.step, data.detail
        if step == UNSUPPORTED_STEP:
            self.warnings.extend(warnings_of(detail))
        elif step == "files":
            self.warnings.extend(file_warnings(detail))
        elif step == "memory" and detail.get("error"):
            self.warnings.append(f"memories were not used: {detail['error']}")
        elif step == "web_search_queries" and detail.get("query_warning"):
            self.warnings.append(f"web search: {detail['query_warning']}")
        elif step == "legacy_tools" and detail.get("warning"):
            self.warnings.append(str(detail["warning"]))
        elif step == "tool_servers" and isinstance(warnings := detail.get("warnings"), list):  # engine.context.tool_servers: a server not reached
            self.warnings.extend(str(w) for w in warnings)

    def _on_model_completed(self, data: ModelCompleted) -> list[ChunkOut]:
        self.finish_reason = data.finish_reason
        self._add_usage(data.usage)
        if data.response_id:
            self.response_ids.append(data.response_id)
        # Text held back as a possible tag start is released now.
        out = self._flushed(self.out.acc.flush())
        self.out.acc.finish(strip=False)
        self.out.close_round()
        return out

    def _on_tools_batch(self, data: ToolsBatch) -> None:
        self.client_calls = list(data.client_calls)
        self.out.set_status([call_id_of(call) for call in data.calls], "in_progress")

    def _on_tool_started(self, data: ToolStarted) -> None:
        self.out.arguments_ran[data.call_id] = data.arguments

    def _on_tool_completed(self, data: ToolCompleted) -> None:
        self.out.tool_output(data.call_id, data.output, data.status, {"files": data.files, "embeds": data.embeds, "images": data.images})

    def _on_approval_requested(self, data: ToolApprovalRequested) -> None:
        call_id = data.call_id
        self.approvals[call_id] = Approval(call_id=call_id, name=data.name, arguments=data.arguments, status="pending")

    def _on_approval(self, data: ToolApproval) -> None:
        asked = self.approvals.get(data.call_id)
        if asked is not None:
            asked["status"] = "approved" if data.approve else "rejected"
            if data.reason:
                asked["reason"] = data.reason

    def _on_reinjected(self, data: ContextReinjected) -> None:
        self.sources.extend(data.sources)

    def _on_outlet(self, data: OutletApplied) -> None:
        """The outlet filters' version of the answer replaces it."""
        if data.output is not None:
            self.out.replace(data.output, data.content)

    def _on_iteration_limit(self, data: IterationLimit) -> None:
        self.out.set_status([call_id_of(call) for call in data.pending_calls], "incomplete")

    def _on_finalized(self, data: TurnFinalized) -> None:
        # A record without the field (never written so) keeps the last round's.
        if "finish_reason" in data.model_fields_set:
            self.finish_reason = data.finish_reason
        self.answer_usage, self._answered = (dict(self.usage) if self.usage else None), True

    @property
    def reply_usage(self) -> JsonObject | None:
        """The usage an answer's response reports: as of the answer's end."""
        return self.answer_usage if self._answered else self.usage

    def _add_usage(self, usage: JsonObject | None) -> None:
        """A model call's usage into the turn's (answer and task model calls alike)."""
        if usage:
            if usage.get(USAGE_ESTIMATED) is True:
                self.usage_estimated = True
                usage = {k: v for k, v in usage.items() if k != USAGE_ESTIMATED}
            self.usage = merge_usage(self.usage, normalize_usage(usage))

    def _on_background_result(self, data: BackgroundResult) -> None:
        self._add_usage(data.usage)
        task, result = data.task, data.result
        if task == "title" and isinstance(result, str):
            self.title = result
        elif task == "tags" and isinstance(result, list):
            self.tags = [t for t in result if isinstance(t, str)]  # as parse_tags gives them
        elif task == "follow_ups" and isinstance(result, list):
            self.follow_ups = [f for f in result if isinstance(f, str)]

    def _on_interrupted(self, data: TurnInterrupted) -> None:
        self.interrupted_after = self._durable_before

    def _on_resumed(self, data: TurnResumed) -> None:
        # The status is still the one before this event (set after the handler).
        durable = self.interrupted_after if self.status == "interrupted" else self._durable_before
        mode = data.mode  # logs from before restarts: continue (the default)
        keep = durable
        if mode == "restart" and self._supersede():
            keep = min(keep, self._round_pos)
        self.pos.new_epoch(data.epoch)
        if mode == "restart":
            self._round_pos = self.pos.last_event
        self.resume_point = ResumePoint(
            seq=self.last_seq,
            pos=self.pos.last_event,
            from_pos=durable,
            epoch=self.pos.epoch,
            content_length=len(self.content),
            reasoning_length=len(self.reasoning_content),
            mode=mode,
            keep_pos=keep,
        )

    def _supersede(self) -> bool:
        """A restart: the open round's partial output leaves the answer."""
        if self.state != "streaming" or self.out.round_closed:
            return False
        return self.out.supersede()

    def _on_stopped(self, data: TurnCancelled | TurnFailed) -> list[ChunkOut]:
        """``turn.cancelled`` / ``turn.failed``: what was cut off is incomplete."""
        if isinstance(data, TurnFailed):
            self.error = data.error
        for asked in self.pending_approvals:
            asked["status"] = "cancelled"
        return self._flushed(self.out.stop())

    # -- stream positions ---------------------------------------------------------------

    def _flushed(self, pieces: list[Piece]) -> list[ChunkOut]:
        """Pieces released by a non-delta event belong to that event's position."""
        return [ChunkOut(self.pos.last_event, tuple(pieces))] if pieces else []

    def _fold_delta(self, data: ModelDeltaData) -> list[ChunkOut]:
        pos = data["pos"]
        if pos != self.pos.next:
            raise ValueError(f"turn {self.id}: delta at position {pos}, expected {self.pos.next}")
        text = data["text"]
        kind = data.get("kind", "text")
        call_id = data.get("call_id")
        out: list[ChunkOut] = []
        offset = 0
        for n in data["lens"]:
            piece = text[offset : offset + n]
            offset += n
            out.append(ChunkOut(self.pos.next, self.feed_chunk(kind, piece, call_id)))
        self.pos.last_event = self.pos.next - 1
        return out

    def fold_shown(self, kind: str, text: str, call_id: str | None = None) -> None:
        """Fold text whose positions were taken (and whose pieces were shown)
        already: the chunks a follower showed live from the actor's fold."""
        self.out.feed(kind, text, call_id)

    def feed_chunk(self, kind: str, text: str, call_id: str | None = None) -> tuple[Piece, ...]:
        """Take the next stream position for one raw upstream chunk."""
        self.pos.next += 1
        return tuple(self.out.feed(kind, text, call_id))

    # -- queries -----------------------------------------------------------------

    @property
    def output(self) -> list[Item]:
        return self.out.output

    @property
    def content(self) -> str:
        return self.out.content

    @property
    def reasoning_content(self) -> str:
        return self.out.reasoning_content

    def items_touched(self, event: Event) -> list[Item]:
        """Snapshots of the items an (already applied) event created or changed."""
        t = event.type
        if t == "model.item":
            item = data_of(event, ModelItem).item
            return self.out.touched([call_id_of(item)] if item.get("type") == "function_call" else [])
        if t == "model.completed":
            return [dict(call) for call in self.out.unfinished]  # they end, shown ``incomplete``
        if t == "tools.batch":
            return self.out.touched([call_id_of(c) for c in data_of(event, ToolsBatch).calls])
        if t == "tool.completed":
            call_id = data_of(event, ToolCompleted).call_id
            return self.out.touched([call_id], output_of=call_id)
        if t == "turn.iteration_limit":
            return self.out.touched([call_id_of(c) for c in data_of(event, IterationLimit).pending_calls])
        if t in ("turn.cancelled", "turn.failed"):
            return self.out.touched(self.out.stopped_calls)
        return []

    def public(self) -> JsonObject:
        """The turn as ``GET /v1/turns/{id}`` shows it."""
        view: JsonObject = {
            "id": self.id,
            "object": "turn",
            "chat_id": self.chat_id,
            "status": self.status,
            "state": self.state,
            "model": self.model,
            # Lists copied as JSON lists (a JSON list is not a list of objects or of strings).
            "output": [*self.output],
            "content": self.content,
            "reasoning_content": self.reasoning_content or None,
            "finish_reason": self.finish_reason,
            "usage": self.usage,
            "response_ids": [*self.response_ids],
            "error": self.error,
            "warnings": [*self.warnings],
            "seq": self.last_seq,
            "epoch": self.epoch,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }
        if self.usage_estimated:
            view["usage_estimated"] = True
        if self.reply_usage != self.usage:
            view["answer_usage"] = self.reply_usage  # usage also counts the background task-model calls
        if self.parent_turn_id is not None:
            view["parent_turn_id"] = self.parent_turn_id
            view["forked_at"] = self.forked_at
        if self.sources:
            view["sources"] = [*self.sources]
        if self.approvals:
            view["approvals"] = [_approval_json(a) for a in self.approvals.values()]
        if self.title is not None:
            view["title"] = self.title
        if self.tags is not None:
            view["tags"] = [*self.tags]
        if self.follow_ups is not None:
            view["follow_ups"] = [*self.follow_ups]
        return view


def _approval_json(approval: Approval) -> JsonObject:
    out: JsonObject = {"call_id": approval["call_id"], "name": approval["name"], "arguments": approval["arguments"], "status": approval["status"]}
    if "reason" in approval:
        out["reason"] = approval["reason"]
    return out


_HANDLERS: EventHandlers[TurnView, list[ChunkOut] | None] = EventHandlers()
_HANDLERS.on(TurnForked, TurnView._on_forked)
_HANDLERS.on(TurnStarted, TurnView._on_started)
_HANDLERS.on(AssemblyCompleted, TurnView._on_assembled)
_HANDLERS.on(ModelRequested, TurnView._on_model_requested)
_HANDLERS.on(ModelItem, TurnView._on_model_item)
_HANDLERS.on(ModelWarning, TurnView._on_model_warning)
_HANDLERS.on(AssemblyStep, TurnView._on_assembly_step)
_HANDLERS.on(ModelCompleted, TurnView._on_model_completed)
_HANDLERS.on(ToolsBatch, TurnView._on_tools_batch)
_HANDLERS.on(ToolStarted, TurnView._on_tool_started)
_HANDLERS.on(ToolCompleted, TurnView._on_tool_completed)
_HANDLERS.on(IterationLimit, TurnView._on_iteration_limit)
_HANDLERS.on(ContextReinjected, TurnView._on_reinjected)
_HANDLERS.on(OutletApplied, TurnView._on_outlet)
_HANDLERS.on(TurnFinalized, TurnView._on_finalized)
_HANDLERS.on(BackgroundResult, TurnView._on_background_result)
_HANDLERS.on(TurnInterrupted, TurnView._on_interrupted)
_HANDLERS.on(ToolApprovalRequested, TurnView._on_approval_requested)
_HANDLERS.on(ToolApproval, TurnView._on_approval)
_HANDLERS.on(TurnResumed, TurnView._on_resumed)
_HANDLERS.on(TurnCancelled, TurnView._on_stopped)
_HANDLERS.on(TurnFailed, TurnView._on_stopped)


def fold(turn_id: str, events: Iterable[Event], upto: int | None = None, *, enforce: bool = False) -> TurnView:
    """Replay: the view after the events up to ``upto`` (all when None).

    ``enforce``: drive the state machine through ``transitions`` (for a view a
    live actor will continue)."""
    view = TurnView(turn_id, enforce=enforce)
    for event in events:
        if upto is not None and event.seq > upto:
            break
        view.apply(event)
    return view
