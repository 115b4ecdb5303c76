"""OpenAI Chat Completions transport (``engine.ports.ChatProvider`` over aiohttp).

This adapter only does *transport*: it POSTs the request, frames the
Server-Sent-Events body into ``data:`` lines, decodes each one as JSON and turns
every way the connection can go wrong into an ``UpstreamError`` with a stable
``kind``. It deliberately knows nothing about what a chunk *means* (deltas,
tool-call fragments, reasoning, usage, refusals): that lives in
``engine.fold.accumulator``, so the same semantics can be replayed from the log, tested
without a socket, and shared by any future transport. The only chunk field
looked at here is ``choices[].finish_reason``, because the transport has to
tell a stream that ended properly (some servers omit ``[DONE]`` after the finish
chunk) from one that was cut off.

Error kinds (``UpstreamError.kind``):

* ``upstream_http_error``   HTTP status >= 400 (``status`` set, upstream message kept)
* ``upstream_disconnected`` connection refused/reset, server went away mid-body
* ``upstream_timeout``      connect timeout, or no bytes for ``idle_timeout`` seconds
* ``upstream_truncated``    body ended cleanly with neither a finish reason nor ``[DONE]``
* ``upstream_error``        the upstream spoke, but not the protocol: an in-stream
                            ``{"error": …}`` payload, or a non-JSON non-stream body

The API key is sent only in the ``Authorization`` header and is scrubbed from
every error message (upstreams like to echo it back in 401 bodies).

Session handling, timeouts, the SSE framing (``adapters.providers.sse``: one
parser for both OpenAI transports, no per-event coroutine resumption, no
line-length limit) and the error mapping are shared with the other transports
in ``adapters.providers.http_base``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from adapters.providers.chat_runs import TemplateRuns
from adapters.providers.http_base import HTTPProvider
from adapters.providers.sse import SSEParser
from engine.ports import ModelApi, RawChunk, RawRun, RawWarning

__all__ = ["OpenAIChatProvider"]


class OpenAIChatProvider(HTTPProvider):
    """``ChatProvider`` for any OpenAI-compatible ``/chat/completions`` endpoint.

    One ``aiohttp.ClientSession`` (created lazily, unlimited connection pool) is
    shared by all calls, so hundreds of concurrent streams reuse keep-alive
    connections. Pass ``session`` to share an application-wide session; it is
    then *not* closed by ``close()``.
    """

    api: ModelApi = "chat"

    async def __aenter__(self) -> OpenAIChatProvider:
        return self

    def stream_batches(self, body: dict[str, Any]) -> AsyncGenerator[list[RawChunk | RawWarning], None]:
        """POST a streaming request and yield the ``data:`` payloads of each
        network read as one list (never empty).

        Ends normally on ``[DONE]``, or on a clean end of body after a chunk
        with a non-null ``finish_reason``; raises ``UpstreamError`` otherwise
        (after yielding what came before the error).
        """
        return self._stream(body, None)  # type: ignore[return-value]

    def stream_runs(self, body: dict[str, Any]) -> AsyncGenerator[list[RawChunk | RawWarning | RawRun], None]:
        """``stream_batches``, with the chunks that differ from a template
        only in their text as ``RawRun``s (``adapters.providers.chat_runs``)."""
        return self._stream(body, TemplateRuns(self._sse_items))

    async def _stream(self, body: dict[str, Any], runs: TemplateRuns | None) -> AsyncGenerator[list[RawChunk | RawWarning | RawRun], None]:
        payload = dict(body)
        payload["stream"] = True
        stream_options = dict(payload.get("stream_options") or {})
        stream_options["include_usage"] = True
        payload["stream_options"] = stream_options

        finished = False  # saw a non-null finish_reason
        async with aclosing(self._post_stream("/chat/completions", payload, SSEParser())) as reads:
            async for events in reads:
                out: list[RawChunk | RawWarning | RawRun]
                if runs is not None:
                    out, done = runs.items(events)
                else:
                    out, done = self._sse_items(events)  # type: ignore[assignment]
                if not finished:
                    # Per chunk: no generator, no enumerate (a thousand a read).
                    # A run's chunks have a template that does not finish.
                    i = -1
                    for item in out:
                        i += 1
                        if type(item) is not RawChunk:
                            continue
                        obj = item.data
                        choices = obj.get("choices")
                        if choices:
                            for c in choices:
                                if type(c) is dict and c.get("finish_reason"):
                                    finished = True
                                    break
                            if finished:
                                break
                        elif "error" in obj:
                            if i:
                                yield out[:i]
                            raise self._stream_error(obj)
                if out:
                    yield out
                if done:
                    return
        # Clean end of body without [DONE].
        if not finished:
            raise self._error(
                "upstream_truncated",
                "upstream stream ended without a finish reason or [DONE]",
            )

    async def complete_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST a non-streaming request and return the ``chat.completion`` dict."""
        payload = dict(body)
        payload["stream"] = False
        payload.pop("stream_options", None)  # OpenAI rejects it when stream is false
        return await self._request_json("POST", "/chat/completions", payload)

    async def list_models(self) -> list[dict[str, Any]]:
        """GET ``/models`` and return its ``data`` list."""
        result = await self._request_json("GET", "/models", None)
        data = result.get("data")
        if not isinstance(data, list):
            raise self._error("upstream_error", "upstream /models response has no 'data' list")
        return data
