"""Task-model prompts and their replies: titles, tags, follow-ups, search queries.

Pure functions, no I/O, after Open WebUI's background tasks. A task is one
non-streamed request to the task model whose only message is a user message
holding the rendered template (``task_request``); the reply's text goes to the
task's parser, which returns the typed result or a ``TaskFailure`` saying why
there is none.

The chat a template sees is ``task_messages``: user and assistant messages
only, list content reduced to its text parts, ``<details>…</details>`` blocks
(tool calls, reasoning, …) and markdown images removed, empty messages left out.
Template variables (``render_task_template``): ``{{MESSAGES}}``,
``{{MESSAGES:START:n}}``, ``{{MESSAGES:END:n}}``, ``{{MESSAGES:MIDDLETRUNCATE:n}}``
(each optionally with a per-message content filter ``|start:N``, ``|end:N`` or
``|middletruncate:N``, in characters), ``{{prompt}}`` (the last user message;
``:start:n``, ``:end:n``, ``:middletruncate:n``), and the date/user variables of
``engine.context.sources.date_variables``. Messages render as ``ROLE: content``
lines. All variables are substituted in one pass, so chat text that contains a
placeholder is never substituted (as in ``rag_template``; Open WebUI substitutes
placeholders inside inserted text again).

Where turnlog deliberately differs from Open WebUI 0.12.4:

* A reply's JSON is the first complete JSON object that has the expected
  key (never the text from the last ``{``), so ``{"queries": [...], "x": {}}``
  and a reply with prose or a second object around the answer both parse
  (pinned by tests/test_tasks.py::test_parse_queries).
* ``parse_queries``: a reply that holds JSON without a usable ``queries`` list
  is a failure (the caller then searches for the user message), not an empty
  list that silently skips the search; a reply with no JSON at all is used
  whole as one query, as in Open WebUI. A reply that only repeats the
  template's example (``["query1", "query2"]``, what a model that echoes its
  prompt gives) is a failure too.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from engine.context.messages import Message
from engine.context.sources import date_variables
from engine.json_types import JsonObject, JsonValue
from engine.ports import TaskReply

TaskKind = Literal["title", "tags", "follow_ups", "queries", "image_prompt"]

#: ``metadata.task`` of each task's request.
TASK_NAMES: dict[TaskKind, str] = {
    "title": "title_generation",
    "tags": "tags_generation",
    "follow_ups": "follow_up_generation",
    "queries": "query_generation",
    "image_prompt": "image_prompt_generation",
}

#: The task model's ``max_tokens`` unless configured otherwise.
TASK_MAX_TOKENS = 1000

MAX_FOLLOW_UPS = 5
MAX_FOLLOW_UP_CHARS = 400

# turnlog's wording of the default templates; each asks for one JSON object.

DEFAULT_TITLE_TEMPLATE = """### Task:
Write a short title of 2 to 4 words that sums up the main subject of the chat below.

### Guidelines:
- Write it in the chat's main language; use English if unsure.
- Make it clear and specific rather than clever.
- No emoji, no quotation marks, no special formatting.
- Reply with the raw JSON object only: no other text, no code fences.

### Output:
{"title": "<the title>"}

### Chat:
<chat_history>
{{MESSAGES:END:2}}
</chat_history>"""

DEFAULT_TAGS_TEMPLATE = """### Task:
Tag the chat below: 1 to 3 broad domain tags (such as Science, Technology, Arts, Health, Business) and 1 to 3 more specific subtopic tags.

### Guidelines:
- Start with the broad domains, then add the subtopics that are clearly present.
- If the chat is very short (fewer than 3 messages) or too varied to tag, reply with ["General"].
- Use the chat's main language; use English if unsure.
- Reply with the raw JSON object only: no other text, no code fences.

### Output:
{"tags": ["tag1", "tag2", "tag3"]}

### Chat:
<chat_history>
{{MESSAGES:END:6}}
</chat_history>"""

DEFAULT_FOLLOW_UPS_TEMPLATE = """### Task:
Predict 3 to 5 messages the user is likely to send next in the chat below. Write each one as the user would write it to the assistant, in the user's own voice, and put the most useful first.

### Guidelines:
- Each must follow naturally from the latest exchange and move the conversation forward.
- Do not suggest anything the chat has already asked for or done.
- Keep each under 400 characters; questions, requests and statements are all fine.
- Use the chat's main language; use English if unsure.
- Reply with the raw JSON object only: no other text, no code fences.

### Output:
{"follow_ups": ["first message", "second message", "third message"]}

### Chat:
<chat_history>
{{MESSAGES:END:5}}
</chat_history>"""

DEFAULT_QUERY_TEMPLATE = """### Task:
Decide whether answering the user's latest message needs a search, and if it does, write the search queries.

### Guidelines:
- Prefer 1 to 3 broad queries that together cover what the answer needs; add more only when each one adds something.
- When in doubt, search: a search that finds nothing costs little.
- Reply with an empty list only when you are certain that no search is needed.
- Write the queries in the chat's language.
- Today's date is {{CURRENT_DATE}}; use it for questions about recent or dated events.
- Reply with the raw JSON object only: no other text, no code fences.

### Output:
{"queries": ["query1", "query2"]}

### Chat:
<chat_history>
{{MESSAGES:END:6}}
</chat_history>"""

DEFAULT_IMAGE_PROMPT_TEMPLATE = """### Task:
Write a detailed prompt for an image generator from the user's latest request in the chat below: describe the image as if to someone who cannot see it, with its subject, setting, composition, colours, lighting and style.

### Guidelines:
- Keep everything the user asked for; add only details that serve it, never a different subject.
- Use the chat's main language; use English if unsure.
- Reply with the raw JSON object only: no other text, no code fences.

### Output:
{"prompt": "<the detailed description>"}

### Chat:
<chat_history>
{{MESSAGES:END:6}}
</chat_history>"""

DEFAULT_TEMPLATES: dict[TaskKind, str] = {
    "title": DEFAULT_TITLE_TEMPLATE,
    "tags": DEFAULT_TAGS_TEMPLATE,
    "follow_ups": DEFAULT_FOLLOW_UPS_TEMPLATE,
    "queries": DEFAULT_QUERY_TEMPLATE,
    "image_prompt": DEFAULT_IMAGE_PROMPT_TEMPLATE,
}


# --------------------------------------------------------------------------
# The chat a task sees
# --------------------------------------------------------------------------

_DETAILS = re.compile(r"<details\b[^>]*>(?:(?!<details\b).)*?</details>", re.DOTALL | re.IGNORECASE)
_MARKDOWN_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")


def clean_text(text: str) -> str:
    """``text`` without ``<details>…</details>`` blocks (nested ones included) and
    markdown images ``![alt](url)``, stripped."""
    previous = None
    while previous != text:
        previous, text = text, _DETAILS.sub("", text)
    return _MARKDOWN_IMAGE.sub("", text).strip()


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [part.get("text") for part in content if isinstance(part, Mapping) and part.get("type") in ("text", "input_text", "output_text")]
        return "\n".join(t for t in texts if isinstance(t, str) and t)
    return ""


def task_messages(messages: Sequence[Mapping[str, object]]) -> list[Message]:
    """The chat as a task sees it: ``{"role", "content": str}`` for each user or
    assistant message, content cleaned (``clean_text``); messages left empty
    (tool-call-only assistant messages, images only, …) are dropped."""
    out: list[Message] = []
    for message in messages:
        role = message.get("role")
        if role not in ("user", "assistant"):
            continue
        text = clean_text(_content_text(message.get("content")))
        if text:
            out.append({"role": role, "content": text})
    return out


# --------------------------------------------------------------------------
# Templates
# --------------------------------------------------------------------------

_TASK_VARIABLES = re.compile(
    r"\{\{MESSAGES(?::(?P<m_mode>START|END|MIDDLETRUNCATE):(?P<m_n>\d+))?(?:\|(?P<f_mode>start|end|middletruncate):(?P<f_n>\d+))?\}\}"
    r"|\{\{(?i:prompt)(?::(?P<p_mode>(?i:start|end|middletruncate)):(?P<p_n>\d+))?\}\}"
    r"|\{\{(?P<var>CURRENT_DATE|CURRENT_TIME|CURRENT_DATETIME|CURRENT_WEEKDAY|CURRENT_TIMEZONE|USER_NAME)\}\}"
)


def _cut(text: str, mode: str, n: int) -> str:
    """The first ``n`` characters, the last ``n``, or (middletruncate) the first
    ceil(n/2) and the last floor(n/2) joined by ``...`` when longer than ``n``."""
    mode = mode.lower()
    if mode == "start":
        return text[:n]
    if mode == "end":
        return text[len(text) - n :] if n < len(text) else text
    if len(text) <= n:
        return text
    head, tail = math.ceil(n / 2), n // 2
    return f"{text[:head]}...{text[len(text) - tail :]}"


def _select(messages: list[Message], mode: str | None, n: int) -> list[Message]:
    """All messages, the first ``n``, the last ``n``, or (MIDDLETRUNCATE) the first
    ceil(n/2) and the last floor(n/2) when there are more than ``n``."""
    if mode == "START":
        return messages[:n]
    if mode == "END":
        return messages[len(messages) - n :] if n < len(messages) else messages
    if mode == "MIDDLETRUNCATE" and len(messages) > n:
        head, tail = math.ceil(n / 2), n // 2
        return messages[:head] + messages[len(messages) - tail :]
    return messages


def render_messages(messages: Sequence[Message]) -> str:
    """``ROLE: content`` lines."""
    return "\n".join(f"{str(m.get('role') or '').upper()}: {m.get('content') or ''}" for m in messages)


def render_task_template(
    template: str,
    messages: Sequence[Mapping[str, object]],
    *,
    now: datetime,
    user_name: str | None = None,
    prompt: str | None = None,
) -> str:
    """``template`` with its variables filled from ``task_messages(messages)``.

    ``prompt`` is what ``{{prompt}}`` becomes; None means the last user message
    of the cleaned chat (empty without one). One pass: text that comes from the
    chat is never substituted again.
    """
    chat = task_messages(messages)
    if prompt is None:
        prompt = next((str(m["content"]) for m in reversed(chat) if m["role"] == "user"), "")
    dates = date_variables(now, user_name)

    def fill(match: re.Match[str]) -> str:
        if match.group("var"):
            return dates["{{" + match.group("var") + "}}"]
        if match.group(0).startswith("{{MESSAGES"):
            picked = _select(chat, match.group("m_mode"), int(match.group("m_n") or 0))
            if match.group("f_mode"):
                f_mode, f_n = match.group("f_mode"), int(match.group("f_n"))
                picked = [{**m, "content": _cut(str(m["content"]), f_mode, f_n)} for m in picked]
            return render_messages(picked)
        if match.group("p_mode"):
            return _cut(prompt, match.group("p_mode"), int(match.group("p_n")))
        return prompt

    return _TASK_VARIABLES.sub(fill, template)


def task_request(
    kind: TaskKind,
    messages: Sequence[Mapping[str, object]],
    *,
    now: datetime,
    template: str | None = None,
    user_name: str | None = None,
) -> list[Message]:
    """The task model's messages: one user message with the rendered template
    (``template``, or the kind's default when None or blank)."""
    if not template or not template.strip():
        template = DEFAULT_TEMPLATES[kind]
    return [{"role": "user", "content": render_task_template(template, messages, now=now, user_name=user_name)}]


# --------------------------------------------------------------------------
# Replies
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskFailure:
    """A reply that gave no usable result, and why."""

    reason: str


@dataclass(frozen=True)
class Queries:
    """Search queries from a reply. ``from_json`` is False when the reply held no
    JSON object and was taken whole as one query."""

    queries: list[str]
    from_json: bool = True


_DECODER = json.JSONDecoder()


def json_objects(text: str) -> Iterator[JsonObject]:
    """The complete JSON objects in ``text``, in order. A ``{`` that starts no
    complete object is skipped (the next one is tried); after an object the
    scan goes on after its end (objects nested in it are not visited)."""
    start = text.find("{")
    while start != -1:
        try:
            value, end = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError):
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict):
            yield value
        start = text.find("{", end)


def reply_field(reply: str, key: str) -> tuple[bool, JsonValue]:
    """``(True, value)`` of ``key`` in the first complete JSON object of ``reply``
    that has it; ``(False, None)`` when none has it."""
    for obj in json_objects(reply if isinstance(reply, str) else ""):
        if key in obj:
            return True, obj[key]
    return False, None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def parse_title(reply: str) -> str | TaskFailure:
    """``{"title": "…"}`` → the title, whitespace runs (newlines included) made single spaces."""
    found, value = reply_field(reply, "title")
    if not found:
        return TaskFailure('no JSON object with "title"')
    if not isinstance(value, str):
        return TaskFailure("title is not a string")
    title = _one_line(value)
    return title if title else TaskFailure("empty title")


#: A fallback title longer than this is cut at a word boundary (a chat list
#: shows one line; Open WebUI kept the whole message).
TITLE_MAX_CHARS = 80


def fallback_title(messages: Sequence[Mapping[str, object]]) -> str | None:
    """The title when the task gives none: the first user message's cleaned text
    on one line, cut to :data:`TITLE_MAX_CHARS` (with "…"); None without one."""
    first = next((m for m in task_messages(messages) if m["role"] == "user"), None)
    if first is None:
        return None
    text = _one_line(str(first["content"]))
    if len(text) <= TITLE_MAX_CHARS:
        return text
    cut = text[: TITLE_MAX_CHARS - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > TITLE_MAX_CHARS // 2 else cut).rstrip() + "…"


def parse_tags(reply: str) -> list[str] | TaskFailure:
    """``{"tags": [...]}`` → the tags in order: each on one line and trimmed; entries
    that are not strings or are blank are dropped, and so are repeats (ignoring
    case). No tag left is a failure."""
    found, value = reply_field(reply, "tags")
    if not found:
        return TaskFailure('no JSON object with "tags"')
    if not isinstance(value, list):
        return TaskFailure("tags is not a list")
    tags: list[str] = []
    seen: set[str] = set()
    for entry in value:
        tag = _one_line(entry) if isinstance(entry, str) else ""
        if tag and tag.casefold() not in seen:
            seen.add(tag.casefold())
            tags.append(tag)
    return tags if tags else TaskFailure("no tags")


def parse_follow_ups(reply: str) -> list[str] | TaskFailure:
    """``{"follow_ups": [...]}`` → at most 5 unique trimmed strings of at most 400
    characters, in order (blank and longer ones dropped). Any entry that is not a
    string fails the whole list. An empty list is a valid answer."""
    found, value = reply_field(reply, "follow_ups")
    if not found:
        return TaskFailure('no JSON object with "follow_ups"')
    if not isinstance(value, list):
        return TaskFailure("follow_ups is not a list")
    entries = [entry for entry in value if isinstance(entry, str)]
    if len(entries) != len(value):
        return TaskFailure("a follow-up is not a string")
    out: list[str] = []
    for entry in entries:
        text = entry.strip()
        if text and len(text) <= MAX_FOLLOW_UP_CHARS and text not in out:
            out.append(text)
            if len(out) == MAX_FOLLOW_UPS:
                break
    return out


def parse_queries(reply: str) -> Queries | TaskFailure:
    """Search queries from a query-generation reply (the first complete JSON object
    with ``queries``, not Open WebUI's last ``{``).

    * ``{"queries": [...]}`` (the first complete object that has the key): the
      strings, trimmed, blank ones, non-strings and repeats dropped;
      ``"queries": "text"`` counts as one query. An empty list is a valid answer
      ("no search needed"); a list of blank entries only is a failure.
    * No JSON object at all: the whole reply, trimmed, is one query
      (``from_json=False``); a blank reply is a failure.
    * JSON objects but none with a ``queries`` list: a failure.
    """
    text = reply if isinstance(reply, str) else ""
    found, value = reply_field(text, "queries")
    if not found:
        if next(json_objects(text), None) is not None:
            return TaskFailure('no JSON object with "queries"')
        whole = text.strip()
        return Queries([whole], from_json=False) if whole else TaskFailure("empty reply")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return TaskFailure("queries is not a list")
    queries: list[str] = []
    for entry in value:
        query = entry.strip() if isinstance(entry, str) else ""
        if query and query not in queries:
            queries.append(query)
    if value and not queries:
        return TaskFailure("only blank queries")
    if queries and all(_EXAMPLE_QUERY.fullmatch(q) for q in queries):
        return TaskFailure(f"the reply repeats the template's example queries {json.dumps(queries)}")
    return Queries(queries)


#: A generated image prompt longer than this is not used (a model that rambles).
MAX_IMAGE_PROMPT_CHARS = 4000


def parse_image_prompt(reply: str) -> str | TaskFailure:
    """``{"prompt": "…"}`` → the prompt, trimmed; anything else is a failure
    (the caller draws the user's own words instead)."""
    found, value = reply_field(reply, "prompt")
    if not found:
        return TaskFailure('no JSON object with "prompt"')
    if not isinstance(value, str):
        return TaskFailure("prompt is not a string")
    prompt = value.strip()
    if not prompt:
        return TaskFailure("empty prompt")
    if len(prompt) > MAX_IMAGE_PROMPT_CHARS:
        return TaskFailure(f"the prompt is over {MAX_IMAGE_PROMPT_CHARS} characters")
    return prompt


# The placeholders of the default query template's example output.
_EXAMPLE_QUERY = re.compile(r"query\d+", re.IGNORECASE)


def query_warning(result: Queries | TaskFailure, queries: Sequence[str]) -> str | None:
    """What a client is told when the task model's reply gave no usable queries
    and the user's message was searched instead (None otherwise)."""
    if not isinstance(result, TaskFailure) or not queries:
        return None
    return f"the task model gave no usable search queries ({result.reason}); searched for the user's message instead"


def retrieval_queries(result: Queries | TaskFailure, user_message: str | None) -> list[str]:
    """Files/RAG: the generated queries; when there are none (a failure or
    an empty list) the user message is the query."""
    if isinstance(result, Queries) and result.queries:
        return list(result.queries)
    return [user_message] if user_message and user_message.strip() else []


def web_search_queries(result: Queries | TaskFailure, user_message: str | None) -> list[str]:
    """Web search: the generated queries (an empty list: no search); on a
    failure the user message is the query."""
    if isinstance(result, Queries):
        return list(result.queries)
    return [user_message] if user_message and user_message.strip() else []


def query_usage(answer: str) -> JsonObject:
    """``{"query_usage": …}``, what the task model's call for search queries
    spent as its upstream reported it (the turn's usage includes it); empty
    when it reported none."""
    usage = answer.usage if isinstance(answer, TaskReply) else None
    return {"query_usage": usage} if usage else {}
