"""``TURNLOG_REUSE_PORT``: several ``turnlog serve`` processes listen on one port
(``SO_REUSEPORT``) and share one PostgreSQL log; a draining one leaves new
connections to the others; on SQLite it is refused."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from tests.harness import sse_text
from tests.processes import ROOT, Server, get_json, wait_for
from tests.upstream import Reply, ScriptedUpstream

USER = [{"role": "user", "content": "hi"}]


async def _fresh_get(url: str) -> str:
    """GET on a new connection: the kernel picks a listening process per connection."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
        async with fresh.get(url) as resp:
            assert resp.status == 200
            return await resp.text()


async def _both_answer(a: Server, b: Server) -> None:
    """Fresh connections to the port until two processes (two start times) have answered."""
    starts: set[str] = set()
    deadline = time.monotonic() + 30
    while len(starts) < 2:
        assert b.proc.poll() is None, f"the second process exited:\n{b.log_tail()}"
        assert time.monotonic() < deadline, f"only one process answered on port {a.port}:\n{b.log_tail()}"
        try:
            page = await _fresh_get(a.url + "/metrics")
        except aiohttp.ClientError:
            continue  # the second process is still starting up
        found = re.search(r"^process_start_time_seconds (\S+)$", page, re.M)
        assert found is not None
        starts.add(found.group(1))


async def test_two_processes_serve_one_port_and_one_log(pg_url: str, tmp_path: Path, upstream: ScriptedUpstream, http: aiohttp.ClientSession) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = Server(pg_url, upstream.url, auto_resume=True, log_dir=tmp_path / "a", TURNLOG_REUSE_PORT="true")
    b: Server | None = None
    try:
        await a.ready(http)
        # The second binds the same port while the first listens on it.
        b = Server(pg_url, upstream.url, auto_resume=True, log_dir=tmp_path / "b", args=("--port", str(a.port)), TURNLOG_REUSE_PORT="true")
        await _both_answer(a, b)

        # Turns through the shared port complete, whichever process runs them,
        # and each is readable through the port afterwards (one log).
        turn_ids = []
        for i in range(6):
            upstream.enqueue(Reply(text=f"answer {i}"))
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
                async with fresh.post(a.url + "/v1/chat/completions", json={"model": "gpt-test", "messages": USER}) as resp:
                    assert resp.status == 200, await resp.text()
                    body = await resp.json()
                    turn_ids.append(resp.headers["X-Turn-Id"])
            assert body["choices"][0]["message"]["content"] == f"answer {i}"
        for i, turn_id in enumerate(turn_ids):
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
                async with fresh.get(f"{a.url}/v1/turns/{turn_id}") as resp:
                    assert resp.status == 200
                    view = await resp.json()
            assert view["status"] == "completed"
            assert view["content"] == f"answer {i}"
    finally:
        a.stop()
        if b is not None:
            b.stop()


TEXT = "".join(f"tok{i:03d} " for i in range(60))  # 60 chunks of 8 characters
PAUSE_AT = 10


async def test_a_draining_process_leaves_new_connections_to_the_other(pg_url: str, tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """A keeps a turn running through its drain (a long drain); meanwhile every
    new connection to the port reaches B, and A's 503 closes the connection
    a client kept alive to it. Without the drain closing A's listening socket,
    about half of the fresh connections would reach A and get its 503."""
    upstream = ScriptedUpstream(models=["gpt-test"], default=Reply(text=TEXT, chunk_size=8, delay=0.005, pause_after=PAUSE_AT))
    await upstream.start()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    env = {"TURNLOG_REUSE_PORT": "true", "TURNLOG_DRAIN_SECONDS": "60", "TURNLOG_LEASE_SECONDS": "60"}
    a = Server(pg_url, upstream.url, auto_resume=True, log_dir=tmp_path / "a", env=env)
    b: Server | None = None
    kept = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
    try:
        await a.ready(http)
        # Alone on the port, A gets the connection kept alive and a turn that
        # pauses midway (the upstream holds it), so A's drain lasts.
        async with kept.get(a.url + "/healthz") as resp:
            assert resp.status == 200
        async with http.post(a.url + "/v1/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True}) as resp:
            assert resp.status == 200
            turn_id = resp.headers["X-Turn-Id"]
            reading = asyncio.create_task(resp.content.read())
            await wait_for(http, f"{a.url}/v1/turns/{turn_id}", lambda v: len(v["content"]) >= PAUSE_AT * 8, timeout=30)
            b = Server(pg_url, upstream.url, auto_resume=True, log_dir=tmp_path / "b", args=("--port", str(a.port)), env=env)
            await _both_answer(a, b)

            os.kill(a.proc.pid, signal.SIGTERM)
            # A drains: its 503 on the kept connection, which it then closes.
            deadline = time.monotonic() + 20
            while True:
                assert time.monotonic() < deadline, f"A never answered as draining:\n{a.log_tail()}"
                async with kept.get(a.url + "/healthz") as health:
                    if health.status == 503:
                        assert health.headers.get("Connection", "").lower() == "close"
                        assert health.headers.get("Retry-After", "").isdigit()
                        break
                await asyncio.sleep(0.02)
            assert a.proc.poll() is None and not reading.done()  # A still drains: its turn is held

            # Every new connection reaches B: /healthz, and a turn.
            for _ in range(24):
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
                    async with fresh.get(a.url + "/healthz") as health:
                        assert health.status == 200, "a new connection reached the draining process"
            upstream.enqueue(Reply(text="from b"))
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
                async with fresh.post(a.url + "/v1/chat/completions", json={"model": "gpt-test", "messages": USER}) as done:
                    assert done.status == 200, await done.text()
                    assert (await done.json())["choices"][0]["message"]["content"] == "from b"

            # A's turn goes on once the upstream lets it; A finishes it and exits.
            upstream.release()
            seen = sse_text((await asyncio.wait_for(reading, 30)).decode())
        assert await asyncio.to_thread(a.proc.wait, 30) == 0, a.log_tail()
        assert seen == TEXT
        view = await get_json(http, f"http://127.0.0.1:{a.port}/v1/turns/{turn_id}")
        assert view["status"] == "completed" and view["content"] == TEXT
        assert b"stopped listening" in a.log_path.read_bytes()
    finally:
        await kept.close()
        a.stop()
        if b is not None:
            b.stop()
        await upstream.close()


def test_reuse_port_is_refused_on_sqlite(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "TURNLOG_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 't.db'}",
        "TURNLOG_REUSE_PORT": "true",
    }
    done = subprocess.run([sys.executable, "-m", "adapters.cli", "serve", "--port", "0"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "TURNLOG_REUSE_PORT needs PostgreSQL" in done.stderr + done.stdout
