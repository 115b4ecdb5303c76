"""A service without a usable upstream says so: at start, on /v1/models, on a 404."""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.harness import make_settings, start_service, stop_service
from tests.processes import Server, free_port
from tests.upstream import ScriptedUpstream

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


async def test_serve_without_an_upstream_warns_and_says_how_to_configure_one(http: aiohttp.ClientSession, tmp_path: Path) -> None:
    server = Server(tmp_path / "none.db", None, auto_resume=False)
    try:
        await server.ready(http)
        # logged before the service listens, so it is in the log once it answers
        log = server.log_path.read_text()
        warning = next(line for line in log.splitlines() if "no upstream is configured" in line)
        assert "WARNING" in warning and "TURNLOG_OPENAI_BASE_URL" in warning and "--demo" in warning
        async with http.get(server.url + "/v1/models") as resp:
            assert resp.status == 200
            listing = await resp.json()
        assert listing["data"] == [] and "no upstream is configured" in listing["turnlog"]["warning"]
        async with http.post(server.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 404
            error = (await resp.json())["error"]
        assert error["code"] == "model_not_found" and "no upstream is configured" in error["message"]
    finally:
        server.stop()


async def test_an_unreachable_upstream_is_reported_on_models_and_in_the_log(http: aiohttp.ClientSession, tmp_path: Path) -> None:
    closed = free_port()  # bound once and released: nothing listens there
    server = Server(tmp_path / "down.db", f"http://127.0.0.1:{closed}/v1", auto_resume=False)
    try:
        await server.ready(http)
        async with http.get(server.url + "/v1/models") as resp:
            assert resp.status == 200
            listing = await resp.json()
        assert listing["data"] == []
        [down] = listing["turnlog"]["unreachable"]
        assert down["upstream"] == "openai" and "cannot connect" in down["error"]
        # the listing answered only after the failed refresh was logged
        log = server.log_path.read_text()
        line = next(line for line in log.splitlines() if "is unreachable" in line)
        assert "WARNING" in line and f"127.0.0.1:{closed}" in line and "sk-test" not in log
        # OpenAI SDK clients still parse the listing (the extension field is ignored)
        sdk = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        assert (await sdk.models.list()).data == []
    finally:
        server.stop()


async def test_start_logs_each_upstream_with_its_models(
    upstream: ScriptedUpstream, database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="turnlog.catalog")  # before the service starts
    service = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url), upstream)
    try:
        status, listing = await service.get("/v1/models")  # waits for the start-up listing
        assert status == 200 and "turnlog" not in listing
    finally:
        await stop_service(service)
    lines = [r.getMessage() for r in caplog.records if r.name == "turnlog.catalog"]
    assert any(line.startswith("upstream openai (") and "2 models: gpt-test, gpt-other" in line for line in lines), lines
    assert not any("unreachable" in line for line in lines)
