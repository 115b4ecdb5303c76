"""Replay equals live, in the engine: the actor's own view against the fold of
the log, at every committed event.

The real engine in process: ``Supervisor`` and its actors on
``MemoryEventStore``, ``InProcessBus``, the real OpenAI Chat provider against
the scripted upstream, real tool modules. A subscriber joins each turn before
it runs; its ``sink`` (the bus's synchronous delivery, used while the reader is
parked) is called inside the publish, which the actor does right after a
commit while nothing else of the turn runs, so ``actor.view`` is exactly what
the actor holds at that event. Each snapshot must equal the fold of the stored
log up to the snapshot's seq (``fold(log[:seq])``), and at the end the whole
view must equal the fold of the whole log: what clients are told live (the
view feeds the non-streaming answer, the index row, the resume point) is what
a replay rebuilds.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from adapters.catalog import Catalog
from adapters.http.schemas import parse_chat_request
from adapters.providers.openai_chat import OpenAIChatProvider
from adapters.store import MemoryEventStore
from adapters.tools.catalog import DirToolCatalog
from engine.events import Event
from engine.fold.turn_view import fold
from engine.ports import ChatProvider, LiveEvent, LiveMessage
from engine.run.actor import TurnActor
from engine.run.live import InProcessBus
from engine.run.supervisor import Supervisor
from engine.run.wiring import TurnWiring
from engine.settings import EngineSettings
from tests.harness import UPSTREAM_KEY, make_settings
from tests.tools_fixtures import write_tools
from tests.upstream import Reply, ScriptedUpstream

USER = [{"role": "user", "content": "What is the weather?"}]


def _json(value: Any) -> Any:
    """A deep copy as a client would get it (the view's lists and dicts live on)."""
    return json.loads(json.dumps(value))


@dataclass
class Engine:
    supervisor: Supervisor
    store: MemoryEventStore
    bus: InProcessBus
    upstream: ScriptedUpstream


@pytest.fixture
async def engine(tmp_path: Path, upstream: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Engine]:
    monkeypatch.setenv("TURNLOG_TEST_TOOL_LOG", str(tmp_path / "tool.log"))
    assert upstream.url is not None
    provider = OpenAIChatProvider(upstream.url, UPSTREAM_KEY)
    providers: dict[str, ChatProvider] = {"openai": provider}
    catalog = Catalog(make_settings(tmp_path, upstream.url), providers)
    store = MemoryEventStore()
    bus = InProcessBus()
    wiring = TurnWiring(
        store=store,
        blobs=store,
        models=catalog,
        # Small delta windows: an answer is several model.delta events.
        settings=EngineSettings(flush_max_chunks=3, tool_timeout=5.0),
        tools=DirToolCatalog(write_tools(tmp_path / "tools")),
    )
    supervisor = Supervisor(store=store, bus=bus, wiring=wiring)
    await supervisor.start()
    try:
        yield Engine(supervisor, store, bus, upstream)
    finally:
        await supervisor.stop()
        await catalog.close()
        await provider.close()
        await store.close()


@dataclass
class Snapshots:
    """``actor.view`` at each event the actor published, taken inside the publish."""

    actor: TurnActor
    events: list[tuple[Event, dict[str, Any]]] = field(default_factory=list)
    deltas: list[tuple[Event, str, str]] = field(default_factory=list)  # (event, content, reasoning)
    missed: list[LiveMessage] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def take(self, message: LiveMessage) -> bool:
        if isinstance(message, LiveEvent):
            view = self.actor.view
            if message.event.type == "model.delta":
                self.deltas.append((message.event, view.content, view.reasoning_content))
            else:
                self.events.append((message.event, _json(view.public())))
            self.arrived.set()
        return True  # taken here: the parked reader is not woken

    async def published(self, event_type: str) -> None:
        """Wait until the actor has published an event of this type."""
        while not any(e.type == event_type for e, _ in self.events):
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 10)


@dataclass
class Watched:
    """A turn started with a subscriber that snapshots the actor at each publish."""

    actor: TurnActor
    snaps: Snapshots
    reader: asyncio.Task[None]
    close: Callable[[], None]

    async def finished(self) -> TurnActor:
        await asyncio.wait_for(asyncio.shield(self.actor.done), 30)
        self.close()
        await self.reader
        return self.actor


async def start(engine: Engine, body: dict[str, Any]) -> Watched:
    """Start a turn and subscribe before it runs."""
    request = parse_chat_request({"model": "gpt-test", "messages": USER, **body}).recorded()
    actor = await engine.supervisor.start_turn(request=request, user_id="u1", model="gpt-test")
    # start_turn returns once the turn's first commit (turn.started with its
    # assembly and model.requested) is durable and published: a follower
    # takes those from the actor's history with its subscription, as every
    # client does (Supervisor.join). The actor waits for the upstream now and
    # has folded nothing since, so its view is the one it published them with.
    # No await from here to the reader's first wait.
    snaps = Snapshots(actor)
    view = _json(actor.view.public())
    snaps.events.append((Event(turn_id=actor.turn_id, seq=1, type="<start>", at=0.0, data={}), view))
    joined = engine.supervisor.join(actor.turn_id)
    assert joined.history is not None and joined.history[-1].type == "model.requested"
    snaps.events += [(event, view) for event in joined.history[1:]]
    sub = joined.subscription
    sub.sink = snaps.take

    async def read() -> None:
        # Anything this reader gets was not delivered inside its publish.
        while (message := await sub.get()) is not None:
            snaps.missed.append(message)

    return Watched(actor, snaps, asyncio.create_task(read()), sub.close)


async def run_turn(engine: Engine, body: dict[str, Any]) -> tuple[TurnActor, Snapshots]:
    watched = await start(engine, body)
    return await watched.finished(), watched.snaps


async def logged(engine: Engine, turn_id: str, event_type: str, timeout: float = 10.0) -> None:
    """Poll the store until the turn's log has an event of this type."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not any(e.type == event_type for e in await engine.store.read(turn_id)):  # each read yields once
        assert loop.time() < deadline, f"no {event_type} within {timeout} s"


async def check_live_equals_fold(engine: Engine, actor: TurnActor, snaps: Snapshots) -> list[Event]:
    log = await engine.store.read(actor.turn_id)
    turn_id = actor.turn_id
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    assert not snaps.missed, f"published outside the subscriber's sink: {snaps.missed}"
    # Every committed event was published, in order, exactly once.
    published = [e for e, _ in snaps.events[1:]] + [e for e, _, _ in snaps.deltas]
    unpublished = sorted({e.seq for e in log[1:]} - {e.seq for e in published})
    assert not unpublished, f"committed but never published: {[(s, log[s - 1].type) for s in unpublished]}"
    assert [e.model_dump() for e in sorted(published, key=lambda e: e.seq)] == [e.model_dump() for e in log[1:]]
    for event, snapshot in snaps.events:
        # Concurrent tools may have folded (not yet committed) later events.
        assert snapshot["seq"] >= event.seq
        expected = _json(fold(turn_id, log, upto=snapshot["seq"]).public())
        assert snapshot == expected, f"the actor's view at {event.type} (seq {event.seq}) is not the fold of the log"
    for event, content, reasoning in snaps.deltas:
        durable = fold(turn_id, log, upto=event.seq)
        assert content.startswith(durable.content), f"seq {event.seq}: the durable text is not what the actor showed"
        assert reasoning.startswith(durable.reasoning_content)
    assert _json(actor.view.public()) == _json(fold(turn_id, log).public())
    return log


def tool_reply(*calls: tuple[str, dict[str, Any], str], text: str = "") -> Reply:
    return Reply(text=text, tool_calls=[{"name": n, "arguments": a, "id": i} for n, a, i in calls], finish_reason="tool_calls")


async def test_plain_turn(engine: Engine) -> None:
    engine.upstream.enqueue(Reply(text="A plain answer, streamed in small pieces.", chunk_size=2))
    actor, snaps = await run_turn(engine, {})
    log = await check_live_equals_fold(engine, actor, snaps)
    assert actor.view.status == "completed" and actor.view.content == "A plain answer, streamed in small pieces."
    assert sum(e.type == "model.delta" for e in log) >= 5


async def test_three_tool_rounds(engine: Engine) -> None:
    engine.upstream.enqueue(
        tool_reply(("get_weather", {"city": "Paris"}, "w1"), ("get_weather", {"city": "Oslo"}, "w2"), text="Looking. "),
        tool_reply(("add", {"a": 2, "b": 3}, "a1"), text="Adding. "),
        tool_reply(("search", {"q": "x"}, "s1"), ("teleport", {}, "t1")),
        Reply(text="Sunny, 5, one hit."),
    )
    actor, snaps = await run_turn(engine, {"tool_ids": ["weather"]})
    log = await check_live_equals_fold(engine, actor, snaps)
    view = actor.view
    assert view.content == "Looking. Adding. Sunny, 5, one hit."
    outputs = [i for i in view.output if i["type"] == "function_call_output"]
    assert [i["call_id"] for i in outputs] == ["w1", "w2", "a1", "t1", "s1"]  # t1 (unknown) fails before s1 runs
    assert [e.type for e in log].count("context.reinjected") == 3
    # The two lookups overlapped (each returns only once the other started):
    # the actor folded events of one while the other's commit was in flight.
    assert "ran alone" not in json.dumps(outputs)


@pytest.mark.parametrize(
    ("reply", "content", "reasoning"),
    [
        (Reply(reasoning=["Native ", "reasoning ", "first."], text="Then the answer.", chunk_size=3), "Then the answer.", "Native reasoning first."),
        (Reply(chunks=["<thi", "nk>tagged", " thought</th", "ink>The ", "answer", "."]), "The answer.", "tagged thought"),
        (Reply(chunks=["Text, ", "<think>a thought</think>", "then more", " <thin"]), "Text, then more <thin", "a thought"),
    ],
    ids=["native", "think-tags", "tag-mid-answer-and-held-back-tail"],
)
async def test_reasoning(engine: Engine, reply: Reply, content: str, reasoning: str) -> None:
    engine.upstream.enqueue(reply)
    actor, snaps = await run_turn(engine, {})
    await check_live_equals_fold(engine, actor, snaps)
    assert (actor.view.content, actor.view.reasoning_content) == (content, reasoning)


async def test_cancelled_mid_stream(engine: Engine) -> None:
    engine.upstream.enqueue(Reply(text="This answer is cut off by a cancel. " * 4, chunk_size=3, pause_after=10))
    watched = await start(engine, {})
    await asyncio.wait_for(engine.upstream.paused.wait(), 10)
    assert await engine.supervisor.cancel(watched.actor.turn_id, "client") == "cancelled"
    engine.upstream.release()
    actor = await watched.finished()
    log = await check_live_equals_fold(engine, actor, watched.snaps)
    assert [e.type for e in log][-2:] == ["turn.cancel_requested", "turn.cancelled"]
    assert actor.view.status == "cancelled" and actor.view.content


async def test_cancelled_while_a_tool_runs(engine: Engine) -> None:
    engine.upstream.enqueue(tool_reply(("slow", {"seconds": 30}, "sl1"), ("add", {"a": 1, "b": 1}, "a1"), text="Wait. "))
    watched = await start(engine, {"tool_ids": ["weather"]})
    await watched.snaps.published("tool.completed")  # add is done, slow runs
    assert await engine.supervisor.cancel(watched.actor.turn_id, "client") == "cancelled"
    actor = await watched.finished()
    await check_live_equals_fold(engine, actor, watched.snaps)
    calls = {i["call_id"]: i["status"] for i in actor.view.output if i["type"] == "function_call"}
    assert calls == {"sl1": "incomplete", "a1": "completed"}


async def test_an_event_committed_as_the_actor_is_cancelled_is_still_published(engine: Engine) -> None:
    engine.upstream.enqueue(tool_reply(("slow", {"seconds": 30}, "sl1"), ("add", {"a": 1, "b": 1}, "a1")))
    watched = await start(engine, {"tool_ids": ["weather"]})
    await logged(engine, watched.actor.turn_id, "tool.completed")  # durable, the actor not yet resumed
    assert await engine.supervisor.cancel(watched.actor.turn_id, "client") == "cancelled"
    actor = await watched.finished()
    await check_live_equals_fold(engine, actor, watched.snaps)


@pytest.mark.parametrize(
    "reply",
    [
        Reply(status=500, error_message="upstream broke"),
        Reply(text="Half an answer, then the socket drops.", chunk_size=3, fault="disconnect", fault_after=6),
    ],
    ids=["http-500", "disconnect-mid-stream"],
)
async def test_failed_turn(engine: Engine, reply: Reply) -> None:
    engine.upstream.enqueue(reply)
    actor, snaps = await run_turn(engine, {})
    log = await check_live_equals_fold(engine, actor, snaps)
    assert log[-1].type == "turn.failed" and actor.view.status == "failed" and actor.view.error
