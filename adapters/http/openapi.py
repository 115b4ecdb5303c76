"""``GET /openapi.json``: an OpenAPI 3.1 document of every route the app registers.

The paths and methods come from the aiohttp router itself, the schemas from
the pydantic models that validate the requests (``schemas.py`` and the route
modules) and describe the answers (``api_models.py``); only the operations'
words and status codes are written here, in :data:`OPERATIONS`. A route the
router has and :data:`OPERATIONS` lacks is still listed (marked
``x-undocumented``) and :func:`undocumented` names it, which a test checks, so a
new route cannot ship without its operation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from adapters.http import api_models as m
from adapters.http.approval_routes import ApprovalRequest
from adapters.http.file_routes import FileId, NewCollection
from adapters.http.fork_routes import ForkRequest
from adapters.http.memory_routes import MemoryBody, QueryBody
from adapters.http.responses_routes import ResponsesRequest
from adapters.http.schemas import ChatRequest
from adapters.presets import PresetPatch, PresetSpec

OPENAPI_PATH = "/openapi.json"
REF = "#/components/schemas/{model}"
BEARER = "bearerAuth"
ACCESS_TOKEN = "accessToken"
_PARAM = re.compile(r"\{([^{}:]+)(?::[^{}]*)?\}")


@dataclass(frozen=True)
class Media:
    """One content type of a body: JSON of a model, SSE whose ``data:`` is a
    model, or opaque (HTML, files)."""

    kind: str  # "json" | "sse" | "binary" | "text" | "object" (any JSON object)
    model: type[BaseModel] | None = None


def json_(model: type[BaseModel]) -> dict[str, Media]:
    return {"application/json": Media("json", model)}


SSE_CHUNKS = Media("sse", m.ChatCompletionChunk)
SSE_RESPONSE_EVENTS = Media("sse", m.ResponseStreamEvent)
HTML = {"text/html": Media("text")}
#: One server-sent event of a streamed answer.
SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "description": (
        "One server-sent event of the stream: its `data` is the JSON of `x-sse-data` (a chat completion stream ends with "
        "`data: [DONE]`); `id` is the event's position, for `Last-Event-ID` on a reconnect"
    ),
    "properties": {"data": {"type": "string"}, "id": {"type": "string"}, "event": {"type": "string"}, "retry": {"type": "integer"}},
    "required": ["data"],
}
TURN_HEADERS = ("X-Turn-Id", "X-Chat-Id")


@dataclass(frozen=True)
class Reply:
    description: str
    content: dict[str, Media] = field(default_factory=dict)
    headers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Operation:
    summary: str
    tag: str
    responses: dict[int, Reply]
    errors: tuple[int, ...] = ()
    body: dict[str, Media] | None = None
    query: type[BaseModel] | None = None
    headers: type[BaseModel] | None = None
    public: bool = False  # no API key, even with TURNLOG_AUTH=on
    description: str | None = None


ERRORS: dict[int, str] = {
    400: "Bad input: malformed JSON, a schema violation or a bad parameter, named in the message.",
    401: "No or wrong API key (`TURNLOG_AUTH=on`).",
    403: "An admin-only endpoint asked with a user key (`TURNLOG_AUTH=on`).",
    404: "Not found, or someone else's.",
    409: "A conflict with the turn's state (`turn_not_running`, `turn_not_ended`, …) or a damaged log (`damaged_log`, with `damage`).",
    413: "The body is over the limit (`TURNLOG_MAX_BODY_BYTES`, `TURNLOG_MAX_FILE_BYTES`).",
    415: "Unsupported file type.",
    501: "Not supported by this event store.",
    502: "The upstream (model or embedding service) failed.",
}

PARAMS: dict[str, str] = {
    "turn_id": "A turn id (`X-Turn-Id`).",
    "chat_id": "A chat id.",
    "memory_id": "A memory id.",
    "file_id": "A file id.",
    "knowledge_id": "A knowledge collection id.",
    "blob_id": "A blob id: 64 hex digits (the sha256 of its bytes).",
    "filename": "A file of the inspector's page.",
    "response_id": "A response id (`resp_<turn id>`).",
    "preset_id": "A preset id (a model id of turnlog's own).",
}


def _turn_failures() -> dict[int, Reply]:
    """How a turn that failed upstream is answered (not streamed, not in the background)."""
    return {
        422: Reply(
            "The upstream refused the turn's first model call with a 422: the client's own fields (its message and `param`; a 400 is answered 400 alike).",
            json_(m.ErrorResponse),
            TURN_HEADERS,
        ),
        429: Reply(
            "The upstream's rate limit, or a quota (`rate_limit_exceeded`, nothing recorded): retry after `Retry-After` seconds.",
            json_(m.ErrorResponse),
            TURN_HEADERS,
        ),
        502: Reply(
            "The turn failed upstream (`upstream_error`, `code` says how) or in an inlet filter (the turn is recorded as `failed`).",
            json_(m.ErrorResponse),
            TURN_HEADERS,
        ),
        503: Reply("The upstream cannot be reached (`upstream_unavailable`), with `Retry-After`.", json_(m.ErrorResponse), TURN_HEADERS),
    }


_TURN_ERRORS = (404, 409)
_BODY = (400, 413)

#: (METHOD, path as the router has it) -> the operation.
OPERATIONS: dict[tuple[str, str], Operation] = {
    ("GET", "/healthz"): Operation("Liveness", "service", {200: Reply("Up.", json_(m.Health))}, public=True),
    ("GET", OPENAPI_PATH): Operation("This document", "service", {200: Reply("The OpenAPI 3.1 document.", {"application/json": Media("object")})}, public=True),
    ("GET", "/v1/models"): Operation(
        "The presets and the models of the configured upstream connections", "models", {200: Reply("The model ids a request may name.", json_(m.ModelList))}
    ),
    ("POST", "/v1/chat/completions"): Operation(
        "Start a turn (OpenAI Chat Completions plus turnlog's extensions)",
        "chat",
        {
            200: Reply(
                "`stream: false`: the `chat.completion`; `stream: true`: SSE of `chat.completion.chunk`, "
                "each message with `id: <position>`, ending with `data: [DONE]`.",
                {"application/json": Media("json", m.ChatCompletion), "text/event-stream": SSE_CHUNKS},
                TURN_HEADERS,
            ),
            **_turn_failures(),
        },
        errors=(*_BODY, 404),
        body=json_(ChatRequest),
    ),
    ("GET", "/v1/turns/{turn_id}"): Operation("The turn projected from its log", "turns", {200: Reply("The turn.", json_(m.Turn))}, errors=_TURN_ERRORS),
    ("GET", "/v1/turns/{turn_id}/events"): Operation(
        "A page of the turn's event log", "turns", {200: Reply("Events in seq order.", json_(m.EventPage))}, errors=(400, *_TURN_ERRORS), query=m.EventsQuery
    ),
    ("GET", "/v1/turns/{turn_id}/stream"): Operation(
        "Reconnect: the turn's SSE stream after a position, then live",
        "turns",
        {200: Reply("SSE of `chat.completion.chunk` until the turn ends.", {"text/event-stream": SSE_CHUNKS}, TURN_HEADERS)},
        errors=(400, *_TURN_ERRORS),
        query=m.StreamQuery,
        headers=m.StreamHeaders,
    ),
    ("GET", "/v1/turns/{turn_id}/replay"): Operation(
        "Time travel: the turn as folded from its first events",
        "turns",
        {200: Reply("The turn at `upto`.", json_(m.Turn))},
        errors=(400, *_TURN_ERRORS),
        query=m.ReplayQuery,
    ),
    ("GET", "/v1/turns/{turn_id}/verify"): Operation(
        "Check the hash chain and re-run the engine against the recorded results", "turns", {200: Reply("The verdict.", json_(m.Verdict))}, errors=_TURN_ERRORS
    ),
    ("GET", "/v1/turns/{turn_id}/receipt"): Operation(
        "The turn's receipt: its chain's head, signed with TURNLOG_RECEIPT_KEY", "turns", {200: Reply("The receipt.", json_(m.Receipt))}, errors=_TURN_ERRORS
    ),
    ("GET", "/v1/turns/{turn_id}/spans"): Operation(
        "The turn's spans on one time axis: assembly, model calls, tool calls, approvals, reinjections, outlet, background tasks",
        "turns",
        {200: Reply("Spans in the order they began, and the moments (failures, warnings, resumes) as marks.", json_(m.Spans))},
        errors=_TURN_ERRORS,
    ),
    ("POST", "/v1/turns/{turn_id}/cancel"): Operation(
        "Cancel a running turn (the partial answer is saved)", "turns", {202: Reply("Cancelled.", json_(m.TurnStatusChange))}, errors=_TURN_ERRORS
    ),
    ("POST", "/v1/turns/{turn_id}/resume"): Operation(
        "Resume an interrupted turn from its last durable event", "turns", {202: Reply("Resumed.", json_(m.TurnStatusChange))}, errors=_TURN_ERRORS
    ),
    ("POST", "/v1/turns/{turn_id}/fork"): Operation(
        "Re-run a finished turn from one of its events, with another model or other tool results",
        "turns",
        {201: Reply("The fork, a new turn in a new chat.", json_(m.Forked), TURN_HEADERS)},
        errors=(*_BODY, *_TURN_ERRORS),
        body=json_(ForkRequest),
    ),
    ("POST", "/v1/turns/{turn_id}/approvals"): Operation(
        "Approve or reject a tool call the turn waits on (params.tool_approval: ask)",
        "turns",
        {202: Reply("The decision is recorded; the turn goes on when every call of the batch is decided.", json_(m.ApprovalDecision))},
        errors=(*_BODY, *_TURN_ERRORS),
        body=json_(ApprovalRequest),
    ),
    ("POST", "/v1/presets"): Operation(
        "Create a model preset (admin)",
        "models",
        {201: Reply("The preset.", json_(m.Preset))},
        errors=(*_BODY, 403, 409),
        body=json_(PresetSpec),
        description="Its base model must be an upstream model, its files shared collections, its filters opt-in ones (400 otherwise).",
    ),
    ("GET", "/v1/presets"): Operation(
        "Every preset, of the settings and created here (admin)", "models", {200: Reply("The presets.", json_(m.PresetList))}, errors=(403,)
    ),
    ("GET", "/v1/presets/{preset_id}"): Operation("A preset (admin)", "models", {200: Reply("The preset.", json_(m.Preset))}, errors=(403, 404)),
    ("PATCH", "/v1/presets/{preset_id}"): Operation(
        "Change a preset (admin); turns already started keep what they recorded",
        "models",
        {200: Reply("The preset.", json_(m.Preset))},
        errors=(*_BODY, 403, 404, 409),
        body=json_(PresetPatch),
        description="A preset of the settings is changed in the settings: 409 `preset_read_only`.",
    ),
    ("DELETE", "/v1/presets/{preset_id}"): Operation("Delete a preset (admin)", "models", {200: Reply("Deleted.", json_(m.Deleted))}, errors=(403, 404, 409)),
    ("GET", "/metrics"): Operation(
        "Prometheus metrics of this process",
        "service",
        {200: Reply("The Prometheus text exposition format.", {"text/plain": Media("text")})},
        errors=(403,),
        description="With auth on: an admin key, or `TURNLOG_METRICS_TOKEN` as the bearer token (for scrapers); a user key gets 403.",
    ),
    ("POST", "/v1/responses"): Operation(
        "Start a turn through the OpenAI Responses API (previous_response_id continues a conversation)",
        "responses",
        {
            200: Reply(
                "`stream: false`: the `response` (with `background: true` at once, `queued`); `stream: true`: its typed SSE events.",
                {"application/json": Media("json", m.ResponseObject), "text/event-stream": SSE_RESPONSE_EVENTS},
                TURN_HEADERS,
            ),
            **_turn_failures(),
        },
        errors=(*_BODY, 404, 409),
        body=json_(ResponsesRequest),
    ),
    ("GET", "/v1/responses/{response_id}"): Operation(
        "A response folded from its log, or (stream=true) its events after starting_after, then live",
        "responses",
        {
            200: Reply(
                "The response, or its SSE events.",
                {"application/json": Media("json", m.ResponseObject), "text/event-stream": SSE_RESPONSE_EVENTS},
                TURN_HEADERS,
            )
        },
        errors=(400, 404, 409),
        query=m.ResponseQuery,
    ),
    ("DELETE", "/v1/responses/{response_id}"): Operation(
        "Delete a stored response (its turn's log stays as the audit record)",
        "responses",
        {200: Reply("Deleted.", json_(m.ResponseDeleted))},
        errors=(404, 409),
    ),
    ("POST", "/v1/responses/{response_id}/cancel"): Operation(
        "Cancel a response (the partial output is kept)", "responses", {200: Reply("The response as it stands.", json_(m.ResponseObject))}, errors=(404, 409)
    ),
    ("GET", "/v1/responses/{response_id}/input_items"): Operation(
        "The input items of a response",
        "responses",
        {200: Reply("A page of items.", json_(m.ResponseItemList))},
        errors=(400, 404, 409),
        query=m.InputItemsQuery,
    ),
    ("GET", "/v1/turns"): Operation(
        "Find the caller's turns: full text, filters, keyset pages",
        "turns",
        {200: Reply("One page, newest first.", json_(m.TurnPage))},
        errors=(400, 403),
        query=m.TurnsQuery,
    ),
    ("GET", "/v1/ui/turns/counts"): Operation(
        "The inspector's counts: the turns the filters match, by status",
        "inspector",
        {200: Reply("The counts.", json_(m.TurnCounts))},
        errors=(400, 403),
        query=m.TurnsQuery,
    ),
    ("GET", "/v1/ui/chats"): Operation(
        "The inspector's chats: the caller's chats, each with its first message",
        "inspector",
        {200: Reply("Newest first.", json_(m.UiChatList))},
        errors=(400,),
        query=m.ChatsQuery,
    ),
    ("GET", "/v1/chats"): Operation("The caller's chats", "chats", {200: Reply("Newest first.", json_(m.ChatList))}, errors=(400,), query=m.ChatsQuery),
    ("GET", "/v1/chats/{chat_id}"): Operation("A chat and its messages", "chats", {200: Reply("The chat.", json_(m.Chat))}, errors=(404, 409)),
    ("POST", "/v1/memories"): Operation(
        "Store a memory", "memories", {200: Reply("The memory.", json_(m.Memory))}, errors=(*_BODY, 502), body=json_(MemoryBody)
    ),
    ("GET", "/v1/usage"): Operation(
        "What the caller's turns spent (an admin: anyone's)",
        "usage",
        {200: Reply("Turns, tokens and tool calls per model and/or UTC day, and their total.", json_(m.UsageReport))},
        errors=(400, 403),
        query=m.UsageQuery,
    ),
    ("GET", "/v1/memories"): Operation("The caller's memories", "memories", {200: Reply("Every memory.", json_(m.MemoryList))}),
    ("POST", "/v1/memories/query"): Operation(
        "The memories nearest to a text", "memories", {200: Reply("The k best, with scores.", json_(m.MemoryHits))}, errors=(*_BODY, 502), body=json_(QueryBody)
    ),
    ("GET", "/v1/memories/{memory_id}"): Operation("A memory", "memories", {200: Reply("The memory.", json_(m.Memory))}, errors=(404,)),
    ("POST", "/v1/memories/{memory_id}"): Operation(
        "Replace a memory's content", "memories", {200: Reply("The memory.", json_(m.Memory))}, errors=(*_BODY, 404, 502), body=json_(MemoryBody)
    ),
    ("PATCH", "/v1/memories/{memory_id}"): Operation(
        "Replace a memory's content", "memories", {200: Reply("The memory.", json_(m.Memory))}, errors=(*_BODY, 404, 502), body=json_(MemoryBody)
    ),
    ("DELETE", "/v1/memories/{memory_id}"): Operation("Delete a memory", "memories", {200: Reply("Deleted.", json_(m.Deleted))}, errors=(404,)),
    ("POST", "/v1/files"): Operation(
        "Upload and index a document",
        "files",
        {200: Reply("The file; `status` is `processing` until it is indexed.", json_(m.FileObject))},
        errors=(*_BODY, 415),
        body={"multipart/form-data": Media("json", m.FileUpload)},
    ),
    ("GET", "/v1/files"): Operation("The caller's files", "files", {200: Reply("Every file.", json_(m.FileList))}),
    ("GET", "/v1/files/{file_id}"): Operation("A file's metadata and status", "files", {200: Reply("The file.", json_(m.FileObject))}, errors=(404,)),
    ("DELETE", "/v1/files/{file_id}"): Operation("Delete a file and its chunks", "files", {200: Reply("Deleted.", json_(m.Deleted))}, errors=(404,)),
    ("POST", "/v1/knowledge"): Operation(
        "Create a knowledge collection (a shared one: admin)",
        "knowledge",
        {200: Reply("The collection.", json_(m.Collection))},
        errors=(*_BODY, 403),
        body=json_(NewCollection),
    ),
    ("GET", "/v1/knowledge"): Operation("The caller's collections", "knowledge", {200: Reply("Every collection.", json_(m.CollectionList))}),
    ("GET", "/v1/knowledge/{knowledge_id}"): Operation(
        "A collection and its files", "knowledge", {200: Reply("The collection.", json_(m.Collection))}, errors=(404,)
    ),
    ("DELETE", "/v1/knowledge/{knowledge_id}"): Operation(
        "Delete a collection (not its files)", "knowledge", {200: Reply("Deleted.", json_(m.Deleted))}, errors=(404,)
    ),
    ("POST", "/v1/knowledge/{knowledge_id}/files"): Operation(
        "Add a file to a collection", "knowledge", {200: Reply("The collection.", json_(m.Collection))}, errors=(*_BODY, 404), body=json_(FileId)
    ),
    ("DELETE", "/v1/knowledge/{knowledge_id}/files/{file_id}"): Operation(
        "Remove a file from a collection", "knowledge", {200: Reply("The collection.", json_(m.Collection))}, errors=(404,)
    ),
    ("GET", "/v1/blobs/{blob_id}"): Operation(
        'The bytes behind a `{"$blob"}` reference in an event (images, files)',
        "blobs",
        {200: Reply("The bytes, with their mime type.", {"*/*": Media("binary")}), 304: Reply("Not modified (`If-None-Match`).")},
        errors=(404,),
        headers=m.BlobHeaders,
    ),
    ("GET", "/v1/ws"): Operation(
        "The WebSocket: chat, subscribe with a cursor, cancel, direct tool results",
        "websocket",
        {101: Reply("Switching to the WebSocket protocol; the messages are JSON text (docs/reference/websocket.md).")},
        errors=(400,),
        query=m.WsQuery,
        description="A request that is not a WebSocket upgrade gets 400.",
    ),
    ("GET", "/ui"): Operation("The inspector (redirect)", "inspector", {302: Reply("To `/ui/`.")}, public=True),
    ("GET", "/ui/"): Operation("The inspector's page", "inspector", {200: Reply("HTML.", HTML)}, public=True),
    ("GET", "/ui/turns/{turn_id}"): Operation("The inspector, opened on one turn", "inspector", {200: Reply("HTML.", HTML)}, public=True),
    ("GET", "/ui/static/{filename}"): Operation(
        "The inspector's scripts and styles", "inspector", {200: Reply("The file.", {"*/*": Media("binary")})}, errors=(404,), public=True
    ),
    ("GET", "/v1/ui/turns"): Operation(
        "The inspector's list of the caller's turns",
        "inspector",
        {200: Reply("One page, newest first.", json_(m.UiTurnPage))},
        errors=(400, 501),
        query=m.UiTurnsQuery,
    ),
    ("GET", "/v1/ui/turns/{turn_id}/summary"): Operation(
        "The inspector's summary of a turn: requests sent, tool calls, problems",
        "inspector",
        {200: Reply("The summary.", json_(m.UiSummary))},
        errors=_TURN_ERRORS,
    ),
    ("GET", "/v1/ui/turns/{turn_id}/forks"): Operation(
        "The inspector's list of a turn's forks",
        "inspector",
        {200: Reply("The caller's forks of the turn, oldest first.", json_(m.UiForks))},
        errors=_TURN_ERRORS,
    ),
    ("GET", "/v1/ui/turns/{turn_id}/timeline"): Operation(
        "The inspector's timeline: events with the state after each",
        "inspector",
        {200: Reply("One page.", json_(m.UiTimeline))},
        errors=(400, *_TURN_ERRORS),
        query=m.TimelineQuery,
    ),
}


def routes(app: web.Application) -> list[tuple[str, str]]:
    """(METHOD, path) of every route the router has, HEAD aside (aiohttp adds
    it to every GET); a static folder is ``{prefix}/{filename}``."""
    out: list[tuple[str, str]] = []
    for route in app.router.routes():
        if route.method == "HEAD" or route.resource is None:
            continue
        path = route.resource.canonical
        if isinstance(route.resource, web.StaticResource):
            path = path.rstrip("/") + "/{filename}"
        key = (route.method, path)
        if key not in out:
            out.append(key)
    return out


def undocumented(app: web.Application) -> list[tuple[str, str]]:
    """Routes without an operation in :data:`OPERATIONS`."""
    return [key for key in routes(app) if key not in OPERATIONS]


def _models(app: web.Application) -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = [m.ErrorResponse]
    for key in routes(app):
        op = OPERATIONS.get(key)
        if op is None:
            continue
        medias = [media for reply in op.responses.values() for media in reply.content.values()]
        medias += list((op.body or {}).values())
        for media in medias:
            if media.model is not None and media.model not in found:
                found.append(media.model)
    return found


def _parameters(where: str, model: type[BaseModel]) -> list[dict[str, Any]]:
    schema = model.model_json_schema(by_alias=True, ref_template=REF)
    required = set(schema.get("required", ()))
    out = []
    for name, prop in schema.get("properties", {}).items():
        description = prop.pop("description", None)
        prop.pop("title", None)
        # A parameter is absent or a value: never null.
        options = [o for o in prop.pop("anyOf", ()) if o != {"type": "null"}]
        if len(options) == 1:
            prop.update(options[0])
        elif options:
            prop["anyOf"] = options
        if prop.get("default", 0) is None:
            del prop["default"]
        param: dict[str, Any] = {"name": name, "in": where, "required": name in required, "schema": prop}
        if description:
            param["description"] = description
        out.append(param)
    return out


def _content(content: dict[str, Media], refs: dict[type[BaseModel], dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for media_type, media in content.items():
        if media.kind == "json" and media.model is not None:
            out[media_type] = {"schema": refs[media.model]}
        elif media.kind == "sse":
            # The schema of a text/event-stream body is that of one event
            # (its fields as an SSE parser gives them), as OpenAPI 3.2 reads a
            # sequential media type and as validators such as schemathesis
            # apply it: a string schema fails every event of a real stream.
            out[media_type] = {
                "schema": SSE_EVENT,
                "x-sse-data": refs[media.model] if media.model is not None else {},
            }
        elif media.kind == "object":
            out[media_type] = {"schema": {"type": "object"}}
        elif media.kind == "binary":
            out[media_type] = {"schema": {"type": "string", "format": "binary"}}
        else:
            out[media_type] = {"schema": {"type": "string"}}
    return out


def _operation(method: str, path: str, op: Operation | None, refs: dict[type[BaseModel], dict[str, Any]]) -> dict[str, Any]:
    params = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}, "description": PARAMS.get(name, name)} for name in _PARAM.findall(path)
    ]
    if op is None:
        return {
            "summary": "undocumented",
            "operationId": _operation_id(method, path),
            "parameters": params,
            "responses": {"default": {"description": "undocumented"}},
            "x-undocumented": True,
        }
    if op.query is not None:
        params += _parameters("query", op.query)
    if op.headers is not None:
        params += _parameters("header", op.headers)
    responses: dict[str, Any] = {}
    for status, reply in op.responses.items():
        entry: dict[str, Any] = {"description": reply.description}
        if reply.content:
            entry["content"] = _content(reply.content, refs)
        if reply.headers:
            entry["headers"] = {h: {"$ref": f"#/components/headers/{h}"} for h in reply.headers}
        responses[str(status)] = entry
    errors = set(op.errors) | ({401} if not op.public else set())
    for status in sorted(errors):
        responses.setdefault(str(status), {"$ref": f"#/components/responses/Error{status}"})
    out: dict[str, Any] = {"summary": op.summary, "operationId": _operation_id(method, path), "tags": [op.tag]}
    if op.description:
        out["description"] = op.description
    if params:
        out["parameters"] = params
    if op.body is not None:
        out["requestBody"] = {"required": True, "content": _content(op.body, refs)}
    out["responses"] = responses
    if op.public:
        out["security"] = []
    elif path == "/v1/ws":
        out["security"] = [{BEARER: []}, {ACCESS_TOKEN: []}]
    return out


def _operation_id(method: str, path: str) -> str:
    words = re.sub(r"[{}]", "", path).strip("/").replace(".", "_").replace("-", "_").split("/")
    if path.endswith("/") and path != "/":
        words.append("index")  # /ui/ next to /ui
    return "_".join([method.lower(), *(w for w in words if w)])


def build_document(app: web.Application) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``app``'s routes."""
    models = _models(app)
    schemas, top = models_json_schema([(model, "validation") for model in models], ref_template=REF)
    refs = {model: schemas[(model, "validation")] for model in models}
    components = dict(top.get("$defs", {}))
    paths: dict[str, dict[str, Any]] = {}
    for method, path in routes(app):
        paths.setdefault(path, {})[method.lower()] = _operation(method, path, OPERATIONS.get((method, path)), refs)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "turnlog",
            "version": _version(),
            "description": (
                "Chat turns recorded as an event log, over an OpenAI-compatible API. With `TURNLOG_AUTH=on` every "
                "operation except those with empty `security` needs `Authorization: Bearer KEY`. Every error is "
                '`{"error": {"message", "type", "code", "param"}}`. Generated from the service\'s routes and models.'
            ),
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "responses": {
                f"Error{status}": {"description": text, "content": {"application/json": {"schema": refs[m.ErrorResponse]}}} for status, text in ERRORS.items()
            },
            "headers": {
                "X-Turn-Id": {"description": "The turn's id.", "schema": {"type": "string"}},
                "X-Chat-Id": {"description": "The turn's chat id (empty when it has none).", "schema": {"type": "string"}},
            },
            "securitySchemes": {
                BEARER: {"type": "http", "scheme": "bearer", "description": "An API key from `turnlog keys create --user NAME` (only with `TURNLOG_AUTH=on`)."},
                ACCESS_TOKEN: {
                    "type": "apiKey",
                    "in": "query",
                    "name": "access_token",
                    "description": "The API key on a WebSocket upgrade (browsers cannot set headers there).",
                },
            },
        },
        "security": [{BEARER: []}],
    }


def _version() -> str:
    try:
        return version("turnlog")
    except PackageNotFoundError:
        return "0"


def setup(app: web.Application) -> None:
    built: list[dict[str, Any]] = []  # built on the first request: the router is frozen by then

    async def get_openapi(request: web.Request) -> web.Response:
        if not built:
            built.append(build_document(request.app))
        return web.json_response(built[0])

    app.router.add_get(OPENAPI_PATH, get_openapi)
