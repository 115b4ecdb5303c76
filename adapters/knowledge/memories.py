"""A user's memories: short facts stored per user and searched for a turn.

The ``memories`` table (migration 0005) is the source of truth: content,
owner, times. With an :class:`~engine.ports.Embedder` each memory's vector
also lives in the vector store, in one collection per embedding model
(``memories:<model>``; vectors of two models are not comparable), keyed by
the memory id, with ``{"user_id"}`` as metadata (the search filter) and the
embedded content as the item's text.

**Writes embed first.** ``add`` and ``update`` compute the vector before
touching the database, then upsert the vector, then write the row. An
embedding failure raises :class:`EmbeddingFailed` (the HTTP layer answers
502) and nothing is stored or changed: a memory the client was told is saved
is one that search can find, a down or refusing embedding endpoint (an
input too long for the model, say) is reported while the client can still
act on it, and the table needs no "unembedded" state. Upserting the vector
before the row means a crash in between leaves at worst a vector without a
row, which search ignores (hits are joined with the rows).

**Search** implements :class:`~engine.ports.MemorySearch`:

* with an embedder, the cosine nearest in the model's collection. Memories
  that have no vector there (written before an embedder was configured, or
  under another model), or whose vector is of older content, are embedded
  at the user's first search in this process (``_sync``), so switching the
  model or turning embeddings on needs no migration step;
* without one, Okapi BM25 over the user's memories (:func:`bm25_scores`),
  computed here in pure Python: see its docstring for why not a library.

Scores are higher = closer (cosine similarity; BM25 score). Every failure
of a search is a :class:`~engine.ports.RetrievalError` naming the reason.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from adapters.knowledge.schema import memories
from adapters.store.sqlite import SQLITE_BEGIN
from engine.ports import Embedder, EmbeddingError, MemoryHit, RetrievalError
from engine.vectors import VectorItem, VectorStore

COLLECTION_PREFIX = "memories:"
# Vector hits fetched beyond ``k``: room for vectors whose row is gone (a
# crash between deleting the row and its vector) without returning fewer.
_SLACK = 8


@dataclass(frozen=True)
class Memory:
    id: str
    user_id: str
    content: str
    created_at: float
    updated_at: float

    def public(self) -> dict[str, object]:
        """The API shape (``/v1/memories``): no owner, it is always the caller."""
        return {"id": self.id, "content": self.content, "created_at": self.created_at, "updated_at": self.updated_at}


class EmbeddingFailed(Exception):
    """A write could not embed its content; nothing was stored (the reason is the message)."""


def new_memory_id() -> str:
    return f"mem_{uuid.uuid4().hex[:24]}"


def collection_for(model: str) -> str:
    """The vector collection of an embedding model's memory vectors."""
    return COLLECTION_PREFIX + model


class Memories:
    """CRUD and search over the ``memories`` table (and the vector store).

    ``engine`` is the (migrated) database's async engine, the event store's
    own is fine: one pool. ``embedder`` and ``vectors`` come together or not
    at all; without them search is lexical.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        embedder: Embedder | None = None,
        vectors: VectorStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if embedder is not None and vectors is None:
            raise ValueError("an embedder needs a vector store to keep the memories' vectors in")
        # SQLite: writes take the write lock up front (a read in the same
        # transaction can't go stale), reads need no transaction. Other
        # dialects ignore the option.
        self._write = engine.execution_options(**{SQLITE_BEGIN: "BEGIN IMMEDIATE"})
        self._read = engine.execution_options(**{SQLITE_BEGIN: None})
        self.embedder = embedder
        self.vectors = vectors
        self._clock = clock
        # Users whose memories are known to be in the model's collection (this process).
        self._synced: set[str] = set()

    @property
    def collection(self) -> str | None:
        return collection_for(self.embedder.model) if self.embedder is not None else None

    # ----------------------------------------------------------------- CRUD

    async def add(self, user_id: str, content: str) -> Memory:
        """Store a memory (embedded first, when there is an embedder). Raises ``EmbeddingFailed``."""
        now = self._clock()
        memory = Memory(new_memory_id(), user_id, content, now, now)
        await self._put_vector(memory)
        async with self._write.begin() as conn:
            await conn.execute(insert(memories).values(id=memory.id, user_id=user_id, content=content, created_at=now, updated_at=now))
        return memory

    async def remember(self, user_id: str, content: str) -> str:
        """``engine.ports.MemorySearch.remember`` (the model's ``add_memory``)."""
        try:
            return (await self.add(user_id, content)).id
        except EmbeddingFailed as exc:
            raise RetrievalError(f"the memory could not be embedded: {exc}") from exc

    async def list_for(self, user_id: str) -> list[Memory]:
        """The user's memories, newest first."""
        async with self._read.connect() as conn:
            rows = (
                await conn.execute(select(memories).where(memories.c.user_id == user_id).order_by(memories.c.created_at.desc(), memories.c.id.desc()))
            ).all()
        return [Memory(r.id, r.user_id, r.content, r.created_at, r.updated_at) for r in rows]

    async def get(self, user_id: str, memory_id: str) -> Memory | None:
        """The memory, or None if unknown or another user's (the caller can't tell which)."""
        async with self._read.connect() as conn:
            row = (await conn.execute(select(memories).where(memories.c.id == memory_id, memories.c.user_id == user_id))).first()
        return None if row is None else Memory(row.id, row.user_id, row.content, row.created_at, row.updated_at)

    async def update(self, user_id: str, memory_id: str, content: str) -> Memory | None:
        """Replace the content (re-embedded); None if not the user's memory.

        Raises ``EmbeddingFailed``, and then the memory is unchanged."""
        old = await self.get(user_id, memory_id)
        if old is None:  # before embedding: someone else's id costs no embedding call
            return None
        memory = Memory(memory_id, user_id, content, old.created_at, max(self._clock(), old.updated_at))
        await self._put_vector(memory)
        async with self._write.begin() as conn:
            result = await conn.execute(
                update(memories).where(memories.c.id == memory_id, memories.c.user_id == user_id).values(content=content, updated_at=memory.updated_at)
            )
        if result.rowcount == 0:  # deleted meanwhile: take back the vector we just wrote
            await self._drop_vector(memory_id)
            return None
        return memory

    async def delete(self, user_id: str, memory_id: str) -> bool:
        """Delete the row, then its vector; False if not the user's memory.

        In that order so that a failure in between leaves a vector without a
        row (which search ignores), never a listed memory without a vector."""
        async with self._write.begin() as conn:
            result = await conn.execute(delete(memories).where(memories.c.id == memory_id, memories.c.user_id == user_id))
        if result.rowcount == 0:
            return False
        await self._drop_vector(memory_id)
        return True

    async def _put_vector(self, memory: Memory) -> None:
        if self.embedder is None or self.vectors is None:
            return
        try:
            [vector] = await self.embedder.embed([memory.content])
            await self.vectors.upsert(self._collection(), [self._item(memory, vector)])
        except EmbeddingError as exc:
            raise EmbeddingFailed(f"embedding model {self.embedder.model!r} failed: {exc}") from exc
        except ValueError as exc:  # a zero or non-finite vector, another dimension than the collection's
            raise EmbeddingFailed(f"embedding model {self.embedder.model!r} gave an unusable vector: {exc}") from exc

    async def _drop_vector(self, memory_id: str) -> None:
        if self.vectors is not None and self.embedder is not None:
            await self.vectors.delete(self._collection(), [memory_id])

    def _collection(self) -> str:
        collection = self.collection
        assert collection is not None
        return collection

    @staticmethod
    def _item(memory: Memory, vector: list[float]) -> VectorItem:
        return VectorItem(memory.id, [float(x) for x in vector], memory.content, {"user_id": memory.user_id})

    # --------------------------------------------------------------- search

    async def search(self, user_id: str, query: str, k: int) -> list[MemoryHit]:
        """The user's ``k`` memories nearest to ``query``, best first (``MemorySearch``).

        Lexical search leaves out memories that share no term with the query
        (a score of 0 says nothing about them). Raises ``RetrievalError``."""
        if k <= 0 or not query.strip():
            return []
        try:
            if self.embedder is None:
                return await self._lexical(user_id, query, k)
            return await self._nearest(user_id, query, k)
        except RetrievalError:
            raise
        except EmbeddingError as exc:
            raise RetrievalError(f"memory search: embedding model failed: {exc}") from exc
        except (SQLAlchemyError, OSError, ValueError) as exc:
            raise RetrievalError(f"memory search failed: {type(exc).__name__}: {exc}") from exc

    async def _lexical(self, user_id: str, query: str, k: int) -> list[MemoryHit]:
        rows = await self.list_for(user_id)
        scores = bm25_scores(query, [m.content for m in rows])
        ranked = sorted(
            ((score, m) for score, m in zip(scores, rows) if score > 0),
            key=lambda pair: (-pair[0], -pair[1].created_at, pair[1].id),
        )
        return [MemoryHit(m.id, m.content, m.created_at, score) for score, m in ranked[:k]]

    async def _nearest(self, user_id: str, query: str, k: int) -> list[MemoryHit]:
        assert self.embedder is not None and self.vectors is not None
        [raw] = await self.embedder.embed([query])
        qvec = [float(x) for x in raw]
        if user_id not in self._synced:
            await self._sync(user_id, qvec)
        for _attempt in range(2):
            hits = await self.vectors.query(self._collection(), qvec, k + _SLACK, filter={"user_id": user_id})
            rows = await self._rows(user_id, [h.id for h in hits])
            # A vector made from other content than the row's (two updates
            # racing, a crash between the vector and the row): embed it again
            # and ask once more, so the ranking is the current content's.
            stale = [rows[h.id] for h in hits if h.id in rows and h.text != rows[h.id].content]
            if not stale:
                break
            await self._embed_into_collection(stale)
        return [MemoryHit(h.id, rows[h.id].content, rows[h.id].created_at, h.score) for h in hits if h.id in rows][:k]

    async def _rows(self, user_id: str, ids: Sequence[str]) -> dict[str, Memory]:
        if not ids:
            return {}
        async with self._read.connect() as conn:
            found = (await conn.execute(select(memories).where(memories.c.user_id == user_id, memories.c.id.in_(list(ids))))).all()
        return {r.id: Memory(r.id, r.user_id, r.content, r.created_at, r.updated_at) for r in found}

    async def _sync(self, user_id: str, qvec: list[float]) -> None:
        """Embed the user's memories that the model's collection lacks, or holds
        for older content: once per user and process, then writes keep it so.

        Asks the store for as many of the user's vectors as they have memories.
        An approximate index (HNSW) may miss some: those are embedded again,
        which costs a call and changes nothing."""
        assert self.vectors is not None
        rows = await self.list_for(user_id)
        if rows:
            present = await self.vectors.query(self._collection(), qvec, len(rows), filter={"user_id": user_id})
            embedded = {h.id: h.text for h in present}  # the text each vector was made from
            stale = [m for m in rows if embedded.get(m.id) != m.content]
            if stale:
                await self._embed_into_collection(stale)
        self._synced.add(user_id)

    async def _embed_into_collection(self, batch: Sequence[Memory]) -> None:
        """One embedding call (the embedder batches) and one upsert for ``batch``."""
        assert self.embedder is not None and self.vectors is not None
        vectors = await self.embedder.embed([m.content for m in batch])
        if len(vectors) != len(batch):
            raise RetrievalError(f"memory search: embedding model {self.embedder.model!r} returned {len(vectors)} vectors for {len(batch)} texts")
        await self.vectors.upsert(self._collection(), [self._item(m, v) for m, v in zip(batch, vectors)])


# ------------------------------------------------------------------ lexical

_TOKEN = re.compile(r"\w+")
BM25_K1 = 1.2  # term-frequency saturation (Lucene's default)
BM25_B = 0.75  # length normalization


def tokenize(text: str) -> list[str]:
    """Case-folded Unicode word runs: no stemming and no stop words (BM25's
    IDF already weighs down words every memory has)."""
    return _TOKEN.findall(text.casefold())


def bm25_scores(query: str, documents: Sequence[str], *, k1: float = BM25_K1, b: float = BM25_B) -> list[float]:
    """Okapi BM25 of each document for ``query``, with Lucene's IDF
    ``ln(1 + (N - n + 0.5) / (n + 0.5))``; each distinct query term counts once.

    Written out rather than taken from ``rank-bm25`` or ``bm25s``: a user has
    a few hundred memories that change between searches, so there is no index
    worth keeping and one pass over them is microseconds; both libraries need
    numpy (``bm25s`` scipy too) for this loop; and ``rank-bm25``'s
    ``BM25Okapi`` uses the IDF ``ln((N - n + 0.5) / (n + 0.5))``, which is 0
    for a term in one of two memories and negative for a term in most of
    them, so on a handful of memories a matching one can score 0. Lucene's
    IDF is positive for every term that occurs.
    """
    docs = [Counter(tokenize(d)) for d in documents]
    terms = set(tokenize(query))
    if not docs or not terms:
        return [0.0] * len(docs)
    n_docs = len(docs)
    lengths = [sum(d.values()) for d in docs]
    avgdl = (sum(lengths) / n_docs) or 1.0
    idf = {}
    for term in terms:
        n = sum(1 for d in docs if term in d)
        idf[term] = math.log(1.0 + (n_docs - n + 0.5) / (n + 0.5)) if n else 0.0
    scores = []
    for doc, length in zip(docs, lengths):
        norm = k1 * (1.0 - b + b * length / avgdl)
        score = 0.0
        for term in terms:
            tf = doc.get(term, 0)
            if tf:
                score += idf[term] * tf * (k1 + 1.0) / (tf + norm)
        scores.append(score)
    return scores
