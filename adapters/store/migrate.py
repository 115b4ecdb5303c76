"""Programmatic ``alembic upgrade head``, callable from a running event loop.

The Alembic config is built in code (no alembic.ini needed, any current
directory works) and points at the ``migrations`` package wherever it is
installed. We open an async connection ourselves and let ``env.py`` run on its
sync facade through ``AsyncConnection.run_sync``: no nested event loop, no
thread.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection

import migrations
from adapters.store.sqlite import SQLITE_BEGIN


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # Kept out of the ConfigParser (no '%' interpolation trouble with passwords).
    cfg.attributes["url"] = url
    return cfg


async def migrate(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` (idempotent)."""
    from adapters.store import create_engine

    cfg = alembic_config(url)
    engine = create_engine(url)

    def upgrade(connection: Connection) -> None:
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, revision)

    try:
        # SQLite: take the write lock up front, so that a second process
        # migrating at the same time waits (busy_timeout) and then finds the
        # database at head, instead of failing on a lock upgrade. (Ignored by
        # other dialects.)
        async with engine.execution_options(**{SQLITE_BEGIN: "BEGIN IMMEDIATE"}).begin() as connection:
            await connection.run_sync(upgrade)
    finally:
        await engine.dispose()
