"""Test harness: the real service on loopback, against the scripted upstream.

Nothing here is mocked: the service is the real aiohttp app with a real SQLite
file, and the upstream is a real HTTP server speaking OpenAI's bytes.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from adapters.config import Settings, load_settings
from adapters.http.app import create_app
from adapters.http.context import SERVICES, Services
from tests.upstream import ScriptedUpstream

UPSTREAM_KEY = "sk-upstream-SECRET-7f3a9c"


@dataclass
class Service:
    """A running turnlog with its upstream."""

    url: str  # http://127.0.0.1:PORT
    scripted: ScriptedUpstream | None  # None: a real model server is the upstream
    settings: Settings
    runner: web.AppRunner
    http: aiohttp.ClientSession
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def upstream(self) -> ScriptedUpstream:
        assert self.scripted is not None, "this service's upstream is not the scripted one"
        return self.scripted

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"

    @property
    def services(self) -> Services:
        return self.runner.app[SERVICES]

    async def post(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any, dict[str, str]]:
        async with self.http.post(self.url + path, json=body, headers=self.headers, **kw) as resp:
            text = await resp.text()
            try:
                data = json.loads(text)
            except ValueError:
                data = text
            return resp.status, data, dict(resp.headers)

    async def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        async with self.http.get(self.url + path, headers={**self.headers, **kw.pop("headers", {})}, **kw) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text

    async def turn(self, turn_id: str) -> dict[str, Any]:
        status, body = await self.get(f"/v1/turns/{turn_id}")
        assert status == 200, body
        return body

    async def events(self, turn_id: str) -> list[dict[str, Any]]:
        status, body = await self.get(f"/v1/turns/{turn_id}/events?limit=10000")
        assert status == 200, body
        return body["events"]

    async def wait_status(self, turn_id: str, *statuses: str, timeout: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            view = await self.turn(turn_id)
            if view["status"] in statuses:
                return view
            if time.monotonic() > deadline:
                raise AssertionError(f"turn {turn_id} stayed {view['status']} (wanted {statuses})")
            await asyncio.sleep(0.02)


async def retired(service: Service, turn_id: str) -> None:
    """Until the supervisor has let the turn's actor go. The client is answered
    as the actor stops; its lease is given up and the actor dropped just after
    (the supervisor's retire task): wait for that, not for time."""
    supervisor = service.services.supervisor
    actor = supervisor.actors.get(turn_id)
    if actor is not None:
        await actor.done
    task = supervisor.retiring.get(turn_id)
    if task is not None:
        await task


def make_settings(tmp_path: Path, upstream_url: str | None, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": f"sqlite+aiosqlite:///{tmp_path / 'turnlog.db'}",
        "openai_base_url": upstream_url,
        "openai_api_key": UPSTREAM_KEY,
        "lease_seconds": 2.0,
    }
    values.update(overrides)
    return load_settings(None, **values)


async def start_service(settings: Settings, upstream: ScriptedUpstream | None, **ports: Any) -> Service:
    """Run the app on a free loopback port; ``ports`` plug outer-edge adapters
    (e.g. ``code_executor``) into ``create_app``."""
    app = create_app(settings, **ports)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    http = aiohttp.ClientSession()
    return Service(url=f"http://127.0.0.1:{port}", scripted=upstream, settings=settings, runner=runner, http=http)


async def verify_all_turns(service: Service, scratch_dir: Path) -> int:
    """``turnlog verify`` on every finished turn of the service: its hash chain
    holds, and the engine re-run against its recorded results appends the
    same events."""
    from adapters.cli import scratch_store
    from engine.chain import check
    from engine.run.verify import verify_turn

    store = service.services.store
    records = [r for r in await store.list_turns(limit=100_000) if r.status in ("completed", "cancelled", "failed")]
    if not records:
        return 0
    await asyncio.to_thread(scratch_dir.mkdir, parents=True, exist_ok=True)
    scratch = await scratch_store(str(scratch_dir))
    try:
        for record in records:
            chain = check(record.id, await store.read_chain(record.id))
            assert chain.ok, f"turn {record.id}: {chain.damage}"
            result = await verify_turn(await store.read(record.id), scratch)
            assert result.ok, f"turn {record.id} does not verify:\n" + "\n".join(result.diff)
    finally:
        await scratch.close()
    return len(records)


async def stop_service(service: Service, *, verify: bool = True) -> None:
    try:
        if verify and SERVICES in service.runner.app:
            import tempfile

            with tempfile.TemporaryDirectory(prefix="turnlog-verify-") as folder:
                await verify_all_turns(service, Path(folder))
    finally:
        await service.http.close()
        await service.runner.cleanup()


def sse_messages(raw: str) -> list[tuple[int | None, str]]:
    """(id, data) of each SSE message in a body."""
    out: list[tuple[int | None, str]] = []
    for block in raw.split("\n\n"):
        ident: int | None = None
        data: list[str] = []
        for line in block.split("\n"):
            if line.startswith("id: "):
                ident = int(line[4:])
            elif line.startswith("data: "):
                data.append(line[6:])
        if data:
            out.append((ident, "\n".join(data)))
    return out


def sse_text(raw: str) -> str:
    """The answer text carried by a chat.completion.chunk SSE body."""
    text = []
    for _ident, data in sse_messages(raw):
        if data == "[DONE]":
            continue
        chunk = json.loads(data)
        for choice in chunk.get("choices") or []:
            text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)
