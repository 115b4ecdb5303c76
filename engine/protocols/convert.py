"""History conversion: stored output items → what each upstream protocol reads.

Pure functions (behaviour spec §8, §6.6):

* ``convert_output_to_messages`` turns an assistant turn's output items (§1.1)
  into Chat Completions messages (assistant / tool / user-with-images);
* ``process_messages_with_output`` and ``sanitize_tool_pairs`` prepare a whole
  chat history (§8.2);
* ``to_responses_input`` / ``responses_body`` map a Chat Completions body to a
  Responses API body, ``stateful_continuation_input`` builds the input of a
  ``previous_response_id`` continuation (Q9);
* ``ollama_messages`` maps Chat messages to Ollama ``/api/chat`` messages.

Keys turnlog reads on stored items beyond Open WebUI's:

* ``function_call.arguments_ran`` — the (filtered) arguments the tool was
  actually called with, as an object or a JSON object string. When present it
  is what gets replayed to the model (Q22: Open WebUI replays the unfiltered
  arguments). Without it the stored ``arguments`` are replayed when they are a
  valid JSON object, else ``"{}"`` (Q22: Open WebUI replays invalid JSON as is).
* ``reasoning.encrypted_content`` / a provider id ``rs_…`` — a Responses API
  reasoning item the provider can take back (Q10, see ``REASONING_RESPONSES``).
  The ids of the message / function_call items that follow it are replayed
  too, unless they are turnlog-made ids (``is_local_id``): the API pairs a
  reasoning item with its following item by id, so the stream layer should
  keep the provider's item ids for an exact replay.

Reasoning replay (``reasoning_format``):

``None``
    reasoning is not replayed (raw mode still replays ``reasoning_details``);
``"think_tags"``
    ``<start_tag>text<end_tag>`` becomes part of the assistant content;
``"thinking"`` / ``"reasoning_content"``
    a top-level field of the assistant message (Ollama / llama.cpp);
``"responses"`` (turnlog, Q10)
    for Responses API upstreams (stateless continuations and history):
    reasoning items carrying provider data are kept, in their original order
    together with the items that followed them, as Responses input items under
    the assistant message's ``responses_items`` key; ``to_responses_input``
    replays them. Open WebUI drops these items, so reasoning models lose their
    chain of thought between tool rounds. This key is for the Responses
    adapter only: never send a ``"responses"``-format history to a Chat
    Completions upstream.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

Message = dict[str, Any]
Item = dict[str, Any]

#: A call is replayed only if its ``function_call`` item has one of these
#: statuses and an output with the same ``call_id`` exists (§8.1).
REPLAYABLE_CALL_STATUSES = frozenset({"completed", "failed", "rejected"})
#: Turnlog's code-interpreter item type, and Open WebUI's.
CODE_INTERPRETER_TYPES = frozenset({"code_interpreter", "open_webui:code_interpreter"})
#: The ``reasoning_format`` that keeps provider reasoning items for the Responses API (Q10).
REASONING_RESPONSES = "responses"
REASONING_FORMATS = frozenset({"think_tags", "thinking", "reasoning_content", REASONING_RESPONSES})
#: The text of the user message that carries tool images when they are flattened.
TOOL_IMAGES_PROMPT = "Here are the images from the tool results above. Please analyze them."
#: Keys of stored chat messages that are bookkeeping, never sent upstream (§8.2).
BOOKKEEPING_KEYS = frozenset({"id", "output", "model", "contextSummary", "usage", "meta", "files"})
#: Chat Completions body keys the Responses API does not take (§6.6).
RESPONSES_DROPPED_KEYS = frozenset(
    {"stream_options", "logit_bias", "frequency_penalty", "presence_penalty", "stop", "messages"}
)


# --------------------------------------------------------------------------
# Small readers
# --------------------------------------------------------------------------


def _text_of_parts(parts: Any, types: Iterable[str] = ("output_text", "text")) -> str:
    """Concatenated text of content parts of the given types (``text`` is read
    too: Q7 — Open WebUI pads with ``text`` parts and then cannot read them)."""
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        return ""
    wanted = set(types)
    return "".join(part.get("text") or "" for part in parts if isinstance(part, Mapping) and part.get("type") in wanted)


def _image_url(part: Mapping[str, Any]) -> str | None:
    """The URL of an ``input_image`` or ``image_url`` part (string or ``{url}``)."""
    value = part.get("image_url")
    if isinstance(value, Mapping):
        value = value.get("url")
    return value if isinstance(value, str) and value else None


def _is_image_part(part: Any) -> bool:
    return isinstance(part, Mapping) and part.get("type") in ("input_image", "image_url")


def _is_text_part(part: Any) -> bool:
    return isinstance(part, Mapping) and part.get("type") in ("input_text", "text", "output_text")


def _json_object(value: Any) -> dict[str, Any] | None:
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


def _object_string(value: Any) -> str | None:
    """A JSON object string for ``value``: a valid object string is kept verbatim
    (what the model wrote; also keeps provider prompt caches warm), a mapping is
    dumped; anything else → None."""
    if isinstance(value, Mapping):
        return json.dumps(dict(value), ensure_ascii=False)
    if isinstance(value, str) and _json_object(value) is not None:
        return value
    return None


def replay_arguments(item: Mapping[str, Any]) -> str:
    """The arguments string replayed for a ``function_call`` item (Q22).

    ``arguments_ran`` (what the tool actually ran with) wins; then the stored
    ``arguments`` if they are a valid JSON object; else ``"{}"``.
    """
    for key in ("arguments_ran", "arguments"):
        replay = _object_string(item.get(key))
        if replay is not None:
            return replay
    return "{}"


def _call_of(item: Mapping[str, Any]) -> tuple[str, str]:
    """(name, arguments) as the model should see its own call: ``provider_function``
    (a call dispatched through ``call_tool``) restores the model-authored call."""
    provider = item.get("provider_function")
    if isinstance(provider, Mapping) and provider.get("name"):
        return str(provider["name"]), _object_string(provider.get("arguments")) or "{}"
    return str(item.get("name") or ""), replay_arguments(item)


def _reasoning_text(item: Mapping[str, Any]) -> str:
    text = _text_of_parts(item.get("content"))
    if not text:
        summary = item.get("summary")
        if isinstance(summary, list):
            text = "\n".join(s.get("text") or "" for s in summary if isinstance(s, Mapping) and s.get("text"))
    return text


def _replayable_details(details: Any) -> list[Any]:
    """Provider ``reasoning_details`` worth replaying: Anthropic entries without a
    signature cannot be verified by the provider and are dropped."""
    if not isinstance(details, list):
        return []
    out = []
    for entry in details:
        if (
            isinstance(entry, Mapping)
            and str(entry.get("format") or "").startswith("anthropic")
            and not entry.get("signature")
        ):
            continue
        out.append(entry)
    return out


_LOCAL_ID = re.compile(r"(?:msg|r|fc|fco|ci|cc|call)_[0-9a-f]{24}")


def is_local_id(value: Any) -> bool:
    """An id turnlog made itself (``prefix_`` + 24 hex, spec §1.1), as opposed to
    a provider's item id (OpenAI's are longer), which a stored-response replay
    may reference."""
    return isinstance(value, str) and _LOCAL_ID.fullmatch(value) is not None


def has_provider_reasoning(item: Mapping[str, Any]) -> bool:
    """A reasoning item the provider can take back (Q10): it has
    ``encrypted_content`` or a provider id (``rs_…``)."""
    if item.get("type") != "reasoning":
        return False
    item_id = item.get("id")
    return bool(item.get("encrypted_content")) or (isinstance(item_id, str) and item_id.startswith("rs_"))


def responses_reasoning_item(item: Mapping[str, Any]) -> Item:
    """A stored reasoning item as a Responses API input item (only the fields the
    API takes back: ``id``, ``summary``, ``encrypted_content``)."""
    summary = [
        {"type": "summary_text", "text": s.get("text") or ""}
        for s in (item.get("summary") or [])
        if isinstance(s, Mapping)
    ]
    out: Item = {"type": "reasoning", "summary": summary}
    if isinstance(item.get("id"), str) and item["id"].startswith("rs_"):
        out["id"] = item["id"]
    if item.get("encrypted_content"):
        out["encrypted_content"] = item["encrypted_content"]
    return out


def _code_interpreter_text(item: Mapping[str, Any]) -> str:
    """``<code_interpreter>`` + ``<code_interpreter_output>`` blocks (§8.1). The
    output is stdout, else the result, else (turnlog) stderr so the model sees
    its error; no output block when there is no output yet."""
    code = item.get("code") or ""
    text = f"<code_interpreter>\n{code}\n</code_interpreter>"
    output = item.get("output")
    if isinstance(output, Mapping):
        output = output.get("stdout") or output.get("result") or output.get("stderr")
    if output is not None and not isinstance(output, str):
        output = json.dumps(output, ensure_ascii=False)
    if output:
        text += f"\n<code_interpreter_output>\n{output}\n</code_interpreter_output>"
    return text


# --------------------------------------------------------------------------
# Output items → Chat Completions messages (§8.1)
# --------------------------------------------------------------------------


class _Assistant:
    """The assistant message being gathered from consecutive items."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.tool_calls: list[dict[str, Any]] = []
        self.reasoning: list[str] = []
        self.details: list[Any] = []
        self.items: list[Item] = []  # Responses input items, "responses" format only
        self.provider_reasoning = False

    def message(self, reasoning_format: str | None) -> Message | None:
        if not (self.content or self.tool_calls or self.reasoning or self.details):
            return None
        msg: Message = {"role": "assistant", "content": "\n".join(self.content)}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        if self.reasoning and reasoning_format in ("thinking", "reasoning_content"):
            msg[reasoning_format] = "\n".join(self.reasoning)
        if self.details:
            msg["reasoning_details"] = self.details
        if self.provider_reasoning and self.items:
            msg["responses_items"] = self.items
        return msg


def convert_output_to_messages(
    output: list[dict[str, Any]],
    *,
    raw: bool = False,
    reasoning_format: str | None = None,
    flatten_tool_images: bool = False,
) -> list[dict[str, Any]]:
    """Chat Completions messages for a list of output items (spec §8.1).

    * A call is replayed only if its ``function_call`` has status
      completed/failed/rejected AND an output with the same ``call_id`` exists;
      otherwise both halves are dropped. Arguments follow Q22
      (``replay_arguments``); ``provider_function`` restores the model's call.
    * Consecutive text, reasoning and calls gather into ONE assistant message
      (texts joined with ``\\n``; whitespace-only texts skipped). A run of tool
      outputs closes it and adds one ``tool`` message per output (text parts
      joined with ``\\n``). Tool images: with ``flatten_tool_images`` one user
      message with all the run's images follows the run; otherwise the tool
      content is the list of ``input_text``/``input_image`` parts.
    * ``raw`` replays provider ``reasoning_details`` (see ``_replayable_details``).
    * Code-interpreter items (``code_interpreter`` or
      ``open_webui:code_interpreter``) replay as tagged text.
    * Unknown items (e.g. context compaction) are skipped. Finally
      ``sanitize_tool_pairs`` removes anything still unpaired.
    """
    answered = {
        item.get("call_id")
        for item in output
        if isinstance(item, Mapping) and item.get("type") == "function_call_output"
    }
    replayable = {
        item.get("call_id")
        for item in output
        if isinstance(item, Mapping)
        and item.get("type") == "function_call"
        and item.get("status") in REPLAYABLE_CALL_STATUSES
        and item.get("call_id") in answered
    }
    replayable.discard(None)
    responses_mode = reasoning_format == REASONING_RESPONSES

    messages: list[Message] = []
    assistant = _Assistant()
    tool_run: list[Message] = []
    run_images: list[str] = []
    emitted_outputs: set[Any] = set()
    emitted_calls: set[Any] = set()
    held_reasoning: Item | None = None  # a provider reasoning item waiting for its following item

    def close_assistant() -> None:
        nonlocal assistant
        msg = assistant.message(reasoning_format)
        if msg is not None:
            messages.append(msg)
        assistant = _Assistant()

    def close_run() -> None:
        if not tool_run:
            return
        messages.extend(tool_run)
        if flatten_tool_images and run_images:
            parts: list[dict[str, Any]] = [{"type": "text", "text": TOOL_IMAGES_PROMPT}]
            parts.extend({"type": "image_url", "image_url": {"url": url}} for url in run_images)
            messages.append({"role": "user", "content": parts})
        tool_run.clear()
        run_images.clear()

    def contribute(responses_item: Item | None = None) -> _Assistant:
        """About to add to the assistant message: end any tool run first, and
        (responses format) place a held reasoning item before its follower."""
        nonlocal held_reasoning
        close_run()
        if responses_mode and responses_item is not None:
            if held_reasoning is not None:
                assistant.items.append(held_reasoning)
                assistant.provider_reasoning = True
            assistant.items.append(responses_item)
        held_reasoning = None
        return assistant

    for item in output:
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        follows_held = held_reasoning
        held_reasoning = None if kind != "reasoning" else held_reasoning

        if kind == "function_call_output":
            call_id = item.get("call_id")
            if call_id not in replayable or call_id in emitted_outputs:
                continue
            emitted_outputs.add(call_id)
            close_assistant()
            raw_parts = item.get("output")
            parts = [p for p in raw_parts if isinstance(p, Mapping)] if isinstance(raw_parts, list) else []
            text_parts = [p for p in parts if _is_text_part(p)]
            images = [url for p in parts if _is_image_part(p) and (url := _image_url(p))]
            if isinstance(item.get("output"), str):
                text = item["output"]
            else:
                text = "\n".join(p.get("text") or "" for p in text_parts)
            content: Any = text
            if images and flatten_tool_images:
                run_images.extend(images)
            elif images:
                content = [dict(p) for p in parts if p.get("type") in ("input_text", "input_image")]
            tool_run.append({"role": "tool", "tool_call_id": call_id, "content": content})

        elif kind == "function_call":
            call_id = item.get("call_id")
            if call_id not in replayable or call_id in emitted_calls:
                continue
            emitted_calls.add(call_id)
            name, arguments = _call_of(item)
            fc_item: Item = {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}
            if isinstance(item.get("id"), str) and item["id"] != call_id and not is_local_id(item["id"]):
                fc_item["id"] = item["id"]
            held_reasoning = follows_held
            contribute(fc_item).tool_calls.append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            )

        elif kind == "message":
            text = _text_of_parts(item.get("content"))
            if not text.strip():
                continue
            msg_item: Item = {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
            if isinstance(item.get("id"), str) and not is_local_id(item["id"]):
                msg_item["id"] = item["id"]
                msg_item["status"] = "completed"
            held_reasoning = follows_held
            contribute(msg_item).content.append(text)

        elif kind == "reasoning":
            if raw:
                details = _replayable_details(item.get("reasoning_details"))
                if details:
                    contribute().details.extend(details)
            if reasoning_format == "think_tags":
                text = _reasoning_text(item)
                if text:
                    start = item.get("start_tag") or "<think>"
                    end = item.get("end_tag") or "</think>"
                    contribute().content.append(f"{start}{text}{end}")
            elif reasoning_format in ("thinking", "reasoning_content"):
                text = _reasoning_text(item)
                if text:
                    contribute().reasoning.append(text)
            elif responses_mode and has_provider_reasoning(item):
                # Held until the next item: the Responses API needs a reasoning
                # item immediately followed by the item it belongs to.
                held_reasoning = responses_reasoning_item(item)

        elif kind in CODE_INTERPRETER_TYPES:
            text = _code_interpreter_text(item)
            contribute({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]})
            assistant.content.append(text)

    close_run()
    close_assistant()
    return sanitize_tool_pairs(messages)


# --------------------------------------------------------------------------
# History preparation (§8.2)
# --------------------------------------------------------------------------


def _call_ids(message: Mapping[str, Any]) -> list[Any]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [call.get("id") for call in calls if isinstance(call, Mapping)]


def _has_content(content: Any) -> bool:
    if isinstance(content, str):
        return bool(content.strip())
    if isinstance(content, list):
        return bool(content)
    return False


def sanitize_tool_pairs(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep only tool calls answered by the tool messages that directly follow
    their assistant message, and only tool messages claimed by that assistant
    message (the first answer per call). An assistant message left with no calls
    survives only if it has content. Other messages pass through. Returns a new
    list; edited messages are copies."""
    out: list[Message] = []
    i = 0
    n = len(messages)
    while i < n:
        message = messages[i]
        role = message.get("role")
        if role == "tool":
            i += 1  # not directly after an assistant message with calls: orphan
            continue
        if role != "assistant" or not message.get("tool_calls"):
            out.append(message)
            i += 1
            continue
        j = i + 1
        while j < n and messages[j].get("role") == "tool":
            j += 1
        ids = _call_ids(message)
        answered = {m.get("tool_call_id") for m in messages[i + 1 : j]} & set(ids)
        answered.discard(None)
        calls = [c for c in message["tool_calls"] if isinstance(c, Mapping) and c.get("id") in answered]
        if calls:
            kept = message if len(calls) == len(message["tool_calls"]) else {**message, "tool_calls": calls}
            out.append(kept)
            seen: set[Any] = set()
            for tool in messages[i + 1 : j]:
                call_id = tool.get("tool_call_id")
                if call_id in answered and call_id not in seen:
                    seen.add(call_id)
                    out.append(tool)
        elif _has_content(message.get("content")):
            out.append({k: v for k, v in message.items() if k != "tool_calls"})
        i = j
    return out


def process_messages_with_output(
    messages: list[dict[str, Any]], *, reasoning_format: str | None = None
) -> list[dict[str, Any]]:
    """Prepare a stored chat history for the model (spec §8.2).

    Assistant messages with a non-empty ``output`` are expanded with
    ``convert_output_to_messages`` (their ``content`` is ignored); every other
    message loses the bookkeeping keys (``BOOKKEEPING_KEYS``, including
    ``files``). Not implemented from Open WebUI: the ``include_file_context``
    ``<attached_files>`` prefix (turnlog brings files in through its own
    assembly steps) and voice-transcript messages.
    """
    out: list[Message] = []
    for message in messages:
        output = message.get("output")
        if message.get("role") == "assistant" and isinstance(output, list) and output:
            out.extend(convert_output_to_messages(output, reasoning_format=reasoning_format))
            continue
        out.append({k: v for k, v in message.items() if k not in BOOKKEEPING_KEYS})
    return out


# --------------------------------------------------------------------------
# Chat Completions → Responses API (§6.6 adapter mapping)
# --------------------------------------------------------------------------


def _input_image(part: Mapping[str, Any]) -> Item | None:
    url = _image_url(part)
    if url is None:
        return None
    detail = part.get("detail")
    if detail is None and isinstance(part.get("image_url"), Mapping):
        detail = part["image_url"].get("detail")
    return {"type": "input_image", "image_url": url, "detail": detail or "auto"}


def _input_parts(content: Any) -> list[Item]:
    """User/developer content → Responses input content parts."""
    if content is None:
        return [{"type": "input_text", "text": ""}]
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    parts: list[Item] = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text"):
            parts.append({"type": "input_text", "text": part.get("text") or ""})
        elif kind in ("image_url", "input_image"):
            image = _input_image(part)
            if image is not None:
                parts.append(image)
        elif kind == "file" and isinstance(part.get("file"), Mapping):
            parts.append({"type": "input_file", **{k: v for k, v in part["file"].items() if v is not None}})
        else:
            parts.append(dict(part))  # already a Responses part (input_file, input_audio…)
    return parts or [{"type": "input_text", "text": ""}]


def _assistant_text(content: Any) -> str:
    """String content, or the non-empty text parts of list content joined with ``\n``."""
    if isinstance(content, list):
        return "\n".join(part.get("text") for part in content if _is_text_part(part) and part.get("text"))
    return content if isinstance(content, str) else ""


def tool_output_value(content: Any) -> str | list[Item]:
    """A tool result as a Responses ``function_call_output.output``: a string,
    or a list of ``input_text``/``input_image`` parts when there are images."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return "" if content is None else json.dumps(content, ensure_ascii=False)
    if not any(_is_image_part(p) for p in content):
        return "\n".join(p.get("text") or "" for p in content if _is_text_part(p))
    parts: list[Item] = []
    for part in content:
        if _is_text_part(part):
            parts.append({"type": "input_text", "text": part.get("text") or ""})
        elif _is_image_part(part):
            image = _input_image(part)
            if image is not None:
                parts.append(image)
    return parts


def _strip_ids(item: Item) -> Item:
    return {k: v for k, v in item.items() if k not in ("id", "status")}


def _replay_items(message: Mapping[str, Any], store: bool) -> list[Item]:
    """An assistant message's kept Responses items (``responses`` reasoning
    format), filtered to its surviving tool calls; a reasoning item must be
    immediately followed by the item it belongs to or it is dropped."""
    calls = {c.get("id"): c for c in message.get("tool_calls") or [] if isinstance(c, Mapping)}
    items: list[Item] = []
    for raw_item in message.get("responses_items") or []:
        if not isinstance(raw_item, Mapping):
            continue
        item = dict(raw_item)
        if item.get("type") == "function_call":
            if item.get("call_id") not in calls:
                continue
            calls.pop(item["call_id"])
        if item.get("type") == "reasoning" and not store and not item.get("encrypted_content"):
            continue  # only resolvable from the provider's store
        items.append(item if store else _strip_ids(item))
    # Calls the kept items do not cover (should not happen) are derived.
    for call_id, call in calls.items():
        fn = call.get("function") or {}
        items.append(
            {
                "type": "function_call",
                "call_id": call_id,
                "name": fn.get("name") or "",
                "arguments": _object_string(fn.get("arguments")) or "{}",
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


def to_responses_input(
    messages: list[dict[str, Any]], *, store: bool = True
) -> tuple[str | None, list[dict[str, Any]]]:
    """Chat messages → (``instructions``, Responses ``input`` items) (§6.6).

    * system → ``instructions`` (the LAST system message wins; list content: its
      text parts joined with ``\\n``);
    * user / developer → ``message`` with ``input_text`` / ``input_image
      {image_url, detail}`` (``detail`` defaults to ``"auto"``; a detail given on
      the Chat part is kept) / ``input_file`` parts;
    * assistant → an optional ``message`` with an ``output_text`` part (when it
      has text), followed by one ``function_call {call_id, name, arguments}``
      per tool call; an assistant message carrying ``responses_items``
      (reasoning format ``"responses"``) replays those items instead, in their
      original order, reasoning included (Q10);
    * tool → ``function_call_output {call_id, output}``.

    ``store=False`` (the provider keeps nothing): reasoning items without
    ``encrypted_content`` are dropped and item ids are removed, since nothing
    can be looked up by id.
    """
    instructions: str | None = None
    items: list[Item] = []
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        if role == "system":
            instructions = _assistant_text(content) if isinstance(content, list) else (content or "")
        elif role in ("user", "developer"):
            items.append({"type": "message", "role": role, "content": _input_parts(content)})
        elif role == "assistant":
            if message.get("responses_items"):
                items.extend(_replay_items(message, store))
                continue
            text = _assistant_text(content)
            if text:
                items.append(
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
                )
            for call in message.get("tool_calls") or []:
                if not isinstance(call, Mapping):
                    continue
                fn = call.get("function") or {}
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call.get("id"),
                        "name": fn.get("name") or "",
                        "arguments": _object_string(fn.get("arguments")) or "{}",
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


def _responses_tool(tool: Any) -> Any:
    if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(tool.get("function"), Mapping):
        return tool  # already flat, or a hosted tool (web_search, file_search…)
    fn = tool["function"]
    out: dict[str, Any] = {"type": "function", "name": fn.get("name")}
    if fn.get("description") is not None:
        out["description"] = fn["description"]
    out["parameters"] = fn.get("parameters") or {"type": "object", "properties": {}}
    out["strict"] = fn["strict"] if isinstance(fn.get("strict"), bool) else False
    return out


def _responses_tool_choice(choice: Any) -> Any:
    if isinstance(choice, Mapping) and choice.get("type") == "function" and isinstance(choice.get("function"), Mapping):
        return {"type": "function", "name": choice["function"].get("name")}
    return choice


def _responses_text_format(response_format: Any) -> dict[str, Any] | None:
    if not isinstance(response_format, Mapping):
        return None
    kind = response_format.get("type")
    if kind == "json_schema" and isinstance(response_format.get("json_schema"), Mapping):
        return {"type": "json_schema", **response_format["json_schema"]}
    if kind in ("json_object", "text"):
        return {"type": kind}
    return None


def responses_body(chat_body: dict[str, Any], *, store: bool | None = None) -> dict[str, Any]:
    """A Chat Completions request body as a Responses API body (§6.6).

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
    body: dict[str, Any] = {}
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
                body["text"] = {**(chat_body.get("text") or {}), "format": text_format}
        elif key == "reasoning_effort":
            if value is not None:
                body["reasoning"] = {**(chat_body.get("reasoning") or {}), "effort": value}
        else:
            body.setdefault(key, value)
    limit = chat_body.get("max_completion_tokens", chat_body.get("max_tokens"))
    if limit is not None:
        body["max_output_tokens"] = limit
    if "messages" in chat_body:
        instructions, items = to_responses_input(chat_body.get("messages") or [], store=store)
        if instructions is not None:
            body["instructions"] = instructions
        body["input"] = items
    return body


def stateful_continuation_input(round_output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``input`` of a stateful tool-loop continuation (``previous_response_id``).

    Only the round's new ``function_call_output`` items (Q9: Open WebUI also
    re-sends the round's assistant text and calls, which the provider already
    stores under ``previous_response_id``), in output order, one per call. An
    output is sent only when its call is a ``function_call`` of the same round
    (the provider's response knows nothing else); the ``instructions`` are the
    caller's to set.
    """
    calls = {
        item.get("call_id")
        for item in round_output
        if isinstance(item, Mapping) and item.get("type") == "function_call" and item.get("call_id")
    }
    items: list[Item] = []
    seen: set[Any] = set()
    for item in round_output:
        if not isinstance(item, Mapping) or item.get("type") != "function_call_output":
            continue
        call_id = item.get("call_id")
        if call_id not in calls or call_id in seen:
            continue
        seen.add(call_id)
        output = item.get("output")
        items.append({"type": "function_call_output", "call_id": call_id, "output": tool_output_value(output)})
    return items


# --------------------------------------------------------------------------
# Chat Completions → Ollama /api/chat
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


def _ollama_content(content: Any) -> tuple[str, list[str]]:
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        return "", []
    texts: list[str] = []
    images: list[str] = []
    for part in content:
        if _is_text_part(part):
            if part.get("text"):
                texts.append(part["text"])
        elif _is_image_part(part):
            url = _image_url(part)
            data = _base64_of(url) if url else None
            if data:
                images.append(data)
    return "\n".join(texts), images


def ollama_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages → Ollama ``/api/chat`` messages.

    Content is a string (text parts joined with ``\\n``) and images go to
    ``images`` as base64 (``data:`` URLs only); assistant ``tool_calls`` carry
    ``function.arguments`` as OBJECTS (invalid JSON → ``{}``);
    ``reasoning_content``/``thinking`` become ``thinking``; tool results are
    ``role: tool`` with ``tool_name`` when the call is known.
    """
    names: dict[Any, str] = {}
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
            calls = []
            for call in message.get("tool_calls") or []:
                if not isinstance(call, Mapping):
                    continue
                fn = call.get("function") or {}
                name = fn.get("name") or ""
                names[call.get("id")] = name
                calls.append({"function": {"name": name, "arguments": _json_object(fn.get("arguments")) or {}}})
            if calls:
                msg["tool_calls"] = calls
        elif role == "tool":
            name = message.get("tool_name") or message.get("name") or names.get(message.get("tool_call_id"))
            if name:
                msg["tool_name"] = name
        out.append(msg)
    return out


def for_model(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Output items as the model is shown them: a tool result with images becomes
    text plus ``input_image`` parts (the images go to the model, not to clients)."""
    out = []
    for item in items:
        if item.get("type") == "function_call_output" and item.get("images"):
            parts = [{"type": "input_text", "text": item.get("output") or ""}]
            parts += [{"type": "input_image", "image_url": url} for url in item["images"]]
            item = {**item, "output": parts}
        out.append(item)
    return out
