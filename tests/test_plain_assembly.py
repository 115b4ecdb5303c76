"""The assembly's short path for plain requests: what it records and
what it sends upstream are exactly what the full pipeline records and sends.

Each request runs twice through the real service: once as it is (the short
path, checked to be taken) and once with the short path switched off. The
oracle is what the upstream received (its raw bytes), the events the log
holds, and what the client received, turn ids and times aside.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import engine.context.live as live
from engine.context.plain import plain_request
from tests.harness import Service

PLAIN: list[dict[str, Any]] = [
    {"stream": True, "messages": [{"role": "user", "content": "hi"}]},
    {"stream": False, "temperature": 0.3, "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"}]},
    {
        "stream": True,
        "params": {"system": "You are turnlog's test.", "top_p": 0.9},
        "messages": [
            {"role": "system", "content": "One."},
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "system", "content": "Two."},
            {"role": "user", "content": "c"},
        ],
    },
    {"stream": True, "features": {"web_search": False}, "max_tokens": 50, "messages": [{"role": "user", "content": "off"}]},
    {"stream": True, "chat_id": "CHAT", "background_tasks": {}, "messages": [{"role": "user", "content": "first"}]},
    {
        "stream": True,
        "chat_id": "CHAT",
        "background_tasks": {},
        "messages": [{"role": "user", "content": "first"}, {"role": "assistant", "content": "PREVIOUS"}, {"role": "user", "content": "second"}],
    },
]


async def _run(service: Service, label: str) -> list[tuple[bytes, str, str]]:
    """Each request's (upstream bytes, events, client bytes), ids made neutral."""
    out = []
    previous = ""
    for template in PLAIN:
        body = json.loads(json.dumps(template).replace("CHAT", f"chat-{label}").replace("PREVIOUS", previous))
        body["model"] = "gpt-test"
        sent = len(service.upstream.request_bodies)
        async with service.http.post(service.v1 + "/chat/completions", json=body, headers=service.headers) as resp:
            assert resp.status == 200
            turn_id = resp.headers["X-Turn-Id"]
            client = (await resp.read()).decode()
        view = await service.wait_status(turn_id, "completed")
        previous = view["content"]
        events = [{"type": e["type"], "data": e.get("data")} for e in await service.events(turn_id)]
        upstream = service.upstream.request_bodies[sent]

        chat_id = events[0]["data"]["chat_id"]

        def neutral(text: str, turn_id: str = turn_id, chat_id: str = chat_id) -> str:
            text = text.replace(turn_id, "TURN").replace(chat_id, "CHAT")
            text = re.sub(r"chatcmpl-[0-9a-f]{24}", "chatcmpl-UPSTREAM", text)  # the upstream's response ids
            text = re.sub(r'"first_chunk_at": ?[\d.]+', '"first_chunk_at": 0', text)  # a clock reading of the run
            return re.sub(r'"created": ?\d+', '"created": 0', text)

        out.append((upstream, neutral(json.dumps(events, sort_keys=True)), neutral(client)))
    return out


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """What ``plain_request`` answered for each request, in order (it still decides)."""
    answers: list[bool] = []

    def watched(*args: Any) -> bool:
        answers.append(plain_request(*args))
        return answers[-1]

    monkeypatch.setattr(live, "plain_request", watched)
    return answers


async def test_plain_requests_record_and_send_the_same_by_either_path(service: Service, taken: list[bool], monkeypatch: pytest.MonkeyPatch) -> None:
    short = await _run(service, "short")
    assert taken == [True] * len(PLAIN)  # every one of them took the short path

    monkeypatch.setattr(live, "plain_request", lambda *args: False)
    full = await _run(service, "full")

    for index, (a, b) in enumerate(zip(short, full, strict=True)):
        assert a[0] == b[0], f"request {index}: upstream bytes differ"
        assert a[1] == b[1], f"request {index}: recorded events differ:\n{a[1]}\n{b[1]}"
        assert a[2] == b[2], f"request {index}: client bytes differ:\n{a[2]}\n{b[2]}"
    # The steps the short path keeps did their work: the system messages merged, the chat's history read.
    assert '"merged_system_messages": 2' in short[2][1] and '"chat_turns": 1' in short[5][1]


async def test_a_request_with_files_features_or_tools_takes_the_full_path(service: Service, taken: list[bool]) -> None:
    not_plain: list[dict[str, Any]] = [
        {"features": {"web_search": True}},
        {"files": [{"type": "file", "id": "nope"}]},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}]},
    ]
    for extra in not_plain:
        body = {"model": "gpt-test", "stream": False, "messages": [{"role": "user", "content": "hi"}], **extra}
        status, answer, _ = await service.post("/v1/chat/completions", body)
        assert status == 200, answer
    assert taken == [False] * len(not_plain)
