"""Calling the model: from the canonical transcript to normalized model events.

The transcript of a turn is kept as Chat Completions messages. For each call
this module picks the model API's protocol module (``chat``, ``responses``,
``ollama``) from :data:`PROTOCOLS`, builds the wire body with it, streams the
body through the provider's transport and folds what comes back with the
protocol's pure normalizer. The turn actor sees only
``engine.protocols.model_events``; ``verify`` uses another ``engine.ports.ModelClient``
that replays the recorded events.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Final

from engine.json_types import JsonObject
from engine.ports import IdFactory, ModelApi, ModelRequest, ResolvedModel, UpstreamError
from engine.protocols import chat, ollama, responses
from engine.protocols.common import Normalizer, call_ids_of
from engine.protocols.model_events import ModelEvent


@dataclass(frozen=True, slots=True)
class WireProtocol:
    """What calling a model over one API takes: a fresh normalizer per call
    (``normalizer(id_factory, reserved_ids=…)``) and the wire body (``body(resolved, request)``)."""

    normalizer: Callable[..., Normalizer]
    body: Callable[[ResolvedModel, ModelRequest], JsonObject]


#: The protocol module of each model API (``ResolvedModel.api``).
PROTOCOLS: Final[Mapping[ModelApi, WireProtocol]] = {
    "chat": WireProtocol(chat.ChatNormalizer, chat.request_body),
    "responses": WireProtocol(responses.ResponsesNormalizer, responses.request_body),
    "ollama": WireProtocol(ollama.OllamaNormalizer, ollama.request_body),
}


def protocol_for(api: ModelApi) -> WireProtocol:
    protocol = PROTOCOLS.get(api)
    if protocol is None:
        raise ValueError(f"unknown model API {api!r}")
    return protocol


def build_body(resolved: ResolvedModel, request: ModelRequest) -> JsonObject:
    """The wire body for the model's API."""
    return protocol_for(resolved.api).body(resolved, request)


class LiveModelClient:
    """Calls the real upstream through the resolved provider's transport."""

    async def stream(
        self, resolved: ResolvedModel, request: ModelRequest, id_factory: IdFactory, *, runs: bool = False
    ) -> AsyncGenerator[list[ModelEvent], None]:
        if resolved.provider is None:
            raise UpstreamError(f"model {resolved.upstream_model!r} has no upstream", "model_not_found")
        protocol = protocol_for(resolved.api)
        # A provider id the transcript already uses (providers that number
        # calls per response: call_0 every round) is replaced by a fresh one.
        normalizer = protocol.normalizer(id_factory, reserved_ids=call_ids_of(request.messages))
        async with aclosing(resolved.provider.stream_runs(protocol.body(resolved, request))) as reads:
            async for raws in reads:
                events = normalizer.feed_read(raws, runs=runs)
                if events:
                    yield events
        tail = normalizer.finish()
        if tail:
            yield list(tail)
