"""PostgreSQL specifics of the event store: the engine and the event INSERTs.

The store (``adapters.store.sql``) is dialect-neutral SQLAlchemy Core; what
PostgreSQL needs on top lives here.

``events.id`` is a surrogate key from its ``BIGSERIAL`` sequence, nothing more:
nothing reads the log across turns by it, so it is neither gap-free nor in
commit order, and group commits of several processes insert side by side (no
table lock). Per-turn order and optimistic concurrency come from the unique
``(turn_id, seq)``; row locks on ``turns`` (the fencing check) serialize two
writers of one turn. Migration 0004 moved the sequence past the ids that
earlier versions numbered themselves.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

# One statement for any number of events (the rows passed as arrays).
_INSERT_EVENTS = text(
    """
    INSERT INTO events (turn_id, seq, type, at, data, hash)
    SELECT * FROM unnest(
        CAST(:turn_ids AS text[]), CAST(:seqs AS integer[]), CAST(:types AS text[]),
        CAST(:ats AS float8[]), CAST(:datas AS text[]), CAST(:hashes AS bytea[])
    )
    """
)


# The fast path of a group commit: no savepoint around it. A unique violation
# would abort the whole transaction, so conflicting rows are skipped instead;
# if any was, the rows that did go in are deleted again (see
# ``insert_events_all_or_none``).
_INSERT_EVENTS_SKIPPING = text(
    """
    WITH inserted AS (
        INSERT INTO events (turn_id, seq, type, at, data, hash)
        SELECT * FROM unnest(
            CAST(:turn_ids AS text[]), CAST(:seqs AS integer[]), CAST(:types AS text[]),
            CAST(:ats AS float8[]), CAST(:datas AS text[]), CAST(:hashes AS bytea[])
        )
        ON CONFLICT (turn_id, seq) DO NOTHING
        RETURNING id
    )
    SELECT count(*), array_agg(id) FROM inserted
    """
)
# By id: the rows that statement inserted, and no other process's.
_DELETE_EVENTS = text("DELETE FROM events WHERE id = ANY(CAST(:ids AS bigint[]))")

#: The fencing tokens of some turns, row-locked until the end of the
#: transaction (one statement text for any number of ids: prepared once).
SELECT_FENCING = text("SELECT id, fencing FROM turns WHERE id = ANY(CAST(:ids AS text[])) FOR UPDATE")


class Conflict(Exception):
    """``insert_events_all_or_none`` met a taken ``(turn_id, seq)``."""


def postgres_engine(url: str, *, timeout: float | None = None, **kwargs: Any) -> AsyncEngine:
    """An async engine for ``postgresql+asyncpg://`` (``kwargs`` go to
    ``create_async_engine``).

    ``timeout`` (the event store's ``TURNLOG_DB_TIMEOUT``): the longest wait
    for one statement's answer (asyncpg's ``command_timeout``: a server
    stopped or frozen, a lock held by another session), for a pooled
    connection, and for a new connection (at most 5 s). None: no statement
    timeout (long index builds of the vector store), 10 s for the pool."""
    kwargs.setdefault("pool_pre_ping", True)
    # Bounded waits while the database is down or unreachable: a request
    # fails (503, adapters.store.faults) instead of hanging for minutes.
    kwargs.setdefault("pool_timeout", 10 if timeout is None else timeout)
    connect_args = kwargs.setdefault("connect_args", {})
    # asyncpg's connect timeout (default 60 s)
    connect_args.setdefault("timeout", 5 if timeout is None else min(5.0, timeout))
    if timeout is not None:
        connect_args.setdefault("command_timeout", timeout)
    settings = connect_args.setdefault("server_settings", {})
    settings.setdefault("application_name", "turnlog")
    # A process frozen mid-transaction (SIGSTOP, a VM pause) would hold its
    # row locks (the fencing check's on ``turns``) and stall the processes
    # that take its turns over: PostgreSQL ends such a session, the locks go,
    # and the frozen process finds its lease gone (fencing) when it wakes.
    settings.setdefault("idle_in_transaction_session_timeout", "5000")
    return create_async_engine(url, **kwargs)


def _columns(rows: list[tuple[Any, ...]]) -> dict[str, list[Any]]:
    turn_ids, seqs, types, ats, datas, hashes = zip(*rows)
    return {
        "turn_ids": list(turn_ids),
        "seqs": list(seqs),
        "types": list(types),
        "ats": list(ats),
        "datas": list(datas),
        "hashes": list(hashes),
    }


def insert_events(conn: Connection, rows: list[tuple[Any, ...]]) -> None:
    """INSERT ``rows`` (``(turn_id, seq, type, at, data, hash)``) atomically (one
    statement; a taken ``(turn_id, seq)`` raises ``IntegrityError``)."""
    conn.execute(_INSERT_EVENTS, _columns(rows))


def insert_events_all_or_none(conn: Connection, rows: list[tuple[Any, ...]]) -> None:
    """Like :func:`insert_events`, but a taken ``(turn_id, seq)`` raises
    :class:`Conflict` with nothing inserted and the transaction still usable
    (no savepoint needed). ``rows`` must not repeat a ``(turn_id, seq)``."""
    count, ids = conn.execute(_INSERT_EVENTS_SKIPPING, _columns(rows)).one()
    if count != len(rows):
        if count:
            conn.execute(_DELETE_EVENTS, {"ids": ids})
        raise Conflict
