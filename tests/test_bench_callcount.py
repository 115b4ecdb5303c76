"""``python -m bench.callcount serve``: ``turnlog serve`` that counts its event
loop's calls between two signals (the bench's ``live_calls`` figures)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from bench.callcount import group_of
from tests.processes import ROOT, free_port, wait_for_output


def test_functions_are_grouped_by_where_they_live() -> None:
    assert group_of("/srv/turnlog/engine/run/actor.py") == "turnlog"
    assert group_of("/srv/turnlog/adapters/http/chat_routes.py") == "turnlog"
    assert group_of("/venv/lib/python3.11/site-packages/aiohttp/streams.py") == "aiohttp"
    assert group_of("/usr/lib/python3.11/asyncio/tasks.py") == "asyncio"
    assert group_of("/usr/lib/python3.11/json/encoder.py") == "other_python"
    assert group_of("~") == "c_calls"


async def test_the_calls_between_the_signals_are_the_served_turns(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "counts.json"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TURNLOG_")},
        "TURNLOG_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'calls.db'}",
        "TURNLOG_DEMO_CHUNK_DELAY": "0",
        "BENCH_CALLCOUNT_OUT": str(out),
    }
    proc = _spawn(["serve", "--port", str(port), "--demo"], env, tmp_path / "serve.log")
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            await _ready(http, url, proc, tmp_path / "serve.log")

            async def counted(turns: int) -> dict[str, int]:
                out.unlink(missing_ok=True)
                os.kill(proc.pid, signal.SIGUSR1)
                for i in range(turns):
                    body = {"model": "demo", "messages": [{"role": "user", "content": f"hello {i}"}]}
                    async with http.post(url + "/v1/chat/completions", json=body) as resp:
                        assert resp.status == 200, await resp.text()
                        await resp.read()
                os.kill(proc.pid, signal.SIGUSR2)
                counts: dict[str, int] = json.loads(await wait_for_output(out, "the counts"))
                return counts

            idle = await counted(0)
            busy = await counted(3)
    finally:
        proc.terminate()
        proc.wait(10)
    assert busy["python"] == sum(v for k, v in busy.items() if k not in ("python", "c_calls"))
    assert busy["aiohttp"] > 0 and busy["c_calls"] > 0
    # Three turns' work, against the signals' own handling with no request.
    assert busy["turnlog"] > 100 > idle.get("turnlog", 0), (idle, busy)


async def _ready(http: aiohttp.ClientSession, url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert proc.poll() is None, _text(log)
        try:
            async with http.get(url + "/healthz") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"bench.callcount serve did not become ready:\n{_text(log)}")


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "bench.callcount", *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def _text(path: Path) -> str:
    return path.read_text(errors="replace")
