"""A reranking server's ``POST …/rerank``.

Two request shapes: ``cohere`` (Cohere, Jina, vLLM, Infinity)
``{"model", "query", "documents": [texts], "top_n"}``, and ``tei`` (Hugging
Face text-embeddings-inference) ``{"query", "texts": [texts]}``. Either answer
is read: ``{"results": [{"index", "relevance_score"}]}`` or a bare list of
``{"index", "score"}``. Every document is asked for (``top_n`` = their
count), so each gets a score; a document the server leaves out scores lowest.

Every failure is a ``RerankError`` that says where and why (HTTP status and
the server's message, a timeout, an answer that is not scores), never the
API key, which is sent only in the ``Authorization`` header.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import aiohttp
import orjson

from adapters.json_api import MAX_MESSAGE, JsonApi
from adapters.providers.http_base import error_text_from_obj, truncate

__all__ = ["ApiReranker", "RerankError"]


class RerankError(Exception):
    """The reranker failed (transport, HTTP status, an answer that is not scores)."""


def endpoint(url: str) -> str:
    """The ``/rerank`` URL of ``url``: a base (``http://host/v1``) or the endpoint itself."""
    url = url.rstrip("/")
    return url if url.endswith("/rerank") else url + "/rerank"


class ApiReranker:
    """Scores from a reranking server (see the module doc)."""

    def __init__(
        self,
        url: str,
        model: str | None = None,
        *,
        api_key: str | None = None,
        shape: Literal["cohere", "tei"] = "cohere",
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.url = endpoint(url)
        self.model = model
        self.shape = shape
        self._api = JsonApi(api_key=api_key, connect_timeout=connect_timeout, read_timeout=read_timeout, session=session, error=RerankError)
        self._error = self._api.error

    def __repr__(self) -> str:  # never show the key
        return f"ApiReranker(url={self.url!r}, model={self.model!r})"

    async def close(self) -> None:
        await self._api.close()

    def _body(self, query: str, documents: list[str]) -> dict[str, Any]:
        if self.shape == "tei":
            return {"query": query, "texts": documents}
        body: dict[str, Any] = {"query": query, "documents": documents, "top_n": len(documents)}
        if self.model:
            body["model"] = self.model
        return body

    async def rerank(self, query: str, documents: Sequence[str]) -> list[float]:
        """One score per document, in order. Raises ``RerankError``."""
        texts = list(documents)
        if not texts:
            return []
        where = f"reranking {len(texts)} passages at {self.url}"
        raw = await self._api.post(self.url, self._body(query, texts), where)
        return self._scores(raw, len(texts), where)

    def _scores(self, raw: bytes, n: int, where: str) -> list[float]:
        try:
            body = orjson.loads(raw)
        except ValueError:
            raise self._error(f"{where}: the answer is not JSON: {truncate(raw.decode('utf-8', 'replace'), 120)!r}") from None
        items = body.get("results") if isinstance(body, dict) else body
        if not isinstance(items, list):
            text = error_text_from_obj(body) if isinstance(body, dict) and "error" in body else None
            raise self._error(f"{where}: " + (f"the server answered an error: {truncate(text, MAX_MESSAGE)}" if text else "the answer has no 'results' list"))
        scores: list[float | None] = [None] * n
        for position, item in enumerate(items):
            index = item.get("index") if isinstance(item, dict) else None
            value = item.get("relevance_score", item.get("score")) if isinstance(item, dict) else None
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n or scores[index] is not None:
                raise self._error(f"{where}: result {position} has a missing, repeated or out-of-range index {index!r}")
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise self._error(f"{where}: result {position} has no finite 'relevance_score' (or 'score')")
            scores[index] = float(value)
        floor = min((s for s in scores if s is not None), default=0.0) - 1.0
        return [floor if s is None else s for s in scores]
