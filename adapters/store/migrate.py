"""Programmatic ``alembic upgrade head``, callable from a running event loop.

The Alembic config is built in code (no alembic.ini needed, any current
directory works) and points at the ``migrations`` package wherever it is
installed. We open an async connection ourselves and let ``env.py`` run on its
sync facade through ``AsyncConnection.run_sync``: no nested event loop, no
thread.

Several processes may migrate the same database at once: replicas of a
deployment all start together, and ``turnlog serve`` migrates on start. Each
of them would find no schema and create it, and all but one fail ("relation
"events" already exists"). So the whole upgrade runs in one transaction that
first takes a lock every migrator takes (:func:`serialize_migrations`, called
by ``env.py`` for this module and the ``alembic`` command line alike): one
process migrates, the others wait for its commit and then find the database
at head.

* PostgreSQL: the transaction-level advisory lock
  ``pg_advisory_xact_lock(MIGRATION_LOCK_KEY)``, key ``0x7475726E6C6F67``
  ("turnlog" in ASCII). It is released at commit or rollback, and by the
  server when a migrating process dies. It cannot collide with the per-name
  ``hashtext`` locks of ``adapters.vectors.pgvector``, which are 32-bit.
* SQLite: the database's write lock, taken by ``BEGIN IMMEDIATE`` before
  anything is read (DDL is transactional on SQLite, ``alembic_version``
  included); the others wait for it in their ``BEGIN IMMEDIATE``, up to
  :data:`SQLITE_MIGRATION_BUSY_TIMEOUT_MS`.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine

import migrations
from adapters.store.engines import create_engine
from adapters.store.sqlite import SQLITE_BEGIN

#: Key of the PostgreSQL advisory lock held while migrating ("turnlog" in ASCII).
MIGRATION_LOCK_KEY = 0x7475726E6C6F67

#: How long a migrator on SQLite waits for another's write lock. Longer than
#: the store's 5 s: a process waiting here is starting up anyway, and with
#: several replicas the last waits for every migration before it.
SQLITE_MIGRATION_BUSY_TIMEOUT_MS = 60_000


def serialize_migrations(connection: Connection) -> None:
    """Take the cross-process migration lock on ``connection`` (PostgreSQL;
    on SQLite the transaction's ``BEGIN IMMEDIATE`` already is that lock).

    Must run first thing in the transaction that migrates: alembic's check of
    ``alembic_version`` has to come after it to see the winner's commit.
    """
    if not connection.in_transaction():
        raise RuntimeError("migrations must run in a transaction (the migration lock lasts as long as it)")
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")


def migration_engine(url: str) -> AsyncEngine:
    """The engine to migrate ``url`` with: on SQLite, one that waits long
    enough for another process's migration (see the module docstring); begin
    its transactions with ``BEGIN IMMEDIATE`` (the ``SQLITE_BEGIN`` option)."""
    if make_url(url).get_backend_name() == "sqlite":
        return create_engine(url, busy_timeout_ms=SQLITE_MIGRATION_BUSY_TIMEOUT_MS)
    return create_engine(url)


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # Kept out of the ConfigParser (no '%' interpolation trouble with passwords).
    cfg.attributes["url"] = url
    return cfg


async def migrate(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` (idempotent)."""
    cfg = alembic_config(url)
    engine = migration_engine(url)

    def upgrade(connection: Connection) -> None:
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, revision)

    try:
        # SQLite: take the write lock up front (see the module docstring);
        # ignored by other dialects, which take theirs in env.py.
        async with engine.execution_options(**{SQLITE_BEGIN: "BEGIN IMMEDIATE"}).begin() as connection:
            await connection.run_sync(upgrade)
    finally:
        await engine.dispose()
