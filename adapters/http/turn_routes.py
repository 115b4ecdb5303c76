"""Turns and chats as projections of the log (docs/reference/turns.md)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web

from adapters.checked_log import DamagedTurn, checked_chain, checked_events, checked_fold
from adapters.config import Settings
from adapters.http.auth import USER
from adapters.http.chat_ids import ChatIds
from adapters.http.chat_routes import stream_turn
from adapters.http.context import Services, services
from adapters.http.errors import ApiError, not_found
from adapters.receipts import load_private_key, receipt
from engine.chain import GENESIS, Damage, check, parse_hash
from engine.events import Event
from engine.fold.chat import chat_messages, chat_turn_views
from engine.fold.spans import spans
from engine.fold.turn_view import TurnView
from engine.ports import TurnRecord
from engine.run.supervisor import TurnConflict

log = logging.getLogger("turnlog.http")

#: The Ed25519 key receipts are signed with (``TURNLOG_RECEIPT_KEY``), or None.
RECEIPT_KEY = web.AppKey("turnlog_receipt_key", object)

#: How long ``GET …/verify`` lets the re-run take before it answers that it did not finish.
VERIFY_TIMEOUT = 60.0


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


class DamagedLog(ApiError):
    """409 ``damaged_log``, the error naming the damage: ``{"error": {"message",
    "type", "code", "damage": {"seq", "kind", "message"}}}``."""

    def __init__(self, turn_id: str, message: str, damage: Damage | None = None) -> None:
        super().__init__(
            409,
            f"turn {turn_id}: damaged log: {message} (GET /v1/turns/{turn_id}/verify)",
            "conflict_error",
            "damaged_log",
            extra={"damage": damage.public()} if damage is not None else None,
        )


def _refused(exc: DamagedTurn) -> DamagedLog:
    if exc.damage is None:
        log.warning("turn %s: its log does not fold: %s", exc.turn_id, exc.what)
    return DamagedLog(exc.turn_id, exc.what, exc.damage)


async def checked_turn_events(svc: Services, turn_id: str) -> list[Event]:
    """The turn's events, after its chain is checked (409 ``damaged_log`` if not)."""
    try:
        return await checked_events(svc.store, turn_id)
    except DamagedTurn as exc:
        raise _refused(exc) from None


async def refuse_damaged(svc: Services, record: TurnRecord) -> None:
    """409 ``damaged_log`` before a stream (or a fork) of a turn that is no
    longer running: a stream of a damaged log would otherwise stop at the
    damage with nothing said. A running turn is not checked: its log is being
    written, and checking it on every reconnect would read it all once more."""
    if record.status == "running":
        return
    _stored, result = await checked_chain(svc.store, record.id)
    if result.damage is not None:
        raise DamagedLog(record.id, result.damage.message, result.damage)


def _fold(turn_id: str, events: list[Event], upto: int | None = None) -> TurnView:
    """The fold, a log it cannot fold (whatever its chain says) a 409."""
    try:
        return checked_fold(turn_id, events, upto=upto)
    except DamagedTurn as exc:
        raise _refused(exc) from None


def _public(svc: Services, record: TurnRecord, view: TurnView, ids: ChatIds) -> dict[str, Any]:
    out = ids.view(view.public())
    # No terminal event and nobody holding the lease: the owner is gone.
    if out["status"] == "running" and record.id not in svc.supervisor.actors:
        if record.lease_until is None or record.lease_until < time.time():
            out["status"] = "interrupted"
    return out


async def get_turn(request: web.Request) -> web.Response:
    svc = services(request)
    record = await _own_turn(request)
    view = _fold(record.id, await checked_turn_events(svc, record.id))
    return web.json_response(_public(svc, record, view, ChatIds.of(request)))


async def get_events(request: web.Request) -> web.Response:
    svc = services(request)
    record = await _own_turn(request)
    after = _int_query(request, "after", 0) or 0
    limit = min(_int_query(request, "limit", 1000, minimum=1) or 1000, 10_000)
    # The page is checked against its chain from the stored hash of the event
    # before it.
    stored = await svc.store.read_chain(record.id, after=max(after - 1, 0), limit=limit + (after > 0))
    previous = GENESIS
    if after > 0 and stored:
        if stored[0].seq == after:
            previous, stored = parse_hash(stored[0].hash) or GENESIS, stored[1:]
        else:
            damage = Damage(after, "deleted", f"seq {after} missing: deleted", 0)
            raise DamagedLog(record.id, damage.message, damage)
    if stored:
        result = check(record.id, stored, previous=previous, first_seq=after + 1)
        if result.damage is not None:
            damage = result.damage
            if damage.index == 0 and after > 0:
                # The page's first event does not chain from seq ``after``'s
                # stored hash: either may be the damaged one. The log from seq
                # 1 up to there says which.
                prefix = check(record.id, await svc.store.read_chain(record.id, limit=after + 1))
                damage = prefix.damage or damage
            raise DamagedLog(record.id, damage.message, damage)
    events = [e.event() for e in stored]
    ids = ChatIds.of(request)
    return web.json_response({"events": [ids.event(e.public()) for e in events], "next_after": events[-1].seq if events else after})


async def get_stream(request: web.Request) -> web.StreamResponse:
    record = await _own_turn(request)
    raw = request.headers.get("Last-Event-ID") or request.query.get("after") or "0"
    try:
        after = int(raw)
    except ValueError as exc:
        raise ApiError(400, "Last-Event-ID / after must be an integer stream position", code="invalid_value") from exc
    include_usage = request.query.get("include_usage", "").lower() in ("1", "true")
    await refuse_damaged(services(request), record)
    return await stream_turn(
        request,
        record.id,
        headers={"X-Turn-Id": record.id, "X-Chat-Id": ChatIds.of(request).shown(record.chat_id) or ""},
        after=after,
        include_usage=include_usage,
    )


async def get_replay(request: web.Request) -> web.Response:
    svc = services(request)
    record = await _own_turn(request)
    upto = _int_query(request, "upto", None, minimum=0)
    view = _fold(record.id, await checked_turn_events(svc, record.id), upto=upto)
    return web.json_response(ChatIds.of(request).view(view.public()))


async def get_verify(request: web.Request) -> web.Response:
    """What ``turnlog verify`` checks: the chain, then the re-run of the engine."""
    from adapters.store.memory import MemoryEventStore
    from engine.run.verify import verify_turn

    svc = services(request)
    record = await _own_turn(request)
    stored, result = await checked_chain(svc.store, record.id)
    out: dict[str, Any] = {"ok": False, "diff": [], "turn_id": record.id, "events": len(stored)}
    if result.damage is not None:
        out["diff"] = [result.damage.message]
        out["damage"] = result.damage.public()
        return web.json_response(out)
    out["head"] = result.head
    if record.status == "running":  # the re-run would wait for the events still to come
        raise ApiError(
            409,
            f"turn {record.id} has not ended: its hash chain holds ({len(stored)} events); verify it once it has ended",
            "conflict_error",
            "turn_not_ended",
        )
    scratch = MemoryEventStore()
    try:
        verdict = await asyncio.wait_for(verify_turn([e.event() for e in stored], scratch), VERIFY_TIMEOUT)
    except TimeoutError:
        out["diff"] = [f"the re-run did not finish within {VERIFY_TIMEOUT:g} s"]
        return web.json_response(out)
    finally:
        await scratch.close()
    out["ok"], out["diff"] = verdict.ok, verdict.diff
    return web.json_response(out)


async def get_receipt(request: web.Request) -> web.Response:
    svc = services(request)
    record = await _own_turn(request)
    _, result = await checked_chain(svc.store, record.id)
    if result.damage is not None:
        raise DamagedLog(record.id, result.damage.message, result.damage)
    return web.json_response(receipt(record.id, result, request.app[RECEIPT_KEY]))


async def get_spans(request: web.Request) -> web.Response:
    """The turn's spans and marks (``engine.fold.spans``), from its whole log in
    one read: a chart of a 10,000-event turn needs no paging through events.
    Like a timeline page it is a view, not a check (``/verify`` is); a SQL
    store reads it without the deltas' text, which spans do not use."""
    svc = services(request)
    record = await _own_turn(request)
    outline = getattr(svc.store, "read_outline", None)
    events = await outline(record.id) if outline is not None else await svc.store.read(record.id)
    return web.json_response(spans(record.id, events))


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
    ids = ChatIds.of(request)
    chat = await svc.store.get_chat(await ids.stored(svc.store, request.match_info["chat_id"]))
    if chat is None or chat.user_id != request[USER]:
        raise not_found("chat")
    try:
        views = await chat_turn_views(svc.store, chat.id)
    except (ValueError, KeyError, TypeError) as exc:  # a turn whose log does not fold
        log.warning("chat %s: a turn's log does not fold: %s", chat.id, exc)
        raise ApiError(409, f"chat {chat.id}: damaged log: {exc}", "conflict_error", "damaged_log") from None
    return web.json_response(
        {
            "id": ids.shown(chat.id),
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
    ids = ChatIds.of(request)
    return web.json_response(
        {"data": [{"id": ids.shown(c.id), "title": c.title, "tags": c.tags, "created_at": c.created_at, "updated_at": c.updated_at} for c in chats]}
    )


def setup(app: web.Application, settings: Settings) -> None:
    app[RECEIPT_KEY] = load_private_key(settings.receipt_key) if settings.receipt_key else None
    app.router.add_get("/v1/turns/{turn_id}", get_turn)
    app.router.add_get("/v1/turns/{turn_id}/verify", get_verify)
    app.router.add_get("/v1/turns/{turn_id}/receipt", get_receipt)
    app.router.add_get("/v1/turns/{turn_id}/spans", get_spans)
    app.router.add_get("/v1/turns/{turn_id}/events", get_events)
    app.router.add_get("/v1/turns/{turn_id}/stream", get_stream)
    app.router.add_get("/v1/turns/{turn_id}/replay", get_replay)
    app.router.add_post("/v1/turns/{turn_id}/cancel", post_cancel)
    app.router.add_post("/v1/turns/{turn_id}/resume", post_resume)
    app.router.add_get("/v1/chats/{chat_id}", get_chat)
    app.router.add_get("/v1/chats", list_chats)
