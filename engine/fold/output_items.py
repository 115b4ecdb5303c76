"""A turn's output items (Responses-API-shaped, as Open WebUI stores an answer),
built from its events: the streamed text of each model round (folded by the
``Accumulator``), the function calls the model made, the tools' outputs, the
outlet filters' replacement, and what a cancel, a failure or a restart left
incomplete.

``TurnView`` owns one and tells it what each event means for the output; the
view itself keeps the turn's state (status, positions, usage...). Item ids are
deterministic in (turn, order of creation), so a replay reproduces every id.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

from engine.fold.accumulator import Accumulator, Piece
from engine.json_types import JsonObject, JsonValue
from engine.protocols.responses import has_provider_reasoning, responses_reasoning_item

#: An output item: a Responses API item (``message``, ``reasoning``,
#: ``function_call``, ``function_call_output``, ``code_interpreter``) as JSON.
Item = JsonObject


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


class OutputItems:
    """The output of one turn, round by round."""

    def __init__(self, turn_id: str) -> None:
        self.ids = ItemIds(turn_id)
        self.reasoning_tags: object = None  # the request's ``reasoning_tags`` param, as given
        self.code_interpreter = False  # legacy <code_interpreter> blocks are parsed
        self.code_cut = False  # ... and an answer ends at a block's closing tag
        self.acc = self._new_accumulator()
        # Output of closed rounds (and tool outputs) in order; the open round's
        # items live in ``acc`` and ``round_calls`` until model.completed.
        self.round_closed = False
        self.items: list[Item] = []
        self.round_calls: list[Item] = []
        self.round_start = 0  # index in ``items`` where the last closed round begins
        self.closed_text: list[str] = []
        self.closed_reasoning: list[str] = []
        self.calls: dict[str, Item] = {}
        self.outputs: dict[str, Item] = {}
        self.code_items: dict[str, Item] = {}
        self.arguments_ran: dict[str, str] = {}
        self.stopped_calls: list[str] = []  # calls a cancel or a failure left incomplete
        # The output items restarts superseded (kept out of ``output``; their
        # text stays in the log).
        self.superseded: list[Item] = []
        self.unfinished: list[Item] = []  # announced calls the last closed round dropped

    def _new_accumulator(self) -> Accumulator:
        # The accumulator gets the id source, not a method of this object: a
        # cycle through it made every turn's state garbage that only the
        # cyclic GC could free (~60 objects per turn, each collection walking them).
        return Accumulator(
            id_factory=self.ids.next,
            reasoning_tags=self.reasoning_tags,
            code_interpreter=self.code_interpreter,
            stop_after_code=self.code_cut,
        )

    # -- what the events say ---------------------------------------------------------

    def configure(self, *, code_interpreter: bool, code_cut: bool, reasoning_tags: object = None) -> None:
        """How the answer's text is read, before anything streamed into it."""
        changed = (code_interpreter, code_cut, reasoning_tags) != (self.code_interpreter, self.code_cut, self.reasoning_tags)
        self.code_interpreter, self.code_cut, self.reasoning_tags = code_interpreter, code_cut, reasoning_tags
        if changed:
            self.acc = self._new_accumulator()

    def open_round(self) -> None:
        """A new model request (not a resumed one): the next round starts fresh."""
        if self.round_closed:
            self.acc = self._new_accumulator()
            self.round_closed = False

    def model_item(self, item: Item) -> None:
        """An item the model sent whole (a function call, a provider's reasoning item)."""
        item = dict(item)
        if item.get("type") == "function_call":
            call_id = call_id_of(item)
            started = self.calls.get(call_id)
            if started is not None and started.get("status") == "in_progress" and any(c is started for c in self.round_calls):
                # The call announced while its arguments streamed, now whole.
                started.clear()
                started.update(item)
                return
            self.calls[call_id] = item
            self.round_calls.append(item)
        elif item.get("type") == "reasoning" and has_provider_reasoning(item):
            # The provider's own reasoning item (its id, its encrypted
            # content) goes with the reasoning the stream showed, so that a
            # Responses API upstream gets it back in continuations.
            for mine in reversed(self.acc.output):
                if mine.get("type") == "reasoning":
                    mine.setdefault("provider_item", responses_reasoning_item(item))
                    break

    def close_round(self, *, completed: bool = True) -> None:
        """Move the round's items (text, reasoning, calls) into the turn's
        output (``completed``: the model's response ended; else it was cut off,
        and calls still streaming stay, to end ``incomplete``)."""
        self.round_start = len(self.items)
        self.unfinished = [c for c in self.round_calls if c.get("status") == "in_progress"] if completed else []
        if self.unfinished:
            # Calls announced while they streamed that never came whole (a
            # glued call became its pieces): not calls of the answer.
            self.round_calls = [c for c in self.round_calls if c.get("status") != "in_progress"]
            for call in self.unfinished:
                call["status"] = "incomplete"
                del self.calls[call_id_of(call)]
            self.superseded.extend(self.unfinished)
        produced = self.acc.output
        if self.round_calls:
            # A round that only called tools has no answer slot to keep.
            produced = [i for i in produced if not (i.get("type") == "message" and not item_text(i))]
        self.items.extend(produced)
        self.items.extend(self.round_calls)
        for item in produced:
            if item.get("type") == "code_interpreter":
                self.code_items[str(item["id"])] = item  # the accumulator's id, a str
        self.closed_text.append(self.acc.text)
        self.closed_reasoning.append(self.acc.reasoning_text)
        self.round_calls = []
        self.round_closed = True

    def set_status(self, call_ids: list[str], status: str) -> None:
        for call_id in call_ids:
            item = self.calls.get(call_id)
            if item is not None:
                item["status"] = status

    def tool_output(self, call_id: str, output: str | None, status: str, extras: Mapping[str, Sequence[JsonValue]]) -> None:
        """A tool's result: a ``function_call_output`` item (a legacy code
        block's result lives on the block itself)."""
        code = self.code_items.get(call_id)
        if code is not None:
            try:
                code["output"] = json.loads(output or "null")
            except ValueError:
                code["output"] = output
            return
        item = self.calls.get(call_id)
        if item is not None:
            item["status"] = status
            ran = self.arguments_ran.get(call_id)
            if ran is not None:
                # What is replayed to the model is exactly what ran (Open WebUI
                # replayed the model's raw, possibly broken, arguments).
                item["arguments_ran"] = ran
        out: Item = {"type": "function_call_output", "id": self.ids.next("fco"), "call_id": call_id, "output": output, "status": status}
        out.update({key: list(value) for key, value in extras.items() if value})
        self.items.append(out)
        self.outputs[call_id] = out

    def replace(self, output: list[Item], content: str | None) -> None:
        """The outlet filters' version of the answer replaces it."""
        self.items = [dict(i) for i in output]
        self.closed_text = [content or ""]

    def supersede(self) -> bool:
        """A restart: the open round's partial output leaves the answer (the
        model answers that round afresh). Returns whether there was any."""
        self.acc.mark_incomplete()
        dropped = [dict(i) for i in (*self.acc.output, *self.round_calls)]
        dropped = [i for i in dropped if i.get("type") != "message" or item_text(i)]
        for item in dropped:
            item["status"] = "incomplete"
            if item.get("type") == "function_call":
                self.calls.pop(call_id_of(item), None)
        self.superseded.extend(dropped)
        self.acc = self._new_accumulator()
        self.round_calls = []
        return bool(dropped)

    def stop(self) -> list[Piece]:
        """A cancel or a failure: what was cut off is incomplete. Returns the
        text the open round held back, released now."""
        pieces: list[Piece] = []
        if not self.round_closed:
            pieces = self.acc.flush()
            self.acc.mark_incomplete()
            self.close_round(completed=False)
        self.stopped_calls = []
        for item in self.items:
            # Never "completed" for what did not complete.
            if item.get("status") == "in_progress":
                item["status"] = "incomplete"
                if item.get("type") == "function_call":
                    self.stopped_calls.append(call_id_of(item))
        return pieces

    def feed(self, kind: str, text: str, call_id: str | None = None) -> list[Piece]:
        """One raw upstream chunk of text, reasoning, or a started call's arguments."""
        if kind == "reasoning":
            return self.acc.feed_reasoning(text)
        if kind == "tool_arguments":
            call = self.calls.get(call_id or "")
            if call is not None and call.get("status") == "in_progress":
                arguments = call.get("arguments")
                call["arguments"] = (arguments if isinstance(arguments, str) else "") + text
            return [Piece("tool_arguments", text, call_id)]
        return self.acc.feed_text(text)

    # -- queries -------------------------------------------------------------------

    @property
    def output(self) -> list[Item]:
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

    def round_output(self) -> list[Item]:
        """The last closed round's items and the tool outputs that answered it."""
        return list(self.items[self.round_start :])

    @property
    def pending_code(self) -> Item | None:
        """The last round's final item, if it is a code block that has not run."""
        if not self.round_closed or len(self.items) <= self.round_start:
            return None
        last = self.items[-1]
        if last.get("type") == "code_interpreter" and last.get("output") is None and last.get("status") == "completed":
            return last
        return None

    def touched(self, call_ids: list[str], output_of: str | None = None) -> list[Item]:
        """Snapshots of the calls' items (and of one call's output item)."""
        out = [dict(self.calls[i]) for i in call_ids if i in self.calls]
        if output_of is not None and output_of in self.outputs:
            out.append(dict(self.outputs[output_of]))
        return out


def item_text(item: Item) -> str:
    content = item.get("content")
    if not isinstance(content, list):
        return ""
    return "".join(text for part in content if isinstance(part, dict) and isinstance(text := part.get("text"), str))


def call_id_of(item: Mapping[str, JsonValue]) -> str:
    """A ``function_call`` item's ``call_id`` ("" if it has none: the calls
    this fold records always have one)."""
    call_id = item.get("call_id")
    return call_id if isinstance(call_id, str) else ""
