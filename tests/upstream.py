"""A scripted model upstream: a real aiohttp server on loopback.

It speaks the exact wire formats of OpenAI Chat Completions, the OpenAI
Responses API and Ollama's native chat (the OpenAI ones checked against the
official ``openai`` SDK in ``tests/test_provider_openai_chat.py`` and
``tests/test_provider_responses.py``), and each request is answered by the next
scripted ``Reply``, whichever endpoint it came to. Use it wherever a test needs
a model::

    from tests.upstream import Reply, ScriptedUpstream

    async with ScriptedUpstream() as up:          # or: url = await up.start() ... await up.close()
        up.enqueue(Reply(chunks=["Hel", "lo"]), Reply(status=500))
        provider = OpenAIChatProvider(up.url, "key")
        ...
        assert up.requests[0]["messages"][-1]["content"] == "hi"

Endpoints (``up.url`` is ``http://127.0.0.1:PORT/v1``; ``up.root`` is the same
without ``/v1``, the base URL of an Ollama server):

* ``POST /v1/chat/completions`` – streaming (``"stream": true``) or not.
* ``POST /v1/responses`` – Responses API, streaming or not (see below).
* ``GET  /v1/models`` – ``{"object": "list", "data": [{"id", "object": "model", "created", "owned_by": "scripted"}]}``.
* ``POST /api/chat`` – Ollama chat, NDJSON stream unless ``"stream": false`` (see below).
* ``GET  /api/tags`` – Ollama's model list, ``{"models": [{"name", "model", …}]}``.
* ``POST /v1/embeddings`` – OpenAI embeddings (see "Embeddings" below); scripted
  apart from the chat endpoints.

Every POST body to a chat endpoint is appended to ``requests``, its headers to
``request_headers`` and its path (e.g. ``/v1/responses``) to ``request_paths``.

Chat Completions streaming bytes, in order (each event is ``data: <compact JSON>\\n\\n``):

1. a role chunk ``delta: {"role": "assistant", "content": ""}``;
2. ``reasoning`` pieces as ``delta: {"reasoning_content": …}``;
3. content pieces as ``delta: {"content": …}``;
4. ``tool_calls`` fragments (OpenAI shape, keyed by ``index``);
5. a finish chunk ``delta: {}`` with ``finish_reason``;
6. only if the request had ``stream_options.include_usage`` (and the reply
   does not ``ignore_include_usage``): a usage chunk with ``choices: []`` (and,
   as OpenAI does, ``"usage": null`` on every other chunk);
7. ``data: [DONE]``.

Responses API streaming bytes (each event is ``event: <type>\\ndata: <compact
JSON>\\n\\n``, the JSON starting with ``"type"`` and ending with
``"sequence_number"`` 0, 1, 2, …; no ``[DONE]``):

1. ``response.created`` and ``response.in_progress`` (``response.status: "in_progress"``, empty output);
2. ``reasoning`` (if any): an ``output_item.added`` reasoning item (id ``rs_…``),
   ``reasoning_summary_part.added``, one ``reasoning_summary_text.delta`` per
   piece, ``reasoning_summary_text.done``, ``reasoning_summary_part.done``,
   ``output_item.done``;
3. the message (unless the reply has tool calls and no text): ``output_item.added``
   (id ``msg_…``), ``content_part.added``, one ``output_text.delta`` per content
   piece, ``output_text.done``, ``content_part.done``, ``output_item.done``;
4. per tool call: ``output_item.added`` (``function_call``, id ``fc_…``, ``call_id``
   = the tool call's ``id`` or ``call_…``), ``function_call_arguments.delta`` per
   ``chunk_size`` fragment, ``function_call_arguments.done``, ``output_item.done``;
5. the terminal event with the whole ``response`` (id ``resp_…`` or
   ``Reply.response_id``, ``output`` and ``usage: {input_tokens,
   input_tokens_details, output_tokens, output_tokens_details, total_tokens}``):
   ``response.completed``; or, for ``finish_reason`` ``"length"`` /
   ``"content_filter"``, ``response.incomplete`` (``incomplete_details.reason``
   ``max_output_tokens`` / ``content_filter``); or, for ``finish_reason="failed"``,
   ``response.failed`` with ``error: {code: "server_error", message: error_message}``.

``previous_response_id``: the server remembers the ids of the responses it
created (unless the request had ``"store": false``). A request naming one it does
not know is answered HTTP 400 ``{"error": {"message": "Previous response with id
'X' not found.", "type": "invalid_request_error", "param": "previous_response_id",
"code": "previous_response_not_found"}}``; the request is recorded but *no reply
is used up*. ``forget_responses()`` simulates expiry.

Request fields (``/v1/chat/completions``, ``/v1/responses``): a top-level field
the vendor does not accept (the installed ``openai`` SDK's request types say
which: ``tests.vendor_fields``) is answered as OpenAI answers it, HTTP 400
``{"error": {"message": "Unrecognized request argument supplied: NAME", "type":
"invalid_request_error", "param": "NAME", "code": null}}``; the request is
recorded but *no reply is used up*. ``/api/chat`` ignores unknown fields, as
Ollama does.

Tool-call bookkeeping (``/v1/chat/completions``), checked as the Chat Completions
API checks it, so a test sees the 400 a real upstream would give a malformed
transcript: an assistant message with ``tool_calls`` must be followed at once by
consecutive ``role: "tool"`` messages responding to each of its ``tool_call_id``
(else "An assistant message with 'tool_calls' must be followed by tool messages
responding to each 'tool_call_id'. The following tool_call_ids did not have
response messages: call_x, call_y"), and a ``tool`` message must be one of those
responses (else "Invalid parameter: messages with role 'tool' must be a response
to a preceeding message with 'tool_calls'." -- OpenAI's spelling -- or, for an id
the assistant message did not call, "Invalid parameter: 'tool_call_id' of 'X' not
found in 'tool_calls' of previous message."), and a tool call's ``function.name``
must not be empty ("Invalid 'messages[1].tool_calls[0].function.name': empty
string. …"). The body is ``{"error": {"message",
"type": "invalid_request_error", "param": "messages.[i].role", "code": null}}``
(the API names a message index there; which one it picks is not documented:
here the assistant message's for missing responses, the tool message's
otherwise, with ``.tool_call_id`` for an unknown id). As with an unknown
``previous_response_id``, the request is recorded and *no reply is used up*.

Ollama ``/api/chat`` streaming bytes (one compact JSON object per line,
``application/x-ndjson``): ``{"model", "created_at", "message": {"role":
"assistant", "content": …}, "done": false}`` per reasoning piece (as
``message.thinking``, with empty content) and per content piece; then, if there
are tool calls, one line with all of them whole, ``message.tool_calls: [{"function":
{"name", "arguments": {…object…}}}]``; finally ``{…, "message": {"role":
"assistant", "content": ""}, "done": true, "done_reason": "stop" | "length",
"total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration",
"eval_count", "eval_duration"}``. Errors are ``{"error": "…"}`` bodies.

Usage: ``Reply.usage`` is given in Chat Completions form (``prompt_tokens``,
``completion_tokens``, ``total_tokens``) and translated for the other APIs
(``input_tokens``/``output_tokens``; ``prompt_eval_count``/``eval_count``); a
usage dict already in Responses form is sent as given.

Faults (``Reply.fault``) happen after ``fault_after`` *content* chunks (a count
beyond the last chunk means: after the last chunk, before the finish chunk), in
every API's stream alike:

* ``"disconnect"`` – the socket is closed abruptly in the middle of the chunked
  body, so the client sees a transport error (not a clean end);
* ``"truncate"``   – the body ends cleanly, without finish chunk or ``[DONE]``
  (Responses: without the terminal event; Ollama: without the ``done`` line);
* ``"malformed"``  – a ``data: {not json`` line (Ollama: ``{not json``) is inserted,
  then the stream goes on;
* ``"hang"``       – nothing more is sent, the socket stays open (until ``close()``).

For a non-streaming request: ``disconnect`` closes the socket before any
response, ``hang`` never answers, ``truncate`` sends half the JSON body and
``malformed`` sends ``{not json``.

Prefill continuation (``ScriptedUpstream(resume="continue")``, the default): if
the last request message (Responses: the last ``input`` item) is ``role:
"assistant"`` with text P and the reply's full text starts with P, only the
remainder is sent (as Ollama and servers whose template continues a final
assistant message do); the reasoning is then not repeated, and ``fault_after`` /
``pause_after`` count chunks of the remainder. ``resume="restart"``: the reply is
sent whole whatever the messages end with, as OpenAI's APIs start a new answer.

Embeddings (``POST /v1/embeddings``), OpenAI's shapes exactly: the body is
``{"input": str | [str] | [int] | [[int]], "model", "encoding_format"?: "float" |
"base64", "dimensions"?: int}``; the answer is ``{"object": "list", "data":
[{"object": "embedding", "index": i, "embedding": [floats] | base64 of
little-endian float32}], "model": <the request's>, "usage": {"prompt_tokens",
"total_tokens"}}`` (tokens: words, at least 1 per input). Each vector is
:func:`hashed_embedding` (``embedding_dim`` dimensions, 64 by default, or the
request's ``dimensions``): a signed, hashed bag of lower-cased words,
L2-normalized, so lexical overlap is real similarity ("apple pie recipe" ·
"recipe for apple pie" ≈ 0.87, unrelated texts ≈ 0) and the same text always
gets the same vector. As OpenAI does, an empty ``input`` list, an empty string
or more than 2048 inputs are HTTP 400 (``'$.input' is invalid…``). They are
scripted by their own queue, so that embedding calls made in the background
never use up a chat reply: ``enqueue_embeddings(EmbeddingReply(...))``, FIFO,
a normal answer once empty. ``EmbeddingReply``: ``status`` >= 400 (an OpenAI
error body with ``error_message``); ``fault`` ``"hang"`` (never answers, until
``close()``), ``"disconnect"`` (socket closed, no answer), ``"malformed"``
(``{not json``), ``"truncate"`` (half the JSON), ``"missing_item"`` (the last
``data`` item left out); ``reverse`` (``data`` in reverse order, each item with
its true ``index`` – legal, order is by ``index``); ``hold`` (the request waits
for ``release_embeddings()``). Bodies go to ``embedding_requests``, headers to
``embedding_request_headers``; ``embeddings_in_flight`` /
``embeddings_max_in_flight`` count concurrent requests, ``embeddings_held``
the held ones, and ``await wait_embeddings_held(n)`` waits (no polling) until
``n`` are held.

Also runnable as a process, for tests that run the service in a subprocess::

    python -m tests.upstream --port 0 --script replies.json

where the file holds a list of ``Reply`` dicts (or ``{"replies": [...],
"default": {...}, "models": [...]}``). The base URL is printed on stdout (one
line) once the server listens; SIGTERM/SIGINT stop it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import hashlib
import json
import math
import re
import signal
import struct
import sys
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from tests.vendor_fields import unknown_field_error

__all__ = ["EMBEDDING_FAULTS", "FAULTS", "EmbeddingReply", "Reply", "ScriptedUpstream", "hashed_embedding"]

FAULTS = ("disconnect", "truncate", "malformed", "hang")
EMBEDDING_FAULTS = ("disconnect", "truncate", "malformed", "hang", "missing_item")
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit per request
_INVALID_INPUT = "'$.input' is invalid. Please check the API reference: https://platform.openai.com/docs/api-reference."
_WORD = re.compile(r"\w+")


def hashed_embedding(text: str, dim: int = 64) -> list[float]:
    """The scripted upstream's vector of ``text``: a signed hashed bag of its
    lower-cased words (blake2b: the same on every run and platform), L2-normalized.

    Texts sharing words point the same way (lexical similarity is real cosine
    similarity), unrelated texts are near orthogonal; a text without a word
    character is hashed whole, so no vector is ever zero."""
    words = _WORD.findall(text.lower()) or [text]
    vector = [0.0] * dim
    for word in words:
        h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
        vector[h % dim] += 1.0 if (h >> 63) & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector))
    if norm == 0.0:  # opposite signs cancelled out exactly: fall back to the first word's bucket
        h = int.from_bytes(hashlib.blake2b(words[0].encode(), digest_size=8).digest(), "little")
        vector[h % dim], norm = 1.0, 1.0
    return [x / norm for x in vector]


@dataclass
class EmbeddingReply:
    """One scripted answer to one ``/v1/embeddings`` request (see the module docstring)."""

    status: int = 200
    error_message: str = "scripted failure"
    fault: str | None = None
    reverse: bool = False
    hold: bool = False

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in EMBEDDING_FAULTS:
            raise ValueError(f"unknown embedding fault {self.fault!r}; expected one of {EMBEDDING_FAULTS}")


@dataclass
class Reply:
    """One scripted answer to one request (``/chat/completions``, ``/responses`` or ``/api/chat``)."""

    chunks: list[str] | None = None
    """Content chunks, sent exactly as given (one ``delta.content`` each)."""
    text: str | None = None
    """Alternative to ``chunks``: split into pieces of ``chunk_size`` characters."""
    chunk_size: int = 4
    reasoning: list[str] = field(default_factory=list)
    """Sent first, one ``delta.reasoning_content`` each (Responses: summary deltas;
    Ollama: ``message.thinking``)."""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """Tool calls sent after the content: ``{"name", "arguments" (str or JSON-able),
    "id"?}``; the arguments string is streamed in ``chunk_size`` fragments.
    Remember ``finish_reason="tool_calls"`` (it is not changed for you)."""
    finish_reason: str = "stop"
    """Responses: ``"length"``/``"content_filter"`` end with ``response.incomplete``,
    ``"failed"`` with ``response.failed``. Ollama: ``done_reason`` ``"length"`` or ``"stop"``."""
    usage: dict[str, Any] | None = None
    """Default: prompt_tokens ~ request chars / 4, completion_tokens = number of
    content + reasoning chunks sent."""
    ignore_include_usage: bool = False
    """Chat Completions stream: no usage chunk even when the request asks for
    one (llama-cpp-python's server ignores ``stream_options.include_usage``)."""
    delay: float = 0.0
    """Seconds to wait before each content/reasoning chunk."""
    status: int = 200
    """>= 400: answer with an OpenAI error JSON body (Ollama: ``{"error": …}``) and this status."""
    error_message: str = "scripted failure"
    fault: str | None = None
    """One of ``FAULTS`` (see the module docstring)."""
    fault_after: int = 0
    pause_after: int | None = None
    """After this many content chunks (capped at the last one), set
    ``upstream.paused`` and wait for ``release()``."""
    pause_before_last_argument: bool = False
    """Before the last argument fragment of the last tool call, set
    ``upstream.paused`` and wait for ``release()`` (Chat Completions and
    Responses streams): a test can see what a client got of a call still
    being written."""
    comments: bool = False
    """Interleave ``: keep-alive`` SSE comment lines (SSE APIs only)."""
    response_id: str | None = None
    """The id of the response (Responses: instead of ``resp_…``; Chat: instead of ``chatcmpl-…``)."""
    retry_after: str | None = None
    """With ``status`` >= 400: sent as the ``Retry-After`` header (as OpenAI does with a 429)."""

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
    """A loopback model server answering with scripted ``Reply`` objects.

    Attributes:
        models:          ids listed by ``GET /v1/models`` (and names by ``GET /api/tags``).
        default:         the reply used when the queue is empty.
        requests:        every JSON body received on a POST endpoint, in order.
        request_headers: the headers of those requests (same order).
        request_paths:   the paths of those requests (same order), e.g. ``/v1/responses``.
        task_requests:   task-model requests (titles, tags, follow-ups, search
                         queries: a user message starting with ``### Task:``),
                         which are kept out of ``requests`` and answered from
                         ``task_replies`` (a queue of ``(kind, Reply)``: the
                         first queued for that kind) or else a default JSON
                         answer per kind, so scripted conversations are never
                         disturbed by the background work around them.
        response_ids:    the Responses ids this server issued and still remembers.
        paused:          set when a stream reaches ``pause_after``; cleared by ``release()``.
        url:             the base URL (``http://127.0.0.1:PORT/v1``) once started.
        root:            the server root (``http://127.0.0.1:PORT``), Ollama's base URL.
    """

    def __init__(
        self,
        *,
        models: list[str] | None = None,
        default: Reply | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        embedding_dim: int = 64,
        resume: str = "continue",
    ) -> None:
        if resume not in ("continue", "restart"):
            raise ValueError(f"resume must be 'continue' or 'restart', not {resume!r}")
        self.resume = resume  # how a trailing assistant message is answered (module docstring)
        self.models: list[str] = list(models) if models is not None else ["gpt-test"]
        self.default: Reply = default if default is not None else Reply(text="Hello from the scripted upstream.")
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []
        self.request_paths: list[str] = []
        self.request_bodies: list[bytes] = []  # the raw bytes of those requests (same order)
        self.task_requests: list[dict[str, Any]] = []
        self.task_replies: list[tuple[str, Reply]] = []
        self.response_ids: set[str] = set()
        self.embedding_dim = embedding_dim
        self.embedding_requests: list[dict[str, Any]] = []
        self.embedding_request_headers: list[dict[str, str]] = []
        self.embeddings_in_flight = 0
        self.embeddings_held = 0
        self.embeddings_max_in_flight = 0
        self._embedding_queue: deque[EmbeddingReply] = deque()
        self._embedding_release = asyncio.Event()
        self._embedding_changed = asyncio.Condition()
        self.paused = asyncio.Event()
        self._url: str | None = None
        self._host = host
        self._port = port
        self._queue: deque[Reply] = deque()
        self._release = asyncio.Event()
        self._closing = asyncio.Event()
        self._transports: set[asyncio.Transport] = set()
        self._runner: web.AppRunner | None = None

    # -- public API ------------------------------------------------------------

    def enqueue(self, *replies: Reply) -> None:
        """Queue replies, answered first-in first-out; ``default`` once empty."""
        self._queue.extend(replies)

    def enqueue_embeddings(self, *replies: EmbeddingReply) -> None:
        """Queue ``/v1/embeddings`` answers, first-in first-out; normal answers once empty."""
        self._embedding_queue.extend(replies)

    def release_embeddings(self) -> None:
        """Let every embedding request held by ``EmbeddingReply(hold=True)`` answer
        (``embeddings_held`` is 0 again at once; later holds wait for the next release)."""
        self._embedding_release.set()
        self._embedding_release = asyncio.Event()
        self.embeddings_held = 0

    async def wait_embeddings_held(self, n: int) -> None:
        """Wait until ``n`` embedding requests are held (``EmbeddingReply(hold=True)``)."""
        async with self._embedding_changed:
            await self._embedding_changed.wait_for(lambda: self.embeddings_held >= n)

    @property
    def pending(self) -> int:
        """How many queued replies have not been used yet."""
        return len(self._queue)

    @property
    def url(self) -> str:
        """The base URL ``http://127.0.0.1:PORT/v1``; only once started."""
        if self._url is None:
            raise RuntimeError("the scripted upstream is not started")
        return self._url

    @property
    def root(self) -> str:
        """The server root ``http://127.0.0.1:PORT`` (``url`` without ``/v1``): Ollama's base URL."""
        return self.url[: -len("/v1")]

    def forget_responses(self) -> None:
        """Forget every issued response id, as if they had expired: a later
        ``previous_response_id`` naming one gets ``previous_response_not_found``."""
        self.response_ids.clear()

    async def start(self) -> str:
        """Start listening; returns the base URL ``http://127.0.0.1:PORT/v1``."""
        if self._runner is not None:
            return self.url
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/api/chat", self._ollama_chat)
        app.router.add_get("/api/tags", self._ollama_tags)
        app.router.add_post("/v1/embeddings", self._embeddings)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port)
        await site.start()
        self._runner = runner
        port = runner.addresses[0][1]
        self._url = f"http://{self._host}:{port}/v1"
        return self._url

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

    async def _ollama_tags(self, request: web.Request) -> web.Response:
        now = _iso_now()
        models = [
            {
                "name": m,
                "model": m,
                "modified_at": now,
                "size": 1_000_000,
                "digest": uuid.uuid5(uuid.NAMESPACE_URL, m).hex * 2,
                "details": {
                    "parent_model": "",
                    "format": "gguf",
                    "family": "llama",
                    "families": ["llama"],
                    "parameter_size": "1B",
                    "quantization_level": "Q4_K_M",
                },
            }
            for m in self.models
        ]
        return web.json_response({"models": models})

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error_response(400, "We could not parse the JSON body of your request.")
        if not isinstance(body, dict):
            return _error_response(400, "The request body must be a JSON object.")
        self.embedding_requests.append(body)
        self.embedding_request_headers.append(dict(request.headers))
        reply = self._embedding_queue.popleft() if self._embedding_queue else EmbeddingReply()
        transport = request.transport
        if transport is not None:
            self._transports.add(transport)
        await self._embedding_count(+1)
        try:
            if reply.hold:
                await self._hold_embedding()
            if reply.status >= 400:
                return _error_response(reply.status, reply.error_message)
            if reply.fault == "disconnect":
                raise _Closing
            if reply.fault == "hang":
                await self._wait(self._closing)
            texts = _embedding_inputs(body.get("input"))
            if texts is None:
                return _error_response(400, _INVALID_INPUT)
            dim = body.get("dimensions", self.embedding_dim)
            if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
                return _error_response(400, "Invalid value for 'dimensions': must be a positive integer.")
            fmt = body.get("encoding_format", "float")
            if fmt not in ("float", "base64"):
                return _error_response(400, f"Invalid value for 'encoding_format': {fmt!r}.")
            data: list[dict[str, Any]] = []
            for i, text in enumerate(texts):
                vector = hashed_embedding(text, dim)
                embedding: Any = vector
                if fmt == "base64":
                    embedding = base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode()
                data.append({"object": "embedding", "index": i, "embedding": embedding})
            if reply.fault == "missing_item":
                data.pop()
            if reply.reverse:
                data.reverse()
            tokens = sum(max(1, len(_WORD.findall(t))) for t in texts)
            obj = {
                "object": "list",
                "data": data,
                "model": body.get("model") or "text-embedding-test",
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
            raw = json.dumps(obj).encode()
            if reply.fault == "truncate":
                raw = raw[: len(raw) // 2]
            elif reply.fault == "malformed":
                raw = b"{not json"
            return web.Response(body=raw, content_type="application/json")
        except (_Closing, ConnectionError):
            _abort(request)
            return web.Response()  # never sent: the transport is gone
        finally:
            await self._embedding_count(-1)
            if transport is not None:
                self._transports.discard(transport)

    async def _hold_embedding(self) -> None:
        release = self._embedding_release
        async with self._embedding_changed:
            self.embeddings_held += 1
            self._embedding_changed.notify_all()
        await self._wait(release)

    async def _embedding_count(self, delta: int) -> None:
        async with self._embedding_changed:
            self.embeddings_in_flight += delta
            self.embeddings_max_in_flight = max(self.embeddings_max_in_flight, self.embeddings_in_flight)
            self._embedding_changed.notify_all()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, self._stream, self._complete, _error_response)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, self._responses_stream, self._responses_complete, _error_response)

    async def _ollama_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, self._ollama_stream, self._ollama_complete, _ollama_error_response, stream_default=True)

    async def _handle(
        self,
        request: web.Request,
        stream: Callable[[web.Request, dict[str, Any], Reply], Awaitable[web.StreamResponse]],
        complete: Callable[[web.Request, dict[str, Any], Reply], Awaitable[web.StreamResponse]],
        error: Callable[[int, str], web.Response],
        *,
        stream_default: bool = False,
    ) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return error(400, "We could not parse the JSON body of your request.")
        if not isinstance(body, dict):
            return error(400, "The request body must be a JSON object.")
        kind = _task_kind(body)
        # A field the vendor does not accept: its 400, recorded, no reply used up.
        refused = unknown_field_error(request.path, body)
        task_reply: Reply | None = None
        if kind is not None:
            self.task_requests.append(body)
            task_reply = next((r for k, r in self.task_replies if k == kind), None)
            if task_reply is not None and refused is None:
                self.task_replies.remove((kind, task_reply))
            elif task_reply is None:
                task_reply = Reply(text=TASK_DEFAULTS[kind])
        else:
            self.requests.append(body)
            self.request_bodies.append(await request.read())
            self.request_headers.append(dict(request.headers))
            self.request_paths.append(request.path)
        if refused is not None:
            return web.json_response(refused, status=400)

        previous = body.get("previous_response_id") if request.path == "/v1/responses" else None
        if previous is not None and previous not in self.response_ids:
            return _previous_not_found_response(str(previous))  # no reply is used up
        if request.path == "/v1/chat/completions":
            problem = _tool_bookkeeping(body.get("messages"))
            if problem is not None:
                return _invalid_messages_response(*problem)  # no reply is used up

        if task_reply is not None:
            reply = task_reply
        else:
            reply = self._queue.popleft() if self._queue else self.default

        if reply.status >= 400:
            refusal = error(reply.status, reply.error_message)
            if reply.retry_after is not None:
                refusal.headers["Retry-After"] = reply.retry_after
            return refusal

        transport = request.transport
        if transport is not None:
            self._transports.add(transport)
        try:
            if body.get("stream", stream_default):
                return await stream(request, body, reply)
            return await complete(request, body, reply)
        except (_Closing, ConnectionError):
            _abort(request)
            return web.Response()  # never sent: the transport is gone
        finally:
            if transport is not None:
                self._transports.discard(transport)

    # -- Chat Completions ------------------------------------------------------

    async def _complete(self, request: web.Request, body: dict[str, Any], reply: Reply) -> web.StreamResponse:
        plan = _Plan(body, reply, continues=self.resume == "continue")
        await self._before_complete(plan)
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
                {"id": tc["id"], "type": "function", "function": {"name": tc["name"], "arguments": tc["arguments"]}} for tc in plan.tool_calls
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
        return _json_body(obj, reply)

    async def _stream(self, request: web.Request, body: dict[str, Any], reply: Reply) -> web.StreamResponse:
        plan = _Plan(body, reply, continues=self.resume == "continue")
        resp = await _prepare_sse(request)
        include_usage = plan.include_usage and not reply.ignore_include_usage
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
            data = b"data: " + _dumps(chunk) + b"\n\n"
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

        async def send_content(piece: str) -> None:
            await send(delta({"content": piece}))

        if not await self._send_content(resp, reply, plan.content, send_content, b"data: {not json\n\n"):
            return resp

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
                if j + n >= len(args) and i == len(plan.tool_calls) - 1:
                    await self._pause_before_last(reply)
                await send(delta({"tool_calls": [{"index": i, "function": {"arguments": args[j : j + n]}}]}))

        await send([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": reply.finish_reason}])
        if include_usage:
            await send([], plan.usage())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    # -- Responses API ---------------------------------------------------------

    def _remember(self, plan: _Plan) -> None:
        if plan.body.get("store", True) is not False:
            self.response_ids.add(plan.id)

    async def _responses_complete(self, request: web.Request, body: dict[str, Any], reply: Reply) -> web.StreamResponse:
        plan = _Plan(body, reply, api="responses", continues=self.resume == "continue")
        await self._before_complete(plan)
        rs = _ResponsesState(plan)
        output: list[dict[str, Any]] = []
        if plan.reasoning:
            output.append(rs.reasoning_item("".join(plan.reasoning)))
        if rs.has_message:
            output.append(rs.message_item("".join(plan.content), rs.item_status))
        output.extend(rs.call_item(i, tc["arguments"], "completed") for i, tc in enumerate(plan.tool_calls))
        self._remember(plan)
        return _json_body(rs.response(rs.final_status, output, final=True), reply)

    async def _responses_stream(self, request: web.Request, body: dict[str, Any], reply: Reply) -> web.StreamResponse:
        plan = _Plan(body, reply, api="responses", continues=self.resume == "continue")
        rs = _ResponsesState(plan)
        resp = await _prepare_sse(request)
        comments = reply.comments
        seq = 0

        async def emit(type_: str, **fields: Any) -> None:
            nonlocal seq
            event = {"type": type_, **fields, "sequence_number": seq}
            seq += 1
            data = b"event: " + type_.encode() + b"\ndata: " + _dumps(event) + b"\n\n"
            if comments:
                data += b": keep-alive\n\n"
            await resp.write(data)

        if comments:
            await resp.write(b": keep-alive\n\n")
        self._remember(plan)
        await emit("response.created", response=rs.response("in_progress", []))
        await emit("response.in_progress", response=rs.response("in_progress", []))

        output: list[dict[str, Any]] = []
        if plan.reasoning:
            index, item_id = len(output), rs.reasoning_id
            await emit("response.output_item.added", output_index=index, item=rs.reasoning_item(None))
            part = {"type": "summary_text", "text": ""}
            ids = {"item_id": item_id, "output_index": index, "summary_index": 0}
            await emit("response.reasoning_summary_part.added", **ids, part=part)
            for piece in plan.reasoning:
                if reply.delay:
                    await self._sleep(reply.delay)
                await emit("response.reasoning_summary_text.delta", **ids, delta=piece)
            text = "".join(plan.reasoning)
            await emit("response.reasoning_summary_text.done", **ids, text=text)
            await emit("response.reasoning_summary_part.done", **ids, part={"type": "summary_text", "text": text})
            item = rs.reasoning_item(text)
            await emit("response.output_item.done", output_index=index, item=item)
            output.append(item)

        ids = {"item_id": rs.message_id, "output_index": len(output), "content_index": 0}
        if rs.has_message:
            await emit(
                "response.output_item.added",
                output_index=ids["output_index"],
                item=rs.message_item(None, "in_progress"),
            )
            await emit("response.content_part.added", **ids, part=_output_text(""))

        async def send_content(piece: str) -> None:
            await emit("response.output_text.delta", **ids, delta=piece, logprobs=[])

        if not await self._send_content(resp, reply, plan.content, send_content, b"data: {not json\n\n"):
            return resp

        if rs.has_message:
            text = "".join(plan.content)
            await emit("response.output_text.done", **ids, text=text, logprobs=[])
            await emit("response.content_part.done", **ids, part=_output_text(text))
            item = rs.message_item(text, rs.item_status)
            await emit("response.output_item.done", output_index=ids["output_index"], item=item)
            output.append(item)

        n = reply.chunk_size
        for i, tc in enumerate(plan.tool_calls):
            index, item_id, args = len(output), rs.call_ids[i], tc["arguments"]
            await emit("response.output_item.added", output_index=index, item=rs.call_item(i, "", "in_progress"))
            for j in range(0, len(args), n):
                if j + n >= len(args) and i == len(plan.tool_calls) - 1:
                    await self._pause_before_last(reply)
                await emit("response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=args[j : j + n])
            await emit("response.function_call_arguments.done", item_id=item_id, output_index=index, arguments=args)
            item = rs.call_item(i, args, "completed")
            await emit("response.output_item.done", output_index=index, item=item)
            output.append(item)

        status = rs.final_status
        terminal = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(status, "response.failed")
        await emit(terminal, response=rs.response(status, output, final=True))
        await resp.write_eof()
        return resp

    # -- Ollama ----------------------------------------------------------------

    async def _ollama_complete(self, request: web.Request, body: dict[str, Any], reply: Reply) -> web.StreamResponse:
        plan = _Plan(body, reply, api="ollama", continues=self.resume == "continue")
        await self._before_complete(plan)
        message: dict[str, Any] = {"role": "assistant", "content": "".join(plan.content)}
        if plan.reasoning:
            message["thinking"] = "".join(plan.reasoning)
        if plan.tool_calls:
            message["tool_calls"] = _ollama_tool_calls(plan)
        obj = {"model": plan.model, "created_at": _iso_now(), "message": message, **_ollama_final(plan)}
        return _json_body(obj, reply)

    async def _ollama_stream(self, request: web.Request, body: dict[str, Any], reply: Reply) -> web.StreamResponse:
        plan = _Plan(body, reply, api="ollama", continues=self.resume == "continue")
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)

        async def send(message: dict[str, Any], **extra: Any) -> None:
            obj = {"model": plan.model, "created_at": _iso_now(), "message": message, "done": False, **extra}
            await resp.write(_dumps(obj) + b"\n")

        for piece in plan.reasoning:
            if reply.delay:
                await self._sleep(reply.delay)
            await send({"role": "assistant", "content": "", "thinking": piece})

        async def send_content(piece: str) -> None:
            await send({"role": "assistant", "content": piece})

        if not await self._send_content(resp, reply, plan.content, send_content, b"{not json\n"):
            return resp
        if plan.tool_calls:
            await send({"role": "assistant", "content": "", "tool_calls": _ollama_tool_calls(plan)})
        obj = {"model": plan.model, "created_at": _iso_now(), "message": {"role": "assistant", "content": ""}}
        obj.update(_ollama_final(plan))
        await resp.write(_dumps(obj) + b"\n")
        await resp.write_eof()
        return resp

    # -- shared ----------------------------------------------------------------

    async def _before_complete(self, plan: _Plan) -> None:
        """A non-streaming answer's ``disconnect``/``hang`` faults and per-chunk delays."""
        reply = plan.reply
        if reply.fault == "disconnect":
            raise _Closing
        if reply.fault == "hang":
            await self._wait(self._closing)
            raise _Closing
        for _ in plan.content:
            if reply.delay:
                await self._sleep(reply.delay)

    async def _send_content(
        self,
        resp: web.StreamResponse,
        reply: Reply,
        pieces: list[str],
        send: Callable[[str], Awaitable[None]],
        malformed: bytes,
    ) -> bool:
        """Send the content pieces with the reply's delay, fault and pause.

        Returns False if the body was ended (``truncate``): send nothing more."""
        sent = 0
        # fault_after / pause_after beyond the last chunk mean "after the last chunk".
        fault_at = min(reply.fault_after, len(pieces))
        pause_at = None if reply.pause_after is None else min(reply.pause_after, len(pieces))
        for piece in [*pieces, None]:  # None: the point after the last chunk
            if reply.fault is not None and sent == fault_at:
                if reply.fault == "disconnect":
                    raise _Closing
                if reply.fault == "truncate":
                    await resp.write_eof()
                    return False
                if reply.fault == "hang":
                    await self._wait(self._closing)
                    raise _Closing
                if reply.fault == "malformed":
                    await resp.write(malformed)
            if sent == pause_at:
                release = self._release
                self.paused.set()
                await self._wait(release)
            if piece is None:
                break
            if reply.delay:
                await self._sleep(reply.delay)
            await send(piece)
            sent += 1
        return True

    async def _pause_before_last(self, reply: Reply) -> None:
        if reply.pause_before_last_argument:
            release = self._release
            self.paused.set()
            await self._wait(release)

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
        except TimeoutError:
            return
        raise _Closing


class _Plan:
    """What one request gets: the reply's pieces after prefill continuation."""

    def __init__(self, body: dict[str, Any], reply: Reply, api: str = "chat", *, continues: bool = True) -> None:
        self.body = body
        self.reply = reply
        self.api = api
        if reply.response_id is not None:
            self.id = reply.response_id
        elif api == "responses":
            self.id = "resp_" + uuid.uuid4().hex + uuid.uuid4().hex[:16]
        else:
            self.id = "chatcmpl-" + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = body.get("model") or "gpt-test"
        opts = body.get("stream_options")
        self.include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
        content = reply.content_chunks()
        reasoning = list(reply.reasoning)
        prefill = _prefill(body) if continues else None
        if prefill and "".join(content).startswith(prefill):
            content = _skip_prefix(content, len(prefill))
            reasoning = []
        self.content = content
        self.reasoning = reasoning
        self.tool_calls = [
            {
                "id": tc.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                "name": tc["name"],
                "arguments": tc.get("arguments", "") if isinstance(tc.get("arguments", ""), str) else json.dumps(tc["arguments"]),
            }
            for tc in reply.tool_calls
        ]

    def usage(self) -> dict[str, Any]:
        """Chat Completions usage: the reply's, or estimated."""
        if self.reply.usage is not None:
            return dict(self.reply.usage)
        prompt = max(1, _prompt_chars(self.body) // 4)
        completion = len(self.content) + len(self.reasoning) + len(self.tool_calls)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def responses_usage(self) -> dict[str, Any]:
        """Responses API usage (a reply usage already in that form is sent as given)."""
        given = self.reply.usage
        if given is not None and "input_tokens" in given:
            return dict(given)
        u = self.usage()
        inp = int(u.get("prompt_tokens") or 0)
        out = int(u.get("completion_tokens") or 0)
        details = u.get("completion_tokens_details")
        if isinstance(details, dict):
            reasoning = int(details.get("reasoning_tokens") or 0)
        else:
            reasoning = len(self.reasoning) if given is None else 0
        cached = u.get("prompt_tokens_details")
        cached = int(cached.get("cached_tokens") or 0) if isinstance(cached, dict) else 0
        return {
            "input_tokens": inp,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": out,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": int(u.get("total_tokens") or inp + out),
        }


class _ResponsesState:
    """Ids and object shapes of one Responses API answer."""

    def __init__(self, plan: _Plan) -> None:
        self.plan = plan
        self.reasoning_id = "rs_" + uuid.uuid4().hex + uuid.uuid4().hex[:16]
        self.message_id = "msg_" + uuid.uuid4().hex + uuid.uuid4().hex[:16]
        self.call_ids = ["fc_" + uuid.uuid4().hex + uuid.uuid4().hex[:16] for _ in plan.tool_calls]
        self.has_message = bool(plan.content) or not plan.tool_calls
        finish = plan.reply.finish_reason
        if finish == "failed":
            self.final_status = "failed"
        elif finish in ("length", "content_filter"):
            self.final_status = "incomplete"
        else:
            self.final_status = "completed"
        self.item_status = "incomplete" if self.final_status == "incomplete" else "completed"

    def reasoning_item(self, text: str | None) -> dict[str, Any]:
        summary = [] if text is None else [{"type": "summary_text", "text": text}]
        return {"id": self.reasoning_id, "type": "reasoning", "summary": summary}

    def message_item(self, text: str | None, status: str) -> dict[str, Any]:
        content = [] if text is None else [_output_text(text)]
        return {"id": self.message_id, "type": "message", "status": status, "content": content, "role": "assistant"}

    def call_item(self, i: int, arguments: str, status: str) -> dict[str, Any]:
        tc = self.plan.tool_calls[i]
        return {
            "id": self.call_ids[i],
            "type": "function_call",
            "status": status,
            "arguments": arguments,
            "call_id": tc["id"],
            "name": tc["name"],
        }

    def response(self, status: str, output: list[dict[str, Any]], *, final: bool = False) -> dict[str, Any]:
        plan, body = self.plan, self.plan.body
        incomplete = None
        if status == "incomplete":
            reason = "content_filter" if plan.reply.finish_reason == "content_filter" else "max_output_tokens"
            incomplete = {"reason": reason}
        error = None
        if status == "failed":
            error = {"code": "server_error", "message": plan.reply.error_message}
        return {
            "id": plan.id,
            "object": "response",
            "created_at": plan.created,
            "status": status,
            "background": False,
            "completed_at": int(time.time()) if final and status == "completed" else None,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": body.get("max_tool_calls"),
            "model": plan.model,
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "prompt_cache_key": None,
            "reasoning": {"effort": None, "summary": None},
            "safety_identifier": None,
            "service_tier": "default",
            "store": body.get("store", True),
            "temperature": body.get("temperature", 1.0),
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools", []),
            "top_logprobs": 0,
            "top_p": body.get("top_p", 1.0),
            "truncation": "disabled",
            "usage": plan.responses_usage() if final else None,
            "user": None,
            "metadata": body.get("metadata") or {},
        }


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def _ollama_tool_calls(plan: _Plan) -> list[dict[str, Any]]:
    calls = []
    for tc in plan.tool_calls:
        try:
            args = json.loads(tc["arguments"]) if tc["arguments"] else {}
        except ValueError:
            args = tc["arguments"]  # not JSON: sent as is, so a test can see it
        calls.append({"function": {"name": tc["name"], "arguments": args}})
    return calls


def _ollama_final(plan: _Plan) -> dict[str, Any]:
    """The fields of Ollama's last (``done: true``) object."""
    u = plan.usage()
    prompt = int(u.get("prompt_tokens", u.get("input_tokens")) or 0)
    completion = int(u.get("completion_tokens", u.get("output_tokens")) or 0)
    return {
        "done_reason": "length" if plan.reply.finish_reason == "length" else "stop",
        "done": True,
        "total_duration": 1_000_000 * (completion + prompt + 5),
        "load_duration": 1_000_000,
        "prompt_eval_count": prompt,
        "prompt_eval_duration": 100_000 * prompt,
        "eval_count": completion,
        "eval_duration": 1_000_000 * completion,
    }


# What the task model answers when no reply is queued for a kind.
TASK_DEFAULTS = {
    "title": '{"title": "Scripted chat"}',
    "tags": '{"tags": ["General"]}',
    "follow_ups": '{"follow_ups": ["Tell me more."]}',
    "queries": '{"queries": []}',
    "prompt": '{"prompt": "A scripted, detailed image prompt."}',
}


def _task_kind(body: dict[str, Any]) -> str | None:
    """The kind of a task-model request (its prompt starts with ``### Task:`` and
    asks for one JSON key), else None."""
    texts: list[str] = []
    for message in body.get("messages") or []:
        if isinstance(message, dict) and message.get("role") == "user" and isinstance(message.get("content"), str):
            texts.append(message["content"])
    items = body.get("input")
    if isinstance(items, str):
        texts.append(items)
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                texts.append(content)
            elif isinstance(content, list):
                texts.extend(p.get("text", "") for p in content if isinstance(p, dict))
    for text in texts:
        if text.startswith("### Task:"):
            for kind in TASK_DEFAULTS:
                if f'{{"{kind}":' in text:
                    return kind
    return None


def _prompt_chars(body: dict[str, Any]) -> int:
    chars = 0
    items: list[Any] = []
    messages = body.get("messages")
    if isinstance(messages, list):
        items.extend(messages)
    inp = body.get("input")
    if isinstance(inp, str):
        chars += len(inp)
    elif isinstance(inp, list):
        items.extend(inp)
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        chars += len(instructions)
    for m in items:
        if not isinstance(m, dict):
            continue
        c = m.get("content")
        if isinstance(c, str):
            chars += len(c)
        elif isinstance(c, list):
            chars += sum(len(p.get("text", "")) for p in c if isinstance(p, dict))
        for key in ("output", "arguments"):  # Responses function_call(_output) items
            v = m.get(key)
            if isinstance(v, str):
                chars += len(v)
    return chars


def _prefill(body: dict[str, Any]) -> str | None:
    messages = body.get("messages")
    if messages is None and isinstance(body.get("input"), list):
        messages = body["input"]  # Responses API: input items
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant":
        return None
    content = last.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) and content else None


def _embedding_inputs(value: Any) -> list[str] | None:
    """The texts of an embeddings ``input`` (token ids become words ``t<id>``);
    None where OpenAI answers 400: empty, an empty string, a wrong type, too many."""
    if isinstance(value, str):
        items: list[Any] = [value]
    elif isinstance(value, list) and value and all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        items = [" ".join(f"t{x}" for x in value)]
    elif isinstance(value, list):
        items = value
    else:
        return None
    if not items or len(items) > MAX_EMBEDDING_INPUTS:
        return None
    texts = []
    for item in items:
        if isinstance(item, list) and item and all(isinstance(x, int) and not isinstance(x, bool) for x in item):
            item = " ".join(f"t{x}" for x in item)
        if not isinstance(item, str) or not item:
            return None
        texts.append(item)
    return texts


def _skip_prefix(chunks: list[str], n: int) -> list[str]:
    out: list[str] = []
    for chunk in chunks:
        if n >= len(chunk):
            n -= len(chunk)
            continue
        out.append(chunk[n:])
        n = 0
    return out


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


async def _prepare_sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(
        status=200,
        headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "X-Request-Id": "req_" + uuid.uuid4().hex,
        },
    )
    await resp.prepare(request)
    return resp


def _json_body(obj: dict[str, Any], reply: Reply) -> web.Response:
    """A non-streaming answer, with the reply's ``truncate``/``malformed`` fault applied."""
    raw = json.dumps(obj).encode()
    if reply.fault == "truncate":
        raw = raw[: len(raw) // 2]
    elif reply.fault == "malformed":
        raw = b"{not json"
    return web.Response(body=raw, content_type="application/json")


def _error_response(status: int, message: str) -> web.Response:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    code = {401: "invalid_api_key", 404: "model_not_found", 429: "rate_limit_exceeded"}.get(status)
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": code}}, status=status)


def _previous_not_found_response(previous: str) -> web.Response:
    return web.json_response(
        {
            "error": {
                "message": f"Previous response with id '{previous}' not found.",
                "type": "invalid_request_error",
                "param": "previous_response_id",
                "code": "previous_response_not_found",
            }
        },
        status=400,
    )


def _tool_bookkeeping(messages: Any) -> tuple[str, str] | None:
    """The first tool-call bookkeeping rule ``messages`` breaks, as (message, param),
    in the order the Chat Completions API reports them; None if there is none."""
    if not isinstance(messages, list):
        return None
    open_calls: list[str] = []  # calls of the current assistant message not answered yet
    open_at: int | None = None  # its index while its responses may still come
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "tool":
            call_id = message.get("tool_call_id")
            if open_at is None:
                return (
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.",
                    f"messages.[{i}].role",
                )
            called = [c.get("id") for c in messages[open_at].get("tool_calls") or [] if isinstance(c, dict)]
            if call_id not in called:
                return (
                    f"Invalid parameter: 'tool_call_id' of '{call_id}' not found in 'tool_calls' of previous message.",
                    f"messages.[{i}].tool_call_id",
                )
            if call_id in open_calls:
                open_calls.remove(call_id)
            continue
        if open_calls:
            break  # the responses stopped before every call was answered
        open_calls, open_at = [], None
        if role == "assistant" and message.get("tool_calls"):
            for k, c in enumerate(message["tool_calls"]):
                name = (c.get("function") or {}).get("name") if isinstance(c, dict) else None
                if name == "":
                    return (
                        f"Invalid 'messages[{i}].tool_calls[{k}].function.name': empty string. Expected a string "
                        "with minimum length 1, but got an empty string instead.",
                        f"messages.[{i}].tool_calls.[{k}].function.name",
                    )
            open_at = i
            open_calls = [str(c.get("id")) for c in message["tool_calls"] if isinstance(c, dict)]
    if open_calls:
        return (
            "An assistant message with 'tool_calls' must be followed by tool messages responding to "
            "each 'tool_call_id'. The following tool_call_ids did not have response messages: " + ", ".join(open_calls),
            f"messages.[{open_at}].role",
        )
    return None


def _invalid_messages_response(message: str, param: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}, status=400)


def _ollama_error_response(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


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
