"""The OpenAI-compatible surface, driven by the official openai SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.harness import Service, make_settings, sse_messages, sse_text, start_service, stop_service
from tests.oracle import check_stream_against_log
from tests.upstream import Reply, ScriptedUpstream

# Each test over the live path's shortcuts and over its plain reference path.
pytestmark = pytest.mark.live_paths


def client(service: Service, **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=service.v1, api_key="unused", max_retries=0, **kw)


async def test_streaming_with_the_openai_sdk(service: Service) -> None:
    service.upstream.enqueue(Reply(chunks=["Hel", "lo, ", "wor", "ld!"]))
    sdk = client(service)
    stream = await sdk.chat.completions.create(
        model="gpt-test",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
        usage = chunk.usage or usage
    assert text == "Hello, world!"
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens > 0
    turn_id = stream.response.headers["X-Turn-Id"]
    view = await service.turn(turn_id)
    assert view["status"] == "completed" and view["state"] == "done"
    assert view["content"] == text
    assert stream.response.headers["X-Chat-Id"] == view["chat_id"]


async def test_non_streaming_with_the_openai_sdk(service: Service) -> None:
    service.upstream.enqueue(Reply(text="The answer is 42."))
    sdk = client(service)
    raw = await sdk.chat.completions.with_raw_response.create(model="gpt-test", messages=[{"role": "user", "content": "question"}])
    completion = raw.parse()
    assert completion.choices[0].message.content == "The answer is 42."
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.total_tokens > 0
    assert raw.headers["X-Turn-Id"].startswith("turn_")
    # the upstream was asked with the client's messages, streaming
    sent = service.upstream.requests[-1]
    assert sent["messages"] == [{"role": "user", "content": "question"}]
    assert sent["stream"] is True and sent["model"] == "gpt-test"


async def test_usage_counted_when_the_upstream_reports_none(service: Service) -> None:
    """An upstream that ignores ``stream_options.include_usage`` (llama-cpp-python's
    server): the usage is counted with cl100k and marked as estimated."""
    messages: list[Any] = [{"role": "user", "content": "hello world"}]
    service.upstream.enqueue(Reply(chunks=["Hello", " world"], ignore_include_usage=True))
    sdk = client(service)
    completion = await sdk.chat.completions.create(model="gpt-test", messages=messages)
    assert service.upstream.requests[-1]["messages"] == messages  # what was counted
    # OpenAI's count for chat messages (3 per message, 3 for the reply): 3 + "user"
    # (1) + "hello world" (2, tiktoken [15339, 1917]) + 3; the answer "Hello world" is [9906, 1917].
    expected = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
    assert completion.usage is not None and completion.usage.model_dump(exclude_none=True) == expected
    assert (completion.model_extra or {}).get("usage_estimated") is True
    turn_id = completion.id.removeprefix("chatcmpl-")
    view = await service.turn(turn_id)
    assert {k: view["usage"][k] for k in expected} == expected and view["usage_estimated"] is True
    [done] = [e for e in await service.events(turn_id) if e["type"] == "model.completed"]
    assert done["data"]["usage"] == {**expected, "usage_estimated": True}

    # Streamed, with the usage chunk asked for: the same, on that chunk; an
    # upstream that reports usage (the scripted one's own numbers) is not marked.
    for reports in (False, True):
        service.upstream.enqueue(Reply(chunks=["Hello", " world"], ignore_include_usage=not reports))
        stream = await sdk.chat.completions.create(model="gpt-test", messages=messages, stream=True, stream_options={"include_usage": True})
        [last] = [chunk async for chunk in stream if chunk.usage is not None]
        view = await service.turn(last.id.removeprefix("chatcmpl-"))
        assert last.choices == [] and last.usage is not None
        if reports:
            assert "usage_estimated" not in (last.model_extra or {}) and "usage_estimated" not in view
        else:
            assert last.usage.model_dump(exclude_none=True) == expected
            assert (last.model_extra or {}).get("usage_estimated") is True and view["usage_estimated"] is True

    # The Responses API served over the same upstream: its usage, marked too.
    service.upstream.enqueue(Reply(chunks=["Hello", " world"], ignore_include_usage=True))
    status, response, _ = await service.post("/v1/responses", {"model": "gpt-test", "input": "hello world"})
    assert status == 200, response
    assert {k: response["usage"][k] for k in ("input_tokens", "output_tokens", "total_tokens")} == {"input_tokens": 9, "output_tokens": 2, "total_tokens": 11}
    assert response["usage_estimated"] is True


async def test_models_listing(service: Service) -> None:
    models = await client(service).models.list()
    assert {m.id for m in models.data} == {"gpt-test", "gpt-other"}


@pytest.fixture
async def windowed(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> AsyncIterator[Service]:
    """The service with small delta windows: a long answer is many ``model.delta``
    events, so the log has many prefixes inside the answer."""
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, flush_max_chunks=16), upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


async def test_live_stream_equals_replay(windowed: Service) -> None:
    # What the client was sent live, against the fold of every prefix of the log.
    service = windowed
    text = "Event sourcing keeps every step. " * 20
    service.upstream.enqueue(Reply(text=text, chunk_size=3))
    async with service.http.post(
        service.v1 + "/chat/completions",
        json={
            "model": "gpt-test",
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ) as resp:
        raw = await resp.text()
        turn_id = resp.headers["X-Turn-Id"]
    live = sse_text(raw)
    ids = [i for i, _ in sse_messages(raw) if i is not None]
    assert ids == sorted(ids) and len(ids) == len(set(ids)), "SSE ids strictly increasing"
    stream = await check_stream_against_log(service, turn_id, raw, include_usage=True)
    assert stream.upto(ids[-1]).finish == "stop" and stream.done
    deltas = [e for e in await service.events(turn_id) if e["type"] == "model.delta"]
    assert len(deltas) >= 10, "the answer spans many windows (prefixes)"
    view = await service.turn(turn_id)
    assert live == view["content"] == text
