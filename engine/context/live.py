"""The live assembler: from the client's request and the chat to the upstream request.

It runs once per turn, in the ``assembling`` state, and its result is recorded
(``assembly.step`` events, then ``assembly.completed``), so a resume or a
``verify`` never assembles again.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engine.context.assemble import ModelProfile, assemble
from engine.context.history import History
from engine.context.unsupported import unsupported_step
from engine.events import AssemblyCompleted, AssemblyStep, EventData
from engine.fold.chat import chat_turn_views, stored_history
from engine.ports import EventStore, ModelCatalog, ModelClient, ModelRequest, ResolvedModel, ToolRunner, TurnInput, UpstreamError
from engine.protocols.model_events import TextDelta
from engine.settings import EngineSettings
from engine.tools.calls import ToolContext, ToolHandle, filter_arguments
from engine.tools.legacy import build_selection_request, parse_selection, tool_source


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
    ) -> None:
        self._store = store
        self._models = models
        self._model_client = model_client
        self._tool_runner = tool_runner
        self._tools = tools
        self._settings = settings

    async def assemble(self, turn: TurnInput) -> Sequence[EventData]:
        resolved = await self._models.resolve(turn.model)
        profile = ModelProfile(
            system=resolved.system if resolved else None,
            params=resolved.params if resolved else {},
        )
        history = History()
        if turn.request.get("chat_id"):  # a chat the client names may have earlier turns
            views = await chat_turn_views(self._store, turn.chat_id, before=turn.created_at)
            history = stored_history([w for w in views if w.id != turn.id])
        assembled = assemble(turn.request, history, profile)
        params = dict(assembled.params)
        messages = assembled.messages
        steps: list[EventData] = []
        if is_legacy(turn.request) and self._tools and resolved is not None:
            # Legacy (prompt-based) tools: the task model picks tools before the
            # main call, they run now, their results become context.
            step, messages = await self._legacy_tools(turn, resolved, messages)
            steps.append(step)
        else:
            tools = [*(params.get("tools") or []), *(h.spec.openai_tool() for h in self._tools.values())]
            if tools:
                params["tools"] = tools
        steps.append(
            AssemblyCompleted(
                messages=messages,
                params=params,
                history_len=assembled.history_len,
                new_messages=assembled.new_messages,
                history_reset=assembled.history_reset,
                turn_refs=assembled.turn_refs,
            )
        )
        # Fields the client switched on that do nothing yet: recorded first, so the
        # client is told early in the stream (engine.context.unsupported).
        ignored = unsupported_step(turn.request)
        if ignored is not None:
            steps.insert(0, ignored)
        return steps

    async def _legacy_tools(
        self, turn: TurnInput, resolved: ResolvedModel, messages: list[dict[str, Any]]
    ) -> tuple[AssemblyStep, list[dict[str, Any]]]:
        handles = self._tools
        specs = [h.spec.openai_tool()["function"] for h in handles.values()]
        request = ModelRequest(messages=build_selection_request(specs, messages), params={})
        reply: list[str] = []
        try:
            async for events in self._model_client.stream(resolved, request, _selection_ids()):
                for event in events:
                    if isinstance(event, TextDelta):
                        reply.append(event.text)
        except UpstreamError as exc:
            # Tool selection is best effort: the answer goes on without tools.
            return AssemblyStep(step="legacy_tools", detail={"error": exc.message, "calls": [], "sources": []}), messages
        calls = parse_selection("".join(reply), set(handles))
        sources: list[dict[str, Any]] = []
        ran: list[dict[str, Any]] = []
        for index, (name, parameters) in enumerate(calls):
            handle = handles[name]
            args = filter_arguments(handle.spec, parameters)
            ctx = ToolContext(user={"id": turn.user_id}, messages=list(messages), files=[], metadata={"turn_id": turn.id}, emit=None, call_id=f"legacy_{index}")
            result, _error = await self._tool_runner.run(name, args, handle, ctx, handle.spec.timeout or self._settings.tool_timeout)
            ran.append({"name": name, "arguments": args, "output": result.text, "status": result.status})
            if result.text:
                sources.append(tool_source(handle.spec.tool_id, name, args, result.text))
        step = AssemblyStep(step="legacy_tools", detail={"reply": "".join(reply), "calls": ran, "sources": sources})
        return step, with_tool_context(messages, sources)


def _selection_ids() -> Callable[[str], str]:
    """Ids for calls in a selection reply (never recorded: the reply is read as text)."""
    counter = itertools.count(1)
    return lambda prefix: f"{prefix}_selection_{next(counter)}"


def is_legacy(request: dict[str, Any]) -> bool:
    params = request.get("params")
    return isinstance(params, dict) and params.get("function_calling") == "default"


def with_tool_context(messages: list[dict[str, Any]], sources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Prepend the tool results, as numbered sources, to the last user message."""
    if not sources:
        return messages
    blocks = "\n".join(
        f'<source id="{i}" name="{s["source"]["name"]}">{s["document"][0]}</source>' for i, s in enumerate(sources, 1)
    )
    context = f"Use these tool results to answer; cite them as [id].\n<context>\n{blocks}\n</context>\n\n"
    out = list(messages)
    for i in range(len(out) - 1, -1, -1):
        if out[i].get("role") == "user" and isinstance(out[i].get("content"), str):
            out[i] = {**out[i], "content": context + out[i]["content"]}
            break
    return out
