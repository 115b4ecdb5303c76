"""Reconnecting clients: SSE Last-Event-ID and WebSocket subscribe after=SEQ."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.harness import Service, sse_messages, sse_text
from tests.upstream import Reply

# Each test over the live path's shortcuts and over its plain reference path.
pytestmark = pytest.mark.live_paths

USER = [{"role": "user", "content": "go"}]
TEXT = "Reconnect me without losing or repeating a single character. " * 4


async def read_until(resp, predicate) -> str:
    buf = ""
    async for chunk in resp.content.iter_any():
        buf += chunk.decode()
        if predicate(buf):
            break
    return buf


async def test_sse_reconnect_with_last_event_id_has_no_gap_and_no_duplicate(service: Service) -> None:
    service.upstream.enqueue(Reply(text=TEXT, chunk_size=3, pause_after=20))
    resp = await service.http.post(service.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True})
    turn_id = resp.headers["X-Turn-Id"]
    await asyncio.wait_for(service.upstream.paused.wait(), 5)
    first = await read_until(resp, lambda b: sse_text(b.rsplit("\n\n", 1)[0] + "\n\n").__len__() >= 30)
    first = first[: first.rfind("\n\n") + 2]  # only complete messages
    resp.close()
    last_id = [i for i, _ in sse_messages(first) if i is not None][-1]
    service.upstream.release()
    async with service.http.get(f"{service.v1}/turns/{turn_id}/stream", headers={"Last-Event-ID": str(last_id)}) as again:
        assert again.status == 200
        second = await again.text()
    ids = [i for i, _ in sse_messages(first + second) if i is not None]
    assert ids == sorted(set(ids)), "positions strictly increasing across both connections"
    assert sse_text(first) + sse_text(second) == TEXT
    assert (await service.turn(turn_id))["content"] == TEXT


async def test_sse_stream_of_a_finished_turn_replays_it(service: Service) -> None:
    service.upstream.enqueue(Reply(text="short answer"))
    async with service.http.post(service.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True}) as resp:
        turn_id = resp.headers["X-Turn-Id"]
        live = await resp.text()
    async with service.http.get(f"{service.v1}/turns/{turn_id}/stream") as again:
        replayed = await again.text()
    assert replayed == live  # same bytes: same positions, same chunks


async def ws_collect(ws, *, until_terminal: bool = True, limit: int | None = None) -> list[dict]:
    out = []
    async for msg in ws:
        data = json.loads(msg.data)
        out.append(data)
        if limit is not None and len([m for m in out if m["type"] == "event"]) >= limit:
            break
        if until_terminal and data["type"] == "event" and data["event"]["type"] in ("turn.completed", "turn.failed", "turn.cancelled"):
            break
    return out


async def test_websocket_chat_and_resubscribe_after_seq(service: Service) -> None:
    service.upstream.enqueue(Reply(text=TEXT, chunk_size=2, delay=0.002))
    async with service.http.ws_connect(service.v1 + "/ws") as ws:
        await ws.send_json({"type": "chat", "request": {"model": "gpt-test", "messages": USER}})
        ack = await ws.receive_json()
        assert ack["type"] == "turn"
        turn_id = ack["turn_id"]
        first = await ws_collect(ws, limit=4)
    events_first = [m for m in first if m["type"] == "event"]
    last_seq = events_first[-1]["seq"]
    async with service.http.ws_connect(service.v1 + "/ws") as ws:
        await ws.send_json({"type": "subscribe", "turn_id": turn_id, "after": last_seq})
        second = await ws_collect(ws)
    seqs = [m["seq"] for m in events_first + [m for m in second if m["type"] == "event"]]
    assert seqs == list(range(1, len(seqs) + 1)), "every durable event exactly once, in order"
    text = "".join(
        m["event"]["data"]["text"]
        for m in events_first + second
        if m["type"] == "event" and m["event"]["type"] == "model.delta" and m["event"]["data"]["kind"] == "text"
    )
    assert text == TEXT
    # live deltas carry the seq of their durable event
    deltas = [m for m in first + second if m["type"] == "delta"]
    assert deltas and all(isinstance(d["seq"], int) and d["kind"] == "text" for d in deltas)


async def test_websocket_cancel(service: Service) -> None:
    service.upstream.enqueue(Reply(text="stop me please now", chunk_size=3, pause_after=2))
    async with service.http.ws_connect(service.v1 + "/ws") as ws:
        await ws.send_json({"type": "chat", "request": {"model": "gpt-test", "messages": USER}})
        turn_id = (await ws.receive_json())["turn_id"]
        await asyncio.wait_for(service.upstream.paused.wait(), 5)
        await ws.send_json({"type": "cancel", "turn_id": turn_id})
        # The ack and the durable turn.cancelled event travel separately: either may come first.
        got: list[dict[str, Any]] = []
        acks: list[dict[str, Any]] = []
        while not (acks and got and got[-1]["type"] == "event" and got[-1]["event"]["type"] == "turn.cancelled"):
            msg = json.loads((await asyncio.wait_for(ws.receive(), 10)).data)
            (acks if msg["type"] == "cancelled" else got).append(msg)
    service.upstream.release()
    assert got[-1]["event"]["type"] == "turn.cancelled"
    assert acks[0]["status"] == "cancelled"
    assert (await service.turn(turn_id))["content"] == "stop m"


async def test_websocket_bad_messages_get_error_replies(service: Service) -> None:
    async with service.http.ws_connect(service.v1 + "/ws") as ws:
        for bad, code in [
            ("not json", "invalid_json"),
            ("[1,2]", "invalid_message"),
            ('{"type": "dance"}', "unknown_type"),
            ('{"type": "subscribe", "turn_id": "turn_nope"}', "not_found"),
            ('{"type": "subscribe", "turn_id": "x", "after": -1}', "invalid_value"),
            ('{"type": "chat", "request": {"model": "gpt-test"}}', "invalid_value"),
            ('{"type": "chat", "request": {"model": "nope", "messages": [{"role": "user", "content": "x"}]}}', "model_not_found"),
        ]:
            await ws.send_str(bad)
            reply = await ws.receive_json()
            assert reply["type"] == "error" and reply["code"] == code, (bad, reply)


async def test_early_followers_get_the_actors_history_equal_to_the_log(service: Service) -> None:
    # The client that starts a turn follows it from the actor's committed events
    # instead of a read of the log; they must be the log, exactly, until the
    # actor stops keeping them.
    from engine.run.actor import HISTORY_LIMIT

    service.upstream.enqueue(Reply(text=TEXT, chunk_size=3, pause_after=10))
    resp = await service.http.post(service.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True})
    turn_id = resp.headers["X-Turn-Id"]
    await asyncio.wait_for(service.upstream.paused.wait(), 5)
    supervisor, store = service.services.supervisor, service.services.store
    joined = supervisor.join(turn_id)
    joined.subscription.close()
    history = joined.history
    assert history is not None and [e.seq for e in history] == list(range(1, len(history) + 1))
    logged = await store.read(turn_id)
    assert [e.model_dump() for e in history] == [e.model_dump() for e in logged[: len(history)]]
    actor = supervisor.actors[turn_id]
    assert len(history) <= HISTORY_LIMIT
    service.upstream.release()
    assert sse_text(await resp.text()) == TEXT
    await asyncio.shield(actor.done)
    joined = supervisor.join(turn_id)
    joined.subscription.close()
    assert joined.history is None  # the actor is gone: followers read the log


async def test_a_stalled_client_gets_every_chunk_in_order(service: Service) -> None:
    # Live chunks are written from the actor's publish while the socket keeps up;
    # a client that stops reading backs the socket up (the handler's own writes
    # then wait for it) and must still get the whole answer, once, in order.
    lines = [f"{i:06d} " + "y" * 1992 + "\n" for i in range(3000)]  # ~6 MB, one line per chunk
    service.upstream.enqueue(Reply(chunks=lines))
    async with service.http.post(service.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True}) as resp:
        assert resp.status == 200
        first = await resp.content.readany()
        # Stop reading until the upstream has streamed everything (the turn ended).
        await service.wait_status(resp.headers["X-Turn-Id"], "completed", timeout=60)
        body = first + await resp.read()
    assert sse_text(body.decode()) == "".join(lines)
    ids = [i for i, _ in sse_messages(body.decode()) if i is not None]
    assert ids == sorted(set(ids))


async def test_direct_and_queued_output_interleave_in_order(service: Service) -> None:
    # Paced chunks (each alone: written from the actor's publish) while their
    # committed delta events and the turn's end come through the handler's
    # task: the client sees one ordered stream.
    await stream_paced(service, [f"c{i} " for i in range(40)])


@pytest.mark.live_paths("fast")  # the shortcut's own failure
async def test_a_failing_direct_write_falls_back_without_touching_the_turn(service: Service, monkeypatch: Any, caplog: Any) -> None:
    # A bug (or an unexpected error) in the direct SSE path runs inside the
    # actor's publish: it must neither reach the actor nor lose output.
    from adapters.http import live_sinks

    real = live_sinks.DirectSSE.deliver
    calls = {"n": 0}

    def flaky(self: Any, follower: Any, outs: list[Any]) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected failure in deliver")
        real(self, follower, outs)

    monkeypatch.setattr(live_sinks.DirectSSE, "deliver", flaky)
    chunks = [f"d{i} " for i in range(30)]
    turn_id, _body = await stream_paced(service, chunks)
    assert calls["n"] >= 3, "the direct path was used"
    assert "direct output failed" in caplog.text
    turn = await service.turn(turn_id)
    assert turn["status"] == "completed" and turn["content"] == "".join(chunks)


async def test_a_delta_that_fails_to_fold_on_the_direct_path_is_rebuilt_from_the_log(service: Service, monkeypatch: Any) -> None:
    from engine.run import follow as follow_mod

    calls = {"n": 0}

    def flaky(real: Any) -> Any:
        def call(self: Any, delta: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 4:
                raise ValueError("injected: live text out of step")
            return real(self, delta)

        return call

    monkeypatch.setattr(follow_mod.TurnFollower, "on_chunks", flaky(follow_mod.TurnFollower.on_chunks))
    await stream_paced(service, [f"e{i} " for i in range(30)])
    assert calls["n"] > 4


async def stream_paced(service: Service, chunks: list[str]) -> tuple[str, str]:
    """Stream ``chunks`` (5 ms apart) through a turn; check the client got every
    chunk once, in order, with increasing ids, and the ``[DONE]``. Returns
    ``(turn_id, body)``."""
    service.upstream.enqueue(Reply(chunks=chunks, delay=0.005))
    async with service.http.post(service.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True}) as resp:
        turn_id = resp.headers["X-Turn-Id"]
        body = (await resp.read()).decode()
    assert sse_text(body) == "".join(chunks)
    ids = [i for i, _ in sse_messages(body) if i is not None]
    assert ids == sorted(set(ids))
    assert body.rstrip().endswith("data: [DONE]")
    return turn_id, body
