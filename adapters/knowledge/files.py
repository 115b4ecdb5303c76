"""Uploaded files and knowledge collections: ``engine.ports.Knowledge`` and
what the ``/v1/files`` and ``/v1/knowledge`` routes call.

Ingestion
---------
An upload stores the bytes as a blob and a ``files`` row (``processing``),
then one asyncio task per file does the rest, at most ``ingest_concurrency``
at a time: text extraction (PDF and HTML in a child process killed after
``extract_seconds``, see ``extract_process``; text in a worker thread) and
chunking in a worker thread (CPU-bound: the event loop keeps serving
streams), capped at ``max_text_bytes`` of text and ``max_chunks`` chunks (a
file over either fails with the reason), embeddings in batches through the
``Embedder`` port when there is one, the vectors into the ``VectorStore``
(collection ``file_chunks:<model>``, item id ``<file_id>:<seq>``, metadata
``file_id``, ``user_id``, ``seq``), and finally the chunks and the ``ready``
status in one transaction. Any failure is the file's ``failed`` status with
the reason; nothing is left half-visible.

Crash safety: before the first vector is written the row records the chunk
count and the model (so a later deletion knows which vector ids to remove);
the chunks and ``ready`` are committed together and only while the row is
still ``processing``. A process killed mid-ingestion leaves the file
``processing`` with no chunks; :meth:`FileKnowledge.start` resumes every such
file (vector upserts are idempotent by id). With several processes on one
PostgreSQL database, each resumes them at start: the duplicate work is
harmless (the first commit wins, the other finds the row no longer
``processing`` and writes nothing).

Retrieval
---------
Hybrid, over the ready files the references name (a collection is its files):

* lexical: BM25 (``adapters.knowledge.lexical``) over the file set's chunks,
  normalized to [0, 1);
* vectors: the queries embedded in one call, cosine similarity (negative
  counts as 0) from the vector store, restricted to the file set;
* fusion: a weighted sum, ``0.5 * cosine + 0.5 * bm25`` for a file with
  vectors of the current model (``rag_hybrid``), BM25 alone without an
  embedder (or for files ingested without one), cosine alone with
  ``rag_hybrid`` off. A weighted sum of *absolutely* normalized scores,
  rather than reciprocal rank fusion, because it yields a relevance in [0, 1]
  that ``rag_relevance_threshold`` can be set against (rank fusion scores
  carry no relevance, only order); a chunk only one method found gets 0 from
  the other.

Several queries: a chunk's score is its best over them. Then the threshold
(and score > 0), the ``rag_top_k`` best chunks, grouped per file, best file
first. A ``full`` reference gives each of its files' whole text instead.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from sqlalchemy.ext.asyncio import AsyncEngine

from adapters.knowledge.chunking import Chunk, chunk_text, stitch
from adapters.knowledge.extract import NO_TEXT, ExtractionError, extract_text
from adapters.knowledge.extract_process import extract_isolated
from adapters.knowledge.lexical import LexicalCache, LexicalIndex
from adapters.knowledge.records import FAILED, PROCESSING, READY, CollectionRecord, FileRecord, KnowledgeTables
from adapters.rerank import Reranker, RerankError
from engine.ports import BlobStore, Embedder, EmbeddingError, FileInfo, FileRef, Knowledge, RetrievalError
from engine.vectors import VectorItem, VectorStore

log = logging.getLogger("turnlog.knowledge")

#: The vector store collection of the chunks embedded by ``model``.
COLLECTION_PREFIX = "file_chunks:"

_MISSING_FILE = "no such file"
_MISSING_COLLECTION = "no such collection"


def vector_collection(model: str) -> str:
    return COLLECTION_PREFIX + model


def vector_id(file_id: str, seq: int) -> str:
    return f"{file_id}:{seq}"


@dataclass(frozen=True)
class KnowledgeSettings:
    """What ingestion and retrieval need of ``adapters.config.Settings``."""

    chunk_tokens: int = 400
    chunk_overlap_tokens: int = 50
    top_k: int = 5
    relevance_threshold: float = 0.0
    hybrid: bool = True
    # With a reranker: the best fused candidates it reorders (top_k are kept).
    rerank_candidates: int = 20
    # Texts searched without being stored (fetched web pages): each one's first
    # chunks only (about 25,000 tokens at the default size), so that a huge page
    # costs a bounded embedding.
    page_chunks: int = 64
    # ... and at most this many of their chunks embedded per retrieval (BM25's
    # best first, then each text's first chunks in turn): a local model on a
    # small CPU takes tens of milliseconds a chunk, and this runs in the turn.
    page_embed_chunks: int = 32
    embedding_batch_size: int = 64
    ingest_concurrency: int = 2
    # A file whose text is longer, or makes more chunks, fails (a small PDF can
    # expand to tens of MB of text); extracting a PDF or HTML file is killed
    # after extract_seconds.
    max_text_bytes: int = 5 * 1024 * 1024
    max_chunks: int = 2000
    extract_seconds: float = 60.0
    # BM25 indexes kept in memory, in chunks over all cached file sets.
    lexical_cache_chunks: int = 500_000
    # ``describe`` re-reads the database this often while it waits (a file
    # ingested by another process sends no in-process notification).
    poll_interval: float = 0.5

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> KnowledgeSettings:
        values = {
            "chunk_tokens": settings.chunk_tokens,
            "chunk_overlap_tokens": settings.chunk_overlap_tokens,
            "top_k": settings.rag_top_k,
            "relevance_threshold": settings.rag_relevance_threshold,
            "hybrid": settings.rag_hybrid,
            "rerank_candidates": settings.rag_rerank_candidates,
            "embedding_batch_size": settings.embedding_batch_size,
            "max_text_bytes": settings.file_max_text_bytes,
            "max_chunks": settings.file_max_chunks,
            "extract_seconds": settings.file_extract_seconds,
        }
        values.update(overrides)
        return cls(**values)


class NotFound(Exception):
    """The user has no such file or collection (someone else's included)."""

    def __init__(self, what: Literal["file", "collection"]) -> None:
        super().__init__(f"{what} not found")
        self.what = what


@dataclass(frozen=True)
class Collection:
    record: CollectionRecord
    files: list[FileRecord]

    def public(self) -> dict[str, Any]:
        r = self.record
        return {
            "id": r.id,
            "object": "knowledge",
            "name": r.name,
            "description": r.description,
            "shared": r.shared,
            "files": [f.public() for f in self.files],
            "created_at": int(r.created_at),
            "updated_at": int(r.updated_at),
        }


#: Extracted in a child process (``extract_process``): a small file may take minutes.
ISOLATED_TYPES = frozenset({"application/pdf", "text/html"})


def _chunk(text: str, size: int, overlap: int, max_chunks: int) -> tuple[list[Chunk], int]:
    """Chunking (in a worker thread): chunks and tokens, at most ``max_chunks``."""
    chunks, tokens = chunk_text(text, size, overlap)
    if len(chunks) > max_chunks:
        raise ExtractionError(f"the file's text makes {len(chunks):,} chunks, over the limit of {max_chunks:,} (TURNLOG_FILE_MAX_CHUNKS)")
    return chunks, tokens


class FileKnowledge:
    """``engine.ports.Knowledge`` over uploaded files, and the files and
    collections API.

    ``tables`` is the database; ``blobs`` keeps the uploaded bytes (the event
    store); ``vectors`` and ``embedder`` may be None (lexical retrieval only).
    Call :meth:`start` (resumes interrupted ingestions) and :meth:`stop`.
    """

    def __init__(
        self,
        tables: KnowledgeTables,
        blobs: BlobStore,
        *,
        vectors: VectorStore | None = None,
        embedder: Embedder | None = None,
        settings: KnowledgeSettings | None = None,
        clock: Callable[[], float] = time.time,
        reranker: Reranker | None = None,
    ) -> None:
        self.tables = tables
        self.reranker = reranker
        self.blobs = blobs
        self.vectors = vectors
        self.embedder = embedder if vectors is not None else None
        self.settings = settings or KnowledgeSettings()
        self.clock = clock
        self.lexical = LexicalCache(self.settings.lexical_cache_chunks)
        self._slots = asyncio.Semaphore(self.settings.ingest_concurrency)
        self._pool = ThreadPoolExecutor(max_workers=self.settings.ingest_concurrency, thread_name_prefix="ingest")
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._changed = asyncio.Event()  # replaced (and the old one set) whenever a file finishes
        self._stopping = False

    @classmethod
    def open(
        cls,
        engine: AsyncEngine,
        blobs: BlobStore,
        *,
        vectors: VectorStore | None = None,
        embedder: Embedder | None = None,
        settings: KnowledgeSettings | None = None,
        reranker: Reranker | None = None,
    ) -> FileKnowledge:
        """On an async engine of the (migrated) service database."""
        return cls(KnowledgeTables(engine), blobs, vectors=vectors, embedder=embedder, settings=settings, reranker=reranker)

    # --------------------------------------------------------------- lifecycle

    async def start(self) -> int:
        """Resume the files a previous process left ``processing``; how many."""
        ids = await self.tables.processing_ids()
        for file_id in ids:
            self._schedule(file_id)
        if ids:
            log.info("resuming the ingestion of %d file(s)", len(ids))
        return len(ids)

    async def stop(self) -> None:
        """Cancel running ingestions (their files stay ``processing``, resumed
        at the next start) and release the database."""
        self._stopping = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pool.shutdown(wait=False, cancel_futures=True)
        await self.tables.close()

    async def idle(self) -> None:
        """Wait until no ingestion task runs (tests and the bench)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    # ------------------------------------------------------------------- files

    async def add_file(self, user_id: str, filename: str, content_type: str, data: bytes) -> FileRecord:
        """Store an upload and start its ingestion; the record says ``processing``."""
        blob = await self.blobs.put_blob(user_id, data, content_type)
        now = self.clock()
        record = FileRecord(
            id=f"file-{uuid.uuid4().hex[:24]}",
            user_id=user_id,
            filename=filename,
            content_type=content_type,
            bytes=len(data),
            blob_id=blob,
            status=PROCESSING,
            error=None,
            chars=None,
            chunks=None,
            tokens=None,
            embedding_model=None,
            created_at=now,
            updated_at=now,
        )
        await self.tables.insert_file(record)
        self._schedule(record.id)
        return record

    async def get_file(self, user_id: str, file_id: str) -> FileRecord:
        record = await self.tables.get_file(file_id, user_id)
        if record is None:
            raise NotFound("file")
        return record

    async def list_files(self, user_id: str) -> list[FileRecord]:
        return await self.tables.list_files(user_id)

    async def delete_file(self, user_id: str, file_id: str) -> None:
        """The file, its chunks, its vectors and its place in collections.
        (The uploaded bytes stay in the blob store: blobs are content-addressed
        and may be shared with events.)"""
        if await self.tables.get_file(file_id, user_id) is None:
            raise NotFound("file")
        task = self._tasks.get(file_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        record = await self.tables.delete_file(file_id, user_id)
        if record is None:
            raise NotFound("file")
        self.lexical.forget(file_id)
        if record.embedding_model and record.chunks:
            await self._delete_vectors(record.embedding_model, file_id, record.chunks)
        self._notify()

    # ------------------------------------------------------------- collections

    async def create_collection(self, user_id: str, name: str, description: str = "", *, shared: bool = False) -> Collection:
        """``shared``: readable by every user (the caller checks that an admin asks)."""
        now = self.clock()
        record = CollectionRecord(
            id=f"kb-{uuid.uuid4().hex[:24]}", user_id=user_id, name=name, description=description, created_at=now, updated_at=now, shared=shared
        )
        await self.tables.insert_collection(record)
        return Collection(record, [])

    async def is_shared(self, collection_id: str) -> bool:
        """Whether the collection exists and is shared (a preset may bind it)."""
        return await self.tables.is_shared(collection_id)

    async def get_collection(self, user_id: str, collection_id: str) -> Collection:
        record = await self.tables.get_collection(collection_id, user_id, shared=True)
        if record is None:
            raise NotFound("collection")
        members = await self.tables.collection_files(user_id, [collection_id])
        return Collection(record, members.get(collection_id, []))

    async def list_collections(self, user_id: str) -> list[Collection]:
        records = await self.tables.list_collections(user_id)
        members = await self.tables.collection_files(user_id, [r.id for r in records])
        return [Collection(r, members.get(r.id, [])) for r in records]

    async def add_to_collection(self, user_id: str, collection_id: str, file_id: str) -> Collection:
        if await self.tables.get_collection(collection_id, user_id) is None:
            raise NotFound("collection")
        if await self.tables.get_file(file_id, user_id) is None:
            raise NotFound("file")
        await self.tables.add_to_collection(collection_id, file_id)
        return await self.get_collection(user_id, collection_id)

    async def remove_from_collection(self, user_id: str, collection_id: str, file_id: str) -> Collection:
        if await self.tables.get_collection(collection_id, user_id) is None:
            raise NotFound("collection")
        if not await self.tables.remove_from_collection(collection_id, file_id):
            raise NotFound("file")
        return await self.get_collection(user_id, collection_id)

    async def delete_collection(self, user_id: str, collection_id: str) -> None:
        if not await self.tables.delete_collection(collection_id, user_id):
            raise NotFound("collection")

    # --------------------------------------------------------------- ingestion

    def _schedule(self, file_id: str) -> None:
        if self._stopping or file_id in self._tasks:
            return
        task = asyncio.create_task(self._ingest(file_id), name=f"ingest {file_id}")
        self._tasks[file_id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(file_id, None))

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _ingest(self, file_id: str) -> None:
        try:
            async with self._slots:
                await self._process(file_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug or the database: the file must not stay processing
            log.exception("ingesting %s failed", file_id)
            try:
                await self.tables.finish_failed(file_id, f"internal error: {type(exc).__name__}: {exc}")
            except Exception:
                log.exception("recording the failure of %s failed", file_id)
        finally:
            self._notify()

    async def _process(self, file_id: str) -> None:
        record = await self.tables.get_file(file_id, None)
        if record is None or record.status != PROCESSING:
            return
        found = await self.blobs.get_blob(record.user_id, record.blob_id)
        if found is None:
            await self.tables.finish_failed(file_id, "the file's bytes are missing")
            return
        s = self.settings
        loop = asyncio.get_running_loop()
        try:
            if record.content_type in ISOLATED_TYPES:
                text = await extract_isolated(found[1], record.content_type, s.max_text_bytes, s.extract_seconds)
            else:  # plain text and Markdown: no longer than the upload, decoded at once
                text = await loop.run_in_executor(self._pool, extract_text, found[1], record.content_type, s.max_text_bytes)
            chars = len(text)
            chunks, tokens = await loop.run_in_executor(self._pool, _chunk, text, s.chunk_tokens, s.chunk_overlap_tokens, s.max_chunks)
        except ExtractionError as exc:
            await self.tables.finish_failed(file_id, str(exc))
            return
        if not chunks:
            await self.tables.finish_failed(file_id, NO_TEXT)
            return
        model = self.embedder.model if self.embedder is not None else None
        if not await self.tables.plan(file_id, len(chunks), tokens, chars, model):
            return  # deleted meanwhile
        if model is not None:
            reason = await self._embed(record, chunks, model)
            if reason is not None:
                await self._delete_vectors(model, file_id, len(chunks))
                await self.tables.finish_failed(file_id, reason)
                return
        if not await self.tables.finish_ready(file_id, chunks) and model is not None:
            # Deleted (or finished by another process) meanwhile; if deleted, its vectors must go.
            if await self.tables.get_file(file_id, None) is None:
                await self._delete_vectors(model, file_id, len(chunks))

    async def _embed(self, record: FileRecord, chunks: Sequence[Chunk], model: str) -> str | None:
        """Embed and store the chunks' vectors; the failure reason, or None."""
        assert self.embedder is not None and self.vectors is not None
        size = self.settings.embedding_batch_size
        collection = vector_collection(model)
        for i in range(0, len(chunks), size):
            batch = chunks[i : i + size]
            try:
                vectors = await self.embedder.embed([c.text for c in batch])
            except EmbeddingError as exc:
                return f"embedding failed: {exc}"
            if len(vectors) != len(batch):
                return f"embedding failed: {len(vectors)} vectors for {len(batch)} texts"
            items = [
                VectorItem(
                    id=vector_id(record.id, c.seq),
                    vector=v,
                    metadata={"file_id": record.id, "user_id": record.user_id, "seq": c.seq},
                )
                for c, v in zip(batch, vectors)
            ]
            try:
                await self.vectors.upsert(collection, items)
            except ValueError as exc:  # DimensionMismatch, a zero or non-finite vector
                return f"storing the vectors failed: {exc}"
        return None

    async def _delete_vectors(self, model: str, file_id: str, chunks: int) -> None:
        if self.vectors is None:
            return
        ids = [vector_id(file_id, seq) for seq in range(chunks)]
        for i in range(0, len(ids), 1000):
            await self.vectors.delete(vector_collection(model), ids[i : i + 1000])

    # ------------------------------------------------------- Knowledge: describe

    async def describe(self, user_id: str, refs: Sequence[FileRef], *, wait: float) -> list[FileInfo]:
        """``engine.ports.Knowledge.describe``: waits on the in-process
        notification of finished ingestions, re-reading the database every
        ``poll_interval`` for files another process ingests."""
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            changed = self._changed  # taken before reading: a finish after the read still wakes us
            final = time.monotonic() >= deadline
            infos = await self._describe_once(user_id, refs, final=final)
            if final or not any(info.status == PROCESSING for info in infos):
                return infos
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                continue  # one last read, at the deadline
            try:
                await asyncio.wait_for(changed.wait(), min(remaining, self.settings.poll_interval))
            except TimeoutError:
                pass

    async def _describe_once(self, user_id: str, refs: Sequence[FileRef], *, final: bool = False) -> list[FileInfo]:
        """``final``: the wait is over, so a collection whose other files are
        ready is used without the ones still being processed (said in its reason)."""
        found = await self.tables.files_of(user_id, [r.id for r in refs if r.type == "file"])
        collection_ids = [r.id for r in refs if r.type == "collection"]
        collections = {c: await self.tables.get_collection(c, user_id, shared=True) for c in set(collection_ids)}
        members = await self.tables.collection_files(user_id, collection_ids)
        infos: list[FileInfo] = []
        for ref in refs:
            if ref.type == "file":
                record = found.get(ref.id)
                if record is None:
                    infos.append(FileInfo(ref, ref.id, "missing", _MISSING_FILE))
                else:
                    status = record.status if record.status in (PROCESSING, READY, FAILED) else FAILED
                    infos.append(FileInfo(ref, record.filename, status, record.error))  # type: ignore[arg-type]
                continue
            collection = collections.get(ref.id)
            if collection is None:
                infos.append(FileInfo(ref, ref.id, "missing", _MISSING_COLLECTION))
                continue
            statuses = [f.status for f in members.get(ref.id, [])]
            if PROCESSING in statuses and final and READY in statuses:
                left_out = statuses.count(PROCESSING)
                reason = f"{left_out} of its {len(statuses)} files were still being processed and were left out"
                infos.append(FileInfo(ref, collection.name, "ready", reason))
            elif PROCESSING in statuses:
                infos.append(FileInfo(ref, collection.name, "processing"))
            elif statuses and all(s == FAILED for s in statuses):
                first = next(f.error for f in members[ref.id] if f.status == FAILED)
                infos.append(FileInfo(ref, collection.name, "failed", f"every file failed ({first})"))
            else:
                infos.append(FileInfo(ref, collection.name, "ready"))
        return infos

    # ------------------------------------------------------- Knowledge: retrieve

    async def retrieve(self, user_id: str, refs: Sequence[FileRef], queries: Sequence[str]) -> list[dict[str, Any]]:
        """``engine.ports.Knowledge.retrieve`` (see the module doc)."""
        try:
            return await self._retrieve(user_id, refs, queries)
        except RetrievalError:
            raise
        except EmbeddingError as exc:
            raise RetrievalError(f"embedding the query failed: {exc}") from exc
        except Exception as exc:
            log.exception("retrieval failed")
            raise RetrievalError(f"retrieval failed: {type(exc).__name__}: {exc}") from exc

    async def passages(self, documents: Sequence[str], queries: Sequence[str]) -> list[list[tuple[str, float]]]:
        """``engine.ports.Knowledge.passages``: texts that are not stored (fetched
        web pages) searched as files are: chunked alike (each text's first
        ``page_chunks`` chunks), BM25 and the embedder's cosine fused, reordered
        by the reranker when there is one, then the threshold and the ``top_k``
        best over all the texts. For each text, its chosen passages, best first."""
        try:
            return await self._passages(list(documents), [q.strip() for q in queries if q and q.strip()])
        except RetrievalError:
            raise
        except EmbeddingError as exc:
            raise RetrievalError(f"embedding failed: {exc}") from exc
        except Exception as exc:
            log.exception("passage retrieval failed")
            raise RetrievalError(f"retrieval failed: {type(exc).__name__}: {exc}") from exc

    async def _passages(self, documents: list[str], queries: list[str]) -> list[list[tuple[str, float]]]:
        out: list[list[tuple[str, float]]] = [[] for _ in documents]
        s = self.settings
        loop = asyncio.get_running_loop()
        keys, texts = await loop.run_in_executor(self._pool, _text_chunks, documents, s.chunk_tokens, s.chunk_overlap_tokens, s.page_chunks)
        if not keys or not queries:
            return out
        pool = max(4 * s.top_k, 20)  # candidates per query and method
        index = await asyncio.to_thread(LexicalIndex, keys, texts)
        lexical = [{index.keys[hit.doc]: hit.score for hit in index.search(query, pool)} for query in queries]
        semantic: list[dict[Key, float]] = [{} for _ in queries]
        with_vectors: set[str] = set()
        if self.embedder is not None:
            picked = _embed_candidates(keys, lexical, s.page_embed_chunks)
            vectors = await self.embedder.embed([*queries, *(texts[i] for i in picked)])
            if len(vectors) != len(queries) + len(picked):
                raise RetrievalError(f"embedding failed: {len(vectors)} vectors for {len(queries) + len(picked)} texts")
            semantic = _cosine_hits(vectors[: len(queries)], vectors[len(queries) :], [keys[i] for i in picked], pool)
            with_vectors = {key[0] for key in keys}
        scores = fuse(lexical, semantic, with_vectors, s.hybrid)
        ranked = sorted(((score, key) for key, score in scores.items() if score > 0.0), key=lambda item: (-item[0], item[1]))
        by_key = dict(zip(keys, texts))
        if self.reranker is not None and ranked:
            ranked = await self._rerank(queries, ranked[: max(s.rerank_candidates, s.top_k)], by_key)
        for score, (doc, seq) in [(score, key) for score, key in ranked if score >= s.relevance_threshold][: s.top_k]:
            out[int(doc)].append((by_key[(doc, seq)].strip(), round(score, 6)))
        return out

    async def _ready_files(self, user_id: str, refs: Sequence[FileRef]) -> tuple[list[FileRecord], list[FileRecord]]:
        """The ready files of the references, in reference order, without
        repeats: ``(whole, searched)``; a file named both ways is whole."""
        found = await self.tables.files_of(user_id, [r.id for r in refs if r.type == "file"])
        members = await self.tables.collection_files(user_id, [r.id for r in refs if r.type == "collection"])
        whole: dict[str, FileRecord] = {}
        searched: dict[str, FileRecord] = {}
        for ref in refs:
            records = [found[ref.id]] if ref.type == "file" and ref.id in found else members.get(ref.id, []) if ref.type == "collection" else []
            for record in records:
                if record.status != READY:
                    continue
                (whole if ref.full else searched).setdefault(record.id, record)
        return list(whole.values()), [r for r in searched.values() if r.id not in whole]

    async def _retrieve(self, user_id: str, refs: Sequence[FileRef], queries: Sequence[str]) -> list[dict[str, Any]]:
        whole, searched = await self._ready_files(user_id, refs)
        sources: list[dict[str, Any]] = []
        for record in whole:
            text = stitch(await self.tables.document(record.id)).strip()
            sources.append(
                {
                    "source": {"id": record.id, "name": record.filename, "type": "file"},
                    "document": [text],
                    "metadata": [{"source": record.filename, "name": record.filename, "file_id": record.id}],
                }
            )
        queries = [q.strip() for q in queries if q and q.strip()]
        if not searched or not queries:
            return sources
        scores = await self._scores(user_id, searched, queries)
        s = self.settings
        ranked = sorted(((score, key) for key, score in scores.items() if score > 0.0), key=lambda item: (-item[0], item[1]))
        # The threshold applies to the final score: the reranker's when there is one.
        if self.reranker is None:
            ranked = [(score, key) for score, key in ranked if score >= s.relevance_threshold][: s.top_k]
        else:
            ranked = ranked[: max(s.rerank_candidates, s.top_k)]
        texts = await self.tables.chunk_texts([key for _, key in ranked])
        ranked = [(score, key) for score, key in ranked if key in texts]  # a chunk deleted since the index was built is gone
        if self.reranker is not None and ranked:
            ranked = await self._rerank(queries, ranked, texts)
            ranked = [(score, key) for score, key in ranked if score >= s.relevance_threshold][: s.top_k]
        by_id = {r.id: r for r in searched}
        groups: dict[str, dict[str, Any]] = {}
        for score, (file_id, seq) in ranked:
            chunk = texts[(file_id, seq)]
            record = by_id[file_id]
            group = groups.setdefault(
                file_id,
                {"source": {"id": file_id, "name": record.filename, "type": "file"}, "document": [], "metadata": [], "distances": []},
            )
            group["document"].append(chunk.strip())
            group["metadata"].append({"source": record.filename, "name": record.filename, "file_id": file_id, "chunk": seq, "score": round(score, 6)})
            group["distances"].append(round(score, 6))
        return sources + list(groups.values())

    async def _rerank(
        self, queries: list[str], ranked: list[tuple[float, tuple[str, int]]], texts: dict[tuple[str, int], str]
    ) -> list[tuple[float, tuple[str, int]]]:
        """The candidates reordered by the reranker's score, each its best over the queries."""
        assert self.reranker is not None
        keys = [key for _, key in ranked]
        best = [-math.inf] * len(keys)
        for query in queries:
            try:
                scores = await self.reranker.rerank(query, [texts[key].strip() for key in keys])
            except RerankError as exc:
                raise RetrievalError(f"reranking failed: {exc}") from exc
            best = [max(b, float(v)) for b, v in zip(best, scores)]
        return sorted(zip(best, keys), key=lambda item: (-item[0], item[1]))

    async def _scores(self, user_id: str, files: list[FileRecord], queries: list[str]) -> dict[tuple[str, int], float]:
        """Each candidate chunk's fused relevance, the best over the queries."""
        s = self.settings
        pool = max(4 * s.top_k, 20)  # candidates per query and method
        model = self.embedder.model if self.embedder is not None else None
        with_vectors = {f.id for f in files if model is not None and f.embedding_model == model}
        use_vectors = bool(with_vectors)
        use_lexical = not use_vectors or s.hybrid or len(with_vectors) < len(files)

        lexical: list[dict[tuple[str, int], float]] = [{} for _ in queries]
        if use_lexical:
            ids = [f.id for f in files]
            index = await self.lexical.get(ids, lambda: self.tables.all_chunks(ids))
            for i, query in enumerate(queries):
                lexical[i] = {index.keys[hit.doc]: hit.score for hit in index.search(query, pool)}

        semantic: list[dict[tuple[str, int], float]] = [{} for _ in queries]
        if use_vectors:
            assert self.embedder is not None and model is not None
            qvecs = await self.embedder.embed(queries)
            if len(qvecs) != len(queries):
                raise RetrievalError(f"embedding the query failed: {len(qvecs)} vectors for {len(queries)} queries")
            for i, qvec in enumerate(qvecs):
                semantic[i] = await self._vector_hits(user_id, model, sorted(with_vectors), qvec, pool)

        return fuse(lexical, semantic, with_vectors, s.hybrid)

    async def _vector_hits(self, user_id: str, model: str, file_ids: list[str], qvec: list[float], k: int) -> dict[tuple[str, int], float]:
        """The ``k`` nearest chunks of the files, exactly. The port filters by
        equality only: one file is a ``file_id`` filter; several, the user's
        nearest (oversampled) kept if inside the set, else one query per file."""
        assert self.vectors is not None
        collection = vector_collection(model)

        def keyed(hits: Sequence[Any]) -> dict[tuple[str, int], float]:
            out: dict[tuple[str, int], float] = {}
            for hit in hits:
                meta = hit.metadata
                if meta.get("file_id") in wanted:
                    out[(meta["file_id"], int(meta["seq"]))] = hit.score
            return out

        wanted = set(file_ids)
        if len(file_ids) == 1:
            return keyed(await self.vectors.query(collection, qvec, k, filter={"file_id": file_ids[0]}))
        wide = 4 * k
        hits = await self.vectors.query(collection, qvec, wide, filter={"user_id": user_id})
        inside = keyed(hits)
        if len(inside) >= k or len(hits) < wide:
            return dict(sorted(inside.items(), key=lambda kv: -kv[1])[:k])
        per_file = await asyncio.gather(*(self.vectors.query(collection, qvec, k, filter={"file_id": f}) for f in file_ids))
        merged: dict[tuple[str, int], float] = {}
        for hits in per_file:
            merged.update(keyed(hits))
        return dict(sorted(merged.items(), key=lambda kv: -kv[1])[:k])


Key = tuple[str, int]


def _text_chunks(documents: list[str], size: int, overlap: int, limit: int) -> tuple[list[Key], list[str]]:
    """The first ``limit`` chunks of each text (in a worker thread), keyed ``(str(text index), seq)``."""
    keys: list[Key] = []
    texts: list[str] = []
    for n, text in enumerate(documents):
        chunks, _ = chunk_text(text, size, overlap)
        for chunk in chunks[:limit]:
            keys.append((str(n), chunk.seq))
            texts.append(chunk.text)
    return keys, texts


def _embed_candidates(keys: list[Key], lexical: list[dict[Key, float]], budget: int) -> list[int]:
    """Which chunks (indexes into ``keys``) to embed, at most ``budget``: every
    chunk when they fit, else BM25's best for each query first, then each
    text's chunks from its start, one text after another in turn."""
    if len(keys) <= budget:
        return list(range(len(keys)))
    position = {key: i for i, key in enumerate(keys)}
    picked: dict[int, None] = {}
    for hits in lexical:
        for key, _ in sorted(hits.items(), key=lambda kv: -kv[1]):
            if len(picked) < budget:
                picked.setdefault(position[key])
    by_text: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        by_text.setdefault(key[0], []).append(i)
    rounds = max(len(ids) for ids in by_text.values())
    for n in range(rounds):
        for ids in by_text.values():
            if len(picked) >= budget:
                return sorted(picked)
            if n < len(ids):
                picked.setdefault(ids[n])
    return sorted(picked)


def _cosine_hits(queries: list[list[float]], chunks: list[list[float]], keys: list[Key], k: int) -> list[dict[Key, float]]:
    """Per query, the ``k`` chunks of highest cosine similarity."""
    q = np.asarray(queries, dtype=np.float64)
    m = np.asarray(chunks, dtype=np.float64)
    q /= np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    m /= np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)
    sims = q @ m.T
    out = []
    for row in sims:
        top = np.argsort(-row, kind="stable")[:k]
        out.append({keys[int(j)]: float(row[j]) for j in top})
    return out


def fuse(lexical: list[dict[Key, float]], semantic: list[dict[Key, float]], with_vectors: set[str], hybrid: bool) -> dict[Key, float]:
    """Each chunk's fused score (see the module doc), its best over the queries;
    ``with_vectors``: the documents whose chunks have vectors."""
    weight = 0.5 if hybrid else 1.0  # of the cosine, for documents with vectors
    best: dict[Key, float] = {}
    for lex, sem in zip(lexical, semantic):
        for key in lex.keys() | sem.keys():
            if key[0] in with_vectors:
                score = weight * max(0.0, sem.get(key, 0.0)) + (1.0 - weight) * lex.get(key, 0.0)
            else:
                score = lex.get(key, 0.0)
            if score > best.get(key, 0.0):
                best[key] = score
    return best


def as_knowledge(files: FileKnowledge) -> Knowledge:
    """``files`` as the engine's port (and mypy's proof that it implements it)."""
    return files
