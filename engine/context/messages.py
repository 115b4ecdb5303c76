"""Chat-message helpers used by context assembly, after Open WebUI's.

Pure functions over OpenAI Chat Completions messages. Unlike Open WebUI's
helpers they never mutate their input: every function returns a new list (the
messages it edits are copied; the others are shared). The places where turnlog
deliberately differs from Open WebUI 0.12.4 (each pinned by a vector override
in tests/test_messages.py::test_message_helper_vectors or
tests/test_messages.py::test_apply_params_vectors):

* ``apply_params_to_form_data`` converts ``logit_bias`` before the generic
  copy, so the conversion actually happens.
* ``strip_empty_content_blocks`` treats ``text: null`` as empty (no crash).
* ``update_message_content`` edits ONE text part of list content (the
  first), not every one.
* ``add_or_update_system_message`` finds a system message at any index and
  keeps its list parts; ``merge_system_messages`` keeps every text part of a
  list-content system message, not only the first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TypeGuard

from engine.context.extensions import TURNLOG_PARAMS
from engine.json_types import JsonObject, JsonValue
from engine.protocols.shapes import Message

__all__ = ["Message"]

#: Keys of ``params`` that steer Open WebUI / turnlog and are never
#: model parameters: the one list, ``engine.context.extensions.TURNLOG_PARAMS``.
OWUI_ONLY_PARAMS = TURNLOG_PARAMS

#: Ollama ``/api/chat`` fields that live at the top level of the body, not in
#: ``options`` (Ollama ignores them inside ``options``).
OLLAMA_TOP_LEVEL_PARAMS = frozenset({"format", "keep_alive", "think"})


# --------------------------------------------------------------------------
# Content access
# --------------------------------------------------------------------------


def _is_text_part(part: JsonValue) -> TypeGuard[Mapping[str, JsonValue]]:
    return isinstance(part, Mapping) and part.get("type") == "text"


def _join(first: str, second: str) -> str:
    """``first\\nsecond``, without a dangling newline when one side is empty."""
    if not first:
        return second
    if not second:
        return first
    return f"{first}\n{second}"


def update_message_content(message: Message, text: str, append: bool = True) -> Message:
    """A copy of ``message`` with ``text`` added after (``append``) or before its content.

    String content becomes ``old\\ntext`` / ``text\\nold``. With list content
    only the FIRST text part is edited (Open WebUI edits every text part);
    a list without a text part gets one (at the end when appending, at the
    front when prepending). Missing/None content becomes ``text``.
    """
    content = message.get("content")
    if isinstance(content, list):
        parts = list(content)
        for i, part in enumerate(parts):
            if _is_text_part(part):
                old = part.get("text") or ""
                old_text = old if isinstance(old, str) else str(old)  # as an f-string would show it
                parts[i] = {**part, "text": _join(old_text, text) if append else _join(text, old_text)}
                break
        else:
            new_part: JsonValue = {"type": "text", "text": text}
            parts = [*parts, new_part] if append else [new_part, *parts]
        return {**message, "content": parts}
    old = content if isinstance(content, str) else ""
    return {**message, "content": _join(old, text) if append else _join(text, old)}


def _first_text(content: JsonValue) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        for part in content:
            if _is_text_part(part):
                text = part.get("text")
                return text if isinstance(text, str) else ""
    return None


def _all_text(content: JsonValue) -> str:
    """Every text part of list content, joined with newlines; empty ones dropped."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(text for part in content if _is_text_part(part) and isinstance(text := part.get("text"), str) and text)
    return ""


# --------------------------------------------------------------------------
# Message editing
# --------------------------------------------------------------------------


def add_or_update_system_message(text: str, messages: list[Message], append: bool = False) -> list[Message]:
    """Add ``text`` to the first system message wherever it is (Open WebUI
    looks only at index 0 and otherwise inserts a duplicate), by default
    PREPENDING it; list parts are kept (one text part edited). Without a
    system message a new one is inserted at index 0."""
    out = list(messages)
    for i, message in enumerate(out):
        if message.get("role") == "system":
            out[i] = update_message_content(message, text, append=append)
            return out
    return [{"role": "system", "content": text}, *out]


def add_or_update_user_message(text: str, messages: list[Message], append: bool = True) -> list[Message]:
    """Add ``text`` to the LAST message if it is a user message (appended by
    default); otherwise append a new user message."""
    out = list(messages)
    if out and out[-1].get("role") == "user":
        out[-1] = update_message_content(out[-1], text, append=append)
        return out
    out.append({"role": "user", "content": text})
    return out


def replace_system_message_content(content: JsonValue, messages: list[Message]) -> list[Message]:
    """The first system message anywhere gets ``content`` (replacing all of its
    content). Without a system message the list is returned unchanged."""
    out = list(messages)
    for i, message in enumerate(out):
        if message.get("role") == "system":
            out[i] = {**message, "content": content}
            break
    return out


def _last_user_index(messages: list[Message]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return i
    return None


def set_last_user_message_content(content: str, messages: list[Message]) -> list[Message]:
    """In the last user message, replace the string content, or the FIRST text
    part of list content (other parts kept; a list without text gets one in
    front). No user message: unchanged."""
    out = list(messages)
    index = _last_user_index(out)
    if index is None:
        return out
    message = out[index]
    old = message.get("content")
    if isinstance(old, list):
        parts = list(old)
        for i, part in enumerate(parts):
            if _is_text_part(part):
                parts[i] = {**part, "text": content}
                break
        else:
            parts.insert(0, {"type": "text", "text": content})
        out[index] = {**message, "content": parts}
    else:
        out[index] = {**message, "content": content}
    return out


def get_last_user_message(messages: list[Message]) -> str | None:
    """The string content, or the first text part, of the last user message;
    None without a user message (or when it has no text)."""
    index = _last_user_index(messages)
    if index is None:
        return None
    return _first_text(messages[index].get("content"))


# --------------------------------------------------------------------------
# System merge and empty blocks
# --------------------------------------------------------------------------


def merge_system_messages(messages: list[Message]) -> list[Message]:
    """Fold every system message into ONE at position 0.

    The system texts are joined with ``\\n`` (empty ones dropped); the other
    messages keep their order. Unlike Open WebUI, a list-content system message
    contributes ALL of its text parts (Open WebUI keeps only the first, which
    loses the parts of the duplicate it inserted), and its non-text parts are kept after the text. With no
    system text and no other parts the system messages are simply removed.
    """
    texts: list[str] = []
    extra_parts: list[JsonValue] = []
    rest: list[Message] = []
    for message in messages:
        if message.get("role") != "system":
            rest.append(message)
            continue
        content = message.get("content")
        text = _all_text(content)
        if text:
            texts.append(text)
        if isinstance(content, list):
            extra_parts.extend(part for part in content if not _is_text_part(part))
    merged = "\n".join(texts)
    if extra_parts:
        parts: list[JsonValue] = [{"type": "text", "text": merged}] if merged else []
        parts += extra_parts
        return [{"role": "system", "content": parts}, *rest]
    if merged:
        return [{"role": "system", "content": merged}, *rest]
    return rest


def _is_empty_text_part(part: JsonValue) -> bool:
    if not _is_text_part(part):
        return False
    text = part.get("text")
    return text is None or (isinstance(text, str) and not text.strip())


def strip_empty_content_blocks(messages: list[Message]) -> list[Message]:
    """Drop empty or whitespace-only ``text`` parts from list content, unless
    that would leave the list empty (then the message is unchanged). String
    content is untouched. ``text: null`` counts as empty (Open WebUI raises)."""
    out: list[Message] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            kept: list[JsonValue] = [part for part in content if not _is_empty_text_part(part)]
            if kept and len(kept) != len(content):
                message = {**message, "content": kept}
        out.append(message)
    return out


# --------------------------------------------------------------------------
# Model params
# --------------------------------------------------------------------------


def _deep_merge(base: Mapping[str, JsonValue], extra: Mapping[str, JsonValue]) -> JsonObject:
    result = dict(base)
    for key, value in extra.items():
        current = result.get(key)
        if isinstance(value, Mapping) and isinstance(current, Mapping):
            result[key] = _deep_merge(current, value)
        else:
            result[key] = value
    return result


def _decode_custom_params(custom: object) -> JsonObject:
    if not isinstance(custom, Mapping):
        return {}
    out: JsonObject = {}
    for key, value in custom.items():
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                pass
        out[key] = value
    return out


def convert_logit_bias(value: object) -> JsonObject | None:
    """``"50256:-100, 11:5"`` (the UI's text form) or a mapping → the OpenAI
    ``{token_id: bias}`` object, biases clamped to [-100, 100]. None when the
    value cannot be understood (the key is then not sent at all)."""
    pairs: list[tuple[object, object]]
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        if text.startswith("{"):
            try:
                decoded = json.loads(text)
            except ValueError:
                return None
            return convert_logit_bias(decoded) if isinstance(decoded, Mapping) else None
        pairs = []
        for chunk in text.split(","):
            if not chunk.strip():
                continue
            token, sep, bias = chunk.partition(":")
            if not sep:
                return None
            pairs.append((token.strip(), bias.strip()))
    else:
        return None
    result: JsonObject = {}
    for raw_token, raw_bias in pairs:
        if not isinstance(raw_bias, str | int | float):
            return None  # what float() refuses
        try:
            token_id = int(str(raw_token).strip())
            number = float(raw_bias)
        except (TypeError, ValueError):
            return None
        result[str(token_id)] = int(max(-100.0, min(100.0, number)))
    return result or None


def _is_ollama(model: Mapping[str, object] | None) -> bool:
    if not isinstance(model, Mapping):
        return False
    return model.get("owned_by") == "ollama" or isinstance(model.get("ollama"), Mapping)


def apply_params_to_form_data(form_data: Mapping[str, JsonValue], model: Mapping[str, object] | None = None) -> JsonObject:
    """Move the request's ``params`` into the upstream body (a new dict).

    * ``params`` is removed from the body, and so are the Open WebUI/turnlog-only
      keys (``OWUI_ONLY_PARAMS``).
    * ``custom_params``: string values are JSON-decoded when possible and
      deep-merged into the params.
    * ``logit_bias`` is converted to an object first (Open WebUI copies the
      raw string and then skips the conversion); unparseable values are dropped.
    * Ollama models (``owned_by == "ollama"``): ``options = {**params,
      **existing_options}`` (existing options win); ``format``, ``keep_alive``
      and ``think`` go to the top level instead, where Ollama reads them.
    * Otherwise each non-null param becomes a top-level key unless the body
      already has that key (the body wins).
    """
    body = dict(form_data)
    raw_params = body.pop("params", None)
    params: JsonObject = dict(raw_params) if isinstance(raw_params, Mapping) else {}
    custom = params.pop("custom_params", None)
    params = _deep_merge(params, _decode_custom_params(custom))
    params = {k: v for k, v in params.items() if k not in OWUI_ONLY_PARAMS and v is not None}
    if "logit_bias" in params:
        converted = convert_logit_bias(params["logit_bias"])
        if converted is None:
            del params["logit_bias"]
        else:
            params["logit_bias"] = converted

    if _is_ollama(model):
        options = body.get("options")
        existing = dict(options) if isinstance(options, Mapping) else {}
        for key in OLLAMA_TOP_LEVEL_PARAMS & params.keys():
            value = params.pop(key)
            body.setdefault(key, value)
        if params or existing:
            body["options"] = {**params, **existing}
        return body

    for key, value in params.items():
        if key not in body:
            body[key] = value
    return body
