"""The event store: ``engine.ports.EventStore`` on SQL, and in memory for tests.

Modules: ``schema`` (tables), ``sql`` (the store; reads), ``group_commit``
(the queue and batching of writes, no database), ``batch_plan`` (the write
requests and what a batch decides), ``sqlite_writer`` and ``postgres_writer``
(one writer per backend: every write, at the driver level), ``sqlite``
(SQLite engines and pragmas), ``postgres`` (the PostgreSQL engine),
``migrate`` (programmatic Alembic upgrade), ``memory``
(``MemoryEventStore``: the same contract without a database, for engine
tests; not behind :func:`open_store`, whose callers migrate the URL first),
``common`` (what every backend shares).

Typical start-up::

    await migrate(url)
    store = await open_store(url)
    ...
    await store.close()
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import make_url

from adapters.store.engines import create_engine
from adapters.store.memory import MemoryDatabase, MemoryEventStore
from adapters.store.migrate import migrate
from adapters.store.postgres import postgres_engine
from adapters.store.sql import SqlEventStore, hash_api_key
from adapters.store.sqlite import sqlite_engine, sqlite_writer_engine

__all__ = [
    "MemoryDatabase",
    "MemoryEventStore",
    "SqlEventStore",
    "create_engine",
    "hash_api_key",
    "migrate",
    "open_store",
    "postgres_engine",
    "sqlite_engine",
    "sqlite_writer_engine",
]


async def open_store(
    url: str,
    *,
    synchronous: str = "FULL",
    clock: Callable[[], float] = time.time,
    max_batch: int = 1000,
    chain: bool = True,
    timeout: float | None = None,
    gather: float = 0.0,
    **engine_kwargs: Any,
) -> SqlEventStore:
    """Open the store at ``url`` (already migrated: call :func:`migrate` first).

    SQLite: ``synchronous`` is its PRAGMA (see ``adapters.store.sqlite``), and
    group commits run on a ``sqlite3`` connection in a thread. PostgreSQL: an
    async engine (``engine_kwargs`` go to the engine factory) whose pool
    lends the writer its asyncpg connection.
    ``chain=False`` stores events without their hashes (and their data with
    its keys as given, not sorted): only to measure what the chain costs
    (``bench.storebench chain``).

    ``timeout`` (``TURNLOG_DB_TIMEOUT``): how long a statement waits on the
    database before it fails (the store then answers 503): SQLite's busy
    timeout (a lock held by another connection); on PostgreSQL
    :func:`postgres_engine`'s statement, pool and connect timeouts.

    ``gather`` (``TURNLOG_COMMIT_GATHER``): the shortest time between the
    starts of two group commits that hold only delta windows (lazy appends),
    so that many streams' windows share one transaction.
    """
    if timeout is not None:
        if make_url(url).get_backend_name() == "sqlite":
            engine_kwargs.setdefault("busy_timeout_ms", int(timeout * 1000))
        elif make_url(url).get_backend_name() == "postgresql":
            engine_kwargs.setdefault("timeout", timeout)
    if make_url(url).get_backend_name() == "sqlite":
        engine = sqlite_engine(url, synchronous=synchronous, **engine_kwargs)
        writer = sqlite_writer_engine(
            url,
            synchronous=synchronous,
            busy_timeout_ms=engine_kwargs.get("busy_timeout_ms", 5000),
        )
        return SqlEventStore(engine, writer_engine=writer, clock=clock, max_batch=max_batch, chain=chain, gather=gather)
    return SqlEventStore(create_engine(url, **engine_kwargs), clock=clock, max_batch=max_batch, chain=chain, gather=gather)
