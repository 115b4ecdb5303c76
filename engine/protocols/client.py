"""Calling the model: from the canonical transcript to normalized model events.

The transcript of a turn is kept as Chat Completions messages. For each call
this module builds the wire body of the model's API (Chat Completions, Responses
API, Ollama), streams it through the provider's transport and folds what comes
back with the protocol's pure normalizer. The turn actor sees only
``engine.protocols.model_events``; ``verify`` uses another ``engine.ports.ModelClient``
that replays the recorded events.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from engine.protocols.chat import ChatNormalizer
from engine.protocols.model_events import ModelEvent, StreamWarning
from engine.protocols.ollama import OllamaNormalizer, ollama_messages
from engine.protocols.responses import ResponsesNormalizer, responses_body, to_responses_input
from engine.ports import IdFactory, ModelRequest, RawWarning, ResolvedModel, UpstreamError

# Parameters an Ollama request takes at the top level; the rest go to ``options``.
OLLAMA_TOP_LEVEL = frozenset({"tools", "format", "keep_alive", "think"})


def chat_body(resolved: ResolvedModel, request: ModelRequest) -> dict[str, Any]:
    messages = list(request.messages)
    if request.prefill:
        # Providers that continue an assistant prefill go on from it, so a
        # resumed turn generates nothing twice.
        messages.append({"role": "assistant", "content": request.prefill})
    return {**request.params, "model": resolved.upstream_model, "messages": messages, "stream": True}


def build_body(resolved: ResolvedModel, request: ModelRequest) -> dict[str, Any]:
    """The wire body for the model's API."""
    api = resolved.api
    body = chat_body(resolved, request)
    if api == "chat":
        return body
    if api == "responses":
        out = responses_body(body)
        out.pop("messages", None)
        instructions, items = to_responses_input(body["messages"])
        if instructions:
            out["instructions"] = instructions
        if request.previous_response_id:
            out["previous_response_id"] = request.previous_response_id
            out["input"] = request.input_items
        else:
            out["input"] = items
        out["stream"] = True
        return out
    if api == "ollama":
        params = dict(request.params)
        top = {k: params.pop(k) for k in list(params) if k in OLLAMA_TOP_LEVEL}
        params.pop("stream_options", None)
        options = params.pop("options", {}) or {}
        if "max_tokens" in params:
            params["num_predict"] = params.pop("max_tokens")
        out = {
            "model": resolved.upstream_model,
            "messages": ollama_messages(body["messages"]),
            "stream": True,
            **top,
        }
        merged = {**params, **options}
        if merged:
            out["options"] = merged
        return out
    raise ValueError(f"unknown model API {api!r}")


class LiveModelClient:
    """Calls the real upstream through the resolved provider's transport."""

    async def stream(self, resolved: ResolvedModel, request: ModelRequest, id_factory: IdFactory) -> AsyncGenerator[list[ModelEvent], None]:
        if resolved.provider is None:
            raise UpstreamError(f"model {resolved.upstream_model!r} has no upstream", "model_not_found")
        api = resolved.api
        normalizer: ChatNormalizer | ResponsesNormalizer | OllamaNormalizer
        if api == "chat":
            normalizer = ChatNormalizer(id_factory)
        elif api == "responses":
            normalizer = ResponsesNormalizer(id_factory)
        else:
            normalizer = OllamaNormalizer(id_factory)
        body = build_body(resolved, request)
        async with aclosing(resolved.provider.stream_batches(body)) as reads:
            async for raws in reads:
                events: list[ModelEvent] = []
                for raw in raws:
                    if isinstance(raw, RawWarning):
                        events.append(StreamWarning(raw.message, raw.raw))
                    else:
                        events.extend(normalizer.feed(raw.data))
                if events:
                    yield events
        tail = normalizer.finish()
        if tail:
            yield list(tail)

