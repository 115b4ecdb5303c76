"""Turns and chats as projections of the log (API.md §3)."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from adapters.http.auth import USER
from adapters.http.chat_routes import stream_turn
from adapters.http.context import Services, services
from adapters.http.errors import ApiError, not_found
from engine.fold.chat import chat_messages, chat_turn_views
from engine.fold.turn_view import TurnView, fold
from engine.ports import TurnRecord
from engine.run.supervisor import TurnConflict


def _int_query(request: web.Request, name: str, default: int | None = None, minimum: int = 0) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ApiError(400, f"query parameter '{name}' must be an integer", code="invalid_value", param=name) from exc
    if value < minimum:
        raise ApiError(400, f"query parameter '{name}' must be >= {minimum}", code="invalid_value", param=name)
    return value


async def _own_turn(request: web.Request) -> TurnRecord:
    svc = services(request)
    record = await svc.store.get_turn(request.match_info["turn_id"])
    if record is None or record.user_id != request[USER]:
        raise not_found("turn")
    return record


def _public(svc: Services, record: TurnRecord, view: TurnView) -> dict[str, Any]:
    out = view.public()
    # No terminal event and nobody holding the lease: the owner is gone.
    if out["status"] == "running" and record.id not in svc.supervisor.actors:
        if record.lease_until is None or record.lease_until < time.time():
            out["status"] = "interrupted"
    return out


async def get_turn(request: web.Request) -> web.Response:
    svc = services(request)
    record = await _own_turn(request)
    view = fold(record.id, await svc.store.read(record.id))
    return web.json_response(_public(svc, record, view))


async def get_events(request: web.Request) -> web.Response:
    svc = services(request)
    record = await _own_turn(request)
    after = _int_query(request, "after", 0) or 0
    limit = _int_query(request, "limit", 1000, minimum=1)
    events = await svc.store.read(record.id, after=after, limit=min(limit or 1000, 10_000))
    return web.json_response(
        {"events": [e.public() for e in events], "next_after": events[-1].seq if events else after}
    )


async def get_stream(request: web.Request) -> web.StreamResponse:
    record = await _own_turn(request)
    raw = request.headers.get("Last-Event-ID") or request.query.get("after") or "0"
    try:
        after = int(raw)
    except ValueError as exc:
        raise ApiError(400, "Last-Event-ID / after must be an integer stream position", code="invalid_value") from exc
    include_usage = request.query.get("include_usage", "").lower() in ("1", "true")
    return await stream_turn(
        request,
        record.id,
        headers={"X-Turn-Id": record.id, "X-Chat-Id": record.chat_id},
        after=after,
        include_usage=include_usage,
    )


async def get_replay(request: web.Request) -> web.Response:
    svc = services(request)
    record = await _own_turn(request)
    upto = _int_query(request, "upto", None, minimum=0)
    view = fold(record.id, await svc.store.read(record.id), upto=upto)
    return web.json_response(view.public())


async def post_cancel(request: web.Request) -> web.Response:
    svc = services(request)
    record = await _own_turn(request)
    try:
        status = await svc.supervisor.cancel(record.id, by=request[USER])
    except TurnConflict as exc:
        raise ApiError(409, str(exc), "conflict_error", "turn_not_running") from exc
    return web.json_response({"id": record.id, "status": status}, status=202)


async def post_resume(request: web.Request) -> web.Response:
    svc = services(request)
    record = await _own_turn(request)
    try:
        actor = await svc.supervisor.resume(record.id)
    except TurnConflict as exc:
        raise ApiError(409, str(exc), "conflict_error", "turn_not_interrupted") from exc
    return web.json_response({"id": record.id, "status": actor.view.status}, status=202)


async def get_chat(request: web.Request) -> web.Response:
    svc = services(request)
    chat = await svc.store.get_chat(request.match_info["chat_id"])
    if chat is None or chat.user_id != request[USER]:
        raise not_found("chat")
    views = await chat_turn_views(svc.store, chat.id)
    return web.json_response(
        {
            "id": chat.id,
            "title": chat.title,
            "tags": chat.tags,
            "created_at": chat.created_at,
            "updated_at": chat.updated_at,
            "messages": chat_messages(views),
        }
    )


async def list_chats(request: web.Request) -> web.Response:
    svc = services(request)
    limit = _int_query(request, "limit", 50, minimum=1) or 50
    before_raw = request.query.get("before")
    before = None
    if before_raw:
        try:
            before = float(before_raw)
        except ValueError as exc:
            raise ApiError(400, "query parameter 'before' must be a timestamp", code="invalid_value", param="before") from exc
    chats = await svc.store.list_chats(request[USER], limit=min(limit, 500), before=before)
    return web.json_response(
        {
            "data": [
                {"id": c.id, "title": c.title, "tags": c.tags, "created_at": c.created_at, "updated_at": c.updated_at}
                for c in chats
            ]
        }
    )


def setup(app: web.Application) -> None:
    app.router.add_get("/v1/turns/{turn_id}", get_turn)
    app.router.add_get("/v1/turns/{turn_id}/events", get_events)
    app.router.add_get("/v1/turns/{turn_id}/stream", get_stream)
    app.router.add_get("/v1/turns/{turn_id}/replay", get_replay)
    app.router.add_post("/v1/turns/{turn_id}/cancel", post_cancel)
    app.router.add_post("/v1/turns/{turn_id}/resume", post_resume)
    app.router.add_get("/v1/chats/{chat_id}", get_chat)
    app.router.add_get("/v1/chats", list_chats)
