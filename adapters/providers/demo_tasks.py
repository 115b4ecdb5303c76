"""The demo model's answers to task prompts: search queries, titles, tags,
follow-ups and prompt-based tool selection.

The engine asks its task model with a prompt that names the JSON it expects
(``{"queries": [...]}``, ``{"title": ...}``, ``{"tool_calls": [...]}``...). A
scripted answer to such a prompt must be that JSON, built from the user's
message, and come at once: the turn waits for it before the model answers.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["placeholder", "task_answer", "text"]

# The keys of turnlog's task templates' example outputs, in the order tried.
_OUTPUT = re.compile(r'\{\s*"(title|tags|follow_ups|queries)"\s*:')
_TOOL_SELECTION = re.compile(r'\{\s*"tool_calls"\s*:')
_HISTORY = re.compile(r"<chat_history>(.*?)</chat_history>", re.DOTALL)
_LINE = re.compile(r"^(USER|ASSISTANT): ", re.MULTILINE)
_WORDS = re.compile(r"[^\W\d_]{4,}")
_COMMON = frozenset("about could does from have please should that their there this what when where which will with would your".split())
_QUERY = re.compile(r"^Query: (.*)\Z", re.MULTILINE | re.DOTALL)


def text(content: Any) -> str:
    """A message's text (the text parts of list content, joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") in ("text", "input_text"))
    return ""


def _last_user(prompt: str) -> str:
    """The last ``USER:`` message of the prompt's chat history (the whole prompt
    when it has none), on one line."""
    found = _HISTORY.search(prompt)
    history = found.group(1) if found else ""
    parts = _LINE.split(history)
    # parts: [before, ROLE, content, ROLE, content, ...]
    said = ""
    for role, content in zip(parts[1::2], parts[2::2]):
        if role == "USER":
            said = content
    return " ".join(said.split())


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0]


def _chat_task(key: str, said: str) -> dict[str, Any]:
    words = _WORDS.findall(said)
    if key == "queries":
        return {"queries": [_short(said, 200)] if said else []}
    if key == "title":
        return {"title": " ".join(said.split()[:4]).strip(" .,!?:;") or "Demo chat"}
    if key == "tags":
        longest = sorted(dict.fromkeys(w.lower() for w in words if w.lower() not in _COMMON), key=lambda w: (-len(w), w))[:2]
        return {"tags": ["Demo", *(w.capitalize() for w in longest)]}
    topic = _short(said, 60) or "this"
    return {"follow_ups": [f"Tell me more about \u201c{topic}\u201d", "Count to 20", "What time is it?"]}


def placeholder(schema: Any, said: str) -> Any:
    """A value of the type ``schema`` names (strings: what the user said)."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    return {"string": said, "integer": 1, "number": 1, "boolean": True, "array": [], "object": {}}.get(str(kind))


def _tool_selection(system: str, user: str) -> dict[str, Any]:
    """The first offered tool, its required parameters filled from the query."""
    start = system.find("[")
    try:
        specs, _ = json.JSONDecoder().raw_decode(system, start) if start != -1 else ([], 0)
    except ValueError:
        specs = []
    found = _QUERY.search(user)
    said = " ".join((found.group(1) if found else user).split())
    for spec in specs if isinstance(specs, list) else []:
        if isinstance(spec, dict) and isinstance(spec.get("name"), str):
            params: dict[str, Any] = spec["parameters"] if isinstance(spec.get("parameters"), dict) else {}
            props: dict[str, Any] = params["properties"] if isinstance(params.get("properties"), dict) else {}
            args = {n: placeholder(props.get(n), said) for n in params.get("required") or [] if isinstance(n, str)}
            return {"tool_calls": [{"name": spec["name"], "parameters": args}]}
    return {"tool_calls": []}


def task_answer(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str | None:
    """The JSON answer to a task prompt, or None when ``messages`` are a chat."""
    if tools or not messages:
        return None
    first = text(messages[0].get("content"))
    if messages[0].get("role") == "system" and _TOOL_SELECTION.search(first) and len(messages) == 2:
        return json.dumps(_tool_selection(first, text(messages[1].get("content"))), ensure_ascii=False)
    if len(messages) != 1 or messages[0].get("role") != "user" or not first.startswith("### Task:"):
        return None
    output = first.rfind("### Output:")
    found = _OUTPUT.search(first, max(output, 0))
    if found is None:
        return None
    return json.dumps(_chat_task(found.group(1), _last_user(first)), ensure_ascii=False)
