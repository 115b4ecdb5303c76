"""The steps of assembly, in the order the turn runs them.

Each step takes the ``Draft`` (the upstream request as the steps before it left
it), does one concern's work and returns what it did — recorded as the
``assembly.step`` event of its name, so that an audit shows what each step
added and a replay or ``verify`` never runs a filter, a retrieval or a task
model again. A step with nothing to do returns None and records nothing.

    params → history → inlet filters → features (memory, code interpreter)
           → tools → files and knowledge → source context → system messages

The native/legacy gate: with ``function_calling: "native"`` (the default) the
features are the model's own tools (not pre-injected here), and a model's
attached knowledge is listed in the system message for its knowledge tools;
with ``"default"`` (prompt-based; ``"legacy"``, Open WebUI 0.12's name, is
the same) they are injected
into the context before the model runs. Files a request names are retrieved
in both modes unless the model's ``file_context`` capability is off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal, Protocol

from engine.context.assemble import (
    CODE_INTERPRETER_PROMPT,
    ModelProfile,
    reconcile_messages,
    requested_mode,
    upstream_params,
    with_system_prompt,
)
from engine.context.history import History
from engine.context.memory import memory_block, with_memory
from engine.context.messages import (
    add_or_update_system_message,
    add_or_update_user_message,
    get_last_user_message,
    merge_system_messages,
    strip_empty_content_blocks,
)
from engine.context.sources import DEFAULT_RAG_TEMPLATE, apply_source_context, numbered_object, numbered_sources
from engine.context.tasks import parse_queries, query_usage, query_warning, retrieval_queries, task_request
from engine.context.unsupported import ignored_fields
from engine.json_types import JsonObject, JsonValue
from engine.ports import (
    FileInfo,
    FileRef,
    FilterRun,
    Filters,
    Knowledge,
    MemoryHit,
    MemorySearch,
    PayloadStore,
    RetrievalError,
    TaskModel,
    TurnInput,
    UpstreamError,
)
from engine.protocols.shapes import Message, json_list, json_object_of, list_of

logger = logging.getLogger(__name__)

#: What a step records of what it did.
Detail = JsonObject


@dataclass
class Draft:
    """The upstream request being assembled."""

    turn: TurnInput
    profile: ModelProfile
    request: JsonObject  # the client's body; inlet filters may rewrite it
    messages: list[Message] = field(default_factory=list)
    params: JsonObject = field(default_factory=dict)
    # What this turn adds to its chat's stored history (see engine.context.history).
    new_messages: list[Message] = field(default_factory=list)
    turn_refs: list[JsonObject] = field(default_factory=list)
    history_reset: bool = False
    history_len: int = 0
    chat_turns: int = 0  # earlier turns of the chat
    # Retrieved sources, in Open WebUI's shape ({source, document, metadata}).
    sources: list[JsonObject] = field(default_factory=list)
    # The context before sources were applied (for the loop to rebuild it).
    rag: JsonObject | None = None
    numbered: list[JsonObject] = field(default_factory=list)  # the client-facing source list
    web_queries: list[str] = field(default_factory=list)  # legacy web search: this turn's queries
    image_prompt: str | None = None  # legacy image generation: the task model's prompt (None: the user's words)
    code_interpreter: bool = False  # legacy code blocks in the answer are run

    @property
    def now(self) -> datetime:
        """The turn's own time (recorded): prompts with dates render the same on replay."""
        return datetime.fromtimestamp(self.turn.created_at, tz=UTC)

    @property
    def mode(self) -> Literal["native", "default"]:
        return requested_mode(self.request) or self.profile.function_calling or "native"

    def feature(self, name: str) -> bool:
        features = self.request.get("features")
        return isinstance(features, dict) and bool(features.get(name))

    def capability(self, name: str) -> bool:
        return self.profile.capabilities.get(name, True) is not False


class Step(Protocol):
    name: str

    async def run(self, draft: Draft) -> Detail | None:
        """Change the draft; what to record (None: nothing happened)."""
        ...


class StepFailed(Exception):
    """The step cannot go on and the turn must fail; ``detail`` is recorded."""

    def __init__(self, message: str, type: str, detail: Detail) -> None:
        super().__init__(message)
        self.message = message
        self.type = type
        self.detail = detail


# -- params and history ------------------------------------------------------------


class Params:
    """Model parameters for the upstream: the model profile's, then the request's
    ``params`` (turnlog-only keys never sent), then top-level body fields."""

    name = "params"

    async def run(self, draft: Draft) -> Detail | None:
        draft.params = upstream_params(draft.request, draft.profile)
        return {"params": draft.params} if draft.params else None


class ChatHistory:
    """The chat's stored turns reconciled with what the client sent: each
    message reaches the model once, earlier tool rounds expanded from the log."""

    name = "history"

    def __init__(self, history: History, chat_turns: int) -> None:
        self._history = history
        self._chat_turns = chat_turns

    async def run(self, draft: Draft) -> Detail | None:
        reconciled = reconcile_messages(draft.request, self._history)
        draft.messages = reconciled.messages
        draft.new_messages = reconciled.new_messages
        draft.turn_refs = reconciled.turn_refs
        draft.history_reset = reconciled.history_reset
        draft.history_len = reconciled.history_len
        draft.chat_turns = self._chat_turns
        system = _system_prompt(draft)
        draft.messages = with_system_prompt(draft.messages, system)
        if not self._chat_turns and not system:
            return None
        return {"chat_turns": self._chat_turns, "history_len": reconciled.history_len, "reset": reconciled.history_reset}


def _system_prompt(draft: Draft) -> str | None:
    params = draft.request.get("params")
    if isinstance(params, dict) and params.get("system"):
        return str(params["system"])
    return draft.profile.system


# -- inlet filters -------------------------------------------------------------------


class InletFilters:
    """Each filter's ``inlet`` may rewrite the request (messages, params,
    features, files); the turn goes on with what the last one returned."""

    name = "inlet_filters"

    def __init__(self, filters: Filters) -> None:
        self._filters = filters

    async def run(self, draft: Draft) -> Detail | None:
        if "inlet" not in self._filters.hooks():
            return None
        body: JsonObject = {**draft.request, "messages": list(draft.messages)}
        user: JsonObject = {"id": draft.turn.user_id, "name": draft.turn.user_id}
        try:
            new_body, runs = await self._filters.inlet(body, user)
        except Exception as exc:
            message = str(exc)
            raise StepFailed(message, "filter_error", {"error": message}) from exc
        changed = sorted(k for k in set(body) | set(new_body) if body.get(k) != new_body.get(k))
        messages = new_body.get("messages")
        if isinstance(messages, list):
            draft.messages = [m for m in messages if isinstance(m, dict)]
        draft.request = {k: v for k, v in new_body.items() if k != "messages"}
        if any(r.file_handler for r in runs):
            # A filter that handles files itself: the turn retrieves none.
            draft.request.pop("files", None)
        if any(k != "messages" for k in changed):
            draft.params = upstream_params(draft.request, draft.profile)
        return {"runs": [_run(r) for r in runs], "changed": json_list(changed)}


def _run(run: FilterRun) -> JsonObject:
    out: JsonObject = {"filter": run.filter, "changed": run.changed}
    if run.error:
        out["error"] = run.error
    if run.file_handler:
        out["file_handler"] = True
    return out


# -- features ---------------------------------------------------------------------------


class Memory:
    """Legacy mode: the user's memories nearest to the last message, as a
    ``User Context`` block in the system message (nothing when none match).

    ``prefetch`` starts the search as soon as the messages are final (after the
    inlet filters), so it overlaps the steps between; ``run`` takes its result."""

    name = "memory"

    def __init__(self, memories: MemorySearch | None, k: int) -> None:
        self._memories = memories
        self._k = k
        self._early: asyncio.Task[tuple[str, list[MemoryHit] | str]] | None = None

    def _wanted(self, draft: Draft) -> bool:
        return draft.mode == "default" and draft.feature("memory") and draft.capability("memory")

    def prefetch(self, draft: Draft) -> None:
        if self._wanted(draft) and self._memories is not None:
            self._early = asyncio.ensure_future(self._search(draft))

    def abandon(self) -> None:
        """Assembly stopped before this step: its early search is not wanted."""
        if self._early is not None and not self._early.done():
            self._early.cancel()

    async def _search(self, draft: Draft) -> tuple[str, list[MemoryHit] | str]:
        """The query and its hits, or why there are none."""
        query = get_last_user_message(draft.messages) or ""
        if self._memories is None:
            return query, "no memory store is configured"
        try:
            return query, await self._memories.search(draft.turn.user_id, query, self._k)
        except RetrievalError as exc:
            return query, str(exc)

    async def run(self, draft: Draft) -> Detail | None:
        if not self._wanted(draft):
            return None
        query, hits = await (self._early if self._early is not None else self._search(draft))
        if isinstance(hits, str):
            return {"query": query, "error": hits}
        block = memory_block(hits)
        if block is not None:
            draft.messages = with_memory(draft.messages, block)
        return {"query": query, "hits": [{"id": h.id, "score": h.score} for h in hits], "injected": block is not None}


class CodeInterpreterPrompt:
    """Legacy mode with the code interpreter on: the instructions go with the
    user's message (code blocks in the answer then run)."""

    name = "code_interpreter"

    def __init__(self, available: bool = True) -> None:
        self._available = available

    async def run(self, draft: Draft) -> Detail | None:
        # The mode is the request's or the model's; the feature as the inlet filters left it.
        if draft.mode != "default" or not draft.feature("code_interpreter") or not self._available:
            return None
        draft.code_interpreter = True
        draft.messages = add_or_update_user_message(CODE_INTERPRETER_PROMPT, list(draft.messages), append=True)
        return {"prompt": "appended to the last user message"}


class Unsupported:
    """What the client switched on that cannot work here (a feature whose
    service is not configured, or that needs the other function-calling
    mode): told, not dropped."""

    name = "unsupported"

    def __init__(self, available: Mapping[str, bool]) -> None:
        self._available = available

    async def run(self, draft: Draft) -> Detail | None:
        native = draft.mode == "native"
        ignored = ignored_fields(draft.request, native=native, available=self._available, builtin_tools=draft.capability("builtin_tools"))
        return {"ignored": json_list(ignored)} if ignored else None


# -- files and knowledge ------------------------------------------------------------------


class Files:
    """The files and collections the request names (and, in legacy mode, the
    model's attached knowledge): waited for while still processing (bounded),
    searched with queries the task model writes, as sources for the context.
    In native mode a model's knowledge is listed in the system message instead,
    for its knowledge tools.

    ``prefetch`` starts the search as soon as the messages are final (after the
    inlet filters), so it overlaps the steps between; ``run`` takes its result."""

    name = "files"

    def __init__(self, knowledge: Knowledge | None, task_model: TaskModel, wait: float) -> None:
        self._knowledge = knowledge
        self._task_model = task_model
        self._wait = wait
        self._early: asyncio.Task[tuple[Detail, list[JsonObject]]] | None = None

    def _refs(self, draft: Draft) -> tuple[list[FileRef], list[FileRef]]:
        """(what to retrieve, the model's knowledge to list for its tools)."""
        refs = request_refs(draft.request)
        attached = [FileRef("collection", kid) for kid in draft.profile.knowledge]
        listed: list[FileRef] = []
        if attached and draft.mode == "native":
            listed = attached
        elif attached:
            refs = [*refs, *(r for r in attached if r not in refs)]
        if not draft.capability("file_context"):
            refs = []
        return refs, listed

    def prefetch(self, draft: Draft) -> None:
        refs, _ = self._refs(draft)
        if refs and self._knowledge is not None:
            self._early = asyncio.ensure_future(self._search(draft, refs))

    def abandon(self) -> None:
        """Assembly stopped before this step: its early search is not wanted."""
        if self._early is not None and not self._early.done():
            self._early.cancel()

    async def run(self, draft: Draft) -> Detail | None:
        refs, listed = self._refs(draft)
        detail: Detail = {}
        if listed:
            draft.messages = add_or_update_system_message(attached_knowledge(listed), list(draft.messages), append=True)
            detail["attached_knowledge"] = [r.id for r in listed]
        if not refs:
            return detail or None
        found, sources = await (self._early if self._early is not None else self._search(draft, refs))
        draft.sources.extend(sources)
        return {**detail, **found}

    async def _search(self, draft: Draft, refs: list[FileRef]) -> tuple[Detail, list[JsonObject]]:
        if self._knowledge is None:
            return {"files": [_ref(r) for r in refs], "error": "files are not available: no knowledge store is configured"}, []
        detail: Detail = {}
        infos = await self._knowledge.describe(draft.turn.user_id, refs, wait=self._wait)
        detail["files"] = [_info(i, self._wait) for i in infos]
        ready = [i.ref for i in infos if i.status == "ready"]
        if not ready:
            return detail, []
        queries: list[str] = []
        if not all(r.full for r in ready):
            queries, query_detail = await self._queries(draft)
            detail.update(query_detail)
        try:
            sources = await self._knowledge.retrieve(draft.turn.user_id, ready, queries)
        except RetrievalError as exc:
            detail["error"] = str(exc)
            return detail, []
        detail["sources"] = json_list(sources)
        return detail, sources

    async def _queries(self, draft: Draft) -> tuple[list[str], Detail]:
        """Search queries from the task model; on a failure or an empty answer,
        the last user message (Open WebUI's fallback)."""
        last = get_last_user_message(draft.messages) or ""
        prompt = str(task_request("queries", draft.messages, now=draft.now)[0]["content"])
        try:
            answer = await self._task_model.ask("queries", prompt)
        except UpstreamError as exc:
            return [last], {"queries": [last], "query_error": exc.message}
        reply = str(answer)
        parsed = parse_queries(reply)
        queries = retrieval_queries(parsed, last)
        detail: Detail = {"queries": json_list(queries), "query_reply": reply, **query_usage(answer)}
        warning = query_warning(parsed, queries)
        if warning is not None:
            logger.warning("turn %s: files: %s", draft.turn.id, warning)
            detail["query_warning"] = warning
        return queries, detail


def request_refs(request: Mapping[str, JsonValue]) -> list[FileRef]:
    """The ``files`` of a request as references (malformed entries are ignored;
    the schema rejects them before a turn starts)."""
    refs: list[FileRef] = []
    for entry in list_of(request.get("files")):
        if not isinstance(entry, dict) or not isinstance(file_id := entry.get("id"), str):
            continue
        kind: Literal["file", "collection"] = "collection" if entry.get("type") == "collection" else "file"
        ref = FileRef(kind, file_id, full=entry.get("context") == "full")
        if ref not in refs:
            refs.append(ref)
    return refs


def attached_knowledge(refs: Sequence[FileRef]) -> str:
    lines = "\n".join(f'<knowledge type="{r.type}" id="{r.id}"/>' for r in refs)
    return f"<attached_knowledge>\n{lines}\n</attached_knowledge>"


def _ref(ref: FileRef) -> JsonObject:
    return {"type": ref.type, "id": ref.id}


def _info(info: FileInfo, wait: float) -> JsonObject:
    out: JsonObject = {**_ref(info.ref), "name": info.name, "status": info.status}
    if info.status == "processing":
        out["reason"] = f"still being processed after {wait:g} s"
    elif info.reason:
        out["reason"] = info.reason
    return out


# -- sources and system messages -----------------------------------------------------------


class SourceContext:
    """The sources as ``<source id="N">`` blocks in the RAG template, prepended
    to the last user message (or appended to the system message); the ids are
    the ``[N]`` the model cites, kept for the whole turn."""

    name = "source_context"

    def __init__(self, template: str | None, system_context: bool) -> None:
        self._template = template or DEFAULT_RAG_TEMPLATE
        self._system = system_context

    async def run(self, draft: Draft) -> Detail | None:
        if not draft.sources:
            return None
        draft.rag = snapshot(draft.messages, self._system)
        messages, source_ids = apply_source_context(
            draft.messages, draft.sources, template=self._template, system_context=self._system, source_ids={}, now=draft.now
        )
        draft.messages = messages
        draft.rag["source_ids"] = json_object_of(source_ids)
        draft.numbered = [numbered_object(s) for s in numbered_sources(draft.sources, source_ids=source_ids)]
        return {"where": "system" if self._system else "user", "sources": json_list(draft.numbered)}


def snapshot(messages: Sequence[Message], system_context: bool) -> JsonObject:
    """The message the context goes into, before it does (the loop rebuilds it
    from this when tools add citations, instead of piling context up)."""
    role = "system" if system_context else "user"
    index = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == role), None)
    return {"role": role, "index": index, "message": dict(messages[index]) if index is not None else None}


class SystemMessages:
    """One system message first, no empty text blocks (what every upstream accepts)."""

    name = "system"

    async def run(self, draft: Draft) -> Detail | None:
        before = draft.messages
        stripped = strip_empty_content_blocks(list(before))
        dropped = sum(_part_count(a) - _part_count(b) for a, b in zip(before, stripped))
        systems = sum(1 for m in before if m.get("role") == "system")
        draft.messages = merge_system_messages(stripped)
        if draft.rag is not None and draft.rag.get("role") == "system":
            draft.rag["index"] = 0 if draft.messages and draft.messages[0].get("role") == "system" else None
        elif draft.rag is not None and isinstance(index := draft.rag.get("index"), int):
            # Merging system messages moves the user message: find it again.
            draft.rag["index"] = _same_index(before, draft.messages, index)
        detail: Detail = {}
        if systems > 1:
            detail["merged_system_messages"] = systems
        if dropped:
            detail["dropped_empty_parts"] = dropped
        return detail or None


def _part_count(message: Message) -> int:
    content = message.get("content")
    return len(content) if isinstance(content, list) else 0


def _same_index(before: Sequence[Message], after: Sequence[Message], index: int) -> int | None:
    target = before[index]
    for i, message in enumerate(after):
        if message is target or message == target:
            return i
    return None


class UserImages:
    """Images of the user's messages as ``image_url`` parts a vision model
    reads: Open WebUI-style ``files`` entries of type image become parts, and
    this service's own blob URLs become data URIs (the upstream cannot fetch
    them). The other ``files`` entries stay for ``AttachedFiles``."""

    name = "images"

    def __init__(self, payloads: PayloadStore) -> None:
        self._payloads = payloads

    async def run(self, draft: Draft) -> Detail | None:
        count = 0
        out: list[Message] = []
        for message in draft.messages:
            files = list_of(message.get("files"))
            images = [e for e in files if isinstance(e, dict) and e.get("type") == "image" and isinstance(e.get("url"), str)]
            parts = _parts(message.get("content"))
            changed = bool(images)
            parts += [{"type": "image_url", "image_url": {"url": e["url"]}} for e in images]
            for part in parts if message.get("role") == "user" else []:
                image = part.get("image_url") if part.get("type") == "image_url" else None
                url = image.get("url") if isinstance(image, dict) else None
                if isinstance(image, dict) and isinstance(url, str) and not url.startswith("data:"):
                    inline = await self._payloads.data_uri(url)
                    if inline is not None:
                        part["image_url"] = {**image, "url": inline}
                        changed = True
                        count += 1
            if changed:
                rest = [e for e in files if e not in images]
                rebuilt = {**{k: v for k, v in message.items() if k != "files"}, "content": json_list(parts)}
                out.append({**rebuilt, "files": rest} if rest else rebuilt)
            else:
                out.append(message)
        draft.messages = out
        return {"inlined": count} if count else None


class AttachedFiles:
    """In native function calling with the model's builtin tools, the files and
    collections of each user message are listed in an ``<attached_files>``
    block before its text, so the model knows what its file tools can read.
    Each turn's files go with that turn's user message — paired by role, not by
    position (Open WebUI mixed them up). The ``files`` entries never reach the
    upstream."""

    name = "attached_files"

    async def run(self, draft: Draft) -> Detail | None:
        listed = 0
        tools = draft.mode == "native" and draft.capability("builtin_tools")
        last_user = max((i for i, m in enumerate(draft.messages) if m.get("role") == "user"), default=None)
        out: list[Message] = []
        for index, message in enumerate(draft.messages):
            files = list(list_of(message.get("files")))
            if index == last_user and isinstance(request_files := draft.request.get("files"), list):
                files += request_files
            refs = [e for e in files if isinstance(e, dict) and isinstance(e.get("id"), str) and e.get("type") != "image"]
            if not refs and "files" not in message:
                out.append(message)
                continue
            rest = {k: v for k, v in message.items() if k != "files"}
            if refs and tools and message.get("role") == "user":
                block = "\n".join(f'<file type="{e.get("type", "file")}" id="{e["id"]}"/>' for e in refs)
                rest["content"] = [{"type": "text", "text": f"<attached_files>\n{block}\n</attached_files>\n\n"}, *_parts(message.get("content"))]
                listed += len(refs)
            out.append(rest)
        draft.messages = out
        return {"listed": listed} if listed else None


def _parts(content: JsonValue) -> list[JsonObject]:
    if isinstance(content, list):
        return [dict(p) for p in content if isinstance(p, dict)]
    return [{"type": "text", "text": content}] if isinstance(content, str) and content else []
