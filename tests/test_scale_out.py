"""Several ``turnlog serve`` processes on one PostgreSQL: fan-out, cancel, adoption, fencing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.harness import sse_text
from tests.processes import Server, cli, get_json, wait_for
from tests.upstream import Reply, ScriptedUpstream

TEXT = "".join(f"tok{i:03d} " for i in range(120))
USER = [{"role": "user", "content": "count"}]


@pytest.fixture
async def pair(pg_url: str, tmp_path: Path, upstream: ScriptedUpstream, http: aiohttp.ClientSession) -> AsyncIterator[tuple[Server, Server]]:
    a = Server(pg_url, upstream.url, auto_resume=True, log_dir=tmp_path, TURNLOG_LEASE_SECONDS="1")
    b = Server(pg_url, upstream.url, auto_resume=True, log_dir=tmp_path, TURNLOG_LEASE_SECONDS="1")
    try:
        await a.ready(http)
        await b.ready(http)
        yield a, b
    finally:
        for server in (a, b):
            if server.proc.poll() is None:
                try:
                    os.kill(server.proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            server.stop()


async def start_turn(http: aiohttp.ClientSession, server: Server) -> tuple[str, aiohttp.ClientResponse]:
    resp = await http.post(server.url + "/v1/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True})
    assert resp.status == 200
    return resp.headers["X-Turn-Id"], resp


async def test_a_turn_on_a_is_watched_live_on_b(pair: tuple[Server, Server], upstream: ScriptedUpstream, http: aiohttp.ClientSession) -> None:
    a, b = pair
    upstream.enqueue(Reply(text=TEXT, chunk_size=8, delay=0.01))
    turn_id, resp = await start_turn(http, a)
    lags = []
    async with http.ws_connect(b.url + "/v1/ws") as ws:
        await ws.send_json({"type": "subscribe", "turn_id": turn_id, "after": 0})
        events = []
        async for msg in ws:
            data = json.loads(msg.data)
            if data["type"] != "event":
                continue
            events.append(data)
            lags.append(time.time() - data["event"]["at"])
            if data["event"]["type"] == "turn.completed":
                break
    await resp.release()
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    text = "".join(e["event"]["data"]["text"] for e in events if e["event"]["type"] == "model.delta")
    assert text == TEXT
    live = lags[len(lags) // 2 :]  # the tail arrived live, not from catch-up
    assert statistics.median(live) < 0.25, f"events reached B after {statistics.median(live):.3f} s (median)"


async def test_cancel_sent_to_b_stops_the_turn_on_a(pair: tuple[Server, Server], upstream: ScriptedUpstream, http: aiohttp.ClientSession) -> None:
    a, b = pair
    upstream.enqueue(Reply(text=TEXT, chunk_size=8, pause_after=5))
    turn_id, resp = await start_turn(http, a)
    await asyncio.wait_for(upstream.paused.wait(), 10)
    async with http.post(f"{b.url}/v1/turns/{turn_id}/cancel") as cancel:
        assert cancel.status == 202, await cancel.text()
        assert (await cancel.json())["status"] == "cancelled"
    raw = await resp.text()
    upstream.release()
    view = await get_json(http, f"{a.url}/v1/turns/{turn_id}")
    assert view["status"] == "cancelled" and view["content"] == TEXT[:40]
    assert sse_text(raw) == TEXT[:40]
    events = (await get_json(http, f"{b.url}/v1/turns/{turn_id}/events"))["events"]
    assert [e["type"] for e in events][-2:] == ["turn.cancel_requested", "turn.cancelled"]


async def test_kill9_of_a_then_b_adopts_and_completes(
    pair: tuple[Server, Server], upstream: ScriptedUpstream, http: aiohttp.ClientSession, pg_url: str
) -> None:
    a, b = pair
    upstream.enqueue(Reply(text=TEXT, chunk_size=8, delay=0.01), Reply(text=TEXT, chunk_size=8))
    turn_id, resp = await start_turn(http, a)
    await wait_for(http, f"{b.url}/v1/turns/{turn_id}", lambda v: len(v["content"]) > 100)
    killed_at = time.monotonic()
    a.kill9()
    resp.close()
    done = await wait_for(http, f"{b.url}/v1/turns/{turn_id}", lambda v: v["status"] == "completed", timeout=20)
    assert time.monotonic() - killed_at < 10, "adopted within a few lease periods"
    assert done["content"] == TEXT, "nothing duplicated, nothing missing"
    types = [e["type"] for e in (await get_json(http, f"{b.url}/v1/turns/{turn_id}/events?limit=10000"))["events"]]
    assert types.index("turn.interrupted") < types.index("turn.resumed") < types.index("turn.completed")
    assert cli(pg_url, "verify", turn_id).returncode == 0


async def test_a_stale_owner_that_wakes_up_is_fenced_off(pair: tuple[Server, Server], upstream: ScriptedUpstream, http: aiohttp.ClientSession) -> None:
    a, b = pair
    upstream.enqueue(Reply(text=TEXT, chunk_size=8, delay=0.01), Reply(text=TEXT, chunk_size=8))
    turn_id, resp = await start_turn(http, a)
    await wait_for(http, f"{b.url}/v1/turns/{turn_id}", lambda v: len(v["content"]) > 100)
    os.kill(a.proc.pid, signal.SIGSTOP)  # A freezes, holding its lease...
    try:
        done = await wait_for(http, f"{b.url}/v1/turns/{turn_id}", lambda v: v["status"] == "completed", timeout=20)
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)  # ...and wakes up after B took the turn over
    # A goes on with the turn until its next write is refused; it then stops.
    deadline = time.monotonic() + 20
    while not any(m in a.log_path.read_bytes() for m in (b"stopped writing", b"this actor stops")):
        assert a.proc.poll() is None, f"A exited:\n{a.log_tail()}"
        assert time.monotonic() < deadline, f"A never noticed it lost the turn:\n{a.log_tail()}"
        await asyncio.sleep(0.05)
    resp.close()
    final = await get_json(http, f"{b.url}/v1/turns/{turn_id}")
    assert final["content"] == TEXT == done["content"]
    events = (await get_json(http, f"{b.url}/v1/turns/{turn_id}/events?limit=10000"))["events"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert [e["type"] for e in events].count("turn.completed") == 1
    assert a.proc.poll() is None  # A is alive; it only stopped writing this turn
    # It says so, whichever write found out first: a lost lease, or a stale fencing token.
    log = a.log_path.read_bytes()
    assert b"lease" in log.lower() or b"stopped writing" in log or b"this actor stops" in log
