"""What every HTTP upstream transport shares: session, timeouts, line framing, errors.

``OpenAIChatProvider``, ``OpenAIResponsesProvider`` and ``OllamaProvider`` differ
only in the endpoint, the body framing (SSE ``data:`` lines or NDJSON) and how a
stream *ends properly*. Everything else lives here:

* one lazily created ``aiohttp.ClientSession`` (unlimited pool) shared by all
  calls, or a caller-supplied one that ``close()`` leaves open;
* timeouts: ``connect_timeout`` is aiohttp's ``sock_connect``; ``headers_timeout``
  bounds the wait for the response headers; on a stream, ``idle_timeout`` bounds
  the time between complete items (SSE events, NDJSON lines: ``_Progress``),
  on a plain JSON request it is aiohttp's ``sock_read`` (no bytes for that long);
* the mapping of every failure to ``UpstreamError`` with a stable ``kind``:

  - ``upstream_http_error``   HTTP status >= 400 (``status`` set, upstream message kept)
  - ``upstream_disconnected`` connection refused/reset, server went away mid-body
  - ``upstream_timeout``      connect timeout, or no bytes for ``idle_timeout`` seconds
  - ``upstream_truncated``    body ended cleanly before the protocol's end marker
  - ``upstream_error``        the upstream spoke, but not the protocol (an in-stream
                              error object, a non-JSON non-stream body)

  Subclasses may refine the kind of an HTTP error (``_http_error_kind``); the
  Responses transport maps an unknown ``previous_response_id`` to
  ``previous_response_not_found``;
* the API key is sent only in the ``Authorization`` header and scrubbed from
  every error message and warning (upstreams like to echo it in 401 bodies).

Framing (the hot path): the body is read with ``StreamReader.iter_any()`` and
each network read goes whole to a *framer* (``_post_stream``): ``SSEParser``
(``adapters.providers.sse``) for the OpenAI transports, ``NDJSONLines`` for
Ollama. ``_post_stream`` yields one *list* per network read (the events or lines
that read completed), so the per-item work is a plain ``for`` loop with no
coroutine resumption per item. Against ``async for line in response.content``
(``readline``) it costs the same CPU when each read carries one event and
less per event when reads carry many (a fast upstream, or a
consumer that fell behind). There is no line-length limit (``readline`` raises
``LineTooLong`` above 128 KiB, which a large tool-call or image chunk can
exceed). ``_sse_items`` decodes the ``data`` of each SSE event as one JSON
payload and stops at ``[DONE]``; both OpenAI transports use it, so they read
the same bytes the same way.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, Protocol, TypeVar

import aiohttp
import orjson

from adapters.providers.sse import SSEEvent
from engine.ports import RawChunk, RawRun, RawWarning, UpstreamError, UpstreamErrorDetail

__all__ = ["Framer", "HTTPProvider", "NDJSONLines", "error_text_from_obj", "truncate"]

T = TypeVar("T")

MAX_ERROR_BODY = 64 * 1024  # bytes of an error body we read at most
MAX_MESSAGE = 500  # chars of upstream text kept in an error message
MAX_RAW = 500  # chars of a malformed line kept in RawWarning.raw

# orjson parses a chunk several times faster than the json module (the
# per-token hot path); its errors are ValueErrors too.
loads = orjson.loads


class Framer(Protocol[T]):
    """Cuts a body into items, one network read at a time (``SSEParser``,
    ``NDJSONLines``): ``feed`` returns what a read completed, ``close`` what the
    clean end of the body completes."""

    def feed(self, chunk: bytes) -> list[T]: ...

    def close(self) -> list[T]: ...


class NDJSONLines:
    """NDJSON framing: lines split on LF only. A CR before it stays in the line
    (``orjson`` skips it as whitespace, so the line is never copied again); an
    unterminated last line counts at a clean end of body."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending: list[bytes] = []  # an unterminated line, in pieces

    def feed(self, chunk: bytes) -> list[bytes]:
        pending = self._pending
        if pending:
            pending.append(chunk)
            if 10 not in chunk:  # LF; an int needle is a memchr
                return []  # a long line still arriving: no re-scan, no re-copy
            chunk = b"".join(pending)
            pending.clear()
        lines = chunk.split(b"\n")
        tail = lines.pop()  # waits for the rest of its line
        if tail:
            pending.append(tail)
        return lines

    def close(self) -> list[bytes]:
        lines = [b"".join(self._pending)] if self._pending else []
        self._pending.clear()
        return lines


class HTTPProvider:
    """Base of the HTTP transports: session, timeouts, framing and error mapping.

    Pass ``session`` to share an application-wide ``aiohttp.ClientSession``; it
    is then *not* closed by ``close()``.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        connect_timeout: float = 10.0,
        idle_timeout: float = 300.0,
        session: aiohttp.ClientSession | None = None,
        headers_timeout: float = 300.0,
        max_event_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key or None
        self._session = session
        self._owns_session = session is None
        self._headers: dict[str, str] = {"Accept": "application/json"}
        if self._api_key:
            self._headers["Authorization"] = f"Bearer {self._api_key}"
        # The model request's body is serialized here (orjson: several times
        # cheaper than aiohttp's ``json=``, which uses the json module: a
        # measurable part of a turn's start in a burst).
        self._json_headers = {**self._headers, "Content-Type": "application/json"}
        # connect=None on purpose: waiting for a free pooled connection (if a
        # caller-supplied session has a limit) is not a connect timeout.
        self._timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=connect_timeout, sock_read=idle_timeout)
        # A stream has no per-read timer: its watchdog (``_Progress``) already
        # fails it when no complete item comes for ``idle_timeout``, which a
        # silent peer trips as surely. aiohttp's ``sock_read`` re-arms a timer on
        # every received packet, ~3 % of the event loop's time per streamed
        # chunk with 1,000 paced streams (py-spy).
        self._stream_timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=connect_timeout, sock_read=None)
        self.idle_timeout = idle_timeout
        self.connect_timeout = connect_timeout
        self.headers_timeout = headers_timeout
        self.max_event_bytes = max_event_bytes

    def __repr__(self) -> str:  # never show the key
        return f"{type(self).__name__}(base_url={self.base_url!r})"

    # -- session ---------------------------------------------------------------

    def _get_session(self) -> aiohttp.ClientSession:
        session = self._session
        if session is None or session.closed:
            if not self._owns_session:
                raise RuntimeError(f"the aiohttp session given to {type(self).__name__} is closed")
            session = self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=self._timeout,
            )
        return session

    async def close(self) -> None:
        """Close the session this provider created (a caller-supplied one is left open)."""
        if self._owns_session and self._session is not None:
            session, self._session = self._session, None
            if not session.closed:
                await session.close()

    async def __aenter__(self):  # -> Self
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- errors ----------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        key = self._api_key
        if key and key in text:
            text = text.replace(key, "***")
        return text

    def _error(self, kind: str, message: str, status: int | None = None) -> UpstreamError:
        return UpstreamError(message=self._scrub(message), kind=kind, status=status)

    def _transport_error(self, exc: BaseException, what: str) -> UpstreamError:
        """Map an aiohttp/OS exception to an ``UpstreamError`` (kind by cause)."""
        # TimeoutError first: it is an OSError, and aiohttp's ServerTimeoutError
        # is also a ClientConnectionError.
        if isinstance(exc, aiohttp.ConnectionTimeoutError) or (isinstance(exc, aiohttp.ClientConnectorError) and isinstance(exc.os_error, TimeoutError)):
            error = self._error("upstream_timeout", f"upstream connect timed out after {self.connect_timeout:g}s")
            error.unreachable = True
            return error
        if isinstance(exc, TimeoutError):
            return self._error("upstream_timeout", f"upstream sent nothing for {self.idle_timeout:g}s ({what})")
        if isinstance(exc, aiohttp.ClientConnectorError):
            error = self._error("upstream_disconnected", f"cannot connect to upstream: {exc}")
            error.unreachable = True
            return error
        if isinstance(exc, aiohttp.ClientPayloadError):
            detail = "the response body ended before it was complete"
        elif isinstance(exc, aiohttp.ServerDisconnectedError):
            detail = "the server closed the connection"
        else:
            detail = str(exc) or "connection error"
        return self._error("upstream_disconnected", f"upstream connection lost ({what}): {detail} ({type(exc).__name__})")

    def _http_error_kind(self, status: int, body: Any, text: str) -> str:
        """The ``UpstreamError.kind`` of an HTTP error; ``body`` is the parsed JSON or None."""
        return "upstream_http_error"

    async def _http_error(self, resp: aiohttp.ClientResponse) -> UpstreamError:
        status = resp.status
        try:
            raw = await _read_capped(resp, MAX_ERROR_BODY)
        except (TimeoutError, aiohttp.ClientError, OSError):
            raw = b""
        body = _parse(raw)
        text = _error_text(raw, body) or (resp.reason or "")
        message = f"upstream returned HTTP {status}"
        if text:
            message += f": {truncate(text, MAX_MESSAGE)}"
        error = self._error(self._http_error_kind(status, body, text), message, status)
        error.upstream = self._error_detail(body, text, resp.headers)
        return error

    def _error_detail(self, body: Any, text: str, headers: Any) -> UpstreamErrorDetail:
        """The HTTP error as the upstream gave it (scrubbed like the message):
        what a client's own bad request is answered with."""
        err = body.get("error") if isinstance(body, dict) else None
        err = err if isinstance(err, dict) else {}
        param, code = err.get("param"), err.get("code")
        return UpstreamErrorDetail(
            message=self._scrub(truncate(text, MAX_MESSAGE)),
            param=self._scrub(param) if isinstance(param, str) else None,
            code=self._scrub(code) if isinstance(code, str) else None,
            retry_after=retry_after_seconds(headers),
        )

    def _stream_error(self, obj: dict[str, Any], kind: str = "upstream_error") -> UpstreamError:
        text = error_text_from_obj(obj) or json.dumps(obj)
        return self._error(kind, "upstream sent an error in the stream: " + truncate(text, MAX_MESSAGE))

    def _warning(self, line: bytes, exc: ValueError | None, what: str = "data line") -> RawWarning:
        if exc is None:
            message = f"{what} is JSON but not an object; skipped"
        elif isinstance(exc, UnicodeDecodeError):
            message = f"{what} is not valid UTF-8; skipped"
        else:
            message = f"{what} is not valid JSON ({exc}); skipped"
        raw = line.rstrip(b"\r").decode("utf-8", "replace")
        return RawWarning(message=self._scrub(message), raw=self._scrub(truncate(raw, MAX_RAW)))

    # -- I/O -------------------------------------------------------------------

    def stream_batches(self, body: dict[str, Any]) -> AsyncGenerator[list[RawChunk | RawWarning], None]:
        """The streamed payloads of each network read, as one list (never
        empty); each transport implements it."""
        raise NotImplementedError

    def stream_runs(self, body: dict[str, Any]) -> AsyncGenerator[list[RawChunk | RawWarning | RawRun], None]:
        """``stream_batches`` (a transport that finds runs of chunks overrides it)."""
        return self.stream_batches(body)  # type: ignore[return-value]

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[RawChunk | RawWarning]:
        """``stream_batches``, one payload at a time."""
        async with aclosing(self.stream_batches(body)) as batches:
            async for batch in batches:
                for item in batch:
                    yield item

    async def _post_stream(self, path: str, payload: dict[str, Any], framer: Framer[T]) -> AsyncGenerator[list[T], None]:
        """POST ``payload`` and yield what ``framer`` cuts the body into, one
        list per network read (never empty).

        HTTP >= 400 and transport failures raise ``UpstreamError``. Use it under
        ``contextlib.aclosing`` so an early exit releases the connection at once.

        Two timeouts, which also catch an upstream that trickles bytes (one a
        second would never trip a per-read timer, so there is none): the
        headers must be in within ``headers_timeout``, and a *complete* item
        (an SSE event, an NDJSON line) must arrive within ``idle_timeout`` of
        the previous one; the bytes of an item still incomplete are capped at
        ``max_event_bytes`` (memory per turn stays bounded).
        """
        session = self._get_session()
        stage = "waiting for the response"
        watchdog: _Progress | None = None
        try:
            async with asyncio.timeout(self.headers_timeout):
                resp = await session.post(self.base_url + path, data=_body(payload), headers=self._json_headers, timeout=self._stream_timeout)
            async with resp:
                if resp.status >= 400:
                    raise await self._http_error(resp)
                stage = "reading the stream"
                watchdog = _Progress(resp, self.idle_timeout)
                feed = framer.feed
                pending = 0  # bytes read since the last complete item
                limit = self.max_event_bytes
                async for data in resp.content.iter_any():
                    items = feed(data)
                    if items:
                        pending = 0
                        watchdog.progress()
                        yield items
                    else:
                        pending += len(data)
                        if pending > limit:
                            raise self._error("upstream_error", f"upstream sent {pending} bytes without completing an event (limit {limit})")
                items = framer.close()  # clean end of body
                if items:
                    yield items
        except UpstreamError:
            raise
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            if watchdog is not None and watchdog.fired:
                raise self._error("upstream_timeout", f"upstream completed no event for {self.idle_timeout:g}s ({stage})") from None
            if stage == "waiting for the response" and isinstance(exc, TimeoutError) and not isinstance(exc, aiohttp.ClientError):
                raise self._error("upstream_timeout", f"upstream sent no response headers within {self.headers_timeout:g}s") from None
            raise self._transport_error(exc, stage) from None
        finally:
            if watchdog is not None:
                watchdog.stop()

    def _sse_items(self, events: list[SSEEvent], type_key: str | None = None) -> tuple[list[RawChunk | RawWarning], bool]:
        """The JSON payloads of ``events`` and whether ``[DONE]`` came (the
        events after it are dropped: the stream is over).

        A payload that is not a JSON object becomes a ``RawWarning``. With
        ``type_key``, an object that lacks a string at that key gets the SSE
        ``event:`` type there (the Responses API repeats the type in both; a
        server that sends it only in ``event:`` is still understood, and the
        recorded object says what it was).
        """
        out: list[RawChunk | RawWarning] = []
        _loads = loads
        for kind, data, raw in events:
            try:
                obj = _loads(data)
            except ValueError as exc:
                if data.strip() == b"[DONE]":
                    return out, True
                out.append(self._warning(raw, exc))
                continue
            if type(obj) is not dict:
                out.append(self._warning(raw, None))
                continue
            if kind is not None and type_key is not None and type(obj.get(type_key)) is not str:
                obj[type_key] = kind.decode("utf-8", "replace")
            out.append(RawChunk(obj))
        return out, False

    def _body_is_error(self, result: dict[str, Any]) -> bool:
        """Whether a non-stream JSON body is an error object rather than a result."""
        return "error" in result and "choices" not in result and "data" not in result

    async def _request_json(self, method: str, path: str, payload: dict[str, Any] | None) -> dict[str, Any]:
        session = self._get_session()
        stage = "waiting for the response"
        try:
            async with asyncio.timeout(self.headers_timeout):
                resp = await session.request(method, self.base_url + path, json=payload, headers=self._headers, timeout=self._timeout)
            async with resp:
                if resp.status >= 400:
                    raise await self._http_error(resp)
                stage = "reading the response"
                raw = await resp.read()
        except UpstreamError:
            raise
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            if stage == "waiting for the response" and isinstance(exc, TimeoutError) and not isinstance(exc, aiohttp.ClientError):
                raise self._error("upstream_timeout", f"upstream sent no response headers within {self.headers_timeout:g}s") from None
            raise self._transport_error(exc, stage) from None
        result = _parse(raw)
        if not isinstance(result, dict):
            raise self._error(
                "upstream_error",
                f"upstream {path} returned a body that is not a JSON object: " + truncate(raw.decode("utf-8", "replace"), MAX_MESSAGE),
            )
        if self._body_is_error(result):
            raise self._error(
                "upstream_error",
                "upstream returned an error: " + truncate(error_text_from_obj(result) or "", MAX_MESSAGE),
            )
        return result


# -- helpers -------------------------------------------------------------------


def _body(payload: dict[str, Any]) -> bytes:
    """The JSON body of a request: orjson, or the json module for what orjson
    refuses (an integer beyond 64 bits, a key that is not a string)."""
    try:
        return orjson.dumps(payload)
    except TypeError:
        return json.dumps(payload).encode()


async def _read_capped(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for data in resp.content.iter_any():
        parts.append(data)
        size += len(data)
        if size >= limit:
            break
    return b"".join(parts)[:limit]


def _parse(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return loads(raw)
    except ValueError:
        return None


def retry_after_seconds(headers: Any) -> float | None:
    """An HTTP ``Retry-After`` in seconds (OpenAI's ``retry-after-ms`` first);
    None when absent or not a number (a date is not worth trusting)."""
    for name, scale in (("retry-after-ms", 0.001), ("Retry-After", 1.0)):
        value = headers.get(name) if headers is not None else None
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            continue
        if seconds >= 0 and seconds == seconds and seconds != float("inf"):
            return seconds
    return None


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def error_text_from_obj(obj: Any) -> str | None:
    """The human message of an OpenAI-style (or Ollama/FastAPI/plain) error object."""
    if not isinstance(obj, dict):
        return None
    err = obj.get("error")
    if isinstance(err, dict):
        msg = err.get("message")
        if msg:
            return str(msg)
        return json.dumps(err)
    if isinstance(err, str) and err:
        return err
    for key in ("message", "detail"):
        val = obj.get(key)
        if val:
            return val if isinstance(val, str) else json.dumps(val)
    return None


def _error_text(raw: bytes, body: Any) -> str:
    if not raw:
        return ""
    text = error_text_from_obj(body)
    if text is None:
        text = raw.decode("utf-8", "replace").strip()
    return " ".join(text.split())  # one line, however the upstream formatted it


class _Progress:
    """The idle timer of a stream, re-armed by complete items, not by bytes.

    One ``loop.time()`` per network read that completes an item; the timer
    re-schedules itself to the last progress plus ``idle`` when it fires
    early, and aborts the response when it fires late (the reader then raises,
    and ``fired`` says why)."""

    __slots__ = ("_handle", "_idle", "_last", "_loop", "_resp", "fired")

    def __init__(self, resp: aiohttp.ClientResponse, idle: float) -> None:
        self._resp = resp
        self._idle = idle
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self.fired = False
        self._handle: asyncio.TimerHandle | None = self._loop.call_at(self._last + idle, self._check)

    def progress(self) -> None:
        self._last = self._loop.time()

    def _check(self) -> None:
        due = self._last + self._idle
        if self._loop.time() < due:
            self._handle = self._loop.call_at(due, self._check)
            return
        self._handle = None
        self.fired = True
        self._resp.content.set_exception(TimeoutError("no complete item"))
        self._resp.close()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
