"""The turn projection: a pure fold from events to the turn view (API.md §3).

Replay is running this fold again; ``replay?upto=SEQ`` stops it early. The live
engine folds its own events through the same class, so what a client sees while
the turn runs and what a reader rebuilds later cannot drift apart.

Stream positions: every upstream chunk and every non-delta event gets a position,
strictly increasing within the turn. They are not stored per chunk; the fold
derives them (a ``model.delta`` carries only its first chunk's position and the
chunk lengths). After a resume, positions jump to the new epoch so that nothing
a dead owner handed out live can collide with what the new owner produces.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.events import Event
from engine.machine import TurnMachine
from engine.stream import Accumulator, Piece, merge_usage, normalize_usage

EPOCH_SHIFT = 32


def epoch_base(epoch: int) -> int:
    """First position of an epoch: positions of different epochs never overlap."""
    return epoch << EPOCH_SHIFT


@dataclass(frozen=True)
class ChunkOut:
    """What one upstream chunk contributes to a client's stream."""

    pos: int
    pieces: tuple[Piece, ...]


STATUS_BY_TERMINAL = {"turn.completed": "completed", "turn.cancelled": "cancelled", "turn.failed": "failed"}


class TurnView:
    """Folds one turn's events. ``apply`` returns the chunks a renderer should show."""

    def __init__(self, turn_id: str) -> None:
        self.id = turn_id
        self.machine = TurnMachine()
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
        self.messages: list[dict[str, Any]] = []  # assembled upstream messages
        self.params: dict[str, Any] = {}
        self.history_len = 0
        self.new_messages: list[dict[str, Any]] = []
        self.iteration = 0
        self.model_open = False  # a model.requested without its model.completed
        self.last_seq = 0
        self.last_event_pos = 0  # position of the last durable event or chunk
        self.next_pos = 1
        self.epoch = 0
        self.title: str | None = None
        self.tags: list[str] | None = None
        self.follow_ups: list[str] | None = None
        self._id_counter = 0
        self.acc = self._new_accumulator()
        self.extra_items: list[dict[str, Any]] = []

    # -- ids -----------------------------------------------------------------

    def _item_id(self, prefix: str) -> str:
        # Deterministic in (turn, order of creation): replay reproduces every id.
        self._id_counter += 1
        digest = hashlib.sha256(f"{self.id}:{self._id_counter}".encode()).hexdigest()[:24]
        return f"{prefix}_{digest}"

    def _new_accumulator(self, reasoning_tags: Any = None) -> Accumulator:
        return Accumulator(id_factory=self._item_id, reasoning_tags=reasoning_tags)

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
            tags = params.get("reasoning_tags") if isinstance(params, dict) else None
            if tags is not None:
                self.acc = self._new_accumulator(tags)
        elif t == "assembly.completed":
            self.messages = data["messages"]
            self.params = data.get("params", {})
            self.history_len = data.get("history_len", 0)
            self.new_messages = data.get("new_messages", [])
        elif t == "model.requested":
            self.iteration = data.get("iteration", 0)
            self.model_open = True
        elif t == "model.item":
            self.extra_items.append(data["item"])
        elif t == "model.warning":
            self.warnings.append(data["message"])
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
        elif t == "turn.resumed":
            self.status = "running"
            self.epoch = data["epoch"]
            self.next_pos = epoch_base(self.epoch) + 1
        elif t in STATUS_BY_TERMINAL:
            self.status = STATUS_BY_TERMINAL[t]
            if t == "turn.failed":
                self.error = data["error"]
            if t != "turn.completed":
                out = self._flushed(self.acc.flush())
                self.acc.mark_incomplete()
                self.model_open = False
        return out

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
        return [*self.acc.output, *self.extra_items]

    @property
    def content(self) -> str:
        return self.acc.text

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
            "reasoning_content": self.acc.reasoning_text or None,
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
        if self.title is not None:
            view["title"] = self.title
        if self.tags is not None:
            view["tags"] = self.tags
        if self.follow_ups is not None:
            view["follow_ups"] = self.follow_ups
        return view


def fold(turn_id: str, events: Iterable[Event], upto: int | None = None) -> TurnView:
    """Replay: the view after the events up to ``upto`` (all when None)."""
    view = TurnView(turn_id)
    for event in events:
        if upto is not None and event.seq > upto:
            break
        view.apply(event)
    return view
