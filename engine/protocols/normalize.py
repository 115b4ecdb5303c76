"""Pure normalizers: each upstream wire protocol → ``engine.protocols.model_events``.

One normalizer per model call. ``feed`` takes one parsed wire object (a Chat
Completions chunk, a Responses API event, an Ollama NDJSON line) and returns
the events it means; ``finish`` is called once when the stream has ended and
returns what only the end can tell (accumulated tool calls, the final
``Finished``). The engine records the raw wire objects and re-runs these on
replay, so nothing here does I/O or reads a clock, and every id that the
provider did not supply comes from the injected ``id_factory(prefix)`` (prefix
``"call"``), in a fixed order.

Contents:

* :class:`ChatToolCalls` — accumulation of Chat Completions ``delta.tool_calls``
  fragments (behaviour spec §6.5), with quirks Q1/Q2 fixed.
* :func:`split_tool_calls` — §7.1, with Q4 fixed (the glued call is replaced).
* :class:`ChatNormalizer`, :class:`ResponsesNormalizer`,
  :class:`OllamaNormalizer`.

Deliberate differences from Open WebUI 0.12.4:

* Q1: a tool-call fragment without ``index`` is never dropped. It continues
  the call with the same provider ``id`` if it has an id (a new call if no
  call has that id), else the last call, else it starts a new call. A later
  fragment that has an ``index`` but no id and no name continues a call that
  was started without an index.
* Q2: at an index that already has a named call, a fragment carrying both a
  non-empty ``id`` different from that call's and a non-empty ``name`` starts
  a new call (it is the first fragment of another call). A different id
  *without* a name is treated as a continuation (Open WebUI's "later id
  ignored": a fragment without a name cannot be the first fragment of a
  usable call). A later non-empty name never replaces an existing name.
* Q4: :func:`split_tool_calls` returns the pieces in place of the glued call;
  the glued call is not kept anywhere.
* Ids: a call without a provider id gets ``id_factory("call")`` (Open WebUI:
  random ``fc_<hex>``). A provider id that is already taken — by an earlier
  call of the same stream or by ``reserved_ids`` (ids used earlier in the
  turn; providers that restart ids every round) — is replaced by a fresh id,
  as in Open WebUI.
* A ``ToolCall`` has ``item_id == call_id`` unless the provider has item ids
  (Responses API ``fc_…``). A call produced by a split gets a fresh id for
  both.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol

from engine.protocols.model_events import (
    Finished,
    ModelEvent,
    ProviderItem,
    ReasoningDelta,
    ResponseStarted,
    StreamFailed,
    StreamWarning,
    TextDelta,
    ToolCall,
    ToolCallStarted,
    UsageReport,
)
from engine.fold.accumulator import parse_chat_chunk

__all__ = [
    "CALL_ID_PREFIX",
    "ChatNormalizer",
    "ChatToolCalls",
    "IdFactory",
    "Normalizer",
    "OllamaNormalizer",
    "ResponsesNormalizer",
    "arguments_text",
    "split_json_values",
    "split_tool_calls",
]

IdFactory = Callable[[str], str]

#: Prefix passed to ``id_factory`` for every tool-call id turnlog makes up.
CALL_ID_PREFIX: Final[str] = "call"


class Normalizer(Protocol):
    def feed(self, obj: Any) -> list[ModelEvent]: ...

    def finish(self) -> list[ModelEvent]: ...


# --------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------


def arguments_text(value: Any) -> str:
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


def _nonempty_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _int_index(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _error_message(error: Any) -> str:
    if isinstance(error, str):
        return error
    if isinstance(error, Mapping):
        for key in ("message", "error", "detail"):
            value = error.get(key)
            if isinstance(value, str) and value:
                return value
            if isinstance(value, Mapping):
                return _error_message(value)
    try:
        return json.dumps(error, default=str)
    except (TypeError, ValueError):
        return str(error)


class _Ids:
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

    def fresh(self) -> str:
        call_id = self._factory(CALL_ID_PREFIX)
        self._taken.add(call_id)
        return call_id


# --------------------------------------------------------------------------
# Splitting glued arguments (§7.1)
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
    """Spec §7.1: a call whose arguments are several concatenated JSON values
    (``{"q":"A"}{"q":"B"}``, some models' way of asking for parallel calls)
    becomes one call per value, in order, each with a fresh id from
    ``id_factory("call")`` (also its ``item_id``) and the exact value text as
    arguments. Calls with zero or one value, or with anything undecodable,
    are returned unchanged (the same object). Q4: the glued call is replaced,
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
            result.append(replace(call, call_id=call_id, arguments=piece, item_id=call_id))
    return result


# --------------------------------------------------------------------------
# Chat Completions
# --------------------------------------------------------------------------


@dataclass(slots=True)
class _ChatCall:
    call_id: str
    provider_id: str | None
    index: int | None
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    announced: bool = False


class ChatToolCalls:
    """Accumulates Chat Completions ``delta.tool_calls`` fragments (§6.5).

    Fragments are keyed by ``index``; ``id``/``type``/``function.name`` come in
    the first fragment of a call, ``function.arguments`` arrive as string
    fragments that are concatenated (non-string arguments are serialized with
    :func:`arguments_text`). Parallel calls interleave by index. See the module
    docstring for the Q1/Q2 rules.
    """

    def __init__(self, id_factory: IdFactory, *, reserved_ids: Iterable[str] = ()) -> None:
        self._id_factory = id_factory
        self._ids = _Ids(id_factory, reserved_ids)
        self._calls: list[_ChatCall] = []
        self._by_index: dict[int, _ChatCall] = {}
        self._result: list[ToolCall] | None = None

    def __len__(self) -> int:
        return len(self._calls)

    def feed(self, fragments: Iterable[Any]) -> list[ToolCallStarted]:
        """Add the fragments of one chunk. Returns a :class:`ToolCallStarted`
        for each call that got its name in this chunk."""
        if self._result is not None:
            raise RuntimeError("ChatToolCalls is finished; no more fragments are accepted")
        started: list[ToolCallStarted] = []
        for fragment in fragments:
            if not isinstance(fragment, dict):
                continue
            function = fragment.get("function")
            if not isinstance(function, dict):
                function = {}
            name = _nonempty_str(function.get("name"))
            call = self._route(fragment, name)
            if name and not call.name:
                call.name = name  # Q2: an existing name is never replaced
            text = arguments_text(function.get("arguments"))
            if text:
                call.arguments.append(text)
            if call.name and not call.announced:
                call.announced = True
                started.append(ToolCallStarted(call_id=call.call_id, name=call.name))
        return started

    def finish(self) -> list[ToolCall]:
        """The complete calls in order of appearance, split (§7.1). Calling it
        again returns the same list (no new ids are drawn)."""
        if self._result is None:
            calls = [
                ToolCall(call_id=c.call_id, name=c.name, arguments="".join(c.arguments), item_id=c.call_id)
                for c in self._calls
            ]
            self._result = split_tool_calls(calls, self._id_factory)
        return list(self._result)

    # -- routing -----------------------------------------------------------

    def _route(self, fragment: Mapping[str, Any], name: str | None) -> _ChatCall:
        index = _int_index(fragment.get("index"))
        provider_id = _nonempty_str(fragment.get("id"))
        if index is not None:
            call = self._by_index.get(index)
            if call is None:
                last = self._calls[-1] if self._calls else None
                if last is not None and last.index is None and provider_id is None and name is None:
                    # Q1: the call began with fragments that had no index.
                    last.index = index
                    self._by_index[index] = last
                    return last
                return self._new(provider_id, index)
            if provider_id and name and call.name and provider_id != call.provider_id:
                return self._new(provider_id, index)  # Q2: another call at the same index
            return call
        # Q1: no index.
        if provider_id:
            for call in self._calls:
                if call.provider_id == provider_id:
                    return call
            return self._new(provider_id, None)
        if self._calls:
            return self._calls[-1]
        return self._new(None, None)

    def _new(self, provider_id: str | None, index: int | None) -> _ChatCall:
        call = _ChatCall(call_id=self._ids.take(provider_id), provider_id=provider_id, index=index)
        self._calls.append(call)
        if index is not None:
            self._by_index[index] = call
        return call


_PLAIN_DELTA_KEYS: Final[frozenset[str]] = frozenset({"content", "role", "refusal"})


class ChatNormalizer:
    """Chat Completions chunks (already JSON-parsed; ``"[DONE]"`` and other
    non-dicts are ignored) → model events.

    ``feed`` returns, in this order: ``ReasoningDelta``, ``TextDelta``,
    ``ToolCallStarted`` (once per call, when it gets its name),
    ``UsageReport`` (the provider's usage dict as sent, llama.cpp ``timings``
    merged in by :func:`parse_chat_chunk`), ``StreamWarning`` (an ``error``
    object in a chunk without choices: Open WebUI keeps streaming). ``finish``
    returns the tool calls (accumulated, then split) and one ``Finished`` with
    the provider's last ``finish_reason`` verbatim (``None`` if it sent none;
    ``"tool_calls"`` even when no call arrived — the engine treats an empty
    batch as the end), the first response id and the last usage reported.
    """

    def __init__(self, id_factory: IdFactory, *, reserved_ids: Iterable[str] = ()) -> None:
        self._calls = ChatToolCalls(id_factory, reserved_ids=reserved_ids)
        self.finish_reason: str | None = None
        self.response_id: str | None = None
        self.usage: dict[str, Any] | None = None
        self._finished = False

    def feed(self, chunk: Any) -> list[ModelEvent]:
        if self._finished:
            raise RuntimeError("ChatNormalizer is finished; no more chunks are accepted")
        if type(chunk) is not dict:
            return []
        # Fast path for the common chunk: one choice whose delta carries only
        # text (the per-token hot path; everything else takes the full parse).
        choices = chunk.get("choices")
        if type(choices) is list and len(choices) == 1 and not chunk.get("usage") and not chunk.get("timings"):
            choice = choices[0]
            if type(choice) is dict and not choice.get("finish_reason"):
                delta = choice.get("delta")
                if type(delta) is dict and delta.keys() <= _PLAIN_DELTA_KEYS:
                    content = delta.get("content")
                    if type(content) is str or content is None:
                        if self.response_id is None and type(chunk.get("id")) is str:
                            self.response_id = chunk["id"]
                        return [TextDelta(content)] if content else []
        parts = parse_chat_chunk(chunk)
        events: list[ModelEvent] = []
        if parts.reasoning:
            events.append(ReasoningDelta(parts.reasoning))
        if parts.content:
            events.append(TextDelta(parts.content))
        if parts.tool_calls:
            events.extend(self._calls.feed(parts.tool_calls))
        if parts.usage:
            self.usage = copy.deepcopy(parts.usage)
            events.append(UsageReport(copy.deepcopy(parts.usage)))
        if parts.error:
            events.append(StreamWarning(_error_message(parts.error), raw=copy.deepcopy(parts.error)))
        if parts.finish_reason:
            self.finish_reason = parts.finish_reason
        if parts.response_id and self.response_id is None:
            self.response_id = parts.response_id
        return events

    def finish(self) -> list[ModelEvent]:
        if self._finished:
            return []
        self._finished = True
        events: list[ModelEvent] = list(self._calls.finish())
        events.append(Finished(reason=self.finish_reason, response_id=self.response_id, usage=self.usage))
        return events


# --------------------------------------------------------------------------
# Responses API
# --------------------------------------------------------------------------

_LIFECYCLE_START: Final[frozenset[str]] = frozenset({"response.created", "response.queued", "response.in_progress"})
_TEXT_DELTAS: Final[frozenset[str]] = frozenset({"response.output_text.delta", "response.refusal.delta"})
_REASONING_DELTAS: Final[frozenset[str]] = frozenset(
    {"response.reasoning_text.delta", "response.reasoning_summary_text.delta"}
)
#: Message content parts that are the visible answer (the same text as the
#: ``output_text``/``refusal`` deltas), and the key holding their text.
_VISIBLE_PARTS: Final[dict[Any, str]] = {"output_text": "text", "text": "text", "refusal": "refusal"}
#: ``incomplete_details.reason`` → Chat Completions finish reason.
_INCOMPLETE_REASONS: Final[dict[str, str]] = {"max_output_tokens": "length", "content_filter": "content_filter"}


@dataclass(slots=True)
class _ResponsesCall:
    item_id: str | None
    output_index: int | None
    call_id: str | None = None
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
    * ``response.output_item.added`` of a ``function_call`` → ``ToolCallStarted``;
      its ``output_item.done`` → ``ToolCall`` (the done item is authoritative;
      ``item_id`` = the item's ``fc_…`` id). A call is emitted once.
    * ``response.output_item.done`` of a ``reasoning`` item → ``ProviderItem``
      (a deep copy), so encrypted reasoning can be replayed (Q10).
    * ``response.completed`` and ``response.incomplete``: the final
      ``response.output`` wins over the stream where the stream lacks
      something (as in Open WebUI's fold, Q20): a ``reasoning`` item never
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

    def __init__(self, id_factory: IdFactory) -> None:
        self._ids = _Ids(id_factory)
        self.response_id: str | None = None
        self._started = False
        self._calls: list[_ResponsesCall] = []
        self._tool_calls_emitted = 0
        self._reasoning_key: tuple[Any, ...] | None = None
        self._reasoning_seen = False
        self._text: list[str] = []  # every TextDelta so far, to check the final output against
        self._items_sent: set[tuple[str, Any]] = set()  # ids and output indexes of the ProviderItems sent
        self._terminal = False
        self._finished = False

    def feed(self, event: Any) -> list[ModelEvent]:
        if self._finished:
            raise RuntimeError("ResponsesNormalizer is finished; no more events are accepted")
        if not isinstance(event, dict) or self._terminal:
            return []
        kind = event.get("type")
        if not isinstance(kind, str):
            return []
        if kind in _LIFECYCLE_START:
            return self._lifecycle(event)
        if kind in _TEXT_DELTAS:
            delta = event.get("delta")
            if isinstance(delta, str) and delta:
                self._text.append(delta)
                return [TextDelta(delta)]
            return []
        if kind in _REASONING_DELTAS:
            return self._reasoning(event, kind)
        if kind == "response.output_item.added":
            return self._item_added(event)
        if kind == "response.function_call_arguments.delta":
            delta = event.get("delta")
            if isinstance(delta, str) and delta:
                self._call_for(event).deltas.append(delta)
            return []
        if kind == "response.function_call_arguments.done":
            call = self._call_for(event)
            arguments = event.get("arguments")
            if isinstance(arguments, str):
                call.final_arguments = arguments
            name = _nonempty_str(event.get("name"))
            if name and not call.name:
                call.name = name
            return []
        if kind == "response.output_item.done":
            return self._item_done(event)
        if kind == "response.completed":
            return self._completed(event)
        if kind == "response.incomplete":
            return self._incomplete(event)
        if kind == "response.failed":
            return self._failed(event)
        if kind == "error":
            self._terminal = True
            code = event.get("code")
            return [
                StreamFailed(
                    message=_error_message(event),
                    code=code if isinstance(code, str) else None,
                    details=copy.deepcopy(event),
                )
            ]
        return []

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

    def _lifecycle(self, event: Mapping[str, Any]) -> list[ModelEvent]:
        response = _response_of(event)
        response_id = _nonempty_str(response.get("id"))
        if self._started or response_id is None:
            return []
        self._started = True
        self.response_id = response_id
        return [ResponseStarted(response_id)]

    def _reasoning(self, event: Mapping[str, Any], kind: str) -> list[ModelEvent]:
        delta = event.get("delta")
        if not isinstance(delta, str) or not delta:
            return []
        part_key = "summary_index" if kind.endswith("summary_text.delta") else "content_index"
        output_index = _int_index(event.get("output_index"))
        where = output_index if output_index is not None else event.get("item_id")
        key = (where, kind, _int_index(event.get(part_key)) or 0)
        if self._reasoning_seen and key != self._reasoning_key:
            delta = "\n\n" + delta
        self._reasoning_key = key
        self._reasoning_seen = True
        return [ReasoningDelta(delta)]

    def _item_added(self, event: Mapping[str, Any]) -> list[ModelEvent]:
        item = event.get("item")
        if not isinstance(item, dict) or item.get("type") != "function_call":
            return []
        call = self._call_for(event, item)
        if call.call_id is None:
            call.call_id = self._ids.take(_nonempty_str(item.get("call_id")))
        name = _nonempty_str(item.get("name"))
        if name and not call.name:
            call.name = name
        arguments = item.get("arguments")
        if arguments and not call.deltas and call.final_arguments is None:
            call.deltas.append(arguments_text(arguments))
        if call.emitted or call.announced or not call.name:
            return []
        call.announced = True
        return [ToolCallStarted(call_id=call.call_id, name=call.name)]

    def _item_done(self, event: Mapping[str, Any]) -> list[ModelEvent]:
        item = event.get("item")
        if not isinstance(item, dict):
            return []
        if item.get("type") == "reasoning":
            return self._provider_item(item, _int_index(event.get("output_index")))
        if item.get("type") != "function_call":
            return []
        call = self._call_for(event, item)
        emitted = self._emit(call, item)
        return [emitted] if emitted is not None else []

    def _provider_item(self, item: dict[str, Any], output_index: int | None) -> list[ModelEvent]:
        """A reasoning item, once: an item with the id, or at the output index,
        of one already sent is that one (a provider may renumber ids in its
        final output)."""
        keys: list[tuple[str, Any]] = []
        item_id = _nonempty_str(item.get("id"))
        if item_id:
            keys.append(("id", item_id))
        if output_index is not None:
            keys.append(("index", output_index))
        if any(key in self._items_sent for key in keys):
            return []
        self._items_sent.update(keys)
        return [ProviderItem(copy.deepcopy(item))]

    def _final_output(self, response: Mapping[str, Any]) -> list[ModelEvent]:
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
            elif item.get("type") == "message" and isinstance(item.get("content"), list):
                for part in item["content"]:
                    key = _VISIBLE_PARTS.get(part.get("type")) if isinstance(part, dict) else None
                    if key is not None and isinstance(part.get(key), str):
                        parts.append(part[key])
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

    def _completed(self, event: Mapping[str, Any]) -> list[ModelEvent]:
        self._terminal = True
        response = _response_of(event)
        events: list[ModelEvent] = self._final_output(response)
        final = response.get("output")
        for position, item in enumerate(final if isinstance(final, list) else []):
            if isinstance(item, dict) and item.get("type") == "function_call":
                call = self._call_for({"output_index": position}, item)
                emitted = self._emit(call, item)
                if emitted is not None:
                    events.append(emitted)
        events.extend(self._flush_pending())
        events.append(
            Finished(
                reason="tool_calls" if self._tool_calls_emitted else "stop",
                response_id=_nonempty_str(response.get("id")) or self.response_id,
                usage=_usage_of(response),
                status="completed",
            )
        )
        return events

    def _incomplete(self, event: Mapping[str, Any]) -> list[ModelEvent]:
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
                response_id=_nonempty_str(response.get("id")) or self.response_id,
                usage=_usage_of(response),
                status="incomplete",
            )
        ]

    def _failed(self, event: Mapping[str, Any]) -> list[ModelEvent]:
        self._terminal = True
        error = _response_of(event).get("error")
        details = copy.deepcopy(error) if isinstance(error, dict) else ({"error": error} if error else {})
        code = error.get("code") if isinstance(error, dict) else None
        message = _error_message(error) if error else "The response failed."
        return [StreamFailed(message=message, code=code if isinstance(code, str) else None, details=details)]

    # -- calls ---------------------------------------------------------------

    def _call_for(self, event: Mapping[str, Any], item: Mapping[str, Any] | None = None) -> _ResponsesCall:
        """The tracked call an event is about, found by item id, then call id,
        then output index (only among calls whose item id is unknown, or when
        the event names no item); created when unknown."""
        if item is not None:
            item_id, call_id = _nonempty_str(item.get("id")), _nonempty_str(item.get("call_id"))
        else:
            item_id, call_id = _nonempty_str(event.get("item_id")), None
        output_index = _int_index(event.get("output_index"))
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

    def _emit(self, call: _ResponsesCall, item: Mapping[str, Any] | None) -> ToolCall | None:
        if call.emitted:
            return None
        if item is not None:
            name = _nonempty_str(item.get("name"))
            if name:
                call.name = name
            if item.get("arguments") is not None:
                call.final_arguments = arguments_text(item.get("arguments"))
            if call.call_id is None:
                call.call_id = self._ids.take(_nonempty_str(item.get("call_id")))
            if call.item_id is None:
                call.item_id = _nonempty_str(item.get("id"))
        if call.call_id is None:
            call.call_id = self._ids.fresh()
        call.emitted = True
        self._tool_calls_emitted += 1
        return ToolCall(
            call_id=call.call_id,
            name=call.name,
            arguments=call.arguments,
            item_id=call.item_id or call.call_id,
        )

    def _flush_pending(self) -> list[ToolCall]:
        events: list[ToolCall] = []
        for call in self._calls:
            emitted = self._emit(call, None)
            if emitted is not None:
                events.append(emitted)
        return events


def _response_of(event: Mapping[str, Any]) -> dict[str, Any]:
    response = event.get("response")
    return response if isinstance(response, dict) else {}


def _usage_of(response: Mapping[str, Any]) -> dict[str, Any] | None:
    usage = response.get("usage")
    return copy.deepcopy(usage) if isinstance(usage, dict) and usage else None


# --------------------------------------------------------------------------
# Ollama /api/chat
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
        self._ids = _Ids(id_factory, reserved_ids)
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
            return [StreamFailed(message=_error_message(error), details=details)]
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
                call_id = self._ids.take(_nonempty_str(raw.get("id")))
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
