"""OpenAI wire shapes for a turn: ``chat.completion.chunk`` SSE and ``chat.completion``.

The renderer turns a follower's output (chunks and events at stream positions)
into SSE messages whose ``id`` is the position. It keeps ``last_sent`` so a
reconnect with ``Last-Event-ID`` resumes right after it, and it is cheap per
chunk: the fixed part of every chunk is serialized once.
"""

from __future__ import annotations

import json
from typing import Any

from engine.follow import EventOut, Out
from engine.projection import ChunkOut, TurnView

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def completion_id(turn_id: str) -> str:
    return f"chatcmpl-{turn_id}"


class ChunkRenderer:
    """Renders one client's SSE stream of a turn."""

    def __init__(self, view: TurnView, *, after: int = 0, include_usage: bool = False) -> None:
        self.view = view
        self.last_sent = after
        self.include_usage = include_usage
        self.done = False
        self._prefix: bytes | None = None

    def _chunk_prefix(self) -> bytes:
        if self._prefix is None:
            v = self.view
            head = {
                "id": completion_id(v.id),
                "object": "chat.completion.chunk",
                "created": int(v.created_at or 0),
                "model": v.model,
            }
            self._prefix = _dumps(head)[:-1].encode() + b',"choices":[{"index":0,"delta":'
        return self._prefix

    def _message(self, pos: int, delta: dict[str, Any], finish: str | None = None, extra: dict[str, Any] | None = None) -> bytes:
        body = self._chunk_prefix() + _dumps(delta).encode()
        body += b',"logprobs":null,"finish_reason":' + _dumps(finish).encode() + b"}]"
        if extra:
            body += b"," + _dumps(extra)[1:-1].encode()
        return b"id: %d\ndata: %s}\n\n" % (pos, body)

    def _plain(self, pos: int, payload: dict[str, Any]) -> bytes:
        return b"id: %d\ndata: %s\n\n" % (pos, _dumps(payload).encode())

    def render(self, outs: list[Out]) -> bytes:
        parts: list[bytes] = []
        for out in outs:
            if out.pos <= self.last_sent or self.done:
                continue
            piece = self._render_one(out)
            if piece is not None:
                parts.append(piece)
                self.last_sent = out.pos
        return b"".join(parts)

    def _render_one(self, out: Out) -> bytes | None:
        if isinstance(out, ChunkOut):
            if not out.pieces:
                return None
            delta: dict[str, str] = {}
            for piece in out.pieces:
                key = "content" if piece.kind == "text" else "reasoning_content"
                delta[key] = delta.get(key, "") + piece.text
            return self._message(out.pos, delta)
        return self._render_event(out)

    def _render_event(self, out: EventOut) -> bytes | None:
        rendered = self._render_event_only(out)
        if not out.pieces:
            return rendered
        # Released text shares the event's position: sent without an id of its
        # own, in the same write, so a reconnect gets both or neither.
        delta: dict[str, str] = {}
        for piece in out.pieces:
            key = "content" if piece.kind == "text" else "reasoning_content"
            delta[key] = delta.get(key, "") + piece.text
        released = self._message(out.pos, delta).split(b"\n", 1)[1]
        return released + (rendered or b"")

    def _render_event_only(self, out: EventOut) -> bytes | None:
        event = out.event
        t = event.type
        v = self.view
        if t == "turn.started":
            return self._message(out.pos, {"role": "assistant", "content": ""})
        if t == "model.warning":
            return None
        if t == "turn.resumed":
            if event.data.get("from_pos", 0) < self.last_sent:
                # This client saw text a dead owner never made durable: tell it
                # where the durable answer ends so it can drop the rest.
                notice = {"resumed": {"from_pos": event.data["from_pos"], "epoch": event.data["epoch"]}}
                return self._message(out.pos, {}, extra={"turnlog": notice})
            return None
        if t == "turn.finalized":
            return self._message(out.pos, {}, finish=v.finish_reason or "stop")
        if t == "turn.completed":
            self.done = True
            tail = b""
            usage = _openai_usage(v.usage)
            if self.include_usage and usage:
                head = {"id": completion_id(v.id), "object": "chat.completion.chunk", "created": int(v.created_at or 0), "model": v.model}
                tail = self._plain(out.pos, {**head, "choices": [], "usage": usage})
            return tail + b"data: [DONE]\n\n"
        if t == "turn.cancelled":
            self.done = True
            return self._message(out.pos, {}, finish="stop", extra={"turnlog": {"status": "cancelled"}}) + b"data: [DONE]\n\n"
        if t == "turn.failed":
            self.done = True
            error = event.data.get("error", {})
            payload = {"error": {"message": error.get("message", "turn failed"), "type": error.get("type", "upstream_error"), "code": error.get("status")}}
            return self._plain(out.pos, payload) + b"data: [DONE]\n\n"
        return None


def completion_body(view: TurnView) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` of a finished turn."""
    message: dict[str, Any] = {"role": "assistant", "content": view.content}
    if view.acc.reasoning_text:
        message["reasoning_content"] = view.acc.reasoning_text
    body: dict[str, Any] = {
        "id": completion_id(view.id),
        "object": "chat.completion",
        "created": int(view.created_at or 0),
        "model": view.model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": view.finish_reason or "stop"}],
        "usage": _openai_usage(view.usage),
    }
    if view.status != "completed":
        body["turnlog"] = {"status": view.status}
    return body


def _openai_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    return {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens") if k in usage} or None
