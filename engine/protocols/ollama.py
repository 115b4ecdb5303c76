"""Ollama's native chat API (``POST /api/chat``): NDJSON lines → model events.

Ollama speaks its own protocol besides its OpenAI-compatible endpoint. The
response streams newline-delimited JSON objects, each with a ``message``
fragment (``thinking``, ``content``, whole ``tool_calls`` whose
``function.arguments`` is an object), the last with ``done: true``, the
reason and token counts. :class:`OllamaNormalizer` turns them into
``engine.protocols.model_events``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from engine.protocols.common import CallIds, IdFactory, arguments_text, error_message, nonempty_str
from engine.protocols.model_events import Finished, ModelEvent, ReasoningDelta, StreamFailed, TextDelta, ToolCall

__all__ = ["OllamaNormalizer"]

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

    def feed(self, obj: Any) -> list[ModelEvent]:
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
                call_id = self._ids.take(nonempty_str(raw.get("id")))
                name = function.get("name")
                events.append(
                    ToolCall(
                        call_id=call_id,
                        name=name if isinstance(name, str) else "",
                        arguments=arguments_text(function.get("arguments")),
                        item_id=call_id,
                    )
                )
                self._tool_calls += 1
        if obj.get("done") is True:
            self._terminal = True
            events.append(Finished(reason=self._reason(obj.get("done_reason")), usage=_ollama_usage(obj)))
        return events

    def finish(self) -> list[ModelEvent]:
        if self._finished:
            return []
        self._finished = True
        if self._terminal:
            return []
        return [Finished(reason="tool_calls" if self._tool_calls else None, status=None)]

    def _reason(self, done_reason: Any) -> str:
        if self._tool_calls:
            return "tool_calls"
        return done_reason if isinstance(done_reason, str) and done_reason else "stop"


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


def _ollama_usage(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    prompt, completion = _count(obj.get("prompt_eval_count")), _count(obj.get("eval_count"))
    if prompt is None and completion is None:
        return None
    prompt, completion = prompt or 0, completion or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
