"""The inspector: a page for people, served by turnlog itself.

``GET /ui/`` (chats and turns) and ``GET /ui/turns/{id}`` (one turn) answer the
same static page (``adapters/ui/static``: plain HTML, CSS and JavaScript, no
build step, nothing fetched from elsewhere). The page itself needs no key: it
asks for one when the API answers 401, keeps it in the tab's
``sessionStorage`` and sends it as ``Authorization: Bearer`` on every call.

Besides the public API (``/v1/turns/{id}``, ``/events``, ``/replay``,
``/stream``, ``/cancel``, ``/verify``, ``/receipt``) it reads views made
for it, under ``/v1/ui`` and so behind the same authentication:

* ``GET /v1/ui/turns?status=&model=&chat_id=&offset=&limit=``: the user's
  turns, newest first, one page, with the chat's title and the models in use;
* ``GET /v1/ui/turns/{id}/summary``: the turn view plus what the page shows
  beside it: the messages each model request sent, each tool call with its
  duration, the iteration count, the failures and warnings;
* ``GET /v1/ui/turns/{id}/timeline?after=&limit=``: one page of events, each
  with the state the turn was in after it;
* ``GET /v1/ui/turns/{id}/forks``: the turn's forks (the ``turn_forks`` index).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from aiohttp import web
from sqlalchemy import and_, not_, or_, select

from adapters.http.auth import USER
from adapters.http.chat_ids import ChatIds
from adapters.http.context import Services, services
from adapters.http.errors import ApiError
from adapters.http.turn_routes import DamagedLog, _fold, _int_query, _own_turn, _public, checked_turn_events
from adapters.store.fork_index import forks_of
from adapters.store.schema import chats, turns
from engine.events import Event
from engine.fold.turn_view import TurnView
from engine.run.loop_state import LoopState

STATIC = Path(__file__).resolve().parent.parent / "ui" / "static"
STATUSES = ("running", "completed", "cancelled", "failed", "interrupted", "waiting")
TIMELINE_PAGE = 200
TIMELINE_MAX = 1000


#: On every file of the page: nothing but its own files may run or load (no
#: inline script or style: an injected one does nothing), no other site may
#: frame it (clickjacking), no content sniffing, no Referer with a turn id.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


async def page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache", **SECURITY_HEADERS})


async def static_file(request: web.Request) -> web.FileResponse:
    """One of the page's files; any other name is a 404 in the API's error shape
    (aiohttp's own static handler answers an empty one)."""
    name = request.match_info["filename"]
    path = STATIC / name
    try:
        found = path.name == name and path.is_file()
    except (OSError, ValueError):  # a name no file system has (a NUL byte, too long)
        found = False
    if not found:
        raise ApiError(404, "file not found", "not_found_error", "not_found")
    return web.FileResponse(path, headers=SECURITY_HEADERS)


async def to_page(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/ui/")


async def _fetch(svc: Services, stmt: Any) -> list[Any]:
    """Rows of a read-only query, through the store's own read path."""
    fetch = getattr(svc.store, "_fetch", None)
    if fetch is None:
        raise ApiError(501, "the inspector's listing needs a SQL event store", "api_error", "not_supported")
    return list(await fetch(stmt))


def _listed_status(svc: Services, row: Any) -> str:
    """As ``GET /v1/turns/{id}`` says it: a running turn nobody owns is interrupted."""
    if row.status == "running" and row.id not in svc.supervisor.actors:
        if row.lease_until is None or row.lease_until < time.time():
            return "interrupted"
    return str(row.status)


async def list_turns(request: web.Request) -> web.Response:
    svc = services(request)
    user = request[USER]
    limit = min(_int_query(request, "limit", 25, minimum=1) or 25, 200)
    offset = _int_query(request, "offset", 0) or 0
    status = request.query.get("status") or None
    if status is not None and status not in STATUSES:
        raise ApiError(400, f"status must be one of {', '.join(STATUSES)}", code="invalid_value", param="status")
    model = request.query.get("model") or None
    chat_id = request.query.get("chat_id") or None
    stmt = (
        select(
            turns.c.id,
            turns.c.chat_id,
            turns.c.model,
            turns.c.status,
            turns.c.created_at,
            turns.c.updated_at,
            turns.c.lease_until,
            chats.c.title,
        )
        .select_from(turns.outerjoin(chats, chats.c.id == turns.c.chat_id))
        .where(turns.c.user_id == user)
    )
    if model is not None:
        stmt = stmt.where(turns.c.model == model)
    ids = ChatIds.of(request)
    if chat_id is not None:
        stmt = stmt.where(turns.c.chat_id.in_(ids.candidates(chat_id)))
    # "interrupted" is not stored: it is a running row without a live owner
    # (``_listed_status``): neither an actor of this process nor a lease.
    leased = and_(turns.c.lease_until.is_not(None), turns.c.lease_until >= time.time())
    owned = or_(turns.c.id.in_(list(svc.supervisor.actors)), leased)
    if status == "running":
        stmt = stmt.where(turns.c.status == "running", owned)
    elif status == "interrupted":
        stmt = stmt.where(turns.c.status == "running", not_(owned))
    elif status is not None:
        stmt = stmt.where(turns.c.status == status)
    stmt = stmt.order_by(turns.c.created_at.desc(), turns.c.id.desc())
    rows = await _fetch(svc, stmt.offset(offset).limit(limit + 1))
    models = await _fetch(svc, select(turns.c.model).distinct().where(turns.c.user_id == user).order_by(turns.c.model))
    data = [
        {
            "id": r.id,
            "chat_id": ids.shown(r.chat_id),
            "chat_title": r.title,
            "model": r.model,
            "status": _listed_status(svc, r),
            "created_at": r.created_at,
            "updated_at": r.updated_at,
        }
        for r in rows[:limit]
    ]
    return web.json_response({"data": data, "has_more": len(rows) > limit, "offset": offset, "models": [m[0] for m in models]})


def _problems(event: Any) -> list[dict[str, Any]]:
    """What should stand out about one event: failures (``error``) and warnings."""
    d, t = event.data, event.type
    out: list[dict[str, Any]] = []
    if t == "turn.failed":
        out.append({"level": "error", "message": d.get("message") or "the turn failed"})
    elif t == "tool.completed" and d.get("status") not in (None, "completed"):
        out.append({"level": "error", "message": f"tool {d.get('name')} {d.get('status')}: {d.get('error') or d.get('output')}"})
    elif t == "model.warning":
        out.append({"level": "warning", "message": d.get("message") or d.get("warning") or "upstream warning"})
    elif t == "turn.iteration_limit":
        out.append({"level": "warning", "message": "the tool-round cap was hit; the turn finished with what it had"})
    elif t == "turn.interrupted":
        out.append({"level": "warning", "message": "the owning process was found gone"})
    elif t == "background.result" and d.get("error"):
        out.append({"level": "warning", "message": f"background task {d.get('task')}: {d.get('error')}"})
    elif t == "outlet.applied":
        for run in d.get("runs") or []:
            if run.get("error"):
                out.append({"level": "warning", "message": f"outlet filter {run.get('filter')}: {run.get('error')}"})
    return [{**p, "seq": event.seq, "type": t} for p in out]


async def turn_summary(request: web.Request) -> web.Response:
    svc = services(request)
    record = await _own_turn(request)
    events = await checked_turn_events(svc, record.id)
    view = _fold(record.id, [])
    loop = LoopState()
    requests: list[dict[str, Any]] = []
    tools: dict[str, dict[str, Any]] = {}
    problems: list[dict[str, Any]] = []
    history_len = 0
    iterations = 0
    for event in events:
        _apply(view, event)
        loop.apply(event)
        d, t = event.data, event.type
        if t == "assembly.completed":
            history_len = int(d.get("history_len") or 0)
        elif t == "model.requested":
            iterations = max(iterations, int(d.get("iteration") or 0) + 1)
            requests.append(
                {
                    "seq": event.seq,
                    "iteration": d.get("iteration", 0),
                    "api": d.get("api"),
                    "resumed": bool(d.get("resumed")),
                    "prefill": d.get("prefill"),
                    "history_len": history_len,
                    "messages": list(loop.messages),
                }
            )
        elif t == "tool.started":
            tools[d["call_id"]] = {
                "call_id": d["call_id"],
                "name": d.get("name"),
                "kind": d.get("kind"),
                "arguments": d.get("arguments"),
                "iteration": loop.iteration + 1,
                "started_seq": event.seq,
                "started_at": event.at,
                "status": "in_progress",
                "output": None,
                "error": None,
                "completed_seq": None,
                "duration_ms": None,
            }
        elif t == "tool.completed" and d.get("call_id") in tools:
            call = tools[d["call_id"]]
            call.update(
                status=d.get("status"),
                output=d.get("output"),
                error=d.get("error"),
                completed_seq=event.seq,
                duration_ms=round((event.at - call["started_at"]) * 1000, 1),
            )
        problems.extend(_problems(event))
    public = _public(svc, record, view, ChatIds.of(request))
    for call in tools.values():
        if call["status"] == "in_progress" and public["status"] != "running":
            call["status"] = "incomplete"
    return web.json_response(
        {
            "turn": public,
            "first_at": events[0].at if events else None,
            "last_seq": events[-1].seq if events else 0,
            "iterations": iterations,
            "requests": requests,
            "tools": list(tools.values()),
            "problems": problems,
        }
    )


async def turn_forks(request: web.Request) -> web.Response:
    """The turn's forks (the ``turn_forks`` index), the caller's only."""
    record = await _own_turn(request)
    found = await forks_of(services(request).store, record.id, request[USER])
    return web.json_response({"data": [f.public() for f in found]})


class TimelineFolds:
    """The fold of a turn at the end of the timeline page last served, kept for
    the page after it: a scroll through a turn folds each event once, instead
    of folding from seq 1 again for every page (quadratic on a long turn). A
    page that starts anywhere else folds its prefix, as any reader would."""

    def __init__(self, size: int = 32) -> None:
        self._size = size
        self._views: OrderedDict[tuple[str, int], TurnView] = OrderedDict()

    def take(self, turn_id: str, seq: int) -> TurnView | None:
        """The view after ``seq``, if kept (it is the caller's now: it goes on folding it)."""
        return self._views.pop((turn_id, seq), None)

    def keep(self, turn_id: str, view: TurnView) -> None:
        self._views[(turn_id, view.last_seq)] = view
        while len(self._views) > self._size:
            self._views.popitem(last=False)


TIMELINE_FOLDS = web.AppKey("turnlog_timeline_folds", TimelineFolds)


async def turn_timeline(request: web.Request) -> web.Response:
    svc = services(request)
    record = await _own_turn(request)
    after = _int_query(request, "after", 0) or 0
    limit = min(_int_query(request, "limit", TIMELINE_PAGE, minimum=1) or TIMELINE_PAGE, TIMELINE_MAX)
    folds = request.app[TIMELINE_FOLDS]
    ids = ChatIds.of(request)
    # The state after each event needs the fold up to the page: the one the
    # previous page left, else the prefix's.
    view = folds.take(record.id, after)
    if view is None:
        prefix = await svc.store.read(record.id, limit=after) if after > 0 else []
        view = _fold(record.id, [e for e in prefix if e.seq <= after])
    # One more event read says whether a page follows.
    events = await svc.store.read(record.id, after=after, limit=limit + 1)
    more = len(events) > limit
    rows: list[dict[str, Any]] = []
    for event in events[:limit]:
        _apply(view, event)
        rows.append({"seq": event.seq, "type": event.type, "at": event.at, "state": view.state, "data": _data(ids, event)})
    if view.last_seq == (rows[-1]["seq"] if rows else after):
        folds.keep(record.id, view)
    next_after: int = rows[-1]["seq"] if rows else after
    return web.json_response({"events": rows, "next_after": next_after, "has_more": more})


def _data(ids: ChatIds, event: Event) -> dict[str, Any]:
    """An event's data as the caller sees it (its chat id shown)."""
    return ids.event(event.public())["data"] if event.type == "turn.started" else event.data


def _apply(view: TurnView, event: Event) -> None:
    """One more event into the view; a log that does not fold is a 409, as on
    ``GET /v1/turns/{id}``."""
    try:
        view.apply(event)
    except (ValueError, KeyError, TypeError) as exc:
        raise DamagedLog(view.id, f"the log cannot be folded: {exc}") from None


def setup(app: web.Application) -> None:
    app[TIMELINE_FOLDS] = TimelineFolds()
    app.router.add_get("/ui", to_page)
    app.router.add_get("/ui/", page)
    app.router.add_get("/ui/turns/{turn_id}", page)
    app.router.add_get("/ui/static/{filename}", static_file)
    app.router.add_get("/v1/ui/turns", list_turns)
    app.router.add_get("/v1/ui/turns/{turn_id}/summary", turn_summary)
    app.router.add_get("/v1/ui/turns/{turn_id}/timeline", turn_timeline)
    app.router.add_get("/v1/ui/turns/{turn_id}/forks", turn_forks)
