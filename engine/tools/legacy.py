"""Legacy (prompt-based) tool selection: ask a task model which tools to run.

Pure code with no I/O. Before the main call, when ``function_calling`` is
``legacy``, the engine shows the task model the tool specs and the recent chat
(``build_selection_request``), reads the calls out of its reply
(``parse_selection``), runs them like any other tool (``engine.tools.calls``) and
turns each non-empty result into a source (``tool_source``) that is later
rendered into the prompt as RAG context. It follows Open WebUI's
``chat_completion_tools_handler`` with two of its quirks fixed:

* The reply's JSON is the FIRST complete JSON object in it, not the text
  from the first ``{`` to the last ``}`` (which breaks as soon as the model adds
  a second object or a stray brace after it; pinned by
  tests/test_legacy_tools.py::test_parse_selection).
* ``{"tool_calls": []}`` means "no tools"; it never becomes one call
  named ``None`` (pinned by tests/test_legacy_tools.py::test_vector_no_tools_is_q27_fixed).

What the caller still does (as Open WebUI does it): send the request with
``stream: false`` and ``metadata.task = TASK``; keep only the parameters a
spec declares (``engine.tools.filter_arguments``, not for MCP tools); give
``tool_source`` exactly the parameters the tool ran with; skip empty results.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import NoReturn

from engine.json_types import JsonObject, JsonValue

#: ``metadata.task`` of the task-model request.
TASK = "function_calling"

#: The placeholder the template's tool list replaces.
TOOLS_PLACEHOLDER = "{{TOOLS}}"

#: How many messages before the last user message the task model sees.
HISTORY_WINDOW = 4

#: turnlog's own wording; asks for one JSON object and nothing else.
DEFAULT_TOOLS_TEMPLATE = """You decide which tools, if any, should run before the assistant answers the user's query.

Tools you may choose from (JSON function specifications):
{{TOOLS}}

How to decide:
- Read the query and the recent history, then pick only the tools whose results the answer really needs.
- Several tools, or the same tool several times, are fine when the query needs them.
- Fill each tool's parameters from its specification, using values stated in the query or the history; never invent values.
- If no tool fits, or the query can be answered without one, choose none.

Reply with a single JSON object and nothing else (no prose, no code fences):
{"tool_calls": [{"name": "<tool name>", "parameters": {"<parameter>": <value>}}]}
When no tool should run, reply exactly:
{"tool_calls": []}"""


# --------------------------------------------------------------------------
# The request
# --------------------------------------------------------------------------


def _function(spec: Mapping[str, object]) -> dict[str, object]:
    """An OpenAI function spec; a ``{"type": "function", "function": {...}}`` tool is unwrapped."""
    inner = spec.get("function")
    if spec.get("type") == "function" and isinstance(inner, Mapping):
        spec = inner
    return dict(spec)


def _text(content: object) -> str:
    """A message's text: string content as is, list content's text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [part.get("text") for part in content if isinstance(part, Mapping) and part.get("type") == "text"]
        return "\n".join(text for text in texts if isinstance(text, str) and text)
    return ""


def _last_user_index(messages: Sequence[Mapping[str, object]]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return i
    return None


def render_template(template: str | None, specs: Iterable[Mapping[str, object]]) -> str:
    """The system prompt: ``template`` (the default when None or empty) with
    ``{{TOOLS}}`` replaced by the JSON list of function specs."""
    tools_json = json.dumps([_function(spec) for spec in specs], ensure_ascii=False)
    return (template or DEFAULT_TOOLS_TEMPLATE).replace(TOOLS_PLACEHOLDER, tools_json)


def selection_prompt(messages: Sequence[Mapping[str, object]]) -> str:
    """The user message: ``History:`` with up to ``HISTORY_WINDOW`` messages
    before the last user message as ``ROLE: \"\"\"content\"\"\"`` lines, then
    ``Query: <last user message>``; only the ``Query:`` line without history.

    Messages after the last user message are not shown. Without a user message
    the query is empty and the history is the last messages of the chat.
    """
    index = _last_user_index(messages)
    if index is None:
        before, query = messages, ""
    else:
        before, query = messages[:index], _text(messages[index].get("content"))
    recent = before[-HISTORY_WINDOW:] if HISTORY_WINDOW > 0 else []
    lines = [f'{str(m.get("role") or "").upper()}: """{_text(m.get("content"))}"""' for m in recent]
    if not lines:
        return f"Query: {query}"
    return "History:\n" + "\n".join(lines) + f"\nQuery: {query}"


def build_selection_request(
    specs: Iterable[Mapping[str, object]],
    messages: Sequence[Mapping[str, object]],
    template: str | None = None,
) -> list[JsonObject]:
    """The task-model messages, as Open WebUI builds them: a system message with the rendered
    template, then a user message with the history and the query."""
    return [
        {"role": "system", "content": render_template(template, specs)},
        {"role": "user", "content": selection_prompt(messages)},
    ]


# --------------------------------------------------------------------------
# The reply
# --------------------------------------------------------------------------


def _reject_constant(name: str) -> NoReturn:
    # NaN / Infinity are not JSON; parameters must survive strict JSON (events).
    raise ValueError(f"non-JSON constant {name}")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def first_json_object(text: str) -> JsonObject | None:
    """The first complete JSON object in ``text`` (not first ``{`` to last ``}``).

    Decoding starts at the first ``{``; when no complete object starts there,
    the next ``{`` is tried, and so on. None when there is none.
    """
    if not isinstance(text, str):
        return None
    start = text.find("{")
    while start != -1:
        try:
            value, _ = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError):
            start = text.find("{", start + 1)
            continue
        return value if isinstance(value, dict) else None
    return None


def parse_selection(reply: str, known: set[str]) -> list[tuple[str, JsonObject]]:
    """The calls the task model chose, in its order, as ``(name, parameters)``.

    Accepted: ``{"tool_calls": [{"name", "parameters"}, ...]}`` or a single
    ``{"name", "parameters"}`` object. An empty ``tool_calls`` list means no
    tools (never a call named ``None``). Names not in ``known`` are ignored, parameters that are not an
    object become ``{}``, anything unreadable gives ``[]``. The same tool may be
    chosen more than once.
    """
    obj = first_json_object(reply)
    if obj is None:
        return []
    entries: list[JsonValue]
    if "tool_calls" in obj:
        chosen = obj["tool_calls"]
        if isinstance(chosen, Mapping):
            entries = [chosen]
        elif isinstance(chosen, list):
            entries = chosen
        else:
            return []
    else:
        entries = [obj]

    calls: list[tuple[str, JsonObject]] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        name = entry.get("name")
        if not isinstance(name, str) or name not in known:
            continue
        parameters = entry.get("parameters")
        calls.append((name, dict(parameters) if isinstance(parameters, Mapping) else {}))
    return calls


# --------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------


def tool_source(tool_id: str, name: str, parameters: JsonObject, result_text: str) -> JsonObject:
    """A tool result as a RAG source, named ``<tool_id>/<name>``.

    ``parameters`` should be what the tool ran with (after filtering). Open
    WebUI makes a source only of a non-empty result; that check is the caller's.
    """
    label = f"{tool_id}/{name}"
    return {
        "source": {"name": label},
        "document": [result_text],
        "metadata": [{"source": label, "parameters": dict(parameters)}],
        "tool_result": True,
    }
