"""``/v1/responses``: the OpenAI Responses API over turns (docs/guides/responses-api.md).

A response is a turn: ``POST`` maps the body onto a turn request (the input
items become messages, ``instructions`` the system message, function ``tools``
client tools, ``previous_response_id`` the chat of that turn, so the stored
history continues whatever protocol the upstream speaks) and starts the turn;
everything read back (the object, the event stream, the input items) is a fold
of the turn's log (``responses_format``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, Literal, cast

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from adapters.http.auth import KEY_HASH, USER
from adapters.http.chat_ids import ChatIds
from adapters.http.chat_routes import serve_sse, start_turn
from adapters.http.context import Services, services
from adapters.http.errors import ApiError, turn_error
from adapters.http.response_deletions import ResponseDeletions
from adapters.http.responses_format import (
    RECORD_KEY,
    InputError,
    ResponsesRenderer,
    chat_tool_choice,
    chat_tools,
    fold_response,
    input_messages,
    response_of,
    turn_id_of,
)
from adapters.http.schemas import parse_chat_request, read_json, validate_body
from adapters.http.turn_routes import DamagedLog, _int_query, checked_turn_events, refuse_damaged
from engine.events import Event
from engine.fold.chat import chat_turn_views, history_messages
from engine.fold.turn_view import TurnView, fold
from engine.json_types import JsonValue
from engine.machine import TERMINAL_STATUSES
from engine.ports import TurnRecord
from engine.run.follow import Out, TurnFollower, follow
from engine.run.supervisor import TurnConflict

log = logging.getLogger("turnlog.http")

#: Model parameters of the Responses body that map onto the turn request.
_PARAMS = {"temperature": "temperature", "top_p": "top_p", "max_output_tokens": "max_tokens"}
NO_BACKGROUND_TASKS = {"title": False, "tags": False, "follow_ups": False}
#: The app's ``ResponseDeletions``, made on first use (the store opens at start-up).
DELETIONS = web.AppKey("turnlog_response_deletions", dict)


def _deletions(request: web.Request) -> ResponseDeletions:
    holder: dict[str, ResponseDeletions] = request.app[DELETIONS]
    if "it" not in holder:
        holder["it"] = ResponseDeletions(services(request).store.engine)  # type: ignore[attr-defined]
    return holder["it"]


class ResponsesRequest(BaseModel):
    """The Responses API body plus turnlog's extensions. Fields a client library
    sends that do not change a turn (``include``, ``truncation``, …) are accepted
    and ignored."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    previous_response_id: str | None = None
    store: bool | None = None
    stream: bool | None = None
    background: bool | None = None
    metadata: dict[str, str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    parallel_tool_calls: bool | None = None
    # turnlog's extensions, as on /v1/chat/completions
    tool_ids: list[str] | None = None
    features: dict[str, bool] | None = None
    files: list[dict[str, Any]] | None = None
    params: dict[str, Any] | None = None
    background_tasks: dict[str, bool] | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None


def _bad(exc: InputError) -> ApiError:
    return ApiError(400, str(exc), code="invalid_value", param=exc.param)


async def _previous(svc: Services, previous_id: str, user: str, deletions: ResponseDeletions) -> TurnRecord:
    """The turn ``previous_response_id`` names: the user's, stored, not deleted, ended."""
    turn_id = turn_id_of(previous_id)
    record = await svc.store.get_turn(turn_id) if turn_id else None
    if record is None or record.user_id != user or await deletions.deleted(record.id):
        raise ApiError(
            404, f"Previous response with id '{previous_id}' not found.", "invalid_request_error", "previous_response_not_found", "previous_response_id"
        )
    view = await _started(svc, record.id)
    recorded = view.request.get(RECORD_KEY)
    if (recorded if isinstance(recorded, dict) and recorded else {"store": False}).get("store") is False:
        raise ApiError(
            404,
            f"Previous response with id '{previous_id}' not found (it was created with store: false, or not through /v1/responses).",
            "invalid_request_error",
            "previous_response_not_found",
            "previous_response_id",
        )
    if record.status not in TERMINAL_STATUSES:
        raise ApiError(409, f"Previous response '{previous_id}' is still in progress.", "invalid_request_error", "response_in_progress", "previous_response_id")
    return record


async def _continuation(svc: Services, previous: TurnRecord) -> tuple[str | None, list[dict[str, Any]] | None]:
    """How a response continues ``previous``: in its chat when it is the chat's
    latest turn (the stored history is prepended as for any turn of the chat);
    else (a branch from an earlier response) in a new chat whose first turn
    sends the conversation up to ``previous`` itself, expanded from the log."""
    records = await svc.store.list_turns(chat_id=previous.chat_id, limit=10_000)
    if not any((r.created_at, r.id) > (previous.created_at, previous.id) for r in records):
        return previous.chat_id, None
    views = await chat_turn_views(svc.store, previous.chat_id)
    upto = next(i for i, view in enumerate(views) if view.id == previous.id)
    return None, history_messages(views[: upto + 1])


def turn_request(body: ResponsesRequest, chat_id: str | None, history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The turn request (Chat Completions shape with extensions) of a Responses
    body; ``history``: the conversation to send before its input (a branch)."""
    try:
        messages = [*(history or []), *input_messages(body.input)]
        request: dict[str, Any] = {"model": body.model, "messages": messages, "stream": bool(body.stream)}
        if body.instructions:
            request["messages"] = [{"role": "system", "content": body.instructions}, *messages]
        if body.tools:
            request["tools"] = chat_tools(body.tools)
            if body.parallel_tool_calls is not None:
                request["parallel_tool_calls"] = body.parallel_tool_calls
        if body.tool_choice is not None and body.tools:
            request["tool_choice"] = chat_tool_choice(body.tool_choice)
    except InputError as exc:
        raise _bad(exc) from exc
    for name, key in _PARAMS.items():
        value = getattr(body, name)
        if value is not None:
            request[key] = value
    for name in ("tool_ids", "features", "files", "params"):
        value = getattr(body, name)
        if value is not None:
            request[name] = value
    # A plain Responses call writes no title, tags or follow-ups unless asked.
    request["background_tasks"] = body.background_tasks if body.background_tasks is not None else NO_BACKGROUND_TASKS
    if chat_id:
        request["chat_id"] = chat_id
    record: dict[str, Any] = {"input": body.input, "store": body.store is not False, "background": bool(body.background)}
    for name in ("instructions", "previous_response_id", "metadata"):
        value = getattr(body, name)
        if value is not None:
            record[name] = value
    request[RECORD_KEY] = record
    return request


async def create_response(request: web.Request) -> web.StreamResponse:
    svc = services(request)
    user = request[USER]
    body = validate_body(ResponsesRequest, await read_json(request))
    if body.background and body.store is False:
        raise ApiError(400, "background responses need store: true", code="invalid_value", param="background")
    chat_id, branch = None, None
    if body.previous_response_id:
        previous = await _previous(svc, body.previous_response_id, user, _deletions(request))
        chat_id, branch = await _continuation(svc, previous)
    chat_request = parse_chat_request(turn_request(body, chat_id, branch))
    # (a response's chat is one the service named: its id is not scoped)
    actor = await start_turn(svc, chat_request, user, ChatIds.of(request), request[KEY_HASH], language=request.headers.get("Accept-Language"))
    headers = {"X-Turn-Id": actor.turn_id, "X-Chat-Id": actor.view.chat_id or ""}
    if body.stream:
        return await stream_response(request, actor.turn_id, headers=headers)
    if body.background:
        obj, _ = _folded(actor.turn_id, await svc.store.read(actor.turn_id))
        obj["status"] = "queued" if obj["status"] == "in_progress" and not obj["output"] else obj["status"]
        return web.json_response(obj, headers=headers)
    # Final once the turn ends or only its background tasks are left.
    await asyncio.shield(actor.answered)
    # The actor's committed events are the log (no read needed), unless it
    # stopped writing midway.
    history = actor.history()
    events = history if history is not None and not actor.lost else await svc.store.read(actor.turn_id)
    obj, view = _folded(actor.turn_id, events)
    if view.status == "failed":
        # As the Responses API answers a request it refuses: an error, not a response.
        answer = turn_error(view.error or {})
        return web.json_response(answer.body(), status=answer.status, headers={**headers, **answer.headers()})
    return web.json_response(obj, headers=headers)


async def stream_response(request: web.Request, turn_id: str, *, headers: dict[str, str], starting_after: int = -1) -> web.StreamResponse:
    """The Responses SSE of a turn from after ``starting_after``, then live, until
    the response ends. The client going away only ends this response."""
    return await serve_sse(
        request,
        turn_id,
        headers=headers,
        make_renderer=lambda view: ResponsesRenderer(view, starting_after=starting_after),
        error_event=(
            b'event: error\ndata: {"type":"error","code":"stream_error",'
            b'"message":"stream interrupted; resume with GET /v1/responses/{id}?stream=true&starting_after=N","param":null}\n\n'
        ),
    )


async def _own(request: web.Request) -> tuple[Services, TurnRecord, str]:
    """The caller's stored response named in the path, else 404."""
    svc = services(request)
    rid = request.match_info["response_id"]
    turn_id = turn_id_of(rid)
    record = await svc.store.get_turn(turn_id) if turn_id else None
    if record is None or record.user_id != request[USER] or await _deletions(request).deleted(record.id):
        raise ApiError(404, f"Response with id '{rid}' not found.", "not_found_error", "not_found")
    return svc, record, rid


def _stored(view: TurnView, rid: str) -> None:
    record = view.request.get(RECORD_KEY)
    if not isinstance(record, dict) or record.get("store") is False:
        # A turn started elsewhere (chat completions) is no response; one created
        # with store: false cannot be retrieved.
        raise ApiError(404, f"Response with id '{rid}' not found.", "not_found_error", "not_found")


async def _started(svc: Services, turn_id: str) -> TurnView:
    """The turn as its first event says: the request it was started with."""
    return _folded_view(turn_id, await svc.store.read(turn_id, limit=1))


def _folded_view(turn_id: str, events: list[Event]) -> TurnView:
    try:
        return fold(turn_id, events)
    except (ValueError, KeyError, TypeError) as exc:
        raise DamagedLog(turn_id, f"the log cannot be folded: {exc}") from None


def _folded(turn_id: str, events: list[Event]) -> tuple[dict[str, Any], TurnView]:
    """``fold_response``; a log it cannot fold is a 409 ``damaged_log``, as for the turn."""
    try:
        return fold_response(turn_id, events)
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("turn %s: its log does not fold: %s", turn_id, exc)
        raise DamagedLog(turn_id, f"the log cannot be folded: {exc}") from None


async def get_response(request: web.Request) -> web.StreamResponse:
    """The response object; a log whose hash chain is damaged is a 409
    ``damaged_log`` (checked before a stream too, once the turn has ended)."""
    svc, record, rid = await _own(request)
    headers = {"X-Turn-Id": record.id, "X-Chat-Id": record.chat_id}
    stream = request.query.get("stream", "false").lower()
    if stream not in ("true", "false", "1", "0"):
        raise ApiError(400, "query parameter 'stream' must be true or false", code="invalid_value", param="stream")
    if stream in ("true", "1"):
        after = _int_query(request, "starting_after", -1, minimum=-1)
        after = -1 if after is None else after
        _stored(await _started(svc, record.id), rid)
        await refuse_damaged(svc, record)
        return await stream_response(request, record.id, headers=headers, starting_after=after)
    if record.status in TERMINAL_STATUSES:
        obj, view = _folded(record.id, await checked_turn_events(svc, record.id))
        _stored(view, rid)
        return web.json_response(obj, headers=headers)
    _stored(await _started(svc, record.id), rid)
    return web.json_response(await _running(svc, record.id), headers=headers)


async def _running(svc: Services, turn_id: str) -> dict[str, Any]:
    """A running response as a client joining its stream now would see it: the
    log and the chunks of the open window (not yet written to the log)."""
    # ``follow`` is an async generator: closed here, its subscription ends at once.
    followed = cast(AsyncGenerator[tuple[TurnFollower, list[Out]], None], follow(svc.store, svc.supervisor.join, turn_id))
    async with aclosing(followed):
        async for follower, outs in followed:
            return response_of(follower.view, outs)
    raise DamagedLog(turn_id, "the log cannot be followed")  # follow yields the catch-up first: not reached


async def cancel_response(request: web.Request) -> web.Response:
    """Cancels a running response (its partial output is kept); one that has
    ended is returned as it is."""
    svc, record, rid = await _own(request)
    view = await _started(svc, record.id)
    _stored(view, rid)
    try:
        await svc.supervisor.cancel(record.id, request[USER])
    except TurnConflict:
        pass  # already ended (or ending): the object says how
    except KeyError as exc:
        raise ApiError(404, f"Response with id '{rid}' not found.", "not_found_error", "not_found") from exc
    obj, _ = _folded(record.id, await svc.store.read(record.id))
    return web.json_response(obj)


async def input_items(request: web.Request) -> web.Response:
    svc, record, rid = await _own(request)
    view = await _started(svc, record.id)
    _stored(view, rid)
    order = request.query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError(400, "query parameter 'order' must be asc or desc", code="invalid_value", param="order")
    limit = min(_int_query(request, "limit", 20, minimum=1) or 20, 100)
    items = recorded_input_items(view)
    if order == "desc":
        items.reverse()
    after = request.query.get("after")
    if after:
        ids = [i["id"] for i in items]
        if after not in ids:
            raise ApiError(400, f"no input item '{after}' in this response", code="invalid_value", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return web.json_response(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }
    )


def recorded_input_items(view: TurnView) -> list[dict[str, Any]]:
    """The response's ``input`` as recorded, as Responses input items with
    stable ids."""
    record = view.request.get(RECORD_KEY)
    raw = record.get("input") if isinstance(record, dict) else None
    items: list[JsonValue] = [{"type": "message", "role": "user", "content": raw}] if isinstance(raw, str) else raw if isinstance(raw, list) else []
    out = []
    for i, given in enumerate(items):
        if not isinstance(given, dict):
            continue
        item = dict(given)
        kind = item.get("type") or ("message" if "role" in item else None)
        item["type"] = kind
        if kind == "message":
            content = item.get("content")
            if isinstance(content, str):
                part = "output_text" if item.get("role") == "assistant" else "input_text"
                item["content"] = [{"type": part, "text": content}]
            item.setdefault("status", "completed")
        item["id"] = item.get("id") or f"in_{view.id}_{i}"
        out.append(item)
    return out


async def delete_response(request: web.Request) -> web.Response:
    """Deletes an ended response from the Responses API (404 from then on);
    the turn's log stays as the audit record (``response_deletions``)."""
    svc, record, rid = await _own(request)
    view = await _started(svc, record.id)
    _stored(view, rid)
    if record.status not in TERMINAL_STATUSES:
        raise ApiError(
            409,
            f"Response '{rid}' is {record.status}: cancel it (POST /v1/responses/{rid}/cancel) before deleting it",
            "invalid_request_error",
            "response_in_progress",
        )
    if not await _deletions(request).delete(record.id, request[USER]):
        raise ApiError(404, f"Response with id '{rid}' not found.", "not_found_error", "not_found")
    return web.json_response({"id": rid, "object": "response", "deleted": True})


def setup(app: web.Application) -> None:
    app[DELETIONS] = {}
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    app.router.add_post("/v1/responses/{response_id}/cancel", cancel_response)
    app.router.add_get("/v1/responses/{response_id}/input_items", input_items)
