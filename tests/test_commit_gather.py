"""The group commit's gather (``TURNLOG_COMMIT_GATHER``), on SQLite and PostgreSQL.

A commit costs mostly per transaction, so delta windows (lazy appends: no
caller awaits them) wait up to the gather after the previous commit began, to
share one. What must hold: a lazy write is held, never lost or reordered; any
write that is not lazy ends the wait and takes the held ones along; a lone
window is written once the gather has passed; and a turn never waits for the
gather itself (its awaited writes are not lazy, and an actor with windows
piling up stops marking them lazy).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

from adapters.store import migrate, open_store
from adapters.store.sql import SqlEventStore
from engine.events import Event
from engine.ports import TurnRecord
from tests.harness import make_settings, start_service, stop_service
from tests.upstream import Reply, ScriptedUpstream


def _ev(turn_id: str, seq: int, **data: Any) -> Event:
    return Event(turn_id=turn_id, seq=seq, type="test.event", at=time.time(), data={"v": 1, **data})


async def _start(store: SqlEventStore, turn_id: str) -> int:
    now = time.time()
    record = TurnRecord(id=turn_id, chat_id=f"chat-{turn_id}", user_id="u", model="m", status="running", created_at=now, updated_at=now, owner="w")
    return await store.start_turn(record, [_ev(turn_id, 1)], lease_seconds=600)


async def _open(database_url: str, gather: float) -> SqlEventStore:
    await migrate(database_url)
    return await open_store(database_url, gather=gather)


async def test_lazy_windows_wait_and_a_write_that_is_not_lazy_takes_them_along(database_url: str) -> None:
    store = await _open(database_url, gather=60.0)
    try:
        a, b = f"a-{uuid.uuid4().hex}", f"b-{uuid.uuid4().hex}"
        token_a = await _start(store, a)
        token_b = await _start(store, b)  # a commit just began: the gather runs from here
        held = [store.append_nowait([_ev(a, 2)], fencing=token_a, lazy=True)]
        await asyncio.sleep(0)  # a later tick of the loop: not the same batch by accident
        held.append(store.append_nowait([_ev(b, 2)], fencing=token_b, lazy=True))
        held.append(store.append_nowait([_ev(a, 3)], fencing=token_a, lazy=True))
        done, _ = await asyncio.wait(held, timeout=0.5)  # a commit takes milliseconds
        assert not done, "lazy appends were written before the gather ended"
        batches = store.stats["batches"]
        await store.append([_ev(b, 3)], fencing=token_b)  # not lazy: goes now, with the held ones
        assert all(f.done() and f.exception() is None for f in held)
        assert store.stats["batches"] == batches + 1
        assert [e.seq for e in await store.read(a)] == [1, 2, 3]
        assert [e.seq for e in await store.read(b)] == [1, 2, 3]
    finally:
        await store.close()


async def test_a_lone_lazy_window_is_written_once_the_gather_has_passed(database_url: str) -> None:
    gather = 0.3
    store = await _open(database_url, gather=gather)
    try:
        t = f"t-{uuid.uuid4().hex}"
        token = await _start(store, t)
        began = time.monotonic()
        await asyncio.wait_for(store.append_nowait([_ev(t, 2)], fencing=token, lazy=True), 10)
        assert time.monotonic() - began >= gather * 0.8
        # Idle for longer than the gather: a lazy window goes at once.
        await asyncio.sleep(gather * 1.5)
        began = time.monotonic()
        await asyncio.wait_for(store.append_nowait([_ev(t, 3)], fencing=token, lazy=True), 10)
        assert time.monotonic() - began < gather * 0.8
        assert [e.seq for e in await store.read(t)] == [1, 2, 3]
    finally:
        await store.close()


async def test_closing_writes_what_is_held(database_url: str) -> None:
    store = await _open(database_url, gather=60.0)
    t = f"t-{uuid.uuid4().hex}"
    token = await _start(store, t)
    held = store.append_nowait([_ev(t, 2)], fencing=token, lazy=True)
    await asyncio.wait_for(store.close(), 10)
    assert held.done() and held.exception() is None
    store = await open_store(database_url)
    try:
        assert [e.seq for e in await store.read(t)] == [1, 2]
    finally:
        await store.close()


async def test_a_turn_never_waits_for_the_gather(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    """A gather half the test's timeout: a streamed turn with many
    small windows (more than the actor lets pile up) still ends at once, and
    its log holds every chunk. (A long lease: its renewals, not lazy, would
    end the waits too.)"""
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, commit_gather=10.0, flush_max_chunks=2, lease_seconds=60.0)
    svc = await start_service(settings, upstream)
    try:
        chunks = [f"w{i} " for i in range(40)]
        upstream.enqueue(Reply(chunks=chunks, delay=0.005))  # one read per chunk
        body = {"model": "gpt-test", "messages": [{"role": "user", "content": "go"}], "stream": True}

        async def run() -> str:
            async with svc.http.post(svc.v1 + "/chat/completions", json=body) as resp:
                assert resp.status == 200
                await resp.read()
                return resp.headers["X-Turn-Id"]

        turn_id = await asyncio.wait_for(run(), 20)
        view = await svc.turn(turn_id)
        assert view["status"] == "completed" and view["content"] == "".join(chunks)
        windows = [e for e in await svc.events(turn_id) if e["type"] == "model.delta"]
        assert len(windows) >= len(chunks) // 2
    finally:
        await stop_service(svc)
