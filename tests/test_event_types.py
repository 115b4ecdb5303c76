"""Every stored event type round-trips through its typed class, and old shapes
are read in the current shape.

The payloads below are written out by hand as a store holds them (the JSON of
``make_event``'s data), one or more per event type; they are the oracle, not
anything the event classes compute. A payload read back through ``parse_data``
and written again with ``make_event`` must come out byte-for-byte the same
(a hash chain covers the stored JSON, so a field the typed read added or
dropped would break verification of every old log). Old shapes (an older
``v``, fields that logs written before them lack) must be read as the current
shape, through the store's read path, and fold to the view their log showed.
"""

from __future__ import annotations

import json
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from adapters.store import migrate, open_store
from engine.events import EVENT_TYPES, Event, EventData, ModelItem, ModelRequested, ToolsBatch, TurnResumed, data_of, make_event, parse_data, upcast
from engine.fold.turn_view import fold
from engine.run.folded import Folded

TURN = "t-types"
AT = 1_800_000_000.5

REQUEST = {"model": "m", "messages": [{"role": "user", "content": "hé"}], "stream": True}
CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "lookup", "arguments": '{"q": "x"}', "status": "completed"}

#: Event type -> payloads in their current stored shape.
STORED: dict[str, list[dict[str, Any]]] = {
    "turn.forked": [
        {"v": 1, "parent_turn_id": "p", "at": 4},
        {"v": 1, "parent_turn_id": "p", "at": 6, "model": "other", "tool_results": {"call_1": "given"}},
    ],
    "turn.started": [
        {"v": 1, "chat_id": "c", "user_id": "u", "model": "m", "stream": True, "request": REQUEST},
        {"v": 1, "chat_id": "c", "user_id": "u", "model": "m", "stream": False, "request": {}},
    ],
    "assembly.step": [
        {"v": 1, "step": "files", "detail": {"sources": [{"id": 1, "name": "a.txt"}], "warnings": []}},
        {"v": 1, "step": "tools", "detail": {}},
    ],
    "assembly.completed": [
        {"v": 1, "messages": [{"role": "user", "content": "hé"}], "params": {}, "history_len": 0, "new_messages": [{"role": "user", "content": "hé"}]},
        {
            "v": 1,
            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
            "params": {"temperature": 0.5, "tools": [{"type": "function", "function": {"name": "lookup"}}]},
            "history_len": 1,
            "new_messages": [{"role": "user", "content": "q"}],
            "history_reset": True,
            "turn_refs": [{"index": 0, "turn_id": "t0"}],
            "chat_turns": 3,
            "sources": [{"id": 1, "name": "doc", "type": "file"}],
            "rag": {"role": "user", "index": 1, "message": {"role": "user", "content": "q"}, "source_ids": {}},
            "code_interpreter": False,
            "code_cut": True,
        },
    ],
    "model.requested": [
        {"v": 2, "iteration": 0, "api": "chat", "prefill": None, "resumed": False},
        {"v": 2, "iteration": 2, "api": "responses", "prefill": "par", "resumed": True, "resume_params": {"continue_final_message": True}},
    ],
    "model.delta": [
        {"v": 1, "kind": "text", "pos": 3, "text": "héllo", "lens": [2, 3]},
        {"v": 1, "kind": "reasoning", "pos": 9, "text": "", "lens": []},
    ],
    "model.item": [{"v": 1, "item": CALL}],
    "model.completed": [
        {"v": 1, "finish_reason": "stop", "usage": {"input_tokens": 3, "output_tokens": 2}, "response_id": "r1", "status": None},
        {"v": 1, "finish_reason": None, "usage": None, "response_id": None, "status": "incomplete"},
    ],
    "model.warning": [{"v": 1, "message": "bad chunk", "raw": "data: {"}, {"v": 1, "message": "w", "raw": None}],
    "tools.batch": [
        {"v": 1, "iteration": 1, "calls": [{"call_id": "call_1", "name": "lookup", "arguments": "{}"}], "client_calls": []},
        {"v": 1, "iteration": 2, "calls": [], "client_calls": [{"call_id": "call_2", "name": "theirs", "arguments": "{}"}]},
    ],
    "tool.started": [
        {"v": 1, "call_id": "call_1", "name": "lookup", "arguments": "{}", "kind": "server", "tool_id": "t", "idempotent": True, "attempt": 2},
        {
            "v": 1,
            "call_id": "call_3",
            "name": "code_interpreter",
            "arguments": '{"code": "1"}',
            "kind": "code",
            "tool_id": None,
            "idempotent": False,
            "attempt": 1,
        },
    ],
    "tool.event": [{"v": 1, "call_id": "call_1", "event": {"type": "status", "data": {"description": "working"}}}],
    "tool.completed": [
        {
            "v": 1,
            "call_id": "call_1",
            "name": "lookup",
            "output": "found",
            "status": "completed",
            "files": [],
            "embeds": [],
            "images": [],
            "sources": [],
            "error": None,
        },
        {
            "v": 1,
            "call_id": "call_2",
            "name": "lookup",
            "output": None,
            "status": "failed",
            "files": [{"type": "image", "url": "/f/1"}],
            "embeds": ["<b>x</b>"],
            "images": ["/i/1"],
            "sources": [{"source": {"name": "s"}, "document": ["d"], "metadata": [{}]}],
            "error": "boom",
            "substituted": True,
        },
    ],
    "context.reinjected": [
        {"v": 1, "iteration": 1, "messages": [{"role": "tool", "tool_call_id": "call_1", "content": "found"}], "previous_response_id": None, "input_items": []},
        {
            "v": 1,
            "iteration": 2,
            "messages": [],
            "previous_response_id": "r1",
            "input_items": [{"type": "function_call_output", "call_id": "call_1", "output": "found"}],
            "rewrite": {"index": 1, "message": {"role": "user", "content": "q [1]"}},
            "sources": [{"id": 2, "name": "web"}],
        },
    ],
    "turn.iteration_limit": [{"v": 1, "limit": 2, "pending_calls": [{"call_id": "call_1"}], "message": "limit"}],
    "model.fallback": [{"v": 1, "reason": "previous response not found", "previous_response_id": "r1"}],
    "turn.finalized": [{"v": 1, "finish_reason": "stop"}, {"v": 1, "finish_reason": None}],
    "outlet.applied": [
        {"v": 1, "filters": ["f"], "runs": [{"filter": "f", "changed": True, "error": None}], "content": "x", "output": [{"type": "message"}]},
        {"v": 1, "filters": [], "runs": [], "content": None, "output": None},
    ],
    "background.started": [{"v": 1, "tasks": ["title", "tags"]}],
    "background.result": [
        {"v": 1, "task": "title", "result": "A title", "error": None, "reply": '{"title": "A title"}'},
        {"v": 1, "task": "tags", "result": ["a", {"b": [1, 2.5, None]}], "error": None, "reply": "r"},
        {"v": 1, "task": "follow_ups", "result": None, "error": "no json", "reply": None},
    ],
    "turn.completed": [{"v": 1}],
    "turn.cancel_requested": [{"v": 1, "by": "u"}, {"v": 1, "by": None}],
    "turn.cancelled": [{"v": 1, "reason": "cancelled by request"}],
    "turn.failed": [{"v": 1, "error": {"type": "upstream_failed", "message": "502", "code": 502}}],
    "turn.interrupted": [{"v": 1, "reason": "owner lost", "last_owner": "host-1"}],
    "turn.resumed": [
        {"v": 1, "from_seq": 7, "from_pos": 12, "epoch": 1, "owner": "host-2", "mode": "continue"},
        {"v": 1, "from_seq": 9, "from_pos": 4294967300, "epoch": 2, "owner": None, "mode": "restart"},
    ],
    "tool.approval_requested": [{"v": 1, "call_id": "call_1", "name": "lookup", "arguments": "{}"}],
    "tool.approval": [{"v": 1, "call_id": "call_1", "approve": True}, {"v": 1, "call_id": "call_1", "approve": False, "reason": "no", "by": "u"}],
    "tools.decided": [{"v": 1}],
}

#: (event type, a payload as older versions stored it, the current shape it reads as).
OLD: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    # model.requested v1 named a provider (always "openai") and had no api.
    ("model.requested", {"v": 1, "provider": "openai", "iteration": 0}, {"v": 2, "iteration": 0, "api": "chat", "prefill": None, "resumed": False}),
    (
        "model.requested",
        {"v": 1, "provider": "openai", "iteration": 1, "api": "responses", "prefill": "ab", "resumed": True},
        {"v": 2, "iteration": 1, "api": "responses", "prefill": "ab", "resumed": True},
    ),
    # Before resume modes: every resume continued.
    (
        "turn.resumed",
        {"v": 1, "from_seq": 3, "from_pos": 5, "epoch": 1, "owner": "h"},
        {"v": 1, "from_seq": 3, "from_pos": 5, "epoch": 1, "owner": "h", "mode": "continue"},
    ),
    # Before the assembly recorded its history counts and code-interpreter decision.
    (
        "assembly.completed",
        {"v": 1, "messages": [{"role": "user", "content": "q"}]},
        {"v": 1, "messages": [{"role": "user", "content": "q"}], "params": {}, "history_len": 0, "new_messages": []},
    ),
    # Before tool.completed carried errors, sources and rich results.
    (
        "tool.completed",
        {"v": 1, "call_id": "c", "name": "n", "output": "o"},
        {"v": 1, "call_id": "c", "name": "n", "output": "o", "status": "completed", "files": [], "embeds": [], "images": [], "sources": [], "error": None},
    ),
    # Before a background result kept the task model's reply.
    ("background.result", {"v": 1, "task": "title", "result": "T"}, {"v": 1, "task": "title", "result": "T", "error": None, "reply": None}),
]


def _event(type_: str, data: dict[str, Any], seq: int = 1) -> Event:
    # As a store builds it from a row: the JSON text, parsed.
    return Event(turn_id=TURN, seq=seq, type=type_, at=AT, data=json.loads(json.dumps(data)))


def test_the_samples_cover_every_event_type() -> None:
    assert set(STORED) == set(EVENT_TYPES)


@pytest.mark.parametrize(("type_", "stored"), [(t, d) for t, ds in STORED.items() for d in ds], ids=lambda v: v if isinstance(v, str) else "")
def test_a_stored_payload_round_trips_through_its_class(type_: str, stored: dict[str, Any]) -> None:
    event = _event(type_, stored)
    typed = parse_data(event)
    assert type(typed) is EVENT_TYPES[type_]
    again = make_event(TURN, 1, typed, at=AT)
    assert again.type == type_
    assert json.dumps(again.data, sort_keys=True) == json.dumps(stored, sort_keys=True)
    assert data_of(event, EVENT_TYPES[type_]) == typed


@pytest.mark.parametrize(("type_", "old", "current"), OLD, ids=[f"{t}-{i}" for i, (t, *_) in enumerate(OLD)])
def test_an_old_payload_reads_as_the_current_shape(type_: str, old: dict[str, Any], current: dict[str, Any]) -> None:
    typed = parse_data(_event(type_, old))
    assert make_event(TURN, 1, typed, at=AT).data == current
    # The current shape is a fixed point.
    assert make_event(TURN, 1, parse_data(_event(type_, current)), at=AT).data == current


def test_a_model_requested_v1_loses_its_provider_once() -> None:
    event = _event("model.requested", {"v": 1, "provider": "openai", "iteration": 3})
    assert upcast(event).data == {"v": 2, "iteration": 3}
    typed = data_of(event, ModelRequested)
    assert (typed.v, typed.iteration, typed.api) == (2, 3, "chat")
    assert "provider" not in typed.model_dump()


def test_unknown_types_keep_their_fields_and_a_wrong_class_is_refused() -> None:
    typed = parse_data(_event("test.event", {"k": "after"}))
    assert type(typed) is EventData and typed.model_dump() == {"v": 1, "k": "after"}
    with pytest.raises(TypeError):
        data_of(_event("turn.completed", {"v": 1}), TurnResumed)


def test_an_object_field_is_checked_as_an_object_and_its_values_taken_as_they_are() -> None:
    """Payload objects (requests, messages, items) are JSON to the type checker,
    but pydantic checks only that each is an object with string keys: walking
    every value of every payload on each read would cost per event. Their values
    serialize by their own types (a tuple is a JSON list), without warnings."""
    for bad in ("not an object", {1: "x"}, ["x"]):
        with pytest.raises(ValidationError):
            ModelItem.model_validate({"item": bad})
    with pytest.raises(ValidationError):
        ToolsBatch.model_validate({"iteration": 1, "calls": ["not an object"]})
    kept = object()  # not JSON: a deep validation would refuse it
    assert ModelItem.model_validate({"item": {"x": kept}}).item["x"] is kept
    assert ToolsBatch.model_validate({"iteration": 1, "calls": [{"x": kept}]}).calls[0]["x"] is kept
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data = make_event("t", 1, ModelItem.model_validate({"item": {"pair": (1, 2)}})).data
    assert data["item"] == {"pair": [1, 2]}


#: A turn as an older turnlog logged it: model.requested v1 (with provider),
#: an assembly without its later fields, a crash and a resume without a mode.
OLD_LOG: list[tuple[str, dict[str, Any]]] = [
    ("turn.started", {"v": 1, "chat_id": "c", "user_id": "u", "model": "m", "request": {"messages": [{"role": "user", "content": "q"}]}}),
    ("assembly.completed", {"v": 1, "messages": [{"role": "user", "content": "q"}], "new_messages": [{"role": "user", "content": "q"}]}),
    ("model.requested", {"v": 1, "provider": "openai", "iteration": 0}),
    ("model.delta", {"v": 1, "kind": "text", "pos": 4, "text": "Hello", "lens": [2, 3]}),
    ("turn.interrupted", {"v": 1, "reason": "owner lost", "last_owner": "dead"}),
    ("turn.resumed", {"v": 1, "from_seq": 5, "from_pos": 7, "epoch": 1, "owner": "new"}),
    ("model.requested", {"v": 1, "provider": "openai", "iteration": 0, "prefill": "Hello", "resumed": True}),
    ("model.delta", {"v": 1, "kind": "text", "pos": (1 << 32) + 2, "text": " world", "lens": [6]}),
    ("model.completed", {"v": 1, "finish_reason": "stop", "usage": {"prompt_tokens": 3, "completion_tokens": 4}, "response_id": None}),
    ("turn.finalized", {"v": 1, "finish_reason": "stop"}),
    ("turn.completed", {"v": 1}),
]


async def test_an_old_log_replays_through_the_store_to_its_view(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"
    await migrate(url)
    store = await open_store(url)
    turn_id = f"old-{uuid.uuid4().hex[:8]}"
    try:
        await store.append([Event(turn_id=turn_id, seq=i, type=t, at=AT + i, data=d) for i, (t, d) in enumerate(OLD_LOG, 1)])
        events = await store.read(turn_id)
    finally:
        await store.close()
    assert [e.data["v"] for e in events if e.type == "model.requested"] == [2, 2]
    view = fold(turn_id, events)
    assert (view.status, view.content, view.finish_reason, view.chat_id, view.model) == ("completed", "Hello world", "stop", "c", "m")
    assert view.new_messages == [{"role": "user", "content": "q"}]
    assert view.usage is not None and (view.usage["input_tokens"], view.usage["output_tokens"]) == (3, 4)
    point = view.resume_point
    assert point is not None and (point.mode, point.from_pos, point.epoch, point.content_length) == ("continue", 5, 1, len("Hello"))
    state = Folded.of(turn_id, events).state
    assert (state.last_api, state.iteration, state.finish_reason, state.input.chat_id) == ("chat", 0, "stop", "c")
