"""The vector-store port: embeddings in named collections, cosine search.

Adapters: ``adapters.vectors.sqlite`` (exact cosine over an in-memory numpy
matrix per collection, kept in step with the table) and ``adapters.vectors.pgvector`` (PostgreSQL + pgvector,
HNSW, and a metadata index for selective filters).
Both pass ``tests/test_vectors.py``.

Semantics every adapter keeps:

* A collection has one dimension, fixed by its first upsert; a vector of
  another length (upsert or query) raises :class:`DimensionMismatch`.
* ``upsert`` replaces an item with the same id in the same collection
  (vector, text and metadata); ids are per collection.
* ``query`` returns at most ``k`` hits, best first, ``score`` being the cosine
  similarity (1 = same direction, -1 = opposite). ``filter`` keeps the items
  whose metadata has each given key equal to the given value (JSON equality).
  An unknown collection gives ``[]``.
* Zero vectors (no direction) and non-finite components are rejected with
  ``ValueError``.
* ``metadata`` must be JSON-serializable; ``text`` is stored as given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from engine.json_types import JsonObject


class DimensionMismatch(ValueError):
    """A vector's length differs from its collection's dimension."""


@dataclass(frozen=True)
class VectorItem:
    id: str
    vector: list[float]
    text: str = ""
    metadata: JsonObject = field(default_factory=dict)


@dataclass(frozen=True)
class VectorHit:
    id: str
    score: float  # cosine similarity
    text: str
    metadata: JsonObject


class VectorStore(Protocol):
    async def upsert(self, collection: str, items: list[VectorItem]) -> None: ...

    async def query(
        self,
        collection: str,
        vector: list[float],
        k: int,
        *,
        filter: JsonObject | None = None,
    ) -> list[VectorHit]: ...

    async def delete(self, collection: str, ids: list[str]) -> None: ...


def check_vector(vector: Sequence[float]) -> float:
    """Validate ``vector`` for cosine search; returns its Euclidean norm."""
    if not vector:
        raise ValueError("empty vector")
    norm_sq = 0.0
    for x in vector:
        x = float(x)
        if not math.isfinite(x):
            raise ValueError("vector components must be finite")
        norm_sq += x * x
    norm = math.sqrt(norm_sq)
    if norm == 0.0:
        raise ValueError("zero vector: cosine similarity is undefined")
    return norm


def batch_dimension(items: Sequence[VectorItem]) -> int:
    """The one dimension of ``items`` (validating each vector)."""
    dims = {len(item.vector) for item in items}
    if len(dims) != 1:
        raise DimensionMismatch(f"one upsert must have one dimension, got {sorted(dims)}")
    for item in items:
        check_vector(item.vector)
    return dims.pop()
