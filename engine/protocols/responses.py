"""The OpenAI Responses API (``POST /v1/responses``): body, input items, reasoning items, normalizer.

The Responses API is OpenAI's newer protocol. The request carries
``instructions`` and typed ``input`` items (``message``, ``function_call``,
``function_call_output``, ``reasoning``) instead of ``messages``; function
tools are flat; the provider can keep the response (``store``) so that a
continuation sends only ``previous_response_id`` and the new items. The
streamed response is SSE events typed ``response.*`` (some 59 kinds), with
output items carrying their own ids (``fc_…``, ``rs_…``), and reasoning items
whose ``encrypted_content`` the provider can take back.

This module is everything specific to it, so the engine's transcript stays
Chat Completions messages (``engine.protocols.history``) and only this module
knows the Responses shapes:

* :func:`request_body` — the wire body of a call: the Chat Completions body
  (``engine.protocols.chat``) mapped by :func:`responses_body` /
  :func:`to_responses_input`, or, for a stateful continuation, the
  ``previous_response_id`` and the items of :func:`stateful_continuation_input`
  (only the round's new tool outputs);
* reasoning items the provider takes back: :func:`has_provider_reasoning`,
  :func:`responses_reasoning_item`, :func:`is_local_id` — used by
  ``history`` for the ``"responses"`` reasoning format, whose
  ``responses_items`` :func:`to_responses_input` replays. A Responses API
  reasoning item the provider can take back has ``encrypted_content`` or a
  provider id (``rs_…``). The ids of the message / function_call items that
  follow it are replayed too, unless they are turnlog-made ids
  (:func:`is_local_id`): the API pairs a reasoning item with its following
  item by id, so the stream layer should keep the provider's item ids for an
  exact replay;
* :class:`ResponsesNormalizer` — streaming events →
  ``engine.protocols.model_events``.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from engine.json_types import JsonObject, JsonValue
from engine.ports import ModelRequest, RawChunk, RawRun, RawWarning, ResolvedModel
from engine.protocols import chat
from engine.protocols.common import (
    CallIds,
    IdFactory,
    arguments_text,
    error_message,
    feed_each,
    image_url,
    int_index,
    is_image_part,
    is_text_part,
    named_calls,
    nonempty_str,
    object_string,
    split_tool_calls,
)
from engine.protocols.model_events import (
    Finished,
    ModelEvent,
    ProviderItem,
    ReasoningDelta,
    ResponseStarted,
    StreamFailed,
    StreamWarning,
    TextDelta,
    ToolArgumentsDelta,
    ToolCall,
    ToolCallStarted,
)
from engine.protocols.shapes import Item, json_list, list_of, mapping_of

__all__ = [
    "RESPONSES_DROPPED_KEYS",
    "ResponsesNormalizer",
    "has_provider_reasoning",
    "is_local_id",
    "request_body",
    "responses_body",
    "responses_reasoning_item",
    "stateful_continuation_input",
    "to_responses_input",
    "tool_output_value",
]

#: Chat Completions body keys the Responses API does not take.
RESPONSES_DROPPED_KEYS = frozenset({"stream_options", "logit_bias", "frequency_penalty", "presence_penalty", "stop", "messages"})


def request_body(resolved: ResolvedModel, request: ModelRequest) -> JsonObject:
    """The Responses API body of a call: the Chat Completions body mapped by
    :func:`responses_body`; a stateful continuation (``previous_response_id``)
    sends the request's ``input_items`` instead of the transcript."""
    out = responses_body(chat.request_body(resolved, request))  # input as the body's ``store`` allows
    if out.get("instructions") == "":
        del out["instructions"]
    if request.previous_response_id:
        out["previous_response_id"] = request.previous_response_id
        out["input"] = json_list(request.input_items)
    out["stream"] = True
    return out


# --------------------------------------------------------------------------
# Chat Completions → Responses API
# --------------------------------------------------------------------------


def _input_image(part: Mapping[str, JsonValue]) -> Item | None:
    url = image_url(part)
    if url is None:
        return None
    detail = part.get("detail")
    if detail is None and isinstance(image := part.get("image_url"), Mapping):
        detail = image.get("detail")
    return {"type": "input_image", "image_url": url, "detail": detail or "auto"}


def _input_parts(content: JsonValue) -> list[JsonValue]:
    """User/developer content → Responses input content parts."""
    if content is None:
        return [{"type": "input_text", "text": ""}]
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    parts: list[JsonValue] = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        file = part.get("file")
        if kind in ("text", "input_text", "output_text"):
            parts.append({"type": "input_text", "text": part.get("text") or ""})
        elif kind in ("image_url", "input_image"):
            image = _input_image(part)
            if image is not None:
                parts.append(image)
        elif kind == "file" and isinstance(file, Mapping):
            parts.append({"type": "input_file", **{k: v for k, v in file.items() if v is not None}})
        else:
            parts.append(dict(part))  # already a Responses part (input_file, input_audio…)
    return parts or [{"type": "input_text", "text": ""}]


def _assistant_text(content: JsonValue) -> str:
    """String content, or the non-empty text parts of list content joined with ``\n``."""
    if isinstance(content, list):
        return "\n".join(text for part in content if isinstance(part, dict) and is_text_part(part) and isinstance(text := part.get("text"), str) and text)
    return content if isinstance(content, str) else ""


def _part_text(part: JsonValue) -> str:
    """The text of a content part; ``""`` when it has none."""
    text = part.get("text") if isinstance(part, Mapping) else None
    return text if isinstance(text, str) else ""


def tool_output_value(content: JsonValue) -> str | list[JsonValue]:
    """A tool result as a Responses ``function_call_output.output``: a string,
    or a list of ``input_text``/``input_image`` parts when there are images."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return "" if content is None else json.dumps(content, ensure_ascii=False)
    if not any(is_image_part(p) for p in content):
        return "\n".join(_part_text(p) for p in content if is_text_part(p))
    parts: list[JsonValue] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if is_text_part(part):
            parts.append({"type": "input_text", "text": part.get("text") or ""})
        elif is_image_part(part):
            image = _input_image(part)
            if image is not None:
                parts.append(image)
    return parts


def _strip_ids(item: Item) -> Item:
    return {k: v for k, v in item.items() if k not in ("id", "status")}


def _replay_items(message: Mapping[str, JsonValue], store: bool) -> list[Item]:
    """An assistant message's kept Responses items (``responses`` reasoning
    format), filtered to its surviving tool calls; a reasoning item must be
    immediately followed by the item it belongs to or it is dropped."""
    calls = {c.get("id"): c for c in list_of(message.get("tool_calls")) if isinstance(c, Mapping)}
    items: list[Item] = []
    for raw_item in list_of(message.get("responses_items")):
        if not isinstance(raw_item, Mapping):
            continue
        item = dict(raw_item)
        if item.get("type") == "function_call":
            if item.get("call_id") not in calls:
                continue
            calls.pop(item.get("call_id"))
        if item.get("type") == "reasoning" and not store and not item.get("encrypted_content"):
            continue  # only resolvable from the provider's store
        items.append(item if store else _strip_ids(item))
    # Calls the kept items do not cover (should not happen) are derived.
    for call_id, call in calls.items():
        fn = mapping_of(call.get("function"))
        items.append(
            {
                "type": "function_call",
                "call_id": call_id,
                "name": fn.get("name") or "",
                "arguments": object_string(fn.get("arguments")) or "{}",
            }
        )
    paired: list[Item] = []
    for index, item in enumerate(items):
        if item.get("type") == "reasoning":
            following = items[index + 1] if index + 1 < len(items) else None
            if following is None or following.get("type") not in ("message", "function_call"):
                continue
        paired.append(item)
    return paired


def to_responses_input(messages: Iterable[JsonValue], *, store: bool = True) -> tuple[str | None, list[Item]]:
    """Chat messages → (``instructions``, Responses ``input`` items).

    * system → ``instructions`` (the LAST system message wins; list content: its
      text parts joined with ``\\n``);
    * user / developer → ``message`` with ``input_text`` / ``input_image
      {image_url, detail}`` (``detail`` defaults to ``"auto"``; a detail given on
      the Chat part is kept) / ``input_file`` parts;
    * assistant → an optional ``message`` with an ``output_text`` part (when it
      has text), followed by one ``function_call {call_id, name, arguments}``
      per tool call; an assistant message carrying ``responses_items``
      (reasoning format ``"responses"``) replays those items instead, in their
      original order, reasoning included;
    * tool → ``function_call_output {call_id, output}``.

    ``store=False`` (the provider keeps nothing): reasoning items without
    ``encrypted_content`` are dropped and item ids are removed, since nothing
    can be looked up by id.
    """
    instructions: str | None = None
    items: list[Item] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        content = message.get("content")
        if role == "system":
            instructions = _assistant_text(content)
        elif role in ("user", "developer"):
            items.append({"type": "message", "role": role, "content": _input_parts(content)})
        elif role == "assistant":
            if message.get("responses_items"):
                items.extend(_replay_items(message, store))
                continue
            text = _assistant_text(content)
            if text:
                items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]})
            for call in list_of(message.get("tool_calls")):
                if not isinstance(call, Mapping):
                    continue
                fn = mapping_of(call.get("function"))
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call.get("id"),
                        "name": fn.get("name") or "",
                        "arguments": object_string(fn.get("arguments")) or "{}",
                    }
                )
        elif role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.get("tool_call_id"),
                    "output": tool_output_value(content),
                }
            )
    return instructions, items


def _responses_tool(tool: JsonValue) -> JsonValue:
    fn = tool.get("function") if isinstance(tool, Mapping) else None
    if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(fn, Mapping):
        return tool  # already flat, or a hosted tool (web_search, file_search…)
    out: JsonObject = {"type": "function", "name": fn.get("name")}
    if fn.get("description") is not None:
        out["description"] = fn["description"]
    out["parameters"] = fn.get("parameters") or {"type": "object", "properties": {}}
    out["strict"] = fn["strict"] if isinstance(fn.get("strict"), bool) else False
    return out


def _responses_tool_choice(choice: JsonValue) -> JsonValue:
    if isinstance(choice, Mapping) and choice.get("type") == "function" and isinstance(fn := choice.get("function"), Mapping):
        return {"type": "function", "name": fn.get("name")}
    return choice


def _responses_text_format(response_format: JsonValue) -> JsonObject | None:
    if not isinstance(response_format, Mapping):
        return None
    kind = response_format.get("type")
    if kind == "json_schema" and isinstance(schema := response_format.get("json_schema"), Mapping):
        return {"type": "json_schema", **schema}
    if kind in ("json_object", "text"):
        return {"type": kind}
    return None


def responses_body(chat_body: Mapping[str, JsonValue], *, store: bool | None = None) -> JsonObject:
    """A Chat Completions request body as a Responses API body.

    ``messages`` → ``instructions`` + ``input`` (``to_responses_input``);
    ``max_tokens``/``max_completion_tokens`` → ``max_output_tokens`` (the latter
    wins); ``stream_options, logit_bias, frequency_penalty, presence_penalty,
    stop`` are dropped; function tools are flattened to ``{type:"function", name,
    description, parameters, strict}`` (``strict`` false unless the tool sets it);
    a forced ``tool_choice`` becomes ``{type:"function", name}``. Beyond Open
    WebUI: ``response_format`` → ``text.format`` and ``reasoning_effort`` →
    ``reasoning.effort`` (the Responses API rejects the Chat spellings). Other
    keys pass through. ``store`` defaults to the body's ``store`` (the
    provider's default, true, when absent) and steers ``to_responses_input``.
    """
    if store is None:
        store = chat_body.get("store") is not False
    body: JsonObject = {}
    for key, value in chat_body.items():
        if key in RESPONSES_DROPPED_KEYS or key in ("max_tokens", "max_completion_tokens"):
            continue
        if key == "tools" and isinstance(value, list):
            body["tools"] = [_responses_tool(t) for t in value]
        elif key == "tool_choice":
            body["tool_choice"] = _responses_tool_choice(value)
        elif key == "response_format":
            text_format = _responses_text_format(value)
            if text_format is not None:
                body["text"] = {**mapping_of(chat_body.get("text")), "format": text_format}
        elif key == "reasoning_effort":
            if value is not None:
                body["reasoning"] = {**mapping_of(chat_body.get("reasoning")), "effort": value}
        else:
            body.setdefault(key, value)
    limit = chat_body.get("max_completion_tokens", chat_body.get("max_tokens"))
    if limit is not None:
        body["max_output_tokens"] = limit
    if "messages" in chat_body:
        instructions, items = to_responses_input(list_of(chat_body.get("messages")), store=store)
        if instructions is not None:
            body["instructions"] = instructions
        body["input"] = json_list(items)
    return body


def stateful_continuation_input(round_output: Sequence[Mapping[str, JsonValue]]) -> list[JsonObject]:
    """The ``input`` of a stateful tool-loop continuation (``previous_response_id``).

    Only the round's new ``function_call_output`` items (Open WebUI also
    re-sends the round's assistant text and calls, which the provider already
    stores under ``previous_response_id``), in output order, one per call. An
    output is sent only when its call is a ``function_call`` of the same round
    (the provider's response knows nothing else); the ``instructions`` are the
    caller's to set. A call whose id turnlog replaced answers under the
    provider's (``provider_call_id``); the pieces of a split call (glued JSON) share
    it, and their results go back joined, as the one output of that call.
    """
    # The provider knows its own call id, where turnlog replaced it.
    calls = {
        call_id: provider if isinstance(provider := item.get("provider_call_id"), str) and provider else call_id
        for item in round_output
        if isinstance(item, Mapping) and item.get("type") == "function_call" and isinstance(call_id := item.get("call_id"), str) and call_id
    }
    outputs: dict[str, str | list[JsonValue]] = {}  # by the provider's call id
    seen: set[str] = set()
    for item in round_output:
        if not isinstance(item, Mapping) or item.get("type") != "function_call_output":
            continue
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or call_id not in calls or call_id in seen:
            continue
        seen.add(call_id)
        output = tool_output_value(item.get("output"))
        known = outputs.get(calls[call_id])
        # A piece of a split call: the provider's one call gets every piece's result.
        outputs[calls[call_id]] = output if known is None else _joined_output(known, output)
    return [{"type": "function_call_output", "call_id": call_id, "output": output} for call_id, output in outputs.items()]


def _joined_output(first: str | list[JsonValue], second: str | list[JsonValue]) -> str | list[JsonValue]:
    if isinstance(first, str) and isinstance(second, str):
        return f"{first}\n{second}"
    parts: list[JsonValue] = [{"type": "input_text", "text": first}] if isinstance(first, str) else list(first)
    return parts + ([{"type": "input_text", "text": second}] if isinstance(second, str) else list(second))


# --------------------------------------------------------------------------
# Reasoning items the provider takes back
# --------------------------------------------------------------------------


_LOCAL_ID = re.compile(r"(?:msg|r|fc|fco|ci|cc|call)_[0-9a-f]{24}")


def is_local_id(value: object) -> bool:
    """An id turnlog made itself (``prefix_`` + 24 hex), as opposed to
    a provider's item id (OpenAI's are longer), which a stored-response replay
    may reference."""
    return isinstance(value, str) and _LOCAL_ID.fullmatch(value) is not None


def has_provider_reasoning(item: Mapping[str, object]) -> bool:
    """A reasoning item the provider can take back: it has
    ``encrypted_content`` or a provider id (``rs_…``)."""
    if item.get("type") != "reasoning":
        return False
    if isinstance(item.get("provider_item"), Mapping):  # kept by the turn's fold
        return True
    item_id = item.get("id")
    return bool(item.get("encrypted_content")) or (isinstance(item_id, str) and item_id.startswith("rs_"))


def responses_reasoning_item(item: Mapping[str, JsonValue]) -> Item:
    """A stored reasoning item as a Responses API input item (only the fields the
    API takes back: ``id``, ``summary``, ``encrypted_content``). A reasoning
    item of the turn's output carries the provider's as ``provider_item``."""
    kept = item.get("provider_item")
    if isinstance(kept, Mapping):
        return dict(kept)
    summary: list[JsonValue] = [{"type": "summary_text", "text": s.get("text") or ""} for s in list_of(item.get("summary")) if isinstance(s, Mapping)]
    out: Item = {"type": "reasoning", "summary": summary}
    if isinstance(item_id := item.get("id"), str) and item_id.startswith("rs_"):
        out["id"] = item_id
    if item.get("encrypted_content"):
        out["encrypted_content"] = item["encrypted_content"]
    return out


# --------------------------------------------------------------------------
# Streaming events → model events
# --------------------------------------------------------------------------

_LIFECYCLE_START: Final[frozenset[str]] = frozenset({"response.created", "response.queued", "response.in_progress"})
_TEXT_DELTAS: Final[frozenset[str]] = frozenset({"response.output_text.delta", "response.refusal.delta"})
_REASONING_DELTAS: Final[frozenset[str]] = frozenset({"response.reasoning_text.delta", "response.reasoning_summary_text.delta"})
#: Message content parts that are the visible answer (the same text as the
#: ``output_text``/``refusal`` deltas), and the key holding their text.
_VISIBLE_PARTS: Final[dict[object, str]] = {"output_text": "text", "text": "text", "refusal": "refusal"}
#: ``incomplete_details.reason`` → Chat Completions finish reason.
_INCOMPLETE_REASONS: Final[dict[str, str]] = {"max_output_tokens": "length", "content_filter": "content_filter"}


@dataclass(slots=True)
class _ResponsesCall:
    item_id: str | None
    output_index: int | None
    call_id: str | None = None
    provider_call_id: str | None = None
    name: str = ""
    deltas: list[str] = field(default_factory=list)
    final_arguments: str | None = None
    announced: bool = False
    emitted: bool = False

    @property
    def arguments(self) -> str:
        return self.final_arguments if self.final_arguments is not None else "".join(self.deltas)


class ResponsesNormalizer:
    """Responses API streaming events → model events.

    * ``response.created`` / ``queued`` / ``in_progress`` → ``ResponseStarted``
      (once, when the response has an id).
    * ``response.output_text.delta`` → ``TextDelta``; also
      ``response.refusal.delta`` (a refusal is the visible answer).
    * ``response.reasoning_text.delta`` / ``reasoning_summary_text.delta`` →
      ``ReasoningDelta``. When a new reasoning part or item starts after
      earlier reasoning text, its first delta is prefixed with ``"\\n\\n"`` so
      summary paragraphs do not run together.
      A delta's event type says what it is: unlike Open WebUI's fold, a text
      delta whose ``output_index`` names a reasoning item (or the reverse) is
      not dropped.
    * ``response.output_item.added`` of a ``function_call`` → ``ToolCallStarted``,
      its ``function_call_arguments.delta`` → ``ToolArgumentsDelta``;
      its ``output_item.done`` → ``ToolCall`` (the done item is authoritative;
      ``item_id`` = the item's ``fc_…`` id). A call is emitted once.
    * ``response.output_item.done`` of a ``reasoning`` item → ``ProviderItem``
      (a deep copy), so encrypted reasoning can be replayed.
    * ``response.completed`` and ``response.incomplete``: the final
      ``response.output`` wins over the stream where the stream lacks
      something (as in Open WebUI's fold): a ``reasoning`` item never
      sent → ``ProviderItem``; message text (``output_text``/``refusal``
      parts, in order) that continues the streamed text → a ``TextDelta`` with
      the rest (a server that puts text only in done events or in the final
      output would otherwise give an empty answer); text that contradicts the
      streamed text → ``StreamWarning`` (what was streamed cannot be taken
      back). An empty or missing final output changes nothing.
    * ``response.completed`` → then any ``function_call`` in the final
      ``response.output`` not yet emitted, then any call that was started but
      never done (arguments from ``function_call_arguments.done``, else the
      concatenated deltas), then ``Finished(reason="tool_calls" if any
      ToolCall was emitted for this response else "stop", status="completed")``.
    * ``response.incomplete`` → then ``Finished(reason="length"`` for
      ``max_output_tokens`` (``content_filter`` kept, other reasons verbatim,
      missing → ``"length"``), ``status="incomplete")``. Unfinished calls are
      not emitted: their arguments were cut off.
    * ``response.failed`` → ``StreamFailed(response.error.message, code, details=error)``;
      a top-level ``error`` event → ``StreamFailed`` with the event as details.
    * Everything else (the API has ~59 event types) → nothing.

    After a terminal event (completed/incomplete/failed/error) further events
    are ignored. ``finish`` after a terminal event returns nothing; after a
    stream that ended without one it returns the calls started but not
    emitted and a ``Finished`` with ``status=None`` (reason ``"tool_calls"``
    if any call was emitted, else ``None``): the caller can tell a truncated
    stream by ``status is None``. Usage arrives only in ``Finished.usage``
    (the provider's dict as sent); no ``UsageReport`` is emitted.
    """

    def __init__(self, id_factory: IdFactory, *, reserved_ids: Iterable[str] = ()) -> None:
        self._id_factory = id_factory
        self._ids = CallIds(id_factory, reserved_ids)
        self.response_id: str | None = None
        self._started = False
        self._calls: list[_ResponsesCall] = []
        self._tool_calls_emitted = 0
        self._reasoning_key: tuple[JsonValue, str, int] | None = None
        self._reasoning_seen = False
        self._text: list[str] = []  # every TextDelta so far, to check the final output against
        self._items_sent: set[tuple[str, str | int]] = set()  # ids and output indexes of the ProviderItems sent
        self._terminal = False
        self._finished = False

    def feed(self, event: object) -> list[ModelEvent]:
        if self._finished:
            raise RuntimeError("ResponsesNormalizer is finished; no more events are accepted")
        if not isinstance(event, dict) or self._terminal:
            return []
        kind = event.get("type")
        if not isinstance(kind, str):
            return []
        # The text delta (the per-token event) is taken here; every other
        # kind goes to its handler in one lookup.
        if kind in _TEXT_DELTAS:
            delta = event.get("delta")
            if isinstance(delta, str) and delta:
                self._text.append(delta)
                return [TextDelta(delta)]
            return []
        handler = _HANDLERS.get(kind)
        return handler(self, event) if handler is not None else []

    def feed_read(self, raws: list[RawChunk | RawWarning | RawRun], *, runs: bool = False) -> list[ModelEvent]:
        return feed_each(self, raws)

    def finish(self) -> list[ModelEvent]:
        if self._finished:
            return []
        self._finished = True
        if self._terminal:
            return []
        events: list[ModelEvent] = list(self._flush_pending())
        reason = "tool_calls" if self._tool_calls_emitted else None
        events.append(Finished(reason=reason, response_id=self.response_id, usage=None, status=None))
        return events

    # -- handlers ------------------------------------------------------------

    def _lifecycle(self, event: Mapping[str, JsonValue]) -> list[ModelEvent]:
        response = _response_of(event)
        response_id = nonempty_str(response.get("id"))
        if self._started or response_id is None:
            return []
        self._started = True
        self.response_id = response_id
        return [ResponseStarted(response_id)]

    def _reasoning(self, event: Mapping[str, JsonValue]) -> list[ModelEvent]:
        kind = event.get("type")
        delta = event.get("delta")
        if not isinstance(delta, str) or not delta or not isinstance(kind, str):
            return []
        part_key = "summary_index" if kind.endswith("summary_text.delta") else "content_index"
        output_index = int_index(event.get("output_index"))
        where = output_index if output_index is not None else event.get("item_id")
        key = (where, kind, int_index(event.get(part_key)) or 0)
        if self._reasoning_seen and key != self._reasoning_key:
            delta = "\n\n" + delta
        self._reasoning_key = key
        self._reasoning_seen = True
        return [ReasoningDelta(delta)]

    def _item_added(self, event: Mapping[str, JsonValue]) -> list[ModelEvent]:
        item = event.get("item")
        if not isinstance(item, dict) or item.get("type") != "function_call":
            return []
        call = self._call_for(event, item)
        if call.call_id is None:
            call.call_id = self._take_id(call, item)
        name = nonempty_str(item.get("name"))
        if name and not call.name:
            call.name = name
        arguments = item.get("arguments")
        if arguments and not call.deltas and call.final_arguments is None:
            call.deltas.append(arguments_text(arguments))
        if call.emitted or call.announced or not call.name:
            return []
        call.announced = True
        started: list[ModelEvent] = [ToolCallStarted(call_id=call.call_id, name=call.name, item_id=nonempty_str(item.get("id")))]
        if call.deltas:
            started.append(ToolArgumentsDelta(call.call_id, "".join(call.deltas)))
        return started

    def _arguments_delta(self, event: Mapping[str, JsonValue]) -> list[ModelEvent]:
        delta = event.get("delta")
        if isinstance(delta, str) and delta:
            call = self._call_for(event)
            call.deltas.append(delta)
            if call.announced and not call.emitted and call.call_id is not None:
                return [ToolArgumentsDelta(call.call_id, delta)]
        return []

    def _arguments_done(self, event: Mapping[str, JsonValue]) -> list[ModelEvent]:
        call = self._call_for(event)
        arguments = event.get("arguments")
        if isinstance(arguments, str):
            call.final_arguments = arguments
        name = nonempty_str(event.get("name"))
        if name and not call.name:
            call.name = name
        return []

    def _item_done(self, event: Mapping[str, JsonValue]) -> list[ModelEvent]:
        item = event.get("item")
        if not isinstance(item, dict):
            return []
        if item.get("type") == "reasoning":
            return self._provider_item(item, int_index(event.get("output_index")))
        if item.get("type") != "function_call":
            return []
        call = self._call_for(event, item)
        return self._emit(call, item)

    def _provider_item(self, item: JsonObject, output_index: int | None) -> list[ModelEvent]:
        """A reasoning item, once: an item with the id, or at the output index,
        of one already sent is that one (a provider may renumber ids in its
        final output)."""
        keys: list[tuple[str, str | int]] = []
        item_id = nonempty_str(item.get("id"))
        if item_id:
            keys.append(("id", item_id))
        if output_index is not None:
            keys.append(("index", output_index))
        if any(key in self._items_sent for key in keys):
            return []
        self._items_sent.update(keys)
        return [ProviderItem(copy.deepcopy(item))]

    def _final_output(self, response: Mapping[str, JsonValue]) -> list[ModelEvent]:
        """What the final ``response.output`` has that the stream did not give:
        reasoning items never sent with ``output_item.done``, and message text
        beyond the streamed text (a server that sends text only in done
        events or in the final output). The streamed text cannot be taken
        back: when the final text does not continue it, it is kept and a
        warning says so."""
        final = response.get("output")
        if not isinstance(final, list) or not final:
            return []  # nothing to compare with: the streamed items stand (as in Open WebUI)
        events: list[ModelEvent] = []
        parts: list[str] = []
        for position, item in enumerate(final):
            if not isinstance(item, dict):
                continue
            if item.get("type") == "reasoning":
                events.extend(self._provider_item(item, position))
            elif item.get("type") == "message" and isinstance(content := item.get("content"), list):
                parts.extend(_visible_texts(content))
        text, streamed = "".join(parts), "".join(self._text)
        if text != streamed and text:
            if text.startswith(streamed):
                self._text.append(text[len(streamed) :])
                events.append(TextDelta(self._text[-1]))
            else:
                events.append(
                    StreamWarning(
                        "the final output's text differs from the streamed text; the streamed text is kept",
                        raw=text[:500],
                    )
                )
        return events

    def _completed(self, event: Mapping[str, JsonValue]) -> list[ModelEvent]:
        self._terminal = True
        response = _response_of(event)
        events: list[ModelEvent] = self._final_output(response)
        final = response.get("output")
        for position, item in enumerate(final if isinstance(final, list) else []):
            if isinstance(item, dict) and item.get("type") == "function_call":
                call = self._call_for({"output_index": position}, item)
                events.extend(self._emit(call, item))
        events.extend(self._flush_pending())
        events.append(
            Finished(
                reason="tool_calls" if self._tool_calls_emitted else "stop",
                response_id=nonempty_str(response.get("id")) or self.response_id,
                usage=_usage_of(response),
                status="completed",
            )
        )
        return events

    def _incomplete(self, event: Mapping[str, JsonValue]) -> list[ModelEvent]:
        self._terminal = True
        response = _response_of(event)
        details = response.get("incomplete_details")
        raw_reason = details.get("reason") if isinstance(details, dict) else None
        if isinstance(raw_reason, str) and raw_reason:
            reason = _INCOMPLETE_REASONS.get(raw_reason, raw_reason)
        else:
            reason = "length"
        return [
            *self._final_output(response),
            Finished(
                reason=reason,
                response_id=nonempty_str(response.get("id")) or self.response_id,
                usage=_usage_of(response),
                status="incomplete",
            ),
        ]

    def _failed(self, event: Mapping[str, JsonValue]) -> list[ModelEvent]:
        self._terminal = True
        error = _response_of(event).get("error")
        details: JsonObject = copy.deepcopy(error) if isinstance(error, dict) else ({"error": error} if error else {})
        code = error.get("code") if isinstance(error, dict) else None
        message = error_message(error) if error else "The response failed."
        return [StreamFailed(message=message, code=code if isinstance(code, str) else None, details=details)]

    def _error(self, event: JsonObject) -> list[ModelEvent]:
        self._terminal = True
        code = event.get("code")
        return [
            StreamFailed(
                message=error_message(event),
                code=code if isinstance(code, str) else None,
                details=copy.deepcopy(event),
            )
        ]

    # -- calls ---------------------------------------------------------------

    def _call_for(self, event: Mapping[str, JsonValue], item: Mapping[str, JsonValue] | None = None) -> _ResponsesCall:
        """The tracked call an event is about, found by item id, then call id,
        then output index (only among calls whose item id is unknown, or when
        the event names no item); created when unknown."""
        if item is not None:
            item_id, call_id = nonempty_str(item.get("id")), nonempty_str(item.get("call_id"))
        else:
            item_id, call_id = nonempty_str(event.get("item_id")), None
        output_index = int_index(event.get("output_index"))
        for call in self._calls:
            if item_id and call.item_id == item_id:
                return call
        for call in self._calls:
            if call_id and call.call_id == call_id:
                return call
        if output_index is not None:
            for call in reversed(self._calls):
                if call.output_index == output_index and (item_id is None or call.item_id is None):
                    call.item_id = call.item_id or item_id
                    return call
        call = _ResponsesCall(item_id=item_id, output_index=output_index)
        self._calls.append(call)
        return call

    def _emit(self, call: _ResponsesCall, item: Mapping[str, JsonValue] | None) -> list[ModelEvent]:
        """The call, once: split when its arguments are glued JSON values
        (glued JSON, as on Chat Completions), or a warning when it has no name."""
        if call.emitted:
            return []
        if item is not None:
            name = nonempty_str(item.get("name"))
            if name:
                call.name = name
            if item.get("arguments") is not None:
                call.final_arguments = arguments_text(item.get("arguments"))
            if call.call_id is None:
                call.call_id = self._take_id(call, item)
            if call.item_id is None:
                call.item_id = nonempty_str(item.get("id"))
        if call.call_id is None:
            call.call_id = self._ids.fresh()
        call.emitted = True
        whole = ToolCall(
            call_id=call.call_id,
            name=call.name,
            arguments=call.arguments,
            item_id=call.item_id or call.call_id,
            provider_id=self._ids.replaced(call.provider_call_id, call.call_id),
        )
        calls, warnings = named_calls(split_tool_calls([whole], self._id_factory))
        if len(calls) > 1 and call.provider_call_id:
            # The provider knows one call: its pieces answer it together in a
            # stateful continuation (``stateful_continuation_input``).
            calls = [replace(piece, provider_id=call.provider_call_id) for piece in calls]
        self._tool_calls_emitted += len(calls)
        return [*calls, *warnings]

    def _take_id(self, call: _ResponsesCall, item: Mapping[str, JsonValue]) -> str:
        call.provider_call_id = nonempty_str(item.get("call_id"))
        return self._ids.take(call.provider_call_id)

    def _flush_pending(self) -> list[ModelEvent]:
        events: list[ModelEvent] = []
        for call in self._calls:
            events.extend(self._emit(call, None))
        return events


#: ``ResponsesNormalizer.feed``'s handler for each event kind but the text
#: deltas (other kinds give nothing).
_HANDLERS: Final[dict[str, Callable[[ResponsesNormalizer, JsonObject], list[ModelEvent]]]] = {
    **dict.fromkeys(_LIFECYCLE_START, ResponsesNormalizer._lifecycle),
    **dict.fromkeys(_REASONING_DELTAS, ResponsesNormalizer._reasoning),
    "response.output_item.added": ResponsesNormalizer._item_added,
    "response.function_call_arguments.delta": ResponsesNormalizer._arguments_delta,
    "response.function_call_arguments.done": ResponsesNormalizer._arguments_done,
    "response.output_item.done": ResponsesNormalizer._item_done,
    "response.completed": ResponsesNormalizer._completed,
    "response.incomplete": ResponsesNormalizer._incomplete,
    "response.failed": ResponsesNormalizer._failed,
    "error": ResponsesNormalizer._error,
}


def _visible_texts(content: list[JsonValue]) -> list[str]:
    """The visible answer's texts among a final message's content parts."""
    texts: list[str] = []
    for part in content:
        key = _VISIBLE_PARTS.get(part.get("type")) if isinstance(part, dict) else None
        text = part.get(key) if key is not None and isinstance(part, dict) else None
        if isinstance(text, str):
            texts.append(text)
    return texts


def _response_of(event: Mapping[str, JsonValue]) -> JsonObject:
    response = event.get("response")
    return response if isinstance(response, dict) else {}


def _usage_of(response: Mapping[str, JsonValue]) -> JsonObject | None:
    usage = response.get("usage")
    return copy.deepcopy(usage) if isinstance(usage, dict) and usage else None
