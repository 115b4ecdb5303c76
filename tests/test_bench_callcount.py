"""``python -m bench.callcount serve``: ``turnlog serve`` that counts its event
loop's calls between two signals (the bench's ``live_calls`` figures)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import aiohttp

from bench.callcount import group_of
from tests.processes import Server, wait_for_output


def test_functions_are_grouped_by_where_they_live() -> None:
    assert group_of("/srv/turnlog/engine/run/actor.py") == "turnlog"
    assert group_of("/srv/turnlog/adapters/http/chat_routes.py") == "turnlog"
    assert group_of("/venv/lib/python3.11/site-packages/aiohttp/streams.py") == "aiohttp"
    assert group_of("/usr/lib/python3.11/asyncio/tasks.py") == "asyncio"
    assert group_of("/usr/lib/python3.11/json/encoder.py") == "other_python"
    assert group_of("~") == "c_calls"


async def test_the_calls_between_the_signals_are_the_served_turns(tmp_path: Path) -> None:
    out = tmp_path / "counts.json"
    server = Server(
        tmp_path / "calls.db",
        None,
        auto_resume=False,
        args=("--demo",),
        module="bench.callcount",
        BENCH_CALLCOUNT_OUT=str(out),
        TURNLOG_DEMO_CHUNK_DELAY="0",
    )
    try:
        async with aiohttp.ClientSession() as http:
            await server.ready(http)

            async def counted(turns: int) -> dict[str, int]:
                out.unlink(missing_ok=True)
                os.kill(server.proc.pid, signal.SIGUSR1)
                for i in range(turns):
                    body = {"model": "demo", "messages": [{"role": "user", "content": f"hello {i}"}]}
                    async with http.post(server.url + "/v1/chat/completions", json=body) as resp:
                        assert resp.status == 200, await resp.text()
                        await resp.read()
                os.kill(server.proc.pid, signal.SIGUSR2)
                counts: dict[str, int] = json.loads(await wait_for_output(out, "the counts"))
                return counts

            idle = await counted(0)
            busy = await counted(3)
    finally:
        server.stop()
    assert busy["python"] == sum(v for k, v in busy.items() if k not in ("python", "c_calls"))
    assert busy["aiohttp"] > 0 and busy["c_calls"] > 0
    # Three turns' work, against the signals' own handling with no request.
    assert busy["turnlog"] > 100 > idle.get("turnlog", 0), (idle, busy)
