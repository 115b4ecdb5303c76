"""The PostgreSQL group commit at the driver level: the hot writes on asyncpg.

A group commit of only appends, turn starts and lease releases (nearly every
write of a turn) runs on the writer connection's asyncpg connection itself,
in one asyncpg transaction, instead of SQLAlchemy's ``run_sync`` (a greenlet
switch per statement, its execution context and the asyncpg adapter's
cursor on top of the driver's own work). asyncpg prepares each statement
text once per connection and keeps it; ``executemany`` sends all its rows in
one round trip.

The statements are those of ``adapters.store.sql`` and
``adapters.store.postgres`` (same columns, conditions and locks), with
positional parameters, so what is stored is the same. A batch holding any
other write (claim, renew, chat meta, blobs, API keys) keeps the SQLAlchemy
path for the whole batch.

Savepoints are plain ``SAVEPOINT`` statements; if rolling one back fails, the
transaction cannot be trusted and the whole batch fails (:class:`BatchLost`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from adapters.store.postgres import Conflict

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


def index_args(index: dict[str, Any]) -> tuple[Any, ...]:
    """``UPDATE_INDEX``'s parameters from an append's ``i_*`` index row."""
    return (index["i_status"], index["i_updated_at"], index["i_release"], index["i_view"], index["i_id"])


def turn_args(turn: dict[str, Any]) -> tuple[Any, ...]:
    """``INSERT_TURN``'s parameters from a start's ``t_*`` row."""
    return (
        turn["t_id"],
        turn["t_chat"],
        turn["t_user"],
        turn["t_model"],
        turn["t_status"],
        turn["t_created"],
        turn["t_updated"],
        turn["t_owner"],
        turn["t_lease"],
        turn["t_view"],
    )


def chat_args(chat: dict[str, Any]) -> tuple[Any, ...]:
    """``UPSERT_CHAT``'s parameters from a start's ``c_*`` chat (``c_upd``
    defaults to its time)."""
    return (chat["c_id"], chat["c_user"], chat["c_at"], chat.get("c_upd", chat["c_at"]))


def release_args(params: dict[str, Any]) -> tuple[Any, ...]:
    return (params["r_id"], params["r_owner"])


def _columns(rows: list[tuple[Any, ...]]) -> list[list[Any]]:
    return [list(column) for column in zip(*rows)]


async def insert_events(raw: Any, rows: list[tuple[Any, ...]]) -> None:
    """INSERT ``rows`` atomically; a taken ``(turn_id, seq)`` raises
    ``asyncpg.UniqueViolationError``."""
    await raw.execute(INSERT_EVENTS, *_columns(rows))


async def insert_events_all_or_none(raw: Any, rows: list[tuple[Any, ...]]) -> None:
    """Like :func:`insert_events`, but a taken ``(turn_id, seq)`` raises
    ``Conflict`` with nothing inserted and the transaction still usable.
    ``rows`` must not repeat a ``(turn_id, seq)``."""
    count, ids = await raw.fetchrow(INSERT_EVENTS_SKIPPING, *_columns(rows))
    if count != len(rows):
        if count:
            await raw.execute(DELETE_EVENTS, ids)
        raise Conflict


class BatchLost(Exception):
    """A savepoint could not be rolled back: the whole batch must fail."""


async def in_savepoint(raw: Any, body: Callable[[], Awaitable[None]]) -> None:
    """``body()`` inside a savepoint, rolled back if it raises."""
    await raw.execute("SAVEPOINT turnlog_w")
    try:
        await body()
    except Exception:  # (cancelled: the connection is invalidated anyway)
        try:
            await raw.execute("ROLLBACK TO SAVEPOINT turnlog_w")
            await raw.execute("RELEASE SAVEPOINT turnlog_w")
        except Exception as exc:
            raise BatchLost("a savepoint of the group commit could not be rolled back") from exc
        raise
    await raw.execute("RELEASE SAVEPOINT turnlog_w")


def fails_batch(raw: Any, exc: BaseException) -> bool:
    """Whether ``exc``, raised in a savepoint, must fail the whole batch: its
    rollback failed, or the connection is gone."""
    return isinstance(exc, BatchLost) or bool(raw.is_closed())
