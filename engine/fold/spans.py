"""A turn's spans: what took how long, computed from its log in one pass.

A span is a stretch of the turn between two of its events: context assembly
and each of its steps, each model call, each tool call, each wait for an
approval, each reinjection of tool results, the outlet filters and each
background task. Each names the ``seq`` of the event that opened it (where a
reader of the log finds it) and of the one that closed it. Events that are a
moment rather than a stretch (a warning, a failure, a resume) are *marks*.

Times are the events' own ``at`` (seconds since the epoch), so spans replay to
the same chart whenever they are computed. A fork's log starts with a copy of
its parent's events, at the parent's times: spans begun there are ``copied``,
and the turn's ``start`` and ``end`` are the fork's own. A model call's time to first chunk
comes from ``first_chunk_at`` in its ``model.completed`` when the log has it
(older logs do not: then it is ``None``); its tokens per second are the output
tokens over the time from the first chunk (else from the request) to the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypedDict

from engine.events import Event
from engine.json_types import JsonObject, JsonValue


class Span(TypedDict):
    """A stretch of the turn (``end`` and ``end_seq`` None while it is open)."""

    kind: str
    name: str
    seq: int
    start: float
    end: float | None
    end_seq: int | None
    status: str
    copied: bool
    detail: JsonObject


class Mark(TypedDict):
    """A moment of the turn, and why (the event's field that says it)."""

    type: str
    seq: int
    at: float
    detail: str | None


class SpanChart(TypedDict):
    """What ``spans`` gives: the chart's data."""

    turn_id: str
    start: float | None
    end: float | None
    last_seq: int
    spans: list[Span]
    marks: list[Mark]


#: Events shown as a moment on the time axis, with the data field that says why.
MARKS: dict[str, str] = {
    "turn.forked": "parent_turn_id",
    "model.warning": "message",
    "model.fallback": "reason",
    "turn.iteration_limit": "message",
    "turn.cancel_requested": "by",
    "turn.interrupted": "reason",
    "turn.resumed": "mode",
    "turn.failed": "error",
    "turn.cancelled": "reason",
    "turn.completed": "",
}

#: How the spans still open end when the turn does.
_ENDS = {"turn.failed": "failed", "turn.cancelled": "cancelled", "turn.interrupted": "interrupted"}


def _tokens(usage: JsonValue, *names: str) -> int | None:
    if not isinstance(usage, dict):
        return None
    for name in names:
        value = usage.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


class SpanFold:
    """Folds events into spans; ``result()`` is the chart's data."""

    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        self.spans: list[Span] = []
        self.marks: list[Mark] = []
        self.open: dict[tuple[str, str], Span] = {}
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.last_seq = 0
        self.step_from: float | None = None  # where the next assembly step began
        self.finalized: Event | None = None
        self.copied_upto = 0  # a fork: its events up to this seq are its parent's, with the parent's times
        self._on: dict[str, Callable[[Event], None]] = {
            "turn.started": self._started,
            "assembly.step": self._step,
            "assembly.completed": self._assembled,
            "model.requested": self._requested,
            "model.delta": self._delta,
            "model.completed": self._model_done,
            "tool.started": self._tool_started,
            "tool.completed": self._tool_done,
            "tool.approval_requested": self._approval_asked,
            "tool.approval": self._approval,
            "context.reinjected": self._reinjected,
            "turn.finalized": self._finalized,
            "outlet.applied": self._outlet,
            "background.started": self._background,
            "background.result": self._background_done,
        }

    # -- the pass

    def apply(self, event: Event) -> None:
        if self.first_at is None:
            self.first_at = event.at
        if event.type == "turn.forked":
            self.copied_upto = _int(event.data.get("at"))
        if not self.copied(event):  # a copied event happened in the parent, at the parent's time
            self.last_at = event.at
        self.last_seq = event.seq
        handler = self._on.get(event.type)
        if handler is not None:
            handler(event)
        if event.type in MARKS and not self.copied(event):
            self._mark(event)
        if event.type in _ENDS:
            self._close_all(event, _ENDS[event.type])

    def result(self) -> SpanChart:
        return {
            "turn_id": self.turn_id,
            "start": self.first_at,
            "end": self.last_at,
            "last_seq": self.last_seq,
            "spans": self.spans,
            "marks": self.marks,
        }

    def copied(self, event: Event) -> bool:
        """A fork's copy of its parent's event (after ``turn.forked``, up to the fork point)."""
        return 1 < event.seq <= self.copied_upto

    # -- opening and closing

    def _begin(self, what: str, key: str, name: str, event: Event, start: float | None = None, **detail: JsonValue) -> Span:
        earlier = self.open.pop((what, key), None)
        if earlier is not None:  # begun again (a resume re-runs it): the first try ends here
            self._end(earlier, event, "restarted")
        span: Span = {
            "kind": what,
            "name": name,
            "seq": event.seq,
            "start": event.at if start is None else start,
            "end": None,
            "end_seq": None,
            "status": "open",
            "copied": self.copied(event),
            "detail": detail,
        }
        self.spans.append(span)
        self.open[(what, key)] = span
        return span

    def _finish(self, what: str, key: str, event: Event, status: str = "completed", **detail: JsonValue) -> Span | None:
        span = self.open.pop((what, key), None)
        if span is not None:
            self._end(span, event, status)
            span["detail"].update(detail)
        return span

    @staticmethod
    def _end(span: Span, event: Event, status: str) -> None:
        span["end"], span["end_seq"], span["status"] = event.at, event.seq, status

    def _close_all(self, event: Event, status: str) -> None:
        for span in self.open.values():
            self._end(span, event, status)
        self.open.clear()

    def _mark(self, event: Event) -> None:
        field = MARKS[event.type]
        why = event.data.get(field) if field else None
        if isinstance(why, dict):  # turn.failed's error
            why = why.get("message")
        self.marks.append({"type": event.type, "seq": event.seq, "at": event.at, "detail": None if why is None else str(why)})

    # -- assembly

    def _started(self, event: Event) -> None:
        self.step_from = event.at
        self._begin("assembly", "", "assembly", event)

    def _step(self, event: Event) -> None:
        start = self.step_from if self.step_from is not None else event.at
        span = self._begin("step", str(event.seq), str(event.data.get("step")), event, start=start)
        self._finish("step", str(event.seq), event)
        detail = event.data.get("detail")
        span["status"] = "failed" if isinstance(detail, dict) and detail.get("error") else "completed"
        self.step_from = event.at

    def _assembled(self, event: Event) -> None:
        d = event.data
        self._finish("assembly", "", event, messages=_count(d.get("messages")), history_len=d.get("history_len", 0), sources=_count(d.get("sources")))

    # -- model calls

    def _requested(self, event: Event) -> None:
        d = event.data
        self._finish("reinjection", "", event)
        iteration = _int(d.get("iteration"))
        self._begin("model", "", f"model call {iteration + 1}", event, iteration=iteration, api=d.get("api"), resumed=bool(d.get("resumed")), deltas=0)

    def _delta(self, event: Event) -> None:
        # Counted, not read: a store may leave the deltas' text out of what it hands a chart.
        span = self.open.get(("model", ""))
        if span is not None:
            detail = span["detail"]
            deltas = detail.get("deltas")
            detail["deltas"] = (deltas if isinstance(deltas, int) else 0) + 1

    def _model_done(self, event: Event) -> None:
        d = event.data
        usage = d.get("usage")
        span = self._finish(
            "model",
            "",
            event,
            finish_reason=d.get("finish_reason"),
            input_tokens=_tokens(usage, "prompt_tokens", "input_tokens"),
            output_tokens=_tokens(usage, "completion_tokens", "output_tokens"),
            estimated=bool(isinstance(usage, dict) and usage.get("usage_estimated")),
        )
        if span is not None:
            _rates(span, d.get("first_chunk_at"))

    # -- tools

    def _tool_started(self, event: Event) -> None:
        d = event.data
        self._begin("tool", str(d.get("call_id")), str(d.get("name")), event, call_id=d.get("call_id"), kind=d.get("kind"), attempt=d.get("attempt", 1))

    def _tool_done(self, event: Event) -> None:
        d = event.data
        self._finish("tool", str(d.get("call_id")), event, status=str(d.get("status") or "completed"), error=d.get("error"))

    def _approval_asked(self, event: Event) -> None:
        d = event.data
        self._begin("approval", str(d.get("call_id")), f"approval of {d.get('name')}", event, call_id=d.get("call_id"))

    def _approval(self, event: Event) -> None:
        d = event.data
        self._finish("approval", str(d.get("call_id")), event, status="approved" if d.get("approve") else "denied", by=d.get("by"))

    def _reinjected(self, event: Event) -> None:
        d = event.data
        self._begin("reinjection", "", f"tool results into call {_int(d.get('iteration')) + 1}", event, iteration=d.get("iteration"))

    # -- after the answer

    def _finalized(self, event: Event) -> None:
        self._finish("reinjection", "", event)
        self.finalized = event

    def _outlet(self, event: Event) -> None:
        # The outlet filters run between the final answer and this record of their result.
        opened = self.finalized or event
        d = event.data
        filters, runs = d.get("filters"), d.get("runs")
        span = self._begin("outlet", "", "outlet filters", opened, filters=list(filters) if isinstance(filters, list) else [])
        errors = [r for r in runs if isinstance(r, dict) and r.get("error")] if isinstance(runs, list) else []
        self._finish("outlet", "", event, status="failed" if errors else "completed", errors=len(errors))
        span["detail"].setdefault("errors", len(errors))

    def _background(self, event: Event) -> None:
        tasks = event.data.get("tasks")
        for task in tasks if isinstance(tasks, list) else []:
            self._begin("background", str(task), str(task), event)

    def _background_done(self, event: Event) -> None:
        d = event.data
        self._finish("background", str(d.get("task")), event, status="failed" if d.get("error") else "completed", error=d.get("error"))


def _rates(span: Span, first_chunk_at: JsonValue) -> None:
    """Time to first chunk and output tokens per second of a finished model call."""
    detail = span["detail"]
    first = float(first_chunk_at) if isinstance(first_chunk_at, int | float) and not isinstance(first_chunk_at, bool) else None
    detail["first_chunk_ms"] = None if first is None else round((first - span["start"]) * 1000, 1)
    tokens = detail.get("output_tokens")  # as ``_tokens`` read it: an int or None
    end = span["end"] if span["end"] is not None else span["start"]  # (it has ended: called after ``_finish``)
    generating = end - (first if first is not None else span["start"])
    detail["tokens_per_s"] = round(tokens / generating, 1) if isinstance(tokens, int) and tokens and generating > 0 else None


def _int(value: JsonValue) -> int:
    """A count or a seq as a log holds it (0 when absent)."""
    return int(value) if value and isinstance(value, int | float | str) else 0


def _count(value: JsonValue) -> int:
    """How many items a list field holds (0 when absent)."""
    return len(value) if isinstance(value, list) else 0


def spans(turn_id: str, events: Iterable[Event]) -> SpanChart:
    """The turn's spans and marks, from its events in seq order."""
    fold = SpanFold(turn_id)
    for event in events:
        fold.apply(event)
    return fold.result()
