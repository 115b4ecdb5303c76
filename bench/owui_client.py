"""The Open WebUI peer client: streams turns and times them client side (own process).

    VENV/bin/python bench/owui_client.py [--spec JSON | --spec @FILE]     (no --spec: the JSON spec on stdin)

Self-contained: the standard library plus ``aiohttp`` (which every Open WebUI
install has), so it runs in the Open WebUI virtualenv, not in the project's.
It mirrors ``bench/client.py``: a spec is a list of *phases* run one after the
other, each sending ``requests`` turns with at most ``concurrency`` in flight
(workers start at random offsets in ``[0, ramp_s)``); a phase named ``_warmup``
is run but not reported; ``"announce": true`` prints ``{"event": "phase_start"|
"phase_end", "name"}`` around a phase (the orchestrator reads server CPU time
there). The result is ONE JSON line on stdout: ``{"phases": [{"name", "kind",
"streams": [...], "agg": {...}}, ...]}`` (plus ``"error"`` if the client
deadline ``timeout_s`` was reached).

Two kinds of phase:

``"kind": "sse"`` -- a streaming POST of ``body`` to ``url`` (optional
``headers``, e.g. ``Authorization: Bearer``) read by a bare asyncio protocol
(HTTP/1.1 keep-alive, chunked decoding) that takes each read's arrival time
first and only counts content chunks (``"delta":{"content":`` in ``data:``
events), like ``bench/client.py``. Used for turnlog, the floor and Open WebUI's
plain API path (``POST /api/chat/completions`` without ``chat_id``: its
OpenAI-format SSE passthrough), so both sides of a ratio are read by the same
code.

``"kind": "owui"`` -- Open WebUI's full path, what its browser does: one
socket.io connection (engine.io v4 over a websocket at ``/ws/socket.io/``,
permessage-deflate like a browser) authenticated with the token in the
CONNECT packet and joined with ``user-join``; for every turn a chat made
beforehand with ``POST /api/v1/chats/new`` (outside the timed part), then
``POST /api/chat/completions`` with ``chat_id``, ``id`` (the assistant message
id), ``session_id`` (the socket's sid), ``model``, ``messages``,
``user_message``, ``stream: true`` and the phase's ``body`` fields (e.g.
``bench_chunks``, ``tool_ids``, ``params``). The HTTP answer is only
``{"status": true, "task_ids": [...]}``; the deltas arrive as socket.io
``events`` for that ``chat_id``: ``{"type": "response:completion", "data":
{"type": "response.output_text.delta", "delta": ...}}`` (one per upstream
content chunk), and the turn ends with ``{"type": "chat:completion", "data":
{"done": true, ...}}`` (``chat:message:error`` / an ``error`` in
``chat:completion`` / ``chat:tasks:cancel`` = failed). All turns of a run share
the one socket (one user, one browser tab): every event is emitted once.

Per stream: ``status``, ``ttfb`` (sse: first body byte), ``ttfc`` (request
sent -> first content chunk), ``t_last``, ``total`` (request sent -> end of the
response / the ``done`` event), ``n`` content chunks, ``done``, ``error``;
owui streams also ``post_ms`` (the POST's round trip), ``chat_new_ms``,
``tool_calls`` (function calls announced in the events) and ``events``. Per
phase (``agg``): ``wall``, ``timed_out`` and, with ``"stamps": true`` (a paced
upstream with ``bench_stamp``), the one-way latency ``arrival - stamp`` of
every chunk as percentiles in ms (``latency_ms``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

CONTENT = b'"delta":{"content":'
DONE = b"data: [DONE]"
ERROR = b'data: {"error"'
STAMP = re.compile(rb'"delta":\{"content":"@([0-9]+\.[0-9]+) ')
STAMP_TEXT = re.compile(r"@([0-9]+\.[0-9]+) ")
PROMPT = "Write a very long answer, please."


def percentiles(values: list[float], qs: tuple[float, ...] = (0.5, 0.9, 0.99, 0.999)) -> dict[str, float]:
    if not values:
        return {"n": 0}
    s = sorted(values)
    out: dict[str, float] = {"n": len(s), "min": s[0], "max": s[-1], "mean": sum(s) / len(s)}
    for q in qs:
        k = min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))
        out[f"p{q * 100:g}"] = s[k]
    return out


class _PhaseState:
    def __init__(self, phase: dict[str, Any]) -> None:
        self.lats: list[float] | None = [] if phase.get("stamps") else None


# ----------------------------------------------------------------------------- plain SSE (raw HTTP/1.1)


class _Dechunk:
    """Undoes HTTP/1.1 chunked transfer coding, incrementally."""

    __slots__ = ("buf", "remaining", "skip", "eof")

    def __init__(self) -> None:
        self.buf = b""
        self.remaining = 0
        self.skip = 0
        self.eof = False

    def feed(self, data: bytes) -> bytes:
        if self.buf:
            data, self.buf = self.buf + data, b""
        out = []
        pos, end = 0, len(data)
        while pos < end and not self.eof:
            if self.remaining:
                take = min(self.remaining, end - pos)
                out.append(data[pos : pos + take])
                pos += take
                self.remaining -= take
                if not self.remaining:
                    self.skip = 2
            elif self.skip:
                take = min(self.skip, end - pos)
                pos += take
                self.skip -= take
            else:
                nl = data.find(b"\r\n", pos)
                if nl < 0:
                    self.buf = data[pos:]
                    break
                size = int(data[pos:nl].split(b";", 1)[0], 16)
                pos = nl + 2
                if size == 0:
                    self.eof = True
                else:
                    self.remaining = size
        return b"".join(out)


class _Stream(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; the arrival time is taken first thing
    in ``data_received`` and content chunks are only counted."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self.r: dict[str, Any] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.r is not None and not self.done_fut.done():
            if not self.r.get("done") and self.r.get("error") is None:
                self.r["error"] = f"connection closed ({exc!r})" if exc else "connection closed by server"
            self.done_fut.set_result(None)
        if not self.closed.done():
            self.closed.set_result(None)

    def start(self, request: bytes, r: dict[str, Any], state: _PhaseState) -> asyncio.Future[None]:
        self.r = r
        self.lats = state.lats
        self.head = b""
        self.headers_done = False
        self.dechunk: _Dechunk | None = None
        self.length: int | None = None
        self.body_left = 0
        self.pending = b""
        self.first: float | None = None
        self.last: float | None = None
        self.error_body = b""
        self.done_fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        r["t0"] = time.monotonic()
        assert self.transport is not None
        self.transport.write(request)
        return self.done_fut

    def data_received(self, data: bytes) -> None:
        t = time.monotonic()
        r = self.r
        if r is None or self.done_fut.done():
            return
        r["bytes"] += len(data)
        if not self.headers_done:
            self.head += data
            i = self.head.find(b"\r\n\r\n")
            if i < 0:
                return
            self._headers(self.head[:i].decode("latin-1"))
            self.headers_done = True
            data, self.head = self.head[i + 4 :], b""
            r["ttfb"] = t - r["t0"]
            if not data and not self._finished():
                return
        if self.dechunk is not None:
            data = self.dechunk.feed(data)
        elif self.length is not None:
            data = data[: self.body_left]
            self.body_left -= len(data)
        if r["status"] != 200:
            self.error_body += data
        elif data:
            self._body(data, t)
        if self._finished():
            if r["status"] != 200:
                r["error"] = f"HTTP {r['status']}: {self.error_body[:300].decode('utf-8', 'replace')}"
            if not self.done_fut.done():
                self.done_fut.set_result(None)

    def _headers(self, head: str) -> None:
        lines = head.split("\r\n")
        r = self.r
        assert r is not None
        r["status"] = int(lines[0].split(" ", 2)[1])
        chunked = False
        for line in lines[1:]:
            k, _, v = line.partition(":")
            k = k.strip().lower()
            v = v.strip()
            if k == "transfer-encoding" and "chunked" in v.lower():
                chunked = True
            elif k == "content-length":
                self.length = int(v)
                self.body_left = int(v)
        if chunked:
            self.dechunk = _Dechunk()
            self.length = None

    def _finished(self) -> bool:
        if self.dechunk is not None:
            return self.dechunk.eof
        if self.length is not None:
            return self.body_left <= 0
        return False  # until the server closes

    def _body(self, data: bytes, t: float) -> None:
        r = self.r
        assert r is not None
        if self.pending:
            data = self.pending + data
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            self.pending = data
            return
        part = data[:cut] if cut < len(data) else data
        self.pending = data[cut:]
        k = part.count(CONTENT)
        if k:
            if self.first is None:
                self.first = t
            if self.lats is not None:
                for m in STAMP.findall(part):
                    self.lats.append(t - float(m))
            self.last = t
            r["n"] += k
        if DONE in part:
            r["done"] = True
        if ERROR in part:
            i = part.find(ERROR)
            r["error"] = part[i : i + 300].decode("utf-8", "replace")


class _Conn:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.proto: _Stream | None = None

    async def get(self) -> _Stream:
        p = self.proto
        if p is None or p.closed.done() or p.transport is None or p.transport.is_closing():
            _, proto = await asyncio.get_running_loop().create_connection(_Stream, self.host, self.port)
            self.proto = proto
        return self.proto  # type: ignore[return-value]

    def close(self) -> None:
        if self.proto is not None and self.proto.transport is not None:
            self.proto.transport.close()


def build_request(url: str, body: dict[str, Any], headers: dict[str, str] | None) -> tuple[str, int, bytes]:
    u = urlsplit(url)
    payload = json.dumps(body).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (
        f"POST {u.path or '/'} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\n{extra}Content-Length: {len(payload)}\r\n\r\n"
    )
    return u.hostname or "127.0.0.1", u.port or 80, head.encode() + payload


# ----------------------------------------------------------------------------- Open WebUI full path (socket.io)


class _Turn:
    """One full-path turn: fed by the socket reader with the events of its chat."""

    __slots__ = ("t0", "first", "last", "end", "n", "error", "done", "events", "tool_calls", "lats", "fut")

    def __init__(self, lats: list[float] | None) -> None:
        self.t0 = 0.0
        self.first: float | None = None
        self.last: float | None = None
        self.end: float | None = None
        self.n = 0
        self.error: str | None = None
        self.done = False
        self.events = 0
        self.tool_calls = 0
        self.lats = lats
        self.fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_event(self, t: float, ev: dict[str, Any]) -> None:
        self.events += 1
        d = ev.get("data")
        if not isinstance(d, dict):
            return
        typ = d.get("type")
        dd = d.get("data")
        if not isinstance(dd, dict):
            dd = {}
        if typ == "response:completion":
            sub = dd.get("type")
            if sub == "response.output_text.delta":
                delta = dd.get("delta")
                if not isinstance(delta, str) or not delta:
                    return
                k = 1
                if self.lats is not None:
                    stamps = STAMP_TEXT.findall(delta)
                    k = len(stamps) or 1
                    for m in stamps:
                        self.lats.append(t - float(m))
                if self.first is None:
                    self.first = t
                self.last = t
                self.n += k
            elif sub == "response.output_item.added":
                item = dd.get("item")
                if isinstance(item, dict) and item.get("type") == "function_call":
                    self.tool_calls += 1
        elif typ == "chat:completion":
            if dd.get("error"):
                self.fail(f"chat:completion error: {json.dumps(dd.get('error'))[:300]}", t)
            if dd.get("done") is True:
                self.done = True
                self.finish(t)
        elif typ == "chat:message:error":
            self.fail(f"chat:message:error: {json.dumps(dd.get('error'))[:300]}", t)
        elif typ == "chat:tasks:cancel":
            self.fail("chat:tasks:cancel", t)

    def fail(self, why: str, t: float) -> None:
        if self.error is None:
            self.error = why
        self.finish(t)

    def finish(self, t: float) -> None:
        if self.end is None:
            self.end = t
        if not self.fut.done():
            self.fut.set_result(None)


class OwuiSession:
    """One browser tab: a socket.io connection plus an HTTP session, one user."""

    def __init__(self, base: str, token: str) -> None:
        import aiohttp

        self.aiohttp = aiohttp
        self.base = base.rstrip("/")
        self.token = token
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
        )
        self.ws: Any = None
        self.sid = ""
        self.turns: dict[str, _Turn] = {}
        self.reader: asyncio.Task[None] | None = None
        self.closed_why: str | None = None
        self._ack_id = 0
        self._acks: dict[int, asyncio.Future[Any]] = {}
        self.stats = {"frames": 0, "events": 0, "unrouted_events": 0, "pings": 0}

    async def connect(self, timeout: float = 30.0) -> None:
        u = urlsplit(self.base)
        url = f"{self.base}/ws/socket.io/?EIO=4&transport=websocket"
        self.ws = await asyncio.wait_for(
            self.http.ws_connect(url, compress=15, max_msg_size=0, autoping=True, headers={"Origin": f"{u.scheme}://{u.netloc}"}),
            timeout,
        )
        opened = await self._recv_text(timeout)
        if not opened.startswith("0"):
            raise RuntimeError(f"engine.io: expected an OPEN packet, got {opened[:200]!r}")
        await self.ws.send_str("40" + json.dumps({"token": self.token}))
        while True:
            pkt = await self._recv_text(timeout)
            if pkt == "2":
                await self.ws.send_str("3")
                continue
            if pkt.startswith("40"):
                self.sid = json.loads(pkt[2:] or "{}").get("sid", "")
                break
            if pkt.startswith("44"):
                raise RuntimeError(f"socket.io CONNECT refused: {pkt[:300]}")
        if not self.sid:
            raise RuntimeError("socket.io: no sid in the CONNECT answer")
        self.reader = asyncio.create_task(self._read())
        joined = await asyncio.wait_for(self.emit_with_ack("user-join", {"auth": {"token": self.token}}), timeout)
        if not joined or not isinstance(joined[0], dict) or not joined[0].get("id"):
            raise RuntimeError(f"user-join was not accepted: {joined!r}")

    async def _recv_text(self, timeout: float) -> str:
        msg = await asyncio.wait_for(self.ws.receive(), timeout)
        if msg.type != self.aiohttp.WSMsgType.TEXT:
            raise RuntimeError(f"websocket: unexpected {msg.type} during the handshake ({msg.data!r})")
        return str(msg.data)

    async def emit_with_ack(self, event: str, data: Any) -> Any:
        self._ack_id += 1
        ack = self._ack_id
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._acks[ack] = fut
        await self.ws.send_str(f"42{ack}" + json.dumps([event, data]))
        try:
            return await fut
        finally:
            self._acks.pop(ack, None)

    async def _read(self) -> None:
        TEXT = self.aiohttp.WSMsgType.TEXT
        ws = self.ws
        why = "socket closed"
        try:
            while True:
                msg = await ws.receive()
                t = time.monotonic()
                if msg.type != TEXT:
                    why = f"websocket {msg.type.name}"
                    break
                data: str = msg.data
                self.stats["frames"] += 1
                if data.startswith("42"):
                    self._on_event(data, t)
                elif data == "2":  # engine.io PING: answer or the server drops us
                    self.stats["pings"] += 1
                    await ws.send_str("3")
                elif data.startswith("43"):
                    self._on_ack(data)
                elif data.startswith("41") or data.startswith("1"):
                    why = "socket.io disconnect from the server"
                    break
        except asyncio.CancelledError:
            why = "socket reader cancelled"
            raise
        except Exception as exc:  # noqa: BLE001
            why = f"socket reader: {type(exc).__name__}: {exc}"
        finally:
            self.closed_why = why
            t = time.monotonic()
            for turn in list(self.turns.values()):
                turn.fail(why, t)
            for fut in self._acks.values():
                if not fut.done():
                    fut.set_exception(RuntimeError(why))

    def _on_event(self, data: str, t: float) -> None:
        i = 2
        while i < len(data) and data[i].isdigit():
            i += 1
        ack_id = data[2:i]
        try:
            payload = json.loads(data[i:])
        except ValueError:
            return
        if ack_id:  # a server call (sio.call) waits for an answer: give an empty one
            asyncio.ensure_future(self.ws.send_str(f"43{ack_id}[]"))
        if not isinstance(payload, list) or not payload or payload[0] != "events" or len(payload) < 2:
            return
        ev = payload[1]
        if not isinstance(ev, dict):
            return
        self.stats["events"] += 1
        turn = self.turns.get(ev.get("chat_id"))  # type: ignore[arg-type]
        if turn is None:
            self.stats["unrouted_events"] += 1
            return
        try:
            turn.on_event(t, ev)
        except Exception as exc:  # noqa: BLE001 - an odd event fails its turn, not the shared socket
            turn.fail(f"unexpected event {json.dumps(ev)[:200]}: {type(exc).__name__}: {exc}", t)

    def _on_ack(self, data: str) -> None:
        i = 2
        while i < len(data) and data[i].isdigit():
            i += 1
        try:
            ack = int(data[2:i])
            payload = json.loads(data[i:] or "[]")
        except ValueError:
            return
        fut = self._acks.get(ack)
        if fut is not None and not fut.done():
            fut.set_result(payload)

    async def new_chat(self, model: str) -> tuple[str, float]:
        t = time.monotonic()
        chat = {"title": "bench", "models": [model], "params": {}, "history": {"messages": {}, "currentId": None},
                "messages": [], "tags": [], "timestamp": int(time.time() * 1000)}
        async with self.http.post(self.base + "/api/v1/chats/new", data=json.dumps({"chat": chat, "folder_id": None}),
                                  headers=self.headers) as resp:
            text = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"POST /api/v1/chats/new: HTTP {resp.status}: {text[:300]!r}")
        return json.loads(text)["id"], time.monotonic() - t

    async def turn(self, chat_id: str, model: str, extra: dict[str, Any], lats: list[float] | None) -> dict[str, Any]:
        r: dict[str, Any] = {"status": None, "n": 0, "done": False, "error": None, "chat_id": chat_id}
        if self.closed_why is not None:
            r["error"] = self.closed_why
            return r
        user_id, assistant_id = str(uuid.uuid4()), str(uuid.uuid4())
        body = {
            "stream": True,
            "model": model,
            "messages": [{"role": "user", "content": PROMPT}],
            "chat_id": chat_id,
            "id": assistant_id,
            "session_id": self.sid,
            "parent_id": None,
            "user_message": {"id": user_id, "parentId": None, "childrenIds": [], "role": "user", "content": PROMPT,
                             "models": [model], "timestamp": int(time.time())},
            "features": {},
            "variables": {},
            **extra,
        }
        payload = json.dumps(body)
        turn = _Turn(lats)
        self.turns[chat_id] = turn
        turn.t0 = t0 = time.monotonic()
        try:
            async with self.http.post(self.base + "/api/chat/completions", data=payload, headers=self.headers) as resp:
                r["status"] = resp.status
                text = await resp.read()
            r["post_ms"] = (time.monotonic() - t0) * 1000
            if resp.status != 200:
                r["error"] = f"HTTP {resp.status}: {text[:300].decode('utf-8', 'replace')}"
            else:
                answer = json.loads(text or b"null")
                if not (isinstance(answer, dict) and answer.get("status") and answer.get("task_ids")):
                    r["error"] = f"no task started: {text[:300].decode('utf-8', 'replace')}"
                else:
                    await turn.fut
        except asyncio.CancelledError:
            r["error"] = "timeout (client deadline)"
        except Exception as exc:  # noqa: BLE001
            r["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            self.turns.pop(chat_id, None)
        end = turn.end if turn.end is not None else time.monotonic()
        r["total"] = end - t0
        r["n"] = turn.n
        r["done"] = turn.done and turn.error is None
        r["error"] = r["error"] or turn.error
        r["events"] = turn.events
        r["tool_calls"] = turn.tool_calls
        if turn.first is not None:
            r["ttfc"] = turn.first - t0
            r["t_last"] = turn.last - t0  # type: ignore[operator]
        return r

    async def close(self) -> None:
        try:
            if self.ws is not None and not self.ws.closed:
                await asyncio.wait_for(self.ws.send_str("41"), 2)
                await asyncio.wait_for(self.ws.close(), 5)
        except Exception:  # noqa: BLE001
            pass
        if self.reader is not None:
            self.reader.cancel()
            await asyncio.gather(self.reader, return_exceptions=True)
        await self.http.close()


# ----------------------------------------------------------------------------- phases


async def run_phase(phase: dict[str, Any], deadline: float, sessions: dict[str, OwuiSession]) -> dict[str, Any]:
    kind = phase.get("kind", "sse")
    total = int(phase.get("requests", 1))
    conc = max(1, min(int(phase.get("concurrency", 1)), total))
    ramp = float(phase.get("ramp_s", 0.0))
    state = _PhaseState(phase)
    results: list[dict[str, Any] | None] = [None] * total
    prep: dict[str, Any] = {}

    if kind == "owui":
        key = f"{phase['base']}|{phase['token']}"
        sess = sessions.get(key)
        if sess is None or sess.closed_why is not None:
            sess = OwuiSession(phase["base"], phase["token"])
            sessions[key] = sess
            await asyncio.wait_for(sess.connect(), max(1.0, deadline - time.monotonic()))
        model = phase.get("model", "bench")
        extra = phase.get("body") or {}
        # The chats are made before the timed part (in small batches): only the turns are measured.
        chats: list[tuple[str, float]] = []
        for i in range(0, total, 8):
            batch = [sess.new_chat(model) for _ in range(min(8, total - i))]
            chats.extend(await asyncio.wait_for(asyncio.gather(*batch), max(1.0, deadline - time.monotonic())))
        prep["chat_new_ms"] = percentiles([c[1] * 1000 for c in chats], (0.5, 0.99))
    else:
        host, port, request = build_request(phase["url"], phase["body"], phase.get("headers"))

    next_index = 0
    stopped = False

    async def worker(w: int) -> None:
        nonlocal next_index
        if ramp > 0:
            await asyncio.sleep(starts[w])
        conn = _Conn(host, port) if kind != "owui" else None
        try:
            while next_index < total and not stopped:
                i = next_index
                next_index += 1
                if conn is not None:
                    results[i] = await sse_stream(conn, request, state)
                else:
                    results[i] = await sess.turn(chats[i][0], model, extra, state.lats)
                    results[i]["chat_new_ms"] = chats[i][1] * 1000  # type: ignore[index]
        finally:
            if conn is not None:
                conn.close()

    announce = bool(phase.get("announce"))
    if announce:
        print(json.dumps({"event": "phase_start", "name": phase.get("name")}), flush=True)
    rnd = random.Random(int(phase.get("seed", 1)))
    starts = sorted(rnd.uniform(0, ramp) for _ in range(conc))
    tasks = [asyncio.create_task(worker(w)) for w in range(conc)]
    t0 = time.monotonic()
    _done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - t0))
    if pending:
        stopped = True
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    wall = time.monotonic() - t0
    if announce:
        print(json.dumps({"event": "phase_end", "name": phase.get("name")}), flush=True)
    for t in tasks:  # a worker that crashed (not a stream failure) is reported, not hidden
        if t.done() and not t.cancelled() and t.exception() is not None:
            prep.setdefault("worker_errors", []).append(repr(t.exception())[:300])
    streams = [r if r is not None else {"error": "not run", "n": 0, "done": False} for r in results]
    agg: dict[str, Any] = {"wall": wall, "timed_out": bool(pending), **prep}
    if state.lats is not None:
        agg["latency_ms"] = percentiles([x * 1000 for x in state.lats])
    if kind == "owui":
        agg["socket"] = dict(sess.stats)
    return {"name": phase.get("name", "phase"), "kind": kind, "streams": streams, "agg": agg}


async def sse_stream(conn: _Conn, request: bytes, state: _PhaseState) -> dict[str, Any]:
    """One streaming POST on a keep-alive connection; times are relative to the request."""
    r: dict[str, Any] = {"status": None, "n": 0, "done": False, "error": None, "bytes": 0, "t0": time.monotonic()}
    proto: _Stream | None = None
    try:
        proto = await conn.get()
        await proto.start(request, r, state)
    except asyncio.CancelledError:
        r["error"] = r["error"] or "timeout (client deadline)"
        conn.close()
    except Exception as exc:  # noqa: BLE001
        r["error"] = f"{type(exc).__name__}: {exc}"
        conn.close()
    t0 = r.pop("t0")
    r["total"] = time.monotonic() - t0
    if proto is not None:
        if proto.first is not None:
            r["ttfc"] = proto.first - t0
            r["t_last"] = proto.last - t0  # type: ignore[operator]
        proto.r = None
    if r["status"] != 200 or not r["done"]:
        conn.close()  # do not reuse a connection in an unknown state
    return r


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    timeout = float(spec.get("timeout_s", 120))
    deadline = time.monotonic() + timeout
    sessions: dict[str, OwuiSession] = {}
    out: list[dict[str, Any]] = []
    try:
        for phase in spec["phases"]:
            try:
                res = await run_phase(phase, deadline, sessions)
            except (asyncio.TimeoutError, TimeoutError):
                return {"phases": out, "error": f"phase {phase.get('name')}: setup timed out (client deadline {timeout:g}s)"}
            except Exception as exc:  # noqa: BLE001 - e.g. the socket.io handshake failed
                return {"phases": out, "error": f"phase {phase.get('name')}: {type(exc).__name__}: {exc}"}
            if phase.get("name") != "_warmup":
                out.append(res)
            if res["agg"]["timed_out"]:
                return {"phases": out, "error": f"client deadline of {timeout:g}s reached"}
        return {"phases": out}
    finally:
        for sess in sessions.values():
            await sess.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="owui_client.py", description=__doc__.split("\n")[0])
    p.add_argument("--spec", help="JSON spec or @file (default: read it from stdin)")
    args = p.parse_args(argv)
    raw = args.spec if args.spec is not None else sys.stdin.read()
    if raw.startswith("@"):
        with open(raw[1:], encoding="utf-8") as f:
            raw = f.read()
    result = asyncio.run(run(json.loads(raw)))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
