"""``MemoryEventStore``: the event store in plain Python objects, for engine tests.

Like the ``eventsourcing`` library's POPO recorder, it passes the same contract
(``tests/test_store_contract.py``) as the SQL backends, so a fast engine test
on it (no threads, no files, no database) means what it would mean on SQLite
or PostgreSQL. It copies ``SqlEventStore``'s behaviour, not only its port:

* writes go through one writer task per store, taken from a queue in group
  commits of up to ``max_batch`` requests: a future resolves only when its
  batch is applied, requests of one batch apply in queue order, each one
  atomically and failing alone, and ``stats`` counts batches the same way;
* ``append_nowait`` checks its arguments and encodes the events at once
  (``ValueError``, ``TypeError`` and "closed" raise in the caller), then
  returns the request's future; a cancelled caller does not withdraw it;
* a stale fencing token is ``LeaseLost``, a taken ``(turn_id, seq)`` is
  ``ConcurrencyError``, and after a failed append with a token every later
  append with that token is refused (``after_failure``): the poisoned tokens
  belong to the store instance, the tables to the :class:`MemoryDatabase`;
* event data, views and tags are kept as the same JSON text, so readers get
  fresh objects (never the writer's) and ``read`` upcasts like the SQL read;
* every read suspends the caller once, as a database round trip does, so a
  task that polls the store lets the writer run.

Several stores on one :class:`MemoryDatabase` behave like processes on one
database: shared log and leases, a writer and poisoned tokens each.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from adapters.store.common import (
    EventRow,
    after_failure,
    dumps,
    event_rows,
    hash_api_key,
    hash_hex,
    link_rows,
    loads,
    new_api_key,
    previous_hash,
    stale_token,
)
from adapters.store.usage import COUNTS, TERMINAL, Limits, day_of
from engine.blobs import blob_id as _blob_id
from engine.chain import GENESIS, StoredEvent
from engine.events import Event, upcast
from engine.ports import ROLES, ChatRecord, ConcurrencyError, IndexUpdate, KeyHolder, TurnRecord

log = logging.getLogger(__name__)

__all__ = ["MemoryDatabase", "MemoryEventStore"]

_STOP = object()

#: Per request: (True, result) or (False, exception).
Results = list[tuple[bool, Any]]


@dataclass(slots=True)
class _TurnRow:
    chat_id: str
    user_id: str
    model: str
    status: str
    created_at: float
    updated_at: float
    owner: str | None
    lease_until: float | None
    fencing: int
    view: str | None  # JSON text

    def record(self, turn_id: str) -> TurnRecord:
        return TurnRecord(
            id=turn_id,
            chat_id=self.chat_id,
            user_id=self.user_id,
            model=self.model,
            status=self.status,
            created_at=self.created_at,
            updated_at=self.updated_at,
            owner=self.owner,
            lease_until=self.lease_until,
            fencing=self.fencing,
            view=None if self.view is None else loads(self.view),
        )


@dataclass(slots=True)
class _ChatRow:
    user_id: str
    title: str | None
    tags: str  # JSON text
    created_at: float
    updated_at: float

    def record(self, chat_id: str) -> ChatRecord:
        return ChatRecord(
            id=chat_id,
            user_id=self.user_id,
            title=self.title,
            created_at=self.created_at,
            updated_at=self.updated_at,
            tags=loads(self.tags) if self.tags else [],
        )


@dataclass(slots=True)
class _TurnLog:
    """One turn's events: ``seqs`` sorted (appends may come out of order)."""

    seqs: list[int] = field(default_factory=list)
    # seq -> (type, at, data, hash)
    rows: dict[int, tuple[str, float, str, bytes | None]] = field(default_factory=dict)

    def previous_hash(self, seq: int) -> bytes:
        """The hash of the last event before ``seq`` (the chain's previous link)."""
        i = bisect.bisect_left(self.seqs, seq)
        return GENESIS if i == 0 else previous_hash(self.rows[self.seqs[i - 1]][3])


@dataclass(slots=True)
class _BlobRow:
    user_id: str
    mime: str
    data: bytes
    created_at: float


class MemoryDatabase:
    """What the SQL tables hold, as dicts: the state several stores may share.

    ``api_keys`` maps the key's sha256 (``hash_api_key``) to ``(user_id,
    created_at, role)``: like the ``api_keys`` table, it never holds a key."""

    def __init__(self) -> None:
        self.events: dict[str, _TurnLog] = {}
        self.turns: dict[str, _TurnRow] = {}
        self.chats: dict[str, _ChatRow] = {}
        self.api_keys: dict[str, tuple[str, float, str]] = {}
        self.blobs: dict[str, _BlobRow] = {}
        # What the usage tables hold (``adapters.store.usage``): the rollup by
        # (user_id, key_hash, day, model), and each key's quotas.
        self.usage_rollup: dict[tuple[str, str, str, str], dict[str, int]] = {}
        self.key_quotas: dict[str, Limits] = {}

    def taken(self, rows: Sequence[EventRow]) -> bool:
        """Whether ``rows`` repeat a ``(turn_id, seq)`` or meet a stored one (the
        unique constraint)."""
        keys = {(row[0], row[1]) for row in rows}
        if len(keys) != len(rows):
            return True
        events = self.events
        return any(turn_id in events and seq in events[turn_id].rows for turn_id, seq in keys)

    def insert(self, rows: Sequence[EventRow]) -> None:
        """Insert ``rows``, hash-chained; the caller has checked :meth:`taken`."""
        events = self.events

        def previous(turn_id: str, seq: int) -> bytes:
            log_ = events.get(turn_id)
            return GENESIS if log_ is None else log_.previous_hash(seq)

        for turn_id, seq, type_, at, data, hash_ in link_rows(rows, {}, previous):
            log_ = self.events.get(turn_id)
            if log_ is None:
                log_ = self.events[turn_id] = _TurnLog()
            if not log_.seqs or seq > log_.seqs[-1]:
                log_.seqs.append(seq)
            else:
                bisect.insort(log_.seqs, seq)
            log_.rows[seq] = (type_, float(at), data, hash_)


class _Append:
    __slots__ = ("rows", "turn_id", "fencing", "index", "future")

    def __init__(
        self,
        rows: list[EventRow],
        turn_id: str | None,
        fencing: int | None,
        index: tuple[str | None, str | None, float, str | None] | None,
        future: asyncio.Future[Any],
    ) -> None:
        self.rows = rows
        self.turn_id = turn_id
        self.fencing = fencing
        self.index = index  # (status, view JSON, updated_at, releasing owner)
        self.future = future


class _Op:
    """Any other write: ``fn`` checks before it changes anything, so that a
    failure (an exception) leaves no trace, as a rolled-back savepoint."""

    __slots__ = ("fn", "future")

    def __init__(self, fn: Callable[[], Any], future: asyncio.Future[Any]) -> None:
        self.fn = fn
        self.future = future


async def _round_trip() -> None:
    """Where a SQL read awaits the database: a reader never holds the loop for
    good (``sleep(0)`` is asyncio's one-step yield, not a wait)."""
    await asyncio.sleep(0)


class MemoryEventStore:
    """``engine.ports.EventStore`` and ``BlobStore`` in memory.

    ``database`` is the state (a fresh one if not given; pass the same one to
    another store for a second "process"); ``clock`` and ``max_batch`` as in
    ``SqlEventStore``, and so are :meth:`set_chat_meta` and ``stats``.
    """

    def __init__(
        self,
        database: MemoryDatabase | None = None,
        *,
        clock: Callable[[], float] = time.time,
        max_batch: int = 1000,
    ) -> None:
        self.database = database if database is not None else MemoryDatabase()
        self._clock = clock
        self._max_batch = max_batch
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._poisoned: set[tuple[str | None, int]] = set()
        self._writer: asyncio.Task[None] | None = None
        self._closed = False
        #: Group-commit counters: applied batches, requests and events.
        self.stats = {"batches": 0, "requests": 0, "events": 0}

    # ------------------------------------------------------------------ writes

    async def start_turn(self, turn: TurnRecord, events: Sequence[Event], *, lease_seconds: float) -> int:
        rows = event_rows(events)
        if any(row[0] != turn.id for row in rows):
            raise ValueError("start_turn: events of another turn")
        view = None if turn.view is None else dumps(turn.view)
        lease_until = self._clock() + lease_seconds
        db = self.database

        def op() -> int:
            if turn.id in db.turns:
                raise ConcurrencyError(f"turn {turn.id} already exists")
            if rows and db.taken(rows):
                raise ConcurrencyError(f"turn {turn.id}: event seq already taken")
            created_at = float(turn.created_at)  # what a Float column gives back
            chat = db.chats.get(turn.chat_id)
            if chat is None:
                db.chats[turn.chat_id] = _ChatRow(turn.user_id, None, "[]", created_at, created_at)
            elif chat.updated_at < created_at:
                chat.updated_at = created_at  # never back in time
            db.turns[turn.id] = _TurnRow(
                chat_id=turn.chat_id,
                user_id=turn.user_id,
                model=turn.model,
                status=turn.status,
                created_at=created_at,
                updated_at=float(turn.updated_at),
                owner=turn.owner,
                lease_until=lease_until,
                fencing=1,
                view=view,
            )
            db.insert(rows)
            return 1

        return await self._submit(_Op, op)

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
        rows = event_rows(events)
        turn_ids = {row[0] for row in rows}
        turn_id = next(iter(turn_ids)) if len(turn_ids) == 1 else None
        if (fencing is not None or index is not None) and turn_id is None:
            raise ValueError("append: fencing/index need events of exactly one turn")
        index_row = None
        if index is not None:
            view = None if index.view is None else dumps(index.view)
            index_row = (index.status, view, float(rows[-1][3]), index.release)
        return self._submit(_Append, rows, turn_id, fencing, index_row)

    async def set_chat_meta(self, chat_id: str, *, title: str | None = None, tags: Sequence[str] | None = None) -> None:
        """Set a chat's title and/or tags (None leaves a field as it is)."""
        if title is None and tags is None:
            return
        tags_json = None if tags is None else dumps(list(tags))
        db = self.database

        def op() -> None:
            chat = db.chats.get(chat_id)
            if chat is not None:
                if title is not None:
                    chat.title = title
                if tags_json is not None:
                    chat.tags = tags_json

        await self._submit(_Op, op)

    async def claim_turn(self, turn_id: str, owner: str, *, lease_seconds: float, dead_owner: str | None = None) -> int | None:
        db = self.database

        def op() -> int | None:
            now = self._clock()
            row = db.turns.get(turn_id)
            takeable = row is not None and row.owner in (owner, dead_owner or owner)
            if row is None or not (takeable or row.lease_until is None or row.lease_until < now):
                return None
            row.fencing += 1
            row.owner = owner
            row.lease_until = now + lease_seconds
            return row.fencing

        return await self._submit(_Op, op)

    async def renew_leases(self, owner: str, turn_ids: Sequence[str], *, lease_seconds: float) -> None:
        ids = list(turn_ids)
        if not ids:
            return
        db = self.database

        def op() -> None:
            lease_until = self._clock() + lease_seconds
            for turn_id in ids:
                row = db.turns.get(turn_id)
                if row is not None and row.owner == owner:
                    row.lease_until = lease_until

        await self._submit(_Op, op)

    async def release_turn(self, turn_id: str, owner: str) -> None:
        db = self.database

        def op() -> None:
            row = db.turns.get(turn_id)
            if row is not None and row.owner == owner:
                row.owner = None
                row.lease_until = None

        await self._submit(_Op, op)

    async def create_api_key(self, user_id: str, role: str = "user") -> str:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}")
        key = new_api_key()
        entry = (user_id, self._clock(), role)
        key_hash = hash_api_key(key)

        def op() -> None:
            self.database.api_keys[key_hash] = entry

        await self._submit(_Op, op)
        return key

    # ------------------------------------------------------------------- blobs

    async def put_blob(self, user_id: str, data: bytes, mime: str) -> str:
        """Store ``data`` once per user (``engine.blobs.blob_id``); the first mime
        stays. A known id is answered by a read, without queueing a write."""
        data = bytes(data)
        ident = _blob_id(user_id, data)
        await _round_trip()
        blobs = self.database.blobs
        if ident in blobs:
            return ident
        row = _BlobRow(user_id, mime, data, self._clock())

        def op() -> None:
            blobs.setdefault(ident, row)  # a concurrent put of the same bytes won

        await self._submit(_Op, op)
        return ident

    async def get_blob(self, user_id: str, blob_id: str) -> tuple[str, bytes] | None:
        """``(mime, data)`` of ``user_id``'s blob; None if unknown or another user's."""
        await _round_trip()
        row = self.database.blobs.get(blob_id)
        if row is None or row.user_id != user_id:
            return None
        return row.mime, row.data

    # ------------------------------------------------------------------- reads

    def _rows(self, turn_id: str, after: int, limit: int | None) -> list[tuple[int, Any]]:
        """``(seq, row)`` of the turn's events after ``after``, at most ``limit``."""
        log_ = self.database.events.get(turn_id)
        if log_ is None:
            return []
        start = bisect.bisect_right(log_.seqs, after)
        seqs = log_.seqs[start:] if limit is None else log_.seqs[start : start + max(limit, 0)]
        return [(seq, log_.rows[seq]) for seq in seqs]

    async def read(self, turn_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        await _round_trip()
        construct = Event.model_construct
        return [
            upcast(construct(turn_id=turn_id, seq=seq, type=type_, at=at, data=loads(data))) for seq, (type_, at, data, _) in self._rows(turn_id, after, limit)
        ]

    async def read_chain(self, turn_id: str, after: int = 0, limit: int | None = None) -> list[StoredEvent]:
        await _round_trip()
        return [StoredEvent(turn_id, seq, type_, at, loads(data), hash_hex(hash_)) for seq, (type_, at, data, hash_) in self._rows(turn_id, after, limit)]

    async def get_turn(self, turn_id: str) -> TurnRecord | None:
        await _round_trip()
        row = self.database.turns.get(turn_id)
        return None if row is None else row.record(turn_id)

    async def list_turns(
        self,
        *,
        user_id: str | None = None,
        chat_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
    ) -> list[TurnRecord]:
        await _round_trip()
        found = [
            (turn_id, row)
            for turn_id, row in self.database.turns.items()
            if (user_id is None or row.user_id == user_id) and (chat_id is None or row.chat_id == chat_id) and (status is None or row.status == status)
        ]
        found.sort(key=lambda item: (item[1].created_at, item[0]), reverse=True)
        return [row.record(turn_id) for turn_id, row in found[: max(limit, 0)]]

    async def get_chat(self, chat_id: str) -> ChatRecord | None:
        await _round_trip()
        row = self.database.chats.get(chat_id)
        return None if row is None else row.record(chat_id)

    async def list_chats(self, user_id: str, *, limit: int = 50, before: float | None = None) -> list[ChatRecord]:
        await _round_trip()
        found = [(chat_id, row) for chat_id, row in self.database.chats.items() if row.user_id == user_id and (before is None or row.updated_at < before)]
        found.sort(key=lambda item: (item[1].updated_at, item[0]), reverse=True)
        return [row.record(chat_id) for chat_id, row in found[: max(limit, 0)]]

    async def orphaned_turns(self, now: float) -> list[TurnRecord]:
        await _round_trip()
        found = [
            (turn_id, row) for turn_id, row in self.database.turns.items() if row.status == "running" and (row.lease_until is None or row.lease_until < now)
        ]
        found.sort(key=lambda item: (item[1].created_at, item[0]))
        return [row.record(turn_id) for turn_id, row in found]

    async def user_for_api_key(self, key: str) -> str | None:
        await _round_trip()
        entry = self.database.api_keys.get(hash_api_key(key))
        return None if entry is None else entry[0]

    async def key_holder(self, key: str) -> KeyHolder | None:
        await _round_trip()
        entry = self.database.api_keys.get(hash_api_key(key))
        return None if entry is None else KeyHolder(entry[0], entry[2])

    # --------------------------------------------------------------- lifecycle

    async def close(self) -> None:
        """Finish every queued write and stop the writer (the database stays)."""
        if not self._closed:
            self._closed = True
            if self._writer is not None and not self._writer.done():
                self._queue.put_nowait(_STOP)
                await asyncio.shield(self._writer)

    # ------------------------------------------------------------ group commit

    def _submit(self, kind: type, *args: Any) -> asyncio.Future[Any]:
        """Queue a request for the writer; the future resolves once applied."""
        if self._closed:
            raise RuntimeError("event store is closed")
        writer = self._writer
        if writer is None or writer.done():
            writer = self._writer = asyncio.get_running_loop().create_task(self._write_loop(), name="turnlog-memory-store-writer")
        future = writer.get_loop().create_future()
        self._queue.put_nowait(kind(*args, future))
        return future

    async def _write_loop(self) -> None:
        queue = self._queue
        stop = False
        try:
            while not stop:
                batch: list[Any] = []
                item = await queue.get()
                while True:
                    if item is _STOP:
                        stop = True
                        break
                    batch.append(item)
                    if len(batch) >= self._max_batch or queue.empty():
                        break
                    item = queue.get_nowait()
                if batch:
                    self._commit(batch)
        finally:
            # Not a clean stop (cancelled): fail whatever is still queued.
            while not queue.empty():
                item = queue.get_nowait()
                if item is not _STOP and not item.future.done():
                    item.future.set_exception(RuntimeError("event store writer stopped"))

    def _commit(self, batch: list[Any]) -> None:
        """Apply one batch, in queue order, and resolve its futures."""
        results: Results = []
        try:
            for item in batch:
                if type(item) is _Append:
                    results.append(self._apply_append(item))
                else:
                    try:
                        results.append((True, item.fn()))
                    except Exception as exc:  # its check failed: nothing was changed
                        results.append((False, exc))
        except Exception as exc:  # a bug here: fail the batch as a failed COMMIT does
            log.exception("memory event store: group commit of %d requests failed", len(batch))
            for item in batch:
                if type(item) is _Append:
                    self._poison(item)
                if not item.future.done():
                    item.future.set_exception(exc)
            return
        n_events = 0
        for item, (ok, value) in zip(batch, results):
            if ok and type(item) is _Append:
                n_events += len(item.rows)
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

    def _poison(self, req: _Append) -> None:
        if req.fencing is not None:
            self._poisoned.add((req.turn_id, req.fencing))

    def _apply_append(self, req: _Append) -> tuple[bool, Any]:
        """One append, all or nothing: the outcome ``SqlEventStore`` gives it."""
        db = self.database
        if req.fencing is not None:
            row = db.turns.get(req.turn_id) if req.turn_id is not None else None
            current = None if row is None else row.fencing
            if current != req.fencing:
                return False, stale_token(req.turn_id, req.fencing, current)
            if (req.turn_id, req.fencing) in self._poisoned:
                return False, after_failure(req.turn_id, req.fencing)
        if db.taken(req.rows):
            self._poison(req)
            return False, ConcurrencyError(f"turn {req.turn_id}: an event's seq is already taken")
        db.insert(req.rows)
        if req.index is not None and req.turn_id is not None:
            turn = db.turns.get(req.turn_id)
            if turn is not None:
                status, view, updated_at, release = req.index
                old_view = turn.view
                if status is not None:
                    turn.status = status
                if view is not None:
                    turn.view = view
                turn.updated_at = updated_at
                # The usage rollup, as the SQL stores' trigger keeps it.
                if turn.status in TERMINAL and turn.view is not None and turn.view != old_view:
                    roll_up(db, req.turn_id, old_view, turn.view)
                if release is not None and turn.owner == release:
                    turn.owner = None
                    turn.lease_until = None
        return True, None


def roll_up(db: MemoryDatabase, turn_id: str, old_view: str | None, new_view: str) -> None:
    """The memory store's rollup: what the database triggers do when a turn's
    row takes a terminal status with a new view (the caller checked both)."""
    turn = db.turns[turn_id]
    new, old = json.loads(new_view), json.loads(old_view) if old_view else {}
    log = db.events.get(turn_id)
    first = log.rows.get(1) if log is not None else None
    started = json.loads(first[2]) if first is not None else {}
    key_hash = started.get("key_hash") or ""
    counts = db.usage_rollup.setdefault((turn.user_id, key_hash, day_of(turn.updated_at), turn.model), dict.fromkeys(COUNTS, 0))
    was_ended = old.get("status") in TERMINAL
    # A fork's copied events: the parent counted them (taken off at the first end).
    forked = first is not None and first[0] == "turn.forked"
    copied = (started.get("copied") or {}) if forked and not was_ended else {}
    counts["turns"] += 0 if was_ended else 1
    for name in ("input_tokens", "output_tokens"):
        counts[name] += _tokens(new, name) - _tokens(old, name) - int(copied.get(name) or 0)
    counts["tool_calls"] += _calls(new) - _calls(old) - int(copied.get("tool_calls") or 0)
    if new.get("usage_estimated") is True and not (was_ended and old.get("usage_estimated") is True):
        counts["estimated_turns"] += 1


def _tokens(view: dict[str, Any], name: str) -> int:
    usage = view.get("usage")
    return int((usage or {}).get(name) or 0) if isinstance(usage, dict) else 0


def _calls(view: dict[str, Any]) -> int:
    output = view.get("output")
    return sum(1 for item in output if isinstance(item, dict) and item.get("type") == "function_call") if isinstance(output, list) else 0
