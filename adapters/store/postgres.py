"""PostgreSQL specifics of the event store: the engine, and gap-free positions.

The store (``adapters.store.sql``) is dialect-neutral SQLAlchemy Core; what
PostgreSQL needs on top lives here.

Global positions (``events.id``)
--------------------------------
Readers that follow the whole log (``SqlEventStore.read_all``: projections,
fan-out to other processes) poll ``WHERE id > last ORDER BY id``. That only
works if an event never becomes visible *below* a position a reader has
already passed. On PostgreSQL a ``BIGSERIAL`` does not give that: sequence
values are handed out at INSERT time, transactions commit in another order,
and a rolled-back savepoint burns its values (Marten's skipped-event bugs are
this; see ``anchors.md`` §(e)). So, as the ``eventsourcing`` library does:

* every transaction that inserts events first takes
  ``LOCK TABLE events IN EXCLUSIVE MODE`` (conflicts with other writers'
  ROW EXCLUSIVE, not with readers' ACCESS SHARE). It is taken at the start of
  the group commit, outside any savepoint (a lock taken inside a savepoint
  that rolls back is released), before any row lock, so two processes'
  writers cannot deadlock: they simply take turns, one group commit each;
* under the lock an INSERT numbers its rows ``max(id) + 1, + 2, …`` (one
  statement, the rows passed as arrays through ``unnest``). Nobody else can
  insert until we commit, so positions are assigned in commit order; and
  because the numbers come from the table, not from a sequence, a savepoint
  rolled back gives its positions back: positions are gap-free, as on SQLite.

The ``BIGSERIAL`` default of ``events.id`` (from the initial migration) stays
but is unused: every event goes through ``insert_events``. The log is
append-only; were its newest rows ever deleted, their positions would be
handed out again.

With one writer task per process (the group commit) the lock costs one
statement per batch; several processes serialize their batches on it (their
readers don't wait).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

LOCK_EVENTS = "LOCK TABLE events IN EXCLUSIVE MODE"

# One statement for any number of events; the scalar subquery runs once.
_INSERT_EVENTS = text(
    """
    INSERT INTO events (id, turn_id, seq, type, at, data)
    SELECT (SELECT coalesce(max(id), 0) FROM events) + r.n, r.turn_id, r.seq, r.type, r.at, r.data
    FROM unnest(
        CAST(:turn_ids AS text[]), CAST(:seqs AS integer[]), CAST(:types AS text[]),
        CAST(:ats AS float8[]), CAST(:datas AS text[])
    ) WITH ORDINALITY AS r(turn_id, seq, type, at, data, n)
    """
)


# The fast path of a group commit: no savepoint around it. A unique violation
# would abort the whole transaction, so conflicting rows are skipped instead;
# if any was, the rows that did go in are deleted again (see
# ``insert_events_all_or_none``).
_INSERT_EVENTS_SKIPPING = text(
    """
    WITH inserted AS (
        INSERT INTO events (id, turn_id, seq, type, at, data)
        SELECT (SELECT coalesce(max(id), 0) FROM events) + r.n, r.turn_id, r.seq, r.type, r.at, r.data
        FROM unnest(
            CAST(:turn_ids AS text[]), CAST(:seqs AS integer[]), CAST(:types AS text[]),
            CAST(:ats AS float8[]), CAST(:datas AS text[])
        ) WITH ORDINALITY AS r(turn_id, seq, type, at, data, n)
        ON CONFLICT (turn_id, seq) DO NOTHING
        RETURNING id
    )
    SELECT count(*), min(id) FROM inserted
    """
)
# Every row that statement inserted has a position >= its smallest one, and
# (under the events lock) no other row has.
_DELETE_EVENTS_FROM = text("DELETE FROM events WHERE id >= :first")

#: The fencing tokens of some turns, row-locked until the end of the
#: transaction (one statement text for any number of ids: prepared once).
SELECT_FENCING = text("SELECT id, fencing FROM turns WHERE id = ANY(CAST(:ids AS text[])) FOR UPDATE")


class Conflict(Exception):
    """``insert_events_all_or_none`` met a taken ``(turn_id, seq)``."""


def postgres_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """An async engine for ``postgresql+asyncpg://`` (``kwargs`` go to
    ``create_async_engine``)."""
    kwargs.setdefault("pool_pre_ping", True)
    connect_args = kwargs.setdefault("connect_args", {})
    settings = connect_args.setdefault("server_settings", {})
    settings.setdefault("application_name", "turnlog")
    # A process frozen mid-transaction (SIGSTOP, a VM pause) would hold the
    # events lock and stall every other process: PostgreSQL ends such a
    # session, the lock goes, and the frozen process finds its lease gone
    # (fencing) when it wakes.
    settings.setdefault("idle_in_transaction_session_timeout", "5000")
    return create_async_engine(url, **kwargs)


def lock_events(conn: Connection) -> None:
    """Serialize event inserts until the end of the current transaction.

    Call at the start of the transaction, outside any savepoint."""
    conn.exec_driver_sql(LOCK_EVENTS)


def _columns(rows: list[tuple[Any, ...]]) -> dict[str, list[Any]]:
    turn_ids, seqs, types, ats, datas = zip(*rows)
    return {
        "turn_ids": list(turn_ids),
        "seqs": list(seqs),
        "types": list(types),
        "ats": list(ats),
        "datas": list(datas),
    }


def insert_events(conn: Connection, rows: list[tuple[Any, ...]]) -> None:
    """INSERT ``rows`` (``(turn_id, seq, type, at, data)``) at the next
    positions, atomically (one statement; a taken ``(turn_id, seq)`` raises
    ``IntegrityError``). The caller holds :func:`lock_events`."""
    conn.execute(_INSERT_EVENTS, _columns(rows))


def insert_events_all_or_none(conn: Connection, rows: list[tuple[Any, ...]]) -> None:
    """Like :func:`insert_events`, but a taken ``(turn_id, seq)`` raises
    :class:`Conflict` with nothing inserted and the transaction still usable
    (no savepoint needed). ``rows`` must not repeat a ``(turn_id, seq)``."""
    count, first = conn.execute(_INSERT_EVENTS_SKIPPING, _columns(rows)).one()
    if count != len(rows):
        if count:
            conn.execute(_DELETE_EVENTS_FROM, {"first": first})
        raise Conflict
