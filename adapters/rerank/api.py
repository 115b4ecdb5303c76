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

from adapters.client_session import LazySession
from adapters.providers.http_base import error_text_from_obj, truncate

__all__ = ["ApiReranker", "RerankError"]

MAX_MESSAGE = 300
MAX_ERROR_BODY = 64 * 1024


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
        self._api_key = api_key or None
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=connect_timeout, sock_read=read_timeout)
        self._session = LazySession(self._timeout, session)
        self._headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if self._api_key:
            self._headers["Authorization"] = f"Bearer {self._api_key}"

    def __repr__(self) -> str:  # never show the key
        return f"ApiReranker(url={self.url!r}, model={self.model!r})"

    async def close(self) -> None:
        await self._session.close()

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
        try:
            session = self._session.get()
        except RuntimeError as exc:
            raise RerankError(f"{where}: the aiohttp session is closed") from exc
        try:
            async with session.post(self.url, data=orjson.dumps(self._body(query, texts)), headers=self._headers, timeout=self._timeout) as resp:
                if resp.status >= 400:
                    raise self._error(f"{where}: HTTP {resp.status}{await _error_detail(resp)}")
                raw = await resp.read()
        except RerankError:
            raise
        except TimeoutError as exc:  # aiohttp's connect and read timeouts alike
            what = (
                f"connect timed out after {self.connect_timeout:g}s"
                if isinstance(exc, aiohttp.ConnectionTimeoutError)
                else f"timed out after {self.read_timeout:g}s"
            )
            raise self._error(f"{where}: {what}") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise self._error(f"{where}: {str(exc) or type(exc).__name__}") from None
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

    def _error(self, message: str) -> RerankError:
        if self._api_key and self._api_key in message:
            message = message.replace(self._api_key, "***")
        return RerankError(message)


async def _error_detail(resp: aiohttp.ClientResponse) -> str:
    try:
        raw = await resp.content.read(MAX_ERROR_BODY)
    except (TimeoutError, aiohttp.ClientError, OSError):
        raw = b""
    try:
        text = error_text_from_obj(orjson.loads(raw)) if raw else None
    except ValueError:
        text = None
    if text is None:
        text = raw.decode("utf-8", "replace").strip() or (resp.reason or "")
    text = " ".join(text.split())
    return f": {truncate(text, MAX_MESSAGE)}" if text else ""
