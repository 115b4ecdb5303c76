"""Forks: a new turn that continues a finished turn's log from one of its events.

A fork's log is complete on its own: ``turn.forked {parent_turn_id, at}``, then
the parent's events ``1 .. at-1`` copied into the new turn (re-sequenced after
``turn.forked``, their stream positions re-based; the copy of ``turn.started``
names the fork's chat and, if one is given, its model). From there it is a turn
whose log ends mid-way, which is what a resumed turn is: the supervisor folds it
and starts its actor at ``entry_node``, and the fork re-does event ``at`` live.

``at`` is the seq of the parent's event the fork diverges at, one of:

* a ``model.requested``: the fork calls the model again (with ``model``, if
  given) on the recorded context of that call;
* a ``tools.batch``: the fork decides the same batch again (from the recorded
  model output) and runs it, except the calls named in ``tool_results``,
  whose given outputs are recorded in place of running them
  (``tool.completed`` with ``substituted``); the next model call sees them.

Anything else is refused (``ForkError``), saying why: before ``turn.started``
there is no turn to continue, after the answer is final (finalizing, outlet,
background) nothing the model or the tools do follows, and an event inside a
model call or a batch cannot be re-done on its own.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Protocol

from engine.events import Event, TurnForked
from engine.fold.turn_view import TurnView
from engine.json_types import JsonObject

FORK_POINTS = ("model.requested", "tools.batch")
_AFTER_ANSWER = ("turn.finalized", "outlet.applied", "background.started", "background.result", "turn.completed")


class ForkError(Exception):
    """The fork cannot be made as asked (a 400): ``param`` names the field."""

    def __init__(self, message: str, param: str = "at") -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def check_fork_point(parent: Sequence[Event], at: int, tool_results: Mapping[str, str]) -> Event:
    """The parent's event at ``at``, if a fork can start there with these
    ``tool_results``; else ``ForkError`` saying why."""
    if not parent:
        raise ForkError("the parent turn has no events")
    last = parent[-1].seq
    if at < 1 or at > last:
        raise ForkError(f"'at' must be the seq of one of the parent's events (1..{last}); it has no event {at}")
    event = parent[at - 1]
    started = next((e.seq for e in parent if e.type == "turn.started"), None)
    if started is None or at <= started:
        raise ForkError(
            f"event {at} ({event.type}) is not after the parent's turn.started: a fork keeps the parent's events "
            "before 'at' and needs its turn.started; fork at a model.requested or a tools.batch"
        )
    if event.type in _AFTER_ANSWER:
        phase = "in the background phase" if event.type.startswith("background.") else "after the answer was final"
        raise ForkError(f"event {at} ({event.type}) is {phase}: nothing the model or the tools do follows it; fork at a model.requested or a tools.batch")
    if event.type not in FORK_POINTS:
        raise ForkError(
            f"event {at} is a {event.type}: a fork starts at a model.requested (the model is called again) or a tools.batch (the batch is run again)"
        )
    if event.type == "model.requested" and event.data.get("resumed"):
        first = next((e.seq for e in reversed(parent[: at - 1]) if e.type == "model.requested" and not e.data.get("resumed")), None)
        where = f" (seq {first})" if first is not None else ""
        raise ForkError(f"event {at} is a model.requested that continues an interrupted request; fork at that request's first model.requested{where}")
    if tool_results:
        if event.type != "tools.batch":
            raise ForkError(
                f"'tool_results' replaces outputs of the batch at 'at', and event {at} is a {event.type}, not a tools.batch",
                "tool_results",
            )
        ours = {c["call_id"] for c in event.data.get("calls") or []}
        theirs = {c["call_id"] for c in event.data.get("client_calls") or []}
        for call_id in tool_results:
            if call_id in theirs:
                raise ForkError(
                    f"call {call_id!r} of the batch at {at} is the client's to run: its result comes with the client's next request", "tool_results"
                )
            if call_id not in ours:
                known = ", ".join(sorted(ours)) or "none"
                raise ForkError(f"call {call_id!r} is not in the tools.batch at {at} (its calls: {known})", "tool_results")
    return event


def fork_log(
    parent: Sequence[Event],
    *,
    at: int,
    turn_id: str,
    chat_id: str,
    model: str | None = None,
    tool_results: Mapping[str, str] | None = None,
    now: float | None = None,
    into: Fold | None = None,
    key_hash: str | None = None,
) -> list[Event]:
    """The fork's first events: ``turn.forked``, then the parent's events before
    ``at`` as this turn's. Checks ``at`` first (``check_fork_point``).

    Each copy is folded as it is made (it must fold: a fork's log is a valid
    log), into ``into`` when given: the fold the fork's actor goes on with,
    so that the copy is not folded a second time."""
    given = dict(tool_results or {})
    check_fork_point(parent, at, given)
    kept = [e for e in parent if e.seq < at]
    inherited: dict[str, str] = {}
    if kept and kept[0].type == "turn.forked":
        # The parent is a fork itself: this fork names its own parent, and keeps
        # the substitutions the copied events hold (a re-run makes them again).
        recorded = {e.data["call_id"] for e in kept if e.type == "tool.completed" and e.data.get("substituted")}
        inherited = {k: v for k, v in (kept[0].data.get("tool_results") or {}).items() if k in recorded}
        kept = kept[1:]
    started_at = time.time() if now is None else now
    forked = TurnForked(parent_turn_id=parent[0].turn_id, at=at, model=model, tool_results={**inherited, **given}, key_hash=key_hash)
    first = Event(turn_id=turn_id, seq=1, type=forked.TYPE, at=started_at, data=forked.model_dump(mode="json"))
    fold = into if into is not None else _ViewFold(TurnView(turn_id))
    view = fold.view
    fold.apply(first)
    out = [first]
    for event in kept:
        data = _copied_data(event, view, chat_id=chat_id, model=model)
        copy = Event(turn_id=turn_id, seq=view.last_seq + 1, type=event.type, at=event.at, data=data)
        fold.apply(copy)
        out.append(copy)
    copied = _spent(view)
    if copied:  # known once the copies are folded (the fold reads no such field)
        out[0] = first.model_copy(update={"data": {**first.data, "copied": copied}})
    return out


def _spent(view: TurnView) -> dict[str, int]:
    """What a view's usage and tool calls add up to (zeros left out)."""
    usage = view.usage or {}
    spent = {
        "input_tokens": _count(usage.get("input_tokens")),
        "output_tokens": _count(usage.get("output_tokens")),
        "tool_calls": sum(1 for item in view.output if item.get("type") == "function_call"),
    }
    return {k: v for k, v in spent.items() if v}


def _count(value: object) -> int:
    return int(value) if isinstance(value, int | float) else 0


class Fold(Protocol):
    """Where :func:`fork_log` folds the copies: a view, and whatever else the
    caller folds with it (a live actor's loop state)."""

    @property
    def view(self) -> TurnView: ...

    def apply(self, event: Event) -> None: ...


class _ViewFold:
    def __init__(self, view: TurnView) -> None:
        self.view = view

    def apply(self, event: Event) -> None:
        self.view.apply(event)


def _copied_data(event: Event, view: TurnView, *, chat_id: str, model: str | None) -> JsonObject:
    """An event's data as the fork records it: what names the turn's chat or
    model, and the stream positions (the fork's ``turn.forked`` takes one), are
    the fork's; everything else is the parent's, unchanged."""
    data = dict(event.data)
    if event.type == "turn.started":
        request = dict(data.get("request") or {})
        if request.get("chat_id"):
            request["chat_id"] = chat_id
        if model is not None:
            request["model"] = model
            data["model"] = model
        data["chat_id"] = chat_id
        data["request"] = request
    elif event.type == "model.delta":
        data["pos"] = view.next_pos
    elif event.type == "turn.resumed":
        data["from_seq"] = view.last_seq
        data["from_pos"] = view.last_event_pos
    return data
