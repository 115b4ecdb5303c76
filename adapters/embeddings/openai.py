"""``engine.ports.Embedder`` over an OpenAI-compatible ``POST {base}/embeddings``.

OpenAI, Ollama's ``/v1``, vLLM and Hugging Face TEI all speak it: the body is
``{"model", "input": [texts], "encoding_format": "float"}`` and the answer
``{"data": [{"index", "embedding"}...]}``. ``embed`` cuts the texts into batches
of ``batch_size`` (one request each, at most ``concurrency`` in flight: a whole
document's chunks go out at once, without flooding a local server) and puts
every vector back at its text's place by ``index`` (a server may answer out of
order).

Every failure is an ``EmbeddingError`` whose message says what went wrong and
where (the batch, the HTTP status and the server's message, a timeout, a body
that is not vectors, a count that does not match), never the API key: it is
sent only in the ``Authorization`` header, kept out of ``repr``, and scrubbed
from any message that echoes it. One failed batch fails the call (the other
batches are cancelled): a document is embedded whole or not at all.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson

from adapters.json_api import MAX_MESSAGE, JsonApi
from adapters.providers.http_base import error_text_from_obj, truncate
from engine.ports import EmbeddingError

__all__ = ["OpenAIEmbedder"]


class OpenAIEmbedder:
    """Vectors from an OpenAI-compatible ``/embeddings`` endpoint.

    ``base_url`` is the API root (``https://api.openai.com/v1``,
    ``http://localhost:11434/v1``). ``dimensions`` is sent when given (OpenAI's
    ``text-embedding-3-*`` shorten their vectors on request). ``read_timeout``
    bounds the wait for one batch's answer (silence on the socket);
    ``connect_timeout`` the connect. Pass ``session`` to share an application's
    ``aiohttp.ClientSession`` (then ``close()`` leaves it open).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        batch_size: int = 64,
        concurrency: int = 4,
        dimensions: int | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 120.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        if batch_size < 1 or concurrency < 1:
            raise ValueError("batch_size and concurrency must be >= 1")
        self.base_url = base_url.rstrip("/")
        self._model = model
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.dimensions = dimensions
        self._api = JsonApi(api_key=api_key, connect_timeout=connect_timeout, read_timeout=read_timeout, session=session, error=EmbeddingError)
        self._error = self._api.error

    def __repr__(self) -> str:  # never show the key
        return f"OpenAIEmbedder(base_url={self.base_url!r}, model={self._model!r})"

    @property
    def model(self) -> str:
        return self._model

    async def close(self) -> None:
        """Close the session this embedder created (a caller-supplied one is left open)."""
        await self._api.close()

    async def __aenter__(self) -> OpenAIEmbedder:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ embed

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order. Raises ``EmbeddingError``."""
        if isinstance(texts, str):
            raise TypeError("embed takes a sequence of texts, not one string")
        texts = list(texts)
        if not texts:
            return []
        size = self.batch_size
        batches = [texts[i : i + size] for i in range(0, len(texts), size)]
        if len(batches) == 1:
            return await self._batch(batches[0], 0, 1)
        gate = asyncio.Semaphore(self.concurrency)

        async def run(i: int, batch: list[str]) -> list[list[float]]:
            async with gate:
                return await self._batch(batch, i, len(batches))

        # A TaskGroup cancels the other batches at the first failure.
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(run(i, batch)) for i, batch in enumerate(batches)]
        except* EmbeddingError as failed:
            raise failed.exceptions[0] from None
        out: list[list[float]] = []
        for task in tasks:
            out.extend(task.result())
        return out

    async def _batch(self, texts: list[str], number: int, count: int) -> list[list[float]]:
        where = f"embedding batch {number + 1}/{count} ({len(texts)} texts) at {self.base_url}/embeddings"
        payload: dict[str, Any] = {"model": self._model, "input": texts, "encoding_format": "float"}
        if self.dimensions is not None:
            payload["dimensions"] = self.dimensions
        raw = await self._api.post(self.base_url + "/embeddings", payload, where)
        return self._vectors(raw, len(texts), where)

    def _vectors(self, raw: bytes, n: int, where: str) -> list[list[float]]:
        """The ``n`` vectors of an answer body, ordered by ``index``."""
        try:
            body = orjson.loads(raw)
        except ValueError:
            raise self._error(f"{where}: the answer is not JSON: {truncate(raw.decode('utf-8', 'replace'), 120)!r}") from None
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            text = error_text_from_obj(body) if isinstance(body, dict) and "error" in body else None
            if text:
                raise self._error(f"{where}: the server answered an error: {truncate(text, MAX_MESSAGE)}")
            raise self._error(f"{where}: the answer has no 'data' list")
        if len(data) != n:
            raise self._error(f"{where}: {len(data)} vectors for {n} texts")
        out: list[list[float] | None] = [None] * n
        dim: int | None = None
        for position, item in enumerate(data):
            index = item.get("index", position) if isinstance(item, dict) else None
            vector = item.get("embedding") if isinstance(item, dict) else None
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n or out[index] is not None:
                raise self._error(f"{where}: item {position} has a missing, repeated or out-of-range index {index!r}")
            if not isinstance(vector, list) or not vector:
                raise self._error(f"{where}: item {position} has no 'embedding' list of numbers")
            try:
                floats = [float(x) for x in vector]
            except (TypeError, ValueError):
                raise self._error(f"{where}: item {position} has a non-numeric embedding component") from None
            if not all(math.isfinite(x) for x in floats) or any(isinstance(x, bool) for x in vector):
                raise self._error(f"{where}: item {position} has a non-finite or non-numeric component")
            if dim is None:
                dim = len(floats)
            elif len(floats) != dim:
                raise self._error(f"{where}: vectors of different lengths ({dim} and {len(floats)})")
            out[index] = floats
        return out  # type: ignore[return-value]  # every slot filled: n distinct indexes in range
