"""``SqlEventStore``: the event store on SQLite or PostgreSQL.

Writes: group commit
--------------------
Every write (append, start_turn, leases, chat meta, blobs, API keys) is a
request on one queue (``adapters.store.group_commit``): one writer per store
takes everything queued (up to ``max_batch``) and writes it in ONE
transaction, then commits once and resolves the callers' futures. So:

* one fsync serves a whole batch (appends are on the per-token path);
* writes are serialized: no "database is locked" between our own writers;
* a request that fails (``ConcurrencyError``, ``LeaseLost``) fails alone;
  the others in its batch commit.

One writer per backend writes the batch at the driver level
(``adapters.store.sqlite_writer``: the ``sqlite3`` connection of the writer
thread; ``adapters.store.postgres_writer``: an asyncpg connection, as a task
on the event loop), with the same decisions (``adapters.store.batch_plan``):
runs of appends, starts and releases in few multi-row statements, redone
request by request (a savepoint each) if any fails, so the outcome is that
of one savepoint per request; any other write alone in its savepoint.

A caller cancelled while waiting does not withdraw its request: it may still
be committed.

Reads go through SQLAlchemy, straight to pooled connections of the
``AsyncEngine`` (WAL lets them run while the writer writes), and see
everything whose write call has returned. At most ``pool_size`` reads hold a
connection at once; the others wait their turn on a semaphore, as long as it
takes, instead of on the pool (whose checkout timeout would fail them:
thousands of streams catching up at once, bench ``thousands_ws``). The
pool's overflow stays free for the writer and the engine's other users.

Events are read per turn, in ``seq`` order; ``events.id`` is only a surrogate
key (no reader follows the log across turns by it: see
``adapters.store.postgres``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import case, or_, select
from sqlalchemy.engine import Engine, Row
from sqlalchemy.ext.asyncio import AsyncEngine

from adapters.store.batch_plan import Append, Release, Start, Write
from adapters.store.common import (
    dumps as _dumps,
)
from adapters.store.common import (
    event_rows as _event_rows,
)
from adapters.store.common import (
    hash_api_key,
    hash_hex,
    new_api_key,
)
from adapters.store.common import (
    loads as _loads,
)
from adapters.store.group_commit import GroupCommit, Request, Results, TaskGroupCommit, ThreadedGroupCommit
from adapters.store.postgres_writer import PostgresWriter
from adapters.store.schema import api_keys, blobs, chats, events, turns
from adapters.store.sqlite import SQLITE_BEGIN, sqlite_writer_engine
from adapters.store.sqlite_writer import SqliteWriter
from engine.blobs import blob_id as _blob_id
from engine.chain import StoredEvent
from engine.events import Event, upcast
from engine.ports import (
    ROLES,
    ChatRecord,
    IndexUpdate,
    KeyHolder,
    TurnObserver,
    TurnRecord,
    observe,
)

log = logging.getLogger(__name__)

__all__ = ["SqlEventStore", "hash_api_key"]


class SqlEventStore:
    """``engine.ports.EventStore`` on SQLite or PostgreSQL.

    ``engine`` (async) serves reads. Writes: on SQLite, a ``sqlite3``
    connection of ``writer_engine`` (default: one on ``engine``'s file, see
    ``adapters.store.sqlite.sqlite_writer_engine``) in the writer thread; on
    PostgreSQL, an asyncpg connection of ``engine``'s pool.

    Beyond the protocol: :meth:`set_chat_meta`, the ``stats`` counters of the
    group commit, and the constructor's ``clock`` (for leases and expiry; tests
    pass a fake) and ``max_batch``; ``gather`` (``TURNLOG_COMMIT_GATHER``):
    the shortest time between the starts of two group commits that hold only
    delta windows (lazy appends), so that many streams' windows share one.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        writer_engine: Engine | None = None,
        clock: Callable[[], float] = time.time,
        max_batch: int = 1000,
        chain: bool = True,
        gather: float = 0.0,
    ) -> None:
        self.engine = engine
        # Hash-chain every appended event (``engine.chain``); off only to
        # measure what the chain costs (``bench.storebench chain``).
        self._chain = chain
        self._clock = clock
        # One-statement reads need no transaction (ignored but by SQLite).
        self._read_engine = engine.execution_options(**{SQLITE_BEGIN: None})
        self._read_gate = asyncio.Semaphore(read_slots(engine))
        #: Group-commit counters: committed transactions, requests and events;
        #: ``chain_reads``: previous hashes read back from the database (a
        #: turn this store had not linked lately: another process's, or after
        #: a restart).
        self.stats = {"batches": 0, "requests": 0, "events": 0, "chain_reads": 0}
        #: Told of every group commit (events made durable, seconds it took):
        #: metrics (``engine.ports.TurnObserver.events_committed``).
        self.observer: TurnObserver | None = None
        options = {"max_batch": max_batch, "gather": gather, "on_commit": self._committed}
        self._writes: GroupCommit
        if engine.dialect.name == "sqlite":
            writer = writer_engine or sqlite_writer_engine(engine.url.render_as_string(hide_password=False))
            self._writes = ThreadedGroupCommit(SqliteWriter(writer, self.stats), **options)
        elif engine.dialect.name == "postgresql":
            self._writes = TaskGroupCommit(PostgresWriter(engine, self.stats), **options)
        else:  # pragma: no cover
            raise NotImplementedError(f"the event store has no writer for {engine.dialect.name}")

    def _committed(self, batch: list[Request], results: Results, took: float) -> None:
        """A group commit is durable: count it."""
        n_events = n_started = 0
        for request, (ok, _) in zip(batch, results):
            if ok and type(request) is Append:
                n_events += request.events
            elif ok:
                n_started += request.events
        stats = self.stats
        stats["batches"] += 1
        stats["requests"] += len(batch)
        stats["events"] += n_events
        if self.observer is not None:
            observe(self.observer.events_committed, n_events + n_started, took)

    # ------------------------------------------------------------------ writes

    async def start_turn(self, turn: TurnRecord, events: Sequence[Event], *, lease_seconds: float) -> int:
        rows = _event_rows(events, self._chain)
        if any(row[0] != turn.id for row in rows):
            raise ValueError("start_turn: events of another turn")
        chat = {"c_id": turn.chat_id, "c_user": turn.user_id, "c_at": turn.created_at}
        row = {
            "t_id": turn.id,
            "t_chat": turn.chat_id,
            "t_user": turn.user_id,
            "t_model": turn.model,
            "t_status": turn.status,
            "t_created": turn.created_at,
            "t_updated": turn.updated_at,
            "t_owner": turn.owner,
            "t_lease": self._clock() + lease_seconds,
            "t_view": None if turn.view is None else _dumps(turn.view),
        }
        return int(await self._writes.submit(Start(rows, chat, row)))

    async def append(
        self,
        events: Sequence[Event],
        *,
        fencing: int | None = None,
        index: IndexUpdate | None = None,
    ) -> None:
        await self.append_nowait(events, fencing=fencing, index=index)

    def append_nowait(
        self,
        events: Sequence[Event],
        *,
        fencing: int | None = None,
        index: IndexUpdate | None = None,
        lazy: bool = False,
    ) -> asyncio.Future[None]:
        rows = _event_rows(events, self._chain)
        turn_ids = {row[0] for row in rows}
        turn_id = next(iter(turn_ids)) if len(turn_ids) == 1 else None
        if (fencing is not None or index is not None) and turn_id is None:
            raise ValueError("append: fencing/index need events of exactly one turn")
        index_row = None
        if index is not None:
            index_row = {
                "i_id": turn_id,
                "i_status": index.status,
                "i_view": None if index.view is None else _dumps(index.view),
                "i_updated_at": rows[-1][3],
                "i_release": index.release,
            }
        return self._writes.submit(Append(rows, turn_id, fencing, index_row), lazy)

    async def set_chat_meta(self, chat_id: str, *, title: str | None = None, tags: Sequence[str] | None = None) -> None:
        """Set a chat's title and/or tags (None leaves a field as it is)."""
        if title is not None or tags is not None:
            await self._writes.submit(Write("chat_meta", title, None if tags is None else _dumps(list(tags)), chat_id))

    async def claim_turn(self, turn_id: str, owner: str, *, lease_seconds: float, dead_owner: str | None = None) -> int | None:
        owners = [owner] if dead_owner is None else [owner, dead_owner]
        now = self._clock()
        token = await self._writes.submit(Write("claim", owner, now + lease_seconds, turn_id, owners, now))
        return None if token is None else int(token)

    async def renew_leases(self, owner: str, turn_ids: Sequence[str], *, lease_seconds: float) -> None:
        if turn_ids:
            await self._writes.submit(Write("renew", self._clock() + lease_seconds, owner, list(turn_ids)))

    async def release_turn(self, turn_id: str, owner: str) -> None:
        await self._writes.submit(Release(turn_id, owner))

    async def create_api_key(self, user_id: str, role: str = "user") -> str:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}")
        key = new_api_key()
        await self._writes.submit(Write("api_key", hash_api_key(key), user_id, self._clock(), role))
        return key

    # ------------------------------------------------------------------- blobs

    async def put_blob(self, user_id: str, data: bytes, mime: str) -> str:
        """``engine.blobs.BlobStore.put_blob``: store ``data`` once per user.

        The id is ``engine.blobs.blob_id(user_id, data)``; putting the same bytes
        again is a no-op (the first mime stays). An id already stored is
        answered by a read, without queueing a write; otherwise an
        insert-or-ignore goes through the group-commit writer like any write
        (no second writer on SQLite)."""
        data = bytes(data)
        ident = _blob_id(user_id, data)
        if await self._fetch(select(blobs.c.id).where(blobs.c.id == ident)):
            return ident
        await self._writes.submit(Write("blob", ident, user_id, mime, len(data), data, self._clock()))
        return ident

    async def get_blob(self, user_id: str, blob_id: str) -> tuple[str, bytes] | None:
        """``(mime, data)`` of ``user_id``'s blob; None if unknown or another user's."""
        rows = await self._fetch(select(blobs.c.mime, blobs.c.data).where(blobs.c.id == blob_id, blobs.c.user_id == user_id))
        if not rows:
            return None
        row = rows[0]
        return str(row.mime), bytes(row.data)

    # ------------------------------------------------------------------- reads

    async def read(self, turn_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        stmt = select(events.c.seq, events.c.type, events.c.at, events.c.data).where(events.c.turn_id == turn_id, events.c.seq > after).order_by(events.c.seq)
        if limit is not None:
            stmt = stmt.limit(limit)
        rows = await self._fetch(stmt)
        construct = Event.model_construct
        return [upcast(construct(turn_id=turn_id, seq=row.seq, type=row.type, at=row.at, data=_loads(row.data))) for row in rows]

    async def read_outline(self, turn_id: str) -> list[Event]:
        """The turn's events with ``model.delta`` data left out (``{}``): what a
        chart of its spans needs. On a long answer the deltas are nearly every
        row; not sending and parsing their text made a 10,000-event read ~20x faster."""
        data = case((events.c.type == "model.delta", None), else_=events.c.data)
        stmt = select(events.c.seq, events.c.type, events.c.at, data.label("data")).where(events.c.turn_id == turn_id).order_by(events.c.seq)
        construct = Event.model_construct
        return [
            upcast(construct(turn_id=turn_id, seq=row.seq, type=row.type, at=row.at, data={} if row.data is None else _loads(row.data)))
            for row in await self._fetch(stmt)
        ]

    async def read_chain(self, turn_id: str, after: int = 0, limit: int | None = None) -> list[StoredEvent]:
        stmt = (
            select(events.c.seq, events.c.type, events.c.at, events.c.data, events.c.hash)
            .where(events.c.turn_id == turn_id, events.c.seq > after)
            .order_by(events.c.seq)
        )
        if limit is not None:
            stmt = stmt.limit(limit)
        return [StoredEvent(turn_id, row.seq, row.type, row.at, _loads(row.data), hash_hex(row.hash)) for row in await self._fetch(stmt)]

    async def get_turn(self, turn_id: str) -> TurnRecord | None:
        rows = await self._fetch(select(turns).where(turns.c.id == turn_id))
        return _turn(rows[0]) if rows else None

    async def list_turns(
        self,
        *,
        user_id: str | None = None,
        chat_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
    ) -> list[TurnRecord]:
        stmt = select(turns)
        if user_id is not None:
            stmt = stmt.where(turns.c.user_id == user_id)
        if chat_id is not None:
            stmt = stmt.where(turns.c.chat_id == chat_id)
        if status is not None:
            stmt = stmt.where(turns.c.status == status)
        stmt = stmt.order_by(turns.c.created_at.desc(), turns.c.id.desc()).limit(limit)
        return [_turn(row) for row in await self._fetch(stmt)]

    async def get_chat(self, chat_id: str) -> ChatRecord | None:
        rows = await self._fetch(select(chats).where(chats.c.id == chat_id))
        return _chat(rows[0]) if rows else None

    async def list_chats(self, user_id: str, *, limit: int = 50, before: float | None = None) -> list[ChatRecord]:
        stmt = select(chats).where(chats.c.user_id == user_id)
        if before is not None:
            stmt = stmt.where(chats.c.updated_at < before)
        stmt = stmt.order_by(chats.c.updated_at.desc(), chats.c.id.desc()).limit(limit)
        return [_chat(row) for row in await self._fetch(stmt)]

    async def orphaned_turns(self, now: float) -> list[TurnRecord]:
        stmt = (
            select(turns)
            .where(
                turns.c.status == "running",
                or_(turns.c.lease_until.is_(None), turns.c.lease_until < now),
            )
            .order_by(turns.c.created_at, turns.c.id)
        )
        return [_turn(row) for row in await self._fetch(stmt)]

    async def user_for_api_key(self, key: str) -> str | None:
        holder = await self.key_holder(key)
        return None if holder is None else holder.user_id

    async def key_holder(self, key: str) -> KeyHolder | None:
        rows = await self._fetch(select(api_keys.c.user_id, api_keys.c.role).where(api_keys.c.key_hash == hash_api_key(key)))
        return KeyHolder(rows[0].user_id, rows[0].role) if rows else None

    async def _fetch(self, stmt: Any) -> list[Row[Any]]:
        async with self._read_gate, self._read_engine.connect() as conn:
            return list((await conn.execute(stmt)).all())

    # --------------------------------------------------------------- lifecycle

    async def close(self) -> None:
        """Finish every queued write, stop the writer, dispose of the engine."""
        await self._writes.close()
        await self.engine.dispose()


def read_slots(engine: AsyncEngine) -> int:
    """How many reads may hold a pooled connection at once: the pool's steady
    size (a pool without one, e.g. ``NullPool``: a small fixed number)."""
    size = getattr(engine.pool, "size", None)
    return max(1, int(size())) if callable(size) else 8


def _turn(row: Row[Any]) -> TurnRecord:
    m = row._mapping
    view = m["view"]
    return TurnRecord(
        id=m["id"],
        chat_id=m["chat_id"],
        user_id=m["user_id"],
        model=m["model"],
        status=m["status"],
        created_at=m["created_at"],
        updated_at=m["updated_at"],
        owner=m["owner"],
        lease_until=m["lease_until"],
        fencing=m["fencing"],
        view=None if view is None else _loads(view),
    )


def _chat(row: Row[Any]) -> ChatRecord:
    m = row._mapping
    return ChatRecord(
        id=m["id"],
        user_id=m["user_id"],
        title=m["title"],
        created_at=m["created_at"],
        updated_at=m["updated_at"],
        tags=_loads(m["tags"]) if m["tags"] else [],
    )
