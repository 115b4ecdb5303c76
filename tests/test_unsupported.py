"""Features a request switches on that cannot work for its turn are reported,
not silently dropped: a service that is not configured (no web search engine,
code execution off), or a model whose ``builtin_tools`` capability is off in
native function calling (features are the model's tools then).

The warning is recorded (an ``assembly.step`` named ``unsupported``), shown in
the turn view's ``warnings``, returned to the client (``turnlog.warnings`` in a
``chat.completion``, a ``turnlog`` chunk early in an SSE stream), and the
turns still verify (the harness re-runs every turn at teardown).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.harness import Service, make_settings, sse_messages, sse_text, start_service, stop_service
from tests.upstream import Reply, ScriptedUpstream

NO_SEARCH = "features.web_search was ignored: no web search engine is configured (TURNLOG_WEB_SEARCH_ENGINE)"


def body(**extra: object) -> dict[str, object]:
    return {"model": "gpt-test", "messages": [{"role": "user", "content": "q"}], **extra}


async def test_non_streaming_response_carries_the_warnings(service: Service) -> None:
    service.upstream.enqueue(Reply(text="answer"))
    request = body(features={"web_search": True, "memory": False, "teleport": True})
    status, data, headers = await service.post("/v1/chat/completions", request)
    assert status == 200, data
    assert data["choices"][0]["message"]["content"] == "answer"
    warnings = data["turnlog"]["warnings"]
    assert warnings == ["features.teleport was ignored: this feature is not known to turnlog", NO_SEARCH]
    assert "status" not in data["turnlog"]  # the turn completed
    turn_id = headers["X-Turn-Id"]
    assert (await service.turn(turn_id))["warnings"] == warnings
    events = await service.events(turn_id)
    step = next(e for e in events if e["type"] == "assembly.step" and e["data"]["step"] == "unsupported")
    assert [i["field"] for i in step["data"]["detail"]["ignored"]] == ["features.teleport", "features.web_search"]
    types = [e["type"] for e in events]
    assert types.index("assembly.completed") < types.index("model.requested")
    # nothing of it reaches the upstream, no page fetching tool either
    assert not {"features", "files", "background_tasks", "tools"} & set(service.upstream.requests[-1])


async def test_stream_says_it_before_the_answer(service: Service) -> None:
    service.upstream.enqueue(Reply(chunks=["an", "swer"]))
    async with service.http.post(service.v1 + "/chat/completions", json=body(stream=True, features={"web_search": True})) as resp:
        assert resp.status == 200
        raw = await resp.text()
    assert sse_text(raw) == "answer"
    chunks = [json.loads(d) for _, d in sse_messages(raw) if d != "[DONE]"]
    flagged = [i for i, c in enumerate(chunks) if "warnings" in c.get("turnlog", {})]
    first_text = next(i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["delta"].get("content"))
    assert len(flagged) == 1 and flagged[0] < first_text
    notice = chunks[flagged[0]]
    assert notice["turnlog"] == {"warnings": [NO_SEARCH]}
    # still a valid chat.completion.chunk for OpenAI clients
    assert notice["object"] == "chat.completion.chunk" and notice["choices"][0]["delta"] == {}


async def test_code_execution_off_is_said(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, code_executor="off"), upstream)
    try:
        block = '<code_interpreter type="code" lang="python">\nprint(1)\n</code_interpreter>'
        upstream.enqueue(Reply(text="no code"), Reply(text=block))
        for params in ({}, {"function_calling": "default"}):
            status, data, _ = await svc.post("/v1/chat/completions", body(features={"code_interpreter": True}, params=params))
            assert status == 200
            assert data["turnlog"]["warnings"] == ["features.code_interpreter was ignored: code execution is off (TURNLOG_CODE_EXECUTOR)"]
            # neither the tool nor the prompt: the model is not told it can run code
            sent = upstream.requests[-1]
            assert "tools" not in sent and sent["messages"][-1]["content"] == "q"
        # and a block the model writes anyway stays text: nothing ran, one upstream call
        assert data["choices"][0]["message"]["content"] == block and len(upstream.requests) == 2
    finally:
        await stop_service(svc)


async def test_features_need_the_builtin_tools_capability_in_native_mode(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, models={"gpt-test": {"capabilities": {"builtin_tools": False}}})
    svc = await start_service(settings, upstream)
    try:
        upstream.enqueue(Reply(text="ok"), Reply(text="ok"))
        status, data, _ = await svc.post("/v1/chat/completions", body(features={"memory": True}))
        assert status == 200 and data["turnlog"]["warnings"][0].startswith("features.memory was ignored: the model's builtin_tools capability is off")
        assert "tools" not in upstream.requests[-1]
        # prompt-based function calling injects memories instead: no warning
        status, data, _ = await svc.post("/v1/chat/completions", body(features={"memory": True}, params={"function_calling": "default"}))
        assert status == 200 and "turnlog" not in data
    finally:
        await stop_service(svc)


async def test_a_plain_request_has_no_warnings(service: Service) -> None:
    service.upstream.enqueue(Reply(text="plain"))
    status, data, headers = await service.post("/v1/chat/completions", body(features={"web_search": False}, files=[]))
    assert status == 200 and "turnlog" not in data
