"""The SQLite store's writer thread takes its next batch itself.

A burst of turn starts keeps the event loop busy for tens of milliseconds at a
stretch. When the loop handed each batch to the thread, a commit's next batch
waited for the loop to run the previous one's callback, and the queued starts
waited with it. The writer thread now pops its queue on its own: what is
queued is committed while the loop is held, and only the callers' futures
wait for the loop.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from adapters.store import migrate, open_store
from adapters.store.sql import SqlEventStore
from engine.events import Event
from engine.ports import LeaseLost, TurnRecord
from tests.polling import until


def _ev(turn_id: str, seq: int) -> Event:
    return Event(turn_id=turn_id, seq=seq, type="test.event", at=time.time(), data={"v": seq})


def _record(turn_id: str) -> TurnRecord:
    now = time.time()
    return TurnRecord(id=turn_id, chat_id=f"chat-{turn_id}", user_id="u", model="m", status="running", created_at=now, updated_at=now, owner="w")


def _committed_seqs(path: Path, turn_id: str) -> list[int]:
    """What another connection sees committed (not the store's own view)."""
    with sqlite3.connect(path) as conn:
        return [seq for (seq,) in conn.execute("SELECT seq FROM events WHERE turn_id = ? ORDER BY seq", (turn_id,))]


def _hold_loop_until(path: Path, turn_id: str, want: list[int], limit: float = 10.0) -> list[int]:
    """Block the event loop's thread (no await) until ``want`` is committed or
    ``limit`` passes; the short sleeps only let the writer thread have the GIL."""
    deadline = time.monotonic() + limit
    seen = _committed_seqs(path, turn_id)
    while seen != want and time.monotonic() < deadline:
        time.sleep(0.002)
        seen = _committed_seqs(path, turn_id)
    return seen


async def _open(path: Path, **kwargs: Any) -> SqlEventStore:
    url = f"sqlite+aiosqlite:///{path}"
    await migrate(url)
    return await open_store(url, **kwargs)


async def test_queued_writes_are_committed_while_the_event_loop_is_held(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = await _open(path)
    try:
        t = f"t-{uuid.uuid4().hex}"
        token = await store.start_turn(_record(t), [_ev(t, 1)], lease_seconds=600)
        first = store.append_nowait([_ev(t, 2)], fencing=token)
        # From here until the awaits below the loop runs nothing else.
        assert _hold_loop_until(path, t, [1, 2]) == [1, 2]
        # Queued after that commit, the loop still held: the thread takes it itself.
        second = store.append_nowait([_ev(t, 3)], fencing=token)
        started = f"s-{uuid.uuid4().hex}"
        start = asyncio.ensure_future(store.start_turn(_record(started), [_ev(started, 1)], lease_seconds=600))
        assert _hold_loop_until(path, t, [1, 2, 3]) == [1, 2, 3]
        # The callers learn it once the loop runs again; nothing was lost or reordered.
        assert not first.done() and not second.done()
        await asyncio.wait_for(asyncio.gather(first, second, start), 10)
        assert [e.seq for e in await store.read(t)] == [1, 2, 3]
        assert [e.seq for e in await store.read(started)] == [1]
    finally:
        await store.close()


async def test_held_delta_windows_wait_for_the_loop_to_take_the_previous_commit(tmp_path: Path) -> None:
    """Lazy appends (delta windows, which nobody awaits) are not committed one
    commit after another while the loop lags: they wait until it has taken
    the previous commit's outcome, so a busy loop's windows share commits."""
    path = tmp_path / "t.db"
    store = await _open(path)  # no gather: only the loop's pace holds them
    try:
        t = f"t-{uuid.uuid4().hex}"
        token = await store.start_turn(_record(t), [_ev(t, 1)], lease_seconds=600)
        urgent = store.append_nowait([_ev(t, 2)], fencing=token)
        assert _hold_loop_until(path, t, [1, 2]) == [1, 2]
        window = store.append_nowait([_ev(t, 3)], fencing=token, lazy=True)
        # Still held: the thread has not been told the loop took seq 2's commit.
        assert _hold_loop_until(path, t, [1, 2, 3], limit=0.3) == [1, 2]
        await asyncio.wait_for(asyncio.gather(urgent, window), 10)
        assert _committed_seqs(path, t) == [1, 2, 3]
        assert store.stats["batches"] == 3  # the start, seq 2, then seq 3
    finally:
        await store.close()


async def test_a_failed_commit_refuses_the_turns_appends_queued_behind_it(tmp_path: Path) -> None:
    """The thread poisons a failed batch's turns before it takes the next batch:
    nothing lands after events that were lost (no gap in a turn's seqs)."""
    path = tmp_path / "t.db"
    store = await _open(path)
    try:
        t, other = f"t-{uuid.uuid4().hex}", f"o-{uuid.uuid4().hex}"
        token = await store.start_turn(_record(t), [_ev(t, 1)], lease_seconds=600)
        other_token = await store.start_turn(_record(other), [_ev(other, 1)], lease_seconds=600)
        # Another connection holds the write lock: the writer's BEGIN IMMEDIATE
        # waits its busy timeout (5 s), then the whole batch fails.
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        released = False
        try:
            lost = store.append_nowait([_ev(t, 2)], fencing=token)
            # Queued once the thread is inside that batch (its BEGIN waits).
            await until(lambda: not store._writes._queue, "the writer thread took the batch", every=0.001)  # the queue the thread pops
            behind = store.append_nowait([_ev(t, 3)], fencing=token)
            bystander = store.append_nowait([_ev(other, 2)], fencing=other_token)
            with pytest.raises(sqlite3.OperationalError):
                await asyncio.wait_for(lost, 30)
            # Free the lock while the next batch waits for it: that batch commits.
            blocker.execute("ROLLBACK")
            released = True
            results = await asyncio.wait_for(asyncio.gather(behind, bystander, return_exceptions=True), 30)
        finally:
            if not released:
                blocker.execute("ROLLBACK")
            blocker.close()
        assert isinstance(results[0], LeaseLost), results[0]
        assert results[1] is None
        assert _committed_seqs(path, t) == [1]
        assert _committed_seqs(path, other) == [1, 2]
    finally:
        await store.close()
