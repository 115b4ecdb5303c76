"""The benchmark's write-ahead floor (``bench/floor.py``, ``/durable``): a request
reaches the upstream only once its body is committed to the floor's journal,
and the answer is relayed unchanged."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bench.floor import WRITE_AHEAD, make_app

SSE = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'


async def test_a_request_is_committed_before_it_goes_upstream(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    aiohttp_client: Callable[..., Awaitable[TestClient[Any, Any]]],
) -> None:
    seen: list[tuple[bytes, bool]] = []
    journal: dict[str, Any] = {}
    called = asyncio.Event()

    async def upstream_chat(request: web.Request) -> web.Response:
        body = await request.read()
        # The upstream's own connection: what it finds is what was committed.
        with sqlite3.connect(journal["path"]) as db:
            committed = [row[0] for row in db.execute("SELECT body FROM requests ORDER BY id")]
        seen.append((body, body in committed))
        called.set()
        return web.Response(body=SSE, content_type="text/event-stream")

    upstream_app = web.Application()
    upstream_app.router.add_post("/v1/chat/completions", upstream_chat)
    upstream = await aiohttp_server(upstream_app)
    floor_app = make_app(str(upstream.make_url("/v1")))
    client = await aiohttp_client(floor_app)
    journal["path"] = floor_app[WRITE_AHEAD].path

    bodies = [b'{"model":"m","stream":true,"n":%d}' % i for i in range(3)]
    for body in bodies:
        resp = await client.post("/durable/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
        assert resp.status == 200, await resp.text()
        assert await resp.read() == SSE
    assert seen == [(body, True) for body in bodies]

    # While another connection holds the journal's write lock, the request
    # waits: it reaches the upstream only once the lock is gone and the
    # commit done.
    lock = sqlite3.connect(journal["path"], isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    called.clear()
    late = asyncio.ensure_future(client.post("/durable/v1/chat/completions", data=b'{"late":1}', headers={"Content-Type": "application/json"}))
    try:
        await asyncio.wait_for(called.wait(), 0.5)
    except TimeoutError:
        pass
    assert not called.is_set(), "the request reached the upstream before its body could be committed"
    lock.execute("COMMIT")
    lock.close()
    resp = await late
    assert resp.status == 200 and await resp.read() == SSE
    assert seen[-1] == (b'{"late":1}', True)
    bodies.append(b'{"late":1}')

    # The plain floor writes nothing.
    resp = await client.post("/v1/chat/completions", data=b'{"plain":1}', headers={"Content-Type": "application/json"})
    assert resp.status == 200 and await resp.read() == SSE
    assert seen[-1] == (b'{"plain":1}', False)
    with sqlite3.connect(journal["path"]) as db:
        assert [row[0] for row in db.execute("SELECT body FROM requests ORDER BY id")] == bodies
