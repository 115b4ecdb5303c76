"""``GET /v1/ws``: chat, subscribe with a cursor, cancel (docs/reference/websocket.md).

Each subscription is a pump task: durable events after the client's cursor from
the log, then the live tail. ``event`` messages go out in seq order, exactly
once; ``delta`` messages are a live preview tagged with the seq of the durable
event that will carry them, so a client drops a delta whose seq it already has
as an event. A subscriber that joins mid-window gets the window's deltas so far
(as an SSE follower does), so it shows the text being generated at once. After
a ``turn.resumed`` event comes a ``resumed`` message saying where the durable
answer ended, so a client shown text a dead owner never made durable can drop
it (docs/reconnecting.md). Closing the socket stops the pumps, never the turns.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from contextlib import aclosing
from typing import Any

import orjson
from aiohttp import WSMsgType, web

from adapters.http.approval_routes import approval_request, parse_approval, record_decision
from adapters.http.auth import KEY_HASH, USER
from adapters.http.chat_ids import ChatIds
from adapters.http.chat_routes import start_turn
from adapters.http.context import Services, services
from adapters.http.errors import ApiError, turn_error
from adapters.http.live_sinks import FrameOutbox, StallGuard
from adapters.http.schemas import parse_chat_request, parse_json
from adapters.http.turn_routes import refuse_damaged
from engine.events import Event
from engine.fold.turn_view import fold
from engine.pieces import Piece
from engine.ports import LiveChunks
from engine.run.follow import tail
from engine.run.supervisor import Draining, TurnConflict

log = logging.getLogger("turnlog.ws")
_json_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _encode(payload: dict[str, Any]) -> bytes:
    """A message's UTF-8 JSON text: orjson (every chunk's message is encoded),
    the stdlib for what orjson refuses (integers beyond 64 bits)."""
    try:
        return orjson.dumps(payload)
    except TypeError:
        return _json_encode(payload).encode("utf-8")


class Connection:
    def __init__(
        self, ws: web.WebSocketResponse, svc: Services, user: str, protocol: Any = None, ids: ChatIds | None = None, key_hash: str | None = None
    ) -> None:
        self.ws = ws
        self.svc = svc
        self.user = user
        self.key_hash = key_hash  # the caller's key, as its turns record it
        self.ids = ids if ids is not None else ChatIds(user)  # the caller's chat ids (scoped with auth on)
        self.language: str | None = None  # the upgrade request's Accept-Language (a preset's {{USER_LANGUAGE}})
        self.pumps: dict[str, asyncio.Task[None]] = {}
        self._lock = asyncio.Lock()
        # Frames written together (adapters.http.live_sinks); None:
        # aiohttp's own path (permessage-deflate negotiated).
        outbox = FrameOutbox(ws, protocol) if protocol is not None else None
        self.outbox = outbox if outbox is not None and outbox.usable else None

    async def send(self, payload: dict[str, Any]) -> None:
        await self.send_many([_encode(payload)])

    async def send_many(self, messages: list[bytes], *, hold: bool = False) -> None:
        """Messages already encoded, in order (one upstream read's deltas);
        ``hold``: see ``FrameOutbox.add``."""
        if not messages:
            return
        outbox = self.outbox
        if outbox is not None:
            outbox.add(messages, hold=hold)
            await outbox.drain()
            return
        async with self._lock:
            for message in messages:
                await self.ws.send_frame(message, WSMsgType.TEXT)

    async def error(self, message: str, code: str, extra: dict[str, Any] | None = None) -> None:
        await self.send({"type": "error", "message": message, "code": code, **(extra or {})})

    async def handle(self, raw: str) -> None:
        try:
            message = parse_json(raw)  # as HTTP bodies: strict, and at most 64 levels deep
        except ApiError as exc:
            await self.error(exc.message, exc.code or "invalid_json")
            return
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            await self.error("message must be a JSON object with a string 'type'", "invalid_message")
            return
        kind = message["type"]
        try:
            if kind == "chat":
                await self.on_chat(message)
            elif kind == "subscribe":
                await self.on_subscribe(message)
            elif kind == "cancel":
                await self.on_cancel(message)
            elif kind == "tool_result":
                await self.on_tool_result(message)
            elif kind == "approval":
                await self.on_approval(message)
            else:
                await self.error(f"unknown message type '{kind}'", "unknown_type")
        except ApiError as exc:
            await self.error(exc.message, exc.code or "invalid_request", exc.extra)
        except Draining:
            await self.error("this instance is shutting down; retry on another", "draining")
        except Exception:
            # A bug, as a 500 is over HTTP: logged, and the client told; the
            # connection (and its subscriptions) stays up.
            log.exception("ws message %r failed", kind)
            await self.error(f"internal error handling a '{kind}' message", "internal_error")

    async def _own_turn(self, turn_id: Any) -> str:
        if not isinstance(turn_id, str) or not turn_id or "\x00" in turn_id:
            raise ApiError(400, "'turn_id' must be a non-empty string (without NUL characters)", code="invalid_value")
        record = await self.svc.store.get_turn(turn_id)
        if record is None or record.user_id != self.user:
            raise ApiError(404, "turn not found", code="not_found")
        return record.id

    async def on_chat(self, message: dict[str, Any]) -> None:
        deltas = _deltas_option(message)
        actor = await start_turn(self.svc, parse_chat_request(message.get("request")), self.user, self.ids, self.key_hash, language=self.language)
        await self.send({"type": "turn", "turn_id": actor.turn_id, "chat_id": self.ids.shown(actor.view.chat_id)})
        self._start_pump(actor.turn_id, 0, deltas=deltas)

    async def on_subscribe(self, message: dict[str, Any]) -> None:
        after = message.get("after", 0)
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            raise ApiError(400, "'after' must be a non-negative integer seq", code="invalid_value")
        deltas = _deltas_option(message)
        if message.get("chat_id") and not message.get("turn_id"):
            if "\x00" in str(message["chat_id"]):
                raise ApiError(400, "'chat_id' must not contain NUL characters", code="invalid_value")
            chat = await self.svc.store.get_chat(await self.ids.stored(self.svc.store, str(message["chat_id"])))
            if chat is None or chat.user_id != self.user:
                raise ApiError(404, "chat not found", code="not_found")
            for status in ("running", "waiting"):
                for record in await self.svc.store.list_turns(chat_id=chat.id, status=status):
                    self._start_pump(record.id, 0, deltas=deltas)
            return
        turn_id = await self._own_turn(message.get("turn_id"))
        found = await self.svc.store.get_turn(turn_id)
        if found is not None:
            await refuse_damaged(self.svc, found)
        self._start_pump(turn_id, after, deltas=deltas)

    async def on_tool_result(self, message: dict[str, Any]) -> None:
        turn_id = await self._own_turn(message.get("turn_id"))
        call_id = message.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            raise ApiError(400, "'call_id' must be a non-empty string", code="invalid_value")
        if "result" not in message:
            raise ApiError(400, "missing 'result'", code="invalid_value")
        if not self.svc.supervisor.deliver_tool_result(turn_id, call_id, message["result"]):
            await self.error(f"no direct tool call {call_id} is waiting for a result", "unexpected_tool_result")

    async def on_approval(self, message: dict[str, Any]) -> None:
        turn_id = await self._own_turn(message.get("turn_id"))
        body = parse_approval({k: v for k, v in message.items() if k not in ("type", "turn_id")})
        await self.send({"type": "approval", **await record_decision(self.svc, turn_id, self.user, body)})

    async def on_cancel(self, message: dict[str, Any]) -> None:
        turn_id = await self._own_turn(message.get("turn_id"))
        try:
            status = await self.svc.supervisor.cancel(turn_id, by=self.user)
        except TurnConflict as exc:
            raise ApiError(409, str(exc), code="turn_not_running") from exc
        await self.send({"type": "cancelled", "turn_id": turn_id, "status": status})

    def _start_pump(self, turn_id: str, after: int, *, deltas: bool = True) -> None:
        old = self.pumps.pop(turn_id, None)
        if old is not None:
            old.cancel()
        self.pumps[turn_id] = asyncio.create_task(self.pump(turn_id, after, deltas=deltas))

    async def pump(self, turn_id: str, after: int, *, deltas: bool = True) -> None:
        """Durable events after seq ``after`` as ``event`` messages, exactly once
        and in order, and the live tail as ``delta`` messages (the pieces the
        actor made of each chunk), until the turn ends. ``deltas=False`` (the
        client's choice): events only, the text coming with each
        ``model.delta`` event, one message per delta window instead of one per
        chunk."""
        store = self.svc.store
        sink = _PumpSink(self, turn_id, deltas, after)
        join = functools.partial(self.svc.supervisor.join, runs_tools=True)
        direct = self.outbox is not None and self.svc.settings.live_fast_paths
        try:
            async with aclosing(tail(store, join, turn_id, after=after, sink=sink if direct else None)) as tailed:
                async for items in tailed:
                    out: list[bytes] = []
                    # Only ``model.delta`` events, whose text this client was
                    # already sent as ``delta`` messages, may wait for the next
                    # message (the next chunk's delta: one write for both), at
                    # most live_sinks.HOLD_SECONDS.
                    hold = deltas
                    for item in items:
                        if isinstance(item, Event):
                            data = item.data if item.type != "turn.started" else self.ids.event(item.public())["data"]
                            out.append(
                                _encode({"type": "event", "turn_id": turn_id, "seq": item.seq, "event": {"type": item.type, "at": item.at, "data": data}})
                            )
                            sink.last = item.seq
                            hold = hold and item.type == "model.delta"
                            if item.type == "turn.resumed":
                                await self.send_many(out)
                                out = []
                                await self._send_resumed(turn_id, item)
                            elif item.type == "tool.approval_requested":
                                out.append(_encode({"type": "approval:request", "turn_id": turn_id, **approval_request(item)}))
                            elif item.type == "turn.failed":
                                out.append(_encode(_failed_message(turn_id, item)))
                        elif isinstance(item, LiveChunks):
                            hold = False
                            if deltas:
                                out.extend(_delta_messages(turn_id, item))
                        else:
                            hold = False
                            out.append(_encode(item.payload))
                    await self.send_many(out, hold=hold)
        except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
            pass
        except Exception as exc:
            log.exception("ws pump for %s failed", turn_id)
            try:  # the client is told, not left waiting
                await self.error(f"turn {turn_id}: its log could not be followed: {type(exc).__name__}: {exc}", "log_unreadable", {"turn_id": turn_id})
            except Exception:
                pass
        finally:
            if self.pumps.get(turn_id) is asyncio.current_task():
                del self.pumps[turn_id]

    async def _send_resumed(self, turn_id: str, event: Event) -> None:
        # Rare (once per crash): the durable answer at the resume is the fold
        # of the log up to it.
        point = fold(turn_id, await self.svc.store.read(turn_id), upto=event.seq).resume_point
        if point is not None:
            await self.send({"type": "resumed", "turn_id": turn_id, "seq": event.seq, **point.notice()})

    def close(self) -> None:
        for task in self.pumps.values():
            task.cancel()


class _PumpSink:
    """A subscription's ``LiveSink``: live chunks rendered as ``delta``
    messages into the connection's outbox inside the actor's publish,
    without waking the pump (one task switch per chunk and connection
    less). While the client is behind (the outbox not ready), chunks queue
    and the pump takes them."""

    def __init__(self, conn: Connection, turn_id: str, deltas: bool, last: int) -> None:
        self.conn, self.turn_id, self.deltas = conn, turn_id, deltas
        self.last = last  # the seq of the last ``event`` message sent

    def chunks(self, message: LiveChunks) -> bool:
        outbox = self.conn.outbox
        if outbox is None or not outbox.ready:
            return False
        if not self.deltas:
            return True  # events only: the chunk comes with its event
        try:
            if message.seq > self.last:  # else its event was sent already
                outbox.add(_delta_messages(self.turn_id, message))
        except Exception:  # never into the actor: the pump takes it instead
            log.exception("ws live delta for %s", self.turn_id)
            return False
        return True

    def durable(self, event: Event) -> bool:
        return False  # every event goes out as an ``event`` message, by the pump


def _failed_message(turn_id: str, event: Event) -> dict[str, Any]:
    """The ``error`` message of a failed turn: what an HTTP request for it is
    answered (its status, the error object, ``retry_after``)."""
    answer = turn_error(event.data.get("error") or {})
    message: dict[str, Any] = {
        "type": "error",
        "turn_id": turn_id,
        "message": answer.message,
        "code": answer.code or answer.type,
        "status": answer.status,
        "param": answer.param,
    }
    if answer.retry_after is not None:
        message["retry_after"] = answer.retry_after
    return message


def _deltas_option(message: dict[str, Any]) -> bool:
    """A ``chat`` or ``subscribe`` message's ``deltas`` (default true): false
    asks for durable events only, no live ``delta`` messages."""
    deltas = message.get("deltas", True)
    if not isinstance(deltas, bool):
        raise ApiError(400, "'deltas' must be a boolean", code="invalid_value")
    return deltas


def _delta_messages(turn_id: str, chunks: LiveChunks) -> list[bytes]:
    """The ``delta`` messages of one published read: one per piece the actor
    made of each chunk (plain chunks' texts rendered directly, one piece each)."""
    seq, pos, kind = chunks.seq, chunks.pos, chunks.kind
    if chunks.plain:
        texts = chunks.texts
        return [_encode({"type": "delta", "turn_id": turn_id, "seq": seq, "pos": pos + i, "kind": kind, "content": text}) for i, text in enumerate(texts)]
    return [_encode(_delta_message(turn_id, seq, pos + i, piece)) for i, pieces in enumerate(chunks.pieces) for piece in pieces]


def _delta_message(turn_id: str, seq: int, pos: int, piece: Piece) -> dict[str, object]:
    message: dict[str, object] = {"type": "delta", "turn_id": turn_id, "seq": seq, "pos": pos, "kind": piece.kind, "content": piece.text}
    if piece.call_id is not None:
        message["call_id"] = piece.call_id  # a ``tool_arguments`` fragment's call
    return message


async def websocket(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=services(request).settings.max_body_bytes)
    await ws.prepare(request)
    conn = Connection(ws, services(request), request[USER], request.protocol, ChatIds.of(request), request[KEY_HASH])
    conn.language = request.headers.get("Accept-Language")
    guard = StallGuard(request.protocol, services(request).settings.client_stall_seconds, "WebSocket")
    try:
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                await conn.handle(msg.data)
            elif msg.type == WSMsgType.BINARY:
                await conn.error("binary messages are not supported; send JSON text", "invalid_message")
            elif msg.type == WSMsgType.ERROR:
                break
    finally:
        guard.stop()
        conn.close()
        if conn.outbox is not None:  # what this pass produced goes before aiohttp's close frame
            conn.outbox.flush()
    return ws


def setup(app: web.Application) -> None:
    app.router.add_get("/v1/ws", websocket)
