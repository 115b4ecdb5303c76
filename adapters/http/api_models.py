"""The shapes of what the HTTP API answers, and of its query parameters.

The handlers build their answers as dicts (the hot paths serialize by hand);
these models describe those dicts for ``GET /openapi.json``
(``adapters.http.openapi``), and the fuzz tests check the live answers
against them, so a handler that drifts from its model fails a test. Models
allow extra fields: the API grows by adding fields, and an older
client must keep parsing.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TurnStatus = Literal["running", "completed", "cancelled", "failed", "interrupted"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


# ------------------------------------------------------------------ errors


class ErrorDetail(_Open):
    message: str = Field(description="What is wrong, naming the field or the object.")
    type: str = Field(description="`invalid_request_error`, `authentication_error`, `not_found_error`, `conflict_error`, `upstream_error`, `api_error`, …")
    code: str | None = Field(default=None, description="A stable machine-readable code (`invalid_json`, `missing_api_key`, `damaged_log`, …).")
    param: str | None = Field(default=None, description="The request field at fault, if one is.")


class ErrorResponse(BaseModel):
    """Every error, in the OpenAI shape."""

    error: ErrorDetail


# ------------------------------------------------------------ service, models


class Health(_Open):
    ok: bool


class ModelInfo(_Open):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = Field(description='The upstream connection, or `"turnlog"` for a preset.')
    turnlog: dict[str, Any] | None = Field(default=None, description="A preset's `base_model` (and `name`, `description`).")


class Preset(_Open):
    """A model preset (``owned_by: "turnlog"`` in ``GET /v1/models``)."""

    id: str
    object: Literal["preset"] = "preset"
    source: Literal["settings", "api"] = Field(description="`settings`: a `[models.ID]` entry with `base_model` (read-only here); `api`: created here.")
    name: str | None = None
    description: str | None = None
    base_model: str
    system: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    tool_ids: list[str] = Field(default_factory=list)
    files: list[dict[str, Any]] = Field(default_factory=list)
    features: dict[str, bool] = Field(default_factory=dict)
    filters: list[str] = Field(default_factory=list)


class PresetList(_Open):
    object: Literal["list"] = "list"
    data: list[Preset]


class ModelList(_Open):
    object: Literal["list"] = "list"
    data: list[ModelInfo]
    turnlog: dict[str, Any] | None = Field(default=None, description="Why the list may be short: `warning` (no upstream) or `unreachable` upstreams.")


# --------------------------------------------------------- chat completions


class ToolCallFunction(_Open):
    name: str
    arguments: str


class ToolCall(_Open):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class AssistantMessage(_Open):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None


class Choice(_Open):
    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str


class Usage(_Open):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


class ChatCompletion(_Open):
    """``stream: false``: the answer once the turn has ended (or only its background tasks are left)."""

    id: str = Field(description="`chatcmpl-<turn_id>`")
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None = None
    usage_estimated: bool | None = Field(default=None, description="Extension: `true` when turnlog counted the usage (cl100k): the upstream reported none.")
    turnlog: dict[str, Any] | None = Field(default=None, description="Extension: `status` when not completed, `warnings`.")


class ChunkDelta(_Open):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChunkChoice(_Open):
    index: int
    delta: ChunkDelta
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionChunk(_Open):
    """One ``data:`` message of a ``text/event-stream`` answer (the stream ends with ``data: [DONE]``)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    usage_estimated: bool | None = Field(default=None, description="Extension: `true` when turnlog counted the usage (cl100k): the upstream reported none.")
    turnlog: dict[str, Any] | None = Field(default=None, description="Extension: tool progress (`item`), `status`, `warnings`, `sources`, …")


# ------------------------------------------------------------ turns, chats


class TurnError(_Open):
    message: str
    type: str


class Turn(_Open):
    """The turn as projected from its log (docs/reference/turns.md)."""

    id: str
    object: Literal["turn"] = "turn"
    chat_id: str | None
    status: TurnStatus
    state: str
    model: str | None
    output: list[dict[str, Any]] = Field(description="Output items in the Responses API shapes.")
    content: str
    reasoning_content: str | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    usage_estimated: bool | None = Field(
        default=None, description="Only when true: some of `usage` was counted by turnlog (cl100k): an upstream reported none."
    )
    response_ids: list[str]
    error: TurnError | None = None
    warnings: list[Any]
    seq: int = Field(description="The last event folded.")
    epoch: int
    created_at: float | None
    updated_at: float | None
    parent_turn_id: str | None = None
    forked_at: int | None = None
    sources: list[dict[str, Any]] | None = None
    title: str | None = None
    tags: list[str] | None = None
    follow_ups: list[str] | None = None


class PublicEvent(BaseModel):
    seq: int
    type: str
    at: float
    data: dict[str, Any]


class EventPage(_Open):
    events: list[PublicEvent]
    next_after: int


class TurnStatusChange(_Open):
    """202: the request is recorded; the turn reaches the status on its own."""

    id: str
    status: str


class ApprovalDecision(_Open):
    """202: the decision is recorded; ``status`` is the call's approval status."""

    turn_id: str
    call_id: str
    approve: bool
    status: str


class Damage(_Open):
    seq: int
    kind: str
    message: str


class Verdict(_Open):
    ok: bool
    diff: list[str]
    turn_id: str
    events: int
    head: str | None = None
    damage: Damage | None = None


class Receipt(_Open):
    turn_id: str
    events: int
    head: str = Field(description="The last event's hash (hex).")
    algorithm: str
    signature: str | None = Field(default=None, description="Base64 Ed25519 signature of the head, with TURNLOG_RECEIPT_KEY.")


class Span(_Open):
    kind: Literal["assembly", "step", "model", "tool", "approval", "reinjection", "outlet", "background"]
    name: str
    seq: int = Field(description="The event that opened it.")
    start: float
    end: float | None = Field(description="None while it is still open.")
    end_seq: int | None
    status: str = Field(description="open, completed, failed, approved, denied, restarted (begun again after a resume), interrupted or cancelled.")
    copied: bool = Field(description="A fork's: begun in the copy of its parent's events (at the parent's times).")
    detail: dict[str, Any] = Field(
        description="model: iteration, api, resumed, deltas, finish_reason, input_tokens, output_tokens, estimated, first_chunk_ms, "
        "tokens_per_s; tool: call_id, kind, attempt, error; assembly: messages, history_len, sources; outlet: filters, errors."
    )


class Mark(_Open):
    type: str
    seq: int
    at: float
    detail: str | None


class Spans(_Open):
    turn_id: str
    start: float | None = Field(description="The first event's time (seconds since the epoch).")
    end: float | None = Field(description="The last event's time.")
    last_seq: int
    spans: list[Span]
    marks: list[Mark]


class Forked(_Open):
    turn_id: str
    chat_id: str


class ChatSummary(_Open):
    id: str
    title: str | None
    tags: list[str] | None
    created_at: float | None
    updated_at: float | None


class ChatList(_Open):
    data: list[ChatSummary]


class Chat(ChatSummary):
    messages: list[dict[str, Any]] = Field(description="The chat's messages; assistant messages carry their turn's `output` items.")


# ---------------------------------------------------------------- memories


class Memory(_Open):
    id: str
    content: str
    created_at: float
    updated_at: float | None = None


class MemoryList(_Open):
    data: list[Memory]


class MemoryHit(Memory):
    score: float


class MemoryHits(_Open):
    data: list[MemoryHit]


class Deleted(_Open):
    id: str
    object: str | None = None
    deleted: Literal[True]


# ------------------------------------------------------- files, knowledge


class FileUpload(BaseModel):
    """``multipart/form-data`` with the document in the field ``file`` (text, Markdown, HTML, PDF)."""

    file: bytes = Field(json_schema_extra={"format": "binary"})


class FileObject(_Open):
    id: str
    object: Literal["file"] = "file"
    filename: str
    bytes: int
    content_type: str
    status: str = Field(description="`processing`, `ready` or `failed`.")
    error: str | None = None
    chars: int | None = None
    chunks: int | None = None
    tokens: int | None = None
    embedding_model: str | None = None
    created_at: int
    updated_at: int | None = None


class FileList(_Open):
    object: Literal["list"] = "list"
    data: list[FileObject]


class Collection(_Open):
    id: str
    object: Literal["knowledge"] = "knowledge"
    name: str
    description: str
    shared: bool = Field(default=False, description="Created by an admin with `shared: true`: readable by every user (a preset may bind it).")
    files: list[FileObject]
    created_at: int
    updated_at: int


class CollectionList(_Open):
    object: Literal["list"] = "list"
    data: list[Collection]


# -------------------------------------------------------------- inspector


class UiTurn(_Open):
    id: str
    chat_id: str | None
    chat_title: str | None
    model: str | None
    status: str
    created_at: float | None
    updated_at: float | None


class UiTurnPage(_Open):
    data: list[UiTurn]
    has_more: bool
    offset: int
    models: list[str | None]


class FoundTurn(_Open):
    id: str
    chat_id: str | None
    status: str
    model: str
    title: str | None = Field(default=None, description="The background task's title, when the turn has one (left out otherwise).")
    first_message: str | None = Field(description="The turn's first new user message (its first 500 characters).")
    created_at: float
    updated_at: float | None
    used_tools: bool = Field(description="Whether the turn ran a tool.")
    chat_title: str | None = Field(description="The chat's title, if it has one.")


class TurnPage(_Open):
    data: list[FoundTurn] = Field(description="Newest first.")
    next_before: str | None = Field(description="`before` of the next page; null on the last one.")


class UiChat(ChatSummary):
    first_message: str | None = Field(description="The first new user message of the chat's first turn (its first 500 characters).")


class UiChatList(_Open):
    data: list[UiChat]


class TurnCounts(_Open):
    total: int
    by_status: dict[str, int] = Field(description="Per status as the list shows it (`interrupted` apart from `running`).")
    models: list[str] = Field(description="The models of the user's turns, whatever the filters.")


class UiSummary(_Open):
    turn: Turn
    first_at: float | None
    last_seq: int
    iterations: int
    requests: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    problems: list[dict[str, Any]]


class TimelineEvent(PublicEvent):
    state: str


class UiTimeline(_Open):
    events: list[TimelineEvent]
    next_after: int
    has_more: bool


class UiFork(_Open):
    turn_id: str
    at: int = Field(description="The parent's seq it was forked at.")
    model: str
    status: str
    created_at: float


class UiForks(_Open):
    data: list[UiFork]


# --------------------------------------------------------- query, headers


class EventsQuery(BaseModel):
    after: int = Field(default=0, ge=0, description="Events with a greater seq.")
    limit: int = Field(default=1000, ge=1, description="At most this many (capped at 10,000).")


class StreamQuery(BaseModel):
    after: int | None = Field(default=None, description="The stream position to continue after (as `Last-Event-ID`).")
    include_usage: bool = False


class StreamHeaders(BaseModel):
    last_event_id: int | None = Field(
        default=None, alias="Last-Event-ID", description="The `id:` of the last SSE message received: the stream continues right after it."
    )


class ReplayQuery(BaseModel):
    upto: int | None = Field(default=None, ge=0, description="Fold only the events with seq <= upto.")


class ChatsQuery(BaseModel):
    limit: int = Field(default=50, ge=1, description="At most this many (capped at 500).")
    before: float | None = Field(default=None, description="Chats updated before this Unix time.")


class UsageQuery(BaseModel):
    since: str | None = Field(default=None, description="The first UTC day (YYYY-MM-DD) summed; default: the first there is.")
    until: str | None = Field(default=None, description="The last UTC day (YYYY-MM-DD) summed, included; default: today.")
    group_by: Literal["model", "day", "model,day"] | None = Field(default=None, description="How `data` is grouped; none: one row of the sums.")
    user: str | None = Field(default=None, description="Another user's usage (an admin key's to read).")


class UsageEntry(_Open):
    model: str | None = None
    day: str | None = Field(default=None, description="YYYY-MM-DD, UTC.")
    turns: int
    input_tokens: int
    output_tokens: int
    tool_calls: int
    usage_estimated: bool | None = Field(
        default=None, description="Some tokens were counted by turnlog: an upstream reported none (`estimated_turns` of the turns)."
    )
    estimated_turns: int | None = None


class UsageReport(_Open):
    object: Literal["usage"]
    user: str
    since: str | None
    until: str | None
    data: list[UsageEntry]
    total: UsageEntry


class BlobHeaders(BaseModel):
    if_none_match: str | None = Field(default=None, alias="If-None-Match")


class WsQuery(BaseModel):
    access_token: str | None = Field(default=None, description="The API key, for browsers, which cannot send headers on a WebSocket upgrade.")


class UiTurnsQuery(BaseModel):
    status: Literal["running", "completed", "cancelled", "failed", "interrupted"] | None = None
    model: str | None = None
    chat_id: str | None = None
    offset: int = Field(default=0, ge=0)
    limit: int = Field(default=25, ge=1, description="Capped at 200.")


class TurnsQuery(BaseModel):
    q: str | None = Field(
        default=None,
        description="Words (runs of letters and digits, any case; `word*` a word's start) that must all be in the turn's new user messages or its answer.",
    )
    status: Literal["running", "completed", "cancelled", "failed", "interrupted", "waiting"] | None = None
    model: str | None = None
    chat_id: str | None = None
    since: str | None = Field(default=None, description="Created at or after: Unix seconds or ISO 8601 (UTC unless it says).")
    until: str | None = Field(default=None, description="Created before: Unix seconds or ISO 8601.")
    tools: bool | None = Field(default=None, description="Whether the turn ran a tool.")
    failed: bool | None = Field(default=None, description="Whether the turn, or one of its tool calls, failed.")
    before: str | None = Field(default=None, description="The previous page's `next_before` (or a Unix time).")
    limit: int = Field(default=25, ge=1, description="Capped at 200.")
    user: str | None = Field(default=None, description="Another user's turns: admins only (403 otherwise).")


class TimelineQuery(BaseModel):
    after: int = Field(default=0, ge=0)
    limit: int = Field(default=200, ge=1, description="Capped at 1,000.")


# ------------------------------------------------------ the Responses API


class ResponseObject(_Open):
    """An OpenAI Responses API ``response``, folded from the turn's log (``resp_<turn id>``)."""

    id: str
    object: Literal["response"]
    status: str = Field(description="`queued`, `in_progress`, `completed`, `failed`, `incomplete` or `cancelled`.")
    output: list[dict[str, Any]]


class ResponseStreamEvent(_Open):
    """One typed event of a response's stream (`response.created`, `response.output_text.delta`, …)."""

    type: str
    sequence_number: int = Field(description="0, 1, 2, … derived from the log: a resumed stream continues after `starting_after`.")


class ResponseItemList(_Open):
    object: Literal["list"]
    data: list[dict[str, Any]]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool


class ResponseDeleted(_Open):
    id: str
    object: Literal["response"]
    deleted: bool


class ResponseQuery(BaseModel):
    stream: bool = Field(default=False, description="true: the response's SSE events after `starting_after`, then live.")
    starting_after: int = Field(default=-1, ge=-1, description="The sequence number to continue after (-1: from the start).")


class InputItemsQuery(BaseModel):
    order: Literal["asc", "desc"] = "desc"
    limit: int = Field(default=20, ge=1, description="At most this many (capped at 100).")
    after: str | None = Field(default=None, description="An item id: the items after it.")
