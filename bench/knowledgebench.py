"""Files and knowledge benchmarks, run in a subprocess by ``python -m bench``.

    python -m bench.knowledgebench ingest --dir DIR [--files 20] [--words 40000] [--url DB_URL]
    python -m bench.knowledgebench retrieve --dir DIR [--chunks 100000] [--dim 384] [--url DB_URL]

Each prints ONE JSON line.

``ingest``: ``FileKnowledge`` (``adapters.knowledge.files``) on a migrated
database, the event store as its blob store, the real vector store. F
Markdown documents of W words each are added at once (as the upload route
does, without HTTP) and the time until all are ``ready`` is taken: blob
read, text extraction, cl100k tokenization, chunking (400 tokens, 50 of
overlap), the chunks' transaction, and, in the ``vectors`` run, the vector
store upserts. The embedding *model* is excluded: the embedder is
:class:`FreeEmbedder`, which hands out precomputed vectors. Two runs:
``lexical`` (no embedder) and ``vectors`` (dimension ``--dim``).

``retrieve``: a knowledge base of N chunks (100 files of N/100 chunks, in one
collection) written straight into the tables and the vector store (the
ingestion's last step, without tokenizing 100,000 chunks first), then
``FileKnowledge.retrieve`` over the collection for 20 queries of 2 to 4 words,
each asked 3 times: the whole retrieval (file set from the database, BM25,
query embedding, vector search, fusion, the chunks' texts). ``cold_ms`` is the
first query (it builds the BM25 index of the file set); percentiles are of the
warm queries. Two modes: ``lexical`` (no embedder) and ``hybrid``
(:class:`FreeEmbedder`, hashed bag-of-words vectors of ``--dim``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
import uuid
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from adapters.knowledge.chunking import Chunk, tokenizer
from adapters.knowledge.files import FileKnowledge, KnowledgeSettings, vector_collection, vector_id
from adapters.knowledge.records import PROCESSING, CollectionRecord, FileRecord, KnowledgeTables
from adapters.store import create_engine, migrate, open_store
from adapters.vectors import open_vector_store
from engine.ports import FileRef
from engine.vectors import VectorItem

VOCAB = [f"term{i}" for i in range(20_000)]
_WEIGHTS = np.array([1.0 / (i + 1) ** 0.9 for i in range(len(VOCAB))])
_WEIGHTS /= _WEIGHTS.sum()


def zipf_words(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` words drawn from a Zipf-like law (a realistic term distribution for BM25)."""
    return [VOCAB[i] for i in rng.choice(len(VOCAB), size=n, p=_WEIGHTS)]


def document(rng: np.random.Generator, words: int) -> str:
    drawn = zipf_words(rng, words)
    out: list[str] = []
    i = 0
    while i < len(drawn):
        n = int(rng.integers(8, 20))
        out.append(" ".join(drawn[i : i + n]).capitalize() + ".")
        out.append("\n\n" if rng.random() < 0.2 else " ")
        i += n
    return "".join(out)


class FreeEmbedder:
    """``engine.ports.Embedder`` at no cost: hashed bag-of-words vectors, so
    that the figures are the service's, not a model's."""

    def __init__(self, dim: int, model: str = "free") -> None:
        self.dim = dim
        self._model = f"{model}-{dim}"
        self.calls = 0

    @property
    def model(self) -> str:
        return self._model

    def vector(self, text: str) -> list[float]:
        v = np.zeros(self.dim)
        v[0] = 0.01
        for word in text.lower().split()[:64]:
            v[zlib.crc32(word.encode()) % self.dim] += 1.0
        return (v / np.linalg.norm(v)).tolist()

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls += 1
        return [self.vector(t) for t in texts]


class PrecomputedEmbedder(FreeEmbedder):
    """Hands out a fixed pool of vectors (ingestion: not even the hashing costs)."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim, "pool")
        rng = np.random.default_rng(5)
        pool = rng.standard_normal((256, dim))
        self._pool = (pool / np.linalg.norm(pool, axis=1, keepdims=True)).tolist()

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls += 1
        return [self._pool[i % len(self._pool)] for i in range(len(texts))]


async def _knowledge(url: str, embedder: Any, **settings: Any) -> tuple[FileKnowledge, Any, Any]:
    await migrate(url)
    store = await open_store(url, synchronous="NORMAL")
    vectors = await open_vector_store(url)
    kwargs = {"synchronous": "NORMAL"} if url.startswith("sqlite") else {}
    kb = FileKnowledge(
        KnowledgeTables(create_engine(url, **kwargs)),
        store,
        vectors=vectors,
        embedder=embedder,
        settings=KnowledgeSettings(**settings),
    )
    return kb, store, vectors


async def bench_ingest(url: str, files: int, words: int, dim: int) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    docs = [document(rng, words).encode() for _ in range(files)]
    await asyncio.to_thread(tokenizer)  # loaded once per process, not per run
    runs: dict[str, Any] = {}
    for name, embedder in (("lexical", None), ("vectors", PrecomputedEmbedder(dim))):
        kb, store, vectors = await _knowledge(url, embedder)
        try:
            user = f"bench-{uuid.uuid4().hex[:6]}"
            t0 = time.perf_counter()
            ids = [(await kb.add_file(user, f"doc{i}.md", "text/markdown", data)).id for i, data in enumerate(docs)]
            await kb.idle()
            elapsed = time.perf_counter() - t0
            records = [await kb.get_file(user, file_id) for file_id in ids]
            assert all(r.status == "ready" for r in records), [r.error for r in records if r.status != "ready"]
            chunks = sum(r.chunks or 0 for r in records)
            runs[name] = {
                "chunks": chunks,
                "tokens": sum(r.tokens or 0 for r in records),
                "megabytes": round(sum(map(len, docs)) / 1e6, 2),
                "seconds": round(elapsed, 3),
                "chunks_per_s": round(chunks / elapsed, 1),
            }
        finally:
            await kb.stop()
            await vectors.close()
            await store.close()
    return {"files": files, "words_per_file": words, "dim": dim, "concurrency": KnowledgeSettings().ingest_concurrency, "runs": runs}


async def build_kb(kb: FileKnowledge, user: str, n_chunks: int, dim: int, with_vectors: bool) -> str:
    """100 ready files of ``n_chunks / 100`` chunks (about 100 words each) in one collection."""
    rng = np.random.default_rng(2)
    embedder = FreeEmbedder(dim)
    per_file = max(1, n_chunks // 100)
    tables = kb.tables
    now = time.time()
    collection = CollectionRecord(f"kb-bench-{uuid.uuid4().hex[:8]}", user, "bench", "", now, now)
    await tables.insert_collection(collection)
    for f in range(100):
        file_id = f"file-bench-{uuid.uuid4().hex[:12]}"
        words = zipf_words(rng, per_file * 100)
        chunks = [Chunk(s, " ".join(words[s * 100 : (s + 1) * 100]) + ".", 130, s * 700) for s in range(per_file)]
        record = FileRecord(file_id, user, f"doc{f}.md", "text/markdown", 0, "none", PROCESSING, None, None, None, None, None, now, now)
        await tables.insert_file(record)
        model = embedder.model if with_vectors else None
        await tables.plan(file_id, len(chunks), 130 * len(chunks), 700 * len(chunks), model)
        if with_vectors and kb.vectors is not None:
            items = [VectorItem(vector_id(file_id, c.seq), embedder.vector(c.text), "", {"file_id": file_id, "user_id": user, "seq": c.seq}) for c in chunks]
            for i in range(0, len(items), 1000):
                await kb.vectors.upsert(vector_collection(embedder.model), items[i : i + 1000])
        assert await tables.finish_ready(file_id, chunks)
        await tables.add_to_collection(collection.id, file_id)
    return collection.id


async def bench_retrieve(url: str, n_chunks: int, dim: int, modes: list[str], repeat: int = 3, hybrid_queries: int = 20) -> dict[str, Any]:
    out: dict[str, Any] = {"chunks": n_chunks, "dim": dim, "files": 100, "top_k": 5}
    rng = random.Random(3)
    queries = [" ".join(rng.choice(VOCAB[:3000]) for _ in range(rng.randint(2, 4))) for _ in range(20)]
    for mode in modes:
        embedder = FreeEmbedder(dim) if mode == "hybrid" else None
        kb, store, vectors = await _knowledge(url, embedder, top_k=5)
        try:
            user = f"bench-{uuid.uuid4().hex[:6]}"
            t0 = time.perf_counter()
            collection = await build_kb(kb, user, n_chunks, dim, with_vectors=embedder is not None)
            built = time.perf_counter() - t0
            refs = [FileRef("collection", collection)]
            t0 = time.perf_counter()
            first = await kb.retrieve(user, refs, [queries[0]])
            cold = time.perf_counter() - t0
            assert first, "the first query found nothing"
            times = []
            found = 0
            asked = queries[:hybrid_queries] if mode == "hybrid" else queries
            for _ in range(repeat if mode != "hybrid" or hybrid_queries >= len(queries) else 1):
                for query in asked:
                    t0 = time.perf_counter()
                    sources = await kb.retrieve(user, refs, [query])
                    times.append((time.perf_counter() - t0) * 1000)
                    found += bool(sources)
            times.sort()
            out[mode] = {
                "build_s": round(built, 1),
                "cold_ms": round(cold * 1000, 1),
                "p50_ms": round(statistics.median(times), 2),
                "p90_ms": round(times[int(0.9 * len(times))], 2),
                "max_ms": round(times[-1], 2),
                "queries": len(times),
                "queries_with_results": found,
                "lexical_index_builds": kb.lexical.builds,
            }
        finally:
            await kb.stop()
            await vectors.close()
            await store.close()
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.knowledgebench", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("ingest")
    i.add_argument("--dir", required=True)
    i.add_argument("--files", type=int, default=20)
    i.add_argument("--words", type=int, default=40_000)
    i.add_argument("--dim", type=int, default=384)
    i.add_argument("--url")
    r = sub.add_parser("retrieve")
    r.add_argument("--dir", required=True)
    r.add_argument("--chunks", type=int, default=100_000)
    r.add_argument("--dim", type=int, default=384)
    r.add_argument("--modes", default="lexical,hybrid")
    r.add_argument("--repeat", type=int, default=3, help="times each query is asked")
    r.add_argument("--hybrid-queries", type=int, default=20, help="fewer: a slow vector store asks each once")
    r.add_argument("--url")
    args = p.parse_args(argv)
    url = args.url or f"sqlite+aiosqlite:///{Path(args.dir) / f'knowledge-{args.cmd}-{uuid.uuid4().hex[:6]}.db'}"
    if args.cmd == "ingest":
        out = asyncio.run(bench_ingest(url, args.files, args.words, args.dim))
    else:
        out = asyncio.run(bench_retrieve(url, args.chunks, args.dim, args.modes.split(","), args.repeat, args.hybrid_queries))
    out["backend"] = url.split(":", 1)[0]
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
