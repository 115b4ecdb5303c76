"""``POST /v1/chat/completions`` and ``GET /v1/models`` (docs/reference/chat-completions.md)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from aiohttp import web

from adapters.http.auth import KEY_HASH, USER
from adapters.http.chat_ids import ChatIds
from adapters.http.context import Services, services
from adapters.http.errors import DRAIN_RETRY_AFTER, ApiError, turn_error, unavailable_response
from adapters.http.live_sinks import DirectSSE, Renderer, StallGuard
from adapters.http.openai_format import ChunkRenderer, completion_body
from adapters.http.schemas import ChatRequest, parse_chat_request, read_json
from adapters.presets import apply_preset, resolution, user_language
from adapters.store.usage import QuotaExceeded
from engine.context.assemble import requested_mode
from engine.fold.turn_view import TurnView, fold
from engine.run.actor import TurnActor
from engine.run.follow import follow
from engine.tools.approval import prompt_mode_refusal, unaskable
from engine.tools.direct import direct_tool_specs

KEEPALIVE = b": keep-alive\n\n"
log = logging.getLogger("turnlog.http")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    svc = services(request)
    user = request[USER]
    body = parse_chat_request(await read_json(request))
    ids = ChatIds.of(request)
    actor = await start_turn(svc, body, user, ids, request[KEY_HASH], language=request.headers.get("Accept-Language"))
    headers = {"X-Turn-Id": actor.turn_id, "X-Chat-Id": ids.shown(actor.view.chat_id) or ""}
    if body.stream:
        return await stream_turn(request, actor.turn_id, headers=headers, include_usage=body.include_usage())
    # The answer is final when the turn ends, or when only its background tasks
    # (title, tags, follow-ups) are left: they never delay the answer.
    await asyncio.shield(actor.answered)
    # The actor's own view is what the log holds (no read needed); one that
    # stopped writing midway is rebuilt from the log.
    view = actor.view if not actor.lost else fold(actor.turn_id, await svc.store.read(actor.turn_id))
    if not view.terminal and view.state not in ("background", "awaiting_approval"):
        # The actor stopped before the answer (this instance drains, or a
        # write failed): the turn goes on elsewhere or after a resume. Never
        # a partial answer presented as the whole one. (A turn waiting for a
        # tool approval is answered as waiting.)
        return unavailable_response(
            f"turn {actor.turn_id} was interrupted here and continues on another instance or after a resume; its answer: GET /v1/turns/{actor.turn_id}",
            "turn_interrupted",
            DRAIN_RETRY_AFTER,
            headers=headers,
        )
    if view.status == "failed":
        answer = turn_error(view.error or {})
        return web.json_response(answer.body(), status=answer.status, headers={**headers, **answer.headers()})
    return web.json_response(completion_body(view), headers=headers)


async def start_turn(svc: Services, body: ChatRequest, user: str, ids: ChatIds, key_hash: str | None = None, *, language: str | None = None) -> TurnActor:
    """Check what a turn request refers to, then start it (HTTP and WebSocket
    alike); the request's ``chat_id`` is the client's, ``ids`` its stored one.
    A model id that names a preset is resolved here, once: the turn records
    the resolution and the request it resolved to (``adapters.presets``);
    ``language`` (``Accept-Language``) fills its ``{{USER_LANGUAGE}}``;
    ``key_hash`` is the hash of the caller's key (recorded; its quotas apply)."""
    preset = await svc.presets.get(body.model)
    resolved = await svc.catalog.resolve(preset.base_model if preset is not None else body.model)
    if resolved is None:
        hint = "GET /v1/models lists the models of the configured upstreams"
        if not svc.catalog.providers:
            hint = "no upstream is configured (set TURNLOG_OPENAI_BASE_URL, TURNLOG_OLLAMA_BASE_URL or TURNLOG_CONNECTIONS, or run turnlog serve --demo)"
        what = f"model '{body.model}'" if preset is None else f"the base model '{preset.base_model}' of preset '{body.model}'"
        raise ApiError(404, f"{what} not found: {hint}", "not_found_error", "model_not_found", "model")
    if body.chat_id:
        stored = await ids.stored(svc.store, body.chat_id)
        chat = await svc.store.get_chat(stored)
        if chat is not None and chat.user_id != user:  # (without scoping: auth off)
            raise ApiError(404, "chat not found", "not_found_error", "not_found", "chat_id")
        body = body.model_copy(update={"chat_id": stored})  # the log keeps the stored id
    request = body.recorded()
    recorded_preset: dict[str, Any] | None = None
    if preset is not None:
        recorded_preset = resolution(preset, now=datetime.now(), user_name=user, language=user_language(language))
        request = apply_preset(request, recorded_preset)
    unknown = sorted(set(request.get("tool_ids") or ()) - svc.supervisor.wiring.tools.known_ids())
    if unknown:
        raise ApiError(400, f"unknown tool_ids: {', '.join(unknown)}", code="unknown_tool", param="tool_ids")
    if (requested_mode(request) or resolved.function_calling) == "default":
        refuse_approvals_in_prompt_mode(svc, request)
    await admit(svc, key_hash)
    return await svc.supervisor.start_turn(request=request, user_id=user, model=body.model, preset=recorded_preset, key_hash=key_hash)


async def admit(svc: Services, key_hash: str | None) -> None:
    """429 ``rate_limit_exceeded`` with ``Retry-After`` for a turn over a quota
    (checked last: a request refused for another reason counts nothing)."""
    if svc.quotas is None:
        return
    try:
        await svc.quotas.admit(key_hash)
    except QuotaExceeded as exc:
        raise ApiError(
            429, exc.message, "rate_limit_error", "rate_limit_exceeded", extra={"retry_after": exc.retry_after}, headers={"Retry-After": str(exc.retry_after)}
        ) from None


def refuse_approvals_in_prompt_mode(svc: Services, request: dict[str, Any]) -> None:
    """400 when a prompt-based turn would offer a tool whose calls wait for
    approval: prompt mode runs what the task model selects during assembly,
    where no call can wait, and a call that asks is never run unasked."""
    tool_ids = list(request.get("tool_ids") or [])
    handles = svc.supervisor.wiring.tools.handles(tool_ids)
    tools: list[tuple[str, str | None]] = [(name, h.spec.tool_id) for name, h in handles.items()]
    tools += [(spec.name, spec.tool_id) for spec in direct_tool_specs(request.get("direct_tools"))]
    # Tool servers list their functions only when the turn connects: judged by their id.
    modules = {h.spec.tool_id for h in handles.values()}
    tools += [("", t) for t in tool_ids if t not in modules]
    asking = unaskable(request, svc.supervisor.settings.approval_tools, tools)
    if asking:
        raise ApiError(400, prompt_mode_refusal(asking), code="approval_unsupported", param="params.function_calling")


async def stream_turn(
    request: web.Request,
    turn_id: str,
    *,
    headers: dict[str, str],
    after: int = 0,
    include_usage: bool = False,
) -> web.StreamResponse:
    """SSE of a turn: catch-up after position ``after``, then live, until it ends.

    The client going away only ends this response; the turn runs on.
    """
    return await serve_sse(
        request,
        turn_id,
        headers=headers,
        make_renderer=lambda view: ChunkRenderer(view, after=after, include_usage=include_usage),
        # Headers are sent: an error response is impossible now. End the stream
        # with an error event (the turn itself runs on; a reconnect resumes).
        error_event=b'data: {"error":{"message":"stream interrupted; reconnect with Last-Event-ID","type":"stream_error"}}\n\n',
    )


async def serve_sse(
    request: web.Request,
    turn_id: str,
    *,
    headers: dict[str, str],
    make_renderer: Callable[[TurnView], Renderer],
    error_event: bytes,
) -> web.StreamResponse:
    """The SSE loop every stream of a turn shares (chat chunks, Responses
    events): follow the turn, render what comes, keep the connection alive in
    silences, end with ``error_event`` if following fails."""
    svc = services(request)
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
            **headers,
        }
    )
    await response.prepare(request)
    renderer: Renderer | None = None
    direct = DirectSSE(request, response) if svc.settings.live_fast_paths else None
    idle = 0
    guard = StallGuard(request.protocol, svc.settings.client_stall_seconds, f"stream of turn {turn_id}")
    # The stream's last bytes go with its end (one socket write, not two: each
    # costs ~0.1 ms of kernel time over loopback, a share of a short turn).
    last = b""
    try:
        try:
            async for follower, outs in follow(svc.store, svc.supervisor.join, turn_id, direct=direct):
                if renderer is None:
                    renderer = make_renderer(follower.view)
                if direct is not None:
                    direct.renderer = renderer
                    await direct.settle()  # a direct write still in flight goes first
                renderer.view = follower.view
                data = renderer.render(outs)
                if renderer.done:
                    last = data
                    break
                if data:
                    idle = 0
                    await response.write(data)
                elif not outs:
                    idle += 1
                    if idle >= 15:  # about every 15 s of silence
                        idle = 0
                        await response.write(KEEPALIVE)
        except (ConnectionResetError, ConnectionError):
            return response
        except Exception:
            log.exception("stream of turn %s failed", turn_id)
            try:
                await response.write(error_event)
            except (ConnectionResetError, ConnectionError):
                return response
        try:
            await response.write_eof(last)  # guarded too: the last bytes may wait for the client
        except (ConnectionResetError, ConnectionError):
            pass
    finally:
        guard.stop()
    return response


async def list_models(request: web.Request) -> web.Response:
    """The models of every reachable upstream. When the list may be short (no
    upstream configured, one unreachable) a ``turnlog`` field says why: the
    answer stays a 200 that OpenAI clients parse, and the reason is not lost."""
    svc = services(request)
    body: dict[str, object] = {"object": "list", "data": await svc.catalog.list_models()}
    problems = svc.catalog.problems()
    if problems:
        body["turnlog"] = problems
    return web.json_response(body)


def setup(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", list_models)
