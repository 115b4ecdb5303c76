"""A turn whose delta windows wait for the store stops reading the upstream
(at most ``TURNLOG_MAX_INFLIGHT_FLUSHES`` windows in flight), and a cancel while it
waits keeps every window the client was shown.

SQLite: another connection holds the write lock, so the store's commits wait
(inside the busy timeout). The oracle is what the client received against the
log read back after the lock is released.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.harness import make_settings, start_service, stop_service
from tests.test_observe import scrape
from tests.upstream import Reply, ScriptedUpstream

CHUNKS = [f"c{i} " for i in range(200)]  # 10 s at 20 chunks/s: far more than the test lets through


async def _until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "the condition never held"
        await asyncio.sleep(0.01)


async def test_a_turn_cancelled_while_its_windows_wait_for_the_store_keeps_what_the_client_saw(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    settings = make_settings(tmp_path, upstream.url, flush_interval=0.01, db_timeout=30.0, lease_seconds=60.0, max_inflight_flushes=3)
    svc = await start_service(settings, upstream)
    lock: sqlite3.Connection | None = None
    try:
        upstream.enqueue(Reply(chunks=CHUNKS, delay=0.05))
        received: list[str] = []
        turn: dict[str, str] = {}

        reading = asyncio.create_task(_read_stream(svc, turn, received))
        await _until(lambda: len(received) >= 5)
        lock = sqlite3.connect(tmp_path / "turnlog.db", timeout=10)
        lock.execute("BEGIN IMMEDIATE")  # the store's commits wait from here on
        locked_at = len(received)
        actor = svc.services.supervisor.actors[turn["id"]]
        await _until(actor.writes_behind)  # the reads are held back (catch_up)
        held_at = len(received)
        # TURNLOG_MAX_INFLIGHT_FLUSHES=3: a window per paced chunk, so the
        # turn fell behind within 3 + 1 chunks, not the default's 16 (a few
        # more may reach the client in between: chunks it was sent before
        # the lock but had not read yet on a loaded machine).
        assert held_at - locked_at <= 8

        cancel = asyncio.create_task(svc.post(f"/v1/turns/{turn['id']}/cancel"))
        await _until(lambda: actor.task is not None and actor.task.cancelling() > 0)
        lock.rollback()  # the store answers again
        lock.close()
        lock = None
        status, body, _ = await asyncio.wait_for(cancel, 30)
        assert status == 202, body
        await asyncio.wait_for(reading, 30)  # the stream ends: nothing is left unpublished

        await svc.wait_status(turn["id"], "cancelled")
        events = await svc.events(turn["id"])
        logged = [text for e in events if e["type"] == "model.delta" for text in _texts(e["data"])]
        # Every chunk the client was shown is in the log, in order, and nothing else.
        assert logged == received == CHUNKS[: len(received)]
        # The reads stopped while the windows waited: a few chunks past the hold, not the rest.
        assert len(received) <= held_at + 2 < len(CHUNKS)
    finally:
        if lock is not None:
            lock.close()
        await stop_service(svc)


async def test_the_time_a_turn_waits_for_the_store_is_measured(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    """``turnlog_store_wait_seconds``: the turn held back from its next chunk
    after the test saw it fall behind (at most one chunk interval later: it
    waits when a chunk comes while its windows are behind) until at least the
    lock's release (its oldest window cannot commit before); the turn then
    completes whole."""
    settings = make_settings(tmp_path, upstream.url, flush_interval=0.01, db_timeout=30.0, lease_seconds=60.0)
    svc = await start_service(settings, upstream)
    lock: sqlite3.Connection | None = None
    loop = asyncio.get_running_loop()
    try:
        before = await scrape(svc)
        assert before["turnlog_store_wait_seconds_count"] == 0
        chunks = CHUNKS[:30]
        interval = 0.02  # between two upstream chunks
        upstream.enqueue(Reply(chunks=chunks, delay=interval))
        received: list[str] = []
        turn: dict[str, str] = {}
        reading = asyncio.create_task(_read_stream(svc, turn, received))
        await _until(lambda: len(received) >= 3)
        actor = svc.services.supervisor.actors[turn["id"]]
        lock = sqlite3.connect(tmp_path / "turnlog.db", timeout=10)
        lock.execute("BEGIN IMMEDIATE")
        await _until(actor.writes_behind)
        behind_at = loop.time()
        await asyncio.sleep(0.3)  # a span to measure, not a synchronization
        released_at = loop.time()
        lock.rollback()
        lock.close()
        lock = None
        await asyncio.wait_for(reading, 30)
        await svc.wait_status(turn["id"], "completed")
        assert "".join(received) == (await svc.turn(turn["id"]))["content"] == "".join(chunks)
        after = await scrape(svc)
        waits = after["turnlog_store_wait_seconds_count"]
        waited = after["turnlog_store_wait_seconds_sum"]
        assert waits >= 1
        assert released_at - (behind_at + interval) <= waited < loop.time() - behind_at + 1.0
    finally:
        if lock is not None:
            lock.close()
        await stop_service(svc)


async def _read_stream(svc: Any, turn: dict[str, str], received: list[str]) -> None:
    """A streamed chat completion: its turn id into ``turn``, each content delta into ``received``."""
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": "q"}], "stream": True}
    async with svc.http.post(svc.v1 + "/chat/completions", json=body) as resp:
        assert resp.status == 200
        turn["id"] = resp.headers["X-Turn-Id"]
        async for line in resp.content:
            if line.startswith(b"data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                content = choices[0].get("delta", {}).get("content")
                if content:
                    received.append(content)


def _texts(data: dict[str, object]) -> list[str]:
    text, lens = data["text"], data["lens"]
    assert isinstance(text, str) and isinstance(lens, list)
    out, at = [], 0
    for n in lens:
        out.append(text[at : at + n])
        at += n
    return out
