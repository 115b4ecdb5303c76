"""``verify``: re-run a turn's engine against its recorded side effects.

Replay folds events; verify goes further, as Temporal's determinism check does:
it runs the *engine* again (the same actor and nodes) with every side-effect
result taken from the log — the assembled context, each model response, each
tool result — and no network or tool run at all, then checks that the engine
appends the same events. External inputs (a cancel request, a crash and the
resume after it) are replayed at the point the log shows them.

Two things may legitimately differ and are normalized before comparing:
* delta batching (a group-commit window depends on timing): consecutive
  ``model.delta`` events of one kind are merged;
* the interleaving of concurrently running tools: within a run of ``tool.*``
  events, events are compared per call in order.
Timestamps, owners and fencing are not part of the comparison, nor a resume's
``from_seq`` (a seq counts batches; its ``from_pos`` is compared).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import NoReturn, TypedDict

from engine.events import (
    AssemblyCompleted,
    AssemblyStep,
    BackgroundResult,
    ContextReinjected,
    Event,
    EventData,
    IterationLimit,
    ModelCompleted,
    ModelDelta,
    ModelFallback,
    ModelItem,
    ModelRequested,
    ModelWarning,
    OutletApplied,
    ToolApprovalRequested,
    ToolCompleted,
    ToolEvent,
    ToolStarted,
    TurnCancelled,
    TurnCancelRequested,
    TurnFailed,
    TurnInterrupted,
    TurnResumed,
    TurnStarted,
    data_of,
    make_event,
)
from engine.fold.output_items import call_id_of
from engine.json_types import JsonObject, JsonValue
from engine.ports import (
    AssemblyError,
    EventStore,
    FilterRun,
    Filters,
    IdFactory,
    InlinePayloads,
    LiveEvent,
    LiveMessage,
    ModelRequest,
    ResolvedModel,
    ResumeMode,
    TaskReply,
    TurnInput,
    TurnRecord,
    UpstreamError,
)
from engine.protocols.model_events import (
    Finished,
    ModelEvent,
    ProviderItem,
    ReasoningDelta,
    StreamFailed,
    StreamWarning,
    TextDelta,
    ToolArgumentsDelta,
    ToolCall,
    ToolCallStarted,
)
from engine.run.actor import TurnActor
from engine.run.context import TurnPorts
from engine.run.failures import recorded_upstream_error
from engine.run.folded import Folded
from engine.run.live import InProcessBus
from engine.run.nodes import call_field
from engine.settings import EngineSettings
from engine.tools.calls import ToolContext, ToolHandle, ToolResult, ToolSpec

EXTERNAL = ("turn.cancel_requested", "turn.interrupted", "turn.resumed")
IGNORED_FIELDS = {
    "turn.resumed": ("owner", "from_seq"),
    "turn.interrupted": ("last_owner",),
    "turn.cancel_requested": ("by",),
    "model.completed": ("first_chunk_at",),  # a timestamp
}


class Normalized(TypedDict):
    """An event as verify compares it."""

    type: str
    data: JsonObject


@dataclass
class VerifyResult:
    ok: bool
    expected: list[Normalized]
    actual: list[Normalized]
    diff: list[str] = field(default_factory=list)
    note: str | None = None


# -- normalization ------------------------------------------------------------------


def normalize(events: list[Event]) -> list[Normalized]:
    out: list[Normalized] = []
    for event in events:
        data = dict(event.data)
        for name in IGNORED_FIELDS.get(event.type, ()):
            data.pop(name, None)
        if event.type == "turn.resumed":
            data.setdefault("mode", "continue")  # logs from before resume modes
        if event.type == "model.delta" and out and out[-1]["type"] == "model.delta" and _merged(out[-1]["data"], data):
            continue
        out.append({"type": event.type, "data": data})
    # Concurrent tools may interleave differently: order tool runs per call.
    result: list[Normalized] = []
    run: list[Normalized] = []
    for item in out:
        if item["type"] in ("tool.started", "tool.event", "tool.completed"):
            run.append(item)
            continue
        if run:
            result.extend(sorted(run, key=_call_id))
            run = []
        result.append(item)
    result.extend(sorted(run, key=_call_id))
    return result


def _merged(prev: JsonObject, data: JsonObject) -> bool:
    """Append a ``model.delta``'s chunks to the one before it if both are of one
    kind (and call); False if they are not."""
    if prev["kind"] != data["kind"] or prev.get("call_id") != data.get("call_id"):
        return False
    text, more, lens, added = prev["text"], data["text"], prev["lens"], data["lens"]
    if not (isinstance(text, str) and isinstance(more, str) and isinstance(lens, list) and isinstance(added, list)):
        return False  # not a delta window's shape: compared as it is
    prev["text"], prev["lens"] = text + more, lens + added
    return True


def _call_id(event: Normalized) -> str:
    return call_id_of(event["data"])


def _diff(expected: list[Normalized], actual: list[Normalized]) -> list[str]:
    lines = []
    for i in range(max(len(expected), len(actual))):
        a = expected[i] if i < len(expected) else None
        b = actual[i] if i < len(actual) else None
        if a != b:
            lines.append(f"#{i + 1}: recorded {json.dumps(a, sort_keys=True)[:400]}")
            lines.append(f"#{i + 1}: re-run   {json.dumps(b, sort_keys=True)[:400]}")
            if len(lines) >= 20:
                break
    return lines


# -- recorded side effects -------------------------------------------------------------


class _Script:
    """The recorded log, consumed by the re-run in order."""

    def __init__(self, events: list[Event]) -> None:
        self.events = events
        self.rounds = self._rounds(events)
        self.round_index = 0
        # Per call id, in log order: a log written before call ids were made
        # turn-unique can have one id in several rounds.
        self.tool_results: dict[str, list[Event]] = {}
        self.tool_events: dict[str, list[Event]] = {}
        for e in events:
            if e.type == "tool.completed":
                self.tool_results.setdefault(data_of(e, ToolCompleted).call_id, []).append(e)
            elif e.type == "tool.event":
                self.tool_events.setdefault(data_of(e, ToolEvent).call_id, []).append(e)
        self.fallbacks = [data_of(e, ModelFallback).reason for e in events if e.type == "model.fallback"]
        self.on_external: Callable[[Event], None] = lambda _e: None

    @staticmethod
    def _rounds(events: list[Event]) -> list[list[Event]]:
        """The events following each model request (one list per request attempt)."""
        rounds: list[list[Event]] = []
        current: list[Event] | None = None
        for event in events:
            if event.type in ("model.requested", "model.fallback"):
                current = []
                rounds.append(current)
                continue
            if current is None:
                continue
            current.append(event)
            if event.type in ("model.completed", "turn.failed", "turn.cancelled", "turn.interrupted"):
                current = None
        return rounds


def _recorded_chunks(delta: ModelDelta) -> list[ModelEvent]:
    """A ``model.delta`` window's chunks as the model events that made them."""
    text, offset = delta.text, 0
    window: list[ModelEvent] = []
    for n in delta.lens:
        chunk = text[offset : offset + n]
        offset += n
        if delta.kind == "tool_arguments":
            window.append(ToolArgumentsDelta(delta.call_id or "", chunk))
        else:
            window.append(TextDelta(chunk) if delta.kind == "text" else ReasoningDelta(chunk))
    return window


class RecordedModelClient:
    """Answers each model request with the recorded response of that request."""

    def __init__(self, script: _Script) -> None:
        self.script = script

    async def stream(
        self, resolved: ResolvedModel, request: ModelRequest, id_factory: IdFactory, *, runs: bool = False
    ) -> AsyncGenerator[list[ModelEvent], None]:
        """One recorded event's worth of model events per batch (a ``model.delta``
        window's chunks together, as a read would have carried them)."""
        script = self.script
        recorded = script.rounds[script.round_index] if script.round_index < len(script.rounds) else []
        script.round_index += 1
        usage = None
        for event in recorded:
            t = event.type
            if t == "model.delta":
                delta = data_of(event, ModelDelta)
                if window := _recorded_chunks(delta):
                    yield window
            elif t == "model.item":
                item = data_of(event, ModelItem).item
                if item.get("type") == "function_call" and item.get("status") == "in_progress":
                    yield [ToolCallStarted(call_field(item, "call_id"), call_field(item, "name"), _text(item.get("id")))]
                elif item.get("type") == "function_call":
                    call_id, name, arguments = call_field(item, "call_id"), call_field(item, "name"), call_field(item, "arguments")
                    yield [ToolCall(call_id, name, arguments, _text(item.get("id")), _text(item.get("provider_call_id")))]
                else:
                    yield [ProviderItem(item)]
            elif t == "model.warning":
                warning = data_of(event, ModelWarning)
                yield [StreamWarning(warning.message, warning.raw)]
            elif t == "model.fallback":
                return
            elif t == "model.completed":
                d = data_of(event, ModelCompleted)
                yield [Finished(d.finish_reason, d.response_id, d.usage or usage, d.status)]
                return
            elif t == "turn.failed":
                error = data_of(event, TurnFailed).error
                if error.get("type") == "upstream_failed":
                    yield [StreamFailed(str(error.get("message", "")), _text(error.get("code")))]
                    return
                if error.get("type") == "internal_error":
                    # A bug (a pipe that raised, say) ended the call: the actor records it the same way again.
                    raise _RecordedBug(str(error.get("message", "")).removeprefix("internal error: "))
                raise recorded_upstream_error(error)
            elif t in ("turn.cancel_requested", "turn.interrupted"):
                script.on_external(event)
                await asyncio.Event().wait()  # the actor is stopped from outside
        if not recorded:
            # The log shows this request refused, then a fallback to the full transcript.
            reason = script.fallbacks.pop(0) if script.fallbacks else "previous response not found"
            raise UpstreamError(reason, "previous_response_not_found", 400)


def _text(value: JsonValue) -> str | None:
    """An optional string field of a recorded item or error (an id, a code)."""
    return value if isinstance(value, str) else None


class RecordedToolRunner:
    """Returns each call's recorded result (re-emitting its recorded tool events).

    Concurrent calls of a batch answer in the order the log shows they
    completed: a call returns only once the calls that completed before it in
    its batch are committed again (``committed`` is told by verify's bus). The
    order of completions decides the order of the output items and of the
    re-injected messages, so a re-run in call order would not reproduce a log
    where a later call finished first.
    """

    def __init__(self, script: _Script) -> None:
        self.script = script
        self._stopped: set[str] = set()
        self._before = self._completed_before(script.events)
        self._committed: set[str] = set()
        self._runs: dict[str, int] = {}  # call id -> times run
        self._returned: dict[str, int] = {}  # call id -> recorded results returned
        self._waiting: list[tuple[str, asyncio.Future[None]]] = []

    @staticmethod
    def _completed_before(events: list[Event]) -> dict[str, list[str]]:
        """Per call, the calls of its batch whose results the log has before its."""
        before: dict[str, list[str]] = {}
        batch: list[str] = []
        for event in events:
            if event.type in ("tools.batch", "turn.resumed"):
                batch = []
            elif event.type == "tool.completed":
                call_id = data_of(event, ToolCompleted).call_id
                before[call_id] = list(batch)
                batch.append(call_id)
        return before

    def committed(self, event: Event) -> None:
        """An event of the re-run is durable (called from verify's bus)."""
        if event.type != "tool.completed":
            return
        self._committed.add(data_of(event, ToolCompleted).call_id)
        for call_id, future in list(self._waiting):
            if self._ready(call_id):
                self._waiting.remove((call_id, future))
                if not future.done():
                    future.set_result(None)

    def _ready(self, call_id: str) -> bool:
        return all(p in self._committed for p in self._before.get(call_id, ()))

    async def _in_turn(self, call_id: str) -> None:
        if not self._ready(call_id):
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append((call_id, future))
            await future

    async def run(self, name: str, args: JsonObject, handle: ToolHandle, ctx: ToolContext, timeout: float) -> tuple[ToolResult, str | None]:
        call_id = ctx.call_id or ""
        # The first result of this id not yet returned, and the tool events
        # logged since the one before it.
        done = self._returned.get(call_id, 0)
        results = self.script.tool_results.get(call_id, [])
        recorded = results[done] if done < len(results) else None
        after = results[done - 1].seq if done else 0
        for emitted in self.script.tool_events.get(call_id, []):
            if ctx.emit is not None and after < emitted.seq and (recorded is None or emitted.seq < recorded.seq):
                await ctx.emit(data_of(emitted, ToolEvent).event)
        started = self._started_seq(call_id, self._runs.get(call_id, 0))
        self._runs[call_id] = self._runs.get(call_id, 0) + 1
        stop = next(
            (
                e
                for e in self.script.events
                if e.type in ("turn.cancel_requested", "turn.interrupted") and e.seq > started and (recorded is None or e.seq < recorded.seq)
            ),
            None,
        )
        if stop is not None and call_id not in self._stopped:
            # The log shows a cancel or a crash while this tool ran.
            self._stopped.add(call_id)
            self.script.on_external(stop)
            await asyncio.Event().wait()
        while recorded is None:  # the log ends while this tool ran: it never answers
            await asyncio.Event().wait()
        await self._in_turn(call_id)
        self._returned[call_id] = done + 1
        d = data_of(recorded, ToolCompleted)
        return ToolResult(d.output, d.files, d.embeds, d.images, d.status), d.error

    def _started_seq(self, call_id: str | None, run: int) -> int:
        """The seq of the ``run``-th start of the call (the last one when the log has fewer)."""
        starts = [e.seq for e in self.script.events if e.type == "tool.started" and data_of(e, ToolStarted).call_id == call_id]
        return starts[min(run, len(starts) - 1)] if starts else 0


class RecordedCodeRunner:
    """Legacy code blocks: their recorded outputs, in order."""

    def __init__(self, events: list[Event]) -> None:
        completed = [data_of(e, ToolCompleted) for e in events if e.type == "tool.completed"]
        # Each the JSON of the output object that run then (engine.run.nodes._run_code).
        self.outputs: list[JsonObject] = [json.loads(d.output or "{}") for d in completed if d.name == "code_interpreter"]

    async def run(self, code: str, lang: str) -> JsonObject:
        if not self.outputs:
            await asyncio.Event().wait()
        return self.outputs.pop(0)


class _CommitBus(InProcessBus):
    """The re-run's live bus, which also tells ``on_commit`` of each committed event."""

    def __init__(self, on_commit: Callable[[Event], None]) -> None:
        super().__init__()
        self._on_commit = on_commit

    def publish(self, turn_id: str, message: LiveMessage) -> None:
        super().publish(turn_id, message)
        if isinstance(message, LiveEvent):
            self._on_commit(message.event)


class _RecordedAssembler:
    """The assembly the log shows: its steps, then ``assembly.completed``."""

    def __init__(self, events: list[Event]) -> None:
        self.events = events

    async def assemble(self, turn: TurnInput) -> AsyncIterator[EventData]:
        for event in self.events:
            if event.type == "assembly.step":
                yield data_of(event, AssemblyStep)
            elif event.type == "assembly.completed":
                yield data_of(event, AssemblyCompleted)
                return
        failed = next((e for e in self.events if e.type == "turn.failed"), None)
        if failed is not None:
            # The log shows assembly itself failing (an inlet filter raised).
            error = data_of(failed, TurnFailed).error
            raise AssemblyError(str(error.get("message", "")), str(error.get("type", "")), [])


class _RecordedFilters:
    """What the filters did, from the log: the outlet's version of the answer.
    (The inlet's result is in the recorded assembly; stream filters changed the
    deltas before they were recorded, and their failures are recorded warnings.)"""

    def __init__(self, events: list[Event]) -> None:
        self._outlet = next((data_of(e, OutletApplied) for e in events if e.type == "outlet.applied"), None)

    def hooks(self) -> frozenset[str]:
        return frozenset({"outlet"}) if self._outlet is not None else frozenset()

    def optional_ids(self) -> frozenset[str]:
        return frozenset()

    def for_turn(self, filter_ids: Iterable[str]) -> Filters:
        return self  # the recorded outlet is the turn's own already

    async def inlet(self, body: JsonObject, user: JsonObject) -> tuple[JsonObject, list[FilterRun]]:
        return body, []

    def stream(self, event: JsonObject) -> tuple[JsonObject, list[FilterRun]]:
        return event, []

    async def outlet(self, body: JsonObject, user: JsonObject) -> tuple[JsonObject, list[FilterRun]]:
        recorded = self._outlet or OutletApplied()
        runs = [FilterRun(str(r["filter"]), r.get("changed") is True, _text(r.get("error"))) for r in recorded.runs]
        if recorded.output is None:
            return body, runs
        answer: JsonObject = {"role": "assistant", "content": recorded.content, "output": [*recorded.output]}
        messages = body["messages"]
        before = messages[:-1] if isinstance(messages, list) else []  # (Outlet sent a list)
        return {**body, "messages": [*before, answer]}, runs


class _RecordedBug(Exception):
    """A recorded ``internal_error``, raised again where it happened."""


class _RecordedTaskModel:
    """Each background task's recorded reply (or its recorded failure)."""

    def __init__(self, events: list[Event]) -> None:
        results = [data_of(e, BackgroundResult) for e in events if e.type == "background.result"]
        self._results = {d.task: d for d in results}

    async def ask(self, task: str, prompt: str) -> str:
        recorded = self._results.get(task)
        if recorded is None:
            await asyncio.Event().wait()  # the log ends while this task ran
            raise AssertionError("unreachable")
        if recorded.reply is None:
            raise UpstreamError(recorded.error or "", "upstream_error")
        return TaskReply(recorded.reply, recorded.usage)


class _RecordedHandle:
    def __init__(self, spec: ToolSpec) -> None:
        self.spec = spec

    async def __call__(self, args: JsonObject, ctx: ToolContext) -> NoReturn:  # never called: the runner answers
        raise RuntimeError("verify never runs tools")


def _recorded_handles(events: list[Event]) -> dict[str, ToolHandle]:
    """Handles for the tools that had one live: their specs keep exactly the keys
    the live filtering kept, so filtering again gives the same arguments."""
    handles: dict[str, ToolHandle] = {}
    for event in events:
        if event.type != "tool.started":
            continue
        d = data_of(event, ToolStarted)
        known = handles[d.name].spec.parameters.get("properties") if d.name in handles else None
        props: JsonObject = dict(known) if isinstance(known, dict) else {}
        props.update({k: {} for k in json.loads(d.arguments or "{}")})
        spec = ToolSpec(
            name=d.name,
            description="",
            parameters={"type": "object", "properties": props},
            tool_id=d.tool_id or "",
            # A code block's call runs on the code runner, never through a handle.
            kind="server" if d.kind == "code" else d.kind,
            idempotent=d.idempotent,
        )
        handles[d.name] = _RecordedHandle(spec)
    for event in events:
        # A call asked for approval and rejected never started: its tool still
        # had a handle live (only a runnable call is asked).
        name = data_of(event, ToolApprovalRequested).name if event.type == "tool.approval_requested" else None
        if name is not None and name not in handles:
            empty = ToolSpec(name=name, description="", parameters={"type": "object", "properties": {}}, tool_id="", kind="server")
            handles[name] = _RecordedHandle(empty)
    return handles


class _RecordedModels:
    """Every model resolves, with no upstream, to the API the log shows its
    request used (in order: a fork's model may speak another API than the
    parent's model of the requests it copied), in the resume mode of the
    ``turn.resumed`` before it and with the resume params it was sent."""

    def __init__(self, events: list[Event]) -> None:
        self.resolved: list[ResolvedModel] = []
        mode: ResumeMode = "continue"
        for e in events:
            if e.type == "turn.resumed":
                mode = data_of(e, TurnResumed).mode
            elif e.type == "model.requested":
                requested = data_of(e, ModelRequested)
                params = requested.resume_params or {}
                self.resolved.append(ResolvedModel(provider=None, upstream_model="", api=requested.api, resume=mode, resume_params=params))
                mode = "continue"
        self.resolved = self.resolved or [ResolvedModel(provider=None, upstream_model="")]
        self.calls = 0

    async def resolve(self, model: str) -> ResolvedModel | None:
        recorded = self.resolved[min(self.calls, len(self.resolved) - 1)]
        self.calls += 1
        return replace(recorded, upstream_model=model)

    async def list_models(self) -> list[JsonObject]:
        return []


# -- the re-run ------------------------------------------------------------------------

#: What reaches a turn waiting for approval from outside: the decisions, a
#: cancel, a crash of the process that recorded the last decision.
WAIT_INPUTS = ("tool.approval", "turn.cancel_requested", "turn.cancelled", "turn.interrupted")


async def _after_wait(scratch: EventStore, events: list[Event], turn_id: str) -> bool | None:
    """After the re-run's actor ended: if the turn waits for approval, copy the
    recorded outside inputs that follow into the re-run's log and say how the
    turn went on (True: resumed after a crash, False: started again by the last
    decision); None when there is nothing to go on with."""
    current = Folded.of(turn_id, await scratch.read(turn_id))
    if current.view.terminal or current.view.state != "awaiting_approval":
        return None
    at = current.view.last_seq
    copied = False
    token = await scratch.claim_turn(turn_id, "verify", lease_seconds=3600) or 0
    while at < len(events) and events[at].type in WAIT_INPUTS:
        await scratch.append([events[at]], fencing=token)
        current.apply(events[at])
        at += 1
        copied = True
    if not copied or current.view.terminal:
        return None
    return at < len(events) and events[at].type == "turn.resumed"


async def verify_turn(events: list[Event], scratch: EventStore) -> VerifyResult:
    """Re-run the turn of ``events`` on the scratch store and compare the logs.

    ``scratch`` must be an empty-enough store (turn ids are unique, so one
    scratch store can verify many turns).
    """
    # A fork's log starts with turn.forked and its copy of turn.started: both
    # are given (what the re-run starts from), the rest is re-run.
    head = 2 if events and events[0].type == "turn.forked" else 1
    if len(events) < head or events[head - 1].type != "turn.started":
        return VerifyResult(False, [], [], ["the log does not start with turn.started (or turn.forked, then turn.started)"])
    for want, event in enumerate(events, 1):
        if event.seq != want:  # a re-run would wait forever for what is missing
            return VerifyResult(False, [], [], [f"the log's seqs are not 1..{len(events)}: seq {want} expected, seq {event.seq} found"])
    turn_id = events[0].turn_id
    script = _Script(events)
    started_event = events[head - 1]
    started = data_of(started_event, TurnStarted)
    reinjected = [data_of(e, ContextReinjected) for e in events if e.type == "context.reinjected"]
    stateful = any(d.previous_response_id for d in reinjected) or any(e.type == "model.fallback" for e in events)
    limit = max([data_of(e, IterationLimit).limit for e in events if e.type == "turn.iteration_limit"] or [256])
    settings = EngineSettings(
        lease_seconds=3600,
        flush_interval=3600,
        flush_max_chunks=1 << 30,
        flush_max_chars=1 << 62,
        max_tool_call_iterations=limit,
        responses_stateful=stateful,
        # The calls the log shows asked for approval were asked: by the request or
        # by the tool's configuration then, which the re-run cannot read.
        approval_tools=frozenset(data_of(e, ToolApprovalRequested).name for e in events if e.type == "tool.approval_requested"),
    )
    record = TurnRecord(
        id=turn_id,
        chat_id=started.chat_id,
        user_id=started.user_id,
        model=started.model,
        status="running",
        created_at=started_event.at,
        updated_at=started_event.at,
        owner="verify",
    )
    fencing = await scratch.start_turn(record, events[:head], lease_seconds=3600)
    tool_runner = RecordedToolRunner(script)
    bus = _CommitBus(tool_runner.committed)
    ports = TurnPorts(
        models=_RecordedModels(events),
        model_client=RecordedModelClient(script),
        assembler=_RecordedAssembler(events),
        tools=_recorded_handles(events),
        tool_runner=tool_runner,
        code=RecordedCodeRunner(events),
        payloads=InlinePayloads(),
        filters=_RecordedFilters(events),
        task_model=_RecordedTaskModel(events),
    )

    def make_actor(folded: Folded, token: int) -> TurnActor:
        return TurnActor(view=folded.view, state=folded.state, fencing=token, store=scratch, bus=bus, ports=ports, settings=settings, owner="verify")

    actor = make_actor(Folded.of(turn_id, events[:head]), fencing)
    external: asyncio.Queue[Event] = asyncio.Queue()
    script.on_external = external.put_nowait
    actor.start()
    while True:
        done_task: asyncio.Future[None] = asyncio.ensure_future(asyncio.shield(actor.done))
        ext_task: asyncio.Future[Event] = asyncio.ensure_future(external.get())
        finished, _ = await asyncio.wait((done_task, ext_task), return_when=asyncio.FIRST_COMPLETED)
        if done_task in finished:
            ext_task.cancel()
            # The actor stopped at an approval: feed it what the log shows came
            # from outside while nobody ran the turn, then start the turn again.
            resumed = await _after_wait(scratch, events, turn_id)
            if resumed is None:
                break
            token = await scratch.claim_turn(turn_id, "verify", lease_seconds=3600) or fencing
            actor = make_actor(Folded.of(turn_id, await scratch.read(turn_id)), token)
            actor.start(resume=resumed)
            continue
        done_task.cancel()
        event = ext_task.result()
        if event.type == "turn.cancel_requested":
            await actor.cancel(data_of(event, TurnCancelRequested).by)
            break
        # A crash: stop the actor as the dead process stopped (its open window is
        # durable in the log, so it is kept), then do what the log shows came next.
        await actor.halt()
        current = Folded.of(turn_id, await scratch.read(turn_id))
        token = await scratch.claim_turn(turn_id, "verify", lease_seconds=3600) or fencing
        follow_up = [e for e in events if e.seq > event.seq and e.type in ("turn.resumed", "turn.cancel_requested")]
        next_events: list[EventData] = [TurnInterrupted(last_owner="verify")]
        if follow_up and follow_up[0].type == "turn.cancel_requested":
            next_events += [TurnCancelRequested(), TurnCancelled()]
        for data in next_events:
            appended = make_event(turn_id, current.view.last_seq + 1, data)
            await scratch.append([appended], fencing=token)
            current.apply(appended)
        if not follow_up or follow_up[0].type != "turn.resumed":
            break
        actor = make_actor(current, token)
        actor.start(resume=True)
    actual_events = await scratch.read(turn_id)
    expected = normalize(events)
    actual = normalize(actual_events)
    diff = _diff(expected, actual)
    return VerifyResult(not diff, expected, actual, diff)
