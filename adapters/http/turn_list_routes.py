"""``GET /v1/turns``: find a turn (filters, full text, keyset paging), and the
inspector's views beside it: counts (``GET /v1/ui/turns/counts``) and chats
named by their first message (``GET /v1/ui/chats``).

``q`` is full-text over each turn's new user messages and its answer
(``adapters.store.turn_search`` says exactly how); ``status``, ``model``,
``chat_id``, ``since``/``until`` (Unix seconds or ISO 8601, ``until``
exclusive), ``tools``
and ``failed`` (``true``/``false``) filter; ``before`` is the ``next_before`` of
the previous page (a turn id) or a Unix time. An admin may add ``user=`` to
read another user's turns.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from adapters.http.auth import ROLE, SCOPED, USER
from adapters.http.chat_ids import ChatIds, user_prefix
from adapters.http.context import services
from adapters.http.errors import ApiError
from adapters.http.turn_routes import _int_query
from adapters.store.turn_search import FoundTurn, QueryError, TurnQuery, chat_openers, count_turns, find_turns, models_in_use, parse_query

STATUSES = ("running", "completed", "cancelled", "failed", "interrupted", "waiting")
PAGE = 25
MAX_PAGE = 200


def _invalid(name: str, message: str) -> ApiError:
    return ApiError(400, message, code="invalid_value", param=name)


def _time(request: web.Request, name: str) -> float | None:
    raw = request.query.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(raw)
        except ValueError:
            raise _invalid(name, f"query parameter '{name}' must be a Unix time or an ISO 8601 date") from None
        # A date or time without a zone is UTC (the service's clock).
        return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()
    if not math.isfinite(value):
        raise _invalid(name, f"query parameter '{name}' must be a finite number")
    return value


def _flag(request: web.Request, name: str) -> bool | None:
    raw = request.query.get(name, "").strip().lower()
    if not raw:
        return None
    if raw in ("true", "1", "yes"):
        return True
    if raw in ("false", "0", "no"):
        return False
    raise _invalid(name, f"query parameter '{name}' must be true or false")


def _target_user(request: web.Request) -> str:
    """The caller, or (an admin's ``user=``) the user whose turns are listed."""
    named = request.query.get("user")
    if not named or named == request[USER]:
        return request[USER]
    if request.get(ROLE) != "admin":
        raise ApiError(403, "query parameter 'user' needs an admin key", "permission_error", "admin_required", "user")
    return named


async def _before(request: web.Request, user: str) -> tuple[float, str | None] | None:
    raw = request.query.get("before", "").strip()
    if not raw:
        return None
    try:
        at = float(raw)
    except ValueError:
        pass
    else:
        if math.isfinite(at):
            return (at, None)
    record = await services(request).store.get_turn(raw)
    if record is None or record.user_id != user or record.created_at is None:
        raise _invalid("before", "query parameter 'before' must be the next_before of a page (a turn id of yours) or a Unix time")
    return (record.created_at, record.id)


async def _query(request: web.Request, user: str, *, limit: int = PAGE) -> TurnQuery:
    svc = services(request)
    status = request.query.get("status") or None
    if status is not None and status not in STATUSES:
        raise _invalid("status", f"status must be one of {', '.join(STATUSES)}")
    try:
        terms = parse_query(request.query.get("q", ""))
    except QueryError as exc:
        raise _invalid("q", str(exc)) from None
    return TurnQuery(
        user_id=user,
        terms=terms,
        status=status,
        model=request.query.get("model") or None,
        chat_ids=_ids(request, user).candidates(chat_id) if (chat_id := request.query.get("chat_id")) else (),
        since=_time(request, "since"),
        until=_time(request, "until"),
        tools=_flag(request, "tools"),
        failed=_flag(request, "failed"),
        before=await _before(request, user),
        limit=limit,
        live=list(svc.supervisor.actors),
    )


def _ids(request: web.Request, user: str) -> ChatIds:
    """Chat ids as their owner sees them (an admin reading another's turns too)."""
    return ChatIds(user, user_prefix(user) if request.get(SCOPED) else "")


def _item(found: FoundTurn, ids: ChatIds) -> dict[str, Any]:
    item: dict[str, Any] = {
        "id": found.id,
        "chat_id": ids.shown(found.chat_id),
        "status": found.status,
        "model": found.model,
        "first_message": found.first_message,
        "created_at": found.created_at,
        "updated_at": found.updated_at,
        "used_tools": found.tools,
        "chat_title": found.chat_title,
    }
    if found.title is not None:
        item["title"] = found.title
    return item


async def list_turns(request: web.Request) -> web.Response:
    user = _target_user(request)
    limit = min(_int_query(request, "limit", PAGE, minimum=1) or PAGE, MAX_PAGE)
    # One more than the page says whether another follows.
    query = await _query(request, user, limit=limit + 1)
    found = await find_turns(services(request).store, query)
    page = found[:limit]
    ids = _ids(request, user)
    return web.json_response({"data": [_item(f, ids) for f in page], "next_before": page[-1].id if len(found) > limit else None})


async def turn_counts(request: web.Request) -> web.Response:
    """How many turns the filters (status aside) match, in all and by status,
    and the models the user's turns use (what the model filter offers)."""
    user = _target_user(request)
    store = services(request).store
    counts = await count_turns(store, await _query(request, user))
    return web.json_response({"total": sum(counts.values()), "by_status": counts, "models": await models_in_use(store, user)})


async def list_chats(request: web.Request) -> web.Response:
    """``GET /v1/chats`` for the inspector: each chat also with the first new
    user message of its first turn (``first_message``), which names a chat
    without a title."""
    store = services(request).store
    limit = min(_int_query(request, "limit", PAGE, minimum=1) or PAGE, MAX_PAGE)
    before = _time(request, "before")
    chats = await store.list_chats(request[USER], limit=limit, before=before)
    openers = await chat_openers(store, [c.id for c in chats])
    ids = ChatIds.of(request)
    data = [
        {
            "id": ids.shown(c.id),
            "title": c.title,
            "tags": c.tags,
            "first_message": openers.get(c.id),
            "created_at": c.created_at,
            "updated_at": c.updated_at,
        }
        for c in chats
    ]
    return web.json_response({"data": data})


def setup(app: web.Application) -> None:
    app.router.add_get("/v1/turns", list_turns)
    app.router.add_get("/v1/ui/chats", list_chats)
    app.router.add_get("/v1/ui/turns/counts", turn_counts)
