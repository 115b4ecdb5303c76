"""Usage for model calls whose upstream reports none.

Some OpenAI-compatible servers (llama-cpp-python's, for one) ignore
``stream_options.include_usage`` and end a stream without a usage chunk. The
turn then records an estimate, counted with the adapters' ``TokenCounter``
(OpenAI's ``cl100k_base``) and marked ``"usage_estimated": true`` inside the
recorded usage, so that views and replays tell it from a reported one:

* prompt: OpenAI's published count for chat messages: 3 tokens per message,
  its role, name and text (text parts, tool calls' names and arguments), and 3
  for the reply's start; plus the JSON of the offered tools (their real cost
  depends on the model's chat template);
* completion: the call's text, reasoning and tool calls' names and arguments.

The estimate is part of the ``model.completed`` event, so a re-run (verify)
takes it from the log like any reported usage and never counts again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncGenerator, Iterable

from engine.fold.accumulator import USAGE_ESTIMATED
from engine.json_types import JsonObject, JsonValue
from engine.ports import ModelRequest, TokenCounter
from engine.protocols.model_events import Finished, ModelEvent, ReasoningDelta, TextDelta, TextRun, ToolCall, UsageReport

_PER_MESSAGE = 3
_PER_NAME = 1
_REPLY_START = 3


async def with_usage(batches: AsyncGenerator[list[ModelEvent], None], request: ModelRequest, counter: TokenCounter) -> AsyncGenerator[list[ModelEvent], None]:
    """The model stream's batches as they come, with an estimated usage on a
    ``Finished`` that has none when no ``UsageReport`` came before it."""
    said: list[str] = []
    reported = False
    try:
        async for events in batches:
            for i, event in enumerate(events):
                if isinstance(event, TextRun):
                    said.extend(event.texts)
                elif isinstance(event, (TextDelta, ReasoningDelta)):
                    said.append(event.text)
                elif isinstance(event, ToolCall):
                    said += (event.name, event.arguments)
                elif isinstance(event, UsageReport):
                    reported = True
                elif isinstance(event, Finished) and not reported and not event.usage:
                    usage = await asyncio.to_thread(estimate, counter, request, said)  # a long prompt takes milliseconds
                    events = [*events[:i], dataclasses.replace(event, usage=usage), *events[i + 1 :]]
                    break
            yield events
    finally:  # the upstream's response is closed as soon as the consumer leaves
        await batches.aclose()


def estimate(counter: TokenCounter, request: ModelRequest, said: Iterable[str]) -> JsonObject:
    """Chat Completions usage of one call, counted, marked as estimated."""
    prompt = prompt_tokens(counter, request)
    completion = counter.count("".join(said))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion, USAGE_ESTIMATED: True}


def prompt_tokens(counter: TokenCounter, request: ModelRequest) -> int:
    messages = request.input_items if request.previous_response_id else request.messages
    total = _REPLY_START
    for message in messages:
        total += _PER_MESSAGE + counter.count("".join(_message_texts(message)))
        if message.get("name"):
            total += _PER_NAME
    tools = request.params.get("tools")
    if tools:
        total += counter.count(json.dumps(tools, ensure_ascii=False))
    return total


def _message_texts(message: JsonObject) -> Iterable[str]:
    for key in ("role", "name"):
        value = message.get(key)
        if isinstance(value, str):
            yield value
    yield from _content_texts(message.get("content"))
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            yield str(function.get("name") or "")
            yield str(function.get("arguments") or "")
    # A Responses API input item (a stateful continuation): its call or output.
    for key in ("arguments", "output"):
        value = message.get(key)
        if isinstance(value, str):
            yield value


def _content_texts(content: JsonValue) -> Iterable[str]:
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            text = part.get("text") if isinstance(part, dict) else None
            if isinstance(text, str):
                yield text
