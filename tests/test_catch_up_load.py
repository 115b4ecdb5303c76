"""Many clients catching up from the log at once, on a tiny read pool.

Under load (bench ``thousands_ws``) every follower whose live subscription
cannot serve it reads the log; thousands of such reads at once must queue for
the store's connections, however long that takes, never fail the stream.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import engine.run.follow as catchup  # the catch-up reads
from adapters.store import open_store
from engine.run.live import InProcessBus
from tests.harness import Service, make_settings, sse_text, start_service, stop_service
from tests.upstream import Reply, ScriptedUpstream

USER = [{"role": "user", "content": "go"}]
TEXT = "".join(f"word{i} " for i in range(120))
TERMINAL = ("turn.completed", "turn.failed", "turn.cancelled")


async def _ws_follow(service: Service, turn_id: str, after: int) -> list[dict[str, Any]]:
    """A WebSocket client subscribing at ``after``: what it received until the turn's end."""
    got: list[dict[str, Any]] = []
    async with service.http.ws_connect(service.v1 + "/ws") as ws:
        await ws.send_json({"type": "subscribe", "turn_id": turn_id, "after": after})
        async for msg in ws:
            data = json.loads(msg.data)
            got.append(data)
            if data["type"] == "error" or (data["type"] == "event" and data["event"]["type"] in TERMINAL):
                break
    return got


async def _sse_follow(service: Service, turn_id: str) -> str:
    async with service.http.get(f"{service.v1}/turns/{turn_id}/stream") as resp:
        assert resp.status == 200
        return await resp.text()


async def test_reads_beyond_the_pool_wait_for_a_connection_instead_of_failing(service: Service, database_url: str) -> None:
    # A store whose pool gives up on a checkout after 50 ms: 200 reads at once
    # on two connections would wait longer than that on the pool.
    service.upstream.enqueue(Reply(text=TEXT, chunk_size=5))
    status, body, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
    assert status == 200, body
    turn_id = headers["X-Turn-Id"]
    expected = await service.services.store.read(turn_id)
    assert len(expected) > 4
    store = await open_store(database_url, pool_size=1, max_overflow=1, pool_timeout=0.05)
    try:
        n = len(expected)
        results = await asyncio.gather(*(store.read(turn_id, after=i % n) for i in range(200)))
    finally:
        await store.close()
    for i, got in enumerate(results):
        assert [(e.seq, e.type, e.data) for e in got] == [(e.seq, e.type, e.data) for e in expected[i % n :]]


async def test_many_followers_catching_up_at_once_on_one_connection_each_get_the_whole_answer(
    tmp_path: Path, upstream: ScriptedUpstream, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One pooled read connection, catch-up in batches of 3 events: 40
    # WebSocket clients subscribing at lagging positions (several at the same
    # one: a shared read) and 20 SSE clients from the start, all joining a
    # running turn whose actor no longer holds its history (so each reads the
    # log), and reading on as it goes.
    monkeypatch.setattr(catchup, "BATCH", 3)
    # Short delta windows: the log must hold many events before the pause.
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, db_pool_size=1, flush_interval=0.02)
    service = await start_service(settings, upstream)
    try:
        upstream.enqueue(Reply(text=TEXT, chunk_size=1, delay=0.004, pause_after=len(TEXT) // 2))
        resp = await service.http.post(service.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True})
        turn_id = resp.headers["X-Turn-Id"]
        await asyncio.wait_for(upstream.paused.wait(), 20)
        so_far = await service.services.store.read(turn_id)
        assert len(so_far) > 16  # past the actor's history (engine.run.actor.HISTORY_LIMIT)
        afters = [(i * 7) % len(so_far) for i in range(40)]
        ws_tasks = [asyncio.create_task(_ws_follow(service, turn_id, a)) for a in afters]
        sse_tasks = [asyncio.create_task(_sse_follow(service, turn_id)) for _ in range(20)]
        # Every subscription is open (the pumps joined) before the turn goes on.
        await _wait_followers(service, turn_id, 60)
        upstream.release()
        ws_got = await asyncio.wait_for(asyncio.gather(*ws_tasks), 60)
        sse_got = await asyncio.wait_for(asyncio.gather(*sse_tasks), 60)
        first = await resp.text()
        log = await service.services.store.read(turn_id)
    finally:
        await stop_service(service)
    assert log[-1].type == "turn.completed"
    assert sse_text(first) == TEXT
    for raw in sse_got:
        assert sse_text(raw) == TEXT
    for after, got in zip(afters, ws_got, strict=True):
        assert not [m for m in got if m["type"] == "error"], got[-1]
        events = [m for m in got if m["type"] == "event"]
        assert [(m["seq"], m["event"]["type"], m["event"]["data"]) for m in events] == [
            (e.seq, e.type, json.loads(json.dumps(e.data))) for e in log if e.seq > after
        ]


async def _wait_followers(service: Service, turn_id: str, n: int) -> None:
    """Until ``n`` subscriptions of the turn are open (polled: set-up, not what is tested)."""
    bus = service.services.supervisor.bus
    assert isinstance(bus, InProcessBus)
    for _ in range(1000):
        if len([s for s in bus._subs.get(turn_id, ()) if not s.closed]) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the followers did not all subscribe")
