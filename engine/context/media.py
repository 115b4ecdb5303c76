"""Assembly steps of prompt-based ("legacy") function calling that reach the
world before the model answers: web search (queries from the task model,
results, the pages fetched concurrently, as sources for the context) and image
generation (the image drawn or edited, stored as a blob, shown to the client,
and the model told in a ``<context>`` note). In native function calling the
model calls ``search_web`` / ``fetch_url`` / ``generate_image`` itself.

Each is two steps: the first records a ``status`` at once ("Searching the
web", "Creating image") so clients see progress while the second works.
"""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Sequence

from engine.context.messages import add_or_update_system_message, get_last_user_message
from engine.context.steps import Detail, Draft
from engine.context.tasks import TaskFailure, parse_image_prompt, parse_queries, query_usage, query_warning, task_request, web_search_queries
from engine.json_types import JsonObject, JsonValue
from engine.ports import ImageGenerator, Knowledge, Page, PageFetcher, PayloadStore, RetrievalError, SearchHit, TaskModel, UpstreamError, WebError, WebSearch
from engine.protocols.shapes import Message, json_list
from engine.tools.builtin import stored_images

logger = logging.getLogger(__name__)

# The most input images an edit takes (the last two user messages with images).
EDIT_IMAGES = 2


def _legacy(draft: Draft, feature: str) -> bool:
    return draft.mode == "default" and draft.feature(feature)


# -- web search --------------------------------------------------------------------------


class WebQueries:
    """Search queries from the task model (the user's message when it gives none)."""

    name = "web_search_queries"

    def __init__(self, search: WebSearch | None, task_model: TaskModel) -> None:
        self._search = search
        self._task_model = task_model

    async def run(self, draft: Draft) -> Detail | None:
        if not _legacy(draft, "web_search") or self._search is None:
            return None
        last = get_last_user_message(draft.messages) or ""
        prompt = str(task_request("queries", draft.messages, now=draft.now)[0]["content"])
        detail: Detail = {"status": {"action": "web_search", "description": "Searching the web", "done": False}}
        try:
            answer = await self._task_model.ask("queries", prompt)
        except UpstreamError as exc:
            draft.web_queries = [last] if last.strip() else []
            detail.update(queries=json_list(draft.web_queries), query_error=exc.message)
            return detail
        reply = str(answer)
        parsed = parse_queries(reply)
        draft.web_queries = web_search_queries(parsed, last)
        detail.update(queries=json_list(draft.web_queries), query_reply=reply, **query_usage(answer))
        warning = query_warning(parsed, draft.web_queries)
        if warning is not None:
            logger.warning("turn %s: web search: %s", draft.turn.id, warning)
            detail["query_warning"] = warning
        return detail


class WebResults:
    """The results of the queries, their pages fetched concurrently (bounded per
    page and in all), as sources; a refused or failed page is recorded, and its
    search snippet stands in for it. The pages are chunked and searched for the
    queries as files are (``Knowledge.passages``), and only the chosen passages
    are sources; ``features.web_search_full_context`` (or no knowledge service)
    gives each page's whole text instead."""

    name = "web_search"

    def __init__(self, search: WebSearch | None, fetcher: PageFetcher | None, count: int, knowledge: Knowledge | None = None) -> None:
        self._search = search
        self._fetcher = fetcher
        self._count = count
        self._knowledge = knowledge

    async def run(self, draft: Draft) -> Detail | None:
        if not _legacy(draft, "web_search") or self._search is None:
            return None
        if not draft.web_queries:
            return {"status": {"action": "web_search", "description": "No search query generated", "done": True}}
        hits: dict[str, SearchHit] = {}
        errors: list[str] = []
        for query in draft.web_queries:
            try:
                for hit in await self._search.search(query, self._count):
                    hits.setdefault(hit.url, hit)
            except WebError as exc:
                errors.append(f"{query}: {exc}")
        if not hits:
            status: JsonObject = {"action": "web_search", "description": "No search results found", "done": True, "error": True}
            return {"status": status, "queries": json_list(draft.web_queries), "errors": json_list(errors)}
        pages: list[JsonValue] = []
        fetched: list[Page | WebError] = list(await self._fetcher.fetch_many(list(hits))) if self._fetcher is not None else []
        found: list[tuple[str, str, str, str]] = []  # url, title, text, search snippet
        for n, (url, hit) in enumerate(hits.items()):
            page = fetched[n] if n < len(fetched) else None
            if page is not None and not isinstance(page, Exception):
                pages.append({"url": url, "status": page.status, "title": page.title, "truncated": page.truncated})
                found.append((url, page.title or hit.title or url, page.text, hit.snippet))
            else:
                if page is not None:
                    pages.append({"url": url, "error": str(page)})
                found.append((url, hit.title or url, hit.snippet, hit.snippet))
        detail: Detail = {"queries": json_list(draft.web_queries), "pages": pages, "errors": json_list(errors)}
        if draft.feature("web_search_full_context") or self._knowledge is None:
            sources = [_web_source(url, title, [(text, None)]) for url, title, text, _ in found]
        else:
            sources = await self._retrieved(self._knowledge, found, draft.web_queries, detail)
        draft.sources.extend(sources)
        status = {"action": "web_search", "description": f"Searched {len(hits)} sites", "urls": json_list(hits), "done": True}
        return {"status": status, **detail, "sources": json_list(sources)}

    @staticmethod
    async def _retrieved(knowledge: Knowledge, found: list[tuple[str, str, str, str]], queries: list[str], detail: Detail) -> list[JsonObject]:
        """The pages' passages chosen for the queries; if retrieval fails, the
        search snippets (a page may be megabytes: never whole by accident)."""
        try:
            chosen = await knowledge.passages([text for _, _, text, _ in found], queries)
        except RetrievalError as exc:
            logger.warning("web search: retrieval over the pages failed, the snippets stand in: %s", exc)
            detail["retrieval_error"] = str(exc)
            return [_web_source(url, title, [(snippet, None)]) for url, title, _, snippet in found if snippet]
        detail["retrieval"] = "passages"
        return [_web_source(url, title, passages) for (url, title, _, _), passages in zip(found, chosen) if passages]


def _web_source(url: str, title: str, passages: Sequence[tuple[str, float | None]]) -> JsonObject:
    """A web page as a source, in Open WebUI's shape: one document per passage."""
    source: JsonObject = {
        "source": {"id": url, "name": title, "type": "web_search", "url": url},
        "document": [text for text, _ in passages],
        "metadata": [{"source": url, "name": title, "url": url, **({"score": score} if score is not None else {})} for _, score in passages],
    }
    if all(score is not None for _, score in passages):
        source["distances"] = [score for _, score in passages]
    return source


# -- image generation ----------------------------------------------------------------------


class ImageStarted:
    name = "image_generation_started"

    def __init__(self, images: ImageGenerator | None) -> None:
        self._images = images

    async def run(self, draft: Draft) -> Detail | None:
        if not _legacy(draft, "image_generation") or self._images is None:
            return None
        return {"status": {"action": "image_generation", "description": "Creating image", "done": False}}


class ImagePrompt:
    """Prompt mode, a new image (not an edit): the task model rewrites the
    user's request into a detailed image prompt first (``{"prompt": …}``).
    Its reply and the prompt are recorded, so a replay never asks again; an
    unusable reply (or a failed call) leaves the user's own words, with a
    warning."""

    name = "image_prompt"

    def __init__(self, images: ImageGenerator | None, task_model: TaskModel, enabled: bool) -> None:
        self._images = images
        self._task_model = task_model
        self._enabled = enabled

    async def run(self, draft: Draft) -> Detail | None:
        if not self._enabled or not _legacy(draft, "image_generation") or self._images is None or recent_images(draft.messages):
            return None
        words = get_last_user_message(draft.messages) or ""
        prompt = str(task_request("image_prompt", draft.messages, now=draft.now)[0]["content"])
        try:
            reply = await self._task_model.ask("image_prompt", prompt)
        except UpstreamError as exc:
            return self._fallback(draft, words, f"the task model failed ({exc.message})", None)
        parsed = parse_image_prompt(reply)
        if isinstance(parsed, TaskFailure):
            return self._fallback(draft, words, parsed.reason, reply)
        draft.image_prompt = parsed
        return {"prompt": parsed, "reply": reply}

    @staticmethod
    def _fallback(draft: Draft, words: str, reason: str, reply: str | None) -> Detail:
        warning = f"the task model gave no usable image prompt ({reason}); the user's words were drawn instead"
        logger.warning("turn %s: image generation: %s", draft.turn.id, warning)
        draft.image_prompt = words
        detail: Detail = {"prompt": words, "warning": warning}
        if reply is not None:
            detail["reply"] = reply
        return detail


class ImageGeneration:
    """Draw the user's last message (or edit the images of the recent user
    messages); the image is stored as a blob and sent to the client as a
    ``files`` event, and the model is told it exists (or why it failed)."""

    name = "image_generation"

    def __init__(self, images: ImageGenerator | None, payloads: PayloadStore) -> None:
        self._images = images
        self._payloads = payloads

    async def run(self, draft: Draft) -> Detail | None:
        if not _legacy(draft, "image_generation") or self._images is None:
            return None
        inputs = recent_images(draft.messages)
        prompt = draft.image_prompt if draft.image_prompt is not None and not inputs else get_last_user_message(draft.messages) or ""
        try:
            if inputs:
                made = await self._images.edit(prompt, inputs)
            else:
                made = await self._images.generate(prompt)
        except WebError as exc:
            note = f"An image was requested but could not be created: {exc}. Tell the user."
            draft.messages = _context_note(draft.messages, note)
            status: JsonObject = {"action": "image_generation", "description": "An error occurred while generating an image", "done": True, "error": True}
            return {"status": status, "error": str(exc), "edit": bool(inputs)}
        files = await stored_images(self._payloads, [(i.data, i.mime) for i in made])
        what = "edited" if inputs else "created"
        note = f"The requested image has been {what} and is already shown to the user; do not repeat it or describe how to make it."
        draft.messages = _context_note(draft.messages, note)
        status = {"action": "image_generation", "description": "Image created", "done": True}
        return {"status": status, "files": json_list(files), "edit": bool(inputs), "prompt": prompt}


def _context_note(messages: list[Message], note: str) -> list[Message]:
    return add_or_update_system_message(f"<context>{note}</context>", list(messages), append=False)


_DATA_URI = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+);base64,(?P<b64>.+)$", re.DOTALL)


def recent_images(messages: list[Message]) -> list[tuple[bytes, str]]:
    """The inline images of the last user messages that have any (at most
    ``EDIT_IMAGES``, most recent last): what an edit works on."""
    found: list[tuple[bytes, str]] = []
    for message in reversed(messages):
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        images = []
        for part in content:
            url = part.get("image_url") if isinstance(part, dict) else None
            url = url.get("url") if isinstance(url, dict) else url
            match = _DATA_URI.match(url) if isinstance(url, str) else None
            if match is not None:
                images.append((base64.b64decode(match.group("b64")), match.group("mime")))
        if images:
            found = images + found
        if len(found) >= EDIT_IMAGES:
            break
    return found[-EDIT_IMAGES:]
