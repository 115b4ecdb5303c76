"""OpenAI Responses API transport (``POST {base_url}/responses`` over aiohttp).

Transport only, like ``openai_chat``: frame the SSE body (the same parser,
``adapters.providers.sse``), decode each event's ``data`` (an event object with
a ``type`` and a ``sequence_number``; the ``event:`` line repeats the type and
is used only when the object has none) and map failures to ``UpstreamError``.
What an event *means* is left to the engine.

Ending:

* normal: after a terminal event (``response.completed``, ``response.incomplete``
  or ``response.failed``), reading on to the end of the body; a ``[DONE]`` line
  is tolerated (it ends the body), and once a terminal event was seen a
  connection lost or idle afterwards still counts as a normal end;
* ``upstream_truncated``: the body ended (or ``[DONE]`` came) with no terminal event;
* an in-stream ``error`` event is yielded like any other event; if no terminal
  event follows it, the stream raises ``upstream_error`` with its message
  (``previous_response_not_found`` if that is its code).

HTTP errors map as for Chat Completions (``upstream_http_error``), except that
an HTTP 400/404 saying the ``previous_response_id`` is unknown or expired (code
``previous_response_not_found``, ``param: previous_response_id``, or a message
naming the previous response) raises ``UpstreamError(kind=
"previous_response_not_found", status=…)``, so the engine can resend the full
transcript instead.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from adapters.providers.http_base import HTTPProvider
from adapters.providers.sse import SSEParser
from engine.ports import ModelApi, RawChunk, RawWarning, UpstreamError

__all__ = ["OpenAIResponsesProvider", "TERMINAL_EVENTS", "is_previous_response_error"]

TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})

PREVIOUS_RESPONSE_NOT_FOUND = "previous_response_not_found"


def is_previous_response_error(obj: Any, text: str = "") -> bool:
    """Whether an error body/event says the ``previous_response_id`` is unknown or expired."""
    err = obj.get("error") if isinstance(obj, dict) else None
    if not isinstance(err, dict):
        err = obj if isinstance(obj, dict) else {}
    if err.get("code") == PREVIOUS_RESPONSE_NOT_FOUND or err.get("param") == "previous_response_id":
        return True
    message = (text or str(err.get("message") or "")).lower()
    return "previous_response_id" in message or "previous response" in message


class OpenAIResponsesProvider(HTTPProvider):
    """Transport for an OpenAI-compatible ``/responses`` endpoint (streaming SSE)."""

    api: ModelApi = "responses"

    async def __aenter__(self) -> OpenAIResponsesProvider:
        return self

    def _http_error_kind(self, status: int, body: Any, text: str) -> str:
        if status in (400, 404) and is_previous_response_error(body, text):
            return PREVIOUS_RESPONSE_NOT_FOUND
        return "upstream_http_error"

    def _body_is_error(self, result: dict[str, Any]) -> bool:
        # A Response object always has an "error" key (null, or set when failed).
        return result.get("error") is not None and result.get("object") != "response" and "data" not in result

    async def stream_batches(self, body: dict[str, Any]) -> AsyncGenerator[list[RawChunk | RawWarning], None]:
        """POST ``body`` with ``stream: true`` and yield the event objects of each
        network read as one list (never empty)."""
        payload = dict(body)
        payload["stream"] = True

        terminal = False
        error_event: dict[str, Any] | None = None
        try:
            async with aclosing(self._post_stream("/responses", payload, SSEParser())) as reads:
                async for events in reads:
                    out, done = self._sse_items(events, "type")
                    for item in out:
                        if type(item) is RawChunk:
                            kind = item.data.get("type")
                            if kind in TERMINAL_EVENTS:
                                terminal = True
                            elif kind == "error" and not terminal:
                                error_event = item.data
                    if out:
                        yield out
                    if done:
                        break
        except UpstreamError as exc:
            if not (terminal and exc.kind in ("upstream_disconnected", "upstream_timeout")):
                raise
            return  # the response was complete; only the connection's end was untidy
        if terminal:
            return
        if error_event is not None:
            kind = PREVIOUS_RESPONSE_NOT_FOUND if is_previous_response_error(error_event) else "upstream_error"
            raise self._stream_error(error_event, kind)
        raise self._error(
            "upstream_truncated",
            "upstream stream ended without response.completed, response.incomplete or response.failed",
        )

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` with ``stream: false`` and return the Response object."""
        payload = dict(body)
        payload["stream"] = False
        payload.pop("stream_options", None)  # only valid when streaming
        return await self._request_json("POST", "/responses", payload)

    async def list_models(self) -> list[dict[str, Any]]:
        """GET ``/models`` and return its ``data`` list."""
        result = await self._request_json("GET", "/models", None)
        data = result.get("data")
        if not isinstance(data, list):
            raise self._error("upstream_error", "upstream /models response has no 'data' list")
        return data
