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
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import aiohttp
import orjson
from aiohttp import web


def make_app(upstream: str) -> web.Application:
    base = upstream.rstrip("/")
    app = web.Application(client_max_size=64 * 1024 * 1024)
    holder: dict[str, aiohttp.ClientSession] = {}

    async def session_ctx(app: web.Application):  # type: ignore[no-untyped-def]
        holder["s"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=300),
        )
        yield
        await holder["s"].close()

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with holder["s"].post(
            base + "/chat/completions", data=body, headers={"Content-Type": "application/json"}
        ) as up:
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
        async with holder["s"].post(
            base + "/chat/completions", data=body, headers={"Content-Type": "application/json"}
        ) as up:
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
