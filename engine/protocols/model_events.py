"""Normalized model-stream events: what every upstream protocol is folded into.

Chat Completions chunks, Responses API events and Ollama NDJSON lines each have
a pure normalizer (in ``engine.protocols.chat``, ``responses``, ``ollama``)
that turns them into this small vocabulary; the turn actor only ever sees these. Text and reasoning arrive as
deltas; a tool call arrives whole (its arguments complete) once the protocol
says it is done, so the log records each call once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.json_types import JsonObject


@dataclass(slots=True)  # per chunk: not frozen (its init is 4x slower); never mutated
class TextDelta:
    text: str


@dataclass(slots=True)
class ReasoningDelta:
    text: str


@dataclass(slots=True)
class TextRun:
    """Consecutive non-empty text chunks of one network read, as one event: the
    same as a ``TextDelta`` each, in order. Only a consumer that asks for runs
    (``ModelClient.stream(..., runs=True)``) gets them; a fast upstream brings
    a thousand chunks per read, and an object per chunk is most of what a
    chunk costs beyond its parse."""

    texts: list[str]


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    """A call became visible (name known, arguments still streaming): for live progress."""

    call_id: str
    name: str
    item_id: str | None = None  # the provider's item id where it has one (Responses API ``fc_…``)


@dataclass(slots=True)
class ToolArgumentsDelta:
    """A fragment of a started call's arguments, as the model writes them: for
    live progress (the complete call still comes as a ``ToolCall``)."""

    call_id: str
    text: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A complete function call requested by the model.

    ``arguments`` is the raw string the model produced (may be invalid JSON; the
    tool layer parses it). ``item_id`` is the provider's item id where it has one
    (Responses API ``fc_…``), else equal to ``call_id``. ``provider_id`` is the
    provider's own call id when ``call_id`` had to replace it (the provider's
    was already used in the turn: some number their calls per response).
    """

    call_id: str
    name: str
    arguments: str
    item_id: str | None = None
    provider_id: str | None = None


@dataclass(frozen=True, slots=True)
class ProviderItem:
    """An output item the provider returned that turnlog keeps as it is (e.g. a
    Responses API reasoning item with encrypted content, to replay it later)."""

    item: JsonObject


@dataclass(frozen=True, slots=True)
class Finished:
    """The response ended normally. ``reason`` as Chat Completions names it:
    ``stop``, ``length``, ``tool_calls``, ``content_filter``."""

    reason: str | None = None
    response_id: str | None = None
    usage: JsonObject | None = None
    status: str | None = None  # Responses API: completed | incomplete


@dataclass(frozen=True, slots=True)
class UsageReport:
    usage: JsonObject


@dataclass(frozen=True, slots=True)
class ResponseStarted:
    response_id: str


@dataclass(frozen=True, slots=True)
class StreamWarning:
    """Something odd but survivable (an error chunk inside a stream, an unknown event)."""

    message: str
    raw: object = None  # what the provider sent, as sent


@dataclass(frozen=True, slots=True)
class StreamFailed:
    """The provider said the response failed (Responses ``response.failed`` / ``error``)."""

    message: str
    code: str | None = None
    details: JsonObject = field(default_factory=dict)


ModelEvent = (
    TextDelta
    | TextRun
    | ReasoningDelta
    | ToolCallStarted
    | ToolArgumentsDelta
    | ToolCall
    | ProviderItem
    | Finished
    | UsageReport
    | ResponseStarted
    | StreamWarning
    | StreamFailed
)
