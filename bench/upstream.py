"""A fast OpenAI-compatible upstream for benchmarks (runs in its own process).

    python -m bench.upstream [--host 127.0.0.1] [--port 0]

prints its base URL (``http://127.0.0.1:PORT/v1``) on stdout once listening;
SIGTERM/SIGINT stop it.

``POST /v1/chat/completions`` (streaming only) answers with the exact Chat
Completions chunk format: a role chunk (``delta: {"role": "assistant",
"content": ""}``), N content chunks (``delta: {"content": ...}``), a finish
chunk (``delta: {}``, ``finish_reason: "stop"``), a usage chunk
(``choices: []``) only if ``stream_options.include_usage`` (and then
``"usage": null`` on every other chunk), and ``data: [DONE]``.

What is sent is steered by the request body (top-level fields, which turnlog
forwards upstream unchanged) or by the model name:

* ``bench_chunks`` (int): number of content chunks; or a model ``fast-N``
  / ``paced-N-R``;
* ``bench_rate`` (float, chunks/s): 0 or absent = as fast as the socket allows:
  the whole body is pre-serialized and written in blocks of ``bench_block``
  bytes (default 64 KiB); > 0 = paced: one event per write, chunk i at
  ``t0 + i / rate``;
* ``bench_stamp`` (bool, paced mode): each content chunk's text is
  ``@<time.monotonic() at write>`` followed by a space, so a client on the same
  host can compute the one-way delivery latency of every chunk;
* ``bench_tokens`` (list of str): the content pieces, cycled (default: English
  words of ~4.5 bytes on average, none holding a ``<``);
* ``bench_tool_rounds`` (int N): a tool loop. While the request holds fewer
  than N ``role: "tool"`` messages, the answer is one call of the tool
  ``bench_tool`` (default ``noop``, arguments ``bench_tool_args``, default
  ``"{}"``): a chunk ``delta: {"role": "assistant", "content": null,
  "tool_calls": [{"index": 0, "id": "call_K", "type": "function", "function":
  {...}}]}`` (K = the number of tool messages), a finish chunk with
  ``finish_reason: "tool_calls"``, the usage chunk if asked, ``[DONE]``; once N
  tool results are there, the usual text answer.

Task-model prompts (a request whose last user message starts with ``### Task:``
and asks for one JSON object ``{"queries": ...}``, ``{"title": ...}``,
``{"tags": ...}`` or ``{"follow_ups": ...}``, and that carries no ``bench_*``
field) are answered with that JSON, streamed as one content chunk: the queries
are the last ``USER:`` line of the prompt's ``<chat_history>`` (one query).

``POST /v1/embeddings`` (OpenAI's shapes: ``{"input": str | [str], "model",
"encoding_format"?: "float" | "base64", "dimensions"?}`` →
``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
"model", "usage"}``): each vector is a signed hashed bag of the text's
lower-cased words (blake2b), L2-normalized, ``dimensions`` long (default 256):
deterministic, and texts that share words are near each other.

``POST /bench/record`` ``{"on": bool}`` switches recording on or off and
returns (and forgets) what was recorded so far: ``{"records": [{"kind":
"chat" | "task" | "embeddings", "bytes": <request body size>, "server_ms":
<handler time, request read to response end>, "body": <the parsed body>}]}``.

``POST /bench/release`` makes every paced stream in progress skip its remaining
chunks and finish at once (finish chunk, usage, ``[DONE]``): benchmarks that
hold many turns open use it to end them. ``GET /bench/stats`` returns counters.
``GET /v1/models`` lists ``bench``, ``bench-fast``, ``bench-paced`` (any model
name is accepted by ``/chat/completions``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import heapq
import json
import math
import re
import signal
import struct
import sys
import time
import uuid
from typing import Any

from aiohttp import web

MODELS = ["bench", "bench-fast", "bench-paced"]
DEFAULT_TOKENS = [
    "The",
    " quick",
    " brown",
    " fox",
    " jumps",
    " over",
    " the",
    " lazy",
    " dog",
    ".",
    " It",
    " was",
    " a",
    " bright",
    " cold",
    " day",
    " in",
    " April",
    ",",
    " and",
    " the",
    " clocks",
    " were",
    " striking",
    " thirteen",
    ".",
    " Call",
    " me",
    " Ishmael",
    "!",
]
DEFAULT_CHUNKS = 20
BLOCK = 64 * 1024
EMBEDDING_DIM = 256
TASK_KEYS = ("queries", "title", "tags", "follow_ups")
TASK_ANSWERS: dict[str, Any] = {"title": "Bench chat", "tags": ["General"], "follow_ups": ["Tell me more."]}
_WORD = re.compile(r"\w+")
_USER_LINE = re.compile(r"^user:[ \t]*(.+)$", re.IGNORECASE | re.MULTILINE)

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class Upstream:
    def __init__(self) -> None:
        self.pacer = Pacer()
        self.active = 0
        self.started = 0
        self.completed = 0
        self.aborted = 0
        self.tool_calls = 0
        self.task_calls = 0
        self.embedding_calls = 0
        self.recording: list[dict[str, Any]] | None = None

    # -- handlers ---------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        now = int(time.time())
        return web.json_response({"object": "list", "data": [{"id": m, "object": "model", "created": now, "owned_by": "bench"} for m in MODELS]})

    async def release(self, request: web.Request) -> web.Response:
        return web.json_response({"released": self.pacer.release()})

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "active": self.active,
                "started": self.started,
                "completed": self.completed,
                "aborted": self.aborted,
                "tool_calls": self.tool_calls,
                "task_calls": self.task_calls,
                "embedding_calls": self.embedding_calls,
            }
        )

    async def record(self, request: web.Request) -> web.Response:
        try:
            on = bool((await request.json()).get("on"))
        except (ValueError, AttributeError):
            return _error(400, 'bench upstream: /bench/record wants {"on": true|false}')
        records = self.recording or []
        self.recording = [] if on else None
        return web.json_response({"records": records})

    def _record(self, kind: str, raw: bytes, body: Any, t0: float) -> None:
        if self.recording is not None:
            self.recording.append({"kind": kind, "bytes": len(raw), "server_ms": round((time.perf_counter() - t0) * 1000, 3), "body": body})

    async def embeddings(self, request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "We could not parse the JSON body of your request.")
        inputs = body.get("input") if isinstance(body, dict) else None
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs or not all(isinstance(t, str) and t for t in inputs):
            return _error(400, "'$.input' is invalid: a non-empty string or list of non-empty strings")
        dim = body.get("dimensions") or EMBEDDING_DIM
        if not isinstance(dim, int) or dim < 1:
            return _error(400, "Invalid value for 'dimensions': must be a positive integer.")
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            return _error(400, f"Invalid value for 'encoding_format': {fmt!r}.")
        data: list[dict[str, Any]] = []
        for i, text in enumerate(inputs):
            vector: Any = hashed_embedding(text, dim)
            if fmt == "base64":
                vector = base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode()
            data.append({"object": "embedding", "index": i, "embedding": vector})
        tokens = sum(max(1, len(_WORD.findall(t))) for t in inputs)
        out = {"object": "list", "data": data, "model": str(body.get("model") or "bench-embed"), "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        resp = web.Response(body=_dumps(out).encode(), content_type="application/json")
        self.embedding_calls += 1
        self._record("embeddings", raw, body, t0)
        return resp

    async def chat(self, request: web.Request) -> web.StreamResponse:
        t0 = time.perf_counter()
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "We could not parse the JSON body of your request.")
        if not isinstance(body, dict) or not body.get("stream"):
            return _error(400, "bench upstream: only stream=true is supported")
        task = task_reply(body)
        model = str(body.get("model") or "bench")
        n, rate = _plan(body, model)
        opts = body.get("stream_options")
        include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
        tokens = body.get("bench_tokens") or DEFAULT_TOKENS
        stamp = bool(body.get("bench_stamp")) and rate > 0
        block = int(body.get("bench_block") or BLOCK)
        tool_call: tuple[str, str, str] | None = None
        if body.get("bench_tool_rounds") is not None:
            msgs = body.get("messages") or []
            done_calls = sum(1 for m in msgs if isinstance(m, dict) and m.get("role") == "tool")
            if done_calls < int(body["bench_tool_rounds"]):
                tool_call = (f"call_{done_calls}", str(body.get("bench_tool") or "noop"), str(body.get("bench_tool_args") or "{}"))

        resp = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "X-Request-Id": "req_" + uuid.uuid4().hex,
            },
        )
        await resp.prepare(request)
        chunks = _Chunks("chatcmpl-" + uuid.uuid4().hex[:24], int(time.time()), model, include_usage)
        self.active += 1
        self.started += 1
        try:
            if task is not None:
                self.task_calls += 1
                await resp.write(chunks.role() + chunks.content(task) + chunks.tail(1))
            elif tool_call is not None:
                self.tool_calls += 1
                await resp.write(chunks.tool_call(*tool_call))
            elif rate > 0:
                await self._paced(request, resp, chunks, n, rate, tokens, stamp)
            else:
                await self._fast(resp, chunks, n, tokens, block)
            await resp.write_eof()
            self.completed += 1
            self._record("task" if task is not None else "chat", raw, body, t0)
        except (ConnectionError, asyncio.CancelledError):
            self.aborted += 1
            raise
        finally:
            self.active -= 1
        return resp

    async def _fast(self, resp: web.StreamResponse, c: _Chunks, n: int, tokens: list[str], block: int) -> None:
        await resp.write(c.role())
        per_token = [c.content(t) for t in tokens]
        k = len(per_token)
        cycle = b"".join(per_token)  # k chunks
        reps = max(1, block // len(cycle))
        big = cycle * reps  # reps * k chunks, about `block` bytes, written again and again
        full, rest = divmod(n, reps * k)
        for _ in range(full):
            await resp.write(big)
        await resp.write(cycle * (rest // k) + b"".join(per_token[: rest % k]) + c.tail(n))

    async def _paced(self, request: web.Request, resp: web.StreamResponse, c: _Chunks, n: int, rate: float, tokens: list[str], stamp: bool) -> None:
        await resp.write(c.role())  # through aiohttp: sends the headers (buffered until the first write)
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("client went away")
        done = asyncio.get_running_loop().create_future()
        self.pacer.add(_Paced(transport, c, n, rate, tokens, stamp, done))
        await done


class _Paced:
    """One paced stream, written by the shared ``Pacer`` straight to the transport
    (chunked framing by hand: aiohttp's writer has already sent the headers)."""

    __slots__ = ("transport", "c", "n", "rate", "tokens", "stamp", "done", "i", "t0", "due")

    def __init__(self, transport: Any, c: _Chunks, n: int, rate: float, tokens: list[str], stamp: bool, done: Any) -> None:
        self.transport, self.c, self.n, self.rate = transport, c, n, rate
        self.tokens, self.stamp, self.done = tokens, stamp, done
        self.i = 0
        self.t0 = time.monotonic()
        self.due = self.t0

    def _write(self, data: bytes) -> None:
        self.transport.write(b"%x\r\n%s\r\n" % (len(data), data))

    def send_next(self) -> bool:
        """Write chunk ``i``; False once the stream has ended."""
        if self.done.done():  # the handler is gone
            return False
        if self.transport.is_closing():
            self._end(ConnectionResetError("client went away"))
            return False
        text = f"@{time.monotonic():.6f} " if self.stamp else self.tokens[self.i % len(self.tokens)]
        self._write(self.c.content(text))
        self.i += 1
        if self.i >= self.n:
            self.finish()
            return False
        self.due = self.t0 + self.i / self.rate
        return True

    def finish(self) -> None:
        if not self.transport.is_closing():
            self._write(self.c.tail(self.i))
        self._end(None)

    def _end(self, exc: BaseException | None) -> None:
        if not self.done.done():
            if exc is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(exc)


class Pacer:
    """One timer loop for every paced stream: a heap of due times, so 10,000
    chunks/s cost one wake-up per due instant, not one sleeping task per chunk."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, _Paced]] = []
        self._seq = 0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def add(self, s: _Paced) -> None:
        if s.n <= 0:
            s.finish()
            return
        self._push(s)
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run())
        assert self._wake is not None
        self._wake.set()

    def _push(self, s: _Paced) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (s.due, self._seq, s))

    def release(self) -> int:
        """Finish every stream now."""
        n = len(self.heap)
        while self.heap:
            heapq.heappop(self.heap)[2].finish()
        return n

    async def _run(self) -> None:
        assert self._wake is not None
        wake = self._wake
        while True:
            if not self.heap:
                wake.clear()
                await wake.wait()
                continue
            delay = self.heap[0][0] - time.monotonic()
            if delay > 0:
                wake.clear()
                try:
                    await asyncio.wait_for(wake.wait(), delay)
                except TimeoutError:
                    pass
                continue
            now = time.monotonic()
            while self.heap and self.heap[0][0] <= now:
                s = heapq.heappop(self.heap)[2]
                if s.send_next():
                    self._push(s)


class _Chunks:
    """Pre-serialized ``chat.completion.chunk`` events of one response."""

    def __init__(self, ident: str, created: int, model: str, include_usage: bool) -> None:
        self.include_usage = include_usage
        head = {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": None,
        }
        self._head = b"data: " + _dumps(head)[:-1].encode() + b',"choices":[{"index":0,"delta":'
        self._end = b',"logprobs":null,"finish_reason":null}]' + (b',"usage":null' if include_usage else b"") + b"}\n\n"
        self._raw_head = head

    def content(self, text: str) -> bytes:
        return self._head + _dumps({"content": text}).encode() + self._end

    def role(self) -> bytes:
        return self._head + b'{"role":"assistant","content":""}' + self._end

    def tool_call(self, call_id: str, name: str, arguments: str) -> bytes:
        """A whole tool-call answer: call chunk, finish (``tool_calls``), usage, ``[DONE]``."""
        call = {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        delta = _dumps({"role": "assistant", "content": None, "tool_calls": [call]}).encode()
        return self._head + delta + self._end + self.tail(1, "tool_calls")

    def tail(self, n: int, finish_reason: str = "stop") -> bytes:
        finish = self._head + b'{},"logprobs":null,"finish_reason":"' + finish_reason.encode() + b'"}]'
        finish += (b',"usage":null' if self.include_usage else b"") + b"}\n\n"
        out = [finish]
        if self.include_usage:
            usage = {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n}
            out.append(b"data: " + _dumps({**self._raw_head, "choices": [], "usage": usage}).encode() + b"\n\n")
        out.append(b"data: [DONE]\n\n")
        return b"".join(out)


def hashed_embedding(text: str, dim: int = EMBEDDING_DIM) -> list[float]:
    """A signed hashed bag of ``text``'s lower-cased words (blake2b: the same on
    every run), L2-normalized; a text without a word character is hashed whole."""
    words = _WORD.findall(text.lower()) or [text]
    vector = [0.0] * dim
    for word in words:
        h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
        vector[h % dim] += 1.0 if (h >> 63) & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector))
    if norm == 0.0:  # opposite signs cancelled out: the first word's bucket alone
        h = int.from_bytes(hashlib.blake2b(words[0].encode(), digest_size=8).digest(), "little")
        vector = [0.0] * dim
        vector[h % dim], norm = 1.0, 1.0
    return [x / norm for x in vector]


def task_reply(body: dict[str, Any]) -> str | None:
    """The JSON answer to a task-model prompt (see the module docstring), else None."""
    if any(key.startswith("bench_") for key in body):
        return None
    users = [m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "user"]
    text = users[-1].get("content") if users else None
    if not isinstance(text, str) or not text.startswith("### Task:"):
        return None
    kind = next((k for k in TASK_KEYS if f'{{"{k}":' in text), None)
    if kind is None:
        return None
    if kind == "queries":
        history = text.rsplit("<chat_history>", 1)[-1]
        lines = _USER_LINE.findall(history)
        return _dumps({"queries": [lines[-1].strip() if lines else "bench"]})
    return _dumps({kind: TASK_ANSWERS[kind]})


def _plan(body: dict[str, Any], model: str) -> tuple[int, float]:
    n, rate = DEFAULT_CHUNKS, 0.0
    parts = model.split("-")
    try:
        if parts[0] == "fast" and len(parts) >= 2:
            n = int(parts[1])
        elif parts[0] == "paced" and len(parts) >= 3:
            n, rate = int(parts[1]), float(parts[2])
    except ValueError:
        pass
    if body.get("bench_chunks") is not None:
        n = int(body["bench_chunks"])
    if body.get("bench_rate") is not None:
        rate = float(body["bench_rate"])
    return max(0, n), max(0.0, rate)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}, status=status)


def make_app() -> web.Application:
    up = Upstream()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", up.chat)
    app.router.add_get("/v1/models", up.models)
    app.router.add_post("/v1/embeddings", up.embeddings)
    app.router.add_post("/bench/record", up.record)
    app.router.add_post("/bench/release", up.release)
    app.router.add_get("/bench/stats", up.stats)
    return app


async def _serve(host: str, port: int) -> None:
    runner = web.AppRunner(make_app(), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"http://{host}:{runner.addresses[0][1]}/v1", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.upstream", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    asyncio.run(_serve(args.host, args.port))
    sys.exit(0)


if __name__ == "__main__":
    main()
