"""What the upstream wire protocols share: tool-call ids and arguments, errors, content parts.

turnlog speaks three upstream protocols, one module each: ``chat`` (OpenAI
Chat Completions), ``responses`` (the OpenAI Responses API) and ``ollama``
(Ollama ``/api/chat``). Each has a pure normalizer (wire objects →
``engine.protocols.model_events``) and a request-body builder; ``history``
turns stored output items into the canonical transcript (Chat Completions
messages) the bodies are built from. This module holds what more than one of
them needs, so that no protocol module imports another for a helper.

Normalizers (:class:`Normalizer`): one per model call. ``feed`` takes one
parsed wire object (a Chat Completions chunk, a Responses API event, an Ollama
NDJSON line) and returns the events it means; ``finish`` is called once when
the stream has ended and returns what only the end can tell (accumulated tool
calls, the final ``Finished``). The engine records the raw wire objects and
re-runs the normalizers on replay, so nothing in them does I/O or reads a
clock, and every id that the provider did not supply comes from the injected
``id_factory(prefix)`` (prefix ``"call"``), in a fixed order.

Deliberate differences from Open WebUI 0.12.4 shared by the protocols (the
Chat-only ones, about fragments without an index and repeated indexes, are in
``engine.protocols.chat``):

* :func:`split_tool_calls` returns the pieces in place of the glued call; the
  glued call is not kept anywhere (Open WebUI keeps it as a call without a
  result; pinned by tests/test_normalize.py::test_q4_glued_call_is_replaced_by_its_pieces).
* Ids (:class:`CallIds`): a call without a provider id gets
  ``id_factory("call")`` (Open WebUI: random ``fc_<hex>``). A provider id that
  is already taken — by an earlier call of the same stream or by
  ``reserved_ids`` (ids used earlier in the turn; providers that restart ids
  every round) — is replaced by a fresh id, as in Open WebUI; the
  ``ToolCall`` keeps the provider's as ``provider_id``.
* A ``ToolCall`` has ``item_id == call_id`` unless the provider has item ids
  (Responses API ``fc_…``). A call produced by a split gets a fresh id for
  both.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Final, Protocol

from engine.json_types import JsonObject
from engine.ports import ModelRequest, RawChunk, RawRun, RawWarning
from engine.protocols.model_events import ModelEvent, StreamWarning, ToolCall
from engine.protocols.shapes import Item, Message

__all__ = [
    "CALL_ID_PREFIX",
    "call_ids_of",
    "CallIds",
    "IdFactory",
    "Item",
    "Message",
    "Normalizer",
    "arguments_text",
    "named_calls",
    "error_message",
    "image_url",
    "int_index",
    "is_image_part",
    "is_text_part",
    "json_object",
    "nonempty_str",
    "object_string",
    "outgoing_messages",
    "split_json_values",
    "split_tool_calls",
]

IdFactory = Callable[[str], str]

#: Prefix passed to ``id_factory`` for every tool-call id turnlog makes up.
CALL_ID_PREFIX: Final[str] = "call"


class Normalizer(Protocol):
    def feed(self, obj: object) -> list[ModelEvent]: ...

    def feed_read(self, raws: list[RawChunk | RawWarning | RawRun], *, runs: bool = False) -> list[ModelEvent]:
        """The events of one network read's payloads (``ChatProvider.stream_runs``),
        in order. With ``runs``, consecutive plain text chunks may come as one
        ``TextRun``."""
        ...

    def finish(self) -> list[ModelEvent]: ...


def feed_each(normalizer: Normalizer, raws: list[RawChunk | RawWarning | RawRun]) -> list[ModelEvent]:
    """``feed_read`` of a normalizer that takes payloads one by one: a payload
    that was not JSON becomes a ``StreamWarning`` in its place. Runs of chunks
    are Chat Completions' only (its normalizer reads them)."""
    events: list[ModelEvent] = []
    for raw in raws:
        if isinstance(raw, RawChunk):
            events.extend(normalizer.feed(raw.data))
        elif isinstance(raw, RawWarning):
            events.append(StreamWarning(raw.message, raw.raw))
        else:
            raise TypeError(f"{type(normalizer).__name__} reads no runs of Chat Completions chunks")
    return events


def outgoing_messages(request: ModelRequest) -> list[Message]:
    """The transcript as sent: the request's messages, then the assistant prefill if any."""
    messages = list(request.messages)
    if request.prefill:
        # Providers that continue an assistant prefill go on from it, so a
        # resumed turn generates nothing twice.
        messages.append({"role": "assistant", "content": request.prefill})
    return messages


# --------------------------------------------------------------------------
# Tool calls, errors
# --------------------------------------------------------------------------


def arguments_text(value: object) -> str:
    """Tool-call arguments as the string the model produced.

    Strings are kept as they are (even invalid JSON: the tool layer decides),
    ``None`` is ``""``, anything else (Ollama and some gateways send an object)
    is JSON-serialized with ``json.dumps`` defaults, as Open WebUI does.
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return json.dumps(value, default=str)


def nonempty_str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def int_index(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def error_message(error: object) -> str:
    if isinstance(error, str):
        return error
    if isinstance(error, Mapping):
        for key in ("message", "error", "detail"):
            value = error.get(key)
            if isinstance(value, str) and value:
                return value
            if isinstance(value, Mapping):
                return error_message(value)
    try:
        return json.dumps(error, default=str)
    except (TypeError, ValueError):
        return str(error)


class CallIds:
    """Hands out call ids: the provider's when it is new, else a fresh one."""

    def __init__(self, id_factory: IdFactory, reserved: Iterable[str] = ()) -> None:
        self._factory = id_factory
        self._taken: set[str] = {r for r in reserved if isinstance(r, str)}

    def take(self, provider_id: str | None) -> str:
        if provider_id and provider_id not in self._taken:
            call_id = provider_id
        else:
            call_id = self._factory(CALL_ID_PREFIX)
        self._taken.add(call_id)
        return call_id

    def replaced(self, provider_id: str | None, call_id: str) -> str | None:
        """The provider's id when ``call_id`` stands in for it, else None."""
        return provider_id if provider_id and provider_id != call_id else None

    def fresh(self) -> str:
        call_id = self._factory(CALL_ID_PREFIX)
        self._taken.add(call_id)
        return call_id


def call_ids_of(messages: Iterable[Mapping[str, object]]) -> set[str]:
    """Every tool-call id a transcript already uses (assistant ``tool_calls``,
    ``tool`` results): a call of the next response must not reuse one, or its
    result would be taken for the earlier call's."""
    ids: set[str] = set()
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, Mapping) else None
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, Mapping) and isinstance(call.get("id"), str):
                ids.add(call["id"])
        answered = message.get("tool_call_id") if isinstance(message, Mapping) else None
        if isinstance(answered, str):
            ids.add(answered)
    return ids


def named_calls(calls: Iterable[ToolCall]) -> tuple[list[ToolCall], list[StreamWarning]]:
    """The calls that name a function, and a warning for each one that does not.

    A call without a name (a stray fragment) cannot run, and sent back in the
    next request's history a strict upstream rejects the whole request
    (an empty ``function.name``): it is dropped, and the warning is recorded.
    """
    kept: list[ToolCall] = []
    warnings: list[StreamWarning] = []
    for call in calls:
        if call.name.strip():
            kept.append(call)
        else:
            warnings.append(
                StreamWarning(
                    f"the model sent a tool call without a function name (id {call.call_id}); it was dropped",
                    raw=call.arguments[:500] or None,
                )
            )
    return kept, warnings


# --------------------------------------------------------------------------
# Splitting glued arguments
# --------------------------------------------------------------------------


def split_json_values(text: str) -> list[str] | None:
    """The JSON values ``text`` is made of, as exact substrings.

    Whitespace between values is skipped. Returns None when any piece fails to
    decode (``"{…} trailing"``), ``[]`` for blank text. Any JSON value counts,
    not only objects (``"1 2"`` is two values), as in Open WebUI.
    """
    decoder = json.JSONDecoder()
    pieces: list[str] = []
    position, end = 0, len(text)
    while True:
        while position < end and text[position].isspace():
            position += 1
        if position >= end:
            return pieces
        try:
            _, stop = decoder.raw_decode(text, position)
        except (ValueError, RecursionError):
            return None
        pieces.append(text[position:stop].strip())
        position = stop


def split_tool_calls(calls: Sequence[ToolCall], id_factory: IdFactory) -> list[ToolCall]:
    """A call whose arguments are several concatenated JSON values
    (``{"q":"A"}{"q":"B"}``, some models' way of asking for parallel calls)
    becomes one call per value, in order, each with a fresh id from
    ``id_factory("call")`` (also its ``item_id``) and the exact value text as
    arguments. Calls with zero or one value, or with anything undecodable,
    are returned unchanged (the same object). The glued call is replaced,
    not kept.
    """
    result: list[ToolCall] = []
    for call in calls:
        pieces = split_json_values(call.arguments)
        if pieces is None or len(pieces) < 2:
            result.append(call)
            continue
        for piece in pieces:
            call_id = id_factory(CALL_ID_PREFIX)
            result.append(replace(call, call_id=call_id, arguments=piece, item_id=call_id, provider_id=None))
    return result


# --------------------------------------------------------------------------
# Content parts (Chat and Responses spellings)
# --------------------------------------------------------------------------


def image_url(part: Mapping[str, object]) -> str | None:
    """The URL of an ``input_image`` or ``image_url`` part (string or ``{url}``)."""
    value = part.get("image_url")
    if isinstance(value, Mapping):
        value = value.get("url")
    return value if isinstance(value, str) and value else None


def is_image_part(part: object) -> bool:
    return isinstance(part, Mapping) and part.get("type") in ("input_image", "image_url")


def is_text_part(part: object) -> bool:
    return isinstance(part, Mapping) and part.get("type") in ("input_text", "text", "output_text")


def json_object(value: object) -> JsonObject | None:
    """``value`` as a JSON object: a mapping, or a string holding one; else None."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            return None
        return decoded if isinstance(decoded, dict) else None
    return None


def object_string(value: object) -> str | None:
    """A JSON object string for ``value``: a valid object string is kept verbatim
    (what the model wrote; also keeps provider prompt caches warm), a mapping is
    dumped; anything else → None."""
    if isinstance(value, Mapping):
        return json.dumps(dict(value), ensure_ascii=False)
    if isinstance(value, str) and json_object(value) is not None:
        return value
    return None
