"""The engine's contract: the state machine, the fold, the log's shape."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from engine.events import ModelDelta, TurnStarted, delta_event, make_event
from engine.fold.turn_view import TurnView, fold
from engine.machine import IllegalTransition, TurnMachine
from engine.ports import Wake
from tests.harness import Service, make_settings, start_service, stop_service
from tests.oracle import check_completion_against_turn, check_stream_against_log, read_stream
from tests.upstream import Reply, ScriptedUpstream

USER = [{"role": "user", "content": "go"}]
LEGAL_ORDER = ["turn.started", "assembly.completed", "model.requested", "model.completed", "turn.finalized", "turn.completed"]


# The state machine, written out by hand (an oracle independent of
# engine.machine.TRANSITIONS): legal logs as (event, state after it) ...
LEGAL_SEQUENCES: dict[str, list[tuple[str, str]]] = {
    "plain answer, every optional step": [
        ("turn.started", "assembling"),
        ("assembly.step", "assembling"),
        ("assembly.completed", "assembling"),
        ("model.requested", "streaming"),
        ("model.delta", "streaming"),
        ("model.warning", "streaming"),
        ("model.item", "streaming"),
        ("model.completed", "streaming"),
        ("turn.finalized", "finalizing"),
        ("outlet.applied", "outlet"),
        ("background.started", "background"),
        ("background.result", "background"),
        ("turn.completed", "done"),
    ],
    "a fork: turn.forked, then its copy of the parent's turn.started": [
        ("turn.forked", "new"),
        ("turn.started", "assembling"),
        ("assembly.completed", "assembling"),
        ("model.requested", "streaming"),
        ("model.completed", "streaming"),
        ("tools.batch", "executing_tools"),
        ("tool.completed", "executing_tools"),
        ("context.reinjected", "reinjecting"),
        ("model.requested", "streaming"),
        ("model.completed", "streaming"),
        ("turn.finalized", "finalizing"),
        ("turn.completed", "done"),
    ],
    "two tool rounds, then the iteration limit": [
        ("turn.started", "assembling"),
        ("assembly.completed", "assembling"),
        ("model.requested", "streaming"),
        ("model.item", "streaming"),
        ("model.completed", "streaming"),
        ("tools.batch", "executing_tools"),
        ("tool.started", "executing_tools"),
        ("tool.event", "executing_tools"),
        ("tool.completed", "executing_tools"),
        ("context.reinjected", "reinjecting"),
        ("model.requested", "streaming"),
        ("model.fallback", "streaming"),
        ("model.requested", "streaming"),
        ("model.completed", "streaming"),
        ("tools.batch", "executing_tools"),
        ("tool.completed", "executing_tools"),
        ("context.reinjected", "reinjecting"),
        ("turn.iteration_limit", "reinjecting"),
        ("turn.finalized", "finalizing"),
        ("turn.completed", "done"),
    ],
    "client tools end the turn from executing_tools": [
        ("turn.started", "assembling"),
        ("assembly.completed", "assembling"),
        ("model.requested", "streaming"),
        ("model.completed", "streaming"),
        ("tools.batch", "executing_tools"),
        ("turn.iteration_limit", "executing_tools"),
        ("turn.finalized", "finalizing"),
        ("background.started", "background"),
        ("turn.completed", "done"),
    ],
    "limit while streaming, outlet then done": [
        ("turn.started", "assembling"),
        ("assembly.completed", "assembling"),
        ("model.requested", "streaming"),
        ("turn.iteration_limit", "streaming"),
        ("turn.finalized", "finalizing"),
        ("outlet.applied", "outlet"),
        ("turn.completed", "done"),
    ],
    "crash mid-stream, resumed, re-requested": [
        ("turn.started", "assembling"),
        ("assembly.completed", "assembling"),
        ("model.requested", "streaming"),
        ("model.delta", "streaming"),
        ("turn.interrupted", "streaming"),
        ("turn.resumed", "streaming"),
        ("model.requested", "streaming"),
        ("model.delta", "streaming"),
        ("model.completed", "streaming"),
        ("turn.finalized", "finalizing"),
        ("turn.completed", "done"),
    ],
    "crash during tools, resumed, then cancelled": [
        ("turn.started", "assembling"),
        ("assembly.completed", "assembling"),
        ("model.requested", "streaming"),
        ("model.completed", "streaming"),
        ("tools.batch", "executing_tools"),
        ("tool.started", "executing_tools"),
        ("turn.interrupted", "executing_tools"),
        ("turn.resumed", "executing_tools"),
        ("turn.cancel_requested", "executing_tools"),
        ("turn.cancelled", "cancelled"),
    ],
    "cancelled while assembling": [
        ("turn.started", "assembling"),
        ("turn.cancel_requested", "assembling"),
        ("turn.cancelled", "cancelled"),
    ],
    "failed while streaming": [
        ("turn.started", "assembling"),
        ("assembly.completed", "assembling"),
        ("model.requested", "streaming"),
        ("turn.failed", "failed"),
    ],
    "failed while reinjecting": [
        ("turn.started", "assembling"),
        ("assembly.completed", "assembling"),
        ("model.requested", "streaming"),
        ("tools.batch", "executing_tools"),
        ("context.reinjected", "reinjecting"),
        ("turn.failed", "failed"),
    ],
    "cancelled in the background step": [
        ("turn.started", "assembling"),
        ("assembly.completed", "assembling"),
        ("model.requested", "streaming"),
        ("turn.finalized", "finalizing"),
        ("background.started", "background"),
        ("turn.cancel_requested", "background"),
        ("turn.cancelled", "cancelled"),
    ],
    "failed in the outlet step": [
        ("turn.started", "assembling"),
        ("assembly.completed", "assembling"),
        ("model.requested", "streaming"),
        ("turn.finalized", "finalizing"),
        ("outlet.applied", "outlet"),
        ("turn.failed", "failed"),
    ],
}

# ... and events that must be refused in a state.
ILLEGAL: list[tuple[str, str]] = [
    ("new", "assembly.completed"),
    ("new", "model.requested"),
    ("new", "turn.cancelled"),
    ("new", "turn.interrupted"),
    ("assembling", "turn.started"),
    ("assembling", "turn.forked"),
    ("streaming", "turn.forked"),
    ("done", "turn.forked"),
    ("assembling", "model.delta"),
    ("assembling", "tools.batch"),
    ("assembling", "turn.finalized"),
    ("assembling", "turn.completed"),
    ("streaming", "assembly.completed"),
    ("streaming", "tool.started"),
    ("streaming", "context.reinjected"),
    ("streaming", "turn.completed"),
    ("executing_tools", "model.delta"),
    ("executing_tools", "model.completed"),
    ("executing_tools", "model.requested"),
    ("executing_tools", "tools.batch"),
    ("reinjecting", "tool.completed"),
    ("reinjecting", "model.delta"),
    ("reinjecting", "context.reinjected"),
    ("finalizing", "model.requested"),
    ("finalizing", "turn.finalized"),
    ("finalizing", "background.result"),
    ("outlet", "outlet.applied"),
    ("outlet", "model.delta"),
    ("background", "turn.finalized"),
    ("background", "outlet.applied"),
    ("done", "turn.cancelled"),
    ("done", "turn.failed"),
    ("done", "turn.resumed"),
    ("done", "turn.completed"),
    ("cancelled", "turn.failed"),
    ("cancelled", "turn.cancel_requested"),
    ("failed", "turn.resumed"),
    ("failed", "model.requested"),
    ("streaming", "model.teleported"),
]


@pytest.mark.parametrize("enforce", [False, True], ids=["table", "transitions"])
@pytest.mark.parametrize("name", list(LEGAL_SEQUENCES))
def test_legal_sequences_reach_the_expected_states(name: str, enforce: bool) -> None:
    # The fold's dict lookup and the live actor's transitions.Machine both.
    machine = TurnMachine(enforce=enforce)
    for event_type, expected in LEGAL_SEQUENCES[name]:
        assert machine.allows(event_type), f"{event_type} refused in {machine.state}"
        assert machine.apply(event_type) == expected, f"{event_type}: expected {expected}"
        assert machine.state == expected
    assert machine.terminal == (machine.state in ("done", "cancelled", "failed"))


@pytest.mark.parametrize("enforce", [False, True], ids=["table", "transitions"])
@pytest.mark.parametrize(("state", "event_type"), ILLEGAL)
def test_illegal_events_raise_and_leave_the_state(state: str, event_type: str, enforce: bool) -> None:
    machine = TurnMachine(state, enforce=enforce)
    assert not machine.allows(event_type)
    with pytest.raises(IllegalTransition):
        machine.apply(event_type)
    assert machine.state == state


def test_live_machines_share_one_transitions_machine_but_not_state() -> None:
    a, b = TurnMachine(enforce=True), TurnMachine(enforce=True)
    assert a.apply("turn.started") == "assembling"
    assert b.state == "new"
    assert b.apply("turn.started") == "assembling"
    assert a.apply("assembly.completed") != "new"
    assert b.state == "assembling"


def test_delta_event_equals_the_validated_model_delta() -> None:
    fast = delta_event("t1", 7, "reasoning", 3, ["a", "é✓", "", "xyz"])
    slow = make_event("t1", 7, ModelDelta(kind="reasoning", pos=3, text="aé✓xyz", lens=[1, 2, 0, 3]), at=fast.at)
    assert fast == slow
    assert fast.model_dump() == slow.model_dump()
    # Built as pydantic builds a model: the same set fields, copies, frozen.
    assert fast.model_fields_set == slow.model_fields_set == set(type(slow).model_fields)
    assert fast.model_copy(update={"seq": 8}).seq == 8 and fast.seq == 7
    assert fast.model_dump_json() == slow.model_dump_json()
    with pytest.raises(ValidationError):
        fast.seq = 9


def test_unknown_event_type_raises() -> None:
    with pytest.raises(IllegalTransition):
        TurnMachine("streaming").apply("model.teleported")


def test_fold_rejects_gaps_and_illegal_orders() -> None:
    started = make_event("t1", 1, TurnStarted(chat_id="c", user_id="u", model="m", request={}))
    delta = make_event("t1", 3, ModelDelta(pos=2, text="x", lens=[1]))
    with pytest.raises(ValueError):
        fold("t1", [started, delta])  # seq 2 missing
    early = make_event("t1", 2, ModelDelta(pos=2, text="x", lens=[1]))
    with pytest.raises(IllegalTransition):
        fold("t1", [started, early])  # a delta before the model was requested


def _types(events: list[dict]) -> list[str]:
    return [e["type"] for e in events]


async def test_log_order_seq_and_write_ahead(service: Service) -> None:
    service.upstream.enqueue(Reply(text="abc " * 50, chunk_size=2, delay=0.001))
    status, _, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
    assert status == 200
    events = await service.events(headers["X-Turn-Id"])
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), "seq strictly increasing, no gaps"
    lifecycle = [t for t in _types(events) if t != "model.delta"]
    assert lifecycle == LEGAL_ORDER
    types = _types(events)
    # write-ahead: the request is on the log before any output of it
    assert types.index("model.requested") < types.index("model.delta")
    # every state the projection passes through is legal, replayed step by step
    states = []
    for upto in range(1, len(events) + 1):
        _, view = await service.get(f"/v1/turns/{headers['X-Turn-Id']}/replay?upto={upto}")
        states.append(view["state"])
    assert states[0] == "assembling" and states[-1] == "done"
    assert set(states) <= {"assembling", "streaming", "finalizing", "done"}


async def test_group_commit_keeps_the_log_compact(service: Service) -> None:
    answer = "".join(f"tok{i} " for i in range(1000))  # ~1,000 tokens
    service.upstream.enqueue(Reply(text=answer, chunk_size=5))
    status, body, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
    assert status == 200 and body["choices"][0]["message"]["content"] == answer
    events = await service.events(headers["X-Turn-Id"])
    deltas = [e for e in events if e["type"] == "model.delta"]
    chunks = sum(len(e["data"]["lens"]) for e in deltas)
    assert chunks == len(answer) // 5 + (1 if len(answer) % 5 else 0)
    assert len(deltas) < chunks / 10, "deltas are batched, not one event per chunk"
    log_bytes = sum(len(json.dumps(e["data"], separators=(",", ":"))) for e in deltas)
    assert log_bytes <= 3 * len(answer.encode())


@pytest.fixture
async def one_chunk_windows(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> AsyncIterator[Service]:
    """The service writing each upstream chunk as its own ``model.delta``: every
    chunk boundary is a prefix of the log."""
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, flush_max_chunks=1), upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


THINK_CHUNKS = ["<thi", "nk>hmm", "</think>", "Answer", " here"]


async def test_think_tags_every_prefix_of_the_log_is_what_clients_were_shown(one_chunk_windows: Service) -> None:
    service = one_chunk_windows
    service.upstream.enqueue(Reply(chunks=THINK_CHUNKS), Reply(chunks=THINK_CHUNKS))
    # Not streamed: the answer is the actor's own view of the turn it ended.
    status, body, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
    assert status == 200, body
    assert body["choices"][0]["message"]["content"] == "Answer here"
    assert body["choices"][0]["message"]["reasoning_content"] == "hmm"
    view = await service.turn(headers["X-Turn-Id"])
    assert [i["type"] for i in view["output"]] == ["reasoning", "message"]
    check_completion_against_turn(body, view)
    deltas = [e for e in await service.events(view["id"]) if e["type"] == "model.delta"]
    assert [len(e["data"]["lens"]) for e in deltas] == [1] * len(THINK_CHUNKS)
    await check_stream_against_log(service, view["id"], await read_stream(service, view["id"]))
    # Streamed: what the client was sent live, at every prefix of the log.
    async with service.http.post(service.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True}) as resp:
        raw = await resp.text()
        turn_id = resp.headers["X-Turn-Id"]
    stream = await check_stream_against_log(service, turn_id, raw)
    shown = stream.upto(max(stream.ids))
    assert (shown.content, shown.reasoning, shown.finish) == ("Answer here", "hmm", "stop")


async def test_subscription_get_times_out_and_wakes() -> None:
    from engine.run.live import InProcessBus

    bus = InProcessBus(limit=3)
    sub = bus.subscribe("t1")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await sub.get(0.05) is None  # nothing came: a timeout, not an error
    assert loop.time() - t0 >= 0.04
    message = Wake()
    loop.call_later(0.02, bus.publish, "t1", message)
    assert await sub.get(5.0) is message  # a message ends the wait long before the timeout
    assert loop.time() - t0 < 2.0
    for _ in range(4):  # over the limit: lagged, get says None at once
        bus.publish("t1", Wake())
    assert sub.lagged and await sub.get(5.0) is None
    sub.reset()
    loop.call_later(0.02, sub.close)
    assert await sub.get(5.0) is None and sub.closed


def test_a_turn_view_is_freed_without_the_cyclic_gc() -> None:
    # A view <-> accumulator cycle once made every turn's state garbage that
    # only a GC pass could free; under load those passes paused the loop.
    import gc
    import weakref

    from engine.events import ModelRequested

    gc.collect()
    gc.disable()
    try:
        view = TurnView("t-free", enforce=True)
        for seq, data in enumerate(
            [TurnStarted(chat_id="c", user_id="u", model="m", stream=True, request={"model": "m"}), ModelRequested(iteration=0)],
            start=1,
        ):
            view.apply(make_event("t-free", seq, data))
        for i in range(20):
            view.feed_chunk("text", f"<think>a{i}</think>b{i} " if i % 5 == 0 else f"w{i} ")
        assert view.output  # items were made (ids drawn from the view's id source)
        ref = weakref.ref(view)
        acc_ref = weakref.ref(view.acc)
        del view
        assert ref() is None and acc_ref() is None
    finally:
        gc.enable()
