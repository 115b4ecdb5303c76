"""Ollama's native chat API (``POST /api/chat``): messages, request body, normalizer.

Ollama speaks its own protocol besides its OpenAI-compatible endpoint: the
request takes ``messages`` whose content is a plain string with images as
base64 in ``images``, assistant ``tool_calls`` whose ``function.arguments``
is an object (not a JSON string), ``thinking`` for reasoning, and sampling
parameters under ``options`` (``num_predict`` for ``max_tokens``) beside a
few top-level ones (``tools``, ``format``, ``keep_alive``, ``think``). The
response streams newline-delimited JSON objects, each with a ``message``
fragment, the last with ``done: true``, the reason and token counts.

This module is everything specific to it: :func:`ollama_messages` (Chat
messages → Ollama messages), :func:`request_body` (the wire body, with the
``options`` mapping) and :class:`OllamaNormalizer` (NDJSON lines →
``engine.protocols.model_events``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from engine.json_types import JsonObject, JsonValue
from engine.ports import ModelRequest, RawChunk, RawRun, RawWarning, ResolvedModel
from engine.protocols.common import (
    CallIds,
    IdFactory,
    Message,
    arguments_text,
    error_message,
    feed_each,
    image_url,
    is_image_part,
    is_text_part,
    json_object,
    named_calls,
    nonempty_str,
    outgoing_messages,
)
from engine.protocols.model_events import Finished, ModelEvent, ReasoningDelta, StreamFailed, TextDelta, ToolCall
from engine.protocols.shapes import json_list, list_of, mapping_of

__all__ = ["OLLAMA_TOP_LEVEL", "OllamaNormalizer", "ollama_messages", "request_body"]

#: Parameters an Ollama request takes at the top level; the rest go to ``options``.
OLLAMA_TOP_LEVEL: Final[frozenset[str]] = frozenset({"tools", "format", "keep_alive", "think"})


def request_body(resolved: ResolvedModel, request: ModelRequest) -> JsonObject:
    """The ``/api/chat`` body: the transcript as Ollama messages, the top-level
    parameters, and every other parameter under ``options`` (``max_tokens`` →
    ``num_predict``; ``stream_options`` dropped; the request's own
    ``options`` win)."""
    params = dict(request.params)
    top = {k: params.pop(k) for k in list(params) if k in OLLAMA_TOP_LEVEL}
    params.pop("stream_options", None)
    options = mapping_of(params.pop("options", None))
    if "max_tokens" in params:
        params["num_predict"] = params.pop("max_tokens")
    out: JsonObject = {
        "model": resolved.upstream_model,
        "messages": json_list(ollama_messages(outgoing_messages(request))),
        "stream": True,
        **top,
    }
    merged = {**params, **(options if isinstance(options, dict) else {})}
    if merged:
        out["options"] = merged
    return out


# --------------------------------------------------------------------------
# Chat Completions messages → Ollama /api/chat messages
# --------------------------------------------------------------------------


def _base64_of(url: str) -> str | None:
    """The base64 payload of a ``data:`` URL. Ollama takes only inline base64;
    remote URLs cannot be sent (this module does no I/O) and are skipped."""
    if not url.startswith("data:"):
        return None
    header, sep, payload = url.partition(",")
    if not sep or ";base64" not in header:
        return None
    return payload


def _ollama_content(content: object) -> tuple[str, list[JsonValue]]:
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        return "", []
    texts: list[str] = []
    images: list[JsonValue] = []
    for part in content:
        if is_text_part(part):
            if part.get("text"):
                texts.append(part["text"])
        elif is_image_part(part):
            url = image_url(part)
            data = _base64_of(url) if url else None
            if data:
                images.append(data)
    return "\n".join(texts), images


def ollama_messages(messages: Sequence[Mapping[str, JsonValue]]) -> list[Message]:
    """Chat messages → Ollama ``/api/chat`` messages.

    Content is a string (text parts joined with ``\\n``) and images go to
    ``images`` as base64 (``data:`` URLs only); assistant ``tool_calls`` carry
    ``function.arguments`` as OBJECTS (invalid JSON → ``{}``);
    ``reasoning_content``/``thinking`` become ``thinking``; tool results are
    ``role: tool`` with ``tool_name`` when the call is known.
    """
    names: dict[JsonValue, JsonValue] = {}
    out: list[Message] = []
    for message in messages:
        role = message.get("role")
        text, images = _ollama_content(message.get("content"))
        msg: Message = {"role": role, "content": text}
        if images:
            msg["images"] = images
        if role == "assistant":
            thinking = message.get("thinking") or message.get("reasoning_content")
            if thinking:
                msg["thinking"] = thinking
            calls: list[JsonValue] = []
            for call in list_of(message.get("tool_calls")):
                if not isinstance(call, Mapping):
                    continue
                fn = mapping_of(call.get("function"))
                name = fn.get("name") or ""
                names[call.get("id")] = name
                calls.append({"function": {"name": name, "arguments": json_object(fn.get("arguments")) or {}}})
            if calls:
                msg["tool_calls"] = calls
        elif role == "tool":
            tool_name = message.get("tool_name") or message.get("name") or names.get(message.get("tool_call_id"))
            if tool_name:
                msg["tool_name"] = tool_name
        out.append(msg)
    return out


# --------------------------------------------------------------------------
# NDJSON lines → model events
# --------------------------------------------------------------------------


class OllamaNormalizer:
    """Ollama ``/api/chat`` NDJSON objects → model events.

    ``message.thinking`` → ``ReasoningDelta``, ``message.content`` →
    ``TextDelta`` (in that order), each of ``message.tool_calls`` (they arrive
    whole; ``function.arguments`` is an object and is JSON-serialized) →
    ``ToolCall`` with the provider's ``id`` when it sends a new one, else
    ``id_factory("call")``. ``done: true`` → ``Finished(reason="tool_calls" if
    any call arrived, else done_reason ("stop" when missing), usage=
    {prompt_tokens, completion_tokens, total_tokens} from prompt_eval_count /
    eval_count, or None when neither is present)``. An ``error`` key →
    ``StreamFailed``. After ``done`` or an error, further lines are ignored;
    ``finish`` then returns nothing. A stream that ended without either gets
    ``Finished(reason="tool_calls" or None, status=None)`` from ``finish``.
    """

    def __init__(self, id_factory: IdFactory, *, reserved_ids: Iterable[str] = ()) -> None:
        self._ids = CallIds(id_factory, reserved_ids)
        self._tool_calls = 0
        self._terminal = False
        self._finished = False

    def feed(self, obj: object) -> list[ModelEvent]:
        if self._finished:
            raise RuntimeError("OllamaNormalizer is finished; no more lines are accepted")
        if not isinstance(obj, dict) or self._terminal:
            return []
        error = obj.get("error")
        if error:
            self._terminal = True
            details = copy.deepcopy(error) if isinstance(error, dict) else {"error": error}
            return [StreamFailed(message=error_message(error), details=details)]
        events: list[ModelEvent] = []
        message = obj.get("message")
        if isinstance(message, dict):
            thinking = message.get("thinking")
            if isinstance(thinking, str) and thinking:
                events.append(ReasoningDelta(thinking))
            content = message.get("content")
            if isinstance(content, str) and content:
                events.append(TextDelta(content))
            tool_calls = message.get("tool_calls")
            for raw in tool_calls if isinstance(tool_calls, list) else []:
                if not isinstance(raw, dict):
                    continue
                function = raw.get("function")
                function = function if isinstance(function, dict) else {}
                provider_id = nonempty_str(raw.get("id"))
                call_id = self._ids.take(provider_id)
                name = function.get("name")
                call = ToolCall(
                    call_id=call_id,
                    name=name if isinstance(name, str) else "",
                    arguments=arguments_text(function.get("arguments")),
                    item_id=call_id,
                    provider_id=self._ids.replaced(provider_id, call_id),
                )
                named, warnings = named_calls([call])
                events.extend(named or warnings)
                self._tool_calls += len(named)
        if obj.get("done") is True:
            self._terminal = True
            events.append(Finished(reason=self._reason(obj.get("done_reason")), usage=_ollama_usage(obj)))
        return events

    def feed_read(self, raws: list[RawChunk | RawWarning | RawRun], *, runs: bool = False) -> list[ModelEvent]:
        return feed_each(self, raws)

    def finish(self) -> list[ModelEvent]:
        if self._finished:
            return []
        self._finished = True
        if self._terminal:
            return []
        return [Finished(reason="tool_calls" if self._tool_calls else None, status=None)]

    def _reason(self, done_reason: object) -> str:
        if self._tool_calls:
            return "tool_calls"
        return done_reason if isinstance(done_reason, str) and done_reason else "stop"


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


def _ollama_usage(obj: Mapping[str, object]) -> JsonObject | None:
    prompt, completion = _count(obj.get("prompt_eval_count")), _count(obj.get("eval_count"))
    if prompt is None and completion is None:
        return None
    prompt, completion = prompt or 0, completion or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
