"""turnlog's own tools, offered to the model in native function calling when the
request switches the matching feature on (and the ports behind it are
configured): the model searches, fetches, looks things up, remembers, draws and
runs code itself instead of having it pre-injected.

    web_search        → search_web, fetch_url
    files, knowledge  → query_knowledge_files, view_knowledge_file
    memory            → search_memories, add_memory
    image_generation  → generate_image
    code_interpreter  → execute_code

Each result is a string the model reads (JSON for structured ones); results of
``fetch_url``, ``query_knowledge_files`` and ``view_knowledge_file`` (and
``search_web``) become citation sources (``engine.tools.calls.citation_sources``).
Like any tool, a builtin's call and result are recorded, so replay and
``verify`` never search, fetch, draw or execute again.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from engine.json_types import JsonObject, JsonValue
from engine.ports import (
    CodeExecutor,
    CodeOutput,
    FileRef,
    ImageGenerator,
    Knowledge,
    MemorySearch,
    PageFetcher,
    PayloadStore,
    RetrievalError,
    WebError,
    WebSearch,
    code_output,
)
from engine.tools.calls import ToolContext, ToolSpec

Run = Callable[[JsonObject, ToolContext], Awaitable[str]]


@dataclass
class BuiltinTool:
    """A ``ToolHandle`` of one of turnlog's own tools."""

    spec: ToolSpec
    fn: Run

    async def __call__(self, args: JsonObject, ctx: ToolContext) -> str:
        return await self.fn(args, ctx)


def _spec(name: str, description: str, properties: JsonObject, required: Sequence[str], *, idempotent: bool = True) -> ToolSpec:
    return ToolSpec(
        name=name,
        description=description,
        parameters={"type": "object", "properties": properties, "required": list(required)},
        tool_id=f"builtin:{name}",
        kind="builtin",
        idempotent=idempotent,
    )


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def _error(message: str) -> str:
    return _json({"error": message})


def _count(args: Mapping[str, object], default: int, most: int) -> int:
    value = args.get("count", default)
    return max(1, min(most, value)) if isinstance(value, int) and not isinstance(value, bool) else default


@dataclass(frozen=True)
class BuiltinPorts:
    """What the builtin tools reach (None: that tool is not offered)."""

    search: WebSearch | None = None
    fetcher: PageFetcher | None = None
    knowledge: Knowledge | None = None
    memories: MemorySearch | None = None
    images: ImageGenerator | None = None
    payloads: PayloadStore | None = None
    code: CodeExecutor | None = None
    search_count: int = 5


# -- the tools ------------------------------------------------------------------------


def search_web(ports: BuiltinPorts) -> BuiltinTool:
    async def run(args: JsonObject, ctx: ToolContext) -> str:
        assert ports.search is not None
        try:
            hits = await ports.search.search(str(args.get("query", "")), _count(args, ports.search_count, 10))
        except WebError as exc:
            return _error(f"the search failed: {exc}")
        return _json([{"title": h.title, "link": h.url, "snippet": h.snippet} for h in hits])

    spec = _spec(
        "search_web",
        "Search the web. Returns results with title, link and snippet; fetch a link with fetch_url to read the page.",
        {"query": {"type": "string", "description": "what to search for"}, "count": {"type": "integer", "description": "how many results (at most 10)"}},
        ["query"],
    )
    return BuiltinTool(spec, run)


def fetch_url(ports: BuiltinPorts) -> BuiltinTool:
    async def run(args: JsonObject, ctx: ToolContext) -> str:
        assert ports.fetcher is not None
        try:
            page = await ports.fetcher.fetch(str(args.get("url", "")))
        except WebError as exc:  # refused (a private address...) or failed: the model reads why
            return _error(f"the page could not be fetched: {exc}")
        note = "\n\n[the page was cut at the fetch limit]" if page.truncated else ""
        return (f"# {page.title}\n\n" if page.title else "") + page.text + note

    spec = _spec("fetch_url", "Fetch a web page and return its text.", {"url": {"type": "string", "description": "an http(s) URL"}}, ["url"])
    return BuiltinTool(spec, run)


def _turn_refs(ctx: ToolContext) -> list[FileRef]:
    """The files and collections of the turn: the request's, and the model's
    attached knowledge (passed in the tool context's metadata)."""
    refs: list[FileRef] = []
    for entry in ctx.files:
        if isinstance(entry, dict) and isinstance(file_id := entry.get("id"), str):
            refs.append(FileRef("collection" if entry.get("type") == "collection" else "file", file_id))
    knowledge = ctx.metadata.get("knowledge")
    for kid in knowledge if isinstance(knowledge, list) else []:
        ref = FileRef("collection", str(kid))
        if ref not in refs:
            refs.append(ref)
    return refs


def query_knowledge_files(ports: BuiltinPorts) -> BuiltinTool:
    async def run(args: JsonObject, ctx: ToolContext) -> str:
        assert ports.knowledge is not None
        refs = _turn_refs(ctx)
        if not refs:
            return _error("no files or knowledge are attached to this chat")
        try:
            sources = await ports.knowledge.retrieve(str(ctx.user.get("id", "")), refs, [str(args.get("query", ""))])
        except RetrievalError as exc:
            return _error(f"the search failed: {exc}")
        chunks = []
        for source in sources:
            for document, meta in zip(source.get("document") or [], source.get("metadata") or []):
                chunk = {"content": document, "source": meta.get("name") or source["source"].get("name"), "file_id": meta.get("file_id", "")}
                if meta.get("score") is not None:
                    chunk["score"] = meta["score"]
                chunks.append(chunk)
        return _json(chunks[: _count(args, 10, 20)])

    spec = _spec(
        "query_knowledge_files",
        "Search the files and knowledge attached to this chat. Returns matching passages with their file.",
        {"query": {"type": "string", "description": "what to look for"}, "count": {"type": "integer", "description": "how many passages (at most 20)"}},
        ["query"],
    )
    return BuiltinTool(spec, run)


def view_knowledge_file(ports: BuiltinPorts) -> BuiltinTool:
    async def run(args: JsonObject, ctx: ToolContext) -> str:
        assert ports.knowledge is not None
        file_id = str(args.get("file_id", ""))
        user = str(ctx.user.get("id", ""))
        ref = FileRef("file", file_id, full=True)
        (info,) = await ports.knowledge.describe(user, [ref], wait=0)
        if info.status != "ready":
            return _error(f"file {file_id} cannot be read: {info.reason or info.status}")
        try:
            sources = await ports.knowledge.retrieve(user, [ref], [])
        except RetrievalError as exc:
            return _error(f"file {file_id} cannot be read: {exc}")
        content = "".join("".join(s.get("document") or []) for s in sources)
        return _json({"id": file_id, "filename": info.name, "content": content})

    spec = _spec("view_knowledge_file", "Read a whole attached file by its id.", {"file_id": {"type": "string", "description": "the file's id"}}, ["file_id"])
    return BuiltinTool(spec, run)


def search_memories(ports: BuiltinPorts) -> BuiltinTool:
    async def run(args: JsonObject, ctx: ToolContext) -> str:
        assert ports.memories is not None
        try:
            hits = await ports.memories.search(str(ctx.user.get("id", "")), str(args.get("query", "")), _count(args, 5, 20))
        except RetrievalError as exc:
            return _error(f"the search failed: {exc}")
        return _json([{"id": h.id, "content": h.content, "created_at": h.created_at} for h in hits])

    spec = _spec(
        "search_memories",
        "Search what the user asked you to remember about them.",
        {"query": {"type": "string"}, "count": {"type": "integer", "description": "how many (at most 20)"}},
        ["query"],
    )
    return BuiltinTool(spec, run)


def add_memory(ports: BuiltinPorts) -> BuiltinTool:
    async def run(args: JsonObject, ctx: ToolContext) -> str:
        assert ports.memories is not None
        content = str(args.get("content", "")).strip()
        if not content:
            return _error("nothing to remember: content is empty")
        try:
            memory_id = await ports.memories.remember(str(ctx.user.get("id", "")), content)
        except RetrievalError as exc:
            return _error(f"the memory was not saved: {exc}")
        return _json({"status": "saved", "id": memory_id})

    spec = _spec(
        "add_memory",
        "Remember a fact about the user for later chats (only what they would want kept).",
        {"content": {"type": "string", "description": "the fact, in one sentence"}},
        ["content"],
        idempotent=False,
    )
    return BuiltinTool(spec, run)


def generate_image(ports: BuiltinPorts) -> BuiltinTool:
    async def run(args: JsonObject, ctx: ToolContext) -> str:
        assert ports.images is not None and ports.payloads is not None
        try:
            images = await ports.images.generate(str(args.get("prompt", "")))
        except WebError as exc:
            return _error(f"the image could not be generated: {exc}")
        files = await stored_images(ports.payloads, [(i.data, i.mime) for i in images])
        if ctx.emit is not None:
            shown: list[JsonValue] = [*files]
            await ctx.emit({"type": "files", "data": {"files": shown}})
        return _json({"status": "created", "images": [f["url"] for f in files], "note": "The images are shown to the user already."})

    spec = _spec(
        "generate_image",
        "Draw an image from a description; the user sees it.",
        {"prompt": {"type": "string", "description": "a detailed visual description"}},
        ["prompt"],
        idempotent=False,
    )
    return BuiltinTool(spec, run)


async def run_code(code: CodeExecutor, payloads: PayloadStore | None, source: str, lang: str) -> CodeOutput:
    """Run code; the files it wrote go to the blob store (the log keeps their URLs)."""
    output = await code.run(source, lang)
    if output.get("files") and payloads is not None:
        output["files"] = await payloads.externalize(output["files"], limit=0)
    return code_output(output)


def execute_code(ports: BuiltinPorts) -> BuiltinTool:
    async def run(args: JsonObject, ctx: ToolContext) -> str:
        assert ports.code is not None
        return _json(await run_code(ports.code, ports.payloads, str(args.get("code", "")), "python"))

    spec = _spec(
        "execute_code",
        "Run Python code in an isolated sandbox (no network). Returns stdout, stderr, the value of the last expression, and files it wrote.",
        {"code": {"type": "string", "description": "Python source"}},
        ["code"],
        idempotent=False,
    )
    return BuiltinTool(spec, run)


async def stored_images(payloads: PayloadStore, images: Sequence[tuple[bytes, str]]) -> list[JsonObject]:
    """Images as blobs: ``[{"type": "image", "url", "mime"}]`` (never base64 in an event)."""
    files: list[JsonObject] = []
    for data, mime in images:
        uri = f"data:{mime};base64," + base64.b64encode(data).decode()
        ref = (await payloads.externalize({"data": uri}, limit=0))["data"]
        url = ref.get("url") if isinstance(ref, dict) else None
        files.append({"type": "image", "url": url or uri, "mime": mime})
    return files


# -- which tools a turn gets ------------------------------------------------------------------


def builtin_tools(ports: BuiltinPorts) -> dict[str, BuiltinTool]:
    """Every builtin tool whose ports are configured. Which of them a turn's
    model is offered is the assembly's choice (:func:`wanted_builtins`, after
    the inlet filters); a call to one it was not offered is refused."""
    tools: list[BuiltinTool] = []
    if ports.search is not None:
        tools.append(search_web(ports))
        if ports.fetcher is not None:
            tools.append(fetch_url(ports))
    if ports.knowledge is not None:
        tools += [query_knowledge_files(ports), view_knowledge_file(ports)]
    if ports.memories is not None:
        tools += [search_memories(ports), add_memory(ports)]
    if ports.images is not None and ports.payloads is not None:
        tools.append(generate_image(ports))
    if ports.code is not None:
        tools.append(execute_code(ports))
    return {t.spec.name: t for t in tools}


KNOWLEDGE_TOOLS = frozenset({"query_knowledge_files", "view_knowledge_file"})


#: The builtin tools each feature switches on.
FEATURE_TOOLS: dict[str, tuple[str, ...]] = {
    "web_search": ("search_web", "fetch_url"),
    "memory": ("search_memories", "add_memory"),
    "image_generation": ("generate_image",),
    "code_interpreter": ("execute_code",),
}


def wanted_builtins(request: Mapping[str, object], *, model_knowledge: bool = False) -> set[str]:
    """The builtin tools a request asks for: its features' tools, and the
    knowledge tools when it names files or the model has attached knowledge."""
    features = request.get("features")
    on = features if isinstance(features, dict) else {}
    names = {name for feature, tools in FEATURE_TOOLS.items() if on.get(feature) for name in tools}
    if request.get("files") or model_knowledge:
        names |= KNOWLEDGE_TOOLS
    return names
