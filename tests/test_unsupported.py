"""Request fields accepted but not implemented yet are reported, not silently dropped.

The warning is recorded (an ``assembly.step`` named ``unsupported``), shown in
the turn view's ``warnings``, returned to the client (``turnlog.warnings`` in a
``chat.completion``, a ``turnlog`` chunk early in an SSE stream), and the
turns still verify (the harness re-runs every turn at teardown).
"""

from __future__ import annotations

import json

from tests.harness import Service, sse_messages, sse_text
from tests.upstream import Reply

UNSUPPORTED = {"features": {"web_search": True, "memory": False, "image_generation": True}}


def body(**extra: object) -> dict[str, object]:
    return {"model": "gpt-test", "messages": [{"role": "user", "content": "q"}], **extra}


async def test_non_streaming_response_carries_the_warnings(service: Service) -> None:
    service.upstream.enqueue(Reply(text="answer"))
    status, data, headers = await service.post("/v1/chat/completions", body(**UNSUPPORTED))
    assert status == 200, data
    assert data["choices"][0]["message"]["content"] == "answer"
    warnings = data["turnlog"]["warnings"]
    assert [w.split(" ")[0] for w in warnings] == ["features.image_generation", "features.web_search"]  # only what was switched on
    assert all(" was ignored: " in w for w in warnings)
    assert "status" not in data["turnlog"]  # the turn completed
    turn_id = headers["X-Turn-Id"]
    assert (await service.turn(turn_id))["warnings"] == warnings
    events = await service.events(turn_id)
    types = [e["type"] for e in events]
    step = events[types.index("assembly.step")]
    assert step["data"]["step"] == "unsupported"
    assert [i["field"] for i in step["data"]["detail"]["ignored"]] == ["features.image_generation", "features.web_search"]
    assert types.index("assembly.step") < types.index("assembly.completed") < types.index("model.requested")
    # nothing of it reaches the upstream
    sent = service.upstream.requests[-1]
    assert not {"features", "files", "background_tasks"} & set(sent)


async def test_stream_says_it_before_the_answer(service: Service) -> None:
    service.upstream.enqueue(Reply(chunks=["an", "swer"]))
    async with service.http.post(service.v1 + "/chat/completions", json=body(stream=True, features={"memory": True})) as resp:
        assert resp.status == 200
        raw = await resp.text()
    assert sse_text(raw) == "answer"
    chunks = [json.loads(d) for _, d in sse_messages(raw) if d != "[DONE]"]
    flagged = [i for i, c in enumerate(chunks) if "turnlog" in c]
    first_text = next(i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["delta"].get("content"))
    assert len(flagged) == 1 and flagged[0] < first_text
    notice = chunks[flagged[0]]
    # native function calling (the default): memories would be the model's tools
    assert notice["turnlog"]["warnings"] == [
        'features.memory was ignored: with native function calling memories are the model\'s tools, which are '
        'not available yet; with params.function_calling: "default" they are injected'
    ]
    # still a valid chat.completion.chunk for OpenAI clients
    assert notice["object"] == "chat.completion.chunk" and notice["choices"][0]["delta"] == {}


async def test_legacy_code_interpreter_runs_so_it_is_no_warning(service: Service) -> None:
    service.upstream.enqueue(Reply(text="no code needed"), Reply(text="no code needed"))
    legacy = body(features={"code_interpreter": True}, params={"function_calling": "default"})
    status, data, _ = await service.post("/v1/chat/completions", legacy)
    assert status == 200 and "turnlog" not in data
    native = body(features={"code_interpreter": True})
    status, data, _ = await service.post("/v1/chat/completions", native)
    assert status == 200
    assert data["turnlog"]["warnings"][0].startswith("features.code_interpreter was ignored: ")


async def test_a_plain_request_has_no_warnings(service: Service) -> None:
    service.upstream.enqueue(Reply(text="plain"))
    status, data, headers = await service.post("/v1/chat/completions", body(features={"web_search": False}, files=[]))
    assert status == 200 and "turnlog" not in data
    types = [e["type"] for e in await service.events(headers["X-Turn-Id"])]
    assert "assembly.step" not in types
