"""The live pipeline's records: each model call's first-chunk time."""

from __future__ import annotations

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
