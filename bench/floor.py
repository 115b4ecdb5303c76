"""The floor: the least a relay can do (runs in its own process).

    python -m bench.floor --upstream http://127.0.0.1:PORT/v1 [--port 0]

prints its base URL on stdout once listening. ``POST /v1/chat/completions``
POSTs the request body unchanged to the upstream and forwards the upstream's
response bytes as they arrive (``iter_any``), nothing else: no parsing, no
storage. turnlog's figures are divided by this relay's, measured in the same
run on the same machine, so the ratios do not depend on the host's speed.

``POST /parse/v1/chat/completions`` is a second, informational floor: the least
a service that must *see* every token can do. It splits the upstream's bytes
into SSE lines and, per ``data:`` chunk, parses the JSON and serializes it again
(orjson both ways), writing each read's chunks in one write. No state, no
storage, no fan-out.

``POST /durable/v1/chat/completions`` is a third, informational floor: the
least a relay that writes ahead can do. Before it sends the request upstream,
it commits the request body to a SQLite file (WAL, ``synchronous=NORMAL``, as
``turnlog serve`` by default) and waits until that commit is durable: one
writer thread takes every request queued and commits them as one multi-row
INSERT (a group commit), then the relay goes on as the plain one. turnlog
must do at least this before a turn's model request (its ``model.requested``
is durable before the request goes out), so this floor shows how much of a
start's time the write-ahead itself costs on this host.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import signal
import sqlite3
import sys
import tempfile
import threading
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web

#: Parameters per statement: at most 32766 since SQLite 3.32, 999 before.
_MAX_ROWS = 32766 if sqlite3.sqlite_version_info >= (3, 32, 0) else 999


class WriteAhead:
    """The group commit of the durable floor: the event loop queues a request's
    body, a thread commits everything queued in one transaction and resolves
    the requests' futures on the loop."""

    def __init__(self, path: Path, loop: asyncio.AbstractEventLoop) -> None:
        self.path, self.loop = path, loop
        self.pending: collections.deque[tuple[bytes, asyncio.Future[None]]] = collections.deque()
        self.signal = threading.Event()
        self.stopping = False
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS requests (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        self.thread = threading.Thread(target=self._serve, name="floor-writer", daemon=True)
        self.thread.start()

    def record(self, body: bytes) -> asyncio.Future[None]:
        future = self.loop.create_future()
        self.pending.append((body, future))
        self.signal.set()
        return future

    def close(self) -> None:
        self.stopping = True
        self.signal.set()
        self.thread.join(5)
        self.db.close()

    def _serve(self) -> None:
        while True:
            if not self.pending:
                if self.stopping:
                    return
                self.signal.wait()
                self.signal.clear()
                continue
            batch = [self.pending.popleft() for _ in range(min(len(self.pending), _MAX_ROWS))]
            try:
                self.db.execute("BEGIN IMMEDIATE")
                self.db.execute("INSERT INTO requests (body) VALUES " + ", ".join(["(?)"] * len(batch)), [b for b, _ in batch])
                self.db.execute("COMMIT")
            except sqlite3.Error as exc:
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                self.loop.call_soon_threadsafe(_settle, [f for _, f in batch], exc)
            else:
                self.loop.call_soon_threadsafe(_settle, [f for _, f in batch], None)


def _settle(futures: list[asyncio.Future[None]], exc: BaseException | None) -> None:
    for future in futures:
        if future.done():
            continue
        if exc is None:
            future.set_result(None)
        else:
            future.set_exception(exc)


#: The durable floor's group commit (for tests: its journal's ``path``).
WRITE_AHEAD = web.AppKey("write_ahead", WriteAhead)


def make_app(upstream: str) -> web.Application:
    base = upstream.rstrip("/")
    app = web.Application(client_max_size=64 * 1024 * 1024)
    holder: dict[str, aiohttp.ClientSession] = {}

    async def session_ctx(app: web.Application):
        holder["s"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=300),
        )
        with tempfile.TemporaryDirectory(prefix="floor-") as tmp:
            app[WRITE_AHEAD] = WriteAhead(Path(tmp) / "journal.db", asyncio.get_running_loop())
            yield
            app[WRITE_AHEAD].close()
        await holder["s"].close()

    async def chat(request: web.Request) -> web.StreamResponse:
        return await relay(request, await request.read())

    async def chat_durable(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        await request.app[WRITE_AHEAD].record(body)
        return await relay(request, body)

    async def relay(request: web.Request, body: bytes) -> web.StreamResponse:
        async with holder["s"].post(base + "/chat/completions", data=body, headers={"Content-Type": "application/json"}) as up:
            resp = web.StreamResponse(
                status=up.status,
                headers={"Content-Type": up.headers.get("Content-Type", "text/event-stream"), "Cache-Control": "no-cache"},
            )
            await resp.prepare(request)
            async for data in up.content.iter_any():
                await resp.write(data)
            await resp.write_eof()
            return resp

    async def chat_parsed(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        loads, dumps = orjson.loads, orjson.dumps
        async with holder["s"].post(base + "/chat/completions", data=body, headers={"Content-Type": "application/json"}) as up:
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            pending = b""
            async for data in up.content.iter_any():
                lines = (pending + data).split(b"\n")
                pending = lines.pop()
                out = []
                for line in lines:
                    if line.startswith(b"data: {"):
                        out.append(b"data: " + dumps(loads(line[6:])) + b"\n\n")
                    elif line.startswith(b"data: "):
                        out.append(line + b"\n\n")
                if out:
                    await resp.write(b"".join(out))
            await resp.write_eof()
            return resp

    async def models(request: web.Request) -> web.Response:
        async with holder["s"].get(base + "/models") as up:
            return web.Response(body=await up.read(), status=up.status, content_type="application/json")

    app.cleanup_ctx.append(session_ctx)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/parse/v1/chat/completions", chat_parsed)
    app.router.add_post("/durable/v1/chat/completions", chat_durable)
    app.router.add_get("/v1/models", models)
    return app


async def _serve(host: str, port: int, upstream: str) -> None:
    runner = web.AppRunner(make_app(upstream), access_log=None, shutdown_timeout=1.0)
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
    p = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.split("\n")[0])
    p.add_argument("--upstream", required=True, help="upstream base URL (…/v1)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    asyncio.run(_serve(args.host, args.port, args.upstream))
    sys.exit(0)


if __name__ == "__main__":
    main()
