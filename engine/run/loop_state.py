"""The agent loop's working state: what the nodes need to decide the next step.

It is a fold of the same events as the public ``TurnView`` (the actor applies
each event to both, a resume folds both from the log), but it holds what no
client is shown: the upstream transcript, the batch in progress, the stateful
Responses anchor, the code-run count. Output items themselves (built from the
streamed text) live in the view, which this fold may read.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.events import (
    AssemblyCompleted,
    AssemblyStep,
    BackgroundResult,
    BackgroundStarted,
    ContextReinjected,
    D,
    Event,
    EventData,
    ModelCompleted,
    ModelFallback,
    ModelItem,
    ModelRequested,
    ToolApproval,
    ToolApprovalRequested,
    ToolCompleted,
    ToolsBatch,
    ToolStarted,
    TurnCancelled,
    TurnFailed,
    TurnFinalized,
    TurnForked,
    TurnResumed,
    TurnStarted,
    parse_data,
)
from engine.json_types import JsonObject
from engine.ports import TurnInput


class LoopState:
    def __init__(self) -> None:
        self.turn: TurnInput | None = None
        self.assembled = False
        self.messages: list[JsonObject] = []  # the upstream transcript so far
        self.assembled_count = 0  # how many of them the assembly made (the rest are this turn's rounds)
        self.params: JsonObject = {}
        self.iteration = 0
        self.model_open = False  # a model.requested without its model.completed
        self.last_api = "chat"
        self.finish_reason: str | None = None
        self.response_ids: list[str] = []
        # The round being streamed and the last closed one: (call_id, name, arguments).
        self.round_calls: list[JsonObject] = []
        self.last_round_calls: list[JsonObject] = []
        # The batch in progress (tools.batch .. context.reinjected).
        self.batch: ToolsBatch | None = None
        self.started: dict[str, ToolStarted] = {}  # call_id -> its tool.started
        self.done: set[str] = set()  # call ids with a recorded result
        self.code_runs = 0
        # Stateful Responses continuation: the anchor and the new items, or broken.
        self.pending_stateful: tuple[str, list[JsonObject]] | None = None
        self.stateful_broken = False
        self.chat_turns = 0  # earlier turns of the chat
        # The retrieved context: the sources that went into it (with their text),
        # the message it went into as it was before, and the citation ids so far.
        self.file_sources: list[JsonObject] = []
        self.attached_knowledge: list[str] = []  # the model's collections, for its knowledge tools
        self.offered_builtins: set[str] = set()  # turnlog's own tools the assembly offered the model
        self.rag: JsonObject | None = None
        # Citable sources tool results brought (all rounds; this round's).
        self.citations: list[JsonObject] = []
        self.round_citations: list[JsonObject] = []
        # Background tasks: started (None: not yet), and those with a result.
        self.background: list[str] | None = None
        self.background_done: set[str] = set()
        # A fork's tool outputs given in place of running those calls
        # (``turn.forked``), until each is recorded.
        self.substitutes: dict[str, str] = {}
        # Tool approval of the batch in progress: the calls asked (call_id -> the
        # request's data) and the decisions recorded (call_id -> the decision's data).
        self.asked: dict[str, ToolApprovalRequested] = {}
        self.decisions: dict[str, ToolApproval] = {}

    @property
    def undecided(self) -> list[str]:
        return [c for c in self.asked if c not in self.decisions]

    @property
    def background_pending(self) -> list[str]:
        return [t for t in self.background or [] if t not in self.background_done]

    @property
    def input(self) -> TurnInput:
        assert self.turn is not None, "turn.started is always the first event"
        return self.turn

    def apply(self, event: Event, data: EventData | None = None) -> None:
        """Fold one event (``data``: its ``parse_data``, when the caller has it)."""
        handler = _HANDLERS.get(event.type)
        if handler is not None:
            handler(self, event, data if data is not None else parse_data(event))

    # -- handlers: each takes the envelope (its turn id, its time) and its typed payload

    def _on_forked(self, event: Event, d: TurnForked) -> None:
        self.substitutes = dict(d.tool_results)

    def _on_started(self, event: Event, d: TurnStarted) -> None:
        self.turn = TurnInput(id=event.turn_id, chat_id=d.chat_id, user_id=d.user_id, model=run_model(d), request=d.request, created_at=event.at)

    def _on_assembly_step(self, event: Event, d: AssemblyStep) -> None:
        step, detail = d.step, d.detail
        if step == "tools":
            builtin = detail.get("builtin")
            self.offered_builtins = {name for name in builtin if isinstance(name, str)} if isinstance(builtin, list) else set()
        elif step == "files":
            sources, knowledge = detail.get("sources"), detail.get("attached_knowledge")
            self.file_sources = [s for s in sources if isinstance(s, dict)] if isinstance(sources, list) else []
            self.attached_knowledge = [k for k in knowledge if isinstance(k, str)] if isinstance(knowledge, list) else []

    def _on_assembled(self, event: Event, d: AssemblyCompleted) -> None:
        d = d
        self.assembled = True
        self.messages = list(d.messages)
        self.assembled_count = len(self.messages)
        self.params = d.params
        self.chat_turns = d.chat_turns
        self.rag = d.rag

    def _on_model_requested(self, event: Event, d: ModelRequested) -> None:
        self.iteration = d.iteration
        self.last_api = d.api
        self.model_open = True

    def _on_model_item(self, event: Event, d: ModelItem) -> None:
        item = d.item
        if item.get("type") == "function_call" and item.get("status") != "in_progress":  # not a call announced while it streams
            self.round_calls.append({"call_id": item["call_id"], "name": item["name"], "arguments": item.get("arguments", "")})

    def _on_model_completed(self, event: Event, d: ModelCompleted) -> None:
        d = d
        self.model_open = False
        self.finish_reason = d.finish_reason
        if d.response_id:
            self.response_ids.append(d.response_id)
        self.last_round_calls, self.round_calls = self.round_calls, []

    def _on_fallback(self, event: Event, d: ModelFallback) -> None:
        self.stateful_broken = True
        self.pending_stateful = None

    def _on_tools_batch(self, event: Event, d: ToolsBatch) -> None:
        self.round_citations = []
        self.batch = d
        self.started = {}
        self.done = set()
        self.asked = {}
        self.decisions = {}

    def _on_tool_started(self, event: Event, d: ToolStarted) -> None:
        self.started[d.call_id] = d

    def _on_tool_completed(self, event: Event, d: ToolCompleted) -> None:
        d = d
        self.citations.extend(d.sources)
        self.round_citations.extend(d.sources)
        self.done.add(d.call_id)
        if d.substituted:
            self.substitutes.pop(d.call_id, None)
        started = self.started.get(d.call_id)
        if started is not None and started.kind == "code":
            self.code_runs += 1

    def _on_approval_requested(self, event: Event, d: ToolApprovalRequested) -> None:
        self.asked[d.call_id] = d

    def _on_approval(self, event: Event, d: ToolApproval) -> None:
        self.decisions[d.call_id] = d

    def _on_reinjected(self, event: Event, d: ContextReinjected) -> None:
        d = d
        rewrite = d.rewrite
        if rewrite is not None:
            index, message, snapshot = rewrite.get("index"), rewrite.get("message"), rewrite.get("snapshot")
            if isinstance(index, int) and isinstance(message, dict):  # as Reinject records it
                self.messages[index] = message
            # The snapshot the context was rebuilt from, and the ids so far.
            self.rag = {**(self.rag or (snapshot if isinstance(snapshot, dict) else None) or {}), "source_ids": rewrite.get("source_ids") or {}}
        self.messages.extend(d.messages)
        self.iteration = d.iteration
        self.pending_stateful = (d.previous_response_id, d.input_items) if d.previous_response_id else None
        self.batch = None

    def _on_background_started(self, event: Event, d: BackgroundStarted) -> None:
        self.background = list(d.tasks)

    def _on_background_result(self, event: Event, d: BackgroundResult) -> None:
        self.background_done.add(d.task)

    def _on_finalized(self, event: Event, d: TurnFinalized) -> None:
        # A record without the field (never written so) keeps the last round's.
        if "finish_reason" in d.model_fields_set:
            self.finish_reason = d.finish_reason

    def _on_stopped(self, event: Event, d: TurnCancelled | TurnFailed) -> None:
        self.model_open = False

    def _on_resumed(self, event: Event, d: TurnResumed) -> None:
        if d.mode == "restart" and self.model_open:
            # The cut-off round is answered afresh: the calls it had streamed are superseded.
            self.round_calls = []


_HANDLERS: dict[str, Callable[[LoopState, Event, EventData], None]] = {}


def _on(cls: type[D], handler: Callable[[LoopState, Event, D], None]) -> None:
    def call(state: LoopState, event: Event, data: EventData) -> None:
        assert isinstance(data, cls)  # parse_data built it from cls.TYPE
        handler(state, event, data)

    _HANDLERS[cls.TYPE] = call


_on(TurnForked, LoopState._on_forked)
_on(TurnStarted, LoopState._on_started)
_on(AssemblyStep, LoopState._on_assembly_step)
_on(AssemblyCompleted, LoopState._on_assembled)
_on(ModelRequested, LoopState._on_model_requested)
_on(ModelItem, LoopState._on_model_item)
_on(ModelCompleted, LoopState._on_model_completed)
_on(ModelFallback, LoopState._on_fallback)
_on(ToolsBatch, LoopState._on_tools_batch)
_on(ToolStarted, LoopState._on_tool_started)
_on(ToolCompleted, LoopState._on_tool_completed)
_on(ContextReinjected, LoopState._on_reinjected)
_on(ToolApprovalRequested, LoopState._on_approval_requested)
_on(ToolApproval, LoopState._on_approval)
_on(TurnFinalized, LoopState._on_finalized)
_on(BackgroundStarted, LoopState._on_background_started)
_on(BackgroundResult, LoopState._on_background_result)
_on(TurnCancelled, LoopState._on_stopped)
_on(TurnFailed, LoopState._on_stopped)
_on(TurnResumed, LoopState._on_resumed)


def run_model(started: TurnStarted) -> str:
    """The model a turn calls: a preset's recorded base model (never resolved
    again), else the model it names. A fork that names another model leaves
    the preset behind."""
    preset = started.preset
    if isinstance(preset, dict) and preset.get("id") == started.model and preset.get("base_model"):
        return str(preset["base_model"])
    return started.model
