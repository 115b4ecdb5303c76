"""``TURNLOG_REUSE_PORT``: several ``turnlog serve`` processes listen on one port
(``SO_REUSEPORT``) and share one PostgreSQL log; on SQLite it is refused."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from tests.processes import ROOT, Server
from tests.upstream import Reply, ScriptedUpstream

USER = [{"role": "user", "content": "hi"}]


async def _fresh_get(url: str) -> str:
    """GET on a new connection: the kernel picks a listening process per connection."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
        async with fresh.get(url) as resp:
            assert resp.status == 200
            return await resp.text()


async def test_two_processes_serve_one_port_and_one_log(
    pg_url: str, tmp_path: Path, upstream: ScriptedUpstream, http: aiohttp.ClientSession
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = Server(pg_url, upstream.url, auto_resume=True, log_dir=tmp_path / "a", TURNLOG_REUSE_PORT="true")
    b: Server | None = None
    try:
        await a.ready(http)
        # The second binds the same port while the first listens on it.
        b = Server(
            pg_url, upstream.url, auto_resume=True, log_dir=tmp_path / "b", args=("--port", str(a.port)), TURNLOG_REUSE_PORT="true"
        )
        # Both answer: fresh connections until two processes (two start times) have.
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


def test_reuse_port_is_refused_on_sqlite(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "TURNLOG_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 't.db'}",
        "TURNLOG_REUSE_PORT": "true",
    }
    done = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "serve", "--port", "0"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "TURNLOG_REUSE_PORT needs PostgreSQL" in done.stderr + done.stdout
