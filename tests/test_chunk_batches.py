"""One fold per chunk, one live message per upstream read (CPU per chunk).

The actor folds each chunk once and publishes a read's chunks as one
``LiveChunks``; followers show the actor's pieces and fold a window's shown
text once, when its ``model.delta`` event arrives. The oracle everywhere is
the log: what a live client received must be what a client reading the log
afterwards receives, and a follower's view must be the log's fold.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest

from engine.events import Event
from engine.fold.accumulator import Piece
from engine.fold.turn_view import TurnView, fold
from engine.ports import LiveChunks
from engine.run.follow import EventOut, TurnFollower, chunk_outs
from tests.harness import Service, make_settings, sse_messages, start_service, stop_service
from tests.upstream import Reply, ScriptedUpstream

# Each test over the live path's shortcuts and over its plain reference path.
pytestmark = pytest.mark.live_paths

USER = [{"role": "user", "content": "go"}]
# Tags split across chunks, held-back prefixes ("<", "<th"), a literal "a<b":
# the pieces depend on the accumulator's state at every chunk.
CHUNKS = [
    "Intro ", "<", "th", "ink>", "plan ", "it", "</th", "ink>", " then a<b and ",
    "<thi", "nk>more</think>", "done. ", *[f"w{i} " for i in range(300)], "<", "end",
]  # fmt: skip


async def _stream(service: Service, body: dict[str, Any]) -> tuple[str, str]:
    async with service.http.post(service.v1 + "/chat/completions", json=body) as resp:
        assert resp.status == 200
        return resp.headers["X-Turn-Id"], await resp.text()


async def test_live_sse_bytes_equal_the_logs_for_tags_split_across_batched_chunks(service: Service) -> None:
    service.upstream.enqueue(Reply(chunks=CHUNKS, reasoning=["let me ", "see"]))
    turn_id, live = await _stream(service, {"model": "gpt-test", "messages": USER, "stream": True})
    async with service.http.get(f"{service.v1}/turns/{turn_id}/stream") as again:
        replayed = await again.text()
    assert replayed == live
    view = await service.turn(turn_id)
    shown = "".join((c["choices"][0]["delta"].get("content") or "") for _i, d in sse_messages(live) if d != "[DONE]" and (c := json.loads(d)).get("choices"))
    assert shown == view["content"] and "w299" in shown
    status, verified = await service.get(f"/v1/turns/{turn_id}/verify")
    assert status == 200 and verified["ok"], verified


async def test_windows_sealed_inside_a_read_keep_live_bytes_equal_to_the_logs(
    tmp_path: Path, upstream: ScriptedUpstream, database_url: str, live_path: str
) -> None:
    """A read of more chunks than a window holds is cut into several
    ``model.delta`` events while its chunks go out as one message."""
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, flush_max_chunks=7, live_fast_paths=live_path == "fast")
    svc = await start_service(settings, upstream)
    try:
        upstream.enqueue(Reply(chunks=CHUNKS, pause_after=3))
        resp = await svc.http.post(svc.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True})
        turn_id = resp.headers["X-Turn-Id"]
        await asyncio.wait_for(upstream.paused.wait(), 5)
        upstream.release()  # the rest, written back to back
        live = await resp.text()
        async with svc.http.get(f"{svc.v1}/turns/{turn_id}/stream") as again:
            assert await again.text() == live
        windows = [e for e in await svc.events(turn_id) if e["type"] == "model.delta"]
        assert len(windows) >= len(CHUNKS) // 7 and all(len(e["data"]["lens"]) <= 7 for e in windows)
        status, verified = await svc.get(f"/v1/turns/{turn_id}/verify")
        assert status == 200 and verified["ok"], verified
    finally:
        await stop_service(svc)


async def test_a_burst_is_published_as_one_live_message_per_read(service: Service) -> None:
    """Chunks written at once by the upstream reach subscribers in batches,
    whose pieces (and positions) are the log's."""
    service.upstream.enqueue(Reply(chunks=CHUNKS, pause_after=2))
    resp = await service.http.post(service.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True})
    turn_id = resp.headers["X-Turn-Id"]
    await asyncio.wait_for(service.upstream.paused.wait(), 5)
    sub = service.services.supervisor.join(turn_id).subscription
    service.upstream.release()
    got: list[tuple[int, tuple[Piece, ...]]] = []
    batches: list[int] = []
    try:
        while True:
            message = await asyncio.wait_for(sub.get(), 10)
            if isinstance(message, LiveChunks):
                batches.append(len(message))
                got.extend(zip(range(message.pos, message.end), message.pieces))
            elif message is None or getattr(getattr(message, "event", None), "type", "") == "model.completed":
                break
    finally:
        sub.close()
    await resp.text()
    assert max(batches) > 1, batches  # 300 chunks written back to back: some reads carry several
    assert len(batches) < len(got)
    # The log's fold gives every live chunk the same position and pieces.
    reread = TurnView(turn_id)
    by_pos = {}
    for event in await service.services.store.read(turn_id):
        for out in reread.apply(event):
            by_pos[out.pos] = out.pieces
    assert [pos for pos, _ in got] == sorted({pos for pos, _ in got})
    assert all(by_pos.get(pos, ()) == pieces for pos, pieces in got)


async def test_followers_fed_in_any_grouping_end_at_the_logs_fold(service: Service) -> None:
    """A follower that showed live chunks (the actor's pieces, in reads of any
    size, joining anywhere) and then got their events ends with the view and
    the output of a follower that read only the log."""
    service.upstream.enqueue(Reply(chunks=CHUNKS, reasoning=["why ", "<not>"]))
    turn_id, _ = await _stream(service, {"model": "gpt-test", "messages": USER, "stream": True})
    log = await service.services.store.read(turn_id)
    reader = TurnFollower(turn_id)
    expected = [out for event in log for out in reader.on_event(event)]
    rng = random.Random(13)
    for _ in range(20):
        follower, outs = TurnFollower(turn_id), []
        for event, live in _as_published(turn_id, log):
            while live:  # one read: a random number of the window's chunks
                n = rng.randint(1, len(live))
                batch, live = live[:n], live[n:]
                outs += follower.on_chunks(_message(batch, plain=rng.random() < 0.5))
            outs.extend(follower.on_event(event))
        assert _shown(outs) == _shown(expected)
        assert follower.view.public() == fold(turn_id, log).public()


@pytest.mark.live_paths("fast")  # a fold of the log; the service only writes it
async def test_followers_fed_out_of_order_show_each_position_once_in_order(service: Service) -> None:
    """Live messages that come ahead of the events before them, after their
    own event, or again in part (a reconnect's window, a catch-up) still give
    each position once, in order, with the log's pieces; and each as soon as
    everything before it has come (the live text is not held back for its
    event)."""
    service.upstream.enqueue(Reply(chunks=CHUNKS[:60], reasoning=["why ", "<not>"]))
    turn_id, _ = await _stream(service, {"model": "gpt-test", "messages": USER, "stream": True})
    log = await service.services.store.read(turn_id)
    reader = TurnFollower(turn_id)
    at: dict[int, set[int]] = {}  # each event's positions
    for event in log:
        at[event.seq] = {out.pos for out in reader.on_event(event)}
    reader = TurnFollower(turn_id)
    expected = [out for event in log for out in reader.on_event(event)]
    every = sorted(set().union(*at.values()))
    rng = random.Random(7)
    for _ in range(40):
        items: list[Event | LiveChunks] = []
        for event, window in _as_published(turn_id, log):
            live = window
            while live:
                n = rng.randint(1, len(live))
                items.append(_message(live[:n], plain=rng.random() < 0.5))
                live = live[n:]
                if rng.random() < 0.3:  # some of the window again, across reads
                    a = rng.randrange(len(window))
                    items.append(_message(window[a : rng.randint(a + 1, len(window))], plain=False))
            items.append(event)
        for _ in range(len(items) // 3):  # a live message moved ahead or behind
            i = rng.randrange(len(items))
            if isinstance(items[i], LiveChunks):
                item = items.pop(i)
                items.insert(max(0, min(len(items), i + rng.randint(-4, 4))), item)
        follower, outs, come = TurnFollower(turn_id), [], set()
        for item in items:
            outs += follower.on_event(item) if isinstance(item, Event) else follower.on_chunks(item)
            come |= at[item.seq] if isinstance(item, Event) else set(range(item.pos, item.end))
            ready = next((i for i, p in enumerate(every) if p not in come), len(every))  # everything before has come
            assert _shown(outs)[-1:] == _shown(expected)[ready - 1 : ready] if ready else not outs
        assert follower.view.public() == fold(turn_id, log).public()


#: One live chunk: its event's seq, its position, kind, text and the actor's pieces of it.
Chunk = tuple[int, int, str, str, tuple[Piece, ...]]


def _message(chunks: list[Chunk], *, plain: bool) -> LiveChunks:
    """One published read of consecutive chunks; ``plain`` where every chunk
    is one text piece of its own text (as the actor sends plain chunks)."""
    seq, pos, kind = chunks[0][:3]
    texts, pieces = [c[3] for c in chunks], [c[4] for c in chunks]
    if plain and kind == "text" and all(p == (Piece("text", t),) for t, p in zip(texts, pieces)):
        return LiveChunks(seq, pos, kind, texts)
    return LiveChunks(seq, pos, kind, texts, pieces)


def _as_published(turn_id: str, log: list[Event]) -> list[tuple[Event, list[Chunk]]]:
    """Each event with the live chunks the actor published before it (its own
    fold, one chunk at a time, as ``TurnActor.deltas`` does)."""
    actor = TurnView(turn_id)
    out: list[tuple[Event, list[Chunk]]] = []
    for event in log:
        live: list[Chunk] = []
        if event.type == "model.delta":
            data, offset = event.data, 0
            for n in data["lens"]:
                text = data["text"][offset : offset + n]
                live.append((event.seq, actor.next_pos, data["kind"], text, actor.feed_chunk(data["kind"], text)))
                offset += n
            actor.apply(event, live_applied=True)
        else:
            actor.apply(event)
        out.append((event, live))
    return out


def _shown(outs: list[Any]) -> list[tuple[int, Any]]:
    """Per position what a client is shown (live chunks one by one)."""
    each = [c for o in outs for c in (chunk_outs(o) if isinstance(o, LiveChunks) else [o])]
    return [(o.pos, o.event.type if isinstance(o, EventOut) else [(p.kind, p.text) for p in o.pieces]) for o in each]


async def test_websocket_deltas_false_gets_events_only_with_the_whole_text(service: Service) -> None:
    service.upstream.enqueue(Reply(chunks=CHUNKS[:40]))
    got: list[dict[str, Any]] = []
    async with service.http.ws_connect(service.v1 + "/ws") as ws:
        await ws.send_json({"type": "chat", "deltas": False, "request": {"model": "gpt-test", "messages": USER}})
        async for msg in ws:
            data = json.loads(msg.data)
            got.append(data)
            if data["type"] == "event" and data["event"]["type"] == "turn.completed":
                break
        await ws.send_json({"type": "subscribe", "turn_id": got[0]["turn_id"], "deltas": "no"})
        error = await ws.receive_json()
    assert error["type"] == "error" and error["code"] == "invalid_value"
    assert got[0]["type"] == "turn" and all(m["type"] == "event" for m in got[1:])
    events = [m for m in got if m["type"] == "event"]
    assert [m["seq"] for m in events] == list(range(1, len(events) + 1))
    text = "".join(m["event"]["data"]["text"] for m in events if m["event"]["type"] == "model.delta")
    assert text == "".join(CHUNKS[:40])


async def test_a_subscribers_bound_counts_the_chunks_of_a_batch() -> None:
    """A client that stops reading holds at most ``limit`` chunks, however
    many reads they came in."""
    from engine.run.live import InProcessBus

    bus = InProcessBus(limit=10)
    sub = bus.subscribe("t1")
    batch = LiveChunks(1, 1, "text", ["x"] * 4)
    bus.publish("t1", batch)
    bus.publish("t1", batch)  # 8 chunks queued in 2 messages
    assert not sub.lagged
    first = await sub.get(1.0)
    assert isinstance(first, LiveChunks)
    bus.publish("t1", batch)  # 8 again once 4 were taken
    assert not sub.lagged
    bus.publish("t1", batch)  # 12: over the bound
    assert sub.lagged and await sub.get(1.0) is None


async def test_a_window_of_large_chunks_is_sealed_at_its_character_bound(service: Service) -> None:
    """8 KB chunks arriving faster than the 50 ms window: a window is sealed at
    256 Ki characters, long before 512 chunks (4 MB: one WebSocket message over
    common clients' caps)."""
    text = "".join(f"w{i:06d} " for i in range(250_000))  # 2 MB
    service.upstream.enqueue(Reply(text=text, chunk_size=8192))
    status, body, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
    assert status == 200, body
    turn_id = headers["X-Turn-Id"]
    windows = [e for e in await service.events(turn_id) if e["type"] == "model.delta"]
    sizes = [sum(e["data"]["lens"]) for e in windows]
    assert sum(sizes) == len(text) and (await service.turn(turn_id))["content"] == text
    assert max(sizes) <= 256 * 1024 + 8192, sizes
