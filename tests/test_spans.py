"""Spans from hand-built logs: each expected span is written out by hand (its
times, seqs and figures computed here from the literal timestamps), not derived
from the code under test."""

from __future__ import annotations

import time
from typing import Any

import pytest

from engine.events import Event
from engine.fold.spans import Span, SpanChart, spans

T0 = 1_700_000_000.0


def log(*entries: tuple[float, str, dict[str, Any]]) -> list[Event]:
    """Events at T0 + offset, seq 1, 2, … in the order given."""
    return [Event(turn_id="t1", seq=i, type=kind, at=T0 + offset, data=data) for i, (offset, kind, data) in enumerate(entries, start=1)]


def by_kind(result: SpanChart, kind: str) -> list[Span]:
    return [s for s in result["spans"] if s["kind"] == kind]


def duration(span: Span) -> float:
    end = span["end"]
    assert end is not None, span
    return end - span["start"]


TOOL_TURN = log(
    (0.0, "turn.started", {"chat_id": "c", "user_id": "u", "model": "m", "request": {}}),  # 1
    (0.1, "assembly.step", {"step": "system_prompt", "detail": {}}),  # 2
    (0.3, "assembly.step", {"step": "memory", "detail": {"error": "down"}}),  # 3
    (0.4, "assembly.completed", {"messages": [{}, {}], "history_len": 1, "sources": [{"id": 1}]}),  # 4
    (0.5, "model.requested", {"iteration": 0, "api": "chat"}),  # 5
    (0.7, "model.item", {"item": {"type": "function_call"}}),  # 6
    (1.0, "model.completed", {"finish_reason": "tool_calls", "usage": {"prompt_tokens": 30, "completion_tokens": 12}, "first_chunk_at": T0 + 0.7}),  # 7
    (1.0, "tools.batch", {"iteration": 0, "calls": [{"id": "a"}, {"id": "b"}]}),  # 8
    (1.1, "tool.started", {"call_id": "a", "name": "add", "arguments": "{}"}),  # 9
    (1.2, "tool.started", {"call_id": "b", "name": "explode", "arguments": "{}"}),  # 10
    (1.6, "tool.completed", {"call_id": "b", "name": "explode", "output": None, "status": "failed", "error": "boom"}),  # 11
    (2.1, "tool.completed", {"call_id": "a", "name": "add", "output": "5"}),  # 12
    (2.2, "context.reinjected", {"iteration": 1, "messages": []}),  # 13
    (2.5, "model.requested", {"iteration": 1, "api": "chat"}),  # 14
    (3.0, "model.delta", {"kind": "text", "pos": 0, "text": "Hello", "lens": [2, 3]}),  # 15
    (3.5, "model.delta", {"kind": "text", "pos": 5, "text": " you", "lens": [4]}),  # 16
    (4.5, "model.completed", {"finish_reason": "stop", "usage": {"input_tokens": 50, "output_tokens": 30}}),  # 17
    (4.6, "turn.finalized", {"finish_reason": "stop"}),  # 18
    (4.9, "outlet.applied", {"filters": ["f"], "runs": [{"filter": "f", "error": "bad"}]}),  # 19
    (5.0, "background.started", {"tasks": ["title", "tags"]}),  # 20
    (5.4, "background.result", {"task": "tags", "result": ["x"]}),  # 21
    (6.0, "background.result", {"task": "title", "error": "timeout"}),  # 22
    (6.1, "turn.completed", {}),  # 23
)


def test_a_tool_turn_its_assembly_steps_model_calls_tools_reinjection_outlet_and_background() -> None:
    r = spans("t1", TOOL_TURN)
    assert (r["turn_id"], r["start"], r["end"], r["last_seq"]) == ("t1", T0, T0 + 6.1, 23)
    brief = [(s["kind"], s["name"], s["seq"], s["end_seq"], s["status"]) for s in r["spans"]]
    assert brief == [
        ("assembly", "assembly", 1, 4, "completed"),
        ("step", "system_prompt", 2, 2, "completed"),
        ("step", "memory", 3, 3, "failed"),
        ("model", "model call 1", 5, 7, "completed"),
        ("tool", "add", 9, 12, "completed"),
        ("tool", "explode", 10, 11, "failed"),
        ("reinjection", "tool results into call 2", 13, 14, "completed"),
        ("model", "model call 2", 14, 17, "completed"),
        ("outlet", "outlet filters", 18, 19, "failed"),
        ("background", "title", 20, 22, "failed"),
        ("background", "tags", 20, 21, "completed"),
    ]
    steps = by_kind(r, "step")
    # a step runs from the end of the one before it (the first from turn.started)
    assert [(s["start"], s["end"]) for s in steps] == [(T0, T0 + 0.1), (T0 + 0.1, T0 + 0.3)]
    assert by_kind(r, "assembly")[0]["detail"] == {"messages": 2, "history_len": 1, "sources": 1}
    first, second = by_kind(r, "model")
    assert (first["start"], first["end"]) == (T0 + 0.5, T0 + 1.0)
    assert first["detail"]["first_chunk_ms"] == pytest.approx(200.0)
    assert (first["detail"]["input_tokens"], first["detail"]["output_tokens"]) == (30, 12)
    assert first["detail"]["tokens_per_s"] == pytest.approx(12 / 0.3, abs=0.1)  # from the first chunk to the end
    # no first_chunk_at (an older log): no time to first chunk, the rate over the whole call
    assert second["detail"]["first_chunk_ms"] is None
    assert (second["detail"]["input_tokens"], second["detail"]["output_tokens"]) == (50, 30)
    assert second["detail"]["tokens_per_s"] == pytest.approx(30 / 2.0)
    assert second["detail"]["deltas"] == 2
    assert second["detail"]["finish_reason"] == "stop"
    tools = by_kind(r, "tool")
    assert [(t["start"], t["end"], t["detail"]["call_id"], t["detail"]["error"]) for t in tools] == [
        (T0 + 1.1, T0 + 2.1, "a", None),
        (T0 + 1.2, T0 + 1.6, "b", "boom"),
    ]
    outlet = by_kind(r, "outlet")[0]
    assert (outlet["start"], outlet["end"], outlet["detail"]["errors"]) == (T0 + 4.6, T0 + 4.9, 1)
    assert [m["type"] for m in r["marks"]] == ["turn.completed"]
    assert r["marks"][0]["seq"] == 23


def test_an_approval_wait_and_a_denial() -> None:
    r = spans(
        "t1",
        log(
            (0.0, "turn.started", {}),
            (0.2, "assembly.completed", {"messages": []}),
            (0.3, "model.requested", {"iteration": 0}),
            (0.5, "model.completed", {"finish_reason": "tool_calls"}),
            (0.5, "tools.batch", {"iteration": 0}),
            (0.6, "tool.approval_requested", {"call_id": "a", "name": "rm", "arguments": "{}"}),  # 6
            (0.6, "tool.approval_requested", {"call_id": "b", "name": "ls", "arguments": "{}"}),  # 7
            (30.0, "tool.approval", {"call_id": "b", "approve": True, "by": "ann"}),  # 8
            (90.0, "tool.approval", {"call_id": "a", "approve": False}),  # 9
            (90.0, "tools.decided", {}),
        ),
    )
    approvals = by_kind(r, "approval")
    assert [(a["name"], a["seq"], a["end_seq"], a["status"], duration(a)) for a in approvals] == [
        ("approval of rm", 6, 9, "denied", pytest.approx(89.4)),
        ("approval of ls", 7, 8, "approved", pytest.approx(29.4)),
    ]
    model = by_kind(r, "model")[0]
    # no usage: no tokens and no rate, but not an error
    assert (model["detail"]["output_tokens"], model["detail"]["tokens_per_s"]) == (None, None)


def test_a_crash_ends_what_was_open_and_a_resume_begins_it_again() -> None:
    r = spans(
        "t1",
        log(
            (0.0, "turn.started", {}),
            (0.1, "assembly.completed", {"messages": []}),
            (0.2, "model.requested", {"iteration": 0}),  # 3
            (0.4, "model.completed", {"finish_reason": "tool_calls"}),
            (0.4, "tools.batch", {"iteration": 0}),
            (0.5, "tool.started", {"call_id": "a", "name": "slow"}),  # 6
            (9.0, "turn.interrupted", {"reason": "owner lost"}),  # 7
            (9.1, "turn.resumed", {"from_seq": 6, "from_pos": 0, "epoch": 2, "mode": "restart"}),  # 8
            (9.2, "tool.started", {"call_id": "a", "name": "slow", "attempt": 2}),  # 9
            (9.9, "tool.completed", {"call_id": "a", "name": "slow", "output": "ok"}),  # 10
            (10.0, "context.reinjected", {"iteration": 1}),  # 11
            (10.1, "model.requested", {"iteration": 1}),  # 12
            (10.3, "model.warning", {"message": "bad line"}),  # 13
            (11.0, "turn.failed", {"error": {"message": "upstream died"}}),  # 14
        ),
    )
    tools = by_kind(r, "tool")
    assert [(t["seq"], t["end_seq"], t["status"], t["detail"]["attempt"]) for t in tools] == [(6, 7, "interrupted", 1), (9, 10, "completed", 2)]
    last = by_kind(r, "model")[-1]
    assert (last["seq"], last["end_seq"], last["status"], last["end"]) == (12, 14, "failed", T0 + 11.0)
    assert [(m["type"], m["seq"], m["detail"]) for m in r["marks"]] == [
        ("turn.interrupted", 7, "owner lost"),
        ("turn.resumed", 8, "restart"),
        ("model.warning", 13, "bad line"),
        ("turn.failed", 14, "upstream died"),
    ]


def test_a_running_turn_leaves_its_last_span_open() -> None:
    r = spans("t1", log((0.0, "turn.started", {}), (0.1, "assembly.completed", {}), (0.2, "model.requested", {"iteration": 0})))
    model = by_kind(r, "model")[0]
    assert (model["status"], model["end"], model["end_seq"]) == ("open", None, None)
    assert spans("t1", [])["spans"] == []


def test_ten_thousand_events_in_one_pass() -> None:
    deltas = [(0.3 + i * 0.001, "model.delta", {"kind": "text", "pos": i, "text": "w ", "lens": [2]}) for i in range(10_000)]
    events = log((0.0, "turn.started", {}), (0.1, "assembly.completed", {}), (0.2, "model.requested", {"iteration": 0}), *deltas)
    started = time.perf_counter()
    r = spans("t1", events)
    took = time.perf_counter() - started
    assert by_kind(r, "model")[0]["detail"]["deltas"] == 10_000
    assert r["last_seq"] == 10_003
    assert took < 0.5, f"{took:.3f} s for 10,003 events"


def test_a_forks_copied_events_keep_their_parents_times_off_its_axis() -> None:
    # forked at the parent's seq 4 (its second model.requested): the fork's seqs 2-4 are the parent's 1-3, an hour earlier
    r = spans(
        "t1",
        log(
            (3600.0, "turn.forked", {"parent_turn_id": "p1", "at": 4}),  # 1
            (0.0, "turn.started", {}),  # 2, copied
            (0.1, "assembly.completed", {}),  # 3, copied
            (0.2, "model.requested", {"iteration": 0}),  # 4, copied
            (3600.3, "model.warning", {"message": "a bad line"}),  # 5: past the fork point, the fork's own
            (3600.5, "model.completed", {"finish_reason": "stop", "usage": {"completion_tokens": 10}}),  # 6
            (3601.0, "turn.completed", {}),  # 7
        ),
    )
    assert (r["start"], r["end"]) == (T0 + 3600.0, T0 + 3601.0)
    assert [(s["kind"], s["copied"]) for s in r["spans"]] == [("assembly", True), ("model", True)]
    assert [(m["type"], m["seq"]) for m in r["marks"]] == [("turn.forked", 1), ("model.warning", 5), ("turn.completed", 7)]
