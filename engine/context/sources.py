"""Retrieved sources as model context: ``<source>`` tags, the RAG template, citation numbers.

Pure functions, no I/O. A *source* is Open WebUI's shape,
``{"source": {"id", "name", "type", ...}, "document": [text, ...],
"metadata": [{"source", "name", "url"?, ...}, ...], "distances"?: [...]}``:
document ``i`` goes with metadata ``i``. Each document is cited by a number
``N`` that the model writes as ``[N]``; the numbers are given to *citation keys*
(``metadata.source``, else ``source.id``, else ``"N/A"``) in first-seen order,
so documents of one file share a number, and passing the ``source_ids`` of an
earlier call keeps the numbers of a turn stable across calls.

Where turnlog deliberately differs from Open WebUI 0.12.4:

* ``rag_template`` substitutes every placeholder in ONE pass over the
  template, so a ``[query]`` or ``{{CONTEXT}}`` written inside the retrieved
  context (or the query) stays as it is, and the template's own ``[query]`` gets
  the question (Open WebUI's ``[query]`` protection is inverted and it
  substitutes a ``{{CONTEXT}}`` inside the context again; pinned by
  tests/test_sources.py::test_rag_template_vectors).
* ``apply_source_context`` edits the LAST USER message wherever it is (not only
  when it is the last message) and only its first text part (Open WebUI
  edits every text part).

Kept as Open WebUI does it: the ``name`` attribute and the body are not
escaped (only the operator-chosen extra metadata attributes are).
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import NotRequired, TypedDict

from engine.context.messages import Message, add_or_update_system_message, update_message_content
from engine.json_types import JsonObject

#: The citation key of a document with neither ``metadata.source`` nor ``source.id``.
NO_KEY = "N/A"

#: turnlog's wording of Open WebUI's default RAG template: the same
#: instructions, and the context inside ``<context>…</context>`` at the end. It
#: has no query placeholder: the question reaches the model as the user's own
#: text, which follows the prepended block.
DEFAULT_RAG_TEMPLATE = """### Task:
Answer the user's query using the context below. Cite a source inline as [id] **only when its <source> tag has an explicit id attribute** (for example <source id="1">).

### Guidelines:
- If you do not know the answer, say so plainly.
- If the query is unclear, ask the user to clarify.
- Answer in the language of the user's query.
- If the context is unreadable or of poor quality, tell the user and give the best answer you can.
- If the context does not contain the answer but you know it, say that it does not come from the context and answer from your own knowledge.
- **Cite with [id] (such as [1] or [2]) only when the <source> tag has an id attribute.**
- Never cite a <source> tag that has no id attribute.
- Do not put XML tags in your answer.
- Keep citations short and tied to the statement they support.

### Example of a citation:
When the answer comes from a source with id 1, cite it like this:
* "The study finds the method 20% more efficient [1]."

### Output:
A clear, direct answer to the user's query, with inline [id] citations only for <source> tags that have an id attribute.

<context>
{{CONTEXT}}
</context>
"""


class NumberedSource(TypedDict):
    """A citation as the client sees it: ``id`` is the ``[N]`` the model writes."""

    id: int
    name: str
    type: str
    url: NotRequired[str]


# --------------------------------------------------------------------------
# Documents and their citation keys
# --------------------------------------------------------------------------


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else []


def _text(value: object) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))


def _documents(source: Mapping[str, object]) -> Iterator[tuple[object, Mapping[str, object]]]:
    """``(document, metadata)`` pairs; documents beyond the metadata are ignored (zip)."""
    for document, metadata in zip(_list(source.get("document")), _list(source.get("metadata"))):
        yield document, _mapping(metadata)


def citation_key(source: Mapping[str, object], metadata: Mapping[str, object]) -> str:
    """``metadata.source``, else ``source.id``, else ``"N/A"`` (empty values skipped)."""
    for value in (metadata.get("source"), _mapping(source.get("source")).get("id")):
        if value is not None and value != "":
            return _text(value)
    return NO_KEY


def _number(key: str, ids: dict[str, int]) -> int:
    if key not in ids:
        ids[key] = max(ids.values(), default=0) + 1
    return ids[key]


# --------------------------------------------------------------------------
# <source> tags
# --------------------------------------------------------------------------


def source_context(
    sources: Sequence[Mapping[str, object]],
    *,
    source_ids: Mapping[str, int] | None = None,
    include_content: bool = True,
    metadata_keys: Sequence[str] = (),
) -> tuple[str, dict[str, int]]:
    """The ``<source>`` tags of every document, and the citation numbers after them.

    One tag per document, each followed by ``\\n``::

        <source id="N"[ name="…"][ resource-type="…"][ resource-id="…"][ key="…"…]>BODY</source>

    ``name`` is ``source.name``, ``resource-type`` is ``source.type`` and
    ``resource-id`` is ``source.id`` (left out for type ``text``); each only when
    set. ``metadata_keys`` (``RAG_SOURCE_METADATA_KEYS``) adds those metadata
    values as html-escaped attributes. ``include_content=False`` leaves every
    body empty (citation markers only). ``source_ids`` (key → number) continues
    an earlier numbering; it is not modified, the returned dict is a new one.
    """
    ids = dict(source_ids or {})
    tags: list[str] = []
    for source in sources:
        info = _mapping(source.get("source"))
        for document, metadata in _documents(source):
            number = _number(citation_key(source, metadata), ids)
            attrs = [f'id="{number}"']
            name, kind, ident = info.get("name"), info.get("type"), info.get("id")
            if name:
                attrs.append(f'name="{_text(name)}"')
            if kind:
                attrs.append(f'resource-type="{_text(kind)}"')
            if ident and kind != "text":
                attrs.append(f'resource-id="{_text(ident)}"')
            for key in metadata_keys:
                value = metadata.get(key)
                if value is not None and value != "":
                    attrs.append(f'{key}="{html.escape(_text(value), quote=True)}"')
            body = _text(document) if include_content else ""
            tags.append(f"<source {' '.join(attrs)}>{body}</source>\n")
    return "".join(tags), ids


def numbered_sources(sources: Sequence[Mapping[str, object]], *, source_ids: Mapping[str, int] | None = None) -> list[NumberedSource]:
    """The client-facing citation list: one entry per citation key of ``sources``,
    by number, with the numbers ``source_context`` gives for the same arguments
    (or pass the ``source_ids`` it returned).

    ``name``: the first document's ``metadata.name``, else ``source.name``, else
    the key. ``type``: ``source.type``, else ``tool`` for a tool result, ``web``
    when there is a URL, else ``document``. ``url``: ``metadata.url``, else
    ``source.url``, else the key when it is an http(s) URL.
    """
    ids = dict(source_ids or {})
    entries: dict[int, NumberedSource] = {}
    for source in sources:
        info = _mapping(source.get("source"))
        for _document, metadata in _documents(source):
            key = citation_key(source, metadata)
            number = _number(key, ids)
            if number in entries:
                continue
            url = next((_text(u) for u in (metadata.get("url"), info.get("url")) if isinstance(u, str) and u), None)
            if url is None and key.startswith(("http://", "https://")):
                url = key
            name = next((_text(n) for n in (metadata.get("name"), info.get("name")) if n), key)
            kind = info.get("type")
            if not (isinstance(kind, str) and kind):
                kind = "tool" if source.get("tool_result") else "web" if url else "document"
            entry: NumberedSource = {"id": number, "name": name, "type": kind}
            if url is not None:
                entry["url"] = url
            entries[number] = entry
    return [entries[n] for n in sorted(entries)]


def numbered_object(entry: NumberedSource) -> JsonObject:
    """A numbered source as the JSON object recorded (keys in the same order)."""
    out: JsonObject = {"id": entry["id"], "name": entry["name"], "type": entry["type"]}
    if "url" in entry:
        out["url"] = entry["url"]
    return out


# --------------------------------------------------------------------------
# The RAG template
# --------------------------------------------------------------------------

_RAG_PLACEHOLDERS = re.compile(
    r"\[context\]|\{\{CONTEXT\}\}|\[query\]|\{\{QUERY\}\}"
    r"|\{\{(?:CURRENT_DATE|CURRENT_TIME|CURRENT_DATETIME|CURRENT_WEEKDAY|CURRENT_TIMEZONE|USER_NAME)\}\}"
)


def date_variables(now: datetime, user_name: str | None) -> dict[str, str]:
    """The date/user template variables (Open WebUI's formats); an unknown user is ``Unknown``."""
    date, time = now.strftime("%Y-%m-%d"), now.strftime("%I:%M:%S %p")
    return {
        "{{CURRENT_DATE}}": date,
        "{{CURRENT_TIME}}": time,
        "{{CURRENT_DATETIME}}": f"{date} {time}",
        "{{CURRENT_WEEKDAY}}": now.strftime("%A"),
        "{{CURRENT_TIMEZONE}}": now.tzname() or "UTC",
        "{{USER_NAME}}": user_name or "Unknown",
    }


def rag_template(template: str | None, context: str, query: str, *, now: datetime, user_name: str | None = None) -> str:
    """``template`` (``DEFAULT_RAG_TEMPLATE`` when empty or blank) with its placeholders filled.

    ``[context]``/``{{CONTEXT}}`` → ``context``, ``[query]``/``{{QUERY}}`` →
    ``query``, and the date/user variables of ``date_variables``. One pass over
    the template: nothing inserted is ever substituted again.
    """
    if not template or not template.strip():
        template = DEFAULT_RAG_TEMPLATE
    values = date_variables(now, user_name)
    values.update({"[context]": context, "{{CONTEXT}}": context, "[query]": query, "{{QUERY}}": query})
    return _RAG_PLACEHOLDERS.sub(lambda m: values[m.group(0)], template)


# --------------------------------------------------------------------------
# Into the messages
# --------------------------------------------------------------------------


def _message_text(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    for part in _list(content):
        if isinstance(part, Mapping) and part.get("type") == "text":
            return _text(part.get("text"))
    return ""


def _last_user_index(messages: Sequence[Message]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return i
    return None


def apply_source_context(
    messages: list[Message],
    sources: Sequence[Mapping[str, object]],
    *,
    template: str | None,
    system_context: bool,
    source_ids: Mapping[str, int] | None = None,
    query: str | None = None,
    now: datetime,
    user_name: str | None = None,
    include_content: bool = True,
    metadata_keys: Sequence[str] = (),
) -> tuple[list[Message], dict[str, int]]:
    """Put the sources into the messages as RAG context (a new list; the input is not mutated).

    The ``<source>`` tags (stripped) are rendered with ``rag_template`` and
    PREPENDED (joined by ``\\n``) to the first text part of the last user
    message, or, with ``system_context`` (``RAG_SYSTEM_CONTEXT``), APPENDED to the
    system message (one is inserted at index 0 when there is none).

    ``query`` is what ``[query]`` becomes; None means the last user message's
    text (pass the pre-RAG user text in a tool-loop continuation). Nothing
    changes, and the numbering is returned as given, without sources, without a
    user message, with an empty query, or when the sources have no documents.
    """
    ids = dict(source_ids or {})
    index = _last_user_index(messages)
    if not sources or index is None:
        return list(messages), ids
    if query is None:
        query = _message_text(messages[index])
    if not query:
        return list(messages), ids
    context, new_ids = source_context(sources, source_ids=ids, include_content=include_content, metadata_keys=metadata_keys)
    context = context.strip()
    if not context:
        return list(messages), ids
    block = rag_template(template, context, query, now=now, user_name=user_name)
    if system_context:
        return add_or_update_system_message(block, list(messages), append=True), new_ids
    out = list(messages)
    out[index] = update_message_content(out[index], block, append=False)
    return out, new_ids
