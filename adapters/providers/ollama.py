"""Ollama native chat transport (``POST {root}/api/chat``, NDJSON over aiohttp).

Transport only: one JSON object per line, each yielded as a ``RawChunk``
(``{"model", "created_at", "message": {"role", "content", "thinking"?,
"tool_calls"?}, "done": false}``; tool calls arrive whole, arguments as an
object; the last object has ``done: true`` with ``done_reason``,
``prompt_eval_count``, ``eval_count`` and durations). A line that is not a JSON
object becomes a ``RawWarning`` and the stream goes on.

Ending: normal after an object with ``done: true`` (reading on to the end of the
body; a connection lost or idle after it still counts as a normal end);
``upstream_truncated`` if the body ends before one; an in-stream
``{"error": "..."}`` object raises ``upstream_error``. HTTP errors (Ollama
answers ``{"error": "..."}``) and transport failures map exactly as for the
OpenAI transports (see ``adapters.providers.http_base``).

``base_url`` is the server root (``http://host:11434``), not ``…/v1``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

import aiohttp

from adapters.providers.http_base import HTTPProvider, NDJSONLines, loads
from engine.ports import ModelApi, RawChunk, RawWarning, UpstreamError

__all__ = ["OllamaProvider"]


class OllamaProvider(HTTPProvider):
    """Transport for Ollama's ``/api/chat`` (streaming NDJSON) and ``/api/tags``."""

    api: ModelApi = "ollama"

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float = 10.0,
        idle_timeout: float = 300.0,
        session: aiohttp.ClientSession | None = None,
        api_key: str | None = None,
        headers_timeout: float = 300.0,
    ) -> None:
        """``api_key`` is optional, for an Ollama behind an authenticating proxy."""
        super().__init__(
            base_url,
            api_key,
            connect_timeout=connect_timeout,
            idle_timeout=idle_timeout,
            session=session,
            headers_timeout=headers_timeout,
        )

    async def __aenter__(self) -> OllamaProvider:
        return self

    def _body_is_error(self, result: dict[str, Any]) -> bool:
        return "error" in result and "message" not in result and "models" not in result

    async def stream_batches(self, body: dict[str, Any]) -> AsyncGenerator[list[RawChunk | RawWarning], None]:
        """POST ``body`` with ``stream: true`` and yield the NDJSON objects of each
        network read as one list (never empty)."""
        payload = dict(body)
        payload["stream"] = True

        done = False
        _loads = loads
        try:
            async with aclosing(self._post_stream("/api/chat", payload, NDJSONLines())) as batches:
                async for lines in batches:
                    out: list[RawChunk | RawWarning] = []
                    for line in lines:
                        try:
                            obj = _loads(line)
                        except ValueError as exc:
                            if not line.strip():
                                continue  # blank line
                            out.append(self._warning(line, exc, "line"))
                            continue
                        if type(obj) is not dict:
                            out.append(self._warning(line, None, "line"))
                            continue
                        if obj.get("done") is True:
                            done = True
                        elif not done and "error" in obj and "message" not in obj:
                            if out:
                                yield out
                            raise self._stream_error(obj)
                        out.append(RawChunk(obj))
                    if out:
                        yield out
        except UpstreamError as exc:
            if not (done and exc.kind in ("upstream_disconnected", "upstream_timeout")):
                raise
            return  # the reply was complete; only the connection's end was untidy
        if not done:
            raise self._error("upstream_truncated", 'upstream stream ended without a "done": true object')

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` with ``stream: false`` and return Ollama's single reply object."""
        payload = dict(body)
        payload["stream"] = False
        return await self._request_json("POST", "/api/chat", payload)

    async def list_models(self) -> list[dict[str, Any]]:
        """GET ``/api/tags``; each ``models[].name`` as an OpenAI-style model entry."""
        result = await self._request_json("GET", "/api/tags", None)
        models = result.get("models")
        if not isinstance(models, list):
            raise self._error("upstream_error", "upstream /api/tags response has no 'models' list")
        return [
            {"id": m["name"], "object": "model", "owned_by": "ollama", "created": 0} for m in models if isinstance(m, dict) and isinstance(m.get("name"), str)
        ]
