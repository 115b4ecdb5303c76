from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.pg import pg_url  # noqa: F401  (fixture: a fresh PostgreSQL database)
from tests.harness import Service, make_settings, start_service, stop_service
from tests.upstream import ScriptedUpstream


@pytest.fixture
async def upstream() -> AsyncIterator[ScriptedUpstream]:
    up = ScriptedUpstream(models=["gpt-test", "gpt-other"])
    await up.start()
    try:
        yield up
    finally:
        await up.close()


@pytest.fixture
async def service(tmp_path: Path, upstream: ScriptedUpstream) -> AsyncIterator[Service]:
    svc = await start_service(make_settings(tmp_path, upstream.url), upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
