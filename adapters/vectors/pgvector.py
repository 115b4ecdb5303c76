"""``engine.vectors.VectorStore`` on PostgreSQL with pgvector.

Schema (migration 0003): ``vector_items.embedding`` is an *untyped*
``vector`` column, so collections of any dimension share one table. HNSW
needs a fixed dimension, so there is one partial expression index per
dimension, created the first time a collection of that dimension is
upserted (pgvector's documented way to index mixed dimensions)::

    CREATE INDEX vector_items_hnsw_384 ON vector_items
        USING hnsw ((embedding::vector(384)) vector_cosine_ops) WHERE dim = 384

Dimensions 2001-4000 (over ``vector``'s HNSW limit, e.g. 3072) are indexed
as ``halfvec``: the index gives ``2k + 10`` candidates by half-precision
distance, re-ranked by the exact distance of the stored single-precision
vectors. Above 4000 a query is an exact scan.

A query orders by ``<=>`` (cosine distance) on the indexed expression,
restricted to the collection (and the metadata filter: ``metadata @>
filter::jsonb``, plus ``metadata -> key = value::jsonb`` per key for exact
JSON equality). The planner picks one of two plans:

* the HNSW index: the conditions are applied to the index scan's output, so
  the query runs with ``hnsw.iterative_scan = strict_order`` (pgvector 0.8):
  the scan goes on until ``k`` rows pass the filter instead of returning
  fewer, and results stay in exact distance order. HNSW is an approximate
  index: on large collections a true neighbour can be missed
  (``hnsw.ef_search``, default 40, trades speed for recall);
* for a selective filter (the chunks of a few files), the GIN index on
  ``metadata`` (``jsonb_path_ops``, migration 0006) gives the matching rows,
  which are sorted by exact distance. Without it, a filter matching 100 of
  100,000 chunks makes the iterative scan walk much of the graph.

``score`` is ``1 - (embedding <=> query)``, the cosine similarity.

Vectors travel in pgvector's binary form: ``pgvector.asyncpg.register_vector``
installs the codec on every connection of the store's engine (a ``connect``
hook), so an upsert sends each vector as ``4 + 4·dim`` bytes of float32 (a
``vector[]`` parameter) instead of ~20 characters of decimal text per
component, formatted by Python and parsed by the server: the client's CPU
per upsert falls to about a sixth (``python -m bench.vectorbench codec``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from pgvector import Vector
from pgvector.asyncpg import register_vector
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from adapters.vectors.common import dumps, prepare
from engine.vectors import DimensionMismatch, VectorHit, VectorItem, check_vector

VECTOR_HNSW_MAX_DIM = 2000
HALFVEC_HNSW_MAX_DIM = 4000

_REGISTER = text("INSERT INTO vector_collections (name, dimension, created_at) VALUES (:c, :d, :now) ON CONFLICT (name) DO NOTHING")
_DIMENSION = text("SELECT dimension FROM vector_collections WHERE name = :c")
_UPSERT = text(
    """
    INSERT INTO vector_items (collection, id, dim, embedding, text, metadata)
    SELECT :c, r.id, :d, r.e, r.t, CAST(r.m AS jsonb)
    FROM unnest(
        CAST(:ids AS text[]), CAST(:embs AS vector[]), CAST(:texts AS text[]), CAST(:metas AS text[])
    ) AS r(id, e, t, m)
    ON CONFLICT (collection, id) DO UPDATE
    SET dim = EXCLUDED.dim, embedding = EXCLUDED.embedding, text = EXCLUDED.text,
        metadata = EXCLUDED.metadata
    """
)
_DELETE = text("DELETE FROM vector_items WHERE collection = :c AND id = ANY(CAST(:ids AS text[]))")


def index_name(dim: int) -> str:
    return f"vector_items_hnsw_{dim}"


def index_type(dim: int) -> str | None:
    """The type the HNSW index of dimension ``dim`` casts ``embedding`` to."""
    if dim <= VECTOR_HNSW_MAX_DIM:
        return f"vector({int(dim)})"
    if dim <= HALFVEC_HNSW_MAX_DIM:
        return f"halfvec({int(dim)})"
    return None


_EXTENSION_SCHEMA = "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector'"


def use_binary_vectors(engine: AsyncEngine) -> None:
    """Install pgvector's binary codec on each new connection of ``engine``
    (its ``vector``/``halfvec`` parameters then take ``pgvector.Vector``
    objects or lists, and result columns come back as ``Vector``). The
    database must have the extension (a migrated one does)."""
    sync_engine = engine.sync_engine
    if event.contains(sync_engine, "connect", _register):
        return
    event.listen(sync_engine, "connect", _register)


def _register(dbapi_connection: Any, _record: Any) -> None:
    async def register(conn: Any) -> None:
        schema = await conn.fetchval(_EXTENSION_SCHEMA)
        await register_vector(conn, schema=schema or "public")

    dbapi_connection.run_async(register)


class PgVectorStore:
    """Vector collections in a (migrated) PostgreSQL database with pgvector."""

    def __init__(self, engine: AsyncEngine, *, clock: Callable[[], float] = time.time) -> None:
        """``engine``: better one of the store's own (``open``); connections it
        opened before this store existed lack the binary codec."""
        use_binary_vectors(engine)
        self.engine = engine
        self._clock = clock
        self._dims: dict[str, int] = {}
        self._indexed: set[int] = set()

    @classmethod
    def open(cls, url: str, **engine_kwargs: Any) -> PgVectorStore:
        from adapters.store.postgres import postgres_engine

        return cls(postgres_engine(url, **engine_kwargs))

    async def close(self) -> None:
        await self.engine.dispose()

    # ---------------------------------------------------------------- writes

    async def upsert(self, collection: str, items: list[VectorItem]) -> None:
        if not items:
            return
        dim, items, _ = prepare(items)
        async with self.engine.begin() as conn:
            await conn.execute(_REGISTER, {"c": collection, "d": dim, "now": self._clock()})
            have = (await conn.execute(_DIMENSION, {"c": collection})).scalar_one()
            if have != dim:
                raise DimensionMismatch(f"collection {collection!r} has dimension {have}, got vectors of {dim}")
        self._dims[collection] = dim
        await self._ensure_index(dim)
        async with self.engine.begin() as conn:
            await conn.execute(
                _UPSERT,
                {
                    "c": collection,
                    "d": dim,
                    "ids": [item.id for item in items],
                    "embs": [Vector(item.vector) for item in items],
                    "texts": [item.text for item in items],
                    "metas": [dumps(item.metadata) for item in items],
                },
            )

    async def delete(self, collection: str, ids: list[str]) -> None:
        if not ids:
            return
        async with self.engine.begin() as conn:
            await conn.execute(_DELETE, {"c": collection, "ids": list(ids)})

    async def _ensure_index(self, dim: int) -> None:
        """The HNSW index of dimension ``dim`` (once per process and dimension)."""
        if dim in self._indexed:
            return
        type_ = index_type(dim)
        if type_ is not None:
            expression = f"(embedding::{type_})"
            name = index_name(dim)
            ops = "vector_cosine_ops" if dim <= VECTOR_HNSW_MAX_DIM else "halfvec_cosine_ops"
            async with self.engine.begin() as conn:
                if await self._index_exists(conn, name):
                    self._indexed.add(dim)
                    return
                # Two processes meeting a new dimension at once: one builds.
                await conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:n))"), {"n": name})
                await conn.execute(text(f"CREATE INDEX IF NOT EXISTS {name} ON vector_items USING hnsw ({expression} {ops}) WHERE dim = {int(dim)}"))
        self._indexed.add(dim)

    @staticmethod
    async def _index_exists(conn: AsyncConnection, name: str) -> bool:
        return (await conn.execute(text("SELECT to_regclass(:n) IS NOT NULL"), {"n": name})).scalar_one()

    # ----------------------------------------------------------------- reads

    async def query(
        self,
        collection: str,
        vector: list[float],
        k: int,
        *,
        filter: dict[str, Any] | None = None,
    ) -> list[VectorHit]:
        check_vector(vector)
        async with self.engine.begin() as conn:
            dim = self._dims.get(collection)
            if dim is None:
                dim = (await conn.execute(_DIMENSION, {"c": collection})).scalar_one_or_none()
                if dim is None:
                    return []
                self._dims[collection] = dim
            if len(vector) != dim:
                raise DimensionMismatch(f"collection {collection!r} has dimension {dim}, query has {len(vector)}")
            if k <= 0:
                return []
            params: dict[str, Any] = {"c": collection, "q": Vector(list(vector)), "k": int(k)}
            where = [f"dim = {int(dim)}", "collection = :c"]
            if filter:
                # Containment is what the GIN index answers; the equalities
                # make it exact ({"a": [1, 2]} contains {"a": [1]}).
                params["filter"] = dumps({str(key): value for key, value in filter.items()})
                where.append("metadata @> CAST(:filter AS jsonb)")
            for i, (key, value) in enumerate((filter or {}).items()):
                params[f"fk{i}"] = str(key)
                params[f"fv{i}"] = dumps(value)
                where.append(f"metadata -> CAST(:fk{i} AS text) = CAST(:fv{i} AS jsonb)")
            type_ = index_type(dim)
            where_sql = " AND ".join(where)
            if type_ is None:  # no index: an exact scan
                sql = f"SELECT id, text, metadata, embedding <=> CAST(:q AS vector) AS distance FROM vector_items WHERE {where_sql} ORDER BY distance LIMIT :k"
            elif type_.startswith("vector"):  # the index's distance is the exact one
                sql = (
                    f"SELECT id, text, metadata, (embedding::{type_}) <=> CAST(:q AS {type_}) AS distance "
                    f"FROM vector_items WHERE {where_sql} ORDER BY distance LIMIT :k"
                )
            else:
                # halfvec: candidates in half precision from the index, then
                # re-ranked by the exact distance (pgvector's re-ranking).
                params["candidates"] = 2 * int(k) + 10
                sql = (
                    "SELECT id, text, metadata, distance FROM ("
                    "SELECT id, text, metadata, embedding <=> CAST(:q AS vector) AS distance "
                    f"FROM vector_items WHERE {where_sql} "
                    f"ORDER BY (embedding::{type_}) <=> CAST(CAST(:q AS vector) AS {type_}) LIMIT :candidates"
                    ") AS candidates ORDER BY distance LIMIT :k"
                )
            if type_ is not None:
                await conn.execute(text("SET LOCAL hnsw.iterative_scan = strict_order"))
            rows = (await conn.execute(text(sql), params)).all()
        return [
            VectorHit(
                id=id_,
                score=max(-1.0, min(1.0, 1.0 - float(distance))),
                text=text_,
                metadata=json.loads(meta) if isinstance(meta, str) else meta,
            )
            for id_, text_, meta, distance in rows
        ]
