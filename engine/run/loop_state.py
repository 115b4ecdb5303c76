"""The agent loop's working state: what the nodes need to decide the next step.

It is a fold of the same events as the public ``TurnView`` (the actor applies
each event to both, a resume folds both from the log), but it holds what no
client is shown: the upstream transcript, the batch in progress, the stateful
Responses anchor, the code-run count. Output items themselves (built from the
streamed text) live in the view, which this fold may read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.events import Event
from engine.ports import TurnInput


class LoopState:
    def __init__(self) -> None:
        self.turn: TurnInput | None = None
        self.assembled = False
        self.messages: list[dict[str, Any]] = []  # the upstream transcript so far
        self.assembled_count = 0  # how many of them the assembly made (the rest are this turn's rounds)
        self.params: dict[str, Any] = {}
        self.iteration = 0
        self.model_open = False  # a model.requested without its model.completed
        self.last_api = "chat"
        self.finish_reason: str | None = None
        self.response_ids: list[str] = []
        # The round being streamed and the last closed one: (call_id, name, arguments).
        self.round_calls: list[dict[str, Any]] = []
        self.last_round_calls: list[dict[str, Any]] = []
        # The batch in progress (tools.batch .. context.reinjected).
        self.batch: dict[str, Any] | None = None
        self.started: dict[str, dict[str, Any]] = {}  # call_id -> its tool.started data
        self.done: set[str] = set()  # call ids with a recorded result
        self.code_runs = 0
        # Stateful Responses continuation: the anchor and the new items, or broken.
        self.pending_stateful: tuple[str, list[dict[str, Any]]] | None = None
        self.stateful_broken = False
        self.chat_turns = 0  # earlier turns of the chat
        # The retrieved context: the sources that went into it (with their text),
        # the message it went into as it was before, and the citation ids so far.
        self.file_sources: list[dict[str, Any]] = []
        self.attached_knowledge: list[str] = []  # the model's collections, for its knowledge tools
        self.offered_builtins: set[str] = set()  # turnlog's own tools the assembly offered the model
        self.rag: dict[str, Any] | None = None
        # Citable sources tool results brought (all rounds; this round's).
        self.citations: list[dict[str, Any]] = []
        self.round_citations: list[dict[str, Any]] = []
        # Background tasks: started (None: not yet), and those with a result.
        self.background: list[str] | None = None
        self.background_done: set[str] = set()
        # A fork's tool outputs given in place of running those calls
        # (``turn.forked``), until each is recorded.
        self.substitutes: dict[str, str] = {}
        # Tool approval of the batch in progress: the calls asked (call_id -> the
        # request's data) and the decisions recorded (call_id -> the decision's data).
        self.asked: dict[str, dict[str, Any]] = {}
        self.decisions: dict[str, dict[str, Any]] = {}

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

    def apply(self, event: Event) -> None:
        handler = _HANDLERS.get(event.type)
        if handler is not None:
            handler(self, event)

    # -- handlers -----------------------------------------------------------------

    def _on_forked(self, event: Event) -> None:
        self.substitutes = dict(event.data.get("tool_results") or {})

    def _on_started(self, event: Event) -> None:
        d = event.data
        self.turn = TurnInput(id=event.turn_id, chat_id=d["chat_id"], user_id=d["user_id"], model=run_model(d), request=d["request"], created_at=event.at)

    def _on_assembly_step(self, event: Event) -> None:
        step, detail = event.data.get("step"), event.data.get("detail", {})
        if step == "tools":
            self.offered_builtins = set(detail.get("builtin") or [])
        elif step == "files":
            self.file_sources = list(detail.get("sources") or [])
            self.attached_knowledge = list(detail.get("attached_knowledge") or [])

    def _on_assembled(self, event: Event) -> None:
        self.assembled = True
        self.messages = list(event.data["messages"])
        self.assembled_count = len(self.messages)
        self.params = event.data.get("params", {})
        self.chat_turns = event.data.get("chat_turns", 0)
        self.rag = event.data.get("rag")

    def _on_model_requested(self, event: Event) -> None:
        self.iteration = event.data.get("iteration", 0)
        self.last_api = event.data.get("api", "chat")
        self.model_open = True

    def _on_model_item(self, event: Event) -> None:
        item = event.data["item"]
        if item.get("type") == "function_call":
            self.round_calls.append({"call_id": item["call_id"], "name": item["name"], "arguments": item.get("arguments", "")})

    def _on_model_completed(self, event: Event) -> None:
        self.model_open = False
        self.finish_reason = event.data.get("finish_reason")
        if event.data.get("response_id"):
            self.response_ids.append(event.data["response_id"])
        self.last_round_calls, self.round_calls = self.round_calls, []

    def _on_fallback(self, event: Event) -> None:
        self.stateful_broken = True
        self.pending_stateful = None

    def _on_tools_batch(self, event: Event) -> None:
        self.round_citations = []
        self.batch = event.data
        self.started = {}
        self.done = set()
        self.asked = {}
        self.decisions = {}

    def _on_tool_started(self, event: Event) -> None:
        self.started[event.data["call_id"]] = event.data

    def _on_tool_completed(self, event: Event) -> None:
        sources = event.data.get("sources") or []
        self.citations.extend(sources)
        self.round_citations.extend(sources)
        call_id = event.data["call_id"]
        self.done.add(call_id)
        if event.data.get("substituted"):
            self.substitutes.pop(call_id, None)
        if self.started.get(call_id, {}).get("kind") == "code":
            self.code_runs += 1

    def _on_approval_requested(self, event: Event) -> None:
        self.asked[event.data["call_id"]] = event.data

    def _on_approval(self, event: Event) -> None:
        self.decisions[event.data["call_id"]] = event.data

    def _on_reinjected(self, event: Event) -> None:
        d = event.data
        rewrite = d.get("rewrite")
        if rewrite is not None:
            self.messages[rewrite["index"]] = rewrite["message"]
            # The snapshot the context was rebuilt from, and the ids so far.
            self.rag = {**(self.rag or rewrite.get("snapshot") or {}), "source_ids": rewrite.get("source_ids") or {}}
        self.messages.extend(d.get("messages", []))
        self.iteration = d.get("iteration", self.iteration)
        self.pending_stateful = (d["previous_response_id"], d.get("input_items", [])) if d.get("previous_response_id") else None
        self.batch = None

    def _on_background_started(self, event: Event) -> None:
        self.background = list(event.data.get("tasks") or [])

    def _on_background_result(self, event: Event) -> None:
        self.background_done.add(event.data["task"])

    def _on_finalized(self, event: Event) -> None:
        self.finish_reason = event.data.get("finish_reason", self.finish_reason)

    def _on_stopped(self, event: Event) -> None:
        self.model_open = False

    def _on_resumed(self, event: Event) -> None:
        if event.data.get("mode") == "restart" and self.model_open:
            # The cut-off round is answered afresh: the calls it had streamed are superseded.
            self.round_calls = []


_HANDLERS: dict[str, Callable[[LoopState, Event], None]] = {
    "turn.forked": LoopState._on_forked,
    "turn.started": LoopState._on_started,
    "assembly.step": LoopState._on_assembly_step,
    "assembly.completed": LoopState._on_assembled,
    "model.requested": LoopState._on_model_requested,
    "model.item": LoopState._on_model_item,
    "model.completed": LoopState._on_model_completed,
    "model.fallback": LoopState._on_fallback,
    "tools.batch": LoopState._on_tools_batch,
    "tool.started": LoopState._on_tool_started,
    "tool.completed": LoopState._on_tool_completed,
    "context.reinjected": LoopState._on_reinjected,
    "tool.approval_requested": LoopState._on_approval_requested,
    "tool.approval": LoopState._on_approval,
    "turn.finalized": LoopState._on_finalized,
    "background.started": LoopState._on_background_started,
    "background.result": LoopState._on_background_result,
    "turn.cancelled": LoopState._on_stopped,
    "turn.failed": LoopState._on_stopped,
    "turn.resumed": LoopState._on_resumed,
}


def run_model(started: dict[str, Any]) -> str:
    """The model a turn calls: a preset's recorded base model (never resolved
    again), else the model it names. A fork that names another model leaves
    the preset behind."""
    preset = started.get("preset")
    if isinstance(preset, dict) and preset.get("id") == started["model"] and preset.get("base_model"):
        return str(preset["base_model"])
    return str(started["model"])
