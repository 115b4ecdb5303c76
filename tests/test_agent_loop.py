"""The native tool-calling agent loop over Chat Completions, with real tool modules."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageFunctionToolCall, ChatCompletionMessageParam

from tests.harness import Service, make_settings, sse_messages, sse_text, start_service, stop_service
from tests.oracle import check_completion_against_turn, check_stream_against_log, read_stream
from tests.tools_fixtures import write_tools
from tests.upstream import Reply, ScriptedUpstream

USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the weather?"}]


def call(name: str, arguments: object, id: str | None = None) -> dict:
    out: dict = {"name": name, "arguments": arguments}
    if id:
        out["id"] = id
    return out


def tool_reply(*calls: dict, text: str = "") -> Reply:
    return Reply(text=text, tool_calls=list(calls), finish_reason="tool_calls")


@pytest.fixture
async def agent(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Service]:
    monkeypatch.setenv("TURNLOG_TEST_TOOL_LOG", str(tmp_path / "tool.log"))
    tools = write_tools(tmp_path / "tools")
    svc = await start_service(make_settings(tmp_path, upstream.url, tools_dir=str(tools), tool_timeout=1.0, database_url=database_url), upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


async def run(service: Service, **extra: object) -> tuple[str, dict]:
    body = {"model": "gpt-test", "messages": USER, "tool_ids": ["weather"], **extra}
    status, data, headers = await service.post("/v1/chat/completions", body)
    assert status == 200, data
    return headers["X-Turn-Id"], data


async def check_replay(service: Service, turn_id: str, *, body: dict | None = None, raw: str | None = None) -> dict:
    """Replay equals live: the non-streaming answer ``body`` (built from the
    actor's own view) and the live SSE body ``raw`` against the fold of the log
    (every prefix for a stream); a client following the finished turn too."""
    view = await service.turn(turn_id)
    if body is not None:
        check_completion_against_turn(body, view)
    if raw is not None:
        await check_stream_against_log(service, turn_id, raw)
    await check_stream_against_log(service, turn_id, await read_stream(service, turn_id))
    return view


async def test_two_parallel_calls_run_concurrently_and_are_fed_back(agent: Service) -> None:
    up = agent.upstream
    up.enqueue(
        tool_reply(call("get_weather", {"city": "Paris"}, "call_p"), call("get_weather", {"city": "Oslo"}, "call_o")),
        Reply(text="Paris is sunny, Oslo too."),
    )
    # Each lookup returns only once the other one has started (a barrier in the
    # tool module): both complete only if they ran concurrently.
    turn_id, body = await run(agent)
    assert body["choices"][0]["message"]["content"] == "Paris is sunny, Oslo too."
    second = up.requests[1]["messages"]
    ran = [m["content"] for m in second[2:]]
    assert not any("ran alone" in str(r) for r in ran), f"the two calls did not run concurrently: {ran}"
    assert second[0] == USER[0]
    assert second[1]["role"] == "assistant" and [c["id"] for c in second[1]["tool_calls"]] == ["call_p", "call_o"]
    assert [(m["role"], m["tool_call_id"], m["content"]) for m in second[2:]] == [
        ("tool", "call_p", "Paris: sunny, 21C"),
        ("tool", "call_o", "Oslo: sunny, 21C"),
    ]
    # the tools were offered to the model, reserved parameters hidden
    offered = {t["function"]["name"]: t["function"] for t in up.requests[0]["tools"]}
    assert set(offered) >= {"get_weather", "add", "explode"}
    assert list(offered["get_weather"]["parameters"]["properties"]) == ["city"]
    view = await check_replay(agent, turn_id, body=body)
    types = [i["type"] for i in view["output"]]
    assert types == ["function_call", "function_call", "function_call_output", "function_call_output", "message"]
    assert all(i["status"] == "completed" for i in view["output"])
    events = [e["type"] for e in await agent.events(turn_id)]
    assert events.index("tools.batch") < events.index("tool.started") < events.index("tool.completed") < events.index("context.reinjected")
    # the tool's __event_emitter__ status lines are on the log
    tool_events = [e for e in await agent.events(turn_id) if e["type"] == "tool.event"]
    assert {e["data"]["event"]["data"]["description"] for e in tool_events} == {"looking up Paris", "looking up Oslo"}


async def test_glued_json_arguments_become_separate_calls(agent: Service) -> None:
    agent.upstream.enqueue(tool_reply(call("add", '{"a": 1, "b": 2}{"a": 3, "b": 4}')), Reply(text="3 and 7"))
    turn_id, body = await run(agent)
    outputs = [i["output"] for i in (await agent.turn(turn_id))["output"] if i["type"] == "function_call_output"]
    assert outputs == ["3", "7"]
    calls = [i for i in (await agent.turn(turn_id))["output"] if i["type"] == "function_call"]
    assert len(calls) == 2 and len({c["call_id"] for c in calls}) == 2  # the glued call is replaced, not kept
    await check_replay(agent, turn_id, body=body)


async def test_python_literal_unknown_tool_raising_tool_and_bad_json(agent: Service) -> None:
    agent.upstream.enqueue(
        tool_reply(
            call("add", "{'a': 2, 'b': 5, 'junk': True}", "c1"),
            call("teleport", {"to": "moon"}, "c2"),
            call("explode", {"reason": "test"}, "c3"),
            call("add", '{"a": 1,', "c4"),
        ),
        Reply(text="done"),
    )
    turn_id, body = await run(agent)
    view = await agent.turn(turn_id)
    out = {i["call_id"]: i for i in view["output"] if i["type"] == "function_call_output"}
    assert out["c1"]["output"] == "7" and out["c1"]["status"] == "completed"
    assert out["c2"]["output"] == 'Error: Tool "teleport" not found.' and out["c2"]["status"] == "failed"
    assert "kaboom: test" in out["c3"]["output"] and out["c3"]["status"] == "failed"
    assert "could not be parsed" in out["c4"]["output"]
    # what is replayed to the model is what ran: the filtered arguments
    sent = agent.upstream.requests[1]["messages"][1]["tool_calls"]
    args = {c["id"]: json.loads(c["function"]["arguments"]) for c in sent}
    assert args["c1"] == {"a": 2, "b": 5}
    assert args["c4"] == {}
    await check_replay(agent, turn_id, body=body)


async def test_tool_timeout_is_an_error_result(agent: Service) -> None:
    agent.upstream.enqueue(tool_reply(call("slow", {"seconds": 5}, "s1")), Reply(text="ok"))
    started = time.monotonic()
    turn_id, body = await run(agent)
    assert time.monotonic() - started < 3
    out = [i for i in (await agent.turn(turn_id))["output"] if i["type"] == "function_call_output"][0]
    assert out["status"] == "failed" and "did not finish within 1 seconds" in out["output"]


async def test_iteration_cap_finalizes_instead_of_looping(agent: Service) -> None:
    for _ in range(5):
        agent.upstream.enqueue(tool_reply(call("add", {"a": 1, "b": 1})))
    agent.upstream.enqueue(Reply(text="never reached"))
    async with agent.http.post(
        agent.v1 + "/chat/completions",
        json={"model": "gpt-test", "messages": USER, "tool_ids": ["weather"], "stream": True, "params": {"max_tool_call_iterations": 2}},
    ) as resp:
        raw = await resp.text()
        turn_id = resp.headers["X-Turn-Id"]
    assert len(agent.upstream.requests) == 3  # cap N => at most N+1 model calls
    events = await agent.events(turn_id)
    limit = [e for e in events if e["type"] == "turn.iteration_limit"]
    assert limit and limit[0]["data"]["message"] == "Tool-call limit reached (2 iterations)."
    view = await check_replay(agent, turn_id, raw=raw)
    assert view["status"] == "completed"
    assert "Tool-call limit reached" in raw and raw.rstrip().endswith("[DONE]")
    unanswered = [i for i in view["output"] if i["type"] == "function_call"][-1]
    assert unanswered["status"] == "incomplete"  # interrupted, not pretended complete


async def test_empty_tool_calls_with_finish_reason_tool_calls_ends_the_loop(agent: Service) -> None:
    agent.upstream.enqueue(Reply(text="nothing to call", finish_reason="tool_calls"))
    turn_id, body = await run(agent)
    assert body["choices"][0]["message"]["content"] == "nothing to call"
    assert len(agent.upstream.requests) == 1
    assert (await agent.turn(turn_id))["status"] == "completed"


async def test_streaming_client_sees_tool_progress_and_the_answer(agent: Service) -> None:
    agent.upstream.enqueue(tool_reply(call("add", {"a": 2, "b": 2}, "cx"), text="Let me add. "), Reply(text="It is 4."))
    async with agent.http.post(agent.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "tool_ids": ["weather"], "stream": True}) as resp:
        raw = await resp.text()
        turn_id = resp.headers["X-Turn-Id"]
    assert sse_text(raw) == "Let me add. It is 4."
    await check_replay(agent, turn_id, raw=raw)
    items = [json.loads(d)["turnlog"]["item"] for _, d in sse_messages(raw) if '"turnlog":{"item"' in d]
    statuses = [(i["type"], i.get("status")) for i in items]
    assert ("function_call", "in_progress") in statuses
    assert ("function_call_output", "completed") in statuses
    # each item is sent once per change, never twice in the same state (Open WebUI
    # emits every output_item.done of a round twice)
    by_id: dict[str, list[dict]] = {}
    for item in items:
        by_id.setdefault(item["id"], []).append(item)
    assert all(a != b for snaps in by_id.values() for a, b in zip(snaps, snaps[1:]))
    assert '"tool_calls"' not in raw  # server tools are not forwarded as OpenAI tool_calls
    # a reconnecting client gets the same bytes
    async with agent.http.get(f"{agent.v1}/turns/{turn_id}/stream") as again:
        assert await again.text() == raw


async def test_client_tools_end_the_turn_with_tool_calls(agent: Service) -> None:
    weather_tool: ChatCompletionFunctionToolParam = {
        "type": "function",
        "function": {"name": "client_lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
    }
    agent.upstream.enqueue(
        tool_reply(call("client_lookup", {"q": "x"}, "cl1"), call("add", {"a": 1, "b": 2}, "sv1")),
        Reply(text="Thanks, the client said 42."),
    )
    sdk = openai.AsyncOpenAI(base_url=agent.v1, api_key="x", max_retries=0)
    first = await sdk.chat.completions.create(model="gpt-test", messages=USER, tools=[weather_tool], extra_body={"tool_ids": ["weather"], "chat_id": "chat-ct"})
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [(c.id, c.function.name) for c in choice.message.tool_calls or [] if isinstance(c, ChatCompletionMessageFunctionToolCall)] == [
        ("cl1", "client_lookup")
    ]
    # the server tool ran first and its result is kept in the chat's history
    status, chat = await agent.get("/v1/chats/chat-ct")
    assert any(i.get("type") == "function_call_output" and i["output"] == "3" for m in chat["messages"] for i in m.get("output") or [])
    second = await sdk.chat.completions.create(
        model="gpt-test",
        messages=[{"role": "tool", "tool_call_id": "cl1", "content": "42"}],
        tools=[weather_tool],
        extra_body={"chat_id": "chat-ct", "tool_ids": ["weather"]},
    )
    assert second.choices[0].message.content == "Thanks, the client said 42."
    sent = agent.upstream.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in sent[1]["tool_calls"]] == ["cl1", "sv1"]
    assert sent[2]["tool_call_id"] == "sv1" and sent[2]["content"] == "3"
    assert sent[-1] == {"role": "tool", "tool_call_id": "cl1", "content": "42"}
    await sdk.close()


async def test_direct_tools_run_over_the_websocket(agent: Service) -> None:
    direct = [
        {"type": "function", "function": {"name": "browser_time", "description": "the browser's clock", "parameters": {"type": "object", "properties": {}}}}
    ]
    agent.upstream.enqueue(tool_reply(call("browser_time", {}, "d1")), Reply(text="It is noon."))
    async with agent.http.ws_connect(agent.v1 + "/ws") as ws:
        await ws.send_json({"type": "chat", "request": {"model": "gpt-test", "messages": USER, "direct_tools": direct}})
        turn_id = (await ws.receive_json())["turn_id"]
        while True:
            msg = await ws.receive_json()
            if msg["type"] == "execute:tool":
                assert msg["name"] == "browser_time" and msg["call_id"] == "d1"
                await ws.send_json({"type": "tool_result", "turn_id": turn_id, "call_id": "d1", "result": "12:00"})
            if msg["type"] == "event" and msg["event"]["type"] == "turn.completed":
                break
    view = await agent.turn(turn_id)
    out = [i for i in view["output"] if i["type"] == "function_call_output"][0]
    assert out["output"] == "12:00" and view["content"] == "It is noon."


async def test_direct_tool_without_a_client_is_an_error_result(agent: Service) -> None:
    direct = [{"name": "browser_time", "parameters": {"type": "object", "properties": {}}}]
    agent.upstream.enqueue(tool_reply(call("browser_time", {}, "d2")), Reply(text="no clock"))
    turn_id, body = await run(agent, direct_tools=direct)
    out = [i for i in (await agent.turn(turn_id))["output"] if i["type"] == "function_call_output"][0]
    assert out["status"] == "failed" and "no client is connected" in out["output"]


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "add"}}, "required"])
async def test_a_forced_tool_choice_holds_for_the_first_call_only(agent: Service, choice: object) -> None:
    """Forced on every call, the model would call a tool each round until the
    round cap; after the first round it is left out (OpenAI's default: ``auto``)."""
    up = agent.upstream
    up.enqueue(tool_reply(call("add", {"a": 1, "b": 2}, "f1")), Reply(text="It is 3."))
    turn_id, body = await run(agent, tool_choice=choice)
    assert choice == up.requests[0]["tool_choice"] and "tool_choice" not in up.requests[1]
    assert up.requests[1]["tools"] == up.requests[0]["tools"]  # the model may still call one
    assert body["choices"][0]["message"]["content"] == "It is 3."
    view = await check_replay(agent, turn_id, body=body)
    assert view["status"] == "completed"
    assert [i["output"] for i in view["output"] if i["type"] == "function_call_output"] == ["3"]


async def test_three_iterations_replay_exactly(agent: Service) -> None:
    agent.upstream.enqueue(
        tool_reply(call("add", {"a": 1, "b": 1}, "i1"), text="one "),
        tool_reply(call("add", {"a": 2, "b": 2}, "i2"), text="two "),
        tool_reply(call("search", {"q": "x"}, "i3"), text="three "),
        Reply(text="done"),
    )
    turn_id, body = await run(agent)
    assert body["choices"][0]["message"]["content"] == "one two three done"
    view = await check_replay(agent, turn_id, body=body)
    assert [i["type"] for i in view["output"]].count("function_call_output") == 3
    for upto in (5, 12, 20):
        status, partial = await agent.get(f"/v1/turns/{turn_id}/replay?upto={upto}")
        assert status == 200 and partial["seq"] == upto


async def test_large_base64_tool_events_are_stored_as_blobs(agent: Service) -> None:
    agent.upstream.enqueue(tool_reply(call("render_chart", {}, "ch1")), Reply(text="Here it is."))
    async with agent.http.ws_connect(agent.v1 + "/ws") as ws:
        await ws.send_json({"type": "chat", "request": {"model": "gpt-test", "messages": USER, "tool_ids": ["weather"]}})
        turn_id = (await ws.receive_json())["turn_id"]
        frames = []
        while True:
            msg = await ws.receive()
            frames.append(msg.data)
            data = json.loads(msg.data)
            if data["type"] == "event" and data["event"]["type"] == "turn.completed":
                break
    assert all(len(f) < 20_000 for f in frames), "no base64 payload pushed inline to clients"
    event = [e for e in await agent.events(turn_id) if e["type"] == "tool.event"][0]
    ref = event["data"]["event"]["data"]["files"][0]["url"]
    assert ref["mime"] == "image/png" and ref["url"].startswith("/v1/blobs/")
    async with agent.http.get(agent.url + ref["url"]) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"] == "image/png"
        assert (await resp.read()).startswith(b"\x89PNG")


async def test_image_results_go_to_the_model_as_a_user_image_message(agent: Service) -> None:
    agent.upstream.enqueue(tool_reply(call("snapshot", {}, "img1")), Reply(text="I see a tiny PNG."))
    turn_id, _ = await run(agent)
    sent = agent.upstream.requests[1]["messages"]
    assert sent[2] == {"role": "tool", "tool_call_id": "img1", "content": "snapshot: Image file read successfully."}
    images = sent[3]
    assert images["role"] == "user"
    assert {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}} in images["content"]
    out = [i for i in (await agent.turn(turn_id))["output"] if i["type"] == "function_call_output"][0]
    assert out["images"] == ["data:image/png;base64,iVBORw0KGgo="]


async def test_direct_tool_that_never_answers_times_out(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    svc = await start_service(make_settings(tmp_path, upstream.url, direct_tool_timeout=0.3), upstream)
    try:
        direct = [{"name": "browser_time", "parameters": {"type": "object", "properties": {}}}]
        upstream.enqueue(tool_reply(call("browser_time", {}, "d9")), Reply(text="no answer"))
        async with svc.http.ws_connect(svc.v1 + "/ws") as ws:
            await ws.send_json({"type": "chat", "request": {"model": "gpt-test", "messages": USER, "direct_tools": direct}})
            turn_id = (await ws.receive_json())["turn_id"]
            while True:  # receives execute:tool, never answers
                msg = await ws.receive_json()
                if msg["type"] == "event" and msg["event"]["type"] == "turn.completed":
                    break
        out = [i for i in (await svc.turn(turn_id))["output"] if i["type"] == "function_call_output"][0]
        assert out["status"] == "failed" and "did not answer" in out["output"]
    finally:
        await stop_service(svc)


async def test_legacy_prompt_based_tools(agent: Service) -> None:
    # the task model picks the tool (non-native mode), its result becomes context
    agent.upstream.enqueue(
        Reply(text='Sure: {"tool_calls": [{"name": "add", "parameters": {"a": 20, "b": 22, "x": 1}}]}'),
        Reply(text="The sum is 42 [1]."),
    )
    turn_id, body = await run(agent, params={"function_calling": "default"})
    assert body["choices"][0]["message"]["content"] == "The sum is 42 [1]."
    selection, main = agent.upstream.requests
    assert "add" in selection["messages"][0]["content"] and selection["messages"][1]["content"].startswith("Query:")
    assert "tools" not in main  # no native tools in legacy mode
    assert '<source id="1" name="weather/add">42</source>' in main["messages"][-1]["content"]
    step = [e for e in await agent.events(turn_id) if e["type"] == "assembly.step"][0]
    assert step["data"]["detail"]["calls"] == [{"name": "add", "arguments": {"a": 20, "b": 22}, "output": "42", "status": "completed"}]


async def test_legacy_empty_tool_calls_means_no_tools(agent: Service) -> None:
    agent.upstream.enqueue(Reply(text='{"tool_calls": []}'), Reply(text="No tools needed."))
    turn_id, body = await run(agent, params={"function_calling": "default"})
    assert body["choices"][0]["message"]["content"] == "No tools needed."
    step = [e for e in await agent.events(turn_id) if e["type"] == "assembly.step"][0]
    assert step["data"]["detail"]["calls"] == []  # never a call named None


async def test_legacy_selection_without_json_answers_without_tools_and_warns(agent: Service) -> None:
    # A small model answers the selection prompt with prose, not the JSON asked for.
    agent.upstream.enqueue(Reply(text="You should check the weather in Paris, it is nice."), Reply(text="Hello."))
    turn_id, body = await run(agent, params={"function_calling": "default"})
    assert body["choices"][0]["message"]["content"] == "Hello."
    warning = "tools were not used: the model's tool selection held no JSON object"
    assert body["turnlog"]["warnings"] == [warning]
    assert (await agent.turn(turn_id))["warnings"] == [warning]
    step = [e for e in await agent.events(turn_id) if e["type"] == "assembly.step"][0]
    assert step["data"]["detail"]["calls"] == [] and "<source" not in agent.upstream.requests[1]["messages"][-1]["content"]


async def test_a_streaming_client_sees_the_calls_a_cancel_left_incomplete(agent: Service) -> None:
    agent.upstream.enqueue(tool_reply(call("slow", {"seconds": 30}, "sl1")))
    async with agent.http.post(agent.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "tool_ids": ["weather"], "stream": True}) as resp:
        turn_id = resp.headers["X-Turn-Id"]
        deadline = time.monotonic() + 10
        while "tool.started" not in [e["type"] for e in await agent.events(turn_id)]:
            assert time.monotonic() < deadline, "the tool never started"
            await asyncio.sleep(0.01)
        status, _, _ = await agent.post(f"/v1/turns/{turn_id}/cancel")
        assert status == 202
        raw = await resp.text()
    await check_replay(agent, turn_id, raw=raw)


async def test_calls_finishing_out_of_call_order_replay_and_verify(agent: Service, tmp_path: Path) -> None:
    # The output items and the re-injected messages follow the order the calls
    # finished in; verify's re-run must reproduce that order, not call order.
    from tests.harness import verify_all_turns

    agent.upstream.enqueue(tool_reply(call("first", {}, "c_first"), call("second", {}, "c_second")), Reply(text="Both done."))
    turn_id, body = await run(agent, tool_ids=["order"])
    assert body["choices"][0]["message"]["content"] == "Both done."
    outputs = [i["call_id"] for i in (await agent.turn(turn_id))["output"] if i["type"] == "function_call_output"]
    assert outputs == ["c_second", "c_first"], "results in the order they finished"
    second = agent.upstream.requests[1]["messages"]
    assert [m.get("tool_call_id") for m in second if m["role"] == "tool"] == ["c_second", "c_first"]
    assert await verify_all_turns(agent, tmp_path / "verify") == 1


async def test_provider_call_ids_repeated_every_round_get_turn_unique_ids(agent: Service) -> None:
    # A provider that numbers its calls per response (call_0 every round).
    agent.upstream.enqueue(
        tool_reply(call("add", {"a": 1, "b": 2}, "call_0")),
        tool_reply(call("add", {"a": 3, "b": 4}, "call_0")),
        Reply(text="3 then 7"),
    )
    turn_id, body = await run(agent)
    assert body["choices"][0]["message"]["content"] == "3 then 7"
    # The last request carries both rounds, each call answered by its own result.
    sent = agent.upstream.requests[2]["messages"]
    ids = [c["id"] for m in sent if m.get("tool_calls") for c in m["tool_calls"]]
    results = [(m["tool_call_id"], m["content"]) for m in sent if m["role"] == "tool"]
    assert len(ids) == 2 and ids[0] == "call_0" and ids[1] != "call_0"
    assert results == [(ids[0], "3"), (ids[1], "7")]
    view = await check_replay(agent, turn_id, body=body)
    calls = [i for i in view["output"] if i["type"] == "function_call"]
    outputs = [(i["call_id"], i["output"]) for i in view["output"] if i["type"] == "function_call_output"]
    assert [c["call_id"] for c in calls] == ids
    assert calls[1]["provider_call_id"] == "call_0"
    assert outputs == [(ids[0], "3"), (ids[1], "7")]


async def test_a_log_with_one_call_id_in_two_rounds_still_replays(agent: Service, tmp_path: Path) -> None:
    """A log written before call ids were made turn-unique (call_0 in both
    rounds) still verifies, and the next turn's history keeps both rounds."""
    from adapters.cli import scratch_store
    from engine.events import Event
    from engine.fold.chat import answer_of
    from engine.fold.turn_view import fold
    from engine.run.verify import verify_turn

    agent.upstream.enqueue(
        tool_reply(call("add", {"a": 1, "b": 2}, "call_0")),
        tool_reply(call("add", {"a": 3, "b": 4}, "call_0")),
        Reply(text="3 then 7"),
    )
    turn_id, _ = await run(agent)
    events = await agent.services.store.read(turn_id)
    new_id = next(e.data["item"]["call_id"] for e in events if e.type == "model.item" and e.data["item"].get("provider_call_id"))
    # What the same turn logged before: the provider's id in both rounds.
    old = []
    for e in events:
        data = json.loads(json.dumps(e.data).replace(new_id, "call_0"))
        if e.type == "model.item":
            data["item"].pop("provider_call_id", None)
        old.append(Event(turn_id=e.turn_id, seq=e.seq, type=e.type, at=e.at, data=data))
    assert [e.data["item"]["call_id"] for e in old if e.type == "model.item" and e.data["item"]["status"] != "in_progress"] == ["call_0", "call_0"]
    (tmp_path / "scratch").mkdir()
    scratch = await scratch_store(str(tmp_path / "scratch"))
    try:
        result = await verify_turn(old, scratch)
    finally:
        await scratch.close()
    assert result.ok, "\n".join(result.diff)
    answer = answer_of(fold(turn_id, old))
    assert answer is not None
    messages: list[dict[str, Any]] = list(answer.messages)
    rounds = [(m["tool_calls"][0]["id"], json.loads(m["tool_calls"][0]["function"]["arguments"])) for m in messages if m.get("tool_calls")]
    results = [(m["tool_call_id"], m["content"]) for m in messages if m["role"] == "tool"]
    assert rounds == [("call_0", {"a": 1, "b": 2}), ("call_0_2", {"a": 3, "b": 4})]
    assert results == [("call_0", "3"), ("call_0_2", "7")]


async def test_a_call_without_a_name_is_dropped_with_a_recorded_warning(agent: Service) -> None:
    # A stray fragment at its own index that never names a function.
    agent.upstream.enqueue(
        tool_reply(call("add", {"a": 1, "b": 2}, "c_add"), call("", '{"a": 5}', "c_stray")),
        Reply(text="3"),
    )
    turn_id, body = await run(agent)
    # The next request is one a strict upstream takes (it rejects an empty function name).
    assert body["choices"][0]["message"]["content"] == "3"
    sent = agent.upstream.requests[1]["messages"]
    assert [c["id"] for m in sent if m.get("tool_calls") for c in m["tool_calls"]] == ["c_add"]
    view = await check_replay(agent, turn_id, body=body)
    assert [i["call_id"] for i in view["output"] if i["type"] == "function_call"] == ["c_add"]
    warnings = [e["data"] for e in await agent.events(turn_id) if e["type"] == "model.warning"]
    assert len(warnings) == 1 and "without a function name" in warnings[0]["message"] and "c_stray" in warnings[0]["message"]
    assert warnings[0]["raw"] == '{"a": 5}'


async def test_prompt_based_tool_results_go_to_the_last_user_message_when_it_has_an_image(agent: Service) -> None:
    pixel = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    messages = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": [{"type": "text", "text": "Add 20 and 22."}, {"type": "image_url", "image_url": {"url": pixel}}]},
    ]
    agent.upstream.enqueue(
        Reply(text='{"tool_calls": [{"name": "add", "parameters": {"a": 20, "b": 22}}]}'),
        Reply(text="42 [1]."),
    )
    _, body = await run(agent, messages=messages, params={"function_calling": "default"})
    assert body["choices"][0]["message"]["content"] == "42 [1]."
    sent = agent.upstream.requests[-1]["messages"]
    assert [m["content"] for m in sent if m["role"] == "user"][0] == "Hello"  # the earlier message is left alone
    last = sent[-1]
    assert last["role"] == "user" and isinstance(last["content"], list)
    texts = [p["text"] for p in last["content"] if p["type"] == "text"]
    assert len(texts) == 1 and '<source id="1" name="weather/add">42</source>' in texts[0] and texts[0].endswith("Add 20 and 22.")
    assert [p["image_url"]["url"] for p in last["content"] if p["type"] == "image_url"] == [pixel]


OUTLET_RECORDER = """
import json


class Filter:
    def outlet(self, body):
        # The answer becomes what the filter was shown: every message's content.
        body["messages"][-1]["content"] = json.dumps([[m["role"], m["content"]] for m in body["messages"]])
        return body
"""


async def test_outlet_filters_and_title_prompts_see_text_between_tool_rounds_once(
    tmp_path: Path, upstream: ScriptedUpstream, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNLOG_TEST_TOOL_LOG", str(tmp_path / "tool.log"))
    filters = tmp_path / "filters"
    filters.mkdir()
    (filters / "recorder.py").write_text(OUTLET_RECORDER)
    settings = make_settings(tmp_path, upstream.url, tools_dir=str(write_tools(tmp_path / "tools")), filters_dir=str(filters), database_url=database_url)
    svc = await start_service(settings, upstream)
    try:
        upstream.enqueue(tool_reply(call("add", {"a": 1, "b": 2}, "c1"), text="Let me add. "), Reply(text="It is 3."))
        turn_id, body = await run(svc, chat_id="rounds")
        seen = json.loads(body["choices"][0]["message"]["content"])
        assert seen == [["user", USER[0]["content"]], ["assistant", "Let me add. It is 3."]]
        await svc.wait_status(turn_id, "completed")  # the answer comes back before its background tasks run
        titles = [r["messages"][-1]["content"] for r in upstream.task_requests if "title" in r["messages"][-1]["content"].lower()]
        assert titles and all(t.count("Let me add.") == 1 for t in titles)
    finally:
        await stop_service(svc)


async def test_a_large_image_result_is_a_blob_in_the_log_and_inline_for_the_model(agent: Service) -> None:
    agent.upstream.enqueue(tool_reply(call("photo", {}, "ph1")), Reply(text="A photo."), Reply(text="Still a photo."))
    turn_id, body = await run(agent, chat_id="photos")
    # The model got the image itself.
    sent = agent.upstream.requests[1]["messages"]
    images = [p["image_url"]["url"] for p in sent[3]["content"] if p["type"] == "image_url"]
    assert sent[3]["role"] == "user" and len(images) == 1
    assert images[0].startswith("data:image/png;base64,") and len(images[0]) > 100_000
    # The log and the clients have a reference to it.
    completed = [e for e in await agent.events(turn_id) if e["type"] == "tool.completed"][0]
    (url,) = completed["data"]["images"]
    assert url.startswith("/v1/blobs/")
    async with agent.http.get(agent.url + url) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"] == "image/png"
        assert "data:image/png;base64," + base64.b64encode(await resp.read()).decode() == images[0]
    assert all(len(json.dumps(e)) < 20_000 for e in await agent.events(turn_id)), "no base64 image inline in the log"
    await agent.wait_status(turn_id, "completed")  # its background tasks (a title: it has a chat) have ended
    view = await check_replay(agent, turn_id, body=body)
    assert [i["images"] for i in view["output"] if i["type"] == "function_call_output"] == [[url]]
    # The chat's next turn shows the model the image again.
    status, _, _ = await agent.post("/v1/chat/completions", {"model": "gpt-test", "chat_id": "photos", "messages": [{"role": "user", "content": "And?"}]})
    assert status == 200
    again = [
        p["image_url"]["url"]
        for m in agent.upstream.requests[2]["messages"]
        if isinstance(m["content"], list)
        for p in m["content"]
        if p["type"] == "image_url"
    ]
    assert again == images


async def test_a_turn_a_bug_ended_is_recorded_and_verifies(agent: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model call that dies of a bug (not an upstream error) ends the turn
    ``internal_error``; verify re-runs it to the same ``turn.failed``."""

    async def broken(body: dict) -> AsyncIterator[list]:
        raise RuntimeError("boom")
        yield []  # an async generator, as the port's

    provider = agent.services.providers["openai"]
    # stream_runs is what the live model client reads; stream_batches too, so
    # that no path reaches the upstream past the bug.
    for name in ("stream_batches", "stream_runs"):
        monkeypatch.setattr(provider, name, broken)
    status, data, headers = await agent.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
    assert status >= 500 and status != 500, data
    failed = [e for e in await agent.events(headers["X-Turn-Id"]) if e["type"] == "turn.failed"]
    assert [e["data"]["error"]["type"] for e in failed] == ["internal_error"]
    assert "boom" in failed[0]["data"]["error"]["message"]
    # stop_service verifies every turn of the service
