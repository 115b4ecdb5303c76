from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

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
