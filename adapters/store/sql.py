"""``SqlEventStore``: the event store on SQLAlchemy Core.

Writes: group commit
--------------------
Every write (append, start_turn, leases, chat meta, API keys) is a request on
one queue, consumed by one writer per store: on SQLite its own thread, else a
task on the event loop. The writer takes all queued requests (up to
``max_batch``) and writes them in ONE transaction, each request isolated in its
own SAVEPOINT, then commits once and resolves the callers' futures. So:

* one fsync serves a whole batch (appends are on the per-token path);
* writes are serialized: no "database is locked" between our own writers;
* a request that fails (``ConcurrencyError``, ``LeaseLost``) fails alone;
  the others in its batch commit.

Consecutive appends in a batch take a fast path: one fencing SELECT for all of
them, one INSERT of all their events and one executemany UPDATE of their index
rows, all-or-nothing (on SQLite one multi-row INSERT statement, which is atomic
by itself; elsewhere inside one savepoint). If that hits a unique violation (or
the batch holds the same ``(turn_id, seq)`` twice) the run is redone request by
request, one savepoint each, which finds the culprit(s): the outcome is exactly
that of one savepoint per request, at a fraction of the statements.
Consecutive starts (``start_turn``) likewise: one savepoint around a multi-row
INSERT of their turns, an upsert of their chats and one INSERT of their first
events; any failure there redoes the run start by start, so a taken turn id
fails only its caller. Consecutive lease releases: one executemany UPDATE in
one savepoint. Anything else (claim, renew, chat meta...) gets its own
savepoint in queue order.

The batch itself runs either

* on the writer engine (a sync ``Engine``, SQLite) by the writer thread,
  which pops the queue itself and hands each commit's outcome to the event
  loop (one ``call_soon_threadsafe``), never waiting for the loop to pick its
  next batch (``_serve_writes``). Appends, starts and releases are written
  on the thread's raw ``sqlite3`` connection (``adapters.store.sqlite_writer``:
  SQLAlchemy's execution machinery was ~75 % of the thread's CPU); other
  writes as SQLAlchemy Core; or
* on the ``AsyncEngine`` when no writer engine is given: on PostgreSQL a
  batch of only appends, starts and releases on the asyncpg connection
  itself (``adapters.store.postgres_writer``), any other batch (and any
  other driver, e.g. aiosqlite) as synchronous SQLAlchemy Core code through
  ``AsyncConnection.run_sync``.

Both driver-level paths keep the SQLAlchemy path's statements, savepoints,
fallbacks and chain links: what is stored is the same.

A caller's future resolves only after COMMIT returned. A caller cancelled while
waiting does not withdraw its request: it may still be committed.

Reads go straight to pooled connections of the ``AsyncEngine`` (WAL lets them
run while the writer writes) and see everything whose write call has returned.
At most ``pool_size`` reads hold a connection at once; the others wait their
turn on a semaphore, as long as it takes, instead of on the pool (whose
checkout timeout would fail them: thousands of streams catching up at once,
bench ``thousands_ws``). The pool's overflow stays free for the writer and
the engine's other users.

Events are read per turn, in ``seq`` order; ``events.id`` is only a surrogate
key (no reader follows the log across turns by it: see
``adapters.store.postgres``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import math
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Float, Text, bindparam, case, func, or_, select, update
from sqlalchemy.engine import Connection, Engine, Row
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from adapters.store import batch_plan as _plan
from adapters.store import postgres as _pg
from adapters.store import postgres_writer as _pw
from adapters.store import sqlite_writer as _sw
from adapters.store.common import (
    Head,
    after_failure,
    hash_api_key,
    hash_hex,
    link_rows,
    new_api_key,
    previous_hash,
)
from adapters.store.common import (
    dumps as _dumps,
)
from adapters.store.common import (
    event_rows as _event_rows,
)
from adapters.store.common import (
    loads as _loads,
)
from adapters.store.schema import api_keys, blobs, chats, events, turns
from adapters.store.sqlite import SQLITE_BEGIN
from engine.blobs import blob_id as _blob_id
from engine.chain import StoredEvent
from engine.events import Event, upcast
from engine.ports import (
    ROLES,
    ChatRecord,
    ConcurrencyError,
    IndexUpdate,
    KeyHolder,
    TurnObserver,
    TurnRecord,
    observe,
)

log = logging.getLogger(__name__)

__all__ = ["SqlEventStore", "hash_api_key"]

_STOP = object()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


#: A write other than an append: runs in its own savepoint inside a group commit.
Op = Callable[[Connection], Any]

#: Per request: (True, result) or (False, exception).
Results = list[tuple[bool, Any]]


class _Append:
    __slots__ = ("rows", "turn_id", "fencing", "index", "future", "lazy")

    def __init__(
        self,
        rows: list[tuple[Any, ...]],
        turn_id: str | None,
        fencing: int | None,
        index: dict[str, Any] | None,
        future: asyncio.Future[Any],
    ) -> None:
        self.rows = rows
        self.turn_id = turn_id
        self.fencing = fencing
        self.index = index
        self.future = future
        # Nobody waits on it (a delta window): it may wait for company.
        self.lazy = False


class _Op:
    __slots__ = ("fn", "future")

    def __init__(self, fn: Op, future: asyncio.Future[Any]) -> None:
        self.fn = fn
        self.future = future


class _StartOp(_Op):
    """A turn's creation with its first events (counted as appended events).

    ``fn`` writes it alone (in its own savepoint); ``chat``, ``turn`` and
    ``rows`` are its parameters for the multi-row fast path of a run of starts
    (``SqlEventStore._start_run``)."""

    __slots__ = ("events", "rows", "chat", "turn")

    def __init__(
        self,
        fn: Op,
        rows: list[tuple[Any, ...]],
        chat: dict[str, Any],
        turn: dict[str, Any],
        future: asyncio.Future[Any],
    ) -> None:
        super().__init__(fn, future)
        self.events = len(rows)
        self.rows = rows
        self.chat = chat
        self.turn = turn


class _Release(_Op):
    """``release_turn``: consecutive ones run as one executemany UPDATE
    (``SqlEventStore._release_run``); ``fn`` runs it alone."""

    __slots__ = ("params",)

    def __init__(self, fn: Op, params: dict[str, Any], future: asyncio.Future[Any]) -> None:
        super().__init__(fn, future)
        self.params = params


# executemany-able statements, compiled once and cached by SQLAlchemy.
_EVENT_COLUMNS = ("turn_id", "seq", "type", "at", "data", "hash")
_INSERT_EVENTS = events.insert()
# SQLite: the INSERT at the driver level, many rows per statement (atomic:
# see ``adapters.store.sqlite_writer``).
_SQLITE_ROWS_PER_INSERT = _sw.ROWS_PER_INSERT
_sqlite_insert_events = _sw.insert_events_sql


_UPDATE_INDEX = (
    update(turns)
    .where(turns.c.id == bindparam("i_id", type_=Text))
    .values(
        status=func.coalesce(bindparam("i_status", type_=Text), turns.c.status),
        view=func.coalesce(bindparam("i_view", type_=Text), turns.c.view),
        updated_at=bindparam("i_updated_at", type_=Float),
        # IndexUpdate.release: the lease goes with the terminal event's commit.
        owner=case((turns.c.owner == bindparam("i_release", type_=Text), None), else_=turns.c.owner),
        lease_until=case((turns.c.owner == bindparam("i_release", type_=Text), None), else_=turns.c.lease_until),
    )
)
# The hash before ``seq`` (the chain's previous link) when the writer has not
# linked that turn's last event itself.
_SELECT_PREVIOUS_HASH = (
    select(events.c.hash).where(events.c.turn_id == bindparam("p_turn", type_=Text), events.c.seq < bindparam("p_seq")).order_by(events.c.seq.desc()).limit(1)
)
_SELECT_FENCING = select(turns.c.id, turns.c.fencing).where(turns.c.id.in_(bindparam("ids", expanding=True)))
# SQLite: one JSON array parameter instead of an IN list re-rendered per batch.
_SELECT_FENCING_SQLITE = select(turns.c.id, turns.c.fencing).where(
    turns.c.id.in_(select(func.json_each(bindparam("ids_json", type_=Text)).table_valued("value").c.value))
)


class SqlEventStore:
    """``engine.ports.EventStore`` on SQLite or PostgreSQL.

    ``engine`` (async) serves reads, and writes too unless ``writer_engine``
    (sync, SQLite: see ``adapters.store.sqlite.sqlite_writer_engine``) is given;
    then group commits run on it in a dedicated thread.

    Beyond the protocol: :meth:`set_chat_meta`, the ``stats`` counters of the
    group commit, and the constructor's ``clock`` (for leases and expiry; tests
    pass a fake) and ``max_batch``.
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
        # turn -> (seq, hash) of its last event this store linked and
        # committed: the next append's previous link without a read. Only the
        # writer touches it (its thread, on SQLite); a batch's links go into
        # ``_linked`` and reach it once the batch is committed.
        self._heads: dict[str, Head] = {}
        self._linked: dict[str, Head] = {}
        self._clock = clock
        self._max_batch = max_batch
        self._dialect = engine.dialect.name
        self._sqlite = self._dialect == "sqlite"
        self._postgres = self._dialect == "postgresql"
        # The writer takes the write lock when it begins (SQLite); one-statement
        # reads need no transaction. Both options are ignored by other dialects.
        self._write_engine = engine.execution_options(**{SQLITE_BEGIN: "BEGIN IMMEDIATE"})
        self._read_engine = engine.execution_options(**{SQLITE_BEGIN: None})
        self._read_gate = asyncio.Semaphore(read_slots(engine))
        self._writer_engine = writer_engine
        self._sync_conn: Connection | None = None  # used only in the writer thread
        self._async_conn: AsyncConnection | None = None
        self._driver_conn: Any = None  # PostgreSQL: the asyncpg connection under _async_conn
        # The writer's queue: a deque and a wake-up future rather than an
        # asyncio.Queue, whose get() asks for the running loop every time it
        # waits (a getpid() system call on CPython 3.11: once per commit).
        self._pending: deque[Any] = deque()
        self._wakeup: asyncio.Future[None] | None = None
        # The gather (``gather`` seconds): a batch of only lazy appends (delta
        # windows, which no caller awaits) is not begun sooner than that after
        # the previous commit began, so that it takes the windows sealed
        # meanwhile along. A commit's cost is mostly per transaction (a
        # one-event commit costs as much CPU as eight events of a batch of 32,
        # ``python -m bench.storebench gather --dir D``), and thousands of
        # slow streams each seal about one window per chunk. Any other
        # request (a start, a durable record, a release) ends the wait.
        self._gather = gather
        self._gathering = False
        self._urgent = False
        self._last_commit = -math.inf
        # SQLite: the writer thread is the writer (``_serve_writes``). It
        # knows an urgent request is queued while more were queued
        # (``_urgent_in``, the loop's count) than it took (``_urgent_out``,
        # its own): each count has one writer, so no lock.
        self._urgent_in = 0
        self._urgent_out = 0
        self._signal = threading.Event()
        self._thread_waits = False
        # Commits the thread handed to the loop, and those the loop took.
        self._posted = 0
        self._settled = 0
        self._writer_thread: threading.Thread | None = None
        self._writer_done: asyncio.Future[None] | None = None
        # (turn_id, fencing) of appends that failed: later appends with the same
        # token are refused, so a failed write can never leave a gap in a
        # turn's seqs behind a later successful one. The owner stops (LeaseLost)
        # and the turn is resumed under a new token, after the durable events.
        self._poisoned: set[tuple[str, int]] = set()
        self._writer: asyncio.Task[None] | None = None
        self._closed = False
        #: Group-commit counters: committed transactions, requests and events;
        #: ``chain_reads``: previous hashes read back from the database (a
        #: turn this store had not linked lately: another process's, or after
        #: a restart).
        self.stats = {"batches": 0, "requests": 0, "events": 0, "chain_reads": 0}
        #: Told of every group commit (events made durable, seconds it took):
        #: metrics (``engine.ports.TurnObserver.events_committed``).
        self.observer: TurnObserver | None = None

    # ------------------------------------------------------------------ writes

    async def start_turn(self, turn: TurnRecord, events: Sequence[Event], *, lease_seconds: float) -> int:
        rows = _event_rows(events, self._chain)
        if any(row[0] != turn.id for row in rows):
            raise ValueError("start_turn: events of another turn")
        view = None if turn.view is None else _dumps(turn.view)
        insert_chat, bump_chat, insert_turn = self._start_statements
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
            "t_view": view,
        }

        def op(conn: Connection) -> int:
            if conn.execute(insert_chat, chat).rowcount == 0:
                conn.execute(bump_chat, chat)
            try:
                conn.execute(insert_turn, row)
            except IntegrityError as exc:
                raise ConcurrencyError(f"turn {turn.id} already exists") from exc
            if rows:
                trial: dict[str, Head] = {}
                try:
                    self._insert_events(conn, self._link(conn, rows, trial))
                except IntegrityError as exc:
                    raise ConcurrencyError(f"turn {turn.id}: event seq already taken") from exc
                self._linked.update(trial)
            return 1

        return await self._submit(_StartOp, op, rows, chat, row)

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
        return self._submit(_Append, rows, turn_id, fencing, index_row, lazy=lazy)

    async def set_chat_meta(self, chat_id: str, *, title: str | None = None, tags: Sequence[str] | None = None) -> None:
        """Set a chat's title and/or tags (None leaves a field as it is)."""
        values: dict[str, Any] = {}
        if title is not None:
            values["title"] = title
        if tags is not None:
            values["tags"] = _dumps(list(tags))
        if not values:
            return
        stmt = update(chats).where(chats.c.id == chat_id).values(**values)
        await self._submit(_Op, _executing(stmt))

    async def claim_turn(self, turn_id: str, owner: str, *, lease_seconds: float, dead_owner: str | None = None) -> int | None:
        owners = [owner] if dead_owner is None else [owner, dead_owner]

        def op(conn: Connection) -> int | None:
            now = self._clock()
            return conn.execute(
                update(turns)
                .where(
                    turns.c.id == turn_id,
                    or_(
                        turns.c.owner.in_(owners),
                        turns.c.lease_until.is_(None),
                        turns.c.lease_until < now,
                    ),
                )
                .values(fencing=turns.c.fencing + 1, owner=owner, lease_until=now + lease_seconds)
                .returning(turns.c.fencing)
            ).scalar_one_or_none()

        return await self._submit(_Op, op)

    async def renew_leases(self, owner: str, turn_ids: Sequence[str], *, lease_seconds: float) -> None:
        ids = list(turn_ids)
        if not ids:
            return

        def op(conn: Connection) -> None:
            conn.execute(update(turns).where(turns.c.owner == owner, turns.c.id.in_(ids)).values(lease_until=self._clock() + lease_seconds))

        await self._submit(_Op, op)

    async def release_turn(self, turn_id: str, owner: str) -> None:
        params = {"r_id": turn_id, "r_owner": owner}
        await self._submit(_Release, lambda conn: conn.execute(_RELEASE_TURN, params), params)

    async def create_api_key(self, user_id: str, role: str = "user") -> str:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}")
        key = new_api_key()
        stmt = api_keys.insert().values(key_hash=hash_api_key(key), user_id=user_id, created_at=self._clock(), role=role)
        await self._submit(_Op, _executing(stmt))
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
        stmt = self._insert_ignore(blobs).values(
            id=ident,
            user_id=user_id,
            mime=mime,
            size=len(data),
            data=data,
            created_at=self._clock(),
        )
        await self._submit(_Op, _executing(stmt))
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
        """Finish every queued write, stop the writer, dispose of the engines."""
        if not self._closed:
            self._closed = True
            if self._writer is not None and not self._writer.done():
                self._enqueue(_STOP)
                await asyncio.shield(self._writer)
            if self._writer_done is not None and not self._writer_done.done():
                self._enqueue(_STOP)
                await asyncio.shield(self._writer_done)
        if self._writer_thread is not None:
            self._writer_thread.join()
            self._writer_thread = None
        if self._writer_engine is not None:
            self._writer_engine.dispose()
        await self.engine.dispose()

    # ------------------------------------------------------------ group commit

    def _submit(self, kind: type, *args: Any, lazy: bool = False) -> asyncio.Future[Any]:
        """Queue a request for the writer; the future resolves once committed."""
        if self._closed:
            raise RuntimeError("event store is closed")
        loop: asyncio.AbstractEventLoop
        if self._writer_engine is not None:
            if self._writer_done is None or self._writer_done.done():
                self._start_writer_thread()
            assert self._writer_done is not None
            loop = self._writer_done.get_loop()
        else:
            writer = self._writer
            if writer is None or writer.done():
                # A context of its own: it serves every turn, so its log lines name none
                # (it may be started from a turn's task, whose context names that turn).
                writer = self._writer = asyncio.get_running_loop().create_task(self._write_loop(), name="turnlog-store-writer", context=contextvars.Context())
            loop = writer.get_loop()
        # The writer's loop, not get_running_loop(): on CPython 3.11 that is a
        # getpid() system call, and this runs for every delta window.
        future = loop.create_future()
        item = kind(*args, future)
        if lazy:
            item.lazy = True
        self._enqueue(item, lazy)
        return future

    def _enqueue(self, item: Any, lazy: bool = False) -> None:
        self._pending.append(item)
        if self._writer_done is not None:  # the writer thread's queue
            if not lazy:
                self._urgent_in += 1
            if self._thread_waits and (not lazy or not self._gathering or len(self._pending) >= self._max_batch):
                self._signal.set()
            return
        if not lazy:
            self._urgent = True
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            # A gathering writer waits on for more lazy appends (unless its
            # batch is full already).
            if not lazy or not self._gathering or len(self._pending) >= self._max_batch:
                wakeup.set_result(None)

    async def _write_loop(self) -> None:
        pending = self._pending
        loop = asyncio.get_running_loop()
        stop = False
        try:
            while not stop:
                if not pending:
                    self._wakeup = loop.create_future()
                    await self._wakeup
                if self._gather and not self._urgent and len(pending) < self._max_batch:
                    due = self._last_commit + self._gather
                    if loop.time() < due:
                        await self._gather_until(loop, due)
                self._wakeup = None
                batch: list[Any] = []
                while pending and len(batch) < self._max_batch:
                    item = pending.popleft()
                    if item is _STOP:
                        stop = True
                        break
                    batch.append(item)
                # Whatever the batch left behind (more than max_batch were queued).
                self._urgent = any(type(item) is not _Append or not item.lazy for item in pending)
                if batch:
                    self._last_commit = loop.time()
                    await self._commit(batch, loop)
        finally:
            self._wakeup = None
            self._gathering = False
            # Not a clean stop (cancelled, crashed): fail whatever is still queued.
            while pending:
                item = pending.popleft()
                if item is not _STOP and not item.future.done():
                    item.future.set_exception(RuntimeError("event store writer stopped"))
            if self._async_conn is not None:
                await self._async_conn.close()
                self._async_conn = None

    def _start_writer_thread(self) -> None:
        loop = asyncio.get_running_loop()
        self._writer_done = loop.create_future()
        self._writer_thread = threading.Thread(target=self._serve_writes, args=(loop, self._writer_done), name="turnlog-writer", daemon=True)
        self._writer_thread.start()

    def _serve_writes(self, loop: asyncio.AbstractEventLoop, done: asyncio.Future[None]) -> None:
        """The SQLite writer: ``_write_loop``'s rules, run by the writer thread
        itself, which takes its next batch as soon as it has committed one.

        Why not a task on the event loop that hands each batch to the thread:
        the loop then decides the next batch only once it has run the previous
        one's callback, which a loop busy with a burst of turn starts runs
        tens of milliseconds late while the starts queued meanwhile wait, and
        under thousands of streams that doubles a commit's tail latency. The queue is a deque: the
        loop appends, this thread pops from the other end, each one step
        under the GIL; ``threading.Event`` wakes the thread when it waits.
        """
        pending, signal = self._pending, self._signal
        began = -math.inf
        stop = False
        try:
            while not stop:
                if not pending:
                    self._thread_waits = True
                    if not pending:  # (queued before the flag was seen)
                        signal.wait()
                    signal.clear()
                    self._thread_waits = False
                    continue
                while (hold := self._hold_windows(began)) is not None:
                    self._gathering = self._thread_waits = True
                    if self._hold_windows(began) is not None:  # (re-checked once the flags are seen)
                        signal.wait(None if hold == math.inf else hold)
                    signal.clear()
                    self._gathering = self._thread_waits = False
                batch: list[Any] = []
                urgent = 0
                while pending and len(batch) < self._max_batch:
                    item = pending.popleft()
                    if item is _STOP:
                        stop = True
                        break
                    if type(item) is not _Append or not item.lazy:
                        urgent += 1
                    batch.append(item)
                self._urgent_out += urgent
                if batch:
                    began = time.monotonic()
                    t0 = time.perf_counter()
                    try:
                        results = self._commit_in_thread(batch)
                    except Exception as exc:
                        # Poisoned here, before this thread appends anything
                        # after the lost events.
                        for item in batch:
                            if type(item) is _Append:
                                self._poison(item)
                        self._posted += 1
                        _post(loop, self._fail_batch, batch, exc)
                    else:
                        self._posted += 1
                        _post(loop, self._settle_batch, batch, results, time.perf_counter() - t0)
        finally:
            try:
                self._close_sync()
            except Exception:  # pragma: no cover - closing a broken connection
                log.exception("event store: closing the writer's connection failed")
            if stop:
                _post(loop, _settle, done, (True, None))
            else:  # pragma: no cover - a bug in this loop: fail what waits
                _post(loop, self._writer_died, done)

    def _hold_windows(self, began: float) -> float | None:
        """How long the writer thread holds what is queued (``math.inf``:
        until the loop takes the previous commit's outcome), or None: commit now.

        Only delta windows (lazy appends, which nobody awaits) are held: for
        the gather after the previous commit ``began``, and until the loop has
        taken that commit's outcome, so a busy loop's windows share commits as
        they did when the loop picked every batch. A request someone waits
        for, or a full batch, goes at once."""
        if self._urgent_in != self._urgent_out or len(self._pending) >= self._max_batch:
            return None
        wait = began + self._gather - time.monotonic()
        if wait > 0:
            return wait
        return math.inf if self._settled < self._posted else None

    def _writer_died(self, done: asyncio.Future[None]) -> None:  # pragma: no cover
        while self._pending:
            item = self._pending.popleft()
            if item is not _STOP and not item.future.done():
                item.future.set_exception(RuntimeError("event store writer stopped"))
        if not done.done():
            done.set_result(None)

    async def _gather_until(self, loop: asyncio.AbstractEventLoop, due: float) -> None:
        """Wait until ``due`` (loop time) unless a request that is not lazy
        comes, or a full batch is queued."""
        self._gathering = True
        wakeup = self._wakeup = loop.create_future()
        timer = loop.call_at(due, _wake, wakeup)
        try:
            await wakeup
        finally:
            timer.cancel()
            self._gathering = False

    def _poison(self, req: Any) -> None:
        if req.fencing is not None:
            self._poisoned.add((req.turn_id, req.fencing))

    async def _commit(self, batch: list[Any], loop: asyncio.AbstractEventLoop) -> None:
        """Write one batch in one transaction and resolve its futures (the
        async engine's writer; SQLite's thread has ``_serve_writes``)."""
        began = time.perf_counter()
        try:
            results = await self._commit_async(batch)
        except Exception as exc:  # BEGIN/COMMIT or the connection failed: all fail
            self._fail_batch(batch, exc)
            return
        except BaseException:
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(RuntimeError("event store writer cancelled"))
            raise
        self._settle_batch(batch, results, time.perf_counter() - began)

    def _taken(self) -> None:
        """The loop took a commit's outcome: held windows may go now."""
        self._settled += 1
        if self._gathering and self._thread_waits:
            self._signal.set()

    def _fail_batch(self, batch: list[Any], exc: BaseException) -> None:
        """A group commit failed as a whole (BEGIN/COMMIT, the connection): every
        request in it fails, and its turns' later appends are refused."""
        self._taken()
        log.error("event store: group commit of %d requests failed", len(batch), exc_info=exc)
        for item in batch:
            if type(item) is _Append:
                self._poison(item)
            if not item.future.done():
                item.future.set_exception(exc)

    def _settle_batch(self, batch: list[Any], results: Results, took: float) -> None:
        """A group commit is durable: resolve its futures, count it."""
        self._taken()
        n_events = n_started = 0
        for item, (ok, value) in zip(batch, results):
            if ok and type(item) is _Append:
                n_events += len(item.rows)
            elif ok and type(item) is _StartOp:
                n_started += item.events
            if item.future.done():  # the caller was cancelled
                continue
            if ok:
                item.future.set_result(value)
            else:
                item.future.set_exception(value)
        stats = self.stats
        stats["batches"] += 1
        stats["requests"] += len(batch)
        stats["events"] += n_events
        if self.observer is not None:
            observe(self.observer.events_committed, n_events + n_started, took)

    def _commit_in_thread(self, batch: list[Any]) -> Results:
        """A group commit in the writer thread (SQLite): appends, starts and
        releases on the raw sqlite3 connection (``adapters.store.sqlite_writer``);
        a batch of only those is framed there too, one with any other write
        in a SQLAlchemy transaction on the same connection."""
        assert self._writer_engine is not None
        if self._sync_conn is None:
            self._sync_conn = self._writer_engine.connect()
        conn = self._sync_conn
        try:
            raw: sqlite3.Connection = conn.connection.dbapi_connection  # type: ignore[assignment]
            if all(type(item) in _RAW_KINDS for item in batch):
                raw.execute("BEGIN IMMEDIATE")
                results = self._write_batch(conn, batch, raw)
                raw.execute("COMMIT")
            else:
                with conn.begin():
                    results = self._write_batch(conn, batch, raw)
            self._committed_links()
            return results
        except BaseException:
            self._sync_conn = None
            try:
                conn.invalidate()
                conn.close()
            except Exception:  # pragma: no cover
                pass
            raise

    async def _commit_async(self, batch: list[Any]) -> Results:
        """A group commit on the async engine. PostgreSQL: a batch of only
        appends, starts and releases on the asyncpg connection itself
        (``adapters.store.postgres_writer``); any other batch through
        SQLAlchemy (``run_sync``)."""
        if self._async_conn is None:
            self._async_conn = await self._write_engine.connect()
            self._driver_conn = None
        conn = self._async_conn
        try:
            if self._postgres and all(type(item) in _RAW_KINDS for item in batch):
                if self._driver_conn is None:
                    self._driver_conn = (await conn.get_raw_connection()).driver_connection
                raw = self._driver_conn
                async with raw.transaction():
                    results = await self._write_batch_pg(raw, batch)
            else:
                async with conn.begin():
                    results = await conn.run_sync(self._write_batch, batch)
            self._committed_links()
            return results
        except BaseException:
            self._async_conn = None
            self._driver_conn = None
            try:
                await conn.invalidate()
                await conn.close()
            except Exception:  # pragma: no cover
                pass
            raise

    def _close_sync(self, _: object = None) -> None:
        if self._sync_conn is not None:
            self._sync_conn.close()
            self._sync_conn = None

    def _committed_links(self) -> None:
        """The batch committed: its links are the turns' heads now."""
        if self._linked:
            if len(self._heads) > 20_000:  # turns long finished: read again if ever appended to
                self._heads.clear()
            self._heads.update(self._linked)
            self._linked = {}

    def _link(self, conn: Connection, rows: list[tuple[Any, ...]], trial: dict[str, Head]) -> list[tuple[Any, ...]]:
        """``rows`` with their hashes, linked after this batch's and the
        committed heads (``trial`` gets the new heads: merge it into
        ``_linked`` once the rows are written; with the chain off, rows carry
        None and pass through)."""

        def previous(turn_id: str, seq: int) -> bytes:
            self.stats["chain_reads"] += 1
            value = conn.execute(_SELECT_PREVIOUS_HASH, {"p_turn": turn_id, "p_seq": seq}).scalar()
            return previous_hash(value)

        return link_rows(rows, trial, previous, self._linked, self._heads)

    def _write_batch(self, conn: Connection, batch: list[Any], raw: sqlite3.Connection | None = None) -> Results:
        """The body of a group commit (sync; runs inside the open transaction).
        ``raw``: the SQLite writer thread's driver connection (under ``conn``),
        which appends, starts and releases use directly."""
        self._linked = {}
        results: Results = [(True, None)] * len(batch)
        i, n = 0, len(batch)
        while i < n:
            kind = type(batch[i])
            if kind is _Append or kind is _StartOp or kind is _Release:
                j = i + 1
                while j < n and type(batch[j]) is kind:
                    j += 1
                if raw is not None:
                    if kind is _Append:
                        self._append_run_raw(raw, batch, i, j, results)
                    elif kind is _StartOp:
                        self._start_run_raw(raw, batch, i, j, results)
                    else:
                        self._release_run_raw(raw, batch, i, j, results)
                elif kind is _Append:
                    self._append_run(conn, batch, i, j, results)
                elif kind is _StartOp:
                    self._start_run(conn, batch, i, j, results)
                else:
                    self._release_run(conn, batch, i, j, results)
                i = j
            else:
                self._run_op(conn, batch, i, results)
                i += 1
        return results

    def _run_op(self, conn: Connection, batch: list[Any], i: int, results: Results) -> None:
        """``batch[i]`` alone, in its own savepoint."""
        try:
            with conn.begin_nested():
                results[i] = (True, batch[i].fn(conn))
        except Exception as exc:  # the savepoint is rolled back: fails alone
            if conn.invalidated:
                raise
            results[i] = (False, exc)

    def _start_run(self, conn: Connection, batch: list[Any], start: int, end: int, results: Results) -> None:
        """Starts ``batch[start:end]``: all their turn rows, chats and first
        events in multi-row statements inside ONE savepoint (a burst of starts
        cost a savepoint and three statements each). Any failure (a turn id or
        an event seq already taken) rolls the savepoint back and the run is
        redone start by start, each in its own savepoint as before, so only the
        culprit fails (``ConcurrencyError``) and the outcome is that of one
        savepoint per start."""
        reqs: list[_StartOp] = batch[start:end]
        rows = [row for req in reqs for row in req.rows]
        if _plan.startable_together(reqs, rows):
            chats = _plan.merged_chats(reqs)
            upsert_chats, insert_turn = self._start_run_statements
            trial: dict[str, Head] = {}
            try:
                with conn.begin_nested():
                    conn.execute(insert_turn, [req.turn for req in reqs])
                    conn.execute(upsert_chats, chats)
                    if rows:
                        self._insert_events(conn, self._link(conn, rows, trial))
            except Exception:
                if conn.invalidated:
                    raise
            else:
                self._linked.update(trial)
                for i in range(start, end):
                    results[i] = (True, 1)
                return
        for i in range(start, end):
            self._run_op(conn, batch, i, results)

    def _release_run(self, conn: Connection, batch: list[Any], start: int, end: int, results: Results) -> None:
        """Releases ``batch[start:end]`` (turns that ended together): one
        executemany UPDATE in one savepoint; on a failure, one by one."""
        if end - start > 1:
            try:
                with conn.begin_nested():
                    conn.execute(_RELEASE_TURN, [batch[i].params for i in range(start, end)])
            except Exception:
                if conn.invalidated:
                    raise
            else:
                return  # results stay (True, None)
        for i in range(start, end):
            self._run_op(conn, batch, i, results)

    def _append_run(self, conn: Connection, batch: list[Any], start: int, end: int, results: Results) -> None:
        """Appends ``batch[start:end]``: fencing check, then fast or careful path."""
        live = list(range(start, end))
        fenced = _plan.fenced_turns(batch, start, end)
        if fenced:
            if self._sqlite:  # BEGIN IMMEDIATE: we hold the write lock already
                current = dict(conn.execute(_SELECT_FENCING_SQLITE, {"ids_json": _dumps(list(fenced))}).all())
            elif self._postgres:  # one statement text whatever the count: prepared once
                current = dict(conn.execute(_pg.SELECT_FENCING, {"ids": list(fenced)}).all())
            else:
                current = dict(conn.execute(_SELECT_FENCING.with_for_update(), {"ids": list(fenced)}).all())
            live = _plan.live_appends(batch, start, end, current, self._poisoned, results)

        # Fast path: all the run's events at once, unless the batch itself
        # repeats a (turn_id, seq) (then some request must fail: go one by one).
        rows = [row for i in live for row in batch[i].rows]
        if _plan.distinct_seqs(rows):
            updates = [batch[i].index for i in live if batch[i].index is not None]
            trial: dict[str, Head] = {}
            rows = self._link(conn, rows, trial)
            try:
                if self._sqlite and len(rows) <= _SQLITE_ROWS_PER_INSERT:
                    # One statement: atomic by itself, no savepoint needed.
                    if rows:
                        self._insert_events(conn, rows)
                    if updates:
                        conn.execute(_UPDATE_INDEX, updates)
                elif self._postgres:
                    # No savepoint (two round trips saved): an INSERT that
                    # inserts all or nothing, without failing the transaction.
                    if rows:
                        _pg.insert_events_all_or_none(conn, rows)
                    if updates:
                        conn.execute(_UPDATE_INDEX, updates)
                else:
                    with conn.begin_nested():
                        if rows:
                            self._insert_events(conn, rows)
                        if updates:
                            conn.execute(_UPDATE_INDEX, updates)
                self._linked.update(trial)
                return
            except (IntegrityError, _pg.Conflict):
                pass  # nothing of the run was written; find the culprits

        for i in live:
            req = batch[i]
            if (req.turn_id, req.fencing) in self._poisoned:  # an earlier request of this run failed
                results[i] = (False, after_failure(req.turn_id, req.fencing))
                continue
            trial = {}
            try:
                with conn.begin_nested():
                    if req.rows:
                        self._insert_events(conn, self._link(conn, req.rows, trial))
                    if req.index is not None:
                        conn.execute(_UPDATE_INDEX, [req.index])
                self._linked.update(trial)
            except IntegrityError as exc:
                results[i] = (False, _plan.seq_taken(req.turn_id, exc))
                self._poison(req)

    # ----------------------------------------- SQLite writer thread: the driver level

    def _link_raw(self, raw: sqlite3.Connection, rows: list[tuple[Any, ...]], trial: dict[str, Head]) -> list[tuple[Any, ...]]:
        """``_link`` with the previous hash read on the raw connection."""

        def previous(turn_id: str, seq: int) -> bytes:
            self.stats["chain_reads"] += 1
            found = raw.execute(_sw.SELECT_PREVIOUS_HASH, (turn_id, seq)).fetchone()
            return previous_hash(None if found is None else found[0])

        return link_rows(rows, trial, previous, self._linked, self._heads)

    def _append_run_raw(self, raw: sqlite3.Connection, batch: list[Any], start: int, end: int, results: Results) -> None:
        """``_append_run`` on the raw connection: the same checks, statements
        and fallback, without SQLAlchemy."""
        live = list(range(start, end))
        fenced = _plan.fenced_turns(batch, start, end)
        if fenced:
            current = _loads(raw.execute(_sw.SELECT_FENCING, (_dumps(list(fenced)),)).fetchone()[0])
            live = _plan.live_appends(batch, start, end, current, self._poisoned, results)

        # Fast path: all the run's events at once, unless the batch itself
        # repeats a (turn_id, seq) (then some request must fail: go one by one).
        rows = [row for i in live for row in batch[i].rows]
        if _plan.distinct_seqs(rows):
            updates = [batch[i].index for i in live if batch[i].index is not None]
            trial: dict[str, Head] = {}
            rows = self._link_raw(raw, rows, trial)
            try:
                if len(rows) <= _sw.ROWS_PER_INSERT:
                    # One statement: atomic by itself, no savepoint needed.
                    if rows:
                        _sw.insert_events(raw, rows)
                    if updates:
                        raw.executemany(_sw.UPDATE_INDEX, updates)
                else:
                    with _sw.savepoint(raw):
                        _sw.insert_events(raw, rows)
                        if updates:
                            raw.executemany(_sw.UPDATE_INDEX, updates)
                self._linked.update(trial)
                return
            except sqlite3.IntegrityError as exc:
                if _sw.fails_batch(raw, exc):
                    raise
                # nothing of the run was written; find the culprits

        for i in live:
            req = batch[i]
            if (req.turn_id, req.fencing) in self._poisoned:  # an earlier request of this run failed
                results[i] = (False, after_failure(req.turn_id, req.fencing))
                continue
            trial = {}
            try:
                with _sw.savepoint(raw):
                    if req.rows:
                        _sw.insert_events(raw, self._link_raw(raw, req.rows, trial))
                    if req.index is not None:
                        raw.execute(_sw.UPDATE_INDEX, req.index)
            except sqlite3.IntegrityError as exc:
                results[i] = (False, _plan.seq_taken(req.turn_id, exc))
                self._poison(req)
            else:
                self._linked.update(trial)

    def _start_run_raw(self, raw: sqlite3.Connection, batch: list[Any], start: int, end: int, results: Results) -> None:
        """``_start_run`` on the raw connection: all the run's turns, chats and
        first events in one savepoint; on any failure, start by start."""
        reqs: list[_StartOp] = batch[start:end]
        rows = [row for req in reqs for row in req.rows]
        if _plan.startable_together(reqs, rows):
            chats = _plan.merged_chats(reqs)
            trial: dict[str, Head] = {}
            try:
                with _sw.savepoint(raw):
                    _sw.write_rows(raw, _sw.INSERT_TURNS, _sw.TURN_ROW, _sw.TURN_PARAMS, [req.turn for req in reqs])
                    _sw.write_rows(raw, _sw.UPSERT_CHATS, _sw.CHAT_ROW, _sw.CHAT_PARAMS, chats, _sw.UPSERT_CHATS_TAIL)
                    if rows:
                        _sw.insert_events(raw, self._link_raw(raw, rows, trial))
            except Exception as exc:
                if _sw.fails_batch(raw, exc):
                    raise
            else:
                self._linked.update(trial)
                for i in range(start, end):
                    results[i] = (True, 1)
                return
        for i in range(start, end):
            req = batch[i]
            trial = {}
            try:
                with _sw.savepoint(raw):
                    _sw.write_rows(raw, _sw.UPSERT_CHATS, _sw.CHAT_ROW, _sw.CHAT_PARAMS, [{**req.chat, "c_upd": req.chat["c_at"]}], _sw.UPSERT_CHATS_TAIL)
                    try:
                        _sw.write_rows(raw, _sw.INSERT_TURNS, _sw.TURN_ROW, _sw.TURN_PARAMS, [req.turn])
                    except sqlite3.IntegrityError as exc:
                        raise ConcurrencyError(f"turn {req.turn['t_id']} already exists") from exc
                    if req.rows:
                        try:
                            _sw.insert_events(raw, self._link_raw(raw, req.rows, trial))
                        except sqlite3.IntegrityError as exc:
                            raise ConcurrencyError(f"turn {req.turn['t_id']}: event seq already taken") from exc
            except Exception as exc:
                if _sw.fails_batch(raw, exc):
                    raise
                results[i] = (False, exc)
            else:
                self._linked.update(trial)
                results[i] = (True, 1)

    def _release_run_raw(self, raw: sqlite3.Connection, batch: list[Any], start: int, end: int, results: Results) -> None:
        """``_release_run`` on the raw connection."""
        if end - start > 1:
            try:
                with _sw.savepoint(raw):
                    raw.execute(_sw.RELEASE_TURNS, _sw.release_pairs([batch[i].params for i in range(start, end)]))
            except Exception as exc:
                if _sw.fails_batch(raw, exc):
                    raise
            else:
                return  # results stay (True, None)
        for i in range(start, end):
            try:
                with _sw.savepoint(raw):
                    raw.execute(_sw.RELEASE_TURNS, _sw.release_pairs([batch[i].params]))
            except Exception as exc:
                if _sw.fails_batch(raw, exc):
                    raise
                results[i] = (False, exc)

    # ------------------------------------------ PostgreSQL: the asyncpg connection

    async def _write_batch_pg(self, raw: Any, batch: list[Any]) -> Results:
        """``_write_batch`` of a batch of only appends, starts and releases, on
        the asyncpg connection (inside its open transaction)."""
        self._linked = {}
        results: Results = [(True, None)] * len(batch)
        i, n = 0, len(batch)
        while i < n:
            kind = type(batch[i])
            j = i + 1
            while j < n and type(batch[j]) is kind:
                j += 1
            if kind is _Append:
                await self._append_run_pg(raw, batch, i, j, results)
            elif kind is _StartOp:
                await self._start_run_pg(raw, batch, i, j, results)
            else:
                await self._release_run_pg(raw, batch, i, j, results)
            i = j
        return results

    async def _link_pg(self, raw: Any, rows: list[tuple[Any, ...]], trial: dict[str, Head]) -> list[tuple[Any, ...]]:
        """``_link`` with the previous hashes it will need read first (the
        chain's link is sync): the rows whose turn has no head at ``seq - 1``
        in ``trial``, this batch's or the committed links, as ``link_rows``
        decides."""
        found: dict[tuple[str, int], bytes] = {}
        last: dict[str, int] = {}
        for row in rows:
            turn_id, seq, canon = row[0], row[1], row[5]
            if canon is None:  # the chain is off
                continue
            before = last.get(turn_id)
            if before is None:
                head = trial.get(turn_id) or self._linked.get(turn_id) or self._heads.get(turn_id)
                before = None if head is None else head[0]
            if seq > 1 and before != seq - 1:
                self.stats["chain_reads"] += 1
                found[(turn_id, seq)] = previous_hash(await raw.fetchval(_pw.SELECT_PREVIOUS_HASH, turn_id, seq))
            last[turn_id] = seq
        return link_rows(rows, trial, lambda turn_id, seq: found[(turn_id, seq)], self._linked, self._heads)

    async def _append_run_pg(self, raw: Any, batch: list[Any], start: int, end: int, results: Results) -> None:
        """``_append_run`` on the asyncpg connection: the same checks,
        statements and fallback."""
        live = list(range(start, end))
        fenced = _plan.fenced_turns(batch, start, end)
        if fenced:
            current = {row[0]: row[1] for row in await raw.fetch(_pw.SELECT_FENCING, list(fenced))}
            live = _plan.live_appends(batch, start, end, current, self._poisoned, results)

        rows = [row for i in live for row in batch[i].rows]
        if _plan.distinct_seqs(rows):
            updates = [_pw.index_args(batch[i].index) for i in live if batch[i].index is not None]
            trial: dict[str, Head] = {}
            rows = await self._link_pg(raw, rows, trial)
            try:
                # No savepoint (two round trips saved): an INSERT that inserts
                # all or nothing, without failing the transaction.
                if rows:
                    await _pw.insert_events_all_or_none(raw, rows)
                if updates:
                    await raw.executemany(_pw.UPDATE_INDEX, updates)
                self._linked.update(trial)
                return
            except _pg.Conflict:
                pass  # nothing of the run was written; find the culprits

        for i in live:
            req = batch[i]
            if (req.turn_id, req.fencing) in self._poisoned:  # an earlier request of this run failed
                results[i] = (False, after_failure(req.turn_id, req.fencing))
                continue
            trial = {}

            async def one(req: _Append = req, trial: dict[str, Head] = trial) -> None:
                if req.rows:
                    await _pw.insert_events(raw, await self._link_pg(raw, req.rows, trial))
                if req.index is not None:
                    await raw.execute(_pw.UPDATE_INDEX, *_pw.index_args(req.index))

            try:
                await _pw.in_savepoint(raw, one)
            except _UniqueViolation as exc:
                results[i] = (False, _plan.seq_taken(req.turn_id, exc))
                self._poison(req)
            else:
                self._linked.update(trial)

    async def _start_run_pg(self, raw: Any, batch: list[Any], start: int, end: int, results: Results) -> None:
        """``_start_run`` on the asyncpg connection."""
        reqs: list[_StartOp] = batch[start:end]
        rows = [row for req in reqs for row in req.rows]
        if _plan.startable_together(reqs, rows):
            chats = _plan.merged_chats(reqs)
            trial: dict[str, Head] = {}

            async def run() -> None:
                await raw.executemany(_pw.INSERT_TURN, [_pw.turn_args(req.turn) for req in reqs])
                await raw.executemany(_pw.UPSERT_CHAT, [_pw.chat_args(chat) for chat in chats])
                if rows:
                    await _pw.insert_events(raw, await self._link_pg(raw, rows, trial))

            try:
                await _pw.in_savepoint(raw, run)
            except Exception as exc:
                if _pw.fails_batch(raw, exc):
                    raise
            else:
                self._linked.update(trial)
                for i in range(start, end):
                    results[i] = (True, 1)
                return
        for i in range(start, end):
            req = batch[i]
            trial = {}

            async def one(req: _StartOp = req, trial: dict[str, Head] = trial) -> None:
                await raw.execute(_pw.UPSERT_CHAT, *_pw.chat_args(req.chat))
                try:
                    await raw.execute(_pw.INSERT_TURN, *_pw.turn_args(req.turn))
                except _UniqueViolation as exc:
                    raise ConcurrencyError(f"turn {req.turn['t_id']} already exists") from exc
                if req.rows:
                    try:
                        await _pw.insert_events(raw, await self._link_pg(raw, req.rows, trial))
                    except _UniqueViolation as exc:
                        raise ConcurrencyError(f"turn {req.turn['t_id']}: event seq already taken") from exc

            try:
                await _pw.in_savepoint(raw, one)
            except Exception as exc:
                if _pw.fails_batch(raw, exc):
                    raise
                results[i] = (False, exc)
            else:
                self._linked.update(trial)
                results[i] = (True, 1)

    async def _release_run_pg(self, raw: Any, batch: list[Any], start: int, end: int, results: Results) -> None:
        """``_release_run`` on the asyncpg connection: one executemany (one
        round trip); on a failure, one by one."""
        if end - start > 1:
            params = [_pw.release_args(batch[i].params) for i in range(start, end)]

            async def run() -> None:
                await raw.executemany(_pw.RELEASE_TURN, params)

            try:
                await _pw.in_savepoint(raw, run)
            except Exception as exc:
                if _pw.fails_batch(raw, exc):
                    raise
            else:
                return  # results stay (True, None)
        for i in range(start, end):

            async def one(args: tuple[Any, ...] = _pw.release_args(batch[i].params)) -> None:
                await raw.execute(_pw.RELEASE_TURN, *args)

            try:
                await _pw.in_savepoint(raw, one)
            except Exception as exc:
                if _pw.fails_batch(raw, exc):
                    raise
                results[i] = (False, exc)

    def _insert_events(self, conn: Connection, rows: list[tuple[Any, ...]]) -> None:
        """INSERT ``rows``; atomic if ``len(rows) <= _SQLITE_ROWS_PER_INSERT``
        (else call it inside a savepoint)."""
        if self._sqlite:
            step = _SQLITE_ROWS_PER_INSERT
            for k in range(0, len(rows), step):
                chunk = rows[k : k + step]
                conn.exec_driver_sql(_sqlite_insert_events(len(chunk)), tuple(v for row in chunk for v in row))
        elif self._postgres:
            _pg.insert_events(conn, rows)
        else:
            conn.execute(_INSERT_EVENTS, [dict(zip(_EVENT_COLUMNS, row)) for row in rows])

    @functools.cached_property
    def _start_statements(self) -> tuple[Any, Any, Any]:
        """``start_turn``'s statements, built once with bind parameters: building
        them per turn cost ~0.3 ms of the event loop at every turn start."""
        at = bindparam("c_at", type_=Float)
        insert_chat = self._insert_ignore(chats).values(id=bindparam("c_id"), user_id=bindparam("c_user"), title=None, tags="[]", created_at=at, updated_at=at)
        bump_chat = (
            update(chats)
            .where(chats.c.id == bindparam("c_id"))
            .values(
                updated_at=case(
                    (or_(chats.c.updated_at.is_(None), chats.c.updated_at < at), at),
                    else_=chats.c.updated_at,
                )
            )
        )
        insert_turn = turns.insert().values(
            id=bindparam("t_id"),
            chat_id=bindparam("t_chat"),
            user_id=bindparam("t_user"),
            model=bindparam("t_model"),
            status=bindparam("t_status"),
            created_at=bindparam("t_created"),
            updated_at=bindparam("t_updated"),
            owner=bindparam("t_owner"),
            lease_until=bindparam("t_lease"),
            fencing=1,
            view=bindparam("t_view"),
        )
        return insert_chat, bump_chat, insert_turn

    @functools.cached_property
    def _start_run_statements(self) -> tuple[Any, Any]:
        """A run of starts' statements (executemany): the chats' upsert (create,
        or move ``updated_at`` forward as ``start_turn``'s bump does) and the
        turns' INSERT."""
        from sqlalchemy.dialects import postgresql, sqlite

        dialect_insert: Any
        if self._dialect == "sqlite":
            dialect_insert = sqlite.insert
        elif self._dialect == "postgresql":
            dialect_insert = postgresql.insert
        else:  # pragma: no cover
            raise NotImplementedError(f"dialect {self._dialect}")
        upd = bindparam("c_upd", type_=Float)
        stmt = dialect_insert(chats).values(
            id=bindparam("c_id"),
            user_id=bindparam("c_user"),
            title=None,
            tags="[]",
            created_at=bindparam("c_at", type_=Float),
            updated_at=upd,
        )
        upsert_chats = stmt.on_conflict_do_update(
            index_elements=[chats.c.id],
            set_={
                "updated_at": case(
                    (or_(chats.c.updated_at.is_(None), chats.c.updated_at < stmt.excluded.updated_at), stmt.excluded.updated_at),
                    else_=chats.c.updated_at,
                )
            },
        )
        return upsert_chats, self._start_statements[2]

    def _insert_ignore(self, table: Any) -> Any:
        """``INSERT … ON CONFLICT DO NOTHING`` for this dialect."""
        if self._dialect == "sqlite":
            from sqlalchemy.dialects import sqlite

            return sqlite.insert(table).on_conflict_do_nothing()
        if self._dialect == "postgresql":
            from sqlalchemy.dialects import postgresql

            return postgresql.insert(table).on_conflict_do_nothing()
        raise NotImplementedError(f"dialect {self._dialect}")  # pragma: no cover


_RELEASE_TURN = update(turns).where(turns.c.id == bindparam("r_id"), turns.c.owner == bindparam("r_owner")).values(owner=None, lease_until=None)


#: Writes done at the driver level (SQLite writer thread, asyncpg), exact types.
_RAW_KINDS = (_Append, _StartOp, _Release)

#: asyncpg's unique violation (a taken turn id or ``(turn_id, seq)``), as an
#: ``except`` clause: none without the PostgreSQL driver.
_UniqueViolation: tuple[type[Exception], ...]
try:
    from asyncpg.exceptions import UniqueViolationError

    _UniqueViolation = (UniqueViolationError,)
except ImportError:  # pragma: no cover - a SQLite-only install
    _UniqueViolation = ()


def _post(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    """``fn(*args)`` on the loop, from the writer thread."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # pragma: no cover - the loop is closed: nobody waits
        pass


def _settle(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if not future.done():  # not cancelled
        ok, value = outcome
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


def _executing(stmt: Any) -> Op:
    def op(conn: Connection) -> None:
        conn.execute(stmt)

    return op


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
