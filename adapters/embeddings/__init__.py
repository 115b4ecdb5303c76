"""Embedders (``engine.ports.Embedder``): an OpenAI-compatible HTTP endpoint or a local model.

``open_embedder(settings)`` builds the one the settings ask for::

    embedder = open_embedder(settings)        # None with embedding_engine = "none"
    if embedder is not None:
        vectors = await embedder.embed(["a chunk", "another chunk"])
        await embedder.close()

* ``openai``: :class:`~adapters.embeddings.openai.OpenAIEmbedder` on
  ``embedding_base_url``, default the base URL of the connection
  ``embedding_connection`` (``openai``: the OpenAI upstream's ``openai_base_url``);
  model ``embedding_model``, default ``text-embedding-3-small``. The key is
  ``embedding_api_key``; without one, ``openai_api_key`` is used only when the
  base URL is the OpenAI upstream's too (a key is never sent to a host it was
  not given for).
* ``local``: :class:`~adapters.embeddings.local.LocalEmbedder` (the
  ``local-embeddings`` extra), model ``embedding_model``, default
  ``all-MiniLM-L6-v2``.

Both batch by ``embedding_batch_size``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from adapters.embeddings.openai import OpenAIEmbedder

if TYPE_CHECKING:
    from adapters.config import Settings
    from adapters.embeddings.local import LocalEmbedder

__all__ = ["DEFAULT_OPENAI_MODEL", "OpenAIEmbedder", "open_embedder"]

DEFAULT_OPENAI_MODEL = "text-embedding-3-small"


def open_embedder(settings: Settings) -> OpenAIEmbedder | LocalEmbedder | None:
    """The embedder of ``settings.embedding_engine``; None for ``none``.

    ``ValueError`` for a configuration that cannot work (``openai`` without a
    base URL, an unknown local model); ``EmbeddingError`` when the local
    extra is not installed."""
    engine = settings.embedding_engine
    if engine == "none":
        return None
    if engine == "local":
        from adapters.embeddings.local import LocalEmbedder

        return LocalEmbedder(settings.embedding_model, batch_size=settings.embedding_batch_size)
    # Unset: the connection named by embedding_connection (default: the OpenAI upstream).
    upstream_url, upstream_key = settings.openai_endpoint(settings.embedding_connection) or (None, None)
    base_url = settings.embedding_base_url or upstream_url
    if not base_url:
        raise ValueError("embedding_engine = openai needs embedding_base_url (or openai_base_url, or embedding_connection)")
    key = settings.embedding_api_key
    if key is None and _same_url(base_url, upstream_url):
        key = upstream_key
    return OpenAIEmbedder(
        base_url,
        settings.embedding_model or DEFAULT_OPENAI_MODEL,
        api_key=key.get_secret_value() if key is not None else None,
        batch_size=settings.embedding_batch_size,
        connect_timeout=settings.upstream_connect_timeout,
        read_timeout=settings.upstream_idle_timeout,
    )


def _same_url(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a.rstrip("/") == b.rstrip("/")
