"""SQLite specifics: the engines, their pragmas and transaction control.

Pragmas (every connection):

* ``journal_mode=WAL``: readers never block the writer nor the writer readers,
  so reads run on pooled connections while the store's writer commits.
* ``synchronous=FULL`` (default here): in WAL mode every COMMIT fsyncs the WAL,
  so an appended event survives a power loss, not only a process crash. This
  is affordable because the store group-commits (one fsync for a whole batch of
  appends). ``synchronous="NORMAL"`` keeps durability across application
  crashes but may lose the last commits on power loss; pass it for tests or
  throw-away data.
* ``busy_timeout=5000``: another process (``turnlog`` CLI, a second service)
  holding the write lock makes us wait up to 5 s instead of failing at once.
* ``foreign_keys=ON``: enforce any foreign keys later migrations add.

Transactions: the sqlite3 driver's "legacy transaction control" does not emit
BEGIN before SELECT or SAVEPOINT, which breaks SAVEPOINTs (SQLAlchemy docs,
"Transactions with SQLite and the sqlite3 driver"). We switch it off and emit
BEGIN ourselves; the statement comes from the execution option
``SQLITE_BEGIN``: the store's writer uses ``BEGIN IMMEDIATE`` (take the write
lock up front, so a read inside the transaction can't go stale and fail the
commit), single-statement reads use ``None`` (no transaction at all).

Two engines: :func:`sqlite_engine` (aiosqlite, async, used for reads and by
``migrate``) and :func:`sqlite_writer_engine` (the plain sqlite3 driver, one
connection, used by the store's writer thread). aiosqlite runs every cursor
call (create, execute, fetch, close) as a separate hop to its thread, about
four per statement; the writer runs a whole group commit in one hop instead.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

#: Execution option naming the statement that opens a transaction (or None).
SQLITE_BEGIN = "turnlog_sqlite_begin"

_SYNCHRONOUS = {"OFF", "NORMAL", "FULL", "EXTRA"}


def is_memory_url(url: str) -> bool:
    database = make_url(url).database
    return database in (None, "", ":memory:") or "mode=memory" in str(url)


def sqlite_engine(
    url: str,
    *,
    synchronous: str = "FULL",
    busy_timeout_ms: int = 5000,
    pool_size: int = 8,
    **kwargs: Any,
) -> AsyncEngine:
    """An async engine for a SQLite file database (``sqlite+aiosqlite:///path``)."""
    _check(url)
    kwargs.setdefault("pool_size", pool_size)
    kwargs.setdefault("max_overflow", 2 * pool_size)
    engine = create_async_engine(url, **kwargs)
    configure_sqlite(engine.sync_engine, synchronous=synchronous, busy_timeout_ms=busy_timeout_ms)
    return engine


def sqlite_writer_engine(url: str, *, synchronous: str = "FULL", busy_timeout_ms: int = 5000) -> Engine:
    """A synchronous engine on the same file, for the store's writer thread.

    ``url`` may name any SQLite driver (``sqlite+aiosqlite://`` included); the
    engine uses the standard sqlite3 driver. Its transactions begin with
    ``BEGIN IMMEDIATE``.
    """
    _check(url)
    sync_url = make_url(url).set(drivername="sqlite+pysqlite")
    engine = create_engine(
        sync_url,
        pool_size=1,
        max_overflow=0,
        # Used from one executor thread, but created/disposed from others.
        connect_args={"check_same_thread": False},
    )
    configure_sqlite(engine, synchronous=synchronous, busy_timeout_ms=busy_timeout_ms)
    return engine.execution_options(**{SQLITE_BEGIN: "BEGIN IMMEDIATE"})


def configure_sqlite(engine: Engine, *, synchronous: str = "FULL", busy_timeout_ms: int = 5000) -> None:
    """Install the pragmas and our BEGIN handling on a (sync) SQLite engine."""
    synchronous = synchronous.upper()
    if synchronous not in _SYNCHRONOUS:
        raise ValueError(f"synchronous must be one of {sorted(_SYNCHRONOUS)}")

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 driver (see module doc).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            # Switching a fresh file to WAL needs a moment of exclusive access; a
            # concurrent opener can get SQLITE_BUSY without the busy handler.
            for attempt in range(50):
                try:
                    cursor.execute("PRAGMA journal_mode=WAL")
                    break
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc) or attempt == 49:
                        raise
                    time.sleep(0.02)
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        statement = conn.get_execution_options().get(SQLITE_BEGIN, "BEGIN")
        if statement:
            conn.exec_driver_sql(statement)


def _check(url: str) -> None:
    if is_memory_url(url):
        # Every pooled connection would be its own database (or, with the
        # StaticPool, share one transaction with the writer): neither works.
        raise ValueError("in-memory SQLite is not supported by the event store; use a file")
