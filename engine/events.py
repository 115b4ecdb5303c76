"""Domain events: the only way a turn changes.

An event is an immutable envelope ``{turn_id, seq, type, at, data}``. ``data`` is
a plain dict on the envelope (cheap to fold, cheap to store) and each type has a
small pydantic model that builds and validates it. Every data model carries a
version ``v`` so that old logs stay readable: ``upcast`` is where a reader turns
an old version into the current shape.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar, Generic, Literal, NotRequired, TypedDict, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field

from engine.json_types import JsonObject, JsonObjectField, JsonValue


class Event(BaseModel):
    """One appended fact about one turn; ``(turn_id, seq)`` is unique."""

    model_config = ConfigDict(frozen=True)

    turn_id: str
    seq: int
    type: str
    at: float
    data: dict[str, Any]

    def public(self) -> JsonObject:
        """The shape clients see in a turn's events listing."""
        return {"seq": self.seq, "type": self.type, "at": self.at, "data": self.data}


class EventData(BaseModel):
    """Base of every event payload; ``TYPE`` names the event it builds."""

    model_config = ConfigDict(extra="allow")
    TYPE: ClassVar[str] = ""
    v: int = 1


# --- lifecycle -------------------------------------------------------------


class TurnForked(EventData):
    """The first event of a fork: a new turn that continues another turn's log.

    The events that follow, up to the live part, are the parent's events
    ``1..at-1`` copied into this turn (re-sequenced, stream positions
    re-based): the fork's log is complete on its own. From event ``at`` on,
    the fork runs live: with ``model`` (None: the parent's) and, for the calls
    of the batch recorded at ``at`` named in ``tool_results``, those outputs
    recorded in place of running the calls. ``tool_results`` also carries the
    substitutions of the parent (itself a fork) that the copied events hold,
    so that a re-run of this log substitutes them again.
    """

    TYPE: ClassVar[str] = "turn.forked"
    parent_turn_id: str
    at: int
    model: str | None = Field(default=None, exclude_if=lambda v: v is None)
    tool_results: dict[str, str] = Field(default_factory=dict, exclude_if=lambda v: not v)
    # As ``turn.started``'s: the hash of the key that made the fork.
    key_hash: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # What the copied events spent (``input_tokens``, ``output_tokens``,
    # ``tool_calls``): the parent's, which the fork's usage must not count again.
    copied: dict[str, int] = Field(default_factory=dict, exclude_if=lambda v: not v)


class TurnStarted(EventData):
    TYPE: ClassVar[str] = "turn.started"
    chat_id: str
    user_id: str
    model: str
    stream: bool = True
    # The client's request body without secrets (no auth header, no keys);
    # for a preset, the request it resolved to.
    request: JsonObjectField
    # ``model`` names a preset: what it resolved to when the turn started
    # (``{"id", "base_model", "system"?, "params"?, "tool_ids"?, "files"?,
    # "features"?, "filters"?}``, the system prompt rendered). The turn runs
    # on ``base_model``; nothing resolves the preset again. Left out otherwise.
    preset: JsonObjectField | None = Field(default=None, exclude_if=lambda v: v is None)
    # The sha256 (hex) of the API key that started the turn, never the key:
    # usage per key. Left out without one (auth off), as in older logs.
    key_hash: str | None = Field(default=None, exclude_if=lambda v: v is None)


class AssemblyStep(EventData):
    TYPE: ClassVar[str] = "assembly.step"
    step: str
    detail: dict[str, Any] = Field(default_factory=dict)


class AssemblyCompleted(EventData):
    """The assembled upstream request: the recorded result of context assembly."""

    TYPE: ClassVar[str] = "assembly.completed"
    messages: list[JsonObjectField]
    # Parameters for the upstream call (temperature, tools, ...), never credentials.
    params: JsonObjectField = Field(default_factory=dict)
    # How many leading messages came from the stored chat history.
    history_len: int = 0
    # The messages this turn adds to the chat (the new user message, tool results...).
    new_messages: list[JsonObjectField] = Field(default_factory=list)
    # The client sent the whole history (``"history": "client"``): ``new_messages``
    # are all of it and the chat's history restarts at this turn. Left out when
    # false, as ``turn_refs`` when empty, so logs written before they existed verify.
    history_reset: bool = Field(default=False, exclude_if=lambda v: not v)
    # ``{"index", "turn_id"}``: ``new_messages[index]`` is the client's copy of that
    # earlier turn's answer, which the history expands from that turn's log.
    turn_refs: list[JsonObjectField] = Field(default_factory=list, exclude_if=lambda v: not v)
    # How many turns the chat had before this one (titles and tags are for the first).
    chat_turns: int = Field(default=0, exclude_if=lambda v: not v)
    # The sources in the context, as clients see them: ``{"id": N, "name", "type", "url"?}``,
    # ``N`` being the ``[N]`` the model cites.
    sources: list[JsonObjectField] = Field(default_factory=list, exclude_if=lambda v: not v)
    # The context before sources went into it: ``{"role", "index", "message",
    # "source_ids"}`` — the loop rebuilds the message from it when tool results
    # add citations, so the context is carried once, never piled up.
    rag: JsonObjectField | None = Field(default=None, exclude_if=lambda v: v is None)
    # Legacy function calling with the code interpreter on and available: the
    # answer's <code_interpreter> blocks are run. Always set by the assembly;
    # None (left out) in logs written before it was recorded, whose fold then
    # goes by the request.
    code_interpreter: bool | None = Field(default=None, exclude_if=lambda v: v is None)
    # With ``code_interpreter``: an answer ends at its first code block's
    # ``</code_interpreter>`` (the block runs before the model goes on). Left
    # out (false) in logs written before reading stopped there, which fold as
    # they always did.
    code_cut: bool = Field(default=False, exclude_if=lambda v: not v)


class ModelRequested(EventData):
    """Write-ahead for the upstream call: durable before the request leaves.

    v2: version 1 also had ``provider``, always ``"openai"`` whatever the
    upstream was; ``api`` says which protocol was spoken.
    """

    TYPE: ClassVar[str] = "model.requested"
    v: int = 2
    iteration: int = 0
    api: Literal["chat", "responses", "ollama"] = "chat"
    # Only what differs from assembly: a resumed request carries the prefill,
    # and the upstream's resume params that went into its body with it.
    prefill: str | None = None
    resumed: bool = False
    resume_params: JsonObjectField | None = Field(default=None, exclude_if=lambda v: not v)


class ModelDelta(EventData):
    """A flush window of upstream text chunks, stored compactly.

    ``text`` is the concatenation of ``n`` raw chunks; ``lens`` gives each chunk's
    length so that a reader can cut the text back into chunks and give each its
    own stream position (``pos`` is the first chunk's). Live subscribers already
    saw these chunks one by one; this event is the durable record.

    ``kind: "tool_arguments"``: fragments of the arguments of the function call
    ``call_id`` (announced by an ``in_progress`` ``model.item``), recorded so a
    replay shows them where a live client saw them.
    """

    TYPE: ClassVar[str] = "model.delta"
    kind: Literal["text", "reasoning", "tool_arguments"] = "text"
    pos: int
    text: str
    lens: list[int]
    call_id: str | None = Field(default=None, exclude_if=lambda v: v is None, description="the call whose arguments these are (`tool_arguments` only)")


class ModelItem(EventData):
    """An output item that did not arrive as text deltas (e.g. a function call)."""

    TYPE: ClassVar[str] = "model.item"
    item: JsonObjectField


class ModelCompleted(EventData):
    TYPE: ClassVar[str] = "model.completed"
    finish_reason: str | None = None
    usage: JsonObjectField | None = None
    response_id: str | None = None
    status: str | None = None  # Responses API: completed | incomplete
    # Left out when no answer chunk came, and in logs written before it was recorded.
    first_chunk_at: float | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="when the call's first answer chunk (text, reasoning or a tool call) arrived, on the clock of the "
        "events' `at`: the model's own time to first token is this minus the `model.requested` event's `at`",
    )


class ModelWarning(EventData):
    TYPE: ClassVar[str] = "model.warning"
    message: str
    raw: str | None = None


class ToolsBatch(EventData):
    """The model asked for tools: one batch, taken by one loop iteration.

    ``calls`` are the calls turnlog runs (server and direct tools);
    ``client_calls`` are the client's own (plain OpenAI ``tools``), returned to it.
    """

    TYPE: ClassVar[str] = "tools.batch"
    iteration: int
    calls: list[JsonObjectField] = Field(default_factory=list)
    client_calls: list[JsonObjectField] = Field(default_factory=list)


class ToolStarted(EventData):
    """Write-ahead for a tool run: durable before the tool is called."""

    TYPE: ClassVar[str] = "tool.started"
    call_id: str
    name: str
    arguments: str  # the JSON object the tool is called with (filtered)
    # ``code``: a legacy code block, run by the code runner, not a tool.
    kind: Literal["server", "direct", "builtin", "client", "code"] = "server"
    tool_id: str | None = None
    idempotent: bool = False
    attempt: int = 1


class ToolEvent(EventData):
    """Something a tool emitted through ``__event_emitter__`` (status, files, citations...)."""

    TYPE: ClassVar[str] = "tool.event"
    call_id: str
    event: JsonObjectField


class ToolCompleted(EventData):
    """A tool's result, as re-injected (a string or None), with what it produced."""

    TYPE: ClassVar[str] = "tool.completed"
    call_id: str
    name: str
    output: str | None
    status: Literal["completed", "failed"] = "completed"
    files: list[JsonObjectField] = Field(default_factory=list)
    embeds: list[str] = Field(default_factory=list)
    images: list[str] = Field(default_factory=list)
    sources: list[JsonObjectField] = Field(default_factory=list)
    error: str | None = None
    # The output was given when the turn was forked (``turn.forked``'s
    # ``tool_results``): recorded in place of running the call.
    substituted: bool = Field(default=False, exclude_if=lambda v: not v)


class ContextReinjected(EventData):
    """The messages added for the next model call (the recorded re-injection)."""

    TYPE: ClassVar[str] = "context.reinjected"
    iteration: int
    messages: list[JsonObjectField] = Field(default_factory=list)
    previous_response_id: str | None = None
    input_items: list[JsonObjectField] = Field(default_factory=list)
    # The message holding the sources, rebuilt from the pre-context snapshot with
    # the tool results' citations added: ``{"index", "message"}``.
    rewrite: dict[str, Any] | None = Field(default=None, exclude_if=lambda v: v is None)
    # Sources the tools of this round added, numbered after the earlier ones.
    sources: list[JsonObjectField] = Field(default_factory=list, exclude_if=lambda v: not v)


class IterationLimit(EventData):
    TYPE: ClassVar[str] = "turn.iteration_limit"
    limit: int
    pending_calls: list[JsonObjectField] = Field(default_factory=list)
    message: str = ""


class ModelFallback(EventData):
    """The upstream refused a stateful continuation; the full transcript was sent instead."""

    TYPE: ClassVar[str] = "model.fallback"
    reason: str
    previous_response_id: str | None = None


class TurnFinalized(EventData):
    TYPE: ClassVar[str] = "turn.finalized"
    finish_reason: str | None = None


class OutletApplied(EventData):
    """What the outlet filters made of the finished answer: the output items and
    the content derived from them (what the turn now shows)."""

    TYPE: ClassVar[str] = "outlet.applied"
    filters: list[str] = Field(default_factory=list)
    runs: list[JsonObjectField] = Field(default_factory=list)
    content: str | None = None
    output: list[JsonObjectField] | None = None


class BackgroundStarted(EventData):
    TYPE: ClassVar[str] = "background.started"
    tasks: list[str] = Field(default_factory=list)


class BackgroundResult(EventData):
    """A background task's outcome: the parsed ``result``, or why there is none;
    ``reply`` is the task model's raw answer (what a replay answers with)."""

    TYPE: ClassVar[str] = "background.result"
    task: str
    result: JsonValue = None
    error: str | None = None
    reply: str | None = None
    # The task model call's usage as its upstream reported it: the turn's
    # usage includes it. Left out when none (and in older logs).
    usage: JsonObjectField | None = Field(default=None, exclude_if=lambda v: v is None)


class TurnCompleted(EventData):
    TYPE: ClassVar[str] = "turn.completed"


class TurnCancelRequested(EventData):
    TYPE: ClassVar[str] = "turn.cancel_requested"
    by: str | None = None


class TurnCancelled(EventData):
    TYPE: ClassVar[str] = "turn.cancelled"
    reason: str = "cancelled by request"


class TurnFailed(EventData):
    TYPE: ClassVar[str] = "turn.failed"
    error: JsonObjectField


class TurnInterrupted(EventData):
    """Recorded by a supervisor that found no live owner for a running turn."""

    TYPE: ClassVar[str] = "turn.interrupted"
    reason: str = "owner lost"
    last_owner: str | None = None


class TurnResumed(EventData):
    """A new owner continues the turn from its last durable event.

    ``from_seq``/``from_pos`` are the log's end when the resume was recorded (a
    ``turn.interrupted`` record included: it takes the position after the durable
    output, which the old owner may also have handed out live). ``epoch`` moves
    stream positions past anything the old owner could have handed out; the
    event itself is the new epoch's first position. What a client must drop is
    derived by the fold (``projection.ResumePoint``, docs/reconnecting.md).

    ``mode`` is how the cut-off generation goes on: ``continue`` (the model
    continues the durable partial answer; what logs without the field did) or
    ``restart``: the open round's partial answer is superseded (it stays in the
    log, but the fold drops it from the answer) and the model answers afresh.
    """

    TYPE: ClassVar[str] = "turn.resumed"
    from_seq: int
    from_pos: int
    epoch: int
    owner: str | None = None
    mode: Literal["continue", "restart"] = "continue"


class ToolApprovalRequested(EventData):
    """A call waits for a person's decision before it runs (``tool_approval:
    "ask"``, or a tool configured so). Recorded with its batch, in one commit:
    the turn then holds no task until the decision is recorded."""

    TYPE: ClassVar[str] = "tool.approval_requested"
    call_id: str
    name: str
    arguments: str  # as the model gave them (the run filters them, after approval)


class ToolApproval(EventData):
    """A person's decision on a call: an input from outside the turn, recorded
    before the turn goes on, so a replay never asks again."""

    TYPE: ClassVar[str] = "tool.approval"
    call_id: str
    approve: bool
    reason: str | None = Field(default=None, exclude_if=lambda v: v is None)
    by: str | None = Field(default=None, exclude_if=lambda v: v is None)


class ToolsDecided(EventData):
    """Every asked call of the batch is decided: the batch runs (the approved
    calls; a rejected one gets its error result)."""

    TYPE: ClassVar[str] = "tools.decided"


EVENT_TYPES: dict[str, type[EventData]] = {
    cls.TYPE: cls
    for cls in (
        TurnForked,
        TurnStarted,
        AssemblyStep,
        AssemblyCompleted,
        ModelRequested,
        ModelDelta,
        ModelItem,
        ModelCompleted,
        ModelWarning,
        ToolsBatch,
        ToolStarted,
        ToolEvent,
        ToolCompleted,
        ContextReinjected,
        IterationLimit,
        ModelFallback,
        TurnFinalized,
        OutletApplied,
        BackgroundStarted,
        BackgroundResult,
        TurnCompleted,
        TurnCancelRequested,
        TurnCancelled,
        TurnFailed,
        TurnInterrupted,
        TurnResumed,
        ToolApprovalRequested,
        ToolApproval,
        ToolsDecided,
    )
}

TERMINAL_TYPES = frozenset({"turn.completed", "turn.cancelled", "turn.failed"})


def make_event(turn_id: str, seq: int, data: EventData, at: float | None = None) -> Event:
    """Wrap ``data`` (validated against its type when it was built) in an envelope.

    The envelope is constructed without a second validation: its fields are
    ours (an id, a seq, the payload's dump), and several are made at the start
    of every turn. ``turn_id`` and ``seq`` are checked here instead."""
    if type(turn_id) is not str or type(seq) is not int:
        raise TypeError(f"make_event: turn_id must be a str and seq an int, got {turn_id!r}, {seq!r}")
    return Event.model_construct(
        turn_id=turn_id,
        seq=seq,
        type=data.TYPE,
        at=time.time() if at is None else float(at),
        data=data.model_dump(mode="json", exclude_none=False),
    )


def delta_event(turn_id: str, seq: int, kind: str, pos: int, texts: list[str], call_id: str | None = None) -> Event:
    """``make_event`` of a ``ModelDelta``, built without validation.

    Sealed every flush window of every streaming turn, so it skips pydantic: the
    fields are produced here, by the actor, never by a client. A test holds it
    equal to ``make_event(..., ModelDelta(...))``.
    """
    data: JsonObject = {"v": 1, "kind": kind, "pos": pos, "text": "".join(texts), "lens": list(map(len, texts))}
    if call_id is not None:
        data["call_id"] = call_id
    # What ``Event.model_construct`` does for these five fields, without its
    # generic loop over the model's fields, which costs more than the rest
    # together (once per window).
    event = _new_event(Event)
    _set(event, "__dict__", {"turn_id": turn_id, "seq": seq, "type": ModelDelta.TYPE, "at": time.time(), "data": data})
    _set(event, "__pydantic_fields_set__", {"turn_id", "seq", "type", "at", "data"})
    _set(event, "__pydantic_extra__", None)
    _set(event, "__pydantic_private__", None)
    return event


_new_event = object.__new__
_set = object.__setattr__


def _model_requested_v1(data: JsonObject) -> JsonObject:
    out = {k: v for k, v in data.items() if k != "provider"}
    out["v"] = 2
    return out


# (event type, version) -> the function that turns that version into the next.
UPCASTERS: dict[tuple[str, int], Callable[[JsonObject], JsonObject]] = {
    ("model.requested", 1): _model_requested_v1,
}
CURRENT_VERSION: dict[str, int] = {cls.TYPE: cls.model_fields["v"].default for cls in EVENT_TYPES.values()}


def upcast(event: Event) -> Event:
    """Bring an event read from the log to the current data version.

    Every store's ``read`` passes its events through here, so nothing past the
    store sees an old shape. Cheap when there is nothing to do (one dict lookup
    per event): a replay folds thousands of deltas.
    """
    current = CURRENT_VERSION.get(event.type)
    version = event.data.get("v", 1)
    if current is None or version >= current:
        return event
    data = event.data
    while version < current:
        data = UPCASTERS[(event.type, version)](data)
        version = data["v"]
    return Event.model_construct(turn_id=event.turn_id, seq=event.seq, type=event.type, at=event.at, data=data)


class ModelDeltaData(TypedDict):
    """A ``model.delta`` payload as stored (``ModelDelta``'s fields)."""

    v: int
    kind: Literal["text", "reasoning", "tool_arguments"]
    pos: int
    text: str
    lens: list[int]
    call_id: NotRequired[str]


def delta_data(event: Event) -> ModelDeltaData:
    """A ``model.delta``'s payload, typed but not validated: the per-chunk
    path (a replay folds thousands of them). ``delta_event`` builds it without
    validation too; ``parse_data`` gives the validated ``ModelDelta``."""
    if event.type != ModelDelta.TYPE:
        raise TypeError(f"{event.type} event read as {ModelDelta.TYPE}")
    return cast(ModelDeltaData, event.data)


def parse_data(event: Event) -> EventData:
    """The typed payload of an event, brought to the current version first.

    Unknown types keep their raw fields (as ``EventData`` extras)."""
    event = upcast(event)
    cls = EVENT_TYPES.get(event.type)
    if cls is None:
        return EventData.model_validate(event.data)
    return cls.model_validate(event.data)


D = TypeVar("D", bound=EventData)
S = TypeVar("S")
R = TypeVar("R")


def data_of(event: Event, cls: type[D]) -> D:
    """The payload of an event known to be of ``cls``'s type."""
    if event.type != cls.TYPE:
        raise TypeError(f"{event.type} event read as {cls.TYPE}")
    data = parse_data(event)
    assert isinstance(data, cls)
    return data


class EventHandlers(Generic[S, R]):
    """A fold's handlers, one per event type, each taking its type's payload.

    The fold looks a handler up by the event's type and parses the payload
    only when there is one (a fold ignores most types)."""

    def __init__(self) -> None:
        self._by_type: dict[str, Callable[[S, EventData], R]] = {}

    def on(self, cls: type[D], handler: Callable[[S, D], R]) -> None:
        def call(state: S, data: EventData) -> R:
            assert isinstance(data, cls)  # parse_data built it from cls.TYPE
            return handler(state, data)

        self._by_type[cls.TYPE] = call

    def get(self, event_type: str) -> Callable[[S, EventData], R] | None:
        return self._by_type.get(event_type)

    def __contains__(self, event_type: str) -> bool:
        return event_type in self._by_type
