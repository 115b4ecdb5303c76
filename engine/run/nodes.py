"""The nodes of a turn, in the order a turn runs them:

    Assemble → RequestModel → Decide ─┬─ no calls, or the cap hit ─→ Finalize → Outlet → Background → Complete → End
                   ↑                  └─ calls ─→ RunTools ─┬─ client calls ─→ Finalize
                   └──────── Reinject ←─────────────────────┘

Each node does one step's work through the turn's ports, records what
happened, and returns the next node (or ``END``). A node reads the turn only
through its two folds (``ctx.view``, ``ctx.state``), so a resumed turn starts at
``entry_node`` of its folded log and continues exactly where the log ends: a
call with a recorded result is never run again, a model request whose response
was cut off is re-sent with the durable text as a prefill.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, Protocol

from engine.blobs import BLOB_URL_PREFIX
from engine.context.assemble import params_for_round
from engine.context.sources import DEFAULT_RAG_TEMPLATE, NumberedSource, apply_source_context, numbered_sources
from engine.context.steps import snapshot
from engine.context.tasks import TaskFailure, TaskKind, fallback_title, parse_follow_ups, parse_tags, parse_title, task_request
from engine.events import (
    AssemblyStep,
    BackgroundResult,
    BackgroundStarted,
    ContextReinjected,
    EventData,
    IterationLimit,
    ModelCompleted,
    ModelFallback,
    ModelItem,
    ModelRequested,
    ModelWarning,
    OutletApplied,
    ToolApprovalRequested,
    ToolCompleted,
    ToolEvent,
    ToolsBatch,
    ToolsDecided,
    ToolStarted,
    TurnCompleted,
    TurnFinalized,
)
from engine.fold.output_items import call_id_of
from engine.fold.turn_view import TurnView
from engine.json_types import JsonObject, JsonValue
from engine.ports import AssemblyError, CodeOutput, ModelRequest, ResolvedModel, TaskReply, UpstreamError, observe
from engine.protocols.history import REASONING_RESPONSES, convert_output_to_messages, for_model
from engine.protocols.model_events import (
    Finished,
    ModelEvent,
    ProviderItem,
    ReasoningDelta,
    StreamFailed,
    StreamWarning,
    TextDelta,
    TextRun,
    ToolArgumentsDelta,
    ToolCall,
    ToolCallStarted,
    UsageReport,
)
from engine.protocols.responses import stateful_continuation_input
from engine.run.context import END, End, TurnContext
from engine.run.failures import failure_fields
from engine.run.loop_state import LoopState
from engine.run.usage import with_usage
from engine.tools.approval import asks, rejected_output
from engine.tools.builtin import run_code
from engine.tools.calls import ArgumentError, ToolContext, ToolHandle, citation_sources, filter_arguments, not_found_message, parse_arguments

LIMIT_MESSAGE = "Tool-call limit reached ({n} iterations)."
CODE_TOOL = "code_interpreter"
CODE_MAX_RUNS = 5  # legacy code-interpreter blocks run per turn (Open WebUI's hard-coded retries)
INTERRUPTED_MESSAGE = "Error: the tool `{name}` was interrupted (the service stopped while it ran) and is not safe to run twice; it was not run again."


class Node(Protocol):
    async def run(self, ctx: TurnContext) -> Node | End: ...


def entry_node(view: TurnView, state: LoopState) -> Node | End:
    """Where a turn (new or resumed) continues, from the state its log is in."""
    if view.terminal:
        return END
    at = view.state
    if at == "assembling":
        return RequestModel() if state.assembled else Assemble()
    if at == "streaming":
        return RequestModel(resume=True) if state.model_open else Decide()
    if at == "executing_tools":
        return RunTools()
    if at == "awaiting_approval":
        return AwaitApproval() if state.undecided else RunTools()
    if at == "reinjecting":
        return RequestModel()
    if at == "finalizing":
        return Outlet()
    return Background()  # outlet, background: the tasks without a result run


@dataclass(frozen=True)
class Assemble:
    """The upstream request: recorded, so a resume or a replay sends the same."""

    async def run(self, ctx: TurnContext) -> Node | End:
        try:
            async for data in ctx.ports.assembler.assemble(ctx.state.input):
                # Progress a client should see now is committed at once; the
                # rest with the model.requested that sends the assembly.
                progress = isinstance(data, AssemblyStep) and "status" in data.detail
                await ctx.record(data, durable=progress)
        except AssemblyError as exc:
            await ctx.record(*exc.steps)
            return await ctx.fail(exc.message, exc.type)
        return RequestModel()


@dataclass(frozen=True)
class RequestModel:
    """One model call, streamed into the turn. ``resume``: the previous attempt
    was cut off; the durable text of its round (none after a restart, which
    superseded it) goes back as a prefill, with the upstream's resume params.
    ``resolved``: the model as the resume resolved it to choose its mode."""

    resume: bool = False
    resolved: ResolvedModel | None = None

    async def run(self, ctx: TurnContext) -> Node | End:
        view, state = ctx.view, ctx.state
        resolved = self.resolved or await ctx.ports.models.resolve(state.input.model)
        if resolved is None:
            return await ctx.fail(f"model {state.input.model!r} is not available", "model_not_found")
        prefill = (view.acc.content if self.resume and not view.round_closed else None) or None
        extra = dict(resolved.resume_params) if prefill and resolved.resume == "continue" else {}
        base = params_for_round(state.params, state.iteration)
        params = {**base, **extra} if extra else base
        # Write-ahead: durable before the request goes out.
        await ctx.record(ModelRequested(iteration=state.iteration, prefill=prefill, resumed=self.resume, api=resolved.api, resume_params=extra or None))
        observe(ctx.ports.observer.model_call_started, ctx.turn_id, model=state.input.model, resolved=resolved, iteration=state.iteration)
        stateful = state.pending_stateful if (ctx.settings.responses_stateful and resolved.api == "responses") else None
        request = ModelRequest(
            messages=await inline_blob_urls(ctx, state.messages),
            params=params,
            prefill=prefill or None,
            previous_response_id=stateful[0] if stateful else None,
            input_items=await inline_blob_urls(ctx, stateful[1]) if stateful else [],
        )
        try:
            finished = await _consume(ctx, resolved, request)
        except UpstreamError as exc:
            if exc.kind != "previous_response_not_found" or not request.previous_response_id:
                _upstream_failed(ctx, exc.kind)
                return await ctx.fail(exc.message, exc.kind, status=exc.status, extra=failure_fields(exc, state.iteration))
            # The anchor expired upstream: send the whole transcript instead.
            await ctx.record(ModelFallback(reason=exc.message, previous_response_id=request.previous_response_id))
            full = ModelRequest(messages=request.messages, params=request.params, prefill=request.prefill)
            try:
                finished = await _consume(ctx, resolved, full)
            except UpstreamError as again:
                _upstream_failed(ctx, again.kind)
                return await ctx.fail(again.message, again.kind, status=again.status, extra=failure_fields(again, state.iteration))
        return Decide() if finished else END


def _upstream_failed(ctx: TurnContext, kind: str) -> None:
    """The model call failed at the upstream: ends its span, counts the error."""
    observer = ctx.ports.observer
    observe(observer.upstream_error, ctx.turn_id, kind)
    observe(observer.model_call_ended, ctx.turn_id, error=kind)


async def _consume(ctx: TurnContext, resolved: ResolvedModel, request: ModelRequest) -> bool:
    """Fold one model response into the turn; False if the turn failed."""
    response = _Response()
    ids = _call_ids(ctx.turn_id, ctx.state.iteration)
    streamed = _StreamFilters(ctx) if "stream" in ctx.ports.filters.hooks() else None
    cut = ctx.view.out.code_interpreter and ctx.view.out.code_cut
    # Without stream filters, a read's text chunks come as runs (TextRun: a
    # list of their texts, no object per chunk).
    runs = streamed is None and not cut and ctx.settings.live_fast_paths
    reads = ctx.ports.model_client.stream(resolved, request, ids, runs=runs)
    if ctx.ports.tokens is not None:
        reads = with_usage(reads, request, ctx.ports.tokens)
    async for events in _until_code_closed(ctx, reads) if cut else reads:
        if response.first_chunk_at is None and _answers(events):
            response.first_chunk_at = time.time()
        # A read's consecutive chunks of one kind go out as one live message
        # (ctx.deltas); anything else in the read waits for those before it.
        run: list[str] = []
        run_kind = "text"
        for event in _unannounced_whole(events):
            cls = type(event)
            if type(event) is TextRun:  # type(), not isinstance: the per-chunk test of the hot loop
                texts = event.texts
                if run_kind == "text" and run:
                    run.extend(texts)
                elif run:
                    ctx.deltas(run_kind, run)
                    run, run_kind = texts, "text"
                else:
                    run, run_kind = texts, "text"
                continue
            if streamed is None and (type(event) is TextDelta or type(event) is ReasoningDelta):
                text = event.text
                if text:
                    kind = "text" if cls is TextDelta else "reasoning"
                    if kind != run_kind and run:
                        ctx.deltas(run_kind, run)
                        run = []
                    run_kind = kind
                    run.append(text)
                continue
            if run:
                ctx.deltas(run_kind, run)
                run = []
            ended = await _other_event(ctx, event, streamed, response)
            if ended is not None:
                return ended
        if run:
            ctx.deltas(run_kind, run)
        if ctx.writes_behind():
            await ctx.catch_up()
    _upstream_failed(ctx, "upstream_truncated")
    await ctx.fail("the model stream ended without finishing", "upstream_truncated")
    return False


def _unannounced_whole(events: list[ModelEvent]) -> list[ModelEvent]:
    """A read's events, less the live progress of calls it also brings whole
    (started and done in it): announcing them would cost a commit and show
    nothing sooner."""
    whole = {event.call_id for event in events if type(event) is ToolCall}
    if not whole:
        return events
    return [e for e in events if not (isinstance(e, ToolCallStarted | ToolArgumentsDelta) and e.call_id in whole)]


@dataclass
class _Response:
    """What one model response has reported so far, besides its events."""

    usage: JsonObject | None = None
    first_chunk_at: float | None = None  # when the first answer chunk arrived


def _answers(events: list[ModelEvent]) -> bool:
    """Whether a read holds part of the answer (not only a usage report, a
    warning or the finish)."""
    for event in events:
        if type(event) is TextRun or isinstance(event, ToolCall | ProviderItem | ToolCallStarted):
            return True
        if isinstance(event, TextDelta | ReasoningDelta) and event.text:
            return True
    return False


async def _other_event(ctx: TurnContext, event: ModelEvent, streamed: _StreamFilters | None, response: _Response) -> bool | None:
    """One event of a read that is not a plain text chunk (those are batched
    in ``_consume``'s loop). True or False: the response ended (False: the
    turn failed); None: read on."""
    if isinstance(event, TextDelta | ReasoningDelta):
        if event.text and streamed is not None:
            await streamed.delta("text" if isinstance(event, TextDelta) else "reasoning", event.text)
    elif isinstance(event, ToolArgumentsDelta):
        ctx.deltas("tool_arguments", [event.text], call_id=event.call_id)
    elif isinstance(event, ToolCallStarted):
        # Announced as its name arrives, so clients show the call while its
        # arguments stream (recorded: a replay shows it at the same place).
        await ctx.record(ModelItem(item=_started_item(event)))
    elif isinstance(event, ToolCall):
        await ctx.record(ModelItem(item=_call_item(event)))
    elif isinstance(event, ProviderItem):
        # An image the model made (a base64 item) goes to the blob store:
        # the log and clients carry its URL.
        item = await ctx.ports.payloads.externalize(event.item, limit=ctx.settings.inline_limit)
        await ctx.record(ModelItem(item=item))
    elif isinstance(event, UsageReport):
        response.usage = event.usage
    elif isinstance(event, StreamWarning):
        raw = event.raw if isinstance(event.raw, str) or event.raw is None else json.dumps(event.raw)[:500]
        await ctx.record(ModelWarning(message=event.message, raw=raw))
    elif isinstance(event, StreamFailed):
        _upstream_failed(ctx, "upstream_failed")
        await ctx.fail(event.message, "upstream_failed", code=event.code)
        return False
    elif isinstance(event, Finished):
        usage = event.usage or response.usage
        first = response.first_chunk_at
        completed = ModelCompleted(finish_reason=event.reason, usage=usage, response_id=event.response_id, status=event.status, first_chunk_at=first)
        await ctx.record(completed)
        observe(ctx.ports.observer.model_call_ended, ctx.turn_id, finish_reason=event.reason, usage=usage, response_id=event.response_id)
        return True
    return None


def _started_item(event: ToolCallStarted) -> JsonObject:
    """The ``function_call`` item of a call whose arguments are still streaming."""
    item_id = event.item_id or event.call_id
    return {"type": "function_call", "id": item_id, "call_id": event.call_id, "name": event.name, "arguments": "", "status": "in_progress"}


def _call_item(event: ToolCall) -> JsonObject:
    """The ``function_call`` output item of a tool call the model made."""
    item: JsonObject = {
        "type": "function_call",
        "id": event.item_id or event.call_id,
        "call_id": event.call_id,
        "name": event.name,
        "arguments": event.arguments,
        "status": "completed",
    }
    if event.provider_id:
        item["provider_call_id"] = event.provider_id
    return item


#: Events of a response that carry its answer (dropped after a code block's end).
_ANSWER_EVENTS = (TextDelta, ReasoningDelta, ToolCallStarted, ToolArgumentsDelta, ToolCall, ProviderItem)


async def _until_code_closed(ctx: TurnContext, reads: AsyncGenerator[list[ModelEvent], None]) -> AsyncGenerator[list[ModelEvent], None]:
    """Legacy code interpreter: the answer ends at its code block's
    ``</code_interpreter>``, as Open WebUI stops reading there, so the block
    runs before the model goes on (one that kept writing never had its code
    run). The rest of the response is still read, for its finish and usage
    report only (the stream ends cleanly, the usage is not lost); what it held
    is dropped, and a warning says how much.

    One event per read: the accumulator has folded each chunk before the next
    is looked at, so the chunk that closes the block is the last one taken.
    """
    dropped = 0
    async with aclosing(reads):
        async for events in reads:
            for event in events:
                if ctx.view.acc.code_closed and isinstance(event, _ANSWER_EVENTS):
                    dropped += len(event.text) if isinstance(event, TextDelta | ReasoningDelta) else 1
                    continue
                if isinstance(event, Finished) and dropped:
                    message = (
                        f"the model went on after </code_interpreter> ({dropped} characters or items); "
                        "that was dropped: the block runs first, and the model continues from its output"
                    )
                    yield [StreamWarning(message=message)]
                yield [event]


class _StreamFilters:
    """Each delta through the ``stream`` filters before it is shown and logged
    (the log holds what clients saw). A filter that raises is skipped for that
    delta and reported once per turn as a ``model.warning``."""

    def __init__(self, ctx: TurnContext) -> None:
        self._ctx = ctx
        self._reported: set[str] = set()

    async def delta(self, kind: str, text: str) -> None:
        # Open WebUI's stream filters see chat.completion.chunk-shaped events.
        key = "content" if kind == "text" else "reasoning_content"
        event, runs = self._ctx.ports.filters.stream({"choices": [{"index": 0, "delta": {key: text}}]})
        out = _delta_text(event, key, text)
        if out:
            self._ctx.delta(kind, out)
        for run in runs:
            if run.error and run.filter not in self._reported:
                self._reported.add(run.filter)
                await self._ctx.record(ModelWarning(message=f"stream filter {run.filter} failed and was skipped: {run.error}"))


def _delta_text(event: JsonObject, key: str, default: str) -> str:
    choices = event.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        delta = choices[0].get("delta")
        if isinstance(delta, dict):
            value = delta.get(key)
            return value if isinstance(value, str) else ""
    return default


def _call_ids(turn_id: str, iteration: int) -> Callable[[str], str]:
    """Ids for calls a provider left without one: deterministic per turn and round
    (they are recorded, so a replay never needs to regenerate them)."""
    counter = 0

    def make(prefix: str) -> str:
        nonlocal counter
        counter += 1
        digest = hashlib.sha256(f"{turn_id}:{iteration}:{counter}".encode()).hexdigest()[:24]
        return f"{prefix}_{digest}"

    return make


@dataclass(frozen=True)
class Decide:
    """The response is complete: run its tool calls, or finish."""

    async def run(self, ctx: TurnContext) -> Node | End:
        view, state = ctx.view, ctx.state
        calls = state.last_round_calls
        code = view.pending_code
        if code is not None and not calls and state.code_runs < CODE_MAX_RUNS:
            # Legacy mode: the model wrote a <code_interpreter> block. It is run
            # whatever its type attribute says (Open WebUI re-prompted without
            # running a block typed otherwise).
            arguments = json.dumps({"code": code.get("code", ""), "lang": code.get("lang") or "python"})
            call = {"call_id": code["id"], "name": CODE_TOOL, "arguments": arguments, "kind": "code"}
            return RunTools(ToolsBatch(iteration=state.iteration + 1, calls=[call]))
        if not calls:
            # Includes finish_reason "tool_calls" with an empty list: the loop ends
            # (Open WebUI looped forever on it).
            return Finalize(state.finish_reason if state.finish_reason != "tool_calls" else "stop")
        client_names = client_tool_names(state.input.request)
        ours = [c for c in calls if call_field(c, "name") not in client_names or _runnable(ctx, call_field(c, "name")) is not None]
        client = [c for c in calls if c not in ours]
        limit = iteration_limit(state.input.request, ctx.settings.max_tool_call_iterations)
        if ours and limit >= 0 and state.iteration >= limit:
            await ctx.record(IterationLimit(limit=limit, pending_calls=ours, message=LIMIT_MESSAGE.format(n=limit)))
            return Finalize("tool_calls" if client else "stop")
        return RunTools(ToolsBatch(iteration=state.iteration + 1, calls=ours, client_calls=client))


def _runnable(ctx: TurnContext, name: str) -> ToolHandle | None:
    """The handle of a tool this turn's model may call: a builtin only if the
    assembly offered it (the ports hold every configured one)."""
    handle = ctx.ports.tools.get(name)
    if handle is not None and handle.spec.kind == "builtin" and name not in ctx.state.offered_builtins:
        return None
    return handle


def client_tool_names(request: Mapping[str, JsonValue]) -> set[str]:
    """Tools the client declared in the plain OpenAI ``tools`` field."""
    names: set[str] = set()
    tools = request.get("tools")
    for tool in tools if isinstance(tools, list) else []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str):
            names.add(name)
    return names


def call_field(call: Mapping[str, JsonValue], key: str) -> str:
    """A call's ``call_id``, ``name`` or ``arguments``: strings in every call
    the engine records ("" if absent)."""
    value = call.get(key)
    return value if isinstance(value, str) else ""


def iteration_limit(request: Mapping[str, JsonValue], default: int) -> int:
    params = request.get("params")
    value = params.get("max_tool_call_iterations") if isinstance(params, dict) else None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return default


@dataclass(frozen=True)
class RunTools:
    """Run a batch: a new one (recorded here with its write-ahead events, in one
    commit) or, on resume (``batch`` None), the one the log shows in progress."""

    batch: ToolsBatch | None = None

    async def run(self, ctx: TurnContext) -> Node | End:
        state = ctx.state
        fresh = self.batch is not None
        if self.batch is not None:
            asked = _approval_requests(ctx, self.batch)
            if asked:
                # The batch and its questions in one commit; nothing runs before
                # every asked call is decided.
                await ctx.record(self.batch, *asked)
                return AwaitApproval()
        elif ctx.view.state == "awaiting_approval":
            if state.undecided:
                return AwaitApproval()
            # Committed with the batch's write-ahead events below.
            await ctx.record(ToolsDecided(), durable=False)
        batch = self.batch if self.batch is not None else (state.batch or ToolsBatch(iteration=state.iteration))
        done = set() if fresh else state.done
        started_before = {} if fresh else state.started
        runs: list[tuple[JsonObject, JsonObject, ToolHandle | None]] = []
        started: list[EventData] = [self.batch] if self.batch is not None else []
        for call in batch.calls:
            if call["call_id"] in done:
                continue  # its result is on the log: never run it again
            event, run = _plan_call(ctx, call, started_before)
            started.append(event)
            if run is not None:
                runs.append(run)
        if started:
            await ctx.record(*started)  # write-ahead: durable before any tool runs
            _observe_tools(ctx, started)
        if runs:
            await asyncio.gather(*(_run_code(ctx, call, args) if handle is None else _run_tool(ctx, call, args, handle) for call, args, handle in runs))
        if batch.client_calls:
            return Finalize("tool_calls")
        return Reinject()


def _plan_call(
    ctx: TurnContext, call: JsonObject, started_before: dict[str, ToolStarted]
) -> tuple[EventData, tuple[JsonObject, JsonObject, ToolHandle | None] | None]:
    """What a call of a batch becomes: its write-ahead ``tool.started`` and
    what to run, or the result it gets without running (a fork's substitute,
    a rejection, an interruption of a call that is not idempotent, arguments
    that do not parse, an unknown tool)."""
    state = ctx.state
    call_id, name = call_field(call, "call_id"), call_field(call, "name")
    if call_id in state.substitutes:
        # A fork was given this call's output: recorded, not run.
        return ToolCompleted(call_id=call_id, name=name, output=state.substitutes[call_id], substituted=True), None
    decision = state.decisions.get(call_id)
    if decision is not None and not decision.approve:
        return _failed(call_id, name, rejected_output(name, decision.reason)), None
    attempt = 1
    if call_id in started_before:
        previous = started_before[call_id]
        if not previous.idempotent:
            return _failed(call_id, name, INTERRUPTED_MESSAGE.format(name=name)), None
        attempt = previous.attempt + 1
    if call.get("kind") == "code":
        arguments = call_field(call, "arguments")  # {"code", "lang"}, as Decide wrote it
        code_started = ToolStarted(call_id=call_id, name=name, arguments=arguments, kind="code", attempt=attempt)
        return code_started, (call, json.loads(arguments), None)
    handle = _runnable(ctx, name)
    parsed = parse_arguments(_raw_arguments(call), name)
    if isinstance(parsed, ArgumentError):
        return _failed(call_id, name, parsed.message), None
    if handle is None:
        return _failed(call_id, name, not_found_message(name)), None
    args = filter_arguments(handle.spec, parsed)
    tool_started = ToolStarted(
        call_id=call_id,
        name=name,
        arguments=json.dumps(args, ensure_ascii=False),
        kind=handle.spec.kind,
        tool_id=handle.spec.tool_id,
        idempotent=handle.spec.idempotent,
        attempt=attempt,
    )
    return tool_started, (call, args, handle)


def _observe_tools(ctx: TurnContext, recorded: Sequence[EventData]) -> None:
    """Tool calls that start, or end without running (refused, interrupted)."""
    observer = ctx.ports.observer
    for data in recorded:
        if isinstance(data, ToolStarted):
            observe(observer.tool_call_started, ctx.turn_id, call_id=data.call_id, name=data.name)
        elif isinstance(data, ToolCompleted) and not data.substituted:
            observe(observer.tool_call_ended, ctx.turn_id, call_id=data.call_id, name=data.name, status=data.status, error=data.error)


@dataclass(frozen=True)
class AwaitApproval:
    """The batch waits for decisions: the actor ends here, holding nothing. The
    turn stays ``waiting`` in the log; recording the last decision starts an
    actor (on whichever process records it) that continues with ``RunTools``."""

    async def run(self, ctx: TurnContext) -> Node | End:
        return END


def _approval_requests(ctx: TurnContext, batch: ToolsBatch) -> list[EventData]:
    """The questions for the calls of a new batch that must be approved before
    they run. Calls that cannot run (an unknown tool, broken arguments) and
    calls a fork substitutes are not asked: their result is recorded anyway."""
    request, tools = ctx.state.input.request, ctx.settings.approval_tools
    out: list[EventData] = []
    for call in batch.calls:
        call_id, name = call_field(call, "call_id"), call_field(call, "name")
        if call_id in ctx.state.substitutes:
            continue
        if call.get("kind") == "code":
            handle = None
        else:
            handle = _runnable(ctx, name)
            if handle is None or isinstance(parse_arguments(_raw_arguments(call), name), ArgumentError):
                continue
        if asks(request, tools, name, handle):
            out.append(ToolApprovalRequested(call_id=call_id, name=name, arguments=call_field(call, "arguments")))
    return out


def _raw_arguments(call: Mapping[str, JsonValue]) -> str | JsonObject | None:
    """A call's arguments as ``parse_arguments`` takes them: the model's JSON
    string (an object from some providers); any other value as its JSON, which
    ``parse_arguments`` refuses as not an object."""
    arguments = call.get("arguments")
    if arguments is None or isinstance(arguments, str | dict):
        return arguments
    return json.dumps(arguments)


def _failed(call_id: str, name: str, text: str) -> ToolCompleted:
    return ToolCompleted(call_id=call_id, name=name, output=text, status="failed", error=text)


async def _run_tool(ctx: TurnContext, call: JsonObject, args: JsonObject, handle: ToolHandle) -> None:
    call_id, name = call_field(call, "call_id"), call_field(call, "name")

    async def emit(event: JsonObject) -> None:
        await ctx.record(ToolEvent(call_id=call_id, event=await ctx.ports.payloads.externalize(event, limit=ctx.settings.inline_limit)))

    turn = ctx.state.input
    files = turn.request.get("files")
    tool_ctx = ToolContext(
        user={"id": turn.user_id, "name": turn.user_id},
        messages=list(ctx.state.messages),
        files=list(files) if isinstance(files, list) else [],
        metadata={
            "turn_id": turn.id,
            "chat_id": turn.chat_id,
            "call_id": call_id,
            "iteration": ctx.state.iteration,
            "knowledge": list(ctx.state.attached_knowledge),
        },
        emit=emit,
        call_id=call_id,
    )
    timeout = handle.spec.timeout or ctx.settings.tool_timeout
    result, error = await ctx.ports.tool_runner.run(name, args, handle, tool_ctx, timeout)
    sources = citation_sources(name, handle.spec.tool_id, result.text, params=args) if result.status == "completed" else []
    files = await ctx.ports.payloads.externalize(result.files, limit=ctx.settings.inline_limit)
    images = await _image_urls(ctx, result.images)
    await ctx.record(
        ToolCompleted(
            call_id=call_id,
            name=name,
            output=result.text,
            status=result.status,
            files=files,
            embeds=result.embeds,
            images=images,
            sources=sources,
            error=error,
        )
    )
    observe(ctx.ports.observer.tool_call_ended, ctx.turn_id, call_id=call_id, name=name, status=result.status, error=error)


async def _image_urls(ctx: TurnContext, images: list[str]) -> list[str]:
    """A tool's images as blob URLs (``/v1/blobs/ID``) instead of base64 data
    URIs, so the log and every client carry a reference; the model gets the
    image itself (``inline_blob_urls`` when the request is sent). Small ones,
    and all without a blob store, stay inline."""
    refs = await ctx.ports.payloads.externalize(images, limit=ctx.settings.inline_limit)
    return [ref["url"] if isinstance(ref, dict) and isinstance(ref.get("url"), str) else ref for ref in refs]


async def inline_blob_urls(ctx: TurnContext, messages: list[JsonObject]) -> list[JsonObject]:
    """``messages`` (or input items) with each image URL that is one of the
    user's blobs replaced by its data URI: the upstream cannot fetch this
    service's URLs. Unchanged parts are the same objects (nothing is copied
    when there is no blob URL)."""
    items = [await _inline_object(ctx, m) for m in messages]
    return messages if all(a is b for a, b in zip(items, messages, strict=True)) else items


async def _inline_value(ctx: TurnContext, value: JsonValue) -> JsonValue:
    if isinstance(value, list):
        items = [await _inline_value(ctx, v) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if not isinstance(value, dict):
        return value
    return await _inline_object(ctx, value)


async def _inline_object(ctx: TurnContext, value: JsonObject) -> JsonObject:
    out = value
    for key, item in value.items():
        new: JsonValue
        if key in ("url", "image_url") and isinstance(item, str) and item.startswith(BLOB_URL_PREFIX):
            new = await ctx.ports.payloads.data_uri(item) or item
        elif isinstance(item, (dict, list)):
            new = await _inline_value(ctx, item)
        else:
            continue
        if new is not item:
            out = dict(out) if out is value else out
            out[key] = new
    return out


async def _run_code(ctx: TurnContext, call: JsonObject, args: JsonObject) -> None:
    """Run a legacy code-interpreter block through the code executor port."""
    timeout = ctx.settings.tool_timeout
    error: str | None = None
    status: Literal["completed", "failed"]
    code, lang = args.get("code", ""), args.get("lang", "python")  # strings: Decide wrote them
    output: CodeOutput
    try:
        async with asyncio.timeout(timeout):
            # A failure to store its files after the run is this call's failure, recorded
            # (never left unrecorded, for a resume to run the code again).
            output = await run_code(ctx.ports.code, ctx.ports.payloads, str(code), str(lang))
        status = "failed" if output.get("stderr") and not output.get("stdout") else "completed"
    except TimeoutError:
        error = f"the code did not finish within {timeout:g} seconds"
        output, status = {"stderr": error}, "failed"
    except Exception as exc:  # the executor itself failed
        error = f"{type(exc).__name__}: {exc}"
        output, status = {"stderr": error}, "failed"
    call_id = call_id_of(call)
    await ctx.record(ToolCompleted(call_id=call_id, name=CODE_TOOL, output=json.dumps(output, ensure_ascii=False), status=status, error=error))
    observe(ctx.ports.observer.tool_call_ended, ctx.turn_id, call_id=call_id, name=CODE_TOOL, status=status, error=error)


@dataclass(frozen=True)
class Reinject:
    """The messages this round adds for the next model call, recorded, so a
    resume or a replay re-sends exactly the same."""

    async def run(self, ctx: TurnContext) -> Node | End:
        view, state = ctx.view, ctx.state
        round_items = for_model(view.round_output())
        # A Responses API upstream takes its own reasoning items back (Open WebUI drops them).
        reasoning = REASONING_RESPONSES if state.last_api == "responses" else None
        messages = convert_output_to_messages(round_items, raw=True, flatten_tool_images=True, reasoning_format=reasoning)
        previous: str | None = None
        items: list[JsonObject] = []
        if ctx.settings.responses_stateful and state.response_ids and not state.stateful_broken and state.last_api == "responses":
            previous = state.response_ids[-1]
            items = stateful_continuation_input(round_items)
        rewrite, numbered = _cited_context(ctx)
        # Committed with the model.requested that sends it.
        await ctx.record(
            ContextReinjected(
                iteration=state.iteration + 1,
                messages=messages,
                previous_response_id=previous,
                input_items=items,
                rewrite=rewrite,
                sources=numbered,
            ),
            durable=False,
        )
        return RequestModel()


def _cited_context(ctx: TurnContext) -> tuple[JsonObject | None, list[JsonObject]]:
    """When this round's tools returned citable sources: the context message
    rebuilt from its snapshot with the file sources (with their text) and every
    tool citation so far (markers only), ids kept from earlier rounds — the
    context is carried once however many rounds there are (Open WebUI appended
    it again each round)."""
    state = ctx.state
    cited = state.round_citations
    if not cited:
        return None, []
    rag = state.rag or snapshot(state.messages, ctx.settings.rag_system_context)
    index, message = rag.get("index"), rag.get("message")
    if not isinstance(index, int) or not isinstance(message, dict):  # (None: no message to rebuild)
        return None, []
    base = [message if i == index else m for i, m in enumerate(state.messages)]
    ids = rag.get("source_ids")
    before = {key: n for key, n in ids.items() if isinstance(n, int)} if isinstance(ids, dict) else {}
    # Files with their text; tool citations as markers only (their text is in
    # the tool results the model already has).
    markers = [{**c, "document": ["" for _ in _documents(c)]} for c in state.citations]
    messages, source_ids = apply_source_context(
        base,
        [*state.file_sources, *markers],
        template=ctx.settings.rag_template or DEFAULT_RAG_TEMPLATE,
        system_context=rag.get("role") == "system",
        source_ids=before,
        now=_now(ctx),
    )
    added = set(source_ids.values()) - set(before.values())
    numbered = [_source_json(s) for s in numbered_sources(state.citations, source_ids=source_ids) if s["id"] in added]
    snap: JsonObject = {k: rag[k] for k in ("role", "index", "message")}
    return {"index": index, "message": messages[index], "source_ids": {**source_ids}, "snapshot": snap}, numbered


def _documents(citation: JsonObject) -> list[JsonValue]:
    """A citation's documents (one empty one if it names none)."""
    documents = citation.get("document")
    return documents if isinstance(documents, list) and documents else [""]


def _source_json(source: NumberedSource) -> JsonObject:
    out: JsonObject = {"id": source["id"], "name": source["name"], "type": source["type"]}
    if "url" in source:
        out["url"] = source["url"]
    return out


def _now(ctx: TurnContext) -> datetime:
    """The turn's own time (recorded in turn.started): prompts render the same on replay."""
    return datetime.fromtimestamp(ctx.state.input.created_at, tz=UTC)


@dataclass(frozen=True)
class Finalize:
    reason: str | None = None

    async def run(self, ctx: TurnContext) -> Node | End:
        # Committed with what follows it (every path records durably after it:
        # the outlet, background.started or turn.completed): one commit less
        # per turn, and nothing acts on it before then; a crash in between
        # resumes at Decide, which finalizes again.
        await ctx.record(TurnFinalized(finish_reason=self.reason), durable=False)
        return Outlet()


@dataclass(frozen=True)
class Outlet:
    """The outlet filters rewrite the finished answer (for every client, plain
    OpenAI SDK calls included); a filter that raises is skipped and reported."""

    async def run(self, ctx: TurnContext) -> Node | End:
        filters = ctx.ports.filters
        if "outlet" not in filters.hooks():
            return Background()
        view, turn = ctx.view, ctx.state.input
        answer: JsonObject = {"role": "assistant", "content": view.content, "output": [*view.output]}
        body: JsonObject = {"model": turn.model, "chat_id": turn.chat_id, "id": turn.id, "messages": [*conversation(ctx.state), answer]}
        new_body, runs = await filters.outlet(body, {"id": turn.user_id, "name": turn.user_id})
        content, output = outlet_answer(new_body, answer)
        await ctx.record(
            OutletApplied(
                filters=[r.filter for r in runs],
                runs=[{"filter": r.filter, "changed": r.changed, **({"error": r.error} if r.error else {})} for r in runs],
                content=content,
                output=output,
            )
        )
        return Background()


def outlet_answer(body: JsonObject, before: JsonObject) -> tuple[str | None, list[JsonObject] | None]:
    """What the outlet made of the answer: new output items (content derived
    from them), or only new content (put into the answer's message item);
    (None, None) when nothing changed."""
    messages = body.get("messages")
    after = messages[-1] if isinstance(messages, list) and messages and isinstance(messages[-1], dict) else before
    output, was = after.get("output"), before["output"]
    if isinstance(output, list) and output != was:
        items = [i for i in output if isinstance(i, dict)]
        return message_text(items), items
    content = after.get("content")
    if isinstance(content, str) and content != before["content"]:
        return content, with_message_text([i for i in was if isinstance(i, dict)] if isinstance(was, list) else [], content)
    return None, None


def message_text(items: list[JsonObject]) -> str:
    return "".join(
        text
        for item in items
        if item.get("type") == "message"
        for part in _parts(item)
        if isinstance(part, dict) and part.get("type") == "output_text" and isinstance(text := part.get("text"), str)
    )


def _parts(item: JsonObject) -> list[JsonValue]:
    content = item.get("content")
    return content if isinstance(content, list) else []


def with_message_text(items: list[JsonObject], text: str) -> list[JsonObject]:
    """``items`` with their answer text replaced by ``text`` (kept in the last
    message item; a message item is added if there was none)."""
    out = [dict(i) for i in items]
    last = max((n for n, i in enumerate(out) if i.get("type") == "message"), default=None)
    for n, item in enumerate(out):
        if item.get("type") == "message":
            parts = [p for p in _parts(item) if not (isinstance(p, dict) and p.get("type") == "output_text")]
            if n == last:
                parts.append({"type": "output_text", "text": text, "annotations": []})
            item["content"] = parts
    if last is None:
        out.append({"type": "message", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": text, "annotations": []}]})
    return out


def conversation(state: LoopState) -> list[JsonObject]:
    """The chat before this turn's answer, as its user sees it: user and
    assistant texts, without the system message, tool traffic or the retrieved
    context. This turn's rounds are left out: their text is in the answer
    (``view.content``), which the callers add."""
    rag = state.rag
    out: list[JsonObject] = []
    for i, message in enumerate(state.messages[: state.assembled_count]):
        if rag is not None and rag.get("index") == i and isinstance(before := rag.get("message"), dict):
            message = before
        if message.get("role") in ("user", "assistant") and message.get("content"):
            out.append({"role": message["role"], "content": message["content"]})
    return out


@dataclass(frozen=True)
class Background:
    """Title, tags and follow-ups from the task model, after the answer is final
    (clients already have it: the stream's [DONE] comes at ``background.started``).
    A task that fails is recorded and never fails the turn."""

    async def run(self, ctx: TurnContext) -> Node | End:
        state = ctx.state
        if state.background is None:
            tasks = background_tasks(state.input.request, state.chat_turns, ctx.view.finish_reason)
            if not tasks:
                return Complete()
            await ctx.record(BackgroundStarted(tasks=tasks))
        chat: list[JsonObject] = [*conversation(state), {"role": "assistant", "content": ctx.view.content}]
        for task in state.background_pending:
            kind: TaskKind = "title" if task == "title" else "tags" if task == "tags" else "follow_ups"
            prompt = str(task_request(kind, chat, now=_now(ctx))[0]["content"])
            try:
                reply = await ctx.ports.task_model.ask(task, prompt)
            except UpstreamError as exc:
                fallback = fallback_title(chat) if task == "title" else None
                await ctx.record(BackgroundResult(task=task, result=fallback, error=exc.message))
                continue
            result, error = parse_task(task, reply, chat)
            usage = reply.usage if isinstance(reply, TaskReply) else None
            await ctx.record(BackgroundResult(task=task, result=result, error=error, reply=str(reply), usage=usage))
        return Complete()


def parse_task(task: str, reply: str, chat: list[JsonObject]) -> tuple[JsonValue, str | None]:
    """The result of a task's reply, or why there is none (a title falls back
    to the first user message's text, as Open WebUI's does)."""
    parsed: str | list[str] | TaskFailure
    if task == "title":
        parsed = parse_title(reply)
        if isinstance(parsed, TaskFailure):
            return fallback_title(chat), parsed.reason
        return parsed, None
    parsed = parse_tags(reply) if task == "tags" else parse_follow_ups(reply)
    if isinstance(parsed, TaskFailure):
        return None, parsed.reason
    return [*parsed], None


def background_tasks(request: Mapping[str, JsonValue], chat_turns: int, finish_reason: str | None) -> list[str]:
    """What to run: the request's ``background_tasks``, else — for a turn of a
    named chat — title and tags on its first turn and follow-ups on every turn;
    nothing for a bare OpenAI-style call or a turn that ended waiting for the
    client's tools."""
    asked = request.get("background_tasks")
    if isinstance(asked, dict):
        return [t for t in BACKGROUND_TASKS if asked.get(t)]
    if not request.get("chat_id") or finish_reason == "tool_calls":
        return []
    return [t for t in BACKGROUND_TASKS if t == "follow_ups" or chat_turns == 0]


BACKGROUND_TASKS = ("title", "tags", "follow_ups")


@dataclass(frozen=True)
class Complete:
    async def run(self, ctx: TurnContext) -> Node | End:
        await ctx.record(TurnCompleted())
        return END
