"""The live assembler: from the client's request and the chat to the upstream request.

It runs the steps of ``engine.context.steps`` in order, once per turn, in the
``assembling`` state; each step that did something is recorded as an
``assembly.step`` event, then the result as ``assembly.completed`` — so a resume
or a ``verify`` never assembles again.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import aclosing

from engine.context.assemble import ModelProfile
from engine.context.history import History
from engine.context.media import ImageGeneration, ImagePrompt, ImageStarted, WebQueries, WebResults
from engine.context.plain import plain_request
from engine.context.steps import (
    AttachedFiles,
    ChatHistory,
    CodeInterpreterPrompt,
    Draft,
    Files,
    InletFilters,
    Memory,
    Params,
    SourceContext,
    Step,
    StepFailed,
    SystemMessages,
    Unsupported,
    UserImages,
)
from engine.context.tool_servers import ToolServersStep
from engine.events import AssemblyCompleted, AssemblyStep, EventData
from engine.fold.chat import chat_turn_views, stored_history
from engine.json_types import JsonObject, JsonValue
from engine.ports import (
    AssemblyError,
    EventStore,
    Filters,
    ImageGenerator,
    InlinePayloads,
    Knowledge,
    MemorySearch,
    ModelCatalog,
    ModelClient,
    ModelRequest,
    NoTurnToolServers,
    PageFetcher,
    PayloadStore,
    ResolvedModel,
    TaskModel,
    ToolRunner,
    TurnInput,
    TurnToolServers,
    UpstreamError,
    WebSearch,
)
from engine.protocols.history import REASONING_RESPONSES
from engine.protocols.model_events import TextDelta
from engine.protocols.shapes import json_list, list_of
from engine.settings import EngineSettings
from engine.tools.approval import asks
from engine.tools.builtin import wanted_builtins
from engine.tools.calls import ToolContext, ToolHandle, filter_arguments
from engine.tools.legacy import build_selection_request, first_json_object, parse_selection, tool_source


class LiveAssembler:
    """``engine.ports.Assembler`` of one turn."""

    def __init__(
        self,
        *,
        store: EventStore,
        models: ModelCatalog,
        model_client: ModelClient,
        tool_runner: ToolRunner,
        tools: Mapping[str, ToolHandle],
        settings: EngineSettings,
        filters: Filters,
        task_model: TaskModel,
        memories: MemorySearch | None = None,
        knowledge: Knowledge | None = None,
        search: WebSearch | None = None,
        fetcher: PageFetcher | None = None,
        images: ImageGenerator | None = None,
        payloads: PayloadStore | None = None,
        code_available: bool = True,
        search_count: int = 3,
        tool_servers: TurnToolServers | None = None,
    ) -> None:
        self._store = store
        self._models = models
        self._model_client = model_client
        self._tool_runner = tool_runner
        self._tools = tools
        self._settings = settings
        self._filters = filters
        self._task_model = task_model
        self._memories = memories
        self._knowledge = knowledge
        self._search = search
        self._fetcher = fetcher
        self._images = images
        self._payloads = payloads or InlinePayloads()
        self._available = {
            "web_search": search is not None,
            "image_generation": images is not None,
            "memory": memories is not None,
            "code_interpreter": code_available,
        }
        self._search_count = search_count
        self._tool_servers = tool_servers or NoTurnToolServers()

    async def assemble(self, turn: TurnInput) -> AsyncIterator[EventData]:
        resolved = await self._models.resolve(turn.model)
        history, chat_turns = History(), 0
        if turn.request.get("chat_id"):  # a chat the client names may have earlier turns
            views = [w for w in await chat_turn_views(self._store, turn.chat_id, before=turn.created_at) if w.id != turn.id]
            # A Responses API upstream takes its own reasoning items back (Open WebUI drops them).
            reasoning = REASONING_RESPONSES if resolved is not None and resolved.api == "responses" else None
            history, chat_turns = stored_history(views, reasoning_format=reasoning), len(views)
        draft = Draft(turn=turn, profile=_profile(resolved), request=dict(turn.request))
        for step in (Params(), ChatHistory(history, chat_turns)):
            detail = await step.run(draft)
            if detail is not None:
                yield AssemblyStep(step=step.name, detail=detail)
        if plain_request(draft, self._filters, self._tool_servers):
            # engine.context.plain: every step between would find nothing to do.
            detail = await SystemMessages().run(draft)
            if detail is not None:
                yield AssemblyStep(step=SystemMessages.name, detail=detail)
        else:
            async with aclosing(self._features(draft, resolved)) as events:  # its searches end with it
                async for event in events:
                    yield event
        yield (
            AssemblyCompleted(
                messages=draft.messages,
                params=draft.params,
                history_len=draft.history_len,
                new_messages=draft.new_messages,
                history_reset=draft.history_reset,
                turn_refs=draft.turn_refs,
                chat_turns=draft.chat_turns,
                sources=draft.numbered,
                rag=draft.rag,
                code_interpreter=draft.code_interpreter,
                code_cut=draft.code_interpreter,
            )
        )

    async def _features(self, draft: Draft, resolved: ResolvedModel | None) -> AsyncGenerator[EventData, None]:
        """The steps after the history: filters, features, tools, files, sources, system messages."""
        memory = Memory(self._memories, self._settings.memory_top_k)
        files = Files(self._knowledge, self._task_model, self._settings.file_wait_seconds)
        inlet = InletFilters(self._filters)
        pipeline: list[Step] = [
            UserImages(self._payloads),
            inlet,
            memory,
            WebQueries(self._search, self._task_model),
            WebResults(self._search, self._fetcher, self._search_count, self._knowledge),
            ImageStarted(self._images),
            ImagePrompt(self._images, self._task_model, self._settings.image_prompt_enhance),
            ImageGeneration(self._images, self._payloads),
            CodeInterpreterPrompt(self._available["code_interpreter"]),
            Unsupported(self._available),
            ToolServersStep(self._tool_servers),
            _OfferedTools(self._tools),
            _LegacyTools(self, resolved),
            files,
            AttachedFiles(),
            SourceContext(self._settings.rag_template, self._settings.rag_system_context),
            SystemMessages(),
        ]
        try:
            for step in pipeline:
                try:
                    detail = await step.run(draft)
                except StepFailed as exc:
                    yield AssemblyStep(step=step.name, detail=exc.detail)
                    raise AssemblyError(exc.message, exc.type, []) from exc
                if detail is not None:
                    yield AssemblyStep(step=step.name, detail=detail)
                if step is inlet:
                    # The messages are final now: the searches of memories and
                    # files start together and run while the steps between work.
                    memory.prefetch(draft)
                    files.prefetch(draft)
        finally:
            memory.abandon()
            files.abandon()

    async def legacy_tools(self, draft: Draft, resolved: ResolvedModel, handles: Mapping[str, ToolHandle]) -> JsonObject:
        """Legacy (prompt-based) tools: the task model picks tools before the main
        call, they run now, their results become sources of the turn's context."""
        specs = [h.spec.function() for h in handles.values()]
        request = ModelRequest(messages=build_selection_request(specs, draft.messages), params={})
        name, model = await self._selection_model(resolved, draft.turn.model)
        if model is None:
            return {"model": name, "error": f"task model {name!r} is not available", "calls": [], "sources": []}
        reply: list[str] = []
        try:
            async for events in self._model_client.stream(model, request, _selection_ids()):
                for event in events:
                    if isinstance(event, TextDelta):
                        reply.append(event.text)
        except UpstreamError as exc:
            # Tool selection is best effort: the answer goes on without tools.
            return {"model": name, "error": exc.message, "calls": [], "sources": []}
        text = "".join(reply)
        calls = parse_selection(text, set(handles))
        sources: list[JsonObject] = []
        ran: list[JsonValue] = []
        turn = draft.turn
        for index, (tool, parameters) in enumerate(calls):
            handle = handles[tool]
            args = filter_arguments(handle.spec, parameters)
            ctx = ToolContext(
                user={"id": turn.user_id}, messages=list(draft.messages), files=[], metadata={"turn_id": turn.id}, emit=None, call_id=f"legacy_{index}"
            )
            result, _error = await self._tool_runner.run(tool, args, handle, ctx, handle.spec.timeout or self._settings.tool_timeout)
            ran.append({"name": tool, "arguments": args, "output": result.text, "status": result.status})
            if result.text:
                sources.append(tool_source(handle.spec.tool_id, tool, args, result.text))
        # Tool results first, then the other sources (Open WebUI's order): the
        # source-context step numbers them all together, once per turn.
        draft.sources[:0] = sources
        detail: JsonObject = {"model": name, "reply": text, "calls": ran, "sources": json_list(sources)}
        if first_json_object(text) is None:  # a small model's prose: the answer goes on without tools, and says so
            detail["warning"] = "tools were not used: the model's tool selection held no JSON object"
        return detail

    async def _selection_model(self, resolved: ResolvedModel, turn_model: str) -> tuple[str, ResolvedModel | None]:
        """The task model (``TURNLOG_TASK_MODEL``, else the turn's own) picks the tools, as in Open WebUI."""
        name = self._settings.task_model
        if not name or name == turn_model:
            return turn_model, resolved
        return name, await self._models.resolve(name)


def _usable(draft: Draft, handles: Mapping[str, ToolHandle]) -> dict[str, ToolHandle]:
    """turnlog's own tools are the model's only in native function calling with
    the model's ``builtin_tools`` capability, and only those the request (as
    the inlet filters left it) asks for; in legacy mode their features are
    injected by the steps instead."""
    wanted: set[str] = set()
    if draft.mode == "native" and draft.capability("builtin_tools"):
        wanted = wanted_builtins(draft.request, model_knowledge=bool(draft.profile.knowledge))
    return {n: h for n, h in handles.items() if h.spec.kind != "builtin" or n in wanted}


class _OfferedTools:
    """Native function calling: the tools the model may call."""

    name = "tools"

    def __init__(self, handles: Mapping[str, ToolHandle]) -> None:
        self._handles = handles

    async def run(self, draft: Draft) -> JsonObject | None:
        if draft.mode != "native":
            return None
        handles = _usable(draft, self._handles)
        tools: list[JsonValue] = [*list_of(draft.params.get("tools")), *(h.spec.openai_tool() for h in handles.values())]
        if tools:
            draft.params["tools"] = tools
        offered = sorted(n for n, h in handles.items() if h.spec.kind == "builtin")
        return {"builtin": json_list(offered)} if offered else None


class _LegacyTools:
    """Prompt-based function calling: the task model picks tools, they run
    before the main call, their results become context."""

    name = "legacy_tools"

    def __init__(self, assembler: LiveAssembler, resolved: ResolvedModel | None) -> None:
        self._assembler = assembler
        self._resolved = resolved

    async def run(self, draft: Draft) -> JsonObject | None:
        handles = _usable(draft, self._assembler._tools)
        if draft.mode != "default" or not handles or self._resolved is None:
            return None
        # A tool whose calls wait for approval is never selected: nothing here
        # can wait for a person (the request is refused before the turn starts
        # when this is known then; an inlet filter or a tool server's function
        # names can make it known only now).
        approval = self._assembler._settings.approval_tools
        asking = sorted(n for n, h in handles.items() if asks(draft.request, approval, n, h))
        offered = {n: h for n, h in handles.items() if n not in asking}
        detail = await self._assembler.legacy_tools(draft, self._resolved, offered) if offered else {"calls": []}
        return {**detail, "needs_approval": json_list(asking)} if asking else detail


def _profile(resolved: ResolvedModel | None) -> ModelProfile:
    if resolved is None:
        return ModelProfile()
    return ModelProfile(
        system=resolved.system,
        params=resolved.params,
        function_calling=resolved.function_calling,
        capabilities=resolved.capabilities,
        knowledge=resolved.knowledge,
    )


def _selection_ids() -> Callable[[str], str]:
    """Ids for calls in a selection reply (never recorded: the reply is read as text)."""
    counter = itertools.count(1)
    return lambda prefix: f"{prefix}_selection_{next(counter)}"
