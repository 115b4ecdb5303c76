"""The OpenAI Responses API shapes of a turn: the request mapped onto a turn
request, the ``response`` object and its typed SSE events (docs/guides/responses-api.md).

A response is a turn (``resp_<turn_id>``). Its SSE events are derived from the
turn's stream output (the chunks and events a follower yields at their stream
positions, which are fixed by the log), so the same log always gives the same
events with the same ``sequence_number``: a stream resumed with
``starting_after=N`` re-derives the events from the first position and sends
those after N. The response object is the same derivation run over the whole
log (``fold_response``): what a client was streamed and what it retrieves
cannot differ.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from adapters.http.errors import turn_error
from engine.events import Event
from engine.fold.turn_view import TurnView
from engine.ports import LiveChunks
from engine.run.follow import EventOut, Out, TurnFollower, chunk_outs
from engine.run.nodes import client_tool_names

RESPONSE_PREFIX = "resp_"
#: Where a turn request keeps what only the Responses API needs (never sent upstream).
RECORD_KEY = "responses"

_dumpb = orjson.dumps


def response_id(turn_id: str) -> str:
    return RESPONSE_PREFIX + turn_id


def turn_id_of(response_id_: str) -> str | None:
    if not response_id_.startswith(RESPONSE_PREFIX):
        return None
    return response_id_[len(RESPONSE_PREFIX) :] or None


# --- the request -------------------------------------------------------------


class InputError(ValueError):
    """An input the Responses API body cannot carry; ``param`` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _text_of_parts(content: Any, param: str) -> str | list[dict[str, Any]]:
    """Responses content parts as Chat Completions content."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InputError(f"'{param}' must be a string or a list of content parts", param)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise InputError(f"'{where}' must be an object", where)
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            if not isinstance(part.get("text"), str):
                raise InputError(f"'{where}.text' must be a string", f"{where}.text")
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise InputError(f"'{where}.image_url' must be a URL or data URI (file_id images are not supported)", f"{where}.image_url")
            parts.append({"type": "image_url", "image_url": {"url": url, "detail": part.get("detail") or "auto"}})
        elif kind == "refusal":
            parts.append({"type": "text", "text": str(part.get("refusal") or "")})
        else:
            raise InputError(f"'{where}.type' {kind!r} is not supported (input_text, input_image, output_text)", f"{where}.type")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def input_messages(value: Any) -> list[dict[str, Any]]:
    """``input`` (a string or items) as Chat Completions messages.

    A client that keeps the conversation itself (the Agents SDK does) sends
    earlier output back: assistant messages and ``function_call`` items become
    an assistant message with ``tool_calls``; ``function_call_output`` a
    ``tool`` message; reasoning items are dropped (the log has the turn's own).
    """
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InputError("'input' must be a non-empty string or a non-empty list of items", "input")
    messages: list[dict[str, Any]] = []

    def open_assistant() -> dict[str, Any]:
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and not last.get("_closed"):
            return last
        message: dict[str, Any] = {"role": "assistant", "content": None}
        messages.append(message)
        return message

    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InputError(f"'{where}' must be an object", where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise InputError(f"'{where}.role' must be user, system, developer or assistant", f"{where}.role")
            content = _text_of_parts(item.get("content"), f"{where}.content")
            if role == "assistant":
                message = open_assistant()
                if message.get("tool_calls"):  # text after calls: a new message
                    message["_closed"] = True
                    message = open_assistant()
                text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
                message["content"] = (message["content"] or "") + text
            else:
                messages.append({"role": role, "content": content})
        elif kind == "function_call":
            for key in ("call_id", "name"):
                if not isinstance(item.get(key), str) or not item[key]:
                    raise InputError(f"'{where}.{key}' must be a non-empty string", f"{where}.{key}")
            message = open_assistant()
            arguments = item.get("arguments")
            message.setdefault("tool_calls", []).append(
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item["name"], "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments or {})},
                }
            )
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str) or not item["call_id"]:
                raise InputError(f"'{where}.call_id' must be a non-empty string", f"{where}.call_id")
            output = item.get("output")
            if not isinstance(output, str):
                output = _text_of_parts(output, f"{where}.output")
                output = output if isinstance(output, str) else json.dumps(output)
            if messages and messages[-1]["role"] == "assistant":
                messages[-1]["_closed"] = True
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind in ("reasoning", "item_reference"):
            continue
        else:
            raise InputError(f"'{where}.type' {kind!r} is not supported (message, function_call, function_call_output, reasoning)", f"{where}.type")
    for message in messages:
        message.pop("_closed", None)
    if not messages:
        raise InputError("'input' has no message to answer", "input")
    return messages


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses function tools as Chat Completions tools (client tools)."""
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise InputError(
                f"'tools[{i}].type' {kind!r} is not supported: only function tools (use tool_ids and features for turnlog's own)", f"tools[{i}].type"
            )
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise InputError(f"'tools[{i}].name' must be a non-empty string", f"tools[{i}].name")
        function: dict[str, Any] = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
        if tool.get("description"):
            function["description"] = tool["description"]
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if choice in ("auto", "none", "required"):
        return choice
    raise InputError("'tool_choice' must be auto, none, required or {type: function, name}", "tool_choice")


# --- the response object ------------------------------------------------------


def _usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    inp = int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)
    out = int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)
    details = usage.get("completion_tokens_details") or usage.get("output_tokens_details") or {}
    cached = (usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
    return {
        "input_tokens": inp,
        "input_tokens_details": {"cached_tokens": int(cached), "cache_write_tokens": 0},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": int(details.get("reasoning_tokens") or 0)},
        "total_tokens": int(usage.get("total_tokens") or inp + out),
    }


def response_tools(request: dict[str, Any]) -> list[dict[str, Any]]:
    tools = []
    for tool in request.get("tools") or []:
        fn = tool.get("function") or {}
        tools.append(
            {
                "type": "function",
                "name": fn.get("name"),
                "description": fn.get("description"),
                "parameters": fn.get("parameters"),
                "strict": fn.get("strict", False),
            }
        )
    return tools


def base_object(view: TurnView) -> dict[str, Any]:
    """The response object's fields that the request decides."""
    request = view.request
    recorded = request.get(RECORD_KEY)
    record = recorded if isinstance(recorded, dict) else {}
    choice = request.get("tool_choice", "auto")
    if isinstance(choice, dict):
        function = choice.get("function")
        choice = {"type": "function", "name": function.get("name") if isinstance(function, dict) else None}
    return {
        "id": response_id(view.id),
        "object": "response",
        "created_at": int(view.created_at or 0),
        "status": "in_progress",
        "background": bool(record.get("background")),
        "error": None,
        "incomplete_details": None,
        "instructions": record.get("instructions"),
        "max_output_tokens": request.get("max_tokens"),
        "model": view.model,
        "output": [],
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": record.get("previous_response_id"),
        "store": record.get("store", True),
        "temperature": request.get("temperature"),
        "text": {"format": {"type": "text"}},
        "tool_choice": choice,
        "tools": response_tools(request),
        "top_p": request.get("top_p"),
        "truncation": "disabled",
        "usage": None,
        "metadata": record.get("metadata") or {},
        "turnlog": {"turn_id": view.id, "chat_id": view.chat_id},
    }


# --- the stream ---------------------------------------------------------------


class _Item:
    __slots__ = ("index", "item", "kind", "text", "delta_prefix")

    def __init__(self, index: int, item: dict[str, Any], kind: str) -> None:
        self.index = index
        self.item = item
        self.kind = kind  # "text" | "reasoning"
        self.text: list[str] = []
        delta_type = "response.output_text.delta" if kind == "text" else "response.reasoning_text.delta"
        # Every delta of this item shares its head: serialized once.
        self.delta_prefix = b'{"type":"%s","item_id":%s,"output_index":%d,"content_index":0,"delta":' % (
            delta_type.encode(),
            _dumpb(item["id"]),
            index,
        )


class ResponsesRenderer:
    """Renders one client's Responses SSE stream of a turn (and, with
    ``emit=False``, just folds the response object).

    Every output position is taken once (``last_sent``); ``sequence_number``
    counts every event derived so far, and only events after ``starting_after``
    are written.
    """

    def __init__(self, view: TurnView, *, starting_after: int = -1, emit: bool = True) -> None:
        self.view = view
        self.last_sent = 0
        self.starting_after = starting_after
        self.emit = emit
        self.seq = -1
        self.done = False
        self.status: str | None = None  # the terminal status, once derived
        self.output: list[dict[str, Any]] = []
        self._open: _Item | None = None
        self._parts: list[bytes] = []
        self._error: dict[str, Any] | None = None
        self._incomplete: dict[str, Any] | None = None
        self._head: dict[str, Any] | None = None
        # The client's function calls shown while the model writes them: call id -> (output index, item).
        self._writing: dict[str, tuple[int, dict[str, Any]]] = {}
        self._client_names: set[str] | None = None

    # -- writing --

    def _next(self) -> int | None:
        """The next sequence number, or None when it is not to be written."""
        self.seq += 1
        return self.seq if self.emit and self.seq > self.starting_after else None

    def _event(self, type_: str, body: dict[str, Any]) -> None:
        n = self._next()
        if n is None:
            return
        payload = _dumpb({"type": type_, **body, "sequence_number": n})
        self._parts.append(b"event: %s\ndata: %s\n\n" % (type_.encode(), payload))

    def _item_id(self, prefix: str) -> str:
        return f"{prefix}_{self.view.id}_{len(self.output)}"

    # -- items --

    def _open_item(self, kind: str) -> _Item:
        if self._open is not None and self._open.kind == kind:
            return self._open
        self._close_item("completed")
        index = len(self.output)
        if kind == "text":
            item: dict[str, Any] = {"id": self._item_id("msg"), "type": "message", "status": "in_progress", "content": [], "role": "assistant"}
            part: dict[str, Any] = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
        else:
            item = {"id": self._item_id("rs"), "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
            part = {"type": "reasoning_text", "text": ""}
        self.output.append(item)
        opened = self._open = _Item(index, item, kind)
        self._event("response.output_item.added", {"output_index": index, "item": item})
        self._event("response.content_part.added", {"item_id": item["id"], "output_index": index, "content_index": 0, "part": part})
        return opened

    def _close_item(self, status: str) -> None:
        opened, self._open = self._open, None
        if opened is None:
            return
        text = "".join(opened.text)
        item, index = opened.item, opened.index
        if opened.kind == "text":
            part: dict[str, Any] = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
            self._event("response.output_text.done", {"item_id": item["id"], "output_index": index, "content_index": 0, "text": text, "logprobs": []})
        else:
            part = {"type": "reasoning_text", "text": text}
            self._event("response.reasoning_text.done", {"item_id": item["id"], "output_index": index, "content_index": 0, "text": text})
        self._event("response.content_part.done", {"item_id": item["id"], "output_index": index, "content_index": 0, "part": part})
        item["content"] = [part]
        item["status"] = status
        self._event("response.output_item.done", {"output_index": index, "item": item})

    def _pieces(self, pieces: tuple[Any, ...]) -> None:
        for piece in pieces:
            if piece.kind == "tool_arguments":
                self._arguments_delta(piece.call_id, piece.text)
                continue
            if piece.kind not in ("text", "reasoning") or not piece.text:
                continue
            opened = self._open_item(piece.kind)
            opened.text.append(piece.text)
            n = self._next()
            if n is not None:
                # The hot path: one prefix, the delta, the number.
                if opened.kind == "text":
                    tail = b',"logprobs":[],"sequence_number":%d}' % n
                    self._parts.append(b"event: response.output_text.delta\ndata: " + opened.delta_prefix + _dumpb(piece.text) + tail + b"\n\n")
                else:
                    tail = b',"sequence_number":%d}' % n
                    self._parts.append(b"event: response.reasoning_text.delta\ndata: " + opened.delta_prefix + _dumpb(piece.text) + tail + b"\n\n")

    def _text_run(self, texts: list[str]) -> None:
        """``_pieces`` for a run of plain text chunks (one text piece each):
        one formatting per chunk, the same bytes."""
        opened = self._open_item("text")
        opened.text.extend(texts)
        first = self.seq + 1
        self.seq += len(texts)
        if not self.emit:
            return
        head = b"event: response.output_text.delta\ndata: " + opened.delta_prefix
        after, dumpb, message = self.starting_after, _dumpb, _TEXT_DELTA
        self._parts += [message % (head, dumpb(text), n) for n, text in zip(range(first, first + len(texts)), texts) if n > after]

    def _call_started(self, item: dict[str, Any]) -> None:
        """A call announced while the model writes it: a call of the client's
        function tools is streamed as the Responses API streams one."""
        if self._client_names is None:
            self._client_names = client_tool_names(self.view.request)
        if item.get("type") != "function_call" or item.get("name") not in self._client_names or item["call_id"] in self._writing:
            return
        self._close_item("completed")
        index = len(self.output)
        call = {"id": self._item_id("fc"), "type": "function_call", "status": "in_progress", "call_id": item["call_id"], "name": item["name"], "arguments": ""}
        self.output.append(call)
        self._writing[item["call_id"]] = (index, call)
        self._event("response.output_item.added", {"output_index": index, "item": dict(call)})

    def _arguments_delta(self, call_id: str | None, text: str) -> None:
        written = self._writing.get(call_id or "")
        if written is None or not text:
            return
        index, call = written
        call["arguments"] += text
        self._event("response.function_call_arguments.delta", {"item_id": call["id"], "output_index": index, "delta": text})

    def _end_call(self, index: int, item: dict[str, Any], arguments: str, status: str) -> None:
        self._event("response.function_call_arguments.done", {"item_id": item["id"], "output_index": index, "name": item["name"], "arguments": arguments})
        item["arguments"] = arguments
        item["status"] = status
        self._event("response.output_item.done", {"output_index": index, "item": dict(item)})

    def _stop_calls(self, status: str) -> None:
        """The turn ended while calls were being written: they end ``status``."""
        for index, item in self._writing.values():
            if item["status"] == "in_progress":
                self._end_call(index, item, item["arguments"], status)

    def _function_calls(self, calls: list[dict[str, Any]]) -> None:
        self._close_item("completed")
        for call in calls:
            written = self._writing.get(call["call_id"])
            if written is not None:
                self._end_call(*written, call.get("arguments") or "", "completed")
                continue
            index = len(self.output)
            item = {
                "id": self._item_id("fc"),
                "type": "function_call",
                "status": "in_progress",
                "call_id": call["call_id"],
                "name": call["name"],
                "arguments": "",
            }
            self.output.append(item)
            arguments = call.get("arguments") or ""
            self._event("response.output_item.added", {"output_index": index, "item": dict(item)})
            if arguments:
                self._event("response.function_call_arguments.delta", {"item_id": item["id"], "output_index": index, "delta": arguments})
            self._event("response.function_call_arguments.done", {"item_id": item["id"], "output_index": index, "name": call["name"], "arguments": arguments})
            item["arguments"] = arguments
            item["status"] = "completed"
            self._event("response.output_item.done", {"output_index": index, "item": dict(item)})

    # -- the response --

    def snapshot(self, status: str) -> dict[str, Any]:
        if self._head is None:
            self._head = base_object(self.view)
        body = {**self._head, "status": status, "output": [dict(i) for i in self.output]}
        if status in ("completed", "incomplete", "failed", "cancelled"):
            body["usage"] = _usage(self.view.reply_usage)
            if self.view.usage_estimated:  # counted by turnlog: the upstream reported no usage
                body["usage_estimated"] = True
            body["error"] = self._error
            body["incomplete_details"] = self._incomplete
            if status == "completed":
                body["completed_at"] = int(self.view.updated_at or 0)
        return body

    def current(self) -> dict[str, Any]:
        """The response as derived so far: its end, or ``in_progress`` with the
        output so far (the open item with its text so far)."""
        if self.status is not None:
            return self.snapshot(self.status)
        body = self.snapshot("in_progress")
        opened = self._open
        if opened is not None:
            part_type = "output_text" if opened.kind == "text" else "reasoning_text"
            part: dict[str, Any] = {"type": part_type, "text": "".join(opened.text)}
            if part_type == "output_text":
                part.update(annotations=[], logprobs=[])
            body["output"][opened.index] = {**opened.item, "content": [part]}
        return body

    def _finish(self, status: str, type_: str) -> None:
        self.status = status
        self.done = True
        self._event(type_, {"response": self.snapshot(status)})

    def _on_event(self, out: EventOut) -> None:
        event: Event = out.event
        t = event.type
        if t == "turn.started":
            self._event("response.created", {"response": self.snapshot("in_progress")})
            self._event("response.in_progress", {"response": self.snapshot("in_progress")})
        elif t == "model.item" and event.data["item"].get("status") == "in_progress":
            self._call_started(event.data["item"])
        elif t == "model.completed":
            self._close_item("completed")
        elif t == "turn.resumed" and out.resume is not None and out.resume.mode == "restart":
            # The cut-off round is answered afresh: its partial item ends
            # incomplete, and the new answer streams as a new item.
            self._close_item("incomplete")
        elif t == "tools.batch":
            self._close_item("completed")
            if event.data.get("client_calls"):
                self._function_calls(list(event.data["client_calls"]))
        elif t == "turn.iteration_limit":
            self._incomplete = {"reason": "max_tool_calls"}
        elif t in ("background.started", "turn.completed"):
            self._close_item("completed")
            self._stop_calls("incomplete")  # announced, never handed to the client
            reason = self.view.finish_reason
            if self._incomplete is None and reason in ("length", "content_filter"):
                self._incomplete = {"reason": "max_output_tokens" if reason == "length" else "content_filter"}
            if self._incomplete is not None:
                self._finish("incomplete", "response.incomplete")
            else:
                self._finish("completed", "response.completed")
        elif t == "turn.cancelled":
            self._close_item("incomplete")
            self._stop_calls("incomplete")
            self._finish("cancelled", "response.incomplete")
        elif t == "turn.failed":
            self._close_item("incomplete")
            self._stop_calls("incomplete")
            answer = turn_error(event.data.get("error") or {})
            self._error = {"code": answer.code or answer.type, "message": answer.message, "param": answer.param}
            # The error object a request refused before its stream gets, then the failed response.
            self._event("error", dict(self._error))
            self._finish("failed", "response.failed")

    def render(self, outs: list[Out]) -> bytes:
        if any(type(out) is LiveChunks and not _plain_text(out) for out in outs):
            # Live chunks other than plain text: one by one.
            outs = [c for out in outs for c in (chunk_outs(out) if type(out) is LiveChunks and not _plain_text(out) else (out,))]
        for out in outs:
            if isinstance(out, LiveChunks):
                later = None if self.done else out.since(self.last_sent + 1)  # not those a reconnect already had
                if later is not None:
                    self._text_run(later.texts)
                    self.last_sent = later.end - 1
                continue
            if out.pos <= self.last_sent or self.done:
                continue
            if not isinstance(out, EventOut):
                self._pieces(out.pieces)
            else:
                if out.pieces:
                    self._pieces(out.pieces)
                self._on_event(out)
            self.last_sent = out.pos
        if not self._parts:
            return b""
        data = b"".join(self._parts)
        self._parts = []
        return data


_TEXT_DELTA = b'%s%s,"logprobs":[],"sequence_number":%d}\n\n'


def _plain_text(chunks: LiveChunks) -> bool:
    return chunks.plain and chunks.kind == "text"


def fold_response(turn_id: str, events: list[Event]) -> tuple[dict[str, Any], TurnView]:
    """The response object of a turn: the stream derivation over its log."""
    follower = TurnFollower(turn_id)
    renderer = ResponsesRenderer(follower.view, emit=False)
    for event in events:
        renderer.render(follower.on_event(event))
    return renderer.current(), follower.view


def response_of(view: TurnView, outs: list[Out]) -> dict[str, Any]:
    """The response object from a follower's output (a running turn: the log
    and the live chunks not yet written to it, as a joining client sees them)."""
    renderer = ResponsesRenderer(view, emit=False)
    renderer.render(outs)
    return renderer.current()
