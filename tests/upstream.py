"""A scripted OpenAI-compatible upstream: a real aiohttp server on loopback.

It speaks the exact Chat Completions wire format (checked against the official
``openai`` SDK in ``tests/test_provider_openai_chat.py``), and each request is
answered by the next scripted ``Reply``. Use it wherever a test needs a model::

    from tests.upstream import Reply, ScriptedUpstream

    async with ScriptedUpstream() as up:          # or: url = await up.start() ... await up.close()
        up.enqueue(Reply(chunks=["Hel", "lo"]), Reply(status=500))
        provider = OpenAIChatProvider(up.url, "key")
        ...
        assert up.requests[0]["messages"][-1]["content"] == "hi"

Endpoints (under the base URL ``http://127.0.0.1:PORT/v1``):

* ``POST /v1/chat/completions`` – streaming (``"stream": true``) or not.
* ``GET  /v1/models`` – ``{"object": "list", "data": [{"id", "object": "model", "created", "owned_by": "scripted"}]}``.

Streaming bytes, in order (each event is ``data: <compact JSON>\\n\\n``):

1. a role chunk ``delta: {"role": "assistant", "content": ""}``;
2. ``reasoning`` pieces as ``delta: {"reasoning_content": …}``;
3. content pieces as ``delta: {"content": …}``;
4. ``tool_calls`` fragments (OpenAI shape, keyed by ``index``);
5. a finish chunk ``delta: {}`` with ``finish_reason``;
6. only if the request had ``stream_options.include_usage``: a usage chunk with
   ``choices: []`` (and, as OpenAI does, ``"usage": null`` on every other chunk);
7. ``data: [DONE]``.

Faults (``Reply.fault``) happen after ``fault_after`` *content* chunks (a count
beyond the last chunk means: after the last chunk, before the finish chunk):

* ``"disconnect"`` – the socket is closed abruptly in the middle of the chunked
  body, so the client sees a transport error (not a clean end);
* ``"truncate"``   – the body ends cleanly, without finish chunk or ``[DONE]``;
* ``"malformed"``  – a ``data: {not json`` line is inserted, then the stream goes on;
* ``"hang"``       – nothing more is sent, the socket stays open (until ``close()``).

For a non-streaming request: ``disconnect`` closes the socket before any
response, ``hang`` never answers, ``truncate`` sends half the JSON body and
``malformed`` sends ``{not json``.

Prefill continuation: if the last request message is ``role: "assistant"`` with
text P and the reply's full text starts with P, only the remainder is sent (as
providers that continue an assistant prefill do); the reasoning is then not
repeated, and ``fault_after`` / ``pause_after`` count chunks of the remainder.

Also runnable as a process, for tests that run the service in a subprocess::

    python -m tests.upstream --port 0 --script replies.json

where the file holds a list of ``Reply`` dicts (or ``{"replies": [...],
"default": {...}, "models": [...]}``). The base URL is printed on stdout (one
line) once the server listens; SIGTERM/SIGINT stop it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal
import sys
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = ["Reply", "ScriptedUpstream", "FAULTS"]

FAULTS = ("disconnect", "truncate", "malformed", "hang")


@dataclass
class Reply:
    """One scripted answer to one ``/chat/completions`` request."""

    chunks: list[str] | None = None
    """Content chunks, sent exactly as given (one ``delta.content`` each)."""
    text: str | None = None
    """Alternative to ``chunks``: split into pieces of ``chunk_size`` characters."""
    chunk_size: int = 4
    reasoning: list[str] = field(default_factory=list)
    """Sent first, one ``delta.reasoning_content`` each."""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """Tool calls sent after the content: ``{"name", "arguments" (str or JSON-able),
    "id"?}``; the arguments string is streamed in ``chunk_size`` fragments.
    Remember ``finish_reason="tool_calls"`` (it is not changed for you)."""
    finish_reason: str = "stop"
    usage: dict[str, Any] | None = None
    """Default: prompt_tokens ~ request chars / 4, completion_tokens = number of
    content + reasoning chunks sent."""
    delay: float = 0.0
    """Seconds to wait before each content/reasoning chunk."""
    status: int = 200
    """>= 400: answer with an OpenAI error JSON body and this status."""
    error_message: str = "scripted failure"
    fault: str | None = None
    """One of ``FAULTS`` (see the module docstring)."""
    fault_after: int = 0
    pause_after: int | None = None
    """After this many content chunks (capped at the last one), set
    ``upstream.paused`` and wait for ``release()``."""
    comments: bool = False
    """Interleave ``: keep-alive`` SSE comment lines."""

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; expected one of {FAULTS}")
        if self.chunks is not None and self.text is not None:
            raise ValueError("give either chunks or text, not both")
        if self.chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Reply:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown Reply fields: {sorted(unknown)}")
        return cls(**data)

    def content_chunks(self) -> list[str]:
        """The content pieces this reply sends (before any prefill is skipped)."""
        if self.chunks is not None:
            return list(self.chunks)
        text = self.text or ""
        n = self.chunk_size
        return [text[i : i + n] for i in range(0, len(text), n)]

    @property
    def full_text(self) -> str:
        return "".join(self.content_chunks())


class _Closing(Exception):
    """The server is shutting down (or the client went away): stop this response."""


class ScriptedUpstream:
    """A loopback OpenAI-compatible server answering with scripted ``Reply`` objects.

    Attributes:
        models:          ids listed by ``GET /v1/models``.
        default:         the reply used when the queue is empty.
        requests:        every JSON body received on ``/chat/completions``, in order.
        request_headers: the headers of those requests (same order).
        paused:          set when a stream reaches ``pause_after``; cleared by ``release()``.
        url:             the base URL (``http://127.0.0.1:PORT/v1``) once started.
    """

    def __init__(
        self,
        *,
        models: list[str] | None = None,
        default: Reply | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.models: list[str] = list(models) if models is not None else ["gpt-test"]
        self.default: Reply = default if default is not None else Reply(text="Hello from the scripted upstream.")
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []
        self.paused = asyncio.Event()
        self.url: str | None = None
        self._host = host
        self._port = port
        self._queue: deque[Reply] = deque()
        self._release = asyncio.Event()
        self._closing = asyncio.Event()
        self._transports: set[asyncio.BaseTransport] = set()
        self._runner: web.AppRunner | None = None

    # -- public API ------------------------------------------------------------

    def enqueue(self, *replies: Reply) -> None:
        """Queue replies, answered first-in first-out; ``default`` once empty."""
        self._queue.extend(replies)

    @property
    def pending(self) -> int:
        """How many queued replies have not been used yet."""
        return len(self._queue)

    async def start(self) -> str:
        """Start listening; returns the base URL ``http://127.0.0.1:PORT/v1``."""
        if self._runner is not None:
            assert self.url is not None
            return self.url
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port)
        await site.start()
        self._runner = runner
        port = runner.addresses[0][1]
        self.url = f"http://{self._host}:{port}/v1"
        return self.url

    async def close(self) -> None:
        """Stop the server; paused, hanging or slow streams are cut off."""
        self._closing.set()
        self._release.set()
        for transport in list(self._transports):
            transport.abort()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    def release(self) -> None:
        """Let every stream paused at ``pause_after`` continue; clears ``paused``."""
        self._release.set()
        self._release = asyncio.Event()
        self.paused.clear()

    async def __aenter__(self) -> ScriptedUpstream:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- handlers --------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        now = int(time.time())
        data = [{"id": m, "object": "model", "created": now, "owned_by": "scripted"} for m in self.models]
        return web.json_response({"object": "list", "data": data})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error_response(400, "We could not parse the JSON body of your request.")
        if not isinstance(body, dict):
            return _error_response(400, "The request body must be a JSON object.")
        self.requests.append(body)
        self.request_headers.append(dict(request.headers))
        reply = self._queue.popleft() if self._queue else self.default

        if reply.status >= 400:
            return _error_response(reply.status, reply.error_message)

        transport = request.transport
        if transport is not None:
            self._transports.add(transport)
        try:
            if body.get("stream"):
                return await self._stream(request, body, reply)
            return await self._complete(request, body, reply)
        except (_Closing, ConnectionError):
            _abort(request)
            return web.Response()  # never sent: the transport is gone
        finally:
            if transport is not None:
                self._transports.discard(transport)

    async def _complete(self, request: web.Request, body: dict[str, Any], reply: Reply) -> web.StreamResponse:
        plan = _Plan(body, reply)
        if reply.fault == "disconnect":
            raise _Closing
        if reply.fault == "hang":
            await self._wait(self._closing)
            raise _Closing
        for _ in plan.content:
            if reply.delay:
                await self._sleep(reply.delay)
        text = "".join(plan.content)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": text if (text or not plan.tool_calls) else None,
            "refusal": None,
        }
        if plan.reasoning:
            message["reasoning_content"] = "".join(plan.reasoning)
        if plan.tool_calls:
            message["tool_calls"] = [
                {"id": tc["id"], "type": "function", "function": {"name": tc["name"], "arguments": tc["arguments"]}}
                for tc in plan.tool_calls
            ]
        obj = {
            "id": plan.id,
            "object": "chat.completion",
            "created": plan.created,
            "model": plan.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish_reason}],
            "usage": plan.usage(),
        }
        raw = json.dumps(obj).encode()
        if reply.fault == "truncate":
            raw = raw[: len(raw) // 2]
        elif reply.fault == "malformed":
            raw = b"{not json"
        return web.Response(body=raw, content_type="application/json")

    async def _stream(self, request: web.Request, body: dict[str, Any], reply: Reply) -> web.StreamResponse:
        plan = _Plan(body, reply)
        resp = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "X-Request-Id": "req_" + uuid.uuid4().hex,
            },
        )
        await resp.prepare(request)
        include_usage = plan.include_usage
        comments = reply.comments

        async def send(choices: list[dict[str, Any]], usage: Any = None, *, last: bool = False) -> None:
            chunk: dict[str, Any] = {
                "id": plan.id,
                "object": "chat.completion.chunk",
                "created": plan.created,
                "model": plan.model,
                "system_fingerprint": None,
                "choices": choices,
            }
            if include_usage:
                chunk["usage"] = usage
            data = b"data: " + json.dumps(chunk, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"
            if comments:
                data += b": keep-alive\n\n"
            await resp.write(data)

        def delta(d: dict[str, Any]) -> list[dict[str, Any]]:
            return [{"index": 0, "delta": d, "logprobs": None, "finish_reason": None}]

        if comments:
            await resp.write(b": keep-alive\n\n")
        await send(delta({"role": "assistant", "content": ""}))
        for piece in plan.reasoning:
            if reply.delay:
                await self._sleep(reply.delay)
            await send(delta({"reasoning_content": piece}))

        sent = 0
        # fault_after / pause_after beyond the last chunk mean "after the last chunk".
        fault_at = min(reply.fault_after, len(plan.content))
        pause_at = None if reply.pause_after is None else min(reply.pause_after, len(plan.content))
        for piece in [*plan.content, None]:  # None: the point after the last chunk
            if reply.fault is not None and sent == fault_at:
                if reply.fault == "disconnect":
                    raise _Closing
                if reply.fault == "truncate":
                    await resp.write_eof()
                    return resp
                if reply.fault == "hang":
                    await self._wait(self._closing)
                    raise _Closing
                if reply.fault == "malformed":
                    await resp.write(b"data: {not json\n\n")
            if sent == pause_at:
                release = self._release
                self.paused.set()
                await self._wait(release)
            if piece is None:
                break
            if reply.delay:
                await self._sleep(reply.delay)
            await send(delta({"content": piece}))
            sent += 1

        for i, tc in enumerate(plan.tool_calls):
            args = tc["arguments"]
            await send(
                delta(
                    {
                        "tool_calls": [
                            {
                                "index": i,
                                "id": tc["id"],
                                "type": "function",
                                "function": {"name": tc["name"], "arguments": ""},
                            }
                        ]
                    }
                )
            )
            n = reply.chunk_size
            for j in range(0, len(args), n):
                await send(delta({"tool_calls": [{"index": i, "function": {"arguments": args[j : j + n]}}]}))

        await send([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": reply.finish_reason}])
        if include_usage:
            await send([], plan.usage())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    # -- waiting ---------------------------------------------------------------

    async def _wait(self, event: asyncio.Event) -> None:
        """Wait for ``event``; raise ``_Closing`` if the server closes first."""
        if self._closing.is_set():
            raise _Closing
        if event is self._closing:
            await event.wait()
            raise _Closing
        waiters = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._closing.wait())}
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        if self._closing.is_set():
            raise _Closing

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._closing.wait(), seconds)
        except asyncio.TimeoutError:
            return
        raise _Closing


class _Plan:
    """What one request gets: the reply's pieces after prefill continuation."""

    def __init__(self, body: dict[str, Any], reply: Reply) -> None:
        self.body = body
        self.reply = reply
        self.id = "chatcmpl-" + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = body.get("model") or "gpt-test"
        opts = body.get("stream_options")
        self.include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
        content = reply.content_chunks()
        reasoning = list(reply.reasoning)
        prefill = _prefill(body)
        if prefill and "".join(content).startswith(prefill):
            content = _skip_prefix(content, len(prefill))
            reasoning = []
        self.content = content
        self.reasoning = reasoning
        self.tool_calls = [
            {
                "id": tc.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                "name": tc["name"],
                "arguments": tc.get("arguments", "")
                if isinstance(tc.get("arguments", ""), str)
                else json.dumps(tc["arguments"]),
            }
            for tc in reply.tool_calls
        ]

    def usage(self) -> dict[str, Any]:
        if self.reply.usage is not None:
            return dict(self.reply.usage)
        chars = 0
        for m in self.body.get("messages") or ():
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                chars += len(c)
            elif isinstance(c, list):
                chars += sum(len(p.get("text", "")) for p in c if isinstance(p, dict))
        prompt = max(1, chars // 4)
        completion = len(self.content) + len(self.reasoning) + len(self.tool_calls)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _prefill(body: dict[str, Any]) -> str | None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant":
        return None
    content = last.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) and content else None


def _skip_prefix(chunks: list[str], n: int) -> list[str]:
    out: list[str] = []
    for chunk in chunks:
        if n >= len(chunk):
            n -= len(chunk)
            continue
        out.append(chunk[n:])
        n = 0
    return out


def _error_response(status: int, message: str) -> web.Response:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    code = {401: "invalid_api_key", 404: "model_not_found", 429: "rate_limit_exceeded"}.get(status)
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": None, "code": code}}, status=status
    )


def _abort(request: web.Request) -> None:
    transport = request.transport
    if transport is not None and not transport.is_closing():
        transport.abort()


# -- standalone process ----------------------------------------------------------


def _load_script(path: str) -> tuple[list[Reply], Reply | None, list[str] | None]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if isinstance(data, list):
        return [Reply.from_dict(r) for r in data], None, None
    replies = [Reply.from_dict(r) for r in data.get("replies", [])]
    default = Reply.from_dict(data["default"]) if data.get("default") is not None else None
    return replies, default, data.get("models")


async def _serve(host: str, port: int, script: str | None) -> None:
    replies: list[Reply] = []
    default = models = None
    if script:
        replies, default, models = _load_script(script)
    upstream = ScriptedUpstream(host=host, port=port, default=default, models=models)
    upstream.enqueue(*replies)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    url = await upstream.start()
    print(url, flush=True)
    try:
        await stop.wait()
    finally:
        await upstream.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.upstream", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--script", help="JSON file: a list of Reply dicts (or {replies, default, models})")
    args = parser.parse_args(argv)
    try:
        asyncio.run(_serve(args.host, args.port, args.script))
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
