"""Retrieval quality on a labelled question set, run in a subprocess by ``python -m bench``.

    python -m bench.retrievalbench --dir DIR [--chunk-tokens 400] [--rerank-url URL]

Prints ONE JSON line.

The set (``bench/data/retrieval``): 32 short Markdown documents written for it
(``docs/``; several on neighbouring topics, such as wheat and rye sourdough,
espresso and pour-over coffee, PostgreSQL backups and tuning, burns and
sprains, so that a question has near misses), each of a few ``##`` sections,
the passages; and ``questions.tsv``: 128 questions, each labelled with the
passage that answers it (``<document>#<section number>``), worded as a person
would ask rather than copied from the passage.

The documents are uploaded to one collection of a real ``FileKnowledge``
(SQLite database and vector store, the service's chunking) with the
``local-embeddings`` extra's model (``all-MiniLM-L6-v2``, int8 ONNX, on the
CPU), then every question is asked under each configuration:

* ``bm25``: no embedder (lexical only);
* ``vectors``: cosine alone (``rag_hybrid = false``);
* ``hybrid``: BM25 and cosine fused (the service's default);
* ``hybrid_rerank``: the hybrid candidates reordered by a reranker
  (``--rerank-url``: an API reranker of the Cohere/Jina/TEI shape; without
  one, the configuration is reported as skipped: no cross-encoder with its
  weights inside a package is available to run here).

A retrieved chunk *answers* a question when it holds at least half of the
labelled passage's text (chunks are cut by tokens, not at sections). The
chunks are ranked by their score; ``hit@k`` is the share of questions with an
answering chunk among the first k, ``mrr`` the mean of 1 / the rank of the
first answering chunk (0 when none is in the first 10).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from adapters.knowledge.files import FileKnowledge, KnowledgeSettings
from adapters.knowledge.records import KnowledgeTables
from adapters.store import create_engine, migrate, open_store
from adapters.vectors import open_vector_store
from engine.ports import FileRef

DATA = Path(__file__).with_name("data") / "retrieval"
DEPTH = 10  # chunks asked for per question: hit@10 and MRR@10
CUTS = (1, 3, 5, 10)
_SECTION = re.compile(r"^## .*$", re.MULTILINE)


@dataclass(frozen=True)
class Passage:
    doc: str
    start: int
    end: int  # character offsets of the section's body in the document


def load_set(root: Path = DATA) -> tuple[dict[str, str], dict[str, Passage], list[tuple[str, str]]]:
    """The documents (name -> text), the passages (id -> span) and the
    questions ``(passage id, question)``."""
    docs = {p.stem: p.read_text(encoding="utf-8") for p in sorted((root / "docs").glob("*.md"))}
    passages: dict[str, Passage] = {}
    for name, text in docs.items():
        heads = list(_SECTION.finditer(text))
        for n, head in enumerate(heads, start=1):
            end = heads[n].start() if n < len(heads) else len(text)
            passages[f"{name}#{n}"] = Passage(name, head.end(), end)
    questions = []
    for line in (root / "questions.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        if line.strip():
            pid, question = line.split("\t", 1)
            if pid not in passages:
                raise ValueError(f"questions.tsv: no passage {pid}")
            questions.append((pid, question.strip()))
    return docs, passages, questions


def answers(chunk: str, doc_text: str, passage: Passage) -> bool:
    """``chunk`` (as retrieval returns it, stripped) holds at least half of the passage."""
    at = doc_text.find(chunk)
    if at < 0:
        return False
    body = doc_text[passage.start : passage.end].strip()
    lo = doc_text.find(body, passage.start)
    overlap = min(at + len(chunk), lo + len(body)) - max(at, lo)
    return overlap >= 0.5 * len(body)


def ranked_chunks(sources: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(file_id, chunk text)`` of every retrieved chunk, best score first
    (retrieval groups chunks per file; the score is in each one's metadata)."""
    out = []
    for source in sources:
        for text, meta in zip(source["document"], source["metadata"]):
            out.append((float(meta.get("score", 0.0)), meta["file_id"], text))
    out.sort(key=lambda item: -item[0])
    return [(file_id, text) for _, file_id, text in out]


def score(ranks: list[int | None]) -> dict[str, float]:
    n = len(ranks)
    out = {f"hit@{k}": round(sum(1 for r in ranks if r is not None and r <= k) / n, 4) for k in CUTS}
    out["mrr"] = round(sum(1.0 / r for r in ranks if r is not None) / n, 4)
    return out


async def evaluate(
    kb: FileKnowledge,
    user: str,
    collection: str,
    file_docs: dict[str, str],
    docs: dict[str, str],
    passages: dict[str, Passage],
    questions: list[tuple[str, str]],
) -> dict[str, Any]:
    ranks: list[int | None] = []
    misses: list[dict[str, Any]] = []
    times = []
    for pid, question in questions:
        t0 = time.perf_counter()
        sources = await kb.retrieve(user, [FileRef("collection", collection)], [question])
        times.append(time.perf_counter() - t0)
        passage = passages[pid]
        rank = None
        for i, (file_id, text) in enumerate(ranked_chunks(sources), start=1):
            doc = file_docs[file_id]
            if doc == passage.doc and answers(text, docs[doc], passage):
                rank = i
                break
        ranks.append(rank)
        if rank is None or rank > 5:
            misses.append({"passage": pid, "question": question, "rank": rank})
    times.sort()
    return {**score(ranks), "p50_ms": round(1000 * times[len(times) // 2], 1), "misses": misses}


async def run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    from adapters.embeddings.local import LocalEmbedder
    from adapters.rerank import open_reranker_from

    docs, passages, questions = load_set()
    embedder = LocalEmbedder(args.model)
    await migrate(url)
    store = await open_store(url, synchronous="NORMAL")
    vectors = await open_vector_store(url)
    base = KnowledgeSettings(chunk_tokens=args.chunk_tokens, chunk_overlap_tokens=args.chunk_overlap, top_k=DEPTH)
    tables = KnowledgeTables(create_engine(url, synchronous="NORMAL"))
    ingest = FileKnowledge(tables, store, vectors=vectors, embedder=embedder, settings=base)
    reranker = open_reranker_from(args.rerank_url, args.rerank_model, args.rerank_key) if args.rerank_url else None
    out: dict[str, Any] = {"documents": len(docs), "passages": len(passages), "questions": len(questions), "model": embedder.model}
    try:
        user = f"bench-{uuid.uuid4().hex[:6]}"
        t0 = time.perf_counter()
        collection = (await ingest.create_collection(user, "retrieval set")).record.id
        file_docs: dict[str, str] = {}
        for name, text in docs.items():
            record = await ingest.add_file(user, f"{name}.md", "text/markdown", text.encode())
            file_docs[record.id] = name
            await ingest.add_to_collection(user, collection, record.id)
        await ingest.idle()
        chunks = 0
        for file_id in file_docs:
            record = await ingest.get_file(user, file_id)
            assert record.status == "ready", record.error
            chunks += record.chunks or 0
        out.update(chunks=chunks, chunk_tokens=args.chunk_tokens, ingest_s=round(time.perf_counter() - t0, 1))
        configs: dict[str, tuple[Any, KnowledgeSettings, Any]] = {
            "bm25": (None, base, None),
            "vectors": (embedder, replace(base, hybrid=False), None),
            "hybrid": (embedder, base, None),
            "hybrid_rerank": (embedder, base, reranker),
        }
        results: dict[str, Any] = {}
        for name, (emb, settings, rr) in configs.items():
            if name == "hybrid_rerank" and rr is None:
                results[name] = {"skipped": "no reranker: pass --rerank-url (no local cross-encoder ships its weights in a package)"}
                continue
            kb = FileKnowledge(tables, store, vectors=vectors, embedder=emb, settings=settings, reranker=rr)
            results[name] = await evaluate(kb, user, collection, file_docs, docs, passages, questions)
        out["configs"] = results
        out["default"] = "hybrid_rerank" if reranker is not None else "hybrid"
    finally:
        await ingest.stop()
        await vectors.close()
        await store.close()
        await embedder.close()
        if reranker is not None:
            await reranker.close()
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.retrievalbench", description=__doc__.split("\n")[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--model", default="all-MiniLM-L6-v2", help="the local embedding model")
    p.add_argument("--chunk-tokens", type=int, default=KnowledgeSettings().chunk_tokens)
    p.add_argument("--chunk-overlap", type=int, default=KnowledgeSettings().chunk_overlap_tokens)
    p.add_argument("--rerank-url", help="an API reranker (…/v1, its POST /rerank)")
    p.add_argument("--rerank-model", default=None)
    p.add_argument("--rerank-key", default=None)
    p.add_argument("--misses", action="store_true", help="list the questions missed in the first 5")
    args = p.parse_args(argv)
    url = f"sqlite+aiosqlite:///{Path(args.dir) / f'retrieval-{uuid.uuid4().hex[:6]}.db'}"
    out = asyncio.run(run(url, args))
    if not args.misses:
        for result in out.get("configs", {}).values():
            if "misses" in result:
                result["misses"] = len(result["misses"])
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
