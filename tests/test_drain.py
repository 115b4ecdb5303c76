"""Graceful drain on SIGTERM: 503 for new turns, running turns finish
or are released, and another instance resumes the released ones at once.

The oracle is what the clients and the scripted upstream saw against each
turn's log (read back from the surviving instance): the whole answer exactly
once, a log with no gap and one ``turn.completed``, a re-run that verifies, and
the upstream asked once per start plus once per resume (never twice for one
stretch of the answer). The lease TTL is 60 s, so a resume that waited for a
lease to run out would fail the timing asserts by far.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.fault_clients import kept_text
from tests.harness import sse_text
from tests.polling import until
from tests.processes import Server, get_json, wait_for
from tests.upstream import Reply, ScriptedUpstream

TEXT = "".join(f"tok{i:03d} " for i in range(120))  # 105 chunks of 8 characters
USER = [{"role": "user", "content": "count"}]
LEASE = "60"  # waiting for a lease to expire would take a minute
DRAIN = 1.5
PAUSE_AT = 20  # every upstream stream pauses after this many chunks until released


async def _stream(http: aiohttp.ClientSession, server: Server, started: list[str]) -> tuple[str, str]:
    """Start a streaming turn and read until the server ends the stream; the
    turn id and the text this client saw."""
    async with http.post(server.url + "/v1/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True}) as resp:
        assert resp.status == 200, await resp.text()
        turn_id = resp.headers["X-Turn-Id"]
        started.append(turn_id)
        raw = b""
        try:
            async for data in resp.content.iter_any():
                raw += data
        except aiohttp.ClientError:
            pass  # the draining instance went away mid-stream
    text = raw.decode(errors="replace")
    return turn_id, sse_text(text[: text.rfind("\n\n") + 2])


def _client(server: Server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


async def _refused_while_draining(client: openai.AsyncOpenAI) -> None:
    """A new turn on a draining instance: 503, ``Retry-After``, the OpenAI error shape."""
    try:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model="gpt-test", messages=USER)  # type: ignore[arg-type]
    finally:
        await client.close()
    assert caught.value.status_code == 503
    assert caught.value.response.headers.get("Retry-After", "").isdigit()
    body = caught.value.response.json()
    assert body["error"]["type"] == "service_unavailable_error" and body["error"]["code"] == "draining"


async def _wait_draining(http: aiohttp.ClientSession, server: Server) -> None:
    """Until ``/healthz`` says the instance drains (it got the signal)."""
    deadline = time.monotonic() + 10
    while True:
        async with http.get(server.url + "/healthz") as resp:
            if resp.status == 503:
                assert resp.headers.get("Retry-After")
                return
        assert time.monotonic() < deadline, f"never started draining:\n{server.log_tail()}"
        await asyncio.sleep(0.02)


async def _all_streaming(http: aiohttp.ClientSession, server: Server, started: list[str], n: int) -> None:
    """Until ``n`` turns have their first stretch of answer durable (each is
    then paused by the upstream, so it is still running at the restart)."""
    deadline = time.monotonic() + 30
    while len(started) < n:
        assert time.monotonic() < deadline, f"only {len(started)} turns started"
        await asyncio.sleep(0.02)
    for turn_id in started:
        await wait_for(http, f"{server.url}/v1/turns/{turn_id}", lambda v: len(v["content"]) >= PAUSE_AT * 8, timeout=30)


async def _completed(http: aiohttp.ClientSession, server: Server, upstream: ScriptedUpstream, turn_ids: list[str]) -> None:
    """Let the paused streams go on (those that arrive later pause again:
    released again) until every turn has completed."""
    deadline = time.monotonic() + 60
    for turn_id in turn_ids:
        while True:
            upstream.release()
            view = await get_json(http, f"{server.url}/v1/turns/{turn_id}")
            if view["status"] == "completed":
                break
            assert view["status"] in ("running", "interrupted"), view
            assert time.monotonic() < deadline, f"{turn_id} did not complete: {view['status']}"
            await asyncio.sleep(0.05)


async def _exited(server: Server, timeout: float = 30.0) -> int:
    code = await asyncio.to_thread(server.proc.wait, timeout)
    return code


def _resume_delays(events: list[dict[str, Any]], stops: list[float]) -> list[float]:
    """Seconds from the latest SIGTERM before each ``turn.resumed`` to it."""
    delays = []
    for event in events:
        if event["type"] == "turn.resumed":
            before = [t for t in stops if t <= event["at"]]
            assert before, f"resumed before any instance was stopped: {event}"
            delays.append(event["at"] - max(before))
    return delays


async def _check_turn(http: aiohttp.ClientSession, server: Server, turn_id: str, seen: str, stops: list[float]) -> int:
    """The oracle for one turn; returns how many times it was resumed."""
    view = await get_json(http, f"{server.url}/v1/turns/{turn_id}")
    assert view["status"] == "completed", view
    assert view["content"] == TEXT, f"{turn_id}: duplicated or missing text"
    assert TEXT.startswith(seen), f"{turn_id}: the client saw text that is not the answer's"
    events = (await get_json(http, f"{server.url}/v1/turns/{turn_id}/events?limit=10000"))["events"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), "a gap in the log"
    types = [e["type"] for e in events]
    assert types.count("turn.completed") == 1
    for delay in _resume_delays(events, stops):
        # the drain and the hand-over (seconds on a loaded machine), not the
        # 60 s lease nor the 20 s heartbeat scan of the adopter
        assert delay < DRAIN + 10, f"{turn_id}: resumed {delay:.1f} s after its owner got SIGTERM (lease {LEASE} s)"
    async with http.get(f"{server.url}/v1/turns/{turn_id}/stream") as resp:
        # A client applying the resumed notices (the OpenAI upstream restarts a
        # cut-off answer: the stream replays the superseded part, then the notice).
        assert kept_text(await resp.text()) == TEXT, "a reconnecting client gets the answer once"
    verdict = await get_json(http, f"{server.url}/v1/turns/{turn_id}/verify")
    assert verdict["ok"], verdict["diff"]
    return types.count("turn.resumed")


async def test_rolling_restart_of_two_instances_under_50_turns(pg_url: str, tmp_path: Path, http: aiohttp.ClientSession) -> None:
    # Every stream (a start or a continuation) pauses after PAUSE_AT chunks:
    # both restarts happen while every turn runs.
    upstream = ScriptedUpstream(models=["gpt-test"], default=Reply(text=TEXT, chunk_size=8, delay=0.01, pause_after=PAUSE_AT))
    await upstream.start()
    env = {"TURNLOG_LEASE_SECONDS": LEASE, "TURNLOG_DRAIN_SECONDS": str(DRAIN)}
    a = Server(pg_url, upstream.url, auto_resume=True, log_dir=tmp_path, env=env)
    b = Server(pg_url, upstream.url, auto_resume=True, log_dir=tmp_path, env=env)
    a2: Server | None = None
    try:
        await a.ready(http)
        await b.ready(http)
        started: list[str] = []
        clients = [asyncio.create_task(_stream(http, a if i % 2 else b, started)) for i in range(50)]
        await _all_streaming(http, b, started, 50)

        # Restart A: it drains, B takes its unfinished turns over.
        client = _client(a)
        stops = [time.time()]
        os.kill(a.proc.pid, signal.SIGTERM)
        await _wait_draining(http, a)
        await _refused_while_draining(client)
        assert await _exited(a) == 0, a.log_tail()
        a2 = Server(pg_url, upstream.url, auto_resume=True, log_dir=tmp_path, env=env)
        await a2.ready(http)

        # Restart B: A2 takes over what B still runs (its own and A's).
        client = _client(b)
        stops.append(time.time())
        os.kill(b.proc.pid, signal.SIGTERM)
        await _wait_draining(http, b)
        await _refused_while_draining(client)
        assert await _exited(b) == 0, b.log_tail()

        await _completed(http, a2, upstream, started)
        seen = dict(await asyncio.gather(*clients))
        assert len(seen) == 50
        resumes = 0
        for turn_id, text in seen.items():
            resumes += await _check_turn(http, a2, turn_id, text, stops)
        assert resumes >= 25, "A's unfinished turns were released (drain shorter than a turn)"
        # The upstream: one request per start, one per resume, no other.
        assert len(upstream.requests) == 50 + resumes
        continued = [r["messages"][-1]["content"] for r in upstream.requests if r["messages"][-1]["role"] == "assistant"]
        assert len(continued) <= resumes and all(TEXT.startswith(p) for p in continued)
        assert b"released" in a.log_path.read_bytes() and b"released" in b.log_path.read_bytes()
    finally:
        for server in (a, b, a2):
            if server is not None:
                server.stop()
        await upstream.close()


async def test_drain_on_sqlite_finishes_the_short_turn_and_the_restart_resumes_the_long_one(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    short = "a short answer that ends within the drain"
    upstream = ScriptedUpstream(models=["gpt-test"], default=Reply(text=TEXT, chunk_size=8, delay=0.01, pause_after=PAUSE_AT))
    upstream.enqueue(Reply(text=short, chunk_size=4, delay=0.1))
    await upstream.start()
    db = tmp_path / "turnlog.db"
    env = {"TURNLOG_LEASE_SECONDS": LEASE, "TURNLOG_DRAIN_SECONDS": str(DRAIN)}
    first = Server(db, upstream.url, auto_resume=True, env=env)
    second: Server | None = None
    try:
        await first.ready(http)
        started: list[str] = []
        quick = asyncio.create_task(_stream(http, first, started))
        await until(lambda: upstream.requests, "the first request reached the upstream")
        slow = asyncio.create_task(_stream(http, first, started))
        await until(lambda: len(started) >= 2, "both streams started")
        await _all_streaming(http, first, [started[1]], 1)
        # A non-streaming request too: released before its answer, it is told so.
        blocking = asyncio.create_task(http.post(first.url + "/v1/chat/completions", json={"model": "gpt-test", "messages": USER}))
        await until(lambda: len(upstream.requests) >= 3, "the blocking request reached the upstream")
        client = _client(first)
        os.kill(first.proc.pid, signal.SIGTERM)
        await _wait_draining(http, first)
        await _refused_while_draining(client)
        quick_id, quick_seen = await quick
        assert quick_seen == short, "the running turn finished within the drain, its client saw all of it"
        slow_id, slow_seen = await slow
        async with await blocking as answer:
            assert answer.status == 503 and answer.headers["Retry-After"].isdigit()
            assert (await answer.json())["error"]["code"] == "turn_interrupted", "never a partial answer as a whole one"
            blocking_id = answer.headers["X-Turn-Id"]
        assert await _exited(first) == 0, first.log_tail()
        stops = [time.time()]  # one instance: the turn waits for the restart, not the lease
        second = Server(db, upstream.url, auto_resume=True, env=env)
        await second.ready(http)
        done = await wait_for(http, f"{second.url}/v1/turns/{quick_id}", lambda v: v["status"] == "completed")
        assert done["content"] == short
        types = [e["type"] for e in (await get_json(http, f"{second.url}/v1/turns/{quick_id}/events?limit=10000"))["events"]]
        assert "turn.interrupted" not in types
        await _completed(http, second, upstream, [slow_id])
        assert await _check_turn(http, second, slow_id, slow_seen, stops) == 1
        await _completed(http, second, upstream, [blocking_id])
        assert await _check_turn(http, second, blocking_id, "", stops) == 1
    finally:
        for server in (first, second):
            if server is not None:
                server.stop()
        await upstream.close()
