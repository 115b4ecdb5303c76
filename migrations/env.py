"""Alembic environment for turnlog (async engines).

Two ways in:

* ``adapters.store.migrate.migrate(url)`` (the service on start, ``turnlog
  migrate``) opens an async connection itself and hands its sync facade over in
  ``config.attributes["connection"]``; we run on it directly, inside the
  caller's event loop (no ``asyncio.run`` here).
* The ``alembic`` command line: we create an async engine from the URL and run
  the migrations through ``connection.run_sync`` in a fresh event loop.

The URL is, in order: ``config.attributes["url"]``, ``alembic -x url=...``,
``$TURNLOG_DATABASE_URL``, ``sqlalchemy.url`` of the config, and finally
``sqlite+aiosqlite:///./turnlog.db``.
"""

from __future__ import annotations

import asyncio
import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection

from adapters.store.migrate import migration_engine, serialize_migrations
from adapters.store.schema import metadata

DEFAULT_URL = "sqlite+aiosqlite:///./turnlog.db"

config = context.config
target_metadata = metadata

if config.config_file_name is not None and "connection" not in config.attributes:
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def database_url() -> str:
    return (
        config.attributes.get("url")
        or context.get_x_argument(as_dictionary=True).get("url")
        or os.environ.get("TURNLOG_DATABASE_URL")
        or config.get_main_option("sqlalchemy.url")
        or DEFAULT_URL
    )


def do_run_migrations(connection: Connection) -> None:
    # Before alembic looks at alembic_version: processes migrating the same
    # database at once take turns (adapters/store/migrate.py).
    serialize_migrations(connection)
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite can't ALTER most things; autogenerate batch ops for it.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def run_async_migrations() -> None:
    from adapters.store.sqlite import SQLITE_BEGIN

    engine = migration_engine(database_url())
    try:
        async with engine.execution_options(**{SQLITE_BEGIN: "BEGIN IMMEDIATE"}).begin() as connection:
            await connection.run_sync(do_run_migrations)
    finally:
        await engine.dispose()


def run_migrations_offline() -> None:
    context.configure(
        url=database_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
elif (connection := config.attributes.get("connection")) is not None:
    do_run_migrations(connection)
else:
    asyncio.run(run_async_migrations())
