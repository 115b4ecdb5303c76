"""The nodes of a turn: assemble → call the model → run tools → re-inject → … → finish.

Each node reads the folded view, does one step's work through the actor's ports
and records what happened; the actor picks the next node from the state the
log is in. That is also how a resumed turn continues: the node for the state its
log ends in runs, and skips whatever the log shows already done.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from typing import TYPE_CHECKING, Any

from engine.assembly import ModelProfile, assemble
from engine.chats import chat_turn_views, stored_history
from engine.convert import convert_output_to_messages, for_model, stateful_continuation_input
from engine.events import (
    AssemblyCompleted,
    AssemblyStep,
    EventData,
    ContextReinjected,
    IterationLimit,
    ModelCompleted,
    ModelFallback,
    ModelItem,
    ModelRequested,
    ModelWarning,
    ToolCompleted,
    ToolEvent,
    ToolsBatch,
    ToolStarted,
    TurnFinalized,
)
from engine.history import History
from engine.model_events import (
    Finished,
    ProviderItem,
    ReasoningDelta,
    StreamFailed,
    StreamWarning,
    TextDelta,
    ToolCall,
    UsageReport,
)
from engine.ports import UpstreamError
from engine.tools import (
    ArgumentError,
    ToolContext,
    ToolResult,
    citation_sources,
    execute_tool_call,
    filter_arguments,
    not_found_message,
    parse_arguments,
    timeout_result,
)
from engine.legacy_tools import build_selection_request, parse_selection, tool_source
from engine.unsupported import unsupported_step
from engine.upstream import ModelRequest

if TYPE_CHECKING:
    from engine.turn import TurnActor

log = logging.getLogger("turnlog.loop")

LIMIT_MESSAGE = "Tool-call limit reached ({n} iterations)."
CODE_TOOL = "code_interpreter"
CODE_MAX_RUNS = 5  # legacy code-interpreter blocks run per turn (Open WebUI's hard-coded retries)
INTERRUPTED_MESSAGE = (
    "Error: the tool `{name}` was interrupted (the service stopped while it ran) and is not "
    "safe to run twice; it was not run again."
)


# -- assembling ----------------------------------------------------------------


async def assemble_node(actor: TurnActor) -> list[EventData]:
    """The events assembly produced (its steps, then ``assembly.completed``): a
    live assembler computes them, verify's replays them. They are recorded with
    the first ``model.requested``, in one commit."""
    return list(await actor.assembler(actor))


async def live_assembly(actor: TurnActor) -> list[EventData]:
    """Assemble the upstream request from the request, the chat and the model's profile."""
    v = actor.view
    resolved = await actor.models.resolve(v.model or "")
    profile = ModelProfile(
        system=resolved.system if resolved else None,
        params=resolved.params if resolved else {},
    )
    history = History()
    if v.request.get("chat_id"):  # a chat the client names may have earlier turns
        views = await chat_turn_views(actor.store, v.chat_id or "", before=v.created_at)
        history = stored_history([w for w in views if w.id != v.id])
    assembled = assemble(v.request, history, profile)
    params = dict(assembled.params)
    messages = assembled.messages
    steps: list[EventData] = []
    if is_legacy(v.request) and actor.tool_handles and resolved is not None:
        # Legacy (prompt-based) tools: the task model picks tools before the
        # main call, they run now, their results become context (spec §5.5).
        step, messages = await _legacy_tools(actor, resolved, messages)
        steps.append(step)
    else:
        tools = [*(params.get("tools") or []), *(h.spec.openai_tool() for h in actor.tool_handles.values())]
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
    # client is told early in the stream (engine.unsupported).
    ignored = unsupported_step(v.request)
    if ignored is not None:
        steps.insert(0, ignored)
    return steps


def is_legacy(request: dict[str, Any]) -> bool:
    params = request.get("params")
    return isinstance(params, dict) and params.get("function_calling") == "default"


async def _legacy_tools(actor: TurnActor, resolved: Any, messages: list[dict[str, Any]]) -> tuple[AssemblyStep, list[dict[str, Any]]]:
    handles = actor.tool_handles
    specs = [h.spec.openai_tool()["function"] for h in handles.values()]
    request = ModelRequest(messages=build_selection_request(specs, messages), params={})
    reply: list[str] = []
    try:
        async for events in actor.model_client.stream(resolved, request, _call_id_factory(actor.view.id, -1)):
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
        ctx = ToolContext(user={"id": actor.view.user_id}, messages=list(messages), files=[], metadata={"turn_id": actor.view.id}, emit=None, call_id=f"legacy_{index}")
        result, error = await actor.tool_runner.run(name, args, handle, ctx, handle.spec.timeout or actor.config.tool_timeout)
        ran.append({"name": name, "arguments": args, "output": result.text, "status": result.status})
        if result.text:
            sources.append(tool_source(handle.spec.tool_id, name, args, result.text))
    step = AssemblyStep(step="legacy_tools", detail={"reply": "".join(reply), "calls": ran, "sources": sources})
    return step, with_tool_context(messages, sources)


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


# -- calling the model -------------------------------------------------------------


def _call_id_factory(turn_id: str, iteration: int) -> Any:
    """Ids for calls a provider left without one: deterministic per turn and round
    (they are recorded, so a replay never needs to regenerate them)."""
    counter = 0

    def make(prefix: str) -> str:
        nonlocal counter
        counter += 1
        digest = hashlib.sha256(f"{turn_id}:{iteration}:{counter}".encode()).hexdigest()[:24]
        return f"{prefix}_{digest}"

    return make


async def call_model_node(actor: TurnActor, *, resume: bool, preceding: list[EventData] | None = None) -> None:
    v = actor.view
    resolved = await actor.models.resolve(v.model or "")
    if resolved is None:
        if preceding:
            await actor.record_many(preceding)
        await actor.fail({"message": f"model {v.model!r} is not available", "type": "model_not_found"})
        return
    prefill = v.acc.content if resume and not v.round_closed else None
    # The iteration this request belongs to (a re-injection in ``preceding`` starts the next one).
    iteration = next((p.iteration for p in preceding or [] if isinstance(p, ContextReinjected)), v.iteration)
    requested = ModelRequested(iteration=iteration, prefill=prefill or None, resumed=resume, api=resolved.api)
    # Write-ahead: durable before the request goes out (with the assembly, if
    # any, in the same commit).
    await actor.record_many([*(preceding or []), requested])
    stateful = v.pending_stateful if (actor.config.responses_stateful and resolved.api == "responses") else None
    request = ModelRequest(
        messages=v.messages,
        params=v.params,
        prefill=prefill or None,
        previous_response_id=stateful[0] if stateful else None,
        input_items=stateful[1] if stateful else [],
    )
    try:
        done = await _consume(actor, resolved, request)
    except UpstreamError as exc:
        if exc.kind == "previous_response_not_found" and request.previous_response_id:
            # The anchor expired upstream: send the whole transcript instead.
            await actor.record(ModelFallback(reason=exc.message, previous_response_id=request.previous_response_id))
            full = ModelRequest(messages=v.messages, params=v.params, prefill=request.prefill)
            try:
                done = await _consume(actor, resolved, full)
            except UpstreamError as again:
                await actor.fail({"message": again.message, "type": again.kind, "status": again.status})
                return
        else:
            await actor.fail({"message": exc.message, "type": exc.kind, "status": exc.status})
            return
    if not done:
        return


async def _consume(actor: TurnActor, resolved: Any, request: ModelRequest) -> bool:
    """Fold one model response into the turn; False if the turn failed."""
    v = actor.view
    usage: dict[str, Any] | None = None
    ids = _call_id_factory(v.id, v.iteration)
    async for events in actor.model_client.stream(resolved, request, ids):
        for event in events:
            if isinstance(event, TextDelta):
                if event.text:
                    actor.chunk("text", event.text)
            elif isinstance(event, ReasoningDelta):
                if event.text:
                    actor.chunk("reasoning", event.text)
            elif isinstance(event, ToolCall):
                item = {
                    "type": "function_call",
                    "id": event.item_id or event.call_id,
                    "call_id": event.call_id,
                    "name": event.name,
                    "arguments": event.arguments,
                    "status": "completed",
                }
                await actor.record(ModelItem(item=item))
            elif isinstance(event, ProviderItem):
                await actor.record(ModelItem(item=event.item))
            elif isinstance(event, UsageReport):
                usage = event.usage
            elif isinstance(event, StreamWarning):
                raw = event.raw if isinstance(event.raw, str) or event.raw is None else json.dumps(event.raw)[:500]
                await actor.record(ModelWarning(message=event.message, raw=raw))
            elif isinstance(event, StreamFailed):
                await actor.fail({"message": event.message, "type": "upstream_failed", "code": event.code})
                return False
            elif isinstance(event, Finished):
                await actor.record(
                    ModelCompleted(
                        finish_reason=event.reason,
                        usage=event.usage or usage,
                        response_id=event.response_id,
                        status=event.status,
                    )
                )
                return True
        if actor.writes_behind():
            await actor.backpressure()
    await actor.fail({"message": "the model stream ended without finishing", "type": "upstream_truncated"})
    return False


# -- deciding after a response ------------------------------------------------------------


def iteration_limit(actor: TurnActor) -> int:
    params = actor.view.request.get("params") or {}
    value = params.get("max_tool_call_iterations") if isinstance(params, dict) else None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return actor.config.max_tool_call_iterations


async def after_model_node(actor: TurnActor) -> None:
    """The response is complete: run its tool calls, or finish."""
    v = actor.view
    calls = v.last_round_calls
    code = v.pending_code
    if code is not None and not calls and v.code_runs < CODE_MAX_RUNS:
        # Legacy mode: the model wrote a <code_interpreter> block. It is run
        # whatever its type attribute says (Q11: never re-prompt without running).
        arguments = json.dumps({"code": code.get("code", ""), "lang": code.get("lang") or "python"})
        batch = ToolsBatch(iteration=v.iteration + 1, calls=[{"call_id": code["id"], "name": CODE_TOOL, "arguments": arguments, "kind": "code"}])
        await run_tools_node(actor, batch)
        return
    if not calls:
        # Includes finish_reason "tool_calls" with an empty list: the loop ends
        # (Open WebUI looped forever on it).
        await actor.record(TurnFinalized(finish_reason=v.finish_reason if v.finish_reason != "tool_calls" else "stop"))
        return
    client_names = v.client_tool_names
    ours = [c for c in calls if c["name"] not in client_names or c["name"] in actor.tool_handles]
    client = [c for c in calls if c not in ours]
    limit = iteration_limit(actor)
    if ours and limit >= 0 and v.iteration >= limit:
        pending = [_call_ref(c) for c in ours]
        message = LIMIT_MESSAGE.format(n=limit)
        await actor.record(IterationLimit(limit=limit, pending_calls=pending, message=message))
        await actor.record(TurnFinalized(finish_reason="tool_calls" if client else "stop"))
        return
    batch = ToolsBatch(
        iteration=v.iteration + 1,
        calls=[_call_ref(c) for c in ours],
        client_calls=[_call_ref(c) for c in client],
    )
    await run_tools_node(actor, batch)


def _call_ref(item: dict[str, Any]) -> dict[str, Any]:
    return {"call_id": item["call_id"], "name": item["name"], "arguments": item.get("arguments", "")}


# -- running tools -------------------------------------------------------------


async def run_tools_node(actor: TurnActor, new_batch: ToolsBatch | None = None) -> None:
    """Run a batch: a new one (recorded here, with its write-ahead events, in
    one commit) or, on resume, the one the log shows in progress."""
    v = actor.view
    batch = new_batch.model_dump() if new_batch is not None else (v.batch or {})
    prepared: list[tuple[dict[str, Any], dict[str, Any], Any, int]] = []
    started: list[EventData] = [new_batch] if new_batch is not None else []
    for call in batch.get("calls", []):
        call_id, name = call["call_id"], call["name"]
        if call_id in v.batch_done:
            continue  # its result is on the log: never run it again
        attempt = 1
        if call_id in v.batch_started:
            previous = v.started_args[call_id]
            if not previous.get("idempotent"):
                started.append(_failed(call_id, name, INTERRUPTED_MESSAGE.format(name=name)))
                continue
            attempt = previous.get("attempt", 1) + 1
        if call.get("kind") == "code":
            prepared.append((call, json.loads(call["arguments"]), None, attempt))
            started.append(ToolStarted(call_id=call_id, name=name, arguments=call["arguments"], kind="code", attempt=attempt))
            continue
        handle = actor.tool_handles.get(name)
        parsed = parse_arguments(call.get("arguments"), name)
        if isinstance(parsed, ArgumentError):
            started.append(_failed(call_id, name, parsed.message))
            continue
        if handle is None:
            started.append(_failed(call_id, name, not_found_message(name)))
            continue
        args = filter_arguments(handle.spec, parsed)
        prepared.append((call, args, handle, attempt))
        started.append(
            ToolStarted(
                call_id=call_id,
                name=name,
                arguments=json.dumps(args, ensure_ascii=False),
                kind=handle.spec.kind,
                tool_id=handle.spec.tool_id,
                idempotent=handle.spec.idempotent,
                attempt=attempt,
            )
        )
    if started:
        await actor.record_many(started)  # write-ahead: durable before any tool runs
    if prepared:
        await asyncio.gather(
            *(
                _run_code(actor, call, args) if handle is None else _run_one(actor, call, args, handle)
                for call, args, handle, _ in prepared
            )
        )
    if batch.get("client_calls"):
        await actor.record(TurnFinalized(finish_reason="tool_calls"))
        return
    # The re-injection is committed with the next model.requested.
    await call_model_node(actor, resume=False, preceding=[_reinjection(actor)])


def _failed(call_id: str, name: str, text: str) -> ToolCompleted:
    return ToolCompleted(call_id=call_id, name=name, output=text, status="failed", error=text)


async def _run_one(actor: TurnActor, call: dict[str, Any], args: dict[str, Any], handle: Any) -> None:
    call_id, name = call["call_id"], call["name"]

    async def emit(event: dict[str, Any]) -> None:
        await actor.record(ToolEvent(call_id=call_id, event=await actor.externalize(event)))

    v = actor.view
    ctx = ToolContext(
        user={"id": v.user_id, "name": v.user_id},
        messages=list(v.messages),
        files=list(v.request.get("files") or []),
        metadata={"turn_id": v.id, "chat_id": v.chat_id, "call_id": call_id, "iteration": v.iteration},
        emit=emit,
        call_id=call_id,
    )
    timeout = handle.spec.timeout or actor.config.tool_timeout
    result, error = await actor.tool_runner.run(name, args, handle, ctx, timeout)
    sources = citation_sources(name, handle.spec.tool_id, result.text, params=args) if result.status == "completed" else []
    await actor.record(
        ToolCompleted(
            call_id=call_id,
            name=name,
            output=result.text,
            status=result.status,
            files=await actor.externalize(result.files),
            embeds=result.embeds,
            images=result.images,
            sources=sources,
            error=error,
        )
    )


async def _run_code(actor: TurnActor, call: dict[str, Any], args: dict[str, Any]) -> None:
    """Run a legacy code-interpreter block through the code executor port."""
    timeout = actor.config.tool_timeout
    try:
        async with asyncio.timeout(timeout):
            output = await actor.code_runner.run(args.get("code", ""), args.get("lang", "python"))
        status = "failed" if output.get("stderr") and not output.get("stdout") else "completed"
        error = None
    except TimeoutError:
        output = {"stderr": f"the code did not finish within {timeout:g} seconds"}
        status, error = "failed", output["stderr"]
    except Exception as exc:  # the executor itself failed
        output = {"stderr": f"{type(exc).__name__}: {exc}"}
        status, error = "failed", output["stderr"]
    await actor.record(
        ToolCompleted(call_id=call["call_id"], name=CODE_TOOL, output=json.dumps(output, ensure_ascii=False), status=status, error=error)
    )


class LiveToolRunner:
    """Runs a tool for real, with its timeout (``verify`` swaps in recorded results)."""

    async def run(
        self, name: str, args: dict[str, Any], handle: Any, ctx: ToolContext, timeout: float
    ) -> tuple[ToolResult, str | None]:
        try:
            async with asyncio.timeout(timeout):
                execution = await execute_tool_call(name, args, {name: handle}, ctx)
        except TimeoutError:
            result = timeout_result(name, timeout)
            return result, result.text
        return execution.result, execution.error


def _reinjection(actor: TurnActor) -> ContextReinjected:
    """The messages this round adds for the next model call (recorded, so a resume
    or a replay re-sends exactly the same)."""
    v = actor.view
    round_items = for_model(v.round_items_with_outputs())
    messages = convert_output_to_messages(round_items, raw=True, flatten_tool_images=True)
    prev_id = None
    items: list[dict[str, Any]] = []
    if actor.config.responses_stateful and v.response_ids and not v.stateful_broken and v.last_api == "responses":
        prev_id = v.response_ids[-1]
        items = stateful_continuation_input(round_items)
    return ContextReinjected(
        iteration=v.iteration + 1,
        messages=messages,
        previous_response_id=prev_id,
        input_items=items,
    )
