"""``engine.vectors.VectorStore`` on SQLite: exact cosine search over an in-memory matrix.

The table (``vector_items``) is the durable copy: each item's *unit* vector as
a little-endian float32 BLOB (rows written before this format, float64, are
read as well: a BLOB's length says which), its text and its metadata. Queries
run on an *image* of each collection held in memory, loaded from the table by
the first query and kept in step with every upsert and delete:

* the unit vectors as one float32 matrix (row ``i`` is item ``ids[i]``; a
  delete moves the last row into the hole), so the cosine similarities of a
  query with all items are one matrix-vector product: ``numpy.einsum``, whose
  single-threaded SIMD loop is faster than OpenBLAS's ``sgemv``
  (``matrix @ q``), which with its threads waits for a second core on a busy
  machine. Memory: ``4·dim`` bytes per item
  (150 MB for 100,000 384-d items), plus the ids;
* for each metadata key used in a filter, the rows of each of its values
  (built the first time a filter names the key, from the table), so a filter
  (``{"file_id": F}``: retrieval restricted to a few files) costs its matching
  rows only: ~2 ms for one file's 100 chunks among 100,000, round trips
  included (the first filter on a key reads every item's metadata once:
  about a second for 100,000). Values compare as JSON (``common.canonical``: 1 == 1.0,
  true != 1, objects whole).

The ``k`` best are taken with ``np.partition``; ties of score go to the smaller
id, as before. Only the hits' text and metadata are read back from the table.
Scores are computed in float32 (``score`` agrees with float64 cosine to ~1e-6).

Staying in step across processes and store instances: every write bumps the
collection's ``version`` (``vector_collections.version``, migration 0006) in
its transaction; a query reads it (one indexed row) and reloads the image when
it is not the version the image was built from. This store's own writes are
applied to the image directly (they are serialized per collection, so the
image goes from version v to v+1 with exactly the rows it wrote).

A product over the whole matrix runs in a worker thread (numpy releases the
GIL: the event loop keeps serving streams meanwhile); small ones (filtered
queries) run inline. Writers wait for running readers before changing the
image (a per-image readers/writer gate on the event loop).

Writes take SQLite's write lock up front (``BEGIN IMMEDIATE``) and wait for
other writers (``busy_timeout``), like the event store's writer, which may
share the file.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
from sqlalchemy import select, text
from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from adapters.store.sqlite import SQLITE_BEGIN, sqlite_engine
from adapters.vectors.common import canonical, dumps, prepare
from adapters.vectors.schema import vector_collections, vector_items
from engine.vectors import DimensionMismatch, VectorHit, VectorItem, check_vector

# Below this many multiply-adds a product runs inline: a thread hop costs more.
INLINE_WORK = 2_000_000

_F32 = np.dtype("<f4")
_F64 = np.dtype("<f8")
_LITTLE = sys.byteorder == "little"

_VERSION = select(vector_collections.c.dimension, vector_collections.c.version)
_BUMP = text("UPDATE vector_collections SET version = version + 1 WHERE name = :c RETURNING version")
_ROWS = "SELECT id, embedding FROM vector_items WHERE collection = ?"
_METADATA = "SELECT id, metadata FROM vector_items WHERE collection = ?"


class _Gate:
    """Readers (worker threads using an image) and writers (changing it on the
    event loop) of one image: writers wait until no reader runs, and new
    readers wait while a writer waits. Only ``await``s on the event loop: the
    writer's change itself is synchronous, right after ``writing()`` returns."""

    __slots__ = ("readers", "writers", "_no_readers", "_no_writers")

    def __init__(self) -> None:
        self.readers = 0
        self.writers = 0
        self._no_readers = asyncio.Event()
        self._no_readers.set()
        self._no_writers = asyncio.Event()
        self._no_writers.set()

    @asynccontextmanager
    async def reading(self) -> Any:
        while self.writers:
            await self._no_writers.wait()
        self.readers += 1
        self._no_readers.clear()
        try:
            yield
        finally:
            self.readers -= 1
            if not self.readers:
                self._no_readers.set()

    async def writing(self) -> None:
        """Returns when no reader runs; change the image before the next ``await``."""
        self.writers += 1
        self._no_writers.clear()
        try:
            while self.readers:
                await self._no_readers.wait()
        finally:
            self.writers -= 1
            if not self.writers:
                self._no_writers.set()


class _Image:
    """One collection in memory: unit vectors (float32 rows), ids, filter postings."""

    def __init__(self, dim: int, version: int, ids: list[str], matrix: np.ndarray) -> None:
        self.dim = dim
        self.version = version
        self.ids = ids
        self.rows = {id_: i for i, id_ in enumerate(ids)}
        self.n = len(ids)
        self.matrix = matrix  # (capacity, dim); rows >= n unused
        # key -> canonical value -> rows; and key -> the canonical value of each row (None: no such key)
        self.postings: dict[str, dict[str, set[int]]] = {}
        self.values: dict[str, list[str | None]] = {}
        self.gate = _Gate()

    # -- changes (on the event loop, after gate.writing()) --------------------

    def put(self, ids: list[str], units: np.ndarray, metadata: list[dict[str, Any]]) -> None:
        """Insert or replace items (``units``: their unit vectors, float32)."""
        new = [id_ for id_ in ids if id_ not in self.rows]
        if self.n + len(new) > len(self.matrix):
            grown = np.empty((max(self.n + len(new), len(self.matrix) + len(self.matrix) // 2, 64), self.dim), _F32)
            grown[: self.n] = self.matrix[: self.n]
            self.matrix = grown
        keys = list(self.postings)
        for id_, unit, meta in zip(ids, units, metadata):
            row = self.rows.get(id_)
            if row is None:
                row = self.n
                self.n += 1
                self.rows[id_] = row
                self.ids.append(id_)
                for key in keys:
                    self.values[key].append(None)
            else:
                self._unpost(row)
            self.matrix[row] = unit
            for key in keys:
                self._post(key, row, meta)

    def remove(self, ids: list[str]) -> None:
        for id_ in ids:
            row = self.rows.pop(id_, None)
            if row is None:
                continue
            self._unpost(row)
            last = self.n - 1
            if row != last:  # the last row fills the hole
                moved = self.ids[last]
                self.matrix[row] = self.matrix[last]
                self.ids[row] = moved
                self.rows[moved] = row
                for key, values in self.values.items():
                    c = values[row] = values[last]
                    if c is not None:
                        rows = self.postings[key][c]
                        rows.discard(last)
                        rows.add(row)
            self.ids.pop()
            for values in self.values.values():
                values.pop()
            self.n = last

    def index_key(self, key: str, metadata: dict[str, dict[str, Any]]) -> None:
        """Build the postings of ``key`` from every item's metadata (by id)."""
        values: list[str | None] = [None] * self.n
        postings: dict[str, set[int]] = {}
        missing = object()
        for id_, meta in metadata.items():
            row = self.rows.get(id_)
            value = meta.get(key, missing)
            if row is None or value is missing:
                continue
            c = canonical(value)
            values[row] = c
            postings.setdefault(c, set()).add(row)
        self.values[key] = values
        self.postings[key] = postings

    def _post(self, key: str, row: int, meta: dict[str, Any]) -> None:
        if key in meta:
            c = canonical(meta[key])
            self.values[key][row] = c
            self.postings[key].setdefault(c, set()).add(row)
        else:
            self.values[key][row] = None

    def _unpost(self, row: int) -> None:
        for key, values in self.values.items():
            c = values[row]
            if c is not None:
                rows = self.postings[key][c]
                rows.discard(row)
                if not rows:
                    del self.postings[key][c]
                values[row] = None

    # -- reads -----------------------------------------------------------------

    def candidates(self, filter: dict[str, Any]) -> np.ndarray:
        """The rows whose metadata matches every ``(key, value)`` of ``filter``
        (its keys indexed already), ascending."""
        sets = []
        for key, value in filter.items():
            rows = self.postings[key].get(canonical(value))
            if not rows:
                return np.empty(0, np.int64)
            sets.append(rows)
        sets.sort(key=len)
        found = sets[0] if len(sets) == 1 else set.intersection(*sets)
        return np.fromiter(sorted(found), np.int64, len(found))


def _best(image: _Image, q: np.ndarray, k: int, rows: np.ndarray | None) -> list[tuple[str, float]]:
    """The ``k`` best ``(id, score)`` among ``rows`` (None: all), best first,
    ties to the smaller id."""
    if rows is None:
        scores = np.einsum("ij,j->i", image.matrix[: image.n], q)
    else:
        scores = np.einsum("ij,j->i", image.matrix[rows], q)
    count = len(scores)
    if count == 0:
        return []
    if count > k:
        # Everything tied with the k-th best is a candidate (ties go by id).
        kth = np.partition(scores, count - k)[count - k]
        picked = np.flatnonzero(scores >= kth)
    else:
        picked = np.arange(count)
    ids = image.ids
    out = [(ids[int(r if rows is None else rows[r])], float(scores[r])) for r in picked]
    out.sort(key=lambda hit: (-hit[1], hit[0]))
    return out[:k]


def _units(matrix: np.ndarray) -> np.ndarray:
    norms = np.sqrt(np.einsum("ij,ij->i", matrix, matrix))
    return (matrix / norms[:, None]).astype(_F32)


def _decode(blobs: list[bytes], dim: int) -> np.ndarray:
    """Stored unit vectors (float32, or float64 from before) as float32 rows."""
    out = np.empty((max(len(blobs), 64), dim), _F32)
    f32 = 4 * dim
    if all(len(b) == f32 for b in blobs):
        if blobs:
            out[: len(blobs)] = np.frombuffer(b"".join(blobs), _F32).reshape(len(blobs), dim)
        return out
    for i, blob in enumerate(blobs):
        out[i] = np.frombuffer(blob, _F32 if len(blob) == f32 else _F64)
    return out


class SqliteVectorStore:
    """Vector collections in a (migrated) SQLite database."""

    def __init__(self, engine: AsyncEngine, *, clock: Callable[[], float] = time.time, inline_work: int = INLINE_WORK) -> None:
        self.engine = engine
        # Products up to this many multiply-adds run on the loop, larger ones in a worker thread.
        self.inline_work = inline_work
        self._write = engine.execution_options(**{SQLITE_BEGIN: "BEGIN IMMEDIATE"})
        self._read = engine.execution_options(**{SQLITE_BEGIN: None})
        self._snapshot = engine.execution_options(**{SQLITE_BEGIN: "BEGIN"})  # several reads, one snapshot
        self._clock = clock
        self._images: dict[str, _Image] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @classmethod
    def open(cls, url: str, *, inline_work: int = INLINE_WORK, **engine_kwargs: Any) -> SqliteVectorStore:
        engine_kwargs.setdefault("pool_size", 4)
        return cls(sqlite_engine(url, **engine_kwargs), inline_work=inline_work)

    async def close(self) -> None:
        self._images.clear()
        await self.engine.dispose()

    def _lock(self, collection: str) -> asyncio.Lock:
        """Serializes this store's writes and image loads of one collection."""
        lock = self._locks.get(collection)
        if lock is None:
            lock = self._locks[collection] = asyncio.Lock()
        return lock

    # ---------------------------------------------------------------- writes

    async def upsert(self, collection: str, items: list[VectorItem]) -> None:
        if not items:
            return
        dim, items, matrix = prepare(items)
        units = _units(matrix)
        if not _LITTLE:  # pragma: no cover
            stored = units.astype(_F32.newbyteorder("<"))
        else:
            stored = units
        metadata = [dumps(item.metadata) for item in items]
        rows = [
            {"collection": collection, "id": item.id, "dim": dim, "embedding": stored[i].tobytes(), "text": item.text, "metadata": metadata[i]}
            for i, item in enumerate(items)
        ]
        stmt = insert(vector_items)
        stmt = stmt.on_conflict_do_update(
            index_elements=["collection", "id"],
            set_={c: stmt.excluded[c] for c in ("dim", "embedding", "text", "metadata")},
        )
        async with self._lock(collection):
            async with self._write.begin() as conn:
                await conn.execute(
                    insert(vector_collections).values(name=collection, dimension=dim, created_at=self._clock(), version=0).on_conflict_do_nothing()
                )
                have = (await conn.execute(select(vector_collections.c.dimension).where(vector_collections.c.name == collection))).scalar_one()
                if have != dim:
                    raise DimensionMismatch(f"collection {collection!r} has dimension {have}, got vectors of {dim}")
                await conn.execute(stmt, rows)
                version = (await conn.execute(_BUMP, {"c": collection})).scalar_one()
            image = self._images.get(collection)
            if image is not None:
                if image.version != version - 1:  # someone else wrote too: reload at the next query
                    del self._images[collection]
                    return
                parsed = [json.loads(m) for m in metadata] if image.postings else [{}] * len(items)
                await image.gate.writing()
                image.put([item.id for item in items], units, parsed)
                image.version = version

    async def delete(self, collection: str, ids: list[str]) -> None:
        if not ids:
            return
        ids = list(dict.fromkeys(ids))
        async with self._lock(collection):
            async with self._write.begin() as conn:
                result = await conn.execute(vector_items.delete().where(vector_items.c.collection == collection, vector_items.c.id.in_(ids)))
                if not result.rowcount:
                    return
                version = (await conn.execute(_BUMP, {"c": collection})).scalar_one_or_none()
            image = self._images.get(collection)
            if image is not None:
                if version is None or image.version != version - 1:
                    del self._images[collection]
                    return
                await image.gate.writing()
                image.remove(ids)
                image.version = version

    # ----------------------------------------------------------------- reads

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
            found = (await conn.execute(_VERSION.where(vector_collections.c.name == collection))).first()
            if found is None:
                return []
            dim, version = found
            version = version or 0
            if len(vector) != dim:
                raise DimensionMismatch(f"collection {collection!r} has dimension {dim}, query has {len(vector)}")
            if k <= 0:
                return []
            want = json.loads(dumps(filter)) if filter else None
            image = await self._image(collection, version, want)
            q = (np.asarray(vector, np.float64) / norm).astype(_F32)
            if want is None:
                rows = None
                work = image.n * dim
            else:
                rows = image.candidates(want)
                work = len(rows) * dim
            if work <= self.inline_work:
                best = _best(image, q, k, rows)
            else:
                async with image.gate.reading():
                    best = await asyncio.to_thread(_best, image, q, k, rows)
            if not best:
                return []
            found_rows = (
                await conn.execute(
                    select(vector_items.c.id, vector_items.c.text, vector_items.c.metadata).where(
                        vector_items.c.collection == collection, vector_items.c.id.in_([id_ for id_, _ in best])
                    )
                )
            ).all()
        by_id = {id_: (text_, meta) for id_, text_, meta in found_rows}
        return [
            VectorHit(id=id_, score=max(-1.0, min(1.0, score)), text=by_id[id_][0], metadata=json.loads(by_id[id_][1]))
            for id_, score in best
            if id_ in by_id  # deleted by another process since the image was read
        ]

    async def _image(self, collection: str, version: int, want: dict[str, Any] | None) -> _Image:
        """The collection's image at ``version`` or newer, with the postings of
        ``want``'s keys."""
        image = self._images.get(collection)
        if image is not None and image.version >= version and not _unindexed(image, want):
            return image
        async with self._lock(collection):
            async with self._snapshot.connect() as conn:
                async with conn.begin():  # one snapshot: vectors, metadata and version agree
                    now = (await conn.execute(_VERSION.where(vector_collections.c.name == collection))).one()
                    image = self._images.get(collection)
                    if image is None or image.version != now.version or image.dim != now.dimension:
                        keys = sorted({*(image.postings if image is not None else ()), *(want or ())})
                        result: Any = await conn.exec_driver_sql(_ROWS, (collection,))
                        ids: list[str] = []
                        blobs: list[bytes] = []
                        for row in result:
                            ids.append(row[0])
                            blobs.append(row[1])
                        image = _Image(now.dimension, now.version, ids, _decode(blobs, now.dimension))
                    else:
                        keys = _unindexed(image, want)
                    if keys:
                        meta_rows: Any = await conn.exec_driver_sql(_METADATA, (collection,))
                        metadata = {row[0]: json.loads(row[1]) for row in meta_rows}
                        for key in keys:
                            image.index_key(key, metadata)
            self._images[collection] = image
            return image


def _unindexed(image: _Image, want: dict[str, Any] | None) -> list[str]:
    return [key for key in want if key not in image.postings] if want else []
