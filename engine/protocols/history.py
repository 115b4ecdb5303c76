"""History: stored output items → Chat Completions messages, the engine's canonical transcript.

A turn's answer is stored as output items (Open WebUI's: ``message``,
``function_call``, ``function_call_output``, ``reasoning``, code-interpreter
items); the model is shown a transcript of Chat Completions messages, whatever
protocol the upstream speaks. This module is that protocol-neutral step, pure
functions, as Open WebUI converts history; the protocol modules (``chat``, ``responses``,
``ollama``) map the transcript onto their wire format.

* ``convert_output_to_messages`` turns an assistant turn's output items
  into Chat Completions messages (assistant / tool / user-with-images);
* ``process_messages_with_output`` and ``sanitize_tool_pairs`` prepare a whole
  chat history;
* ``for_model`` shows tool-result images to the model.

Keys turnlog reads on stored items beyond Open WebUI's:

* ``function_call.arguments_ran`` — the (filtered) arguments the tool was
  actually called with, as an object or a JSON object string. When present it
  is what gets replayed to the model (Open WebUI replays the unfiltered
  arguments; pinned by tests/test_convert.py::test_q22_replayed_arguments). Without it the stored ``arguments`` are replayed when they are a
  valid JSON object, else ``"{}"`` (Open WebUI replays invalid JSON as is, which
  some providers reject).
* ``reasoning.encrypted_content`` / a provider id ``rs_…`` — a Responses API
  reasoning item the provider can take back (see ``REASONING_RESPONSES``
  and ``engine.protocols.responses``).

Reasoning replay (``reasoning_format``):

``None``
    reasoning is not replayed (raw mode still replays ``reasoning_details``);
``"think_tags"``
    ``<start_tag>text<end_tag>`` becomes part of the assistant content;
``"thinking"`` / ``"reasoning_content"``
    a top-level field of the assistant message (Ollama / llama.cpp);
``"responses"`` (turnlog only)
    for Responses API upstreams (stateless continuations and history):
    reasoning items carrying provider data are kept, in their original order
    together with the items that followed them, as Responses input items under
    the assistant message's ``responses_items`` key;
    ``engine.protocols.responses.to_responses_input`` replays them. Open WebUI
    drops these items, so reasoning models lose their chain of thought between
    tool rounds. This key is for the Responses adapter only: never send a
    ``"responses"``-format history to a Chat Completions upstream. It is why
    this module imports the reasoning-item helpers of ``responses``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

from engine.json_types import JsonValue
from engine.protocols.common import image_url, is_image_part, is_text_part, object_string
from engine.protocols.responses import has_provider_reasoning, is_local_id, responses_reasoning_item
from engine.protocols.shapes import Item, Message, list_of, text_of

__all__ = [
    "BOOKKEEPING_KEYS",
    "CODE_INTERPRETER_TYPES",
    "REASONING_FORMATS",
    "REASONING_RESPONSES",
    "REPLAYABLE_CALL_STATUSES",
    "TOOL_IMAGES_PROMPT",
    "convert_output_to_messages",
    "distinct_call_ids",
    "for_model",
    "process_messages_with_output",
    "replay_arguments",
    "sanitize_tool_pairs",
]

#: A call is replayed only if its ``function_call`` item has one of these
#: statuses and an output with the same ``call_id`` exists (as in Open WebUI).
REPLAYABLE_CALL_STATUSES = frozenset({"completed", "failed", "rejected"})
#: Turnlog's code-interpreter item type, and Open WebUI's.
CODE_INTERPRETER_TYPES = frozenset({"code_interpreter", "open_webui:code_interpreter"})
#: The ``reasoning_format`` that keeps provider reasoning items for the Responses API
#: (Open WebUI does not replay them; pinned by
#: tests/test_convert.py::test_q10_responses_reasoning_kept_in_order_with_ids).
REASONING_RESPONSES = "responses"
REASONING_FORMATS = frozenset({"think_tags", "thinking", "reasoning_content", REASONING_RESPONSES})
#: The text of the user message that carries tool images when they are flattened.
TOOL_IMAGES_PROMPT = "Here are the images from the tool results above. Please analyze them."
#: Keys of stored chat messages that are bookkeeping, never sent upstream.
BOOKKEEPING_KEYS = frozenset({"id", "output", "model", "contextSummary", "usage", "meta", "files"})


# --------------------------------------------------------------------------
# Small readers
# --------------------------------------------------------------------------


def _text_of_parts(parts: object, types: Iterable[str] = ("output_text", "text")) -> str:
    """Concatenated text of content parts of the given types (``text`` is read
    too: Open WebUI pads with ``text`` parts and then cannot read them)."""
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        return ""
    wanted = set(types)
    return "".join(part.get("text") or "" for part in parts if isinstance(part, Mapping) and part.get("type") in wanted)


def replay_arguments(item: Mapping[str, object]) -> str:
    """The arguments string replayed for a ``function_call`` item: what ran, always a JSON object.

    ``arguments_ran`` (what the tool actually ran with) wins; then the stored
    ``arguments`` if they are a valid JSON object; else ``"{}"``.
    """
    for key in ("arguments_ran", "arguments"):
        replay = object_string(item.get(key))
        if replay is not None:
            return replay
    return "{}"


def _call_of(item: Mapping[str, object]) -> tuple[str, str]:
    """(name, arguments) as the model should see its own call: ``provider_function``
    (a call dispatched through ``call_tool``) restores the model-authored call."""
    provider = item.get("provider_function")
    if isinstance(provider, Mapping) and provider.get("name"):
        return str(provider["name"]), object_string(provider.get("arguments")) or "{}"
    return str(item.get("name") or ""), replay_arguments(item)


def _reasoning_text(item: Mapping[str, object]) -> str:
    text = _text_of_parts(item.get("content"))
    if not text:
        summary = item.get("summary")
        if isinstance(summary, list):
            text = "\n".join(s.get("text") or "" for s in summary if isinstance(s, Mapping) and s.get("text"))
    return text


def _replayable_details(details: object) -> list[JsonValue]:
    """Provider ``reasoning_details`` worth replaying: Anthropic entries without a
    signature cannot be verified by the provider and are dropped."""
    if not isinstance(details, list):
        return []
    out: list[JsonValue] = []
    for entry in details:
        if isinstance(entry, Mapping) and str(entry.get("format") or "").startswith("anthropic") and not entry.get("signature"):
            continue
        out.append(entry)
    return out


def _code_interpreter_text(item: Mapping[str, object]) -> str:
    """``<code_interpreter>`` + ``<code_interpreter_output>`` blocks. The
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
# Output items → Chat Completions messages
# --------------------------------------------------------------------------


class _Assistant:
    """The assistant message being gathered from consecutive items."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.tool_calls: list[JsonValue] = []
        self.reasoning: list[str] = []
        self.details: list[JsonValue] = []
        self.items: list[JsonValue] = []  # Responses input items, "responses" format only
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
    output: Sequence[JsonValue],
    *,
    raw: bool = False,
    reasoning_format: str | None = None,
    flatten_tool_images: bool = False,
) -> list[Message]:
    """Chat Completions messages for a list of output items.

    * A call is replayed only if its ``function_call`` has status
      completed/failed/rejected AND an output with the same ``call_id`` exists;
      otherwise both halves are dropped. Arguments are what ran
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
    converter = _OutputConverter(output, raw=raw, reasoning_format=reasoning_format, flatten_tool_images=flatten_tool_images)
    for item in output:
        if isinstance(item, Mapping):
            converter.add(item)
    return converter.finish()


class _OutputConverter:
    """The state of one ``convert_output_to_messages``: the messages so far,
    the assistant message being gathered, the tool run being gathered, and a
    provider reasoning item held for the item that follows it."""

    def __init__(self, output: Sequence[JsonValue], *, raw: bool, reasoning_format: str | None, flatten_tool_images: bool) -> None:
        answered = {item.get("call_id") for item in output if isinstance(item, Mapping) and item.get("type") == "function_call_output"}
        self.replayable = {
            item.get("call_id")
            for item in output
            if isinstance(item, Mapping)
            and item.get("type") == "function_call"
            and item.get("status") in REPLAYABLE_CALL_STATUSES
            and item.get("call_id") in answered
        }
        self.replayable.discard(None)
        self.raw = raw
        self.reasoning_format = reasoning_format
        self.responses_mode = reasoning_format == REASONING_RESPONSES
        self.flatten_tool_images = flatten_tool_images
        self.messages: list[Message] = []
        self.assistant = _Assistant()
        self.tool_run: list[Message] = []
        self.run_images: list[str] = []
        self.emitted_outputs: set[JsonValue] = set()
        self.emitted_calls: set[JsonValue] = set()
        self.held_reasoning: Item | None = None  # a provider reasoning item waiting for its following item

    def add(self, item: Mapping[str, JsonValue]) -> None:
        kind = item.get("type")
        follows_held = self.held_reasoning
        if kind != "reasoning":
            self.held_reasoning = None  # only the very next call or message may follow it
        if kind == "function_call_output":
            self._output(item)
        elif kind == "function_call":
            self._call(item, follows_held)
        elif kind == "message":
            self._message(item, follows_held)
        elif kind == "reasoning":
            self._reasoning(item)
        elif kind in CODE_INTERPRETER_TYPES:
            text = _code_interpreter_text(item)
            self._contribute({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]})
            self.assistant.content.append(text)

    def finish(self) -> list[Message]:
        self._close_run()
        self._close_assistant()
        return sanitize_tool_pairs(self.messages)

    def _close_assistant(self) -> None:
        msg = self.assistant.message(self.reasoning_format)
        if msg is not None:
            self.messages.append(msg)
        self.assistant = _Assistant()

    def _close_run(self) -> None:
        if not self.tool_run:
            return
        self.messages.extend(self.tool_run)
        if self.flatten_tool_images and self.run_images:
            parts: list[JsonValue] = [{"type": "text", "text": TOOL_IMAGES_PROMPT}]
            parts.extend({"type": "image_url", "image_url": {"url": url}} for url in self.run_images)
            self.messages.append({"role": "user", "content": parts})
        self.tool_run.clear()
        self.run_images.clear()

    def _contribute(self, responses_item: Item | None = None) -> _Assistant:
        """About to add to the assistant message: end any tool run first, and
        (responses format) place a held reasoning item before its follower."""
        self._close_run()
        if self.responses_mode and responses_item is not None:
            if self.held_reasoning is not None:
                self.assistant.items.append(self.held_reasoning)
                self.assistant.provider_reasoning = True
            self.assistant.items.append(responses_item)
        self.held_reasoning = None
        return self.assistant

    def _output(self, item: Mapping[str, JsonValue]) -> None:
        call_id = item.get("call_id")
        if call_id not in self.replayable or call_id in self.emitted_outputs:
            return
        self.emitted_outputs.add(call_id)
        self._close_assistant()
        raw_parts = item.get("output")
        parts = [p for p in raw_parts if isinstance(p, Mapping)] if isinstance(raw_parts, list) else []
        images = [url for p in parts if is_image_part(p) and (url := image_url(p))]
        if isinstance(raw_parts, str):
            text = raw_parts
        else:
            text = "\n".join(text_of(p.get("text")) for p in parts if is_text_part(p))
        content: JsonValue = text
        if images and self.flatten_tool_images:
            self.run_images.extend(images)
        elif images:
            content = [dict(p) for p in parts if p.get("type") in ("input_text", "input_image")]
        self.tool_run.append({"role": "tool", "tool_call_id": call_id, "content": content})

    def _call(self, item: Mapping[str, JsonValue], follows_held: Item | None) -> None:
        call_id = item.get("call_id")
        if call_id not in self.replayable or call_id in self.emitted_calls:
            return
        self.emitted_calls.add(call_id)
        name, arguments = _call_of(item)
        fc_item: Item = {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}
        if isinstance(item_id := item.get("id"), str) and item_id != call_id and not is_local_id(item_id):
            fc_item["id"] = item_id
        self.held_reasoning = follows_held
        self._contribute(fc_item).tool_calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})

    def _message(self, item: Mapping[str, JsonValue], follows_held: Item | None) -> None:
        text = _text_of_parts(item.get("content"))
        if not text.strip():
            return
        msg_item: Item = {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        if isinstance(item_id := item.get("id"), str) and not is_local_id(item_id):
            msg_item["id"] = item_id
            msg_item["status"] = "completed"
        self.held_reasoning = follows_held
        self._contribute(msg_item).content.append(text)

    def _reasoning(self, item: Mapping[str, JsonValue]) -> None:
        if self.raw:
            details = _replayable_details(item.get("reasoning_details"))
            if details:
                self._contribute().details.extend(details)
        fmt = self.reasoning_format
        if fmt == "think_tags":
            text = _reasoning_text(item)
            if text:
                start = item.get("start_tag") or "<think>"
                end = item.get("end_tag") or "</think>"
                self._contribute().content.append(f"{start}{text}{end}")
        elif fmt in ("thinking", "reasoning_content"):
            text = _reasoning_text(item)
            if text:
                self._contribute().reasoning.append(text)
        elif self.responses_mode and has_provider_reasoning(item):
            # Held until the next item: the Responses API needs a reasoning
            # item immediately followed by the item it belongs to.
            self.held_reasoning = responses_reasoning_item(item)


# --------------------------------------------------------------------------
# History preparation
# --------------------------------------------------------------------------


def _call_ids(message: Mapping[str, JsonValue]) -> list[JsonValue]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [call.get("id") for call in calls if isinstance(call, Mapping)]


def _has_content(content: object) -> bool:
    if isinstance(content, str):
        return bool(content.strip())
    if isinstance(content, list):
        return bool(content)
    return False


def sanitize_tool_pairs(messages: Sequence[Message]) -> list[Message]:
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
        all_calls = list_of(message.get("tool_calls"))
        calls: list[JsonValue] = [c for c in all_calls if isinstance(c, Mapping) and c.get("id") in answered]
        if calls:
            kept = message if len(calls) == len(all_calls) else {**message, "tool_calls": calls}
            out.append(kept)
            seen: set[JsonValue] = set()
            for tool in messages[i + 1 : j]:
                call_id = tool.get("tool_call_id")
                if call_id in answered and call_id not in seen:
                    seen.add(call_id)
                    out.append(tool)
        elif _has_content(message.get("content")):
            out.append({k: v for k, v in message.items() if k != "tool_calls"})
        i = j
    return out


def process_messages_with_output(messages: Sequence[Message], *, reasoning_format: str | None = None) -> list[Message]:
    """Prepare a stored chat history for the model.

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
# Output items as the model is shown them
# --------------------------------------------------------------------------


def for_model(items: Sequence[Item]) -> list[Item]:
    """Output items as the model is shown them: a tool result with images becomes
    text plus ``input_image`` parts (the images go to the model, not to clients)."""
    out: list[Item] = []
    for item in items:
        if item.get("type") == "function_call_output" and isinstance(images := item.get("images"), list) and images:
            parts: list[JsonValue] = [{"type": "input_text", "text": item.get("output") or ""}]
            parts += [{"type": "input_image", "image_url": url} for url in images]
            item = {**item, "output": parts}
        out.append(item)
    return out


def distinct_call_ids(items: Sequence[Item]) -> list[Item]:
    """Output items with every round's calls under ids of their own.

    A log written before turnlog made call ids turn-unique can hold one
    provider id in several rounds (``call_0`` every round). Pairing by id
    would then drop the later rounds from the history; instead a repeated
    call gets ``<id>_<n>`` (n = 2, 3, …; an unused id), and the results that
    follow it, until the id's next call, are renamed with it.
    """
    taken = {item.get("call_id") for item in items if item.get("type") == "function_call"}
    seen: dict[str, int] = {}
    current: dict[str, str] = {}  # the id a repeated call was given, for its results
    out: list[Item] = []
    for item in items:
        call_id = item.get("call_id")
        if item.get("type") == "function_call" and isinstance(call_id, str):
            seen[call_id] = seen.get(call_id, 0) + 1
            current.pop(call_id, None)
            if seen[call_id] > 1:
                n = seen[call_id]
                while f"{call_id}_{n}" in taken:
                    n += 1
                current[call_id] = f"{call_id}_{n}"
                taken.add(current[call_id])
        if isinstance(call_id, str) and call_id in current:
            item = {**item, "call_id": current[call_id]}
            if item.get("type") == "function_call" and item.get("id") == call_id:
                item["id"] = current[call_id]
        out.append(item)
    return out
