"""OpenAI wire shapes for a turn: ``chat.completion.chunk`` SSE and ``chat.completion``.

The renderer turns a follower's output (chunks and events at stream positions)
into SSE messages whose ``id`` is the position. It keeps ``last_sent`` so a
reconnect with ``Last-Event-ID`` resumes right after it, and it is cheap per
chunk: the fixed part of every chunk is serialized once. A client that was shown
text a dead owner never made durable gets the ``turnlog.resumed`` notice chunk
(docs/reconnecting.md).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from adapters.http.errors import turn_error
from engine.context.unsupported import STEP as UNSUPPORTED_STEP
from engine.context.unsupported import file_warnings, warnings_of
from engine.fold.turn_view import TurnView
from engine.ports import LiveChunks
from engine.run.follow import EventOut, Out, chunk_outs
from engine.run.nodes import client_tool_names

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
# The per-chunk part (the delta) goes through orjson: same compact UTF-8 JSON, faster.
_dumpb = orjson.dumps
# turnlog's extension objects with their keys sorted: the log stores event data
# so (engine.chain), and a live client and a reconnecting one (rendered from the
# log) must get the same bytes.
_dumps_ext = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode


def completion_id(turn_id: str) -> str:
    return f"chatcmpl-{turn_id}"


class ChunkRenderer:
    """Renders one client's SSE stream of a turn."""

    def __init__(self, view: TurnView, *, after: int = 0, include_usage: bool = False) -> None:
        self.view = view
        self.last_sent = after
        self.include_usage = include_usage
        self.done = False
        self.answered = False  # [DONE] was sent
        self._answer_now = False
        self._prefix: bytes | None = None
        self._text_head: bytes | None = None  # the prefix and '{"content":'
        # The client's calls streamed as ``tool_calls`` deltas while the model
        # writes them: call id -> their index in the message's ``tool_calls``.
        self._streamed: dict[str, int] = {}
        self._client_names: set[str] | None = None

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

    def _make_text_head(self) -> bytes:
        self._text_head = self._chunk_prefix() + b'{"content":'
        return self._text_head

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, extra: dict[str, Any] | None = None) -> bytes:
        """One ``chat.completion.chunk`` JSON (the fixed head serialized once)."""
        body = self._chunk_prefix() + _dumpb(delta)
        if finish is None and not extra:
            return body + b',"logprobs":null,"finish_reason":null}]}'  # every text chunk
        body += b',"logprobs":null,"finish_reason":' + _dumps(finish).encode() + b"}]"
        if extra:
            body += b"," + _dumps_ext(extra)[1:-1].encode()
        return body + b"}"

    def _usage_chunk(self, usage: dict[str, Any]) -> bytes:
        v = self.view
        head = {"id": completion_id(v.id), "object": "chat.completion.chunk", "created": int(v.created_at or 0), "model": v.model}
        estimated = {"usage_estimated": True} if v.usage_estimated else {}
        return _dumps({**head, "choices": [], "usage": usage, **estimated}).encode()

    @staticmethod
    def _sse(pos: int, payloads: list[bytes]) -> bytes:
        """SSE messages of one position: only the last carries the ``id``, so a
        reconnect after it gets none of them again, and one before it all."""
        out = [b"data: %s\n\n" % p for p in payloads[:-1]]
        out.append(b"id: %d\ndata: %s\n\n" % (pos, payloads[-1]))
        return b"".join(out)

    def render(self, outs: list[Out]) -> bytes:
        parts: list[bytes] = []
        for out in outs:
            if isinstance(out, LiveChunks):
                if not self.done:
                    self._chunks(out, parts)
                continue
            if type(out) is EventOut and out.event.type == "model.item":
                # Before the skip: a client resuming after the announce has
                # its index (and its later fragments and end follow it).
                self._note_call(out.event.data["item"])
            if out.pos <= self.last_sent or self.done:
                continue
            if not isinstance(out, EventOut):
                pieces = out.pieces
                if not pieces:
                    continue
                if pieces[0].kind == "tool_arguments":
                    parts.append(self._sse(out.pos, [self._tool_arguments(p) for p in pieces]))
                elif len(pieces) == 1 and pieces[0].kind == "text":
                    # The per-token case: one text piece, no dict to build,
                    # one formatting of the whole SSE message.
                    head = self._text_head or self._make_text_head()
                    parts.append(_TEXT_MESSAGE % (out.pos, head, _dumpb(pieces[0].text)))
                else:
                    parts.append(b"id: %d\ndata: %s\n\n" % (out.pos, self._chunk(_delta(pieces))))
            elif out.event.type == "background.result":
                # After [DONE]: a named event, which OpenAI clients (stopped at
                # [DONE]) never see and a raw SSE reader can take.
                parts.append(b"event: turnlog\nid: %d\ndata: %s\n\n" % (out.pos, _dumps({"background": out.event.data}).encode()))
            elif out.event.type == "tool.approval_requested":
                parts.append(self._approval_request(out))
            else:
                payloads = self._event_payloads(out)
                if out.pieces:
                    payloads.insert(0, self._chunk(_delta(out.pieces)))
                if payloads:
                    parts.append(self._sse(out.pos, payloads))
                if (self.done or self._answer_now) and not self.answered:
                    # The answer is final: OpenAI clients stop here (background
                    # tasks, if any, follow as named events until the turn ends).
                    self.answered = True
                    parts.append(b"data: [DONE]\n\n")
                self._answer_now = False
                if not payloads:
                    continue
            self.last_sent = out.pos
        return b"".join(parts)

    def _chunks(self, chunks: LiveChunks, parts: list[bytes]) -> None:
        """The chunks of a live message: for plain text chunks, per chunk one
        ``orjson.dumps`` of its text and one formatting of the whole SSE
        message, the same bytes as the per-token case of ``render``."""
        if not chunks.plain or chunks.kind != "text":
            parts.append(self.render(list(chunk_outs(chunks))))
            return
        later = chunks.since(self.last_sent + 1)  # not those a reconnect already had
        if later is None:
            return
        texts, first = later.texts, later.pos
        head = self._text_head or self._make_text_head()
        message, dumpb = _TEXT_MESSAGE, _dumpb
        parts.append(b"".join([message % (pos, head, dumpb(text)) for pos, text in zip(range(first, first + len(texts)), texts)]))
        self.last_sent = first + len(texts) - 1

    def _tool_arguments(self, piece: Any) -> bytes:
        """A fragment of a streaming call's arguments: a ``turnlog`` extension
        chunk (the call itself was shown as a ``turnlog.item``); for a call of
        the client's tools also a ``tool_calls`` delta, as OpenAI streams one."""
        index = self._streamed.get(piece.call_id)
        delta: dict[str, Any] = {} if index is None else {"tool_calls": [{"index": index, "function": {"arguments": piece.text}}]}
        return self._chunk(delta, extra={"turnlog": {"tool_arguments": {"call_id": piece.call_id, "delta": piece.text}}})

    def _note_call(self, item: dict[str, Any]) -> None:
        """A call announced while the model writes it: a call of the client's
        own tools (the plain ``tools`` field) gets the next ``tool_calls`` index."""
        if item.get("type") != "function_call" or item.get("status") != "in_progress" or item["call_id"] in self._streamed:
            return
        if self._client_names is None:
            self._client_names = client_tool_names(self.view.request)
        if item.get("name") in self._client_names:
            self._streamed[item["call_id"]] = len(self._streamed)

    def _call_announced(self, out: EventOut) -> list[bytes]:
        """The ``turnlog.item`` of an announced call; a client's call starts
        its ``tool_calls`` delta in the same chunk (id, name, no arguments yet)."""
        item = out.event.data["item"]
        index = self._streamed.get(item["call_id"])
        if index is None:
            return [self._chunk({}, extra={"turnlog": {"item": i}}) for i in out.items]
        start = {"index": index, "id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": ""}}
        return [self._chunk({"tool_calls": [start]}, extra={"turnlog": {"item": i}}) for i in out.items]

    def _approval_request(self, out: EventOut) -> bytes:
        """A call waits for approval: a named ``turnlog`` event (a raw SSE reader
        takes it by name) whose data is still a ``chat.completion.chunk`` with
        no choices, which OpenAI SDKs iterate over harmlessly mid-stream."""
        v, d = self.view, out.event.data
        request = {"turn_id": v.id, "call_id": d["call_id"], "name": d["name"], "arguments": d["arguments"]}
        head = {"id": completion_id(v.id), "object": "chat.completion.chunk", "created": int(v.created_at or 0), "model": v.model}
        body = _dumps({**head, "choices": [], "turnlog": {"approval_request": request}}).encode()
        return b"event: turnlog\nid: %d\ndata: %s\n\n" % (out.pos, body)

    def _assembly_payloads(self, data: dict[str, Any]) -> list[bytes]:
        """What a client is told during assembly, before the answer starts:
        progress (``status``), images made for it (``files``), and what could
        not be used (``warnings``)."""
        step, detail = data.get("step"), data.get("detail") or {}
        ext: dict[str, Any] = {}
        if "status" in detail:
            ext["progress"] = detail["status"]
        if detail.get("files") and step == "image_generation":
            ext["files"] = detail["files"]
        warnings = warnings_of(detail) if step == UNSUPPORTED_STEP else file_warnings(detail) if step == "files" else []
        if step == "tool_servers":  # an MCP server that could not be reached or listed
            warnings = [str(w) for w in detail.get("warnings") or []]
        if warnings:
            ext["warnings"] = warnings
        return [self._chunk({}, extra={"turnlog": ext})] if ext else []

    def _event_payloads(self, out: EventOut) -> list[bytes]:
        event = out.event
        t = event.type
        v = self.view
        payloads: list[bytes] = [self._chunk({}, extra={"turnlog": {"item": item}}) for item in out.items]
        if t == "turn.started":
            return [self._chunk({"role": "assistant", "content": ""})]
        if t == "model.item" and event.data["item"].get("status") == "in_progress":
            return self._call_announced(out)
        if t == "turn.resumed":
            point = out.resume
            # ``render`` shows this event only to a client behind its position (the
            # new epoch's first); one that was shown output past the durable end
            # holds text a dead owner never made durable, and after a restart
            # one shown any of the superseded round holds text that is not the
            # answer: tell it how much of what it shows to keep (docs/reconnecting.md).
            if point is not None and point.drops(self.last_sent):
                return [self._chunk({}, extra={"turnlog": {"resumed": point.notice()}})]
            return []
        if t == "assembly.step":
            return self._assembly_payloads(event.data)
        if t == "tool.event":
            return [self._chunk({}, extra={"turnlog": {"tool_event": event.data}})]
        if t in ("assembly.completed", "context.reinjected") and event.data.get("sources"):
            # The sources in the context: the [N] the model cites.
            return [*payloads, self._chunk({}, extra={"turnlog": {"sources": event.data["sources"]}})]

        if t == "outlet.applied":
            if event.data.get("content") is None:
                return []
            return [self._chunk({}, extra={"turnlog": {"outlet": {"content": event.data["content"]}}})]
        if t == "background.started":
            self._answer_now = True
            usage = _openai_usage(v.reply_usage)
            return [self._usage_chunk(usage)] if self.include_usage and usage else []
        if t == "turn.iteration_limit":
            error = {"message": event.data.get("message", ""), "type": "iteration_limit"}
            return [*payloads, self._chunk({}, extra={"turnlog": {"error": error}})]
        if t == "turn.finalized":
            finish = v.finish_reason or "stop"
            calls = v.client_calls if finish == "tool_calls" else []
            # Calls streamed while the model wrote them are complete already.
            calls = [c for c in calls if c["call_id"] not in self._streamed]
            if calls:
                payloads.append(self._chunk({"tool_calls": openai_tool_calls(calls, first=len(self._streamed))}))
            return [*payloads, self._chunk({}, finish=finish)]
        if t == "turn.completed":
            self.done = True
            usage = _openai_usage(v.reply_usage)
            return [self._usage_chunk(usage)] if self.include_usage and usage and not self.answered else []
        if t == "turn.cancelled":
            self.done = True
            # Calls the cancel left incomplete, then the end.
            return [*payloads, self._chunk({}, finish="stop", extra={"turnlog": {"status": "cancelled"}})]
        if t == "turn.failed":
            self.done = True
            # The object a request that failed before its stream would get as its body.
            payload = turn_error(event.data.get("error") or {}).body()
            return [*payloads, _dumps(payload).encode()]
        return payloads


_TEXT_END = b'},"logprobs":null,"finish_reason":null}]}'
# id, the chunk up to the text, the text (JSON): a per-token SSE message.
_TEXT_MESSAGE = b"id: %d\ndata: %s%s" + _TEXT_END + b"\n\n"


def _delta(pieces: tuple[Any, ...]) -> dict[str, str]:
    delta: dict[str, str] = {}
    for piece in pieces:
        if piece.kind == "tool_arguments":
            continue  # shown as their own extension chunks
        key = "content" if piece.kind == "text" else "reasoning_content"
        delta[key] = delta.get(key, "") + piece.text
    return delta


def openai_tool_calls(calls: list[dict[str, Any]], *, first: int = 0) -> list[dict[str, Any]]:
    """Client tool calls in OpenAI's shape (the client runs them); ``first``:
    the index of the first (after calls already streamed)."""
    return [
        {"index": i, "id": c["call_id"], "type": "function", "function": {"name": c["name"], "arguments": c.get("arguments", "")}}
        for i, c in enumerate(calls, first)
    ]


def completion_body(view: TurnView) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` of a finished turn."""
    message: dict[str, Any] = {"role": "assistant", "content": view.content}
    calls = view.client_calls if view.finish_reason == "tool_calls" else []
    if calls:
        message["tool_calls"] = [{k: c[k] for k in ("id", "type", "function")} for c in openai_tool_calls(calls)]
        message["content"] = view.content or None
    if view.reasoning_content:
        message["reasoning_content"] = view.reasoning_content
    body: dict[str, Any] = {
        "id": completion_id(view.id),
        "object": "chat.completion",
        "created": int(view.created_at or 0),
        "model": view.model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": view.finish_reason or "stop"}],
        "usage": _openai_usage(view.reply_usage),
    }
    if view.usage_estimated:  # counted by turnlog: the upstream reported no usage
        body["usage_estimated"] = True
    extension: dict[str, Any] = {}
    # Answered with only background tasks left: the answer is complete.
    status = "completed" if view.state == "background" else view.status
    if status != "completed":
        extension["status"] = status
    if view.warnings:
        extension["warnings"] = list(view.warnings)
    if view.pending_approvals:
        extension["approvals"] = view.pending_approvals
    if extension:
        body["turnlog"] = extension
    return body


def _openai_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    return {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens") if k in usage} or None
