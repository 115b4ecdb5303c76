"""Rerankers: a second opinion on retrieval's candidates, query and passage read together.

``open_reranker(settings)`` builds the one ``rerank_engine`` asks for (None for
``none``)::

    reranker = open_reranker(settings)
    if reranker is not None:
        scores = await reranker.rerank("the question", ["passage one", "passage two"])
        await reranker.close()

* ``api``: :class:`ApiReranker`, ``POST {rerank_url}/rerank`` of the shape
  Cohere, Jina, vLLM and Infinity serve (``rerank_api_shape = "cohere"``:
  ``{"model", "query", "documents", "top_n"}`` → ``{"results": [{"index",
  "relevance_score"}]}``), or Hugging Face TEI's (``"tei"``: ``{"query",
  "texts"}`` → ``[{"index", "score"}]``).
* ``local``: refused at start. A local cross-encoder would have to ship its
  weights inside an installable package (nothing is downloaded at run time);
  none does today.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from adapters.config import LOCAL_RERANK_UNAVAILABLE as LOCAL_UNAVAILABLE
from adapters.rerank.api import ApiReranker, RerankError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from adapters.config import Settings

__all__ = ["ApiReranker", "LOCAL_UNAVAILABLE", "RerankError", "Reranker", "open_reranker", "open_reranker_from"]


class Reranker(Protocol):
    async def rerank(self, query: str, documents: Sequence[str]) -> list[float]:
        """One relevance score per document, in order (higher: more relevant).
        Raises ``RerankError``."""
        ...

    async def close(self) -> None: ...


def open_reranker(settings: Settings) -> ApiReranker | None:
    """The reranker of ``settings.rerank_engine``; None for ``none``.
    ``ValueError`` for a configuration that cannot work."""
    if settings.rerank_engine == "none":
        return None
    if settings.rerank_engine == "local":
        raise ValueError(LOCAL_UNAVAILABLE)
    if not settings.rerank_url:
        raise ValueError("rerank_engine = api needs rerank_url")
    key = settings.rerank_api_key.get_secret_value() if settings.rerank_api_key is not None else None
    return ApiReranker(
        settings.rerank_url,
        settings.rerank_model,
        api_key=key,
        shape=settings.rerank_api_shape,
        connect_timeout=settings.upstream_connect_timeout,
        read_timeout=settings.upstream_idle_timeout,
    )


def open_reranker_from(url: str, model: str | None = None, api_key: str | None = None) -> ApiReranker:
    """An API reranker from its URL alone (the bench's)."""
    return ApiReranker(url, model, api_key=api_key)
