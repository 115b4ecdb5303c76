"""The PostgreSQL writer: every write of the store, on one asyncpg connection.

``adapters.store.group_commit.TaskGroupCommit`` runs :class:`PostgresWriter`
as a task on the event loop: each batch is one asyncpg transaction on the
writer's connection (from the store's engine pool: its timeouts and
settings), with the statements below, not SQLAlchemy's ``run_sync`` (a
greenlet switch per statement, its execution context and the asyncpg
adapter's cursor on top of the driver's own work). asyncpg prepares each
statement text once per connection and keeps it; ``executemany`` sends all
its rows in one round trip.

Appends, starts and releases come in runs written in few statements (a
failure redoes the run request by request, so only the culprit fails); any
other write (claim, renew, chat meta, blobs, API keys) is one statement of
``STATEMENTS`` in its own savepoint.

``events.id`` is a surrogate key from its ``BIGSERIAL`` sequence: group
commits of several processes insert side by side (no table lock). Per-turn
order and optimistic concurrency come from the unique ``(turn_id, seq)``;
the fencing read's row locks on ``turns`` serialize two writers of one turn.

Savepoints are plain ``SAVEPOINT`` statements; if rolling one back fails, the
transaction cannot be trusted and the whole batch fails (:class:`BatchLost`).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from adapters.store import batch_plan as plan
from adapters.store.batch_plan import Append, BatchWriter, Release, Start, Write
from adapters.store.common import EventRow, Head, link_rows, previous_hash
from adapters.store.group_commit import Results

#: asyncpg's unique violation (a taken turn id or ``(turn_id, seq)``): none
#: without the PostgreSQL driver.
_UNIQUE: tuple[type[BaseException], ...]
try:
    from asyncpg.exceptions import UniqueViolationError

    _UNIQUE = (UniqueViolationError,)
except ImportError:  # pragma: no cover - a SQLite-only install
    _UNIQUE = ()

#: The fencing tokens of some turns, row-locked until the end of the transaction.
SELECT_FENCING = "SELECT id, fencing FROM turns WHERE id = ANY($1::text[]) FOR UPDATE"

#: The hash before ``seq`` (the chain's previous link) when the writer has not
#: linked that turn's last event itself.
SELECT_PREVIOUS_HASH = "SELECT hash FROM events WHERE turn_id = $1 AND seq < $2 ORDER BY seq DESC LIMIT 1"

_UNNEST = "unnest($1::text[], $2::integer[], $3::text[], $4::float8[], $5::text[], $6::bytea[])"

#: Any number of events in one statement (the rows as column arrays).
INSERT_EVENTS = f"INSERT INTO events (turn_id, seq, type, at, data, hash) SELECT * FROM {_UNNEST}"

#: The fast path's INSERT: conflicting rows skipped, not failing the
#: transaction; the ids of the rows that went in (``insert_events_all_or_none``).
INSERT_EVENTS_SKIPPING = (
    "WITH inserted AS (INSERT INTO events (turn_id, seq, type, at, data, hash) "
    f"SELECT * FROM {_UNNEST} ON CONFLICT (turn_id, seq) DO NOTHING RETURNING id) "
    "SELECT count(*), array_agg(id) FROM inserted"
)
DELETE_EVENTS = "DELETE FROM events WHERE id = ANY($1::bigint[])"

#: ``engine.ports.IndexUpdate``: status and view unless NULL; the lease
#: released with the terminal event if ``$3`` still owns it (SET expressions
#: read the old row).
UPDATE_INDEX = (
    "UPDATE turns SET status = coalesce($1, status), updated_at = $2, "
    "owner = CASE WHEN (owner = $3) THEN NULL ELSE owner END, "
    "lease_until = CASE WHEN (owner = $3) THEN NULL ELSE lease_until END, "
    '"view" = coalesce($4, "view") WHERE id = $5'
)

#: A start's turn row, fencing token 1.
INSERT_TURN = (
    "INSERT INTO turns (id, chat_id, user_id, model, status, created_at, updated_at, owner, lease_until, "
    'fencing, "view") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 1, $10)'
)

#: A start's chat: created, or its ``updated_at`` moved forward to ``$4``.
UPSERT_CHAT = (
    "INSERT INTO chats (id, user_id, title, tags, created_at, updated_at) VALUES ($1, $2, NULL, '[]', $3, $4) "
    "ON CONFLICT (id) DO UPDATE SET updated_at = CASE WHEN (chats.updated_at IS NULL "
    "OR chats.updated_at < excluded.updated_at) THEN excluded.updated_at ELSE chats.updated_at END"
)

#: ``release_turn``: only if that owner still holds it.
RELEASE_TURN = "UPDATE turns SET owner = NULL, lease_until = NULL WHERE id = $1 AND owner = $2"


#: The other writes (``batch_plan.Write``).
STATEMENTS = {
    "claim": (
        "UPDATE turns SET fencing = fencing + 1, owner = $1, lease_until = $2 WHERE id = $3 AND "
        "(owner = ANY($4::text[]) OR lease_until IS NULL OR lease_until < $5) RETURNING fencing"
    ),
    "renew": "UPDATE turns SET lease_until = $1 WHERE owner = $2 AND id = ANY($3::text[])",
    "chat_meta": "UPDATE chats SET title = coalesce($1, title), tags = coalesce($2, tags) WHERE id = $3",
    "api_key": "INSERT INTO api_keys (key_hash, user_id, created_at, role) VALUES ($1, $2, $3, $4)",
    "blob": "INSERT INTO blobs (id, user_id, mime, size, data, created_at) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING",
}


def index_args(index: dict[str, Any]) -> tuple[Any, ...]:
    """``UPDATE_INDEX``'s parameters from an append's ``i_*`` index row."""
    return (index["i_status"], index["i_updated_at"], index["i_release"], index["i_view"], index["i_id"])


def turn_args(turn: dict[str, Any]) -> tuple[Any, ...]:
    """``INSERT_TURN``'s parameters from a start's ``t_*`` row."""
    return tuple(turn[name] for name in ("t_id", "t_chat", "t_user", "t_model", "t_status", "t_created", "t_updated", "t_owner", "t_lease", "t_view"))


def chat_args(chat: dict[str, Any]) -> tuple[Any, ...]:
    """``UPSERT_CHAT``'s parameters from a start's ``c_*`` chat (``c_upd``
    defaults to its time)."""
    return (chat["c_id"], chat["c_user"], chat["c_at"], chat.get("c_upd", chat["c_at"]))


def _columns(rows: list[EventRow]) -> list[list[Any]]:
    return [list(column) for column in zip(*rows)]


async def insert_events(raw: Any, rows: list[EventRow]) -> None:
    """INSERT ``rows`` atomically; a taken ``(turn_id, seq)`` raises
    ``asyncpg.UniqueViolationError``."""
    if rows:
        await raw.execute(INSERT_EVENTS, *_columns(rows))


class Conflict(Exception):
    """``insert_events_all_or_none`` met a taken ``(turn_id, seq)``."""


async def insert_events_all_or_none(raw: Any, rows: list[EventRow]) -> None:
    """Like :func:`insert_events`, but a taken ``(turn_id, seq)`` raises
    :class:`Conflict` with nothing inserted and the transaction still usable
    (no savepoint: a unique violation would abort the whole transaction, so
    conflicting rows are skipped and those that went in deleted again, by
    id: no other process's). ``rows`` must not repeat a ``(turn_id, seq)``."""
    count, ids = await raw.fetchrow(INSERT_EVENTS_SKIPPING, *_columns(rows))
    if count != len(rows):
        if count:
            await raw.execute(DELETE_EVENTS, ids)
        raise Conflict


class BatchLost(Exception):
    """A savepoint could not be rolled back: the whole batch must fail."""


async def in_savepoint(raw: Any, body: Callable[[], Awaitable[Any]]) -> Any:
    """``body()`` inside a savepoint, rolled back if it raises."""
    await raw.execute("SAVEPOINT turnlog_w")
    try:
        result = await body()
    except Exception:  # (cancelled: the connection is invalidated anyway)
        try:
            await raw.execute("ROLLBACK TO SAVEPOINT turnlog_w")
            await raw.execute("RELEASE SAVEPOINT turnlog_w")
        except Exception as exc:
            raise BatchLost("a savepoint of the group commit could not be rolled back") from exc
        raise
    await raw.execute("RELEASE SAVEPOINT turnlog_w")
    return result


def fails_batch(raw: Any, exc: BaseException) -> bool:
    """Whether ``exc``, raised in a savepoint, must fail the whole batch: its
    rollback failed, or the connection is gone."""
    return isinstance(exc, BatchLost) or bool(raw.is_closed())


def _unique_violation(exc: BaseException) -> bool:
    return isinstance(exc, _UNIQUE)


class PostgresWriter(BatchWriter):
    """``group_commit.AsyncWriter`` on a connection of ``engine``'s pool."""

    def __init__(self, engine: AsyncEngine, stats: dict[str, int]) -> None:
        super().__init__(stats)
        self._engine = engine
        self._conn: AsyncConnection | None = None
        self._raw: Any = None  # the asyncpg connection under _conn

    async def write(self, batch: list[Any]) -> Results:
        if self._conn is None:
            self._conn = await self._engine.connect()
            self._raw = (await self._conn.get_raw_connection()).driver_connection
        raw = self._raw
        try:
            async with raw.transaction():
                results = await self._write(raw, batch)
        except BaseException:
            self.failed(batch)
            conn, self._conn, self._raw = self._conn, None, None
            try:
                await conn.invalidate()
                await conn.close()
            except Exception:  # pragma: no cover
                pass
            raise
        self.committed()
        return results

    async def close(self) -> None:
        if self._conn is not None:
            conn, self._conn, self._raw = self._conn, None, None
            await conn.close()

    async def _write(self, raw: Any, batch: list[Any]) -> Results:
        self.linked = {}
        results: Results = [(True, None)] * len(batch)
        for kind, i, j in plan.runs(batch):
            if kind is Append:
                await self._appends(raw, batch, i, j, results)
            elif kind is Start:
                await self._starts(raw, batch[i:j], i, results)
            elif kind is Release:
                await self._releases(raw, batch[i:j], i, results)
            else:
                await self._isolated(raw, i, results, functools.partial(_execute, raw, batch[i]))
        return results

    async def _isolated(self, raw: Any, i: int, results: Results, body: Callable[[], Awaitable[Any]]) -> bool:
        """``results[i]`` is what ``body()`` returns, in a savepoint of its own;
        or what it raised (rolled back) unless that fails the whole batch."""
        try:
            results[i] = (True, await in_savepoint(raw, body))
        except Exception as exc:
            if fails_batch(raw, exc):
                raise
            results[i] = (False, exc)
            return False
        return True

    async def _link(self, raw: Any, rows: list[EventRow], trial: dict[str, Head]) -> list[EventRow]:
        """``rows`` with their hashes, the previous hashes they need read first
        (``trial`` gets the new heads: merge it into ``linked`` once written)."""
        found = {key: previous_hash(await raw.fetchval(SELECT_PREVIOUS_HASH, *key)) for key in self.to_read(rows, trial)}
        return link_rows(rows, trial, lambda turn_id, seq: found[(turn_id, seq)], self.linked, self.heads)

    async def _appends(self, raw: Any, batch: list[Any], start: int, end: int, results: Results) -> None:
        """A run of appends: one fencing read (row locks), then all their rows
        in one statement; if any is taken, append by append for the culprits."""
        live = list(range(start, end))
        fenced = plan.fenced_turns(batch, start, end)
        if fenced:
            current = {row[0]: row[1] for row in await raw.fetch(SELECT_FENCING, list(fenced))}
            live = plan.live_appends(batch, start, end, current, self.poisoned, results)
        rows = [row for i in live for row in batch[i].rows]
        if plan.distinct_seqs(rows):
            updates = [index_args(batch[i].index) for i in live if batch[i].index is not None]
            trial: dict[str, Head] = {}
            rows = await self._link(raw, rows, trial)
            try:
                if rows:
                    await insert_events_all_or_none(raw, rows)
                if updates:
                    await raw.executemany(UPDATE_INDEX, updates)
            except Conflict:
                pass  # nothing of the run was written; find the culprits
            else:
                self.linked.update(trial)
                return
        for i in live:
            req = batch[i]
            if self.refused_again(req, i, results):
                continue
            trial = {}
            try:
                await in_savepoint(raw, functools.partial(self._append_one, raw, req, trial))
            except Exception as exc:
                if not _unique_violation(exc):
                    raise
                results[i] = (False, plan.seq_taken(req.turn_id, exc))
                self.poison(req)
            else:
                self.linked.update(trial)

    async def _append_one(self, raw: Any, req: Append, trial: dict[str, Head]) -> None:
        await insert_events(raw, await self._link(raw, req.rows, trial))
        if req.index is not None:
            await raw.execute(UPDATE_INDEX, *index_args(req.index))

    async def _starts(self, raw: Any, reqs: list[Start], start: int, results: Results) -> None:
        """A run of starts: their turns, chats and first events in one
        savepoint; on any failure, start by start."""
        rows = [row for req in reqs for row in req.rows]
        if plan.startable_together(reqs, rows):
            trial: dict[str, Head] = {}

            async def together() -> None:
                await raw.executemany(INSERT_TURN, [turn_args(req.turn) for req in reqs])
                await raw.executemany(UPSERT_CHAT, [chat_args(chat) for chat in plan.merged_chats(reqs)])
                await insert_events(raw, await self._link(raw, rows, trial))

            if await self._isolated(raw, start, results, together):
                self.linked.update(trial)
                results[start : start + len(reqs)] = [(True, 1)] * len(reqs)
                return
        for k, req in enumerate(reqs):
            trial = {}
            if await self._isolated(raw, start + k, results, functools.partial(self._start_one, raw, req, trial)):
                self.linked.update(trial)

    async def _start_one(self, raw: Any, req: Start, trial: dict[str, Head]) -> int:
        await raw.execute(UPSERT_CHAT, *chat_args(req.chat))
        turn_id = req.turn["t_id"]
        try:
            await raw.execute(INSERT_TURN, *turn_args(req.turn))
        except Exception as exc:
            if _unique_violation(exc):
                raise plan.turn_exists(turn_id, exc) from exc
            raise
        try:
            await insert_events(raw, await self._link(raw, req.rows, trial))
        except Exception as exc:
            if _unique_violation(exc):
                raise plan.seq_taken(turn_id, exc) from exc
            raise
        return 1

    async def _releases(self, raw: Any, reqs: list[Release], start: int, results: Results) -> None:
        """A run of releases: one executemany (one round trip); on a failure,
        one by one."""
        self.forget(reqs)
        if len(reqs) > 1 and await self._isolated(raw, start, results, functools.partial(_releasing, raw, reqs)):
            return
        for k, req in enumerate(reqs):
            await self._isolated(raw, start + k, results, functools.partial(_releasing, raw, [req]))


async def _releasing(raw: Any, reqs: list[Release]) -> None:
    await raw.executemany(RELEASE_TURN, [(req.turn_id, req.owner) for req in reqs])


async def _execute(raw: Any, req: Write) -> Any:
    """A :class:`Write`'s statement; ``claim``'s returned token."""
    if req.op == "claim":
        return await raw.fetchval(STATEMENTS[req.op], *req.args)
    await raw.execute(STATEMENTS[req.op], *req.args)
    return None
