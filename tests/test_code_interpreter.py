"""The legacy code-interpreter loop, through the code-executor port.

The executor itself (a sandbox) is a later feature; here a small executor that
evaluates Python expressions stands at the port, which is where a double belongs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.expressions import ExpressionExecutor
from tests.harness import Service, make_settings, start_service, stop_service
from tests.upstream import Reply, ScriptedUpstream

LEGACY = {"params": {"function_calling": "default"}, "features": {"code_interpreter": True}}


@pytest.fixture
async def legacy(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> AsyncIterator[tuple[Service, ExpressionExecutor]]:
    executor = ExpressionExecutor()
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url), upstream, code_executor=executor)
    try:
        yield svc, executor
    finally:
        await stop_service(svc)


async def test_code_block_runs_and_its_output_is_fed_back(legacy: tuple[Service, ExpressionExecutor]) -> None:
    svc, executor = legacy
    svc.upstream.enqueue(
        Reply(chunks=["Let me compute.\n<code_inter", 'preter type="code" lang="python">\nprint(6 * 7)\n</code_interpreter>']),
        Reply(text="The answer is 42."),
    )
    status, body, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": [{"role": "user", "content": "6 times 7?"}], **LEGACY})
    assert status == 200, body
    assert executor.ran == ["print(6 * 7)"]
    first, second = svc.upstream.requests
    assert "<code_interpreter" in first["messages"][-1]["content"]  # the legacy prompt rides on the user message
    replayed = second["messages"][-1]["content"]
    assert "<code_interpreter>\nprint(6 * 7)\n</code_interpreter>" in replayed and "42" in replayed
    view = await svc.turn(headers["X-Turn-Id"])
    code = [i for i in view["output"] if i["type"] == "code_interpreter"][0]
    assert code["output"] == {"stdout": "42"} and code["status"] == "completed"
    assert view["content"].endswith("The answer is 42.")


async def test_code_loop_stops_after_five_runs(legacy: tuple[Service, ExpressionExecutor]) -> None:
    svc, executor = legacy
    for _ in range(7):
        svc.upstream.enqueue(Reply(chunks=["<code_interpreter>print(1)</code_interpreter>"]))
    status, body, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": [{"role": "user", "content": "loop"}], **LEGACY})
    assert status == 200
    assert len(executor.ran) == 5  # Open WebUI's cap: never more, never hangs
    assert len(svc.upstream.requests) == 6
    assert (await svc.turn(headers["X-Turn-Id"]))["status"] == "completed"


async def test_without_legacy_mode_tags_are_plain_text(legacy: tuple[Service, ExpressionExecutor]) -> None:
    svc, executor = legacy
    svc.upstream.enqueue(Reply(chunks=["<code_interpreter>print(1)</code_interpreter>"]))
    status, body, _ = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": [{"role": "user", "content": "x"}]})
    assert executor.ran == []
    assert body["choices"][0]["message"]["content"] == "<code_interpreter>print(1)</code_interpreter>"
