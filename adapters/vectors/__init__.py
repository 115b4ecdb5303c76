"""Vector stores (``engine.vectors.VectorStore``): SQLite and pgvector.

``open_vector_store(url)`` picks the adapter for the database URL (the same
database as the event store, migrated: the tables come from migrations 0003
and 0006)::

    vectors = await open_vector_store("sqlite+aiosqlite:///./turnlog.db")
    await vectors.upsert("docs", [VectorItem("a", [0.1, 0.2], "text", {"file": "x"})])
    hits = await vectors.query("docs", [0.1, 0.25], k=5, filter={"file": "x"})
    await vectors.close()
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import make_url

from adapters.vectors.pgvector import PgVectorStore
from adapters.vectors.sqlite import SqliteVectorStore

__all__ = ["PgVectorStore", "SqliteVectorStore", "open_vector_store"]


async def open_vector_store(url: str, **engine_kwargs: Any) -> SqliteVectorStore | PgVectorStore:
    """The vector store in the (migrated) database at ``url``."""
    backend = make_url(url).get_backend_name()
    if backend == "sqlite":
        return SqliteVectorStore.open(url, **engine_kwargs)
    if backend == "postgresql":
        return PgVectorStore.open(url, **engine_kwargs)
    raise ValueError(f"no vector store for {backend}")
