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

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from engine.context.assemble import legacy_code_interpreter
from engine.context.unsupported import STEP as UNSUPPORTED_STEP
from engine.context.unsupported import file_warnings, warnings_of
from engine.events import Event
from engine.fold.accumulator import USAGE_ESTIMATED, Accumulator, Piece, merge_usage, normalize_usage
from engine.machine import STATUS_AFTER, TurnMachine
from engine.protocols.responses import has_provider_reasoning, responses_reasoning_item

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


class Positions:
    """The turn's stream-position counter (see the module docstring)."""

    __slots__ = ("next", "last_event", "epoch")

    def __init__(self) -> None:
        self.next = 1  # the position the next chunk or event takes
        self.last_event = 0  # position of the last durable event or chunk
        self.epoch = 0

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


Handler = Callable[["TurnView", dict[str, Any]], list[ChunkOut] | None]


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
        self.new_messages: list[dict[str, Any]] = []
        self.history_reset = False  # the chat's history restarts at this turn
        # {"index", "turn_id"}: new_messages[index] is a client's copy of that turn's answer.
        self.turn_refs: list[dict[str, Any]] = []
        self.last_seq = 0
        self.pos = Positions()
        # The last durable position before a ``turn.interrupted`` record (which
        # takes a position of its own), and the latest resume.
        self._durable_before: int = 0
        self.interrupted_after = 0
        self.resume_point: ResumePoint | None = None
        # Where the open round's output begins (its model.requested, or the
        # restart that superseded what it had), and the output items restarts
        # superseded (kept out of ``output``; their text stays in the log).
        self._round_pos = 0
        self.superseded: list[dict[str, Any]] = []
        self.title: str | None = None
        self.tags: list[str] | None = None
        self.follow_ups: list[str] | None = None
        self.sources: list[dict[str, Any]] = []
        # Calls the client must run (the turn ended with finish_reason tool_calls).
        self.client_calls: list[dict[str, Any]] = []
        self._ids = ItemIds(turn_id)
        self._reasoning_tags: Any = None
        self.code_interpreter = False  # legacy <code_interpreter> blocks are parsed
        self.code_cut = False  # ... and an answer ends at a block's closing tag
        self.acc = self._new_accumulator()
        # Output of closed rounds (and tool outputs) in order; the open round's
        # items live in ``acc`` and ``round_calls`` until model.completed.
        self.round_closed = False
        self.items: list[dict[str, Any]] = []
        self.round_calls: list[dict[str, Any]] = []
        self.round_start = 0  # index in ``items`` where the last closed round begins
        self.closed_text: list[str] = []
        self.closed_reasoning: list[str] = []
        self.calls: dict[str, dict[str, Any]] = {}
        self.outputs: dict[str, dict[str, Any]] = {}
        self.code_items: dict[str, dict[str, Any]] = {}
        self._arguments_ran: dict[str, str] = {}
        self._stopped_calls: list[str] = []  # calls a cancel or a failure left incomplete
        # Tool approval: call_id -> {"call_id", "name", "arguments", "status", "reason"?},
        # status pending | approved | rejected | cancelled.
        self.approvals: dict[str, dict[str, Any]] = {}

    def _new_accumulator(self) -> Accumulator:
        # The accumulator gets the id source, not a method of this view: a
        # view <-> accumulator cycle made every turn's state garbage that only
        # the cyclic GC could free (~60 objects per turn, each collection
        # walking them).
        return Accumulator(
            id_factory=self._ids.next,
            reasoning_tags=self._reasoning_tags,
            code_interpreter=self.code_interpreter,
            stop_after_code=self.code_cut,
        )

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

    def apply(self, event: Event, *, live_applied: bool = False) -> list[ChunkOut]:
        """Fold one event. ``live_applied`` marks a ``model.delta`` whose chunks the
        live engine already fed through ``feed_chunk``."""
        if event.seq != self.last_seq + 1:
            raise ValueError(f"turn {self.id}: expected seq {self.last_seq + 1}, got {event.seq}")
        self.machine.apply(event.type)
        self.last_seq = event.seq
        self.updated_at = event.at
        data = event.data
        if event.type == "model.delta":
            if live_applied:
                self.pos.last_event = data["pos"] + len(data["lens"]) - 1
                return []
            return self._fold_delta(data)
        self._durable_before = self.pos.last_event
        self.pos.take()
        if event.type == "turn.forked" or (event.type == "turn.started" and self.parent_turn_id is None):
            # A fork was created when it was forked, not when its parent started.
            self.created_at = event.at
        handler = _HANDLERS.get(event.type)
        out = (handler(self, data) or []) if handler is not None else []
        status = STATUS_AFTER.get(event.type)
        if status is not None:
            self.status = status
            if status == "running" and self.machine.state == "awaiting_approval" and self.pending_approvals:
                # A decision (or a resume) while another call of the batch is
                # still undecided: the turn goes on waiting.
                self.status = "waiting"
        return out

    @property
    def pending_approvals(self) -> list[dict[str, Any]]:
        return [a for a in self.approvals.values() if a["status"] == "pending"]

    # -- handlers, one per event type ------------------------------------------------

    def _on_forked(self, data: dict[str, Any]) -> None:
        self.parent_turn_id = data["parent_turn_id"]
        self.forked_at = data["at"]

    def _on_started(self, data: dict[str, Any]) -> None:
        self.chat_id = data["chat_id"]
        self.user_id = data["user_id"]
        self.model = data["model"]
        self.stream = data.get("stream", True)
        self.request = data["request"]
        params = self.request.get("params")
        tags = params.get("reasoning_tags") if isinstance(params, dict) else None
        # The assembly's decision replaces this guess; only logs written before
        # it was recorded go by it, and in those "legacy" still meant native.
        self.code_interpreter = legacy_code_interpreter(self.request, legacy_name=False)
        if tags is not None or self.code_interpreter:
            self._reasoning_tags = tags
            self.acc = self._new_accumulator()

    def _on_assembled(self, data: dict[str, Any]) -> None:
        decided = data.get("code_interpreter")
        code = self.code_interpreter if decided is None else bool(decided)
        cut = bool(data.get("code_cut"))
        if (code, cut) != (self.code_interpreter, self.code_cut):
            # The assembly decided (the model's mode, the filtered features, an
            # executor configured); nothing has streamed into the accumulator yet.
            self.code_interpreter, self.code_cut = code, cut
            self.acc = self._new_accumulator()
        self.sources.extend(data.get("sources") or [])
        self.new_messages = data.get("new_messages", [])
        self.history_reset = bool(data.get("history_reset"))
        self.turn_refs = list(data.get("turn_refs") or [])

    def _on_model_requested(self, data: dict[str, Any]) -> None:
        if not data.get("resumed"):
            self._round_pos = self.pos.last_event
            if self.round_closed:
                self.acc = self._new_accumulator()
                self.round_closed = False

    def _on_model_item(self, data: dict[str, Any]) -> None:
        item = dict(data["item"])
        if item.get("type") == "function_call":
            self.calls[item["call_id"]] = item
            self.round_calls.append(item)
        elif item.get("type") == "reasoning" and has_provider_reasoning(item):
            # The provider's own reasoning item (its id, its encrypted
            # content) goes with the reasoning the stream showed, so that a
            # Responses API upstream gets it back in continuations.
            for mine in reversed(self.acc.output):
                if mine.get("type") == "reasoning":
                    mine.setdefault("provider_item", responses_reasoning_item(item))
                    break

    def _on_model_warning(self, data: dict[str, Any]) -> None:
        self.warnings.append(data["message"])

    def _on_assembly_step(self, data: dict[str, Any]) -> None:
        self._add_usage((data.get("detail") or {}).get("query_usage"))  # a task model call for search queries
        step = data.get("step")
        if step == UNSUPPORTED_STEP:
            self.warnings.extend(warnings_of(data.get("detail") or {}))
        elif step == "files":
            self.warnings.extend(file_warnings(data.get("detail") or {}))
        elif step == "memory" and (data.get("detail") or {}).get("error"):
            self.warnings.append(f"memories were not used: {data['detail']['error']}")
        elif step == "web_search_queries" and (data.get("detail") or {}).get("query_warning"):
            self.warnings.append(f"web search: {data['detail']['query_warning']}")
        elif step == "legacy_tools" and (data.get("detail") or {}).get("warning"):
            self.warnings.append(str(data["detail"]["warning"]))
        elif step == "tool_servers":  # engine.context.tool_servers: a server not reached
            self.warnings.extend(str(w) for w in (data.get("detail") or {}).get("warnings") or [])

    def _on_model_completed(self, data: dict[str, Any]) -> list[ChunkOut]:
        self.finish_reason = data.get("finish_reason")
        self._add_usage(data.get("usage"))
        if data.get("response_id"):
            self.response_ids.append(data["response_id"])
        # Text held back as a possible tag start is released now.
        out = self._flushed(self.acc.flush())
        self.acc.finish(strip=False)
        self._close_round()
        return out

    def _on_tools_batch(self, data: dict[str, Any]) -> None:
        self.client_calls = list(data.get("client_calls", []))
        for call in data.get("calls", []):
            item = self.calls.get(call["call_id"])
            if item is not None:
                item["status"] = "in_progress"

    def _on_tool_started(self, data: dict[str, Any]) -> None:
        self._arguments_ran[data["call_id"]] = data["arguments"]

    def _on_tool_completed(self, data: dict[str, Any]) -> None:
        call_id = data["call_id"]
        code = self.code_items.get(call_id)
        if code is not None:
            # A legacy code block's result lives on the block itself.
            try:
                code["output"] = json.loads(data.get("output") or "null")
            except ValueError:
                code["output"] = data.get("output")
            return
        status = data.get("status", "completed")
        item = self.calls.get(call_id)
        if item is not None:
            item["status"] = status
            ran = self._arguments_ran.get(call_id)
            if ran is not None:
                # What is replayed to the model is exactly what ran (Open WebUI
                # replayed the model's raw, possibly broken, arguments).
                item["arguments_ran"] = ran
        output: dict[str, Any] = {
            "type": "function_call_output",
            "id": self._ids.next("fco"),
            "call_id": call_id,
            "output": data.get("output"),
            "status": status,
        }
        for key in ("files", "embeds", "images"):
            if data.get(key):
                output[key] = data[key]
        self.items.append(output)
        self.outputs[call_id] = output

    def _on_approval_requested(self, data: dict[str, Any]) -> None:
        call_id = data["call_id"]
        self.approvals[call_id] = {"call_id": call_id, "name": data["name"], "arguments": data["arguments"], "status": "pending"}

    def _on_approval(self, data: dict[str, Any]) -> None:
        asked = self.approvals.get(data["call_id"])
        if asked is not None:
            asked["status"] = "approved" if data.get("approve") else "rejected"
            if data.get("reason"):
                asked["reason"] = data["reason"]

    def _on_reinjected(self, data: dict[str, Any]) -> None:
        self.sources.extend(data.get("sources") or [])

    def _on_outlet(self, data: dict[str, Any]) -> None:
        """The outlet filters' version of the answer replaces it."""
        output = data.get("output")
        if output is not None:
            self.items = [dict(i) for i in output]
            self.closed_text = [data.get("content") or ""]

    def _on_iteration_limit(self, data: dict[str, Any]) -> None:
        for call in data.get("pending_calls", []):
            item = self.calls.get(call.get("call_id", ""))
            if item is not None:
                item["status"] = "incomplete"

    def _on_finalized(self, data: dict[str, Any]) -> None:
        self.finish_reason = data.get("finish_reason", self.finish_reason)

    def _add_usage(self, usage: dict[str, Any] | None) -> None:
        """A model call's usage into the turn's (answer and task model calls alike)."""
        if usage:
            if usage.get(USAGE_ESTIMATED) is True:
                self.usage_estimated = True
                usage = {k: v for k, v in usage.items() if k != USAGE_ESTIMATED}
            self.usage = merge_usage(self.usage, normalize_usage(usage))

    def _on_background_result(self, data: dict[str, Any]) -> None:
        self._add_usage(data.get("usage"))
        task, result = data["task"], data.get("result")
        if task == "title" and isinstance(result, str):
            self.title = result
        elif task == "tags" and isinstance(result, list):
            self.tags = result
        elif task == "follow_ups" and isinstance(result, list):
            self.follow_ups = result

    def _on_interrupted(self, data: dict[str, Any]) -> None:
        self.interrupted_after = self._durable_before

    def _on_resumed(self, data: dict[str, Any]) -> None:
        # The status is still the one before this event (set after the handler).
        durable = self.interrupted_after if self.status == "interrupted" else self._durable_before
        mode = data.get("mode") or "continue"  # logs from before restarts: continue
        keep = durable
        if mode == "restart" and self._supersede():
            keep = min(keep, self._round_pos)
        self.pos.new_epoch(data["epoch"])
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
        """A restart: the open round's partial output leaves the answer (the
        model answers that round afresh). Returns whether there was any."""
        if self.state != "streaming" or self.round_closed:
            return False
        self.acc.mark_incomplete()
        dropped = [dict(i) for i in (*self.acc.output, *self.round_calls)]
        dropped = [i for i in dropped if i.get("type") != "message" or _item_text(i)]
        for item in dropped:
            item["status"] = "incomplete"
            if item.get("type") == "function_call":
                self.calls.pop(item["call_id"], None)
        self.superseded.extend(dropped)
        self.acc = self._new_accumulator()
        self.round_calls = []
        return bool(dropped)

    def _on_stopped(self, data: dict[str, Any]) -> list[ChunkOut]:
        """``turn.cancelled`` / ``turn.failed``: what was cut off is incomplete."""
        if "error" in data:
            self.error = data["error"]
        out: list[ChunkOut] = []
        if not self.round_closed:
            out = self._flushed(self.acc.flush())
            self.acc.mark_incomplete()
            self._close_round()
        self._stopped_calls = []
        for asked in self.pending_approvals:
            asked["status"] = "cancelled"
        for item in self.items:
            # Never "completed" for what did not complete.
            if item.get("status") == "in_progress":
                item["status"] = "incomplete"
                if item.get("type") == "function_call":
                    self._stopped_calls.append(item["call_id"])
        return out

    # -- output building ------------------------------------------------------------

    def _close_round(self) -> None:
        """Move the round's items (text, reasoning, calls) into the turn's output."""
        self.round_start = len(self.items)
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

    def _flushed(self, pieces: list[Piece]) -> list[ChunkOut]:
        """Pieces released by a non-delta event belong to that event's position."""
        return [ChunkOut(self.pos.last_event, tuple(pieces))] if pieces else []

    def _fold_delta(self, data: dict[str, Any]) -> list[ChunkOut]:
        pos = data["pos"]
        if pos != self.pos.next:
            raise ValueError(f"turn {self.id}: delta at position {pos}, expected {self.pos.next}")
        text = data["text"]
        kind = data.get("kind", "text")
        out: list[ChunkOut] = []
        offset = 0
        for n in data["lens"]:
            piece = text[offset : offset + n]
            offset += n
            out.append(ChunkOut(self.pos.next, self.feed_chunk(kind, piece)))
        self.pos.last_event = self.pos.next - 1
        return out

    def fold_shown(self, kind: str, text: str) -> None:
        """Fold text whose positions were taken (and whose pieces were shown)
        already: the chunks a follower showed live from the actor's fold."""
        if kind == "reasoning":
            self.acc.feed_reasoning(text)
        else:
            self.acc.feed_text(text)

    def feed_chunk(self, kind: str, text: str) -> tuple[Piece, ...]:
        """Take the next stream position for one raw upstream chunk."""
        self.pos.next += 1
        if kind == "reasoning":
            return tuple(self.acc.feed_reasoning(text))
        return tuple(self.acc.feed_text(text))

    # -- queries -----------------------------------------------------------------

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

    def round_output(self) -> list[dict[str, Any]]:
        """The last closed round's items and the tool outputs that answered it."""
        return list(self.items[self.round_start :])

    @property
    def pending_code(self) -> dict[str, Any] | None:
        """The last round's final item, if it is a code block that has not run."""
        if not self.round_closed or len(self.items) <= self.round_start:
            return None
        last = self.items[-1]
        if last.get("type") == "code_interpreter" and last.get("output") is None and last.get("status") == "completed":
            return last
        return None

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
        elif t in ("turn.cancelled", "turn.failed"):
            ids = self._stopped_calls
        out = [dict(self.calls[i]) for i in ids if i in self.calls]
        if t == "tool.completed" and data["call_id"] in self.outputs:
            out.append(dict(self.outputs[data["call_id"]]))
        return out

    def public(self) -> dict[str, Any]:
        """The turn as ``GET /v1/turns/{id}`` shows it."""
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
        if self.usage_estimated:
            view["usage_estimated"] = True
        if self.parent_turn_id is not None:
            view["parent_turn_id"] = self.parent_turn_id
            view["forked_at"] = self.forked_at
        if self.sources:
            view["sources"] = self.sources
        if self.approvals:
            view["approvals"] = [dict(a) for a in self.approvals.values()]
        if self.title is not None:
            view["title"] = self.title
        if self.tags is not None:
            view["tags"] = self.tags
        if self.follow_ups is not None:
            view["follow_ups"] = self.follow_ups
        return view


_HANDLERS: dict[str, Handler] = {
    "turn.forked": TurnView._on_forked,
    "turn.started": TurnView._on_started,
    "assembly.completed": TurnView._on_assembled,
    "model.requested": TurnView._on_model_requested,
    "model.item": TurnView._on_model_item,
    "model.warning": TurnView._on_model_warning,
    "assembly.step": TurnView._on_assembly_step,
    "model.completed": TurnView._on_model_completed,
    "tools.batch": TurnView._on_tools_batch,
    "tool.started": TurnView._on_tool_started,
    "tool.completed": TurnView._on_tool_completed,
    "turn.iteration_limit": TurnView._on_iteration_limit,
    "context.reinjected": TurnView._on_reinjected,
    "outlet.applied": TurnView._on_outlet,
    "turn.finalized": TurnView._on_finalized,
    "background.result": TurnView._on_background_result,
    "turn.interrupted": TurnView._on_interrupted,
    "tool.approval_requested": TurnView._on_approval_requested,
    "tool.approval": TurnView._on_approval,
    "turn.resumed": TurnView._on_resumed,
    "turn.cancelled": TurnView._on_stopped,
    "turn.failed": TurnView._on_stopped,
}


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
