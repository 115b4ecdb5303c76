"""BM25 over a set of files' chunks (``bm25s``), built once per file set and cached.

``bm25s`` (MIT, maintained) precomputes every (term, chunk) BM25 score into a
sparse matrix, so a query is a sum of a few matrix columns and a top-k: about
a millisecond over 100,000 chunks, where ``rank-bm25`` (unmaintained since
2022) loops over every document in Python per query term. Terms: lower-cased
words of two or more letters or digits, English stop words left out (bm25s's
tokenizer; no stemmer, which would need a compiled extra).

Scores are Lucene's BM25 (k1 = 1.5, b = 0.75), normalized to [0, 1) by the
query's largest possible score, the sum of its terms' IDF (each term's
saturating ``tf / (tf + k)`` part tends to 1): 0.4 is a chunk of average
length holding each query term once. The normalization does not depend on the
other results, so the relevance threshold means the same for every query.

An index covers one set of files. Files are immutable once ready, so the set
of ids *is* the version: a file added, deleted or re-ingested makes another
key. Entries are evicted least recently used beyond ``max_chunks`` chunks in
all, and dropped at once when one of their files is deleted.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

import numpy as np

_STOPWORDS = "en"


def _bm25s() -> ModuleType:
    """``bm25s``, imported on first use (it pulls in scipy). Its import sets its
    logger to DEBUG, which put a line per index built into the service log:
    set back to warnings, after the import so that it sticks."""
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


@dataclass(frozen=True)
class LexicalHit:
    doc: int  # index into the index's ``keys``
    score: float  # normalized, in [0, 1)


class LexicalIndex:
    """BM25 over a fixed list of chunks, ``keys[i]`` = ``(file_id, seq)`` of chunk i."""

    def __init__(self, keys: list[tuple[str, int]], texts: Sequence[str]) -> None:
        bm25s = _bm25s()
        self.keys = keys
        self._bm25 = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
        if texts:
            corpus = bm25s.tokenize(list(texts), lower=True, stopwords=_STOPWORDS, show_progress=False)
            self._bm25.index(corpus, show_progress=False)
            indptr = self._bm25.scores["indptr"]
            df = np.diff(indptr).astype(np.float64)  # documents per term (CSC columns)
            n = float(len(texts))
            self._idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5))
            self._vocab: dict[str, int] = self._bm25.vocab_dict
        else:
            self._idf = np.zeros(0)
            self._vocab = {}

    def __len__(self) -> int:
        return len(self.keys)

    def search(self, query: str, k: int) -> list[LexicalHit]:
        """The ``k`` best chunks with a score above zero, best first."""
        bm25s = _bm25s()
        if not self._vocab or k <= 0:
            return []
        words = bm25s.tokenize([query], lower=True, stopwords=_STOPWORDS, show_progress=False, return_ids=False)[0]
        ids = sorted({self._vocab[w] for w in words if w in self._vocab and w != ""})
        if not ids:
            return []
        best = float(self._idf[ids].sum())
        if best <= 0.0:
            return []
        scores = self._bm25.get_scores(ids)
        k = min(k, len(scores))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [LexicalHit(int(i), min(float(scores[i]) / best, 1.0)) for i in top if scores[i] > 0.0]


Loader = Callable[[], Awaitable[tuple[list[tuple[str, int]], list[str]]]]


class LexicalCache:
    """Indexes by file set, built once (concurrent askers share one build, run
    in a worker thread so the event loop keeps serving)."""

    def __init__(self, max_chunks: int = 500_000) -> None:
        self.max_chunks = max_chunks
        self._ready: OrderedDict[tuple[str, ...], LexicalIndex] = OrderedDict()
        self._building: dict[tuple[str, ...], asyncio.Future[LexicalIndex]] = {}
        self.builds = 0  # for tests and the bench: how many indexes were built

    async def get(self, file_ids: Sequence[str], load: Loader) -> LexicalIndex:
        key = tuple(sorted(set(file_ids)))
        index = self._ready.get(key)
        if index is not None:
            self._ready.move_to_end(key)
            return index
        pending = self._building.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[LexicalIndex] = asyncio.get_running_loop().create_future()
        self._building[key] = future
        try:
            keys, texts = await load()
            index = await asyncio.to_thread(LexicalIndex, keys, texts)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody else waits
            raise
        finally:
            self._building.pop(key, None)
        self.builds += 1
        future.set_result(index)
        self._ready[key] = index
        self._evict()
        return index

    def forget(self, file_id: str) -> None:
        """Drop every index that covers ``file_id`` (deleted: free its memory now)."""
        for key in [key for key in self._ready if file_id in key]:
            del self._ready[key]

    def _evict(self) -> None:
        total = sum(len(index) for index in self._ready.values())
        while len(self._ready) > 1 and total > self.max_chunks:
            _, index = self._ready.popitem(last=False)
            total -= len(index)
