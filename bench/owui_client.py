"""The Open WebUI peer client: streams turns and times them client side (own process).

    VENV/bin/python bench/owui_client.py [--spec JSON | --spec @FILE]     (no --spec: the JSON spec on stdin)

It needs only the standard library, ``aiohttp`` (which every Open WebUI install
has) and ``bench/client.py`` (standard library only; the repository root is put
on ``sys.path``), so it runs in the Open WebUI virtualenv, not in the project's.
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
``headers``, e.g. ``Authorization: Bearer``) read by ``bench/client.py``'s bare
asyncio protocol (HTTP/1.1 keep-alive, chunked decoding) that takes each read's
arrival time first and only counts content chunks (``"delta":{"content":`` in
``data:`` events). Used for turnlog, the floor and Open WebUI's
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

import asyncio
import json
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench.client (stdlib only)

from bench.client import _Conn, _PhaseState, build_request, cli, one_stream, percentiles, run_workers  # noqa: E402

STAMP_TEXT = re.compile(r"@([0-9]+\.[0-9]+) ")
PROMPT = "Write a very long answer, please."


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
        chat = {
            "title": "bench",
            "models": [model],
            "params": {},
            "history": {"messages": {}, "currentId": None},
            "messages": [],
            "tags": [],
            "timestamp": int(time.time() * 1000),
        }
        async with self.http.post(self.base + "/api/v1/chats/new", data=json.dumps({"chat": chat, "folder_id": None}), headers=self.headers) as resp:
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
            "user_message": {
                "id": user_id,
                "parentId": None,
                "childrenIds": [],
                "role": "user",
                "content": PROMPT,
                "models": [model],
                "timestamp": int(time.time()),
            },
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
    state = _PhaseState(phase, total)
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

        async def owui_turn(_conn: None, i: int) -> dict[str, Any]:
            r = await sess.turn(chats[i][0], model, extra, state.lats)
            r["chat_new_ms"] = chats[i][1] * 1000
            return r

        results, wall, timed_out, tasks = await run_workers(phase, deadline, total, owui_turn)
    else:
        host, port, request = build_request(phase["url"], phase["body"], phase.get("headers"))
        results, wall, timed_out, tasks = await run_workers(
            phase, deadline, total, lambda conn, _i: one_stream(conn, request, state), lambda: _Conn(host, port)
        )

    for t in tasks:  # a worker that crashed (not a stream failure) is reported, not hidden
        if t.done() and not t.cancelled() and t.exception() is not None:
            prep.setdefault("worker_errors", []).append(repr(t.exception())[:300])
    streams = [r if r is not None else {"error": "not run", "n": 0, "done": False} for r in results]
    for r in streams:
        r.pop("t0", None)
    agg: dict[str, Any] = {"wall": wall, "timed_out": timed_out, **prep}
    if state.lats is not None:
        agg["latency_ms"] = percentiles([x * 1000 for x in state.lats])
    if kind == "owui":
        assert sess is not None
        agg["socket"] = dict(sess.stats)
    return {"name": phase.get("name", "phase"), "kind": kind, "streams": streams, "agg": agg}


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    timeout = float(spec.get("timeout_s", 120))
    deadline = time.monotonic() + timeout
    sessions: dict[str, OwuiSession] = {}
    out: list[dict[str, Any]] = []
    try:
        for phase in spec["phases"]:
            try:
                res = await run_phase(phase, deadline, sessions)
            except TimeoutError:
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
    cli(argv, "owui_client.py", __doc__, run, stdin=True)


if __name__ == "__main__":
    main()
