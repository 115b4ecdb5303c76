"""Hostile input at the service's edge: deeply nested JSON on every surface
that parses it, and the like. Each gets a 4xx naming the problem, never a 500,
and nothing of it reaches the log."""

from __future__ import annotations

import json
from typing import Any

from tests.harness import Service
from tests.upstream import Reply

USER = [{"role": "user", "content": "hello"}]


def nested(levels: int) -> Any:
    """Arrays nested ``levels`` deep: ``[[…[1]…]]``."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


async def post_raw(svc: Service, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    # json.dumps, not orjson: the client's encoder must not refuse the depth first.
    async with svc.http.post(svc.v1 + path, data=json.dumps(body), headers={"Content-Type": "application/json"}) as resp:
        return resp.status, await resp.json()


def assert_too_deep(status: int, body: Any) -> None:
    assert status == 400, body
    assert body["error"]["code"] == "json_too_deep" and "64 levels" in body["error"]["message"], body


async def test_json_nested_300_deep_is_a_400_on_chat_and_responses(service: Service) -> None:
    status, body = await post_raw(service, "/chat/completions", {"model": "gpt-test", "messages": USER, "metadata": nested(300)})
    assert_too_deep(status, body)
    status, body = await post_raw(service, "/responses", {"model": "gpt-test", "input": "hi", "metadata": nested(300)})
    assert_too_deep(status, body)
    # One level past the limit (the body's object is the first level) is refused, the limit itself is not.
    status, body = await post_raw(service, "/chat/completions", {"model": "gpt-test", "messages": USER, "metadata": nested(64)})
    assert_too_deep(status, body)
    service.upstream.enqueue(Reply(text="fine"))
    status, body = await post_raw(service, "/chat/completions", {"model": "gpt-test", "messages": USER, "metadata": nested(63)})
    assert status == 200 and body["choices"][0]["message"]["content"] == "fine", body
    assert len(service.upstream.requests) == 1  # the refused ones never reached the model


async def test_json_nested_300_deep_on_the_websocket_is_an_error_frame(service: Service) -> None:
    async with service.http.ws_connect(service.v1 + "/ws") as ws:
        await ws.send_str(json.dumps({"type": "chat", "request": {"model": "gpt-test", "messages": USER, "metadata": nested(300)}}))
        frame = await ws.receive_json(timeout=10)
        assert frame["type"] == "error" and frame["code"] == "json_too_deep" and "64 levels" in frame["message"], frame
        # The connection stays up and answers the next message.
        await ws.send_json({"type": "subscribe", "turn_id": "turn_missing"})
        assert (await ws.receive_json(timeout=10))["code"] == "not_found"
    assert service.upstream.requests == []
