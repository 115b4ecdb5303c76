"""Background tasks: a title and tags on a chat's first turn, follow-ups on every
turn, written by the task model after the answer is final — never delaying it
(the stream's [DONE] and a non-streaming response come first), recorded as
``background.result`` events, shown in the turn, the chat and its listing, and
never failing the turn. The scripted upstream answers task-model prompts apart
from the scripted conversation (``task_requests``, ``task_replies``).
"""

from __future__ import annotations

import asyncio
import json

from tests.harness import Service, sse_messages, sse_text
from tests.oracle import check_stream_against_log
from tests.upstream import Reply

QUESTION = "How do I bake sourdough bread? ![crumb](http://img/x.png) <details><summary>tool</summary>secret tool output</details>"


def body(**extra: object) -> dict[str, object]:
    return {"model": "gpt-test", "messages": [{"role": "user", "content": QUESTION}], **extra}


def named_events(raw: str) -> list[dict]:
    """The ``event: turnlog`` messages of an SSE body, in order."""
    out = []
    for block in raw.split("\n\n"):
        lines = block.split("\n")
        if "event: turnlog" in lines:
            out.append(json.loads(next(line[6:] for line in lines if line.startswith("data: "))))
    return out


async def test_first_turn_of_a_chat_gets_title_tags_and_follow_ups_after_done(service: Service) -> None:
    up = service.upstream
    up.enqueue(Reply(text="Mix flour, water, salt and starter."))
    up.task_replies += [
        ("title", Reply(text='Sure! {"title": "Sourdough Baking"}')),
        ("tags", Reply(text='{"tags": ["Cooking", "Baking"]}')),
        ("follow_ups", Reply(text='{"follow_ups": ["How long to proof?", "Which flour?"]}')),
    ]
    async with service.http.post(service.v1 + "/chat/completions", json=body(stream=True, chat_id="bread")) as resp:
        raw = await resp.text()
        turn_id = resp.headers["X-Turn-Id"]
    assert sse_text(raw) == "Mix flour, water, salt and starter."
    # [DONE] ends the answer; the background results follow as named events
    done_at = raw.index("data: [DONE]")
    assert raw.index('"finish_reason":"stop"') < done_at < raw.index("event: turnlog")
    results = {e["background"]["task"]: e["background"]["result"] for e in named_events(raw)}
    assert results == {"title": "Sourdough Baking", "tags": ["Cooking", "Baking"], "follow_ups": ["How long to proof?", "Which flour?"]}
    view = await service.turn(turn_id)
    assert (view["status"], view["title"], view["tags"], view["follow_ups"]) == (
        "completed",
        "Sourdough Baking",
        ["Cooking", "Baking"],
        ["How long to proof?", "Which flour?"],
    )
    status, chat = await service.get("/v1/chats/bread")
    assert status == 200 and chat["title"] == "Sourdough Baking" and chat["tags"] == ["Cooking", "Baking"]
    status, listing = await service.get("/v1/chats")
    assert [c["title"] for c in listing["data"] if c["id"] == "bread"] == ["Sourdough Baking"]
    # the task model saw the chat without markup or images, and was never part
    # of the scripted conversation
    assert len(up.requests) == 1 and len(up.task_requests) == 3
    prompts = [r["messages"][-1]["content"] for r in up.task_requests]
    assert all(p.startswith("### Task:") for p in prompts)
    assert all("How do I bake sourdough bread?" in p and "secret tool output" not in p and "img/x.png" not in p for p in prompts)
    types = [e["type"] for e in await service.events(turn_id)]
    assert types[-6:] == ["turn.finalized", "background.started", "background.result", "background.result", "background.result", "turn.completed"]
    await check_stream_against_log(service, turn_id, raw)


async def test_later_turns_get_follow_ups_only_and_bare_calls_none(service: Service) -> None:
    up = service.upstream
    up.enqueue(Reply(text="one"), Reply(text="two"), Reply(text="three"))
    for _ in range(2):
        status, _, headers = await service.post("/v1/chat/completions", body(chat_id="c2"))
        assert status == 200
        await service.wait_status(headers["X-Turn-Id"], "completed")
    assert [r["messages"][-1]["content"].split("\n")[1][:12] for r in up.task_requests][:3]  # title, tags, follow-ups
    assert len(up.task_requests) == 4  # 3 on the first turn, follow-ups on the second
    status, _, headers = await service.post("/v1/chat/completions", body())  # no chat_id: a bare call
    view = await service.wait_status(headers["X-Turn-Id"], "completed")
    assert len(up.task_requests) == 4 and "title" not in view
    assert "background.started" not in [e["type"] for e in await service.events(headers["X-Turn-Id"])]


async def test_a_request_chooses_its_tasks(service: Service) -> None:
    service.upstream.enqueue(Reply(text="answer"))
    status, _, headers = await service.post("/v1/chat/completions", body(background_tasks={"title": True, "tags": False}))
    view = await service.wait_status(headers["X-Turn-Id"], "completed")
    assert view["title"] == "Scripted chat" and "tags" not in view and "follow_ups" not in view


async def test_a_failing_task_model_never_fails_the_turn(service: Service) -> None:
    up = service.upstream
    up.enqueue(Reply(text="the answer"))
    up.task_replies += [("title", Reply(status=500, error_message="task model down")), ("tags", Reply(text="no json here"))]
    status, data, headers = await service.post("/v1/chat/completions", body(chat_id="c3"))
    assert status == 200 and data["choices"][0]["message"]["content"] == "the answer"
    view = await service.wait_status(headers["X-Turn-Id"], "completed")
    results = {e["data"]["task"]: e["data"] for e in await service.events(headers["X-Turn-Id"]) if e["type"] == "background.result"}
    assert "task model down" in results["title"]["error"]
    # the title falls back to the first user message; tags have none
    assert view["title"].startswith("How do I bake sourdough bread?")
    assert results["tags"]["result"] is None and results["tags"]["error"]
    assert "tags" not in view


async def test_a_non_streaming_answer_does_not_wait_for_the_background_tasks(service: Service) -> None:
    up = service.upstream
    up.enqueue(Reply(text="quick answer"))
    up.task_replies.append(("title", Reply(text='{"title": "Slow Title"}', pause_after=0)))
    status, data, headers = await service.post("/v1/chat/completions", body(chat_id="c4"))
    # answered while the title task is still held by the upstream
    assert status == 200 and data["choices"][0]["message"]["content"] == "quick answer"
    assert "turnlog" not in data  # complete, not "running"
    await asyncio.wait_for(up.paused.wait(), 5)
    assert (await service.turn(headers["X-Turn-Id"]))["state"] == "background"
    up.release()
    view = await service.wait_status(headers["X-Turn-Id"], "completed")
    assert view["title"] == "Slow Title"


async def test_websocket_clients_get_the_results_as_events(service: Service) -> None:
    service.upstream.enqueue(Reply(text="ws answer"))
    async with service.http.ws_connect(service.v1 + "/ws") as ws:
        await ws.send_json({"type": "chat", "request": body(chat_id="c5")})
        messages = []
        async for msg in ws:
            data = json.loads(msg.data)
            messages.append(data)
            if data["type"] == "event" and data["event"]["type"] == "turn.completed":
                break
    results = [m["event"]["data"]["task"] for m in messages if m["type"] == "event" and m["event"]["type"] == "background.result"]
    assert results == ["title", "tags", "follow_ups"]


async def test_sse_messages_parse_for_openai_clients(service: Service) -> None:
    # Everything before [DONE] is a chat.completion.chunk (OpenAI clients stop there).
    service.upstream.enqueue(Reply(text="fine"))
    async with service.http.post(service.v1 + "/chat/completions", json=body(stream=True, chat_id="c6")) as resp:
        raw = await resp.text()
    before = raw[: raw.index("data: [DONE]")]
    for _, data in sse_messages(before):
        assert json.loads(data)["object"] == "chat.completion.chunk"
