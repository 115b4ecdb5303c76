"""Pure folding of Responses API streaming events into output items.

Open WebUI keeps an assistant answer as a list of Responses-API-shaped output
items (behaviour spec §1.1). For a Responses API upstream it builds that list
by folding every streaming event into it with ``handle_responses_streaming_event``
(§6.4); the same fold lets any viewer rebuild ``output`` from the
``response.output_item.*`` / ``response.*.delta`` events it was sent.
:func:`fold_responses_event` is that fold. It is pure: the ``output`` list, its
items and the event are never modified (turnlog records events raw and replays
them, so a fold that wrote into the event would corrupt the log); every change
is made on copies, and items taken from an event are deep-copied.

``meta`` is ``None`` when there is nothing to report, ``{}`` when the output
changed in a way worth a full snapshot (``*.done`` events), or a dict:

* ``response.completed`` → ``{"usage", "done": True, "response_id"}``
* ``response.incomplete`` → ``{"status": "incomplete", "reason", "usage", "done": True, "response_id"}``
* ``response.failed`` → ``{"error", "status": "failed"}`` (+ ``usage``/``response_id`` when the provider sent them)
* ``error`` → ``{"error": <the whole event>}``

Deliberate differences from Open WebUI 0.12.4 (spec §15):

* Q7: parts created as padding (a delta for a content slot that was never
  announced with ``content_part.added``) are ``output_text``, never ``text``,
  for message and reasoning items alike, so history replay finds the text.
* Q20, ``response.completed``: the provider's final ``output`` still wins for
  every item it lists, but it is copied, never modified in place, and streamed
  items it does not list are kept, in their streamed position relative to the
  items it does list. A streamed item is "listed" when the final output has an
  item with the same ``id`` or the same ``type`` + ``call_id``, or else an item
  of the same type at the same position that no other streamed item matched
  (so a provider that renumbers ids in its final list does not get every item
  twice). Unlisted items with nothing in them (a message or reasoning item
  without text, padding) are dropped. Reasoning items without a final status
  and every item still ``in_progress`` become ``completed`` (Open WebUI only
  touched reasoning items). An empty or missing final output keeps the
  streamed items, as in Open WebUI.
* Q20, ``response.incomplete`` is no longer ignored: the output is merged with
  the provider's like ``completed``, items still ``in_progress`` become
  ``incomplete``, and meta carries the reason (``incomplete_details.reason``).
* Q20, ``response.failed``: meta also says ``status: "failed"`` and items still
  ``in_progress`` become ``incomplete`` (Q21: an interrupted item must not
  look completed). A missing ``response.error`` becomes
  ``{"message": "The response failed."}`` instead of ``{}``, which reads as "no
  error".

Smaller choices where the spec is silent or Open WebUI does something useless:

* A delta without ``output_index`` goes to the last item, or creates item 0 in
  an empty output (Open WebUI's default, ``len - 1``, is -1 there).
* Delta padding creates typed targets: a ``function_call_arguments`` delta
  beyond the end creates ``{type: "function_call", arguments: ""}`` and a
  reasoning delta ``{type: "reasoning", content: [], summary: []}``; a
  ``function_call_arguments`` delta or done aimed at a non-function_call item
  is ignored (Open WebUI wrote it into a message part).
* ``response.output_text.done`` for a message part that does not exist yet
  creates the part (padding with ``output_text``) instead of dropping the
  final text.
* ``response.output_item.done`` without an item changes nothing and reports
  ``None`` (Open WebUI reported ``{}``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["fold_responses_event"]

Output = list[dict[str, Any]]
Meta = dict[str, Any] | None

#: Delta/done names whose value is a part's ``text``.
_TEXT_KINDS: Final[frozenset[str]] = frozenset({"text", "output_text"})
_REASONING_KINDS: Final[frozenset[str]] = frozenset({"reasoning_text", "reasoning_summary_text"})
#: ``*.done`` names whose final value sits under ``text`` in the event.
_DONE_TEXT_KINDS: Final[frozenset[str]] = _TEXT_KINDS | _REASONING_KINDS
_FINAL_STATUSES: Final[frozenset[str]] = frozenset({"completed", "incomplete", "failed"})


def fold_responses_event(event: dict[str, Any], output: list[dict[str, Any]]) -> tuple[Output, Meta]:
    """Fold one Responses API streaming event into ``output``.

    Returns ``(new_output, meta)``. ``new_output`` is ``output`` itself when
    nothing changed, else a new list (unchanged items are shared, changed ones
    are copies). Never raises on malformed events: what cannot be read is
    ignored.
    """
    if not isinstance(event, dict):
        return output, None
    kind = event.get("type")
    if not isinstance(kind, str):
        return output, None

    if kind == "response.output_item.added":
        return _item_added(event, output), None
    if kind == "response.output_item.done":
        return _item_done(event, output)
    if kind == "response.content_part.added":
        return _part_added(event, output, "content"), None
    if kind == "response.reasoning_summary_part.added":
        return _part_added(event, output, "summary"), None
    if kind == "response.completed":
        return _completed(event, output)
    if kind == "response.incomplete":
        return _incomplete(event, output)
    if kind == "response.failed":
        return _failed(event, output)
    if kind == "error":
        return output, {"error": copy.deepcopy(event)}

    pieces = kind.split(".")
    if len(pieces) >= 3 and pieces[0] == "response":
        if pieces[-1] == "delta":
            return _delta(event, output, pieces[1]), None
        if pieces[-1] == "done":
            if pieces[1] == "content_part":
                return _part_done(event, output, "content", "content_index")
            if pieces[1] == "reasoning_summary_part":
                return _part_done(event, output, "summary", "summary_index")
            return _field_done(event, output, pieces[1])
    # response.created / queued / in_progress and the ~50 other event types.
    return output, None


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def _index(event: Mapping[str, Any], key: str) -> int | None:
    value = event.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _target_index(event: Mapping[str, Any], output: Output) -> int:
    """``output_index``, defaulting to the last item (or 0 when empty)."""
    index = _index(event, "output_index")
    if index is None:
        return max(len(output) - 1, 0)
    return index


def _in_range(index: int, output: Output) -> bool:
    return 0 <= index < len(output)


def _same_item(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    if a.get("id") and a.get("id") == b.get("id"):
        return True
    return bool(a.get("call_id")) and a.get("call_id") == b.get("call_id") and a.get("type") == b.get("type")


def _deep_merge(current: Any, incoming: Any) -> Any:
    """Dicts merge key by key, strings concatenate, anything else is replaced."""
    if isinstance(current, dict) and isinstance(incoming, dict):
        merged = dict(current)
        for key, value in incoming.items():
            merged[key] = _deep_merge(merged[key], value) if key in merged else copy.deepcopy(value)
        return merged
    if isinstance(current, str) and isinstance(incoming, str):
        return current + incoming
    return copy.deepcopy(incoming)


def _padding_message() -> dict[str, Any]:
    return {"type": "message", "status": "in_progress", "role": "assistant", "content": []}


def _padding_target(delta_kind: str, item_id: Any) -> dict[str, Any]:
    """The item a delta beyond the end of ``output`` creates (Chat path: items
    may start with a delta and no ``output_item.added``)."""
    item: dict[str, Any]
    if delta_kind.startswith("reasoning"):
        item = {"type": "reasoning", "status": "in_progress", "content": [], "summary": []}
    elif delta_kind == "function_call_arguments":
        item = {"type": "function_call", "status": "in_progress", "arguments": ""}
    else:
        item = _padding_message()
    if item_id:
        item["id"] = item_id
    return item


def _padding_part(key: str) -> dict[str, Any]:
    # Q7: text parts are output_text everywhere.
    if key == "text":
        return {"type": "output_text", "text": ""}
    return {"type": key}


def _with_part(item: dict[str, Any], list_key: str, index: int, padding: dict[str, Any]) -> dict[str, Any]:
    """Copy ``item[list_key]`` and the part at ``index`` (padding the list up
    to it) and return the copied part, ready to be modified."""
    current = item.get(list_key)
    parts = list(current) if isinstance(current, list) else []
    while len(parts) <= index:
        parts.append(dict(padding))
    part = parts[index]
    part = dict(part) if isinstance(part, dict) else dict(padding)
    parts[index] = part
    item[list_key] = parts
    return part


def _append_to(part: dict[str, Any], key: str, delta: Any) -> None:
    current = part.get(key)
    if current is None:
        current = {} if isinstance(delta, dict) else ""
    part[key] = _deep_merge(current, delta)


# --------------------------------------------------------------------------
# Structure events
# --------------------------------------------------------------------------


def _item_added(event: Mapping[str, Any], output: Output) -> Output:
    item = event.get("item")
    if not isinstance(item, dict) or not item:
        return output
    item = copy.deepcopy(item)
    new = list(output)
    for position, existing in enumerate(new):
        if isinstance(existing, dict) and _same_item(item, existing):
            new[position] = item
            return new
    index = _target_index(event, output) if "output_index" in event else len(new)
    if _in_range(index, new):
        new.insert(index, item)
    else:
        new.append(item)
    return new


def _item_done(event: Mapping[str, Any], output: Output) -> tuple[Output, Meta]:
    item = event.get("item")
    if not isinstance(item, dict) or not item:
        return output, None
    new = list(output)
    index = _target_index(event, output)
    if _in_range(index, new):
        new[index] = copy.deepcopy(item)
    else:
        new.append(copy.deepcopy(item))
    return new, {}


def _part_added(event: Mapping[str, Any], output: Output, list_key: str) -> Output:
    index = _target_index(event, output)
    if not _in_range(index, output):
        return output
    new = list(output)
    item = dict(new[index])
    new[index] = item
    current = item.get(list_key)
    parts = list(current) if isinstance(current, list) else []
    # Open WebUI: reasoning items never get content parts (their text comes
    # from reasoning_text deltas), but the content list is still created.
    part = event.get("part")
    if not (list_key == "content" and item.get("type") == "reasoning") and isinstance(part, dict):
        parts.append(copy.deepcopy(part))
    item[list_key] = parts
    return new


def _part_done(event: Mapping[str, Any], output: Output, list_key: str, index_key: str) -> tuple[Output, Meta]:
    part = event.get("part")
    index = _target_index(event, output)
    if not isinstance(part, dict) or not part or not _in_range(index, output):
        return output, None
    parts = output[index].get(list_key)
    if not isinstance(parts, list):
        return output, None
    part_index = _index(event, index_key)
    if part_index is None:
        part_index = len(parts) - 1
    if not 0 <= part_index < len(parts):
        return output, None
    new = list(output)
    item = dict(new[index])
    new[index] = item
    item[list_key] = list(parts)
    item[list_key][part_index] = copy.deepcopy(part)
    return new, {}


# --------------------------------------------------------------------------
# Deltas and field completions
# --------------------------------------------------------------------------


def _delta(event: Mapping[str, Any], output: Output, delta_kind: str) -> Output:
    delta = event.get("delta", "")
    index = _target_index(event, output)
    if index < 0:
        return output
    new = list(output)
    if index >= len(new):
        while len(new) < index:
            new.append(_padding_message())
        new.append(_padding_target(delta_kind, event.get("item_id")))
    item = dict(new[index])
    new[index] = item
    item_type = item.get("type")

    if delta_kind == "function_call_arguments":
        if item_type != "function_call":
            return output
        current = item.get("arguments")
        item["arguments"] = (current if isinstance(current, str) else "") + (
            delta if isinstance(delta, str) else str(delta)
        )
        return new

    if item_type == "message":
        if delta_kind in _REASONING_KINDS:
            return output
        key = "text" if delta_kind in _TEXT_KINDS else delta_kind
        content_index = _index(event, "content_index") or 0
        part = _with_part(item, "content", content_index, _padding_part(key))
        _append_to(part, key, delta)
        return new

    if item_type == "reasoning":
        if delta_kind == "reasoning_summary_text":
            summary_index = _index(event, "summary_index") or 0
            part = _with_part(item, "summary", summary_index, {"type": "summary_text", "text": ""})
            _append_to(part, "text", delta)
            return new
        if delta_kind == "reasoning_text":
            content_index = _index(event, "content_index") or 0
            part = _with_part(item, "content", content_index, _padding_part("text"))
            _append_to(part, "text", delta)
            return new
        return output

    key = "text" if delta_kind in _TEXT_KINDS else delta_kind
    _append_to(item, key, delta)
    return new


def _field_done(event: Mapping[str, Any], output: Output, done_kind: str) -> tuple[Output, Meta]:
    """``response.<kind>.done``: the final value of a field."""
    if done_kind == "function_call_arguments":
        key = "arguments"
    elif done_kind in _DONE_TEXT_KINDS:
        key = "text"
    else:
        key = done_kind
    index = _target_index(event, output)
    if key not in event or not _in_range(index, output):
        return output, None
    value = copy.deepcopy(event[key])
    new = list(output)
    item = dict(new[index])
    new[index] = item
    item_type = item.get("type")
    if done_kind == "function_call_arguments" and item_type != "function_call":
        return output, None
    if item_type == "reasoning":
        # The final text is not copied: the streamed text is kept.
        item["status"] = "completed"
    elif item_type == "message":
        content_index = _index(event, "content_index") or 0
        part = _with_part(item, "content", content_index, _padding_part(key))
        part[key] = value
    else:
        item[key] = value
    return new, {}


# --------------------------------------------------------------------------
# Lifecycle
# --------------------------------------------------------------------------


def _response(event: Mapping[str, Any]) -> dict[str, Any]:
    response = event.get("response")
    return response if isinstance(response, dict) else {}


def _has_text(parts: Any) -> bool:
    return isinstance(parts, list) and any(
        isinstance(p, dict) and (p.get("text") or p.get("refusal")) for p in parts
    )


def _is_blank(item: Mapping[str, Any]) -> bool:
    """A message or reasoning item with nothing in it (padding, or an item
    that was announced and never filled)."""
    if item.get("type") == "message":
        return not _has_text(item.get("content"))
    if item.get("type") == "reasoning":
        return not (
            _has_text(item.get("content")) or _has_text(item.get("summary")) or item.get("encrypted_content")
        )
    return False


def _match_final(streamed: Output, final: Output) -> list[int | None]:
    """For each streamed item, the index of the final item that is the same
    item, or None.

    Same ``id``, or same ``type`` + ``call_id``; failing that, the final item
    at the same position if it has the same type and no other streamed item
    claimed it (guards against providers that put different ids in the final
    list than in the stream, which would otherwise duplicate every item).
    """
    matches: list[int | None] = []
    claimed: set[int] = set()
    for item in streamed:
        found = None
        if isinstance(item, dict):
            for index, candidate in enumerate(final):
                if _same_item(item, candidate):
                    found = index
                    break
        if found is not None:
            claimed.add(found)
        matches.append(found)
    for position, item in enumerate(streamed):
        if matches[position] is not None or not isinstance(item, dict):
            continue
        if _in_range(position, final) and position not in claimed:
            if final[position].get("type") == item.get("type"):
                matches[position] = position
                claimed.add(position)
    return matches


def _merge_final(streamed: Output, provider: Any) -> Output:
    """The provider's final list, plus the streamed items it lacks (Q20)."""
    final: Output = (
        [copy.deepcopy(item) for item in provider if isinstance(item, dict)] if isinstance(provider, list) else []
    )
    if not final:
        return list(streamed)
    merged = list(final)
    insert_at = 0
    for item, match in zip(streamed, _match_final(streamed, final), strict=True):
        if match is not None:
            insert_at = _index_of(merged, final[match]) + 1
        elif isinstance(item, dict) and not _is_blank(item):
            merged.insert(insert_at, item)
            insert_at += 1
    return merged


def _index_of(items: Output, target: dict[str, Any]) -> int:
    for index, item in enumerate(items):
        if item is target:
            return index
    raise ValueError("item not in list")


def _set_statuses(items: Output, *, reasoning: str | None, in_progress: str) -> Output:
    """Copy-on-write status update: reasoning items without a final status get
    ``reasoning`` (when given); other items still ``in_progress`` get
    ``in_progress``."""
    result: Output = []
    for item in items:
        if not isinstance(item, dict):
            result.append(item)
            continue
        status = item.get("status")
        if reasoning is not None and item.get("type") == "reasoning" and status not in _FINAL_STATUSES:
            item = {**item, "status": reasoning}
        elif status == "in_progress":
            item = {**item, "status": in_progress}
        result.append(item)
    return result


def _completed(event: Mapping[str, Any], output: Output) -> tuple[Output, Meta]:
    response = _response(event)
    merged = _merge_final(output, response.get("output"))
    new = _set_statuses(merged, reasoning="completed", in_progress="completed")
    return new, {"usage": response.get("usage"), "done": True, "response_id": response.get("id")}


def _incomplete(event: Mapping[str, Any], output: Output) -> tuple[Output, Meta]:
    response = _response(event)
    details = response.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    merged = _merge_final(output, response.get("output"))
    new = _set_statuses(merged, reasoning=None, in_progress="incomplete")
    return new, {
        "status": "incomplete",
        "reason": reason,
        "usage": response.get("usage"),
        "done": True,
        "response_id": response.get("id"),
    }


def _failed(event: Mapping[str, Any], output: Output) -> tuple[Output, Meta]:
    response = _response(event)
    error = response.get("error")
    if not error:
        error = {"message": "The response failed."}
    meta: dict[str, Any] = {"error": copy.deepcopy(error), "status": "failed"}
    if response.get("id"):
        meta["response_id"] = response["id"]
    if isinstance(response.get("usage"), dict):
        meta["usage"] = copy.deepcopy(response["usage"])
    if any(item.get("status") == "in_progress" for item in output if isinstance(item, dict)):
        return _set_statuses(output, reasoning=None, in_progress="incomplete"), meta
    return output, meta
