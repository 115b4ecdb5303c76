"""An async engine for a database URL, configured for its dialect."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from adapters.store.postgres import postgres_engine
from adapters.store.sqlite import sqlite_engine


def create_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """An async engine for ``url``, configured for its dialect.

    ``sqlite+aiosqlite://`` gets :func:`sqlite_engine` (``kwargs`` go to it, e.g.
    ``synchronous="NORMAL"``); ``postgresql+asyncpg://`` gets
    :func:`postgres_engine`; anything else a plain async engine.
    """
    backend = make_url(url).get_backend_name()
    if backend == "sqlite":
        return sqlite_engine(url, **kwargs)
    if backend == "postgresql":
        return postgres_engine(url, **kwargs)
    kwargs.setdefault("pool_pre_ping", True)
    return create_async_engine(url, **kwargs)
