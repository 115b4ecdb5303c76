"""Memories in a turn: with ``features.memory`` and prompt-based function calling,
the user's memories nearest to the last message go into the system message as a
``User Context`` block (top 3, with dates), recorded as the ``memory`` step; with
native function calling they are not injected (the model's memory tools are for
that) and the client is told; nothing matching injects nothing.
"""

from __future__ import annotations

import re

from tests.harness import Service
from tests.upstream import Reply

MEMORIES = [
    "I live in Lisbon and cycle to work.",
    "My daughter is allergic to peanuts.",
    "I prefer answers in metric units.",
    "My favourite bread is sourdough from the Lisbon bakery.",
    "I am learning Portuguese.",
]


async def remember(service: Service) -> None:
    for text in MEMORIES:
        status, data, _ = await service.post("/v1/memories", {"content": text})
        assert status == 200, data


def body(**extra: object) -> dict[str, object]:
    return {
        "model": "gpt-test",
        "messages": [{"role": "system", "content": "Be helpful."}, {"role": "user", "content": "Which bakery in Lisbon has sourdough?"}],
        "features": {"memory": True},
        **extra,
    }


async def test_legacy_mode_injects_the_nearest_memories_once(service: Service) -> None:
    await remember(service)
    service.upstream.enqueue(Reply(text="Try the one you like."))
    status, data, headers = await service.post("/v1/chat/completions", body(params={"function_calling": "default"}))
    assert status == 200, data
    system = [m for m in service.upstream.requests[-1]["messages"] if m["role"] == "system"]
    assert len(system) == 1
    text = system[0]["content"]
    assert text.startswith("Be helpful.") and text.count("User Context:") == 1
    lines = re.findall(r"^\d+\. \[(\d{4}-\d\d-\d\d)\] (.+)$", text, re.M)
    assert len(lines) == 3  # top 3
    assert lines[0][1] == "My favourite bread is sourdough from the Lisbon bakery."
    assert "I live in Lisbon and cycle to work." in [memory for _, memory in lines]
    step = next(e["data"]["detail"] for e in await service.events(headers["X-Turn-Id"]) if e["data"].get("step") == "memory")
    assert step["injected"] is True and len(step["hits"]) == 3
    assert step["query"] == "Which bakery in Lisbon has sourdough?"


async def test_nothing_matching_injects_nothing(service: Service) -> None:
    await remember(service)
    service.upstream.enqueue(Reply(text="ok"))
    request = body(params={"function_calling": "default"})
    request["messages"] = [{"role": "user", "content": "zebra quantum"}]  # no memory shares a word
    status, _, headers = await service.post("/v1/chat/completions", request)
    assert status == 200
    assert all("User Context" not in str(m["content"]) for m in service.upstream.requests[-1]["messages"])
    step = next(e["data"]["detail"] for e in await service.events(headers["X-Turn-Id"]) if e["data"].get("step") == "memory")
    assert step == {"query": "zebra quantum", "hits": [], "injected": False}


async def test_native_mode_gives_the_model_memory_tools_instead(service: Service) -> None:
    await remember(service)
    service.upstream.enqueue(Reply(text="ok"))
    status, data, _ = await service.post("/v1/chat/completions", body())
    assert status == 200 and "turnlog" not in data
    sent = service.upstream.requests[-1]
    assert all("User Context" not in str(m["content"]) for m in sent["messages"])
    assert sorted(t["function"]["name"] for t in sent["tools"]) == ["add_memory", "search_memories"]


async def test_a_turn_searches_only_its_users_memories(service: Service) -> None:
    await remember(service)  # the loopback user's (auth off: "local")
    memories = service.services.supervisor.wiring.memories
    assert memories is not None
    assert len(await memories.search("local", "Lisbon sourdough", 3)) == 2  # the two that share a word
    assert await memories.search("bob", "Lisbon sourdough", 3) == []
