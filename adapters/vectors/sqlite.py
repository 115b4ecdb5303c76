"""``engine.vectors.VectorStore`` on SQLite: exact cosine search in Python.

Each item's embedding is stored as its unit vector (float64, little-endian
BLOB), so the cosine similarity with a query is a dot product with the
query's unit vector. A query reads the collection's rows, keeps those whose
metadata matches the filter, and takes the ``k`` best with a heap: linear in
the collection's size (about a second per million dimension-products), which
is what "small corpora" means here. No numpy.

Writes take SQLite's write lock up front (``BEGIN IMMEDIATE``) and wait for
other writers (``busy_timeout``), like the event store's writer, which may
share the file.
"""

from __future__ import annotations

import heapq
import json
import sys
import time
from array import array
from collections.abc import Callable
from operator import mul
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from adapters.store.sqlite import SQLITE_BEGIN, sqlite_engine
from adapters.vectors.common import dumps, matches, prepare
from adapters.vectors.schema import vector_collections, vector_items
from engine.vectors import DimensionMismatch, VectorHit, VectorItem, check_vector

_LITTLE = sys.byteorder == "little"


def _pack(vector: list[float], norm: float) -> bytes:
    unit = array("d", (float(x) / norm for x in vector))
    if not _LITTLE:  # pragma: no cover
        unit.byteswap()
    return unit.tobytes()


def _unpack(blob: bytes) -> array:
    unit = array("d")
    unit.frombytes(blob)
    if not _LITTLE:  # pragma: no cover
        unit.byteswap()
    return unit


class SqliteVectorStore:
    """Vector collections in a (migrated) SQLite database."""

    def __init__(self, engine: AsyncEngine, *, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self._write = engine.execution_options(**{SQLITE_BEGIN: "BEGIN IMMEDIATE"})
        self._read = engine.execution_options(**{SQLITE_BEGIN: None})
        self._clock = clock
        self._dims: dict[str, int] = {}

    @classmethod
    def open(cls, url: str, **engine_kwargs: Any) -> SqliteVectorStore:
        engine_kwargs.setdefault("pool_size", 4)
        return cls(sqlite_engine(url, **engine_kwargs))

    async def close(self) -> None:
        await self.engine.dispose()

    async def upsert(self, collection: str, items: list[VectorItem]) -> None:
        if not items:
            return
        dim, items = prepare(items)
        rows = [
            {
                "collection": collection,
                "id": item.id,
                "dim": dim,
                "embedding": _pack(item.vector, check_vector(item.vector)),
                "text": item.text,
                "metadata": dumps(item.metadata),
            }
            for item in items
        ]
        stmt = insert(vector_items)
        stmt = stmt.on_conflict_do_update(
            index_elements=["collection", "id"],
            set_={c: stmt.excluded[c] for c in ("dim", "embedding", "text", "metadata")},
        )
        async with self._write.begin() as conn:
            await conn.execute(
                insert(vector_collections)
                .values(name=collection, dimension=dim, created_at=self._clock())
                .on_conflict_do_nothing()
            )
            have = (
                await conn.execute(
                    select(vector_collections.c.dimension).where(vector_collections.c.name == collection)
                )
            ).scalar_one()
            if have != dim:
                raise DimensionMismatch(
                    f"collection {collection!r} has dimension {have}, got vectors of {dim}"
                )
            await conn.execute(stmt, rows)
        self._dims[collection] = dim

    async def query(
        self,
        collection: str,
        vector: list[float],
        k: int,
        *,
        filter: dict[str, Any] | None = None,
    ) -> list[VectorHit]:
        norm = check_vector(vector)
        async with self._read.connect() as conn:
            dim = self._dims.get(collection)
            if dim is None:
                dim = (
                    await conn.execute(
                        select(vector_collections.c.dimension).where(
                            vector_collections.c.name == collection
                        )
                    )
                ).scalar_one_or_none()
                if dim is None:
                    return []
                self._dims[collection] = dim
            if len(vector) != dim:
                raise DimensionMismatch(
                    f"collection {collection!r} has dimension {dim}, query has {len(vector)}"
                )
            if k <= 0:
                return []
            rows = (
                await conn.execute(
                    select(
                        vector_items.c.id,
                        vector_items.c.embedding,
                        vector_items.c.text,
                        vector_items.c.metadata,
                    ).where(vector_items.c.collection == collection)
                )
            ).all()
        q = [float(x) / norm for x in vector]
        want = json.loads(dumps(filter)) if filter else None
        scored = []
        for id_, blob, text, meta_json in rows:
            meta = json.loads(meta_json)
            if want is not None and not matches(meta, want):
                continue
            score = sum(map(mul, _unpack(blob), q))
            scored.append((score, id_, text, meta))
        best = heapq.nlargest(k, scored, key=lambda s: (s[0], _Desc(s[1])))
        return [
            VectorHit(id=id_, score=max(-1.0, min(1.0, score)), text=text, metadata=meta)
            for score, id_, text, meta in best
        ]

    async def delete(self, collection: str, ids: list[str]) -> None:
        if not ids:
            return
        async with self._write.begin() as conn:
            await conn.execute(
                delete(vector_items).where(
                    vector_items.c.collection == collection, vector_items.c.id.in_(list(ids))
                )
            )


class _Desc:
    """Orders strings backwards (ties of score: smaller id first)."""

    __slots__ = ("s",)

    def __init__(self, s: str) -> None:
        self.s = s

    def __lt__(self, other: _Desc) -> bool:
        return self.s > other.s

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.s == other.s


