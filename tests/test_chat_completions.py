"""The OpenAI-compatible surface, driven by the official openai SDK."""

from __future__ import annotations

import openai

from tests.harness import Service, sse_messages, sse_text
from tests.upstream import Reply


def client(service: Service, **kw: object) -> openai.AsyncOpenAI:
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
    raw = await sdk.chat.completions.with_raw_response.create(
        model="gpt-test", messages=[{"role": "user", "content": "question"}]
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == "The answer is 42."
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.total_tokens > 0
    assert raw.headers["X-Turn-Id"].startswith("turn_")
    # the upstream was asked with the client's messages, streaming
    sent = service.upstream.requests[-1]
    assert sent["messages"] == [{"role": "user", "content": "question"}]
    assert sent["stream"] is True and sent["model"] == "gpt-test"


async def test_models_listing(service: Service) -> None:
    models = await client(service).models.list()
    assert {m.id for m in models.data} == {"gpt-test", "gpt-other"}


async def test_live_stream_equals_replay(service: Service) -> None:
    service.upstream.enqueue(Reply(text="Event sourcing keeps every step. " * 20, chunk_size=3))
    async with service.http.post(
        service.v1 + "/chat/completions",
        json={"model": "gpt-test", "messages": [{"role": "user", "content": "x"}], "stream": True},
    ) as resp:
        raw = await resp.text()
        turn_id = resp.headers["X-Turn-Id"]
    live = sse_text(raw)
    ids = [i for i, _ in sse_messages(raw) if i is not None]
    assert ids == sorted(ids) and len(ids) == len(set(ids)), "SSE ids strictly increasing"
    view = await service.turn(turn_id)
    status, replay = await service.get(f"/v1/turns/{turn_id}/replay")
    assert status == 200
    assert live == view["content"] == replay["content"] == "Event sourcing keeps every step. " * 20
    assert replay == view
