"""The live pipeline's records: each model call's first-chunk time."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness import Service
from tests.upstream import Reply

# Each test over the live path's shortcuts and over its plain reference path.
pytestmark = pytest.mark.live_paths

USER = [{"role": "user", "content": "go"}]


def _one(events: list[dict], type_: str) -> dict:
    found = [e for e in events if e["type"] == type_]
    assert len(found) == 1, [e["type"] for e in events]
    return found[0]


async def test_model_completed_records_when_the_first_chunk_came(service: Service) -> None:
    # The upstream waits DELAY before each content chunk (its role chunk goes
    # at once and is not an answer chunk): the first chunk cannot have come
    # sooner than DELAY after the request was written ahead.
    delay = 0.25
    service.upstream.enqueue(Reply(chunks=["Hel", "lo"], delay=delay))
    status, body, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
    assert status == 200 and body["choices"][0]["message"]["content"] == "Hello"
    events = await service.events(headers["X-Turn-Id"])
    requested, completed = _one(events, "model.requested"), _one(events, "model.completed")
    first = completed["data"]["first_chunk_at"]
    assert requested["at"] + delay <= first <= completed["at"]
    # ... and before the second chunk (another DELAY later) was folded in.
    assert first <= completed["at"] - delay + 0.05
    # A re-run of the engine answers the call at another time: not a difference.
    status, verdict = await service.get(f"/v1/turns/{headers['X-Turn-Id']}/verify")
    assert status == 200 and verdict["ok"], verdict


async def test_a_call_without_answer_chunks_records_no_first_chunk_time(service: Service) -> None:
    service.upstream.enqueue(Reply(chunks=[]))
    status, _, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
    assert status == 200
    events = await service.events(headers["X-Turn-Id"])
    # Left out, as in logs written before it was recorded.
    assert "first_chunk_at" not in _one(events, "model.completed")["data"]


async def test_the_plain_path_takes_no_shortcut_and_the_fast_path_does(service: Service, live_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference path is what the tests over both paths compare against:
    it must not take the shortcuts (plain chunks folded as one run, chunks
    written from the publish), and the fast path must take them."""
    from adapters.http import live_sinks
    from engine.ports import LiveChunks, LiveMessage
    from engine.run.live import InProcessBus

    direct: list[int] = []
    messages: list[bool] = []
    deliver, publish = live_sinks.DirectSSE.deliver, InProcessBus.publish

    def counted_deliver(self: live_sinks.DirectSSE, follower: Any, outs: list[Any]) -> None:
        direct.append(len(outs))
        deliver(self, follower, outs)

    def counted_publish(self: InProcessBus, turn_id: str, message: LiveMessage) -> None:
        if isinstance(message, LiveChunks):
            messages.append(message.plain)
        publish(self, turn_id, message)

    monkeypatch.setattr(live_sinks.DirectSSE, "deliver", counted_deliver)
    monkeypatch.setattr(InProcessBus, "publish", counted_publish)
    service.upstream.enqueue(Reply(chunks=[f"w{i} " for i in range(20)], delay=0.005))
    async with service.http.post(service.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True}) as resp:
        assert resp.status == 200
        await resp.read()
    assert messages, "no live chunks were published"
    if live_path == "plain":
        assert not direct and not any(messages)
    else:
        assert direct and any(messages)  # (the answer's first chunk is folded on its own)
