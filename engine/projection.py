"""The turn projection: a pure fold from events to the turn view (API.md §3).

Replay is running this fold again; ``replay?upto=SEQ`` stops it early. The live
engine folds its own events through the same class, so what a client sees while
the turn runs and what a reader rebuilds later cannot drift apart.

Stream positions: every upstream chunk and every non-delta event gets a position,
strictly increasing within the turn. They are not stored per chunk; the fold
derives them (a ``model.delta`` carries only its first chunk's position and the
chunk lengths). After a resume, positions jump to the new epoch so that nothing
a dead owner handed out live can collide with what the new owner produces; the
``turn.resumed`` event is the new epoch's first position, and the view records
where the durable answer ended then (``ResumePoint``), for clients that were
shown more than that.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.events import Event
from engine.assembly import legacy_code_interpreter
from engine.machine import TurnMachine
from engine.stream import Accumulator, Piece, merge_usage, normalize_usage
from engine.unsupported import STEP as UNSUPPORTED_STEP, warnings_of

EPOCH_SHIFT = 32


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
    """

    seq: int  # the turn.resumed event
    pos: int  # its stream position: the first of the new epoch
    from_pos: int
    epoch: int
    content_length: int
    reasoning_length: int

    def notice(self) -> dict[str, int]:
        """The client-facing shape (SSE ``turnlog.resumed``, WebSocket ``resumed``)."""
        return {
            "from_pos": self.from_pos,
            "epoch": self.epoch,
            "content_length": self.content_length,
            "reasoning_length": self.reasoning_length,
        }


STATUS_BY_TERMINAL = {"turn.completed": "completed", "turn.cancelled": "cancelled", "turn.failed": "failed"}


class ItemIds:
    """Output item ids, deterministic in (turn, order of creation): a replay
    reproduces every id."""

    __slots__ = ("turn_id", "counter")

    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        self.counter = 0

    def next(self, prefix: str) -> str:
        self.counter += 1
        digest = hashlib.sha256(f"{self.turn_id}:{self.counter}".encode()).hexdigest()[:24]
        return f"{prefix}_{digest}"


class TurnView:
    """Folds one turn's events. ``apply`` returns the chunks a renderer should show."""

    def __init__(self, turn_id: str, *, enforce: bool = False) -> None:
        self.id = turn_id
        self.machine = TurnMachine(enforce=enforce)
        self.chat_id: str | None = None
        self.user_id: str | None = None
        self.model: str | None = None
        self.stream = True
        self.request: dict[str, Any] = {}
        self.status = "running"
        self.error: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None
        self.response_ids: list[str] = []
        self.finish_reason: str | None = None
        self.warnings: list[str] = []
        self.created_at: float | None = None
        self.updated_at: float | None = None
        self.messages: list[dict[str, Any]] = []  # the upstream transcript so far
        self.assembled = False
        self.params: dict[str, Any] = {}
        self.history_len = 0
        self.new_messages: list[dict[str, Any]] = []
        self.history_reset = False  # the chat's history restarts at this turn
        self.turn_refs: list[dict[str, Any]] = []
        self.iteration = 0
        self.model_open = False  # a model.requested without its model.completed
        self.last_seq = 0
        self.last_event_pos = 0  # position of the last durable event or chunk
        self.next_pos = 1
        self.epoch = 0
        # The last durable position before a ``turn.interrupted`` record (which
        # takes a position of its own), and the latest resume.
        self.interrupted_after = 0
        self.resume_point: ResumePoint | None = None
        self.title: str | None = None
        self.tags: list[str] | None = None
        self.follow_ups: list[str] | None = None
        self._ids = ItemIds(turn_id)
        self._reasoning_tags: Any = None
        self.acc = self._new_accumulator()
        self.round_closed = False
        # Output of closed rounds (and tool outputs) in order; the open round's
        # items live in ``acc`` and ``round_calls`` until model.completed.
        self.items: list[dict[str, Any]] = []
        self.round_calls: list[dict[str, Any]] = []
        self.closed_text: list[str] = []
        self.closed_reasoning: list[str] = []
        self.calls: dict[str, dict[str, Any]] = {}
        self.outputs: dict[str, dict[str, Any]] = {}
        self.provider_items: list[dict[str, Any]] = []
        self.tool_specs: list[dict[str, Any]] = []
        self.batch: dict[str, Any] | None = None
        self.last_batch: dict[str, Any] | None = None
        self.batch_started: set[str] = set()
        self.batch_done: set[str] = set()
        self.started_args: dict[str, dict[str, Any]] = {}
        self.tool_events: list[dict[str, Any]] = []
        self.sources: list[dict[str, Any]] = []
        self.limit_hit: dict[str, Any] | None = None
        self.stateful_broken = False
        self.pending_stateful: tuple[str, list[dict[str, Any]]] | None = None
        self.last_api = "chat"
        self.last_round_calls: list[dict[str, Any]] = []
        self.code_items: dict[str, dict[str, Any]] = {}
        self.code_runs = 0
        self.code_interpreter = False  # legacy <code_interpreter> blocks are parsed
        self.round_start = 0  # index in ``items`` where the last closed round begins

    # -- ids -----------------------------------------------------------------

    def _item_id(self, prefix: str) -> str:
        return self._ids.next(prefix)

    def _new_accumulator(self, reasoning_tags: Any = None) -> Accumulator:
        # The accumulator gets the id source, not a method of this view: a
        # view <-> accumulator cycle made every turn's state garbage that only
        # the cyclic GC could free (~60 objects per turn, each collection
        # walking them).
        if getattr(self, "code_interpreter", False):
            return Accumulator(id_factory=self._ids.next, reasoning_tags=reasoning_tags, code_interpreter=True)
        return Accumulator(id_factory=self._ids.next, reasoning_tags=reasoning_tags)

    # -- the fold --------------------------------------------------------------

    @property
    def state(self) -> str:
        return self.machine.state

    def apply(self, event: Event, *, live_applied: bool = False) -> list[ChunkOut]:
        """Fold one event. ``live_applied`` marks a ``model.delta`` whose chunks the
        live engine already fed through ``feed_chunk``."""
        if event.seq != self.last_seq + 1:
            raise ValueError(f"turn {self.id}: expected seq {self.last_seq + 1}, got {event.seq}")
        self.machine.apply(event.type)
        self.last_seq = event.seq
        self.updated_at = event.at
        data = event.data
        out: list[ChunkOut] = []
        t = event.type
        if t == "model.delta":
            if live_applied:
                self.last_event_pos = data["pos"] + len(data["lens"]) - 1
            else:
                out = self._fold_delta(data)
            return out
        before = self.last_event_pos
        self.last_event_pos = self.next_pos
        self.next_pos += 1
        if t == "turn.started":
            self.created_at = event.at
            self.chat_id = data["chat_id"]
            self.user_id = data["user_id"]
            self.model = data["model"]
            self.stream = data.get("stream", True)
            self.request = data["request"]
            params = self.request.get("params") or {}
            params = params if isinstance(params, dict) else {}
            self.code_interpreter = legacy_code_interpreter(self.request)
            tags = params.get("reasoning_tags")
            if tags is not None:
                self._reasoning_tags = tags
            if tags is not None or self.code_interpreter:
                self.acc = self._new_accumulator(self._reasoning_tags)
        elif t == "assembly.completed":
            self.assembled = True
            self.messages = list(data["messages"])
            self.params = data.get("params", {})
            self.history_len = data.get("history_len", 0)
            self.new_messages = data.get("new_messages", [])
            self.history_reset = bool(data.get("history_reset"))
            self.turn_refs = list(data.get("turn_refs") or [])
            self.tool_specs = data.get("tools", [])
        elif t == "model.requested":
            self.iteration = data.get("iteration", 0)
            self.last_api = data.get("api", "chat")
            if not data.get("resumed") and self.round_closed:
                self.acc = self._new_accumulator(self._reasoning_tags)
                self.round_closed = False
            self.model_open = True
        elif t == "model.item":
            item = dict(data["item"])
            if item.get("type") == "function_call":
                self.calls[item["call_id"]] = item
                self.round_calls.append(item)
            else:
                self.provider_items.append(item)
        elif t == "model.warning":
            self.warnings.append(data["message"])
        elif t == "assembly.step" and data.get("step") == UNSUPPORTED_STEP:
            self.warnings.extend(warnings_of(data.get("detail") or {}))
        elif t == "model.fallback":
            self.stateful_broken = True
            self.pending_stateful = None
        elif t == "model.completed":
            self.model_open = False
            self.finish_reason = data.get("finish_reason")
            if data.get("usage"):
                self.usage = merge_usage(self.usage, normalize_usage(data["usage"]))
            if data.get("response_id"):
                self.response_ids.append(data["response_id"])
            # Text held back as a possible tag start is released now.
            out = self._flushed(self.acc.flush())
            self.acc.finish(strip=False)
            self._close_round()
        elif t == "tools.batch":
            self.batch = data
            self.last_batch = data
            self.batch_started = set()
            self.batch_done = set()
            for call in data.get("calls", []):
                item = self.calls.get(call["call_id"])
                if item is not None:
                    item["status"] = "in_progress"
        elif t == "tool.started":
            self.batch_started.add(data["call_id"])
            self.started_args[data["call_id"]] = data
        elif t == "tool.event":
            self.tool_events.append(data)
        elif t == "tool.completed":
            self._tool_completed(data)
        elif t == "context.reinjected":
            self.messages.extend(data.get("messages", []))
            self.iteration = data.get("iteration", self.iteration)
            self.pending_stateful = (
                (data["previous_response_id"], data.get("input_items", [])) if data.get("previous_response_id") else None
            )
            self.batch = None
        elif t == "turn.iteration_limit":
            self.limit_hit = data
            for call in data.get("pending_calls", []):
                item = self.calls.get(call.get("call_id", ""))
                if item is not None:
                    item["status"] = "incomplete"
        elif t == "turn.finalized":
            self.finish_reason = data.get("finish_reason", self.finish_reason)
        elif t == "background.result":
            task, result = data["task"], data.get("result")
            if task == "title" and isinstance(result, str):
                self.title = result
            elif task == "tags" and isinstance(result, list):
                self.tags = result
            elif task == "follow_ups" and isinstance(result, list):
                self.follow_ups = result
        elif t == "turn.interrupted":
            self.status = "interrupted"
            self.interrupted_after = before
        elif t == "turn.resumed":
            durable = self.interrupted_after if self.status == "interrupted" else before
            self.status = "running"
            self.epoch = data["epoch"]
            # The resume itself is the first position of the new epoch: above
            # anything the dead owner handed out live, so a client whose
            # Last-Event-ID is such a position still gets it (and the notice).
            self.last_event_pos = epoch_base(self.epoch)
            self.next_pos = self.last_event_pos + 1
            self.resume_point = ResumePoint(
                seq=event.seq,
                pos=self.last_event_pos,
                from_pos=durable,
                epoch=self.epoch,
                content_length=len(self.content),
                reasoning_length=len(self.reasoning_content),
            )
        elif t in STATUS_BY_TERMINAL:
            self.status = STATUS_BY_TERMINAL[t]
            if t == "turn.failed":
                self.error = data["error"]
            if t != "turn.completed":
                if not self.round_closed:
                    out = self._flushed(self.acc.flush())
                    self.acc.mark_incomplete()
                    self._close_round()
                for item in self.items:
                    # Q21: what was cut off is incomplete, never "completed".
                    if item.get("status") == "in_progress":
                        item["status"] = "incomplete"
                self.model_open = False
        return out

    def _close_round(self) -> None:
        """Move the round's items (text, reasoning, calls) into the turn's output."""
        self.round_start = len(self.items)
        self.last_round_calls = list(self.round_calls)
        produced = self.acc.output
        if self.round_calls:
            # A round that only called tools has no answer slot to keep.
            produced = [i for i in produced if not (i.get("type") == "message" and not _item_text(i))]
        self.items.extend(produced)
        self.items.extend(self.round_calls)
        for item in produced:
            if item.get("type") == "code_interpreter":
                self.code_items[item["id"]] = item
        self.closed_text.append(self.acc.text)
        self.closed_reasoning.append(self.acc.reasoning_text)
        self.round_calls = []
        self.round_closed = True

    def _tool_completed(self, data: dict[str, Any]) -> None:
        call_id = data["call_id"]
        self.batch_done.add(call_id)
        code = self.code_items.get(call_id)
        if code is not None:
            # A legacy code block's result lives on the block itself.
            try:
                code["output"] = json.loads(data.get("output") or "null")
            except ValueError:
                code["output"] = data.get("output")
            self.code_runs += 1
            return
        status = data.get("status", "completed")
        item = self.calls.get(call_id)
        if item is not None:
            item["status"] = status
            started = self.started_args.get(call_id)
            if started is not None:
                # Q22: what is replayed to the model is exactly what ran.
                item["arguments_ran"] = started["arguments"]
        output: dict[str, Any] = {
            "type": "function_call_output",
            "id": self._item_id("fco"),
            "call_id": call_id,
            "output": data.get("output"),
            "status": status,
        }
        for key in ("files", "embeds", "images"):
            if data.get(key):
                output[key] = data[key]
        self.items.append(output)
        self.outputs[call_id] = output
        for source in data.get("sources") or []:
            self.sources.append(source)

    def _flushed(self, pieces: list[Piece]) -> list[ChunkOut]:
        """Pieces released by a non-delta event belong to that event's position."""
        return [ChunkOut(self.last_event_pos, tuple(pieces))] if pieces else []

    def _fold_delta(self, data: dict[str, Any]) -> list[ChunkOut]:
        pos = data["pos"]
        if pos != self.next_pos:
            raise ValueError(f"turn {self.id}: delta at position {pos}, expected {self.next_pos}")
        text = data["text"]
        kind = data.get("kind", "text")
        out: list[ChunkOut] = []
        offset = 0
        for n in data["lens"]:
            piece = text[offset : offset + n]
            offset += n
            out.append(ChunkOut(self.next_pos, self.feed_chunk(kind, piece)))
        self.last_event_pos = self.next_pos - 1
        return out

    def feed_chunk(self, kind: str, text: str) -> tuple[Piece, ...]:
        """Take the next stream position for one raw upstream chunk."""
        self.next_pos += 1
        if kind == "reasoning":
            return tuple(self.acc.feed_reasoning(text))
        return tuple(self.acc.feed_text(text))

    # -- views -----------------------------------------------------------------

    @property
    def output(self) -> list[dict[str, Any]]:
        if self.round_closed:
            return self.items
        return [*self.items, *self.acc.output, *self.round_calls]

    @property
    def content(self) -> str:
        if self.round_closed:
            return "".join(self.closed_text)
        return "".join(self.closed_text) + self.acc.text

    @property
    def reasoning_content(self) -> str:
        if self.round_closed:
            return "".join(self.closed_reasoning)
        return "".join(self.closed_reasoning) + self.acc.reasoning_text

    @property
    def client_tool_names(self) -> set[str]:
        """Tools the client declared in the plain OpenAI ``tools`` field."""
        names = set()
        for tool in self.request.get("tools") or []:
            fn = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                names.add(fn["name"])
        return names

    def items_touched(self, event: Event) -> list[dict[str, Any]]:
        """Snapshots of the items an (already applied) event created or changed."""
        data = event.data
        t = event.type
        ids: list[str] = []
        if t == "model.item" and data["item"].get("type") == "function_call":
            ids = [data["item"]["call_id"]]
        elif t == "tools.batch":
            ids = [c["call_id"] for c in data.get("calls", [])]
        elif t == "tool.completed":
            ids = [data["call_id"]]
        elif t == "turn.iteration_limit":
            ids = [c["call_id"] for c in data.get("pending_calls", [])]
        out = [dict(self.calls[i]) for i in ids if i in self.calls]
        if t == "tool.completed" and data["call_id"] in self.outputs:
            out.append(dict(self.outputs[data["call_id"]]))
        return out

    @property
    def pending_code(self) -> dict[str, Any] | None:
        """The last round's final item, if it is a code block that has not run."""
        if not self.round_closed or len(self.items) <= self.round_start:
            return None
        last = self.items[-1]
        if last.get("type") == "code_interpreter" and last.get("output") is None and last.get("status") == "completed":
            return last
        return None

    def round_items_with_outputs(self) -> list[dict[str, Any]]:
        """The last round's items and the tool outputs that answered it."""
        return list(self.items[self.round_start :])

    @property
    def client_calls(self) -> list[dict[str, Any]]:
        """Calls the client must run (the turn ended with finish_reason tool_calls)."""
        if self.last_batch is None:
            return []
        return list(self.last_batch.get("client_calls", []))

    def public(self) -> dict[str, Any]:
        """The turn as API.md §3 shows it."""
        view: dict[str, Any] = {
            "id": self.id,
            "object": "turn",
            "chat_id": self.chat_id,
            "status": self.status,
            "state": self.state,
            "model": self.model,
            "output": self.output,
            "content": self.content,
            "reasoning_content": self.reasoning_content or None,
            "finish_reason": self.finish_reason,
            "usage": self.usage,
            "response_ids": self.response_ids,
            "error": self.error,
            "warnings": self.warnings,
            "seq": self.last_seq,
            "epoch": self.epoch,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }
        if self.sources:
            view["sources"] = self.sources
        if self.title is not None:
            view["title"] = self.title
        if self.tags is not None:
            view["tags"] = self.tags
        if self.follow_ups is not None:
            view["follow_ups"] = self.follow_ups
        return view


def _item_text(item: dict[str, Any]) -> str:
    return "".join(part.get("text") or "" for part in item.get("content") or [] if isinstance(part, dict))


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
