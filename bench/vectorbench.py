"""Vector-store benchmarks (``adapters.vectors``), run in a subprocess by ``python -m bench``
(scenario ``vector_query``) or by hand.

    python -m bench.vectorbench query --url DB_URL [--n 100000] [--dim 384] [--chunks-per-file 100] [--queries 200] [--k 5]
    python -m bench.vectorbench codec --url DB_URL [--n 10000] [--dim 384] [--queries 200]

Each prints ONE JSON line. A PostgreSQL URL gets a fresh database of its own
(created from it, dropped at the end); a SQLite URL names a file that must not
exist yet.

The data imitate a knowledge base: ``n`` chunks of 1,000 characters in files of
``chunks-per-file`` chunks, metadata ``{"file_id", "name", "seq"}``; vectors of
``dim`` dimensions clustered like real embeddings (``dataset``: topics, files,
sections of 10 chunks), unit length. Items go in one upsert per
file (as a processed upload does). Queries are a chunk's vector plus noise,
k nearest:

* ``unfiltered``: the whole collection;
* ``file_filtered``: ``filter={"file_id": F}``, F the file of the chunk the
  query was made from (retrieval restricted to the files a turn names).

``query`` reports p50/p90/p99 latency of ``store.query`` (end to end: the
database round trips included), after one warm-up query (on SQLite it loads the
collection's matrix: ``first_query_ms``) and one warm-up filtered query (on
SQLite it builds the key's postings: ``first_filtered_query_ms``), the ingest rate, and recall@k against exact
cosine search in numpy (HNSW is approximate). ``codec`` upserts ``n`` vectors
(batches of 500) and times it, then the query latency: run it on two commits to
compare two ways of sending vectors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy.engine import make_url

from adapters.store import migrate
from adapters.vectors import open_vector_store
from engine.vectors import VectorItem

TEXT = ("lorem ipsum dolor sit amet " * 40)[:1000]


def dataset(n: int, dim: int, per_file: int, seed: int = 7) -> tuple[np.ndarray, list[str]]:
    """``n`` unit vectors clustered as a knowledge base's chunks are, and each
    one's file id: 200 topics; each file near a topic; each file's sections
    (10 chunks each) near their file; each chunk near its section. Cosine
    similarities: ~0.88 within a section, ~0.7 within a file, ~0.5 within a
    topic, ~0 across topics."""
    rng = np.random.default_rng(seed)

    def noise(rows: int, scale: float) -> np.ndarray:
        return (scale * rng.standard_normal((rows, dim))).astype(np.float32)

    topics = noise(200, 1.0)
    files = (n + per_file - 1) // per_file
    file_centers = topics[rng.integers(0, len(topics), files)] + noise(files, 0.7)
    sections = (n + 9) // 10
    section_file = (np.arange(sections) * 10) // per_file
    section_centers = file_centers[section_file] + noise(sections, 0.6)
    vectors = section_centers[np.arange(n) // 10] + noise(n, 0.5)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors, [f"file-{f:05d}" for f in np.arange(n) // per_file]


def queries(vectors: np.ndarray, count: int, seed: int = 11) -> tuple[np.ndarray, np.ndarray]:
    """``count`` queries near random chunks (cosine ~0.9 with it), and those chunks' rows."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, len(vectors), count)
    dim = vectors.shape[1]
    q = vectors[rows] + (0.5 / np.sqrt(dim) * rng.standard_normal((count, dim))).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return q.astype(np.float32), rows


def percentiles(ms: list[float]) -> dict[str, float]:
    s = sorted(ms)

    def at(p: float) -> float:
        return round(s[min(len(s) - 1, int(p * len(s)))], 3)

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": round(s[-1], 3), "mean": round(statistics.fmean(s), 3), "n": len(s)}


class Database:
    """A fresh database for one run: a new PostgreSQL database, or a new SQLite file."""

    def __init__(self, url: str) -> None:
        self.base = url
        self.url = url
        self.name: str | None = None

    async def __aenter__(self) -> str:
        u = make_url(self.base)
        if u.get_backend_name() == "postgresql":
            import asyncpg

            self.name = "vectorbench_" + uuid.uuid4().hex[:10]
            admin = await asyncpg.connect(self.base.replace("postgresql+asyncpg://", "postgresql://", 1))
            try:
                await admin.execute(f'CREATE DATABASE "{self.name}"')
            finally:
                await admin.close()
            self.url = u.set(database=self.name).render_as_string(hide_password=False)
        elif await asyncio.to_thread(Path(u.database or "").exists):
            raise SystemExit(f"{u.database} exists: give a new file")
        await migrate(self.url)
        return self.url

    async def __aexit__(self, *exc: object) -> None:
        if self.name is not None:
            import asyncpg

            admin = await asyncpg.connect(self.base.replace("postgresql+asyncpg://", "postgresql://", 1))
            try:
                await admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            finally:
                await admin.close()


async def bench_query(url: str, n: int, dim: int, per_file: int, count: int, k: int) -> dict[str, Any]:
    vectors, file_ids = dataset(n, dim, per_file)
    qs, rows = queries(vectors, count)
    # The exact answers, first: nothing but the store runs while it is timed.
    exact: dict[str, list[set[str]]] = {"unfiltered": [], "file_filtered": []}
    for q, row in zip(qs, rows):
        lo, hi = row // per_file * per_file, min(n, (row // per_file + 1) * per_file)
        exact["file_filtered"].append({f"c{lo + i}" for i in np.argsort(-np.einsum("ij,j->i", vectors[lo:hi], q))[:k]})
        exact["unfiltered"].append({f"c{i}" for i in np.argsort(-np.einsum("ij,j->i", vectors, q))[:k]})
    async with Database(url) as db_url:
        store = await open_vector_store(db_url)
        try:
            t0 = time.perf_counter()
            for start in range(0, n, per_file):
                stop = min(n, start + per_file)
                await store.upsert(
                    "kb",
                    [
                        VectorItem(f"c{i}", vectors[i].tolist(), TEXT, {"file_id": file_ids[i], "name": f"{file_ids[i]}.pdf", "seq": i - start})
                        for i in range(start, stop)
                    ],
                )
            ingest_s = time.perf_counter() - t0
        finally:
            await store.close()
        # A fresh store, as after a restart: the first query pays any loading.
        store = await open_vector_store(db_url)
        try:
            t0 = time.perf_counter()
            await store.query("kb", qs[0].tolist(), k)
            load_ms = (time.perf_counter() - t0) * 1000
            # The first filter on a key (SQLite: the key's postings are built then).
            t0 = time.perf_counter()
            await store.query("kb", qs[0].tolist(), k, filter={"file_id": file_ids[-1]})
            first_filtered_ms = (time.perf_counter() - t0) * 1000
            result: dict[str, Any] = {
                "backend": make_url(db_url).get_backend_name(),
                "n": n,
                "dim": dim,
                "k": k,
                "chunks_per_file": per_file,
                "queries": count,
                "ingest_s": round(ingest_s, 2),
                "ingest_items_per_s": round(n / ingest_s),
                "first_query_ms": round(load_ms, 1),
                "first_filtered_query_ms": round(first_filtered_ms, 1),
            }
            for mode in ("unfiltered", "file_filtered"):
                ms: list[float] = []
                recall: list[float] = []
                for q, row, want in zip(qs, rows, exact[mode]):
                    flt = {"file_id": file_ids[row]} if mode == "file_filtered" else None
                    query = q.tolist()
                    t0 = time.perf_counter()
                    hits = await store.query("kb", query, k, filter=flt)
                    ms.append((time.perf_counter() - t0) * 1000)
                    recall.append(len(want & {h.id for h in hits}) / len(want))
                result[mode] = {**percentiles(ms), "recall_at_k": round(statistics.fmean(recall), 4)}
        finally:
            await store.close()
    return result


async def bench_codec(url: str, n: int, dim: int, count: int) -> dict[str, Any]:
    vectors, _ = dataset(n, dim, 100)
    qs, _ = queries(vectors, count)
    async with Database(url) as db_url:
        store = await open_vector_store(db_url)
        try:
            await store.upsert("warm", [VectorItem("w", vectors[0].tolist())])  # the index of this dimension, made once
            items = [VectorItem(f"c{i}", vectors[i].tolist(), "", {"i": i}) for i in range(n)]
            t0, c0 = time.perf_counter(), time.process_time()
            for start in range(0, n, 500):
                await store.upsert("kb", items[start : start + 500])
            upsert_s, upsert_cpu = time.perf_counter() - t0, time.process_time() - c0
            ms = []
            c0 = time.process_time()
            for q in qs:
                t0 = time.perf_counter()
                await store.query("kb", q.tolist(), 5)
                ms.append((time.perf_counter() - t0) * 1000)
            query_cpu = time.process_time() - c0
        finally:
            await store.close()
    return {
        "backend": make_url(url).get_backend_name(),
        "n": n,
        "dim": dim,
        "upsert_s": round(upsert_s, 3),
        "upsert_items_per_s": round(n / upsert_s),
        "upsert_client_cpu_s": round(upsert_cpu, 3),
        "query_ms": percentiles(ms),
        "query_client_cpu_ms": round(query_cpu / len(qs) * 1000, 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.vectorbench")
    sub = parser.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("query")
    q.add_argument("--url", required=True)
    q.add_argument("--n", type=int, default=100_000)
    q.add_argument("--dim", type=int, default=384)
    q.add_argument("--chunks-per-file", type=int, default=100)
    q.add_argument("--queries", type=int, default=200)
    q.add_argument("--k", type=int, default=5)
    c = sub.add_parser("codec")
    c.add_argument("--url", required=True)
    c.add_argument("--n", type=int, default=10_000)
    c.add_argument("--dim", type=int, default=384)
    c.add_argument("--queries", type=int, default=200)
    for p in (q, c):
        p.add_argument("--dir", help="ignored (the harness passes its work directory)")
    args = parser.parse_args(argv)
    if args.cmd == "query":
        out = asyncio.run(bench_query(args.url, args.n, args.dim, args.chunks_per_file, args.queries, args.k))
    else:
        out = asyncio.run(bench_codec(args.url, args.n, args.dim, args.queries))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
