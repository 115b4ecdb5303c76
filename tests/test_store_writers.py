"""One write path per backend: every write of ``SqlEventStore`` goes through
its backend's writer (``adapters.store.sqlite_writer``: the writer thread's
``sqlite3`` connection; ``adapters.store.postgres_writer``: an asyncpg
connection), never through SQLAlchemy, which keeps the reads.

The oracle is SQLAlchemy's own ``before_cursor_execute`` event on every
engine: it fires for each statement SQLAlchemy executes, and for none that a
writer runs on the driver connection. The writes' outcomes are checked by
reading them back on a connection of another process's making (SQLite: a
plain ``sqlite3`` connection; PostgreSQL: a second store).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from engine.events import Event
from engine.ports import LeaseLost, TurnRecord
from tests.backends import POSTGRES, SQL_BACKENDS, Backend


def _ev(turn_id: str, seq: int) -> Event:
    return Event(turn_id=turn_id, seq=seq, type="test.event", at=time.time(), data={"v": seq})


def _record(turn_id: str, owner: str = "w") -> TurnRecord:
    now = time.time()
    return TurnRecord(id=turn_id, chat_id=f"chat-{turn_id}", user_id="u", model="m", status="running", created_at=now, updated_at=now, owner=owner)


@contextmanager
def sqlalchemy_writes() -> Iterator[list[str]]:
    """The INSERT/UPDATE/DELETE statements any SQLAlchemy engine executes meanwhile."""
    seen: list[str] = []

    def listen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().split(None, 1)[0].upper() in ("INSERT", "UPDATE", "DELETE"):
            seen.append(statement)

    event.listen(Engine, "before_cursor_execute", listen)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", listen)


@pytest.mark.backends(*SQL_BACKENDS)
async def test_every_kind_of_write_in_one_batch_goes_through_the_writer(store_backend: Backend) -> None:
    store = await store_backend.open(time.time)
    other = await store_backend.open(time.time)  # reads back what was committed
    try:
        t, u = f"t-{uuid.uuid4().hex}", f"u-{uuid.uuid4().hex}"
        token = await store.start_turn(_record(t), [_ev(t, 1)], lease_seconds=600)
        blob = b"\x00bytes\xff"
        with sqlalchemy_writes() as writes:
            # Queued in one pass of the loop: the writer takes them together.
            results = await asyncio.gather(
                store.start_turn(_record(u), [_ev(u, 1)], lease_seconds=600),
                store.append([_ev(t, 2)], fencing=token),
                store.claim_turn(t, "w2", lease_seconds=600, dead_owner="w"),  # adopted from a dead owner
                store.append([_ev(t, 3)], fencing=token),  # after the claim: a stale token
                store.set_chat_meta(f"chat-{u}", title="a title", tags=["x", "y"]),
                store.create_api_key("someone", "admin"),
                store.put_blob("someone", blob, "application/octet-stream"),
                store.renew_leases("w", [u], lease_seconds=1200),
                store.release_turn(u, "w"),
                return_exceptions=True,
            )
        assert writes == [], "written through SQLAlchemy, not the writer"
        started, appended, claimed, refused, _, key, blob_id, _, _ = results
        assert started == 1 and appended is None
        assert claimed == token + 1
        assert isinstance(refused, LeaseLost), refused

        assert [e.seq for e in await other.read(t)] == [1, 2]
        turn_t, turn_u = await other.get_turn(t), await other.get_turn(u)
        assert turn_t is not None and (turn_t.owner, turn_t.fencing) == ("w2", token + 1)
        assert turn_u is not None and (turn_u.owner, turn_u.lease_until) == (None, None)  # renewed, then released
        chat = await other.get_chat(f"chat-{u}")
        assert chat is not None and (chat.title, chat.tags) == ("a title", ["x", "y"])
        holder = await other.key_holder(str(key))
        assert holder is not None and (holder.user_id, holder.role) == ("someone", "admin")
        assert await other.get_blob("someone", str(blob_id)) == ("application/octet-stream", blob)
        if store_backend.name != POSTGRES:
            assert store_backend.file is not None
            with sqlite3.connect(store_backend.file) as conn:  # not the store's code at all
                assert conn.execute("SELECT title, tags FROM chats WHERE id = ?", (f"chat-{u}",)).fetchone() == ("a title", '["x","y"]')
    finally:
        await store.close()
        await other.close()


@pytest.mark.backends(*SQL_BACKENDS)
async def test_a_released_turns_chain_head_is_dropped_and_read_back_when_it_goes_on(store_backend: Backend) -> None:
    """A turn released (ended, or waiting for a decision) leaves nothing in
    the writer: the head of its hash chain goes with the release, and the
    turn, claimed again and appended to, reads it back once, its chain intact.
    A turn not released keeps its head (no read)."""
    from tests.chain_oracle import chain

    store = await store_backend.open(time.time)
    try:
        t, u = f"t-{uuid.uuid4().hex}", f"u-{uuid.uuid4().hex}"
        token = await store.start_turn(_record(t), [_ev(t, 1)], lease_seconds=600)
        other = await store.start_turn(_record(u), [_ev(u, 1)], lease_seconds=600)
        await store.append([_ev(t, 2)], fencing=token)
        await store.append([_ev(u, 2)], fencing=other)
        reads = store.stats["chain_reads"]
        await store.append([_ev(u, 3)], fencing=other)
        assert store.stats["chain_reads"] == reads  # the head was kept
        await store.release_turn(t, "w")
        again = await store.claim_turn(t, "w2", lease_seconds=600)
        assert again is not None
        await store.append([_ev(t, 3)], fencing=again)
        assert store.stats["chain_reads"] == reads + 1  # read back once, after the release
        await store.append([_ev(t, 4)], fencing=again)
        assert store.stats["chain_reads"] == reads + 1
        for turn_id, last in ((t, 4), (u, 3)):
            stored = await store.read_chain(turn_id)
            assert [e.seq for e in stored] == list(range(1, last + 1))
            assert [e.hash for e in stored] == chain((e.turn_id, e.seq, e.type, e.at, e.data) for e in stored)
    finally:
        await store.close()
