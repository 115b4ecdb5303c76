"""``/v1/responses`` driven by the official openai SDK's ``client.responses``
(and the OpenAI Agents SDK), against the scripted upstream speaking Chat
Completions or Ollama. The oracles are what the upstream was scripted to say
and was asked (its recorded requests), and the fold of the turn's log
(``GET /v1/turns/{id}``), never the code under test."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseInputMessageItem,
    ResponseInputParam,
    ResponseInputText,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseStreamEvent,
)

from tests.harness import Service, make_settings, start_service, stop_service
from tests.upstream import Reply, ScriptedUpstream


def aclient(service: Service) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=service.v1, api_key="unused", max_retries=0)


def sclient(service: Service) -> openai.OpenAI:
    return openai.OpenAI(base_url=service.v1, api_key="unused", max_retries=0)


def turn_of(response_id: str) -> str:
    assert response_id.startswith("resp_")
    return response_id[len("resp_") :]


async def verified(service: Service, response_id: str) -> dict[str, Any]:
    """The turn behind a response, after ``GET /v1/turns/{id}/verify`` said ok."""
    turn_id = turn_of(response_id)
    status, result = await service.get(f"/v1/turns/{turn_id}/verify")
    assert status == 200 and result["ok"], result
    return await service.turn(turn_id)


def completed(events: list[ResponseStreamEvent]) -> Response:
    """The response of a stream that ended ``response.completed``."""
    last = events[-1]
    assert isinstance(last, ResponseCompletedEvent), last
    return last.response


def message_text(item: object) -> str:
    """The first text part of a message item (input or output)."""
    assert isinstance(item, ResponseInputMessageItem | ResponseOutputMessage), item
    part = item.content[0]
    assert isinstance(part, ResponseInputText | ResponseOutputText), part
    return part.text


def check_sequence(events: list[Any], first: int = 0) -> None:
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(first, first + len(numbers))), numbers


async def test_streaming_then_retrieve(service: Service) -> None:
    chunks = ["Hel", "lo, ", "wor", "ld!"]
    service.upstream.enqueue(Reply(chunks=chunks, reasoning=["think", "ing"]))
    sdk = aclient(service)
    stream = await sdk.responses.create(model="gpt-test", input="hi", instructions="Be brief.", stream=True, metadata={"k": "v"})
    events = [event async for event in stream]
    check_sequence(events)
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert types.count("response.output_text.delta") == len(chunks)
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello, world!"
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "thinking"
    done_items = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.type for i in done_items] == ["reasoning", "message"]
    final = completed(events)
    assert final.status == "completed" and final.output_text == "Hello, world!"
    assert final.usage is not None and final.usage.output_tokens > 0
    assert final.metadata == {"k": "v"} and final.instructions == "Be brief."
    # instructions are the system message of this request only
    assert service.upstream.requests[-1]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    retrieved = await sdk.responses.retrieve(final.id)
    assert retrieved.model_dump() == final.model_dump()
    view = await verified(service, final.id)
    assert view["content"] == "Hello, world!" and view["status"] == "completed"


async def test_sync_client_not_streaming(service: Service) -> None:
    service.upstream.enqueue(Reply(text="The answer is 42."))

    def call() -> Any:
        return sclient(service).responses.create(
            model="gpt-test",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "question"}]}],
            temperature=0.5,
            max_output_tokens=50,
        )

    response = await asyncio.to_thread(call)
    assert response.status == "completed" and response.output_text == "The answer is 42."
    assert response.usage is not None and response.usage.total_tokens > 0
    sent = service.upstream.requests[-1]
    assert sent["messages"] == [{"role": "user", "content": "question"}]
    assert sent["temperature"] == 0.5 and sent["max_tokens"] == 50
    # nothing of the Responses bookkeeping reaches the upstream
    assert "responses" not in sent and "metadata" not in sent
    view = await verified(service, response.id)
    assert view["content"] == "The answer is 42."
    # the sync client's stream too
    service.upstream.enqueue(Reply(chunks=["a", "b"]))

    def stream() -> list[Any]:
        with sclient(service).responses.create(model="gpt-test", input="x", stream=True) as events:
            return list(events)

    events = await asyncio.to_thread(stream)
    check_sequence(events)
    assert events[-1].response.output_text == "ab"


async def test_background_retrieve_and_resumed_stream(service: Service) -> None:
    service.upstream.enqueue(Reply(text="one two three four five six", chunk_size=3, pause_after=3))
    sdk = aclient(service)
    started = await sdk.responses.create(model="gpt-test", input="count", background=True)
    assert started.status in ("queued", "in_progress") and started.background
    await asyncio.wait_for(service.upstream.paused.wait(), 10)
    running = await sdk.responses.retrieve(started.id)
    assert running.status == "in_progress"
    # the output so far (the chunks not yet in the log included), however far it got
    assert "one two three four five six".startswith(running.output_text)
    with pytest.raises(openai.ConflictError, match="in progress"):
        await sdk.responses.create(model="gpt-test", input="next", previous_response_id=started.id)
    # A first reader takes a few events, then goes away.
    first: list[Any] = []
    stream = await sdk.responses.retrieve(started.id, stream=True)
    async for event in stream:
        first.append(event)
        if len(first) == 5:
            break
    await stream.close()
    check_sequence(first)
    service.upstream.release()
    # It resumes after the last sequence number it saw.
    rest = [e async for e in await sdk.responses.retrieve(started.id, stream=True, starting_after=first[-1].sequence_number)]
    check_sequence(rest, first=first[-1].sequence_number + 1)
    whole = [e async for e in await sdk.responses.retrieve(started.id, stream=True)]
    assert [e.model_dump() for e in first + rest] == [e.model_dump() for e in whole]
    text = "".join(e.delta for e in first + rest if e.type == "response.output_text.delta")
    assert text == "one two three four five six"
    assert rest[-1].type == "response.completed"
    view = await verified(service, started.id)
    assert view["content"] == text


async def test_function_tool_round_trip_and_continuation(service: Service) -> None:
    tool: Any = {  # as clients write it, without the "strict" the SDK type requires
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    service.upstream.enqueue(
        Reply(chunks=[], tool_calls=[{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call_1"}], finish_reason="tool_calls"),
        Reply(text="It is sunny in Paris."),
        Reply(text="You asked about Paris."),
    )
    sdk = aclient(service)
    live = [e async for e in await sdk.responses.create(model="gpt-test", input="Weather in Paris?", tools=[tool], stream=True)]
    check_sequence(live)
    assert [e.type for e in live if "function_call" in e.type] == [
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
    ]
    first = completed(live)
    # the same events, replayed from the log
    replayed = [e async for e in await sdk.responses.retrieve(first.id, stream=True)]
    assert [e.model_dump() for e in replayed] == [e.model_dump() for e in live]
    calls = [i for i in first.output if isinstance(i, ResponseFunctionToolCall)]
    assert len(calls) == 1 and calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Paris"}
    assert service.upstream.requests[-1]["tools"][0]["function"]["name"] == "get_weather"
    second = await sdk.responses.create(
        model="gpt-test",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}],
        tools=[tool],
    )
    assert second.output_text == "It is sunny in Paris." and second.previous_response_id == first.id
    sent = service.upstream.requests[-1]["messages"]
    assert sent[0] == {"role": "user", "content": "Weather in Paris?"}
    assert sent[1]["role"] == "assistant" and sent[1]["tool_calls"][0]["id"] == calls[0].call_id
    assert sent[2] == {"role": "tool", "tool_call_id": calls[0].call_id, "content": "sunny"}
    third = await sdk.responses.create(model="gpt-test", previous_response_id=second.id, input="What did I ask?")
    sent = service.upstream.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "assistant", "user"]
    assert sent[3]["content"] == "It is sunny in Paris." and sent[4]["content"] == "What did I ask?"
    assert third.output_text == "You asked about Paris."
    items = await sdk.responses.input_items.list(second.id)
    assert [i.type for i in items.data] == ["function_call_output"]
    for response in (first, second, third):
        view = await verified(service, response.id)
        assert view["chat_id"] == (await service.turn(turn_of(first.id)))["chat_id"]


@pytest.fixture
async def ollama_service(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> AsyncIterator[Service]:
    settings = make_settings(tmp_path, None, database_url=database_url, ollama_base_url=upstream.root)
    svc = await start_service(settings, upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


async def test_continuation_over_ollama(ollama_service: Service) -> None:
    service = ollama_service
    service.upstream.enqueue(Reply(text="Hi Ada."), Reply(text="Your name is Ada."))
    sdk = aclient(service)
    model = (await sdk.models.list()).data[0].id
    first = await sdk.responses.create(model=model, input="I am Ada.")
    second = await sdk.responses.create(model=model, input="Who am I?", previous_response_id=first.id, stream=True)
    events = [e async for e in second]
    assert completed(events).output_text == "Your name is Ada."
    sent = service.upstream.requests[-1]
    assert [(m["role"], m["content"]) for m in sent["messages"]] == [
        ("user", "I am Ada."),
        ("assistant", "Hi Ada."),
        ("user", "Who am I?"),
    ]
    await verified(service, first.id)
    await verified(service, completed(events).id)


async def test_cancel_keeps_the_partial_output(service: Service) -> None:
    service.upstream.enqueue(Reply(chunks=["partial ", "answer ", "never"], pause_after=2))
    sdk = aclient(service)
    started = await sdk.responses.create(model="gpt-test", input="go", background=True)
    await asyncio.wait_for(service.upstream.paused.wait(), 10)
    with pytest.raises(openai.ConflictError, match="cancel it"):
        await sdk.responses.delete(started.id)
    cancelled = await sdk.responses.cancel(started.id)
    assert cancelled.status == "cancelled"
    again = await sdk.responses.retrieve(started.id)
    assert again.status == "cancelled"
    view = await service.turn(turn_of(started.id))
    assert view["status"] == "cancelled"
    assert again.output_text == view["content"] and view["content"].startswith("partial")
    assert all(getattr(i, "status", None) == "incomplete" for i in again.output)
    # cancelling again returns it as it is
    assert (await sdk.responses.cancel(started.id)).status == "cancelled"
    service.upstream.release()


async def test_bad_input_is_a_4xx(service: Service) -> None:
    sdk = aclient(service)
    with pytest.raises(openai.BadRequestError, match="input"):
        await sdk.responses.create(model="gpt-test", input=[])
    with pytest.raises(openai.BadRequestError, match="tools"):
        await sdk.responses.create(model="gpt-test", input="x", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match="input\\[0\\].type"):
        unknown_item: Any = [{"type": "no_such_item"}]  # what the SDK's types would refuse
        await sdk.responses.create(model="gpt-test", input=unknown_item)
    with pytest.raises(openai.NotFoundError, match="Previous response"):
        await sdk.responses.create(model="gpt-test", input="x", previous_response_id="resp_turn_nope")
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.create(model="no-such-model", input="x")
    with pytest.raises(openai.BadRequestError, match="store"):
        await sdk.responses.create(model="gpt-test", input="x", background=True, store=False)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve("resp_turn_nope")
    status, body, _ = await service.post("/v1/responses", {"model": "gpt-test"})
    assert status == 400 and body["error"]["param"] == "input"
    async with service.http.post(service.v1 + "/responses", data=b"{not json", headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_json"
    service.upstream.enqueue(Reply(text="ok"))
    done = await sdk.responses.create(model="gpt-test", input="x")
    status, body = await service.get(f"/v1/responses/{done.id}?stream=true&starting_after=abc")
    assert status == 400 and body["error"]["param"] == "starting_after"
    # store: false is answered, and cannot be retrieved or continued
    service.upstream.enqueue(Reply(text="unstored"))
    unstored = await sdk.responses.create(model="gpt-test", input="x", store=False)
    assert unstored.output_text == "unstored"
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.create(model="gpt-test", input="x", previous_response_id=unstored.id)


async def test_openai_agents_sdk_with_a_function_tool(service: Service) -> None:
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    ran: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"rainy in {city}"

    service.upstream.enqueue(
        Reply(chunks=[], tool_calls=[{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "call_a"}], finish_reason="tool_calls"),
        Reply(text="It is rainy in Oslo."),
    )
    agent = Agent(
        name="weather",
        instructions="Answer about the weather.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model="gpt-test", openai_client=aclient(service)),
    )
    result = await Runner.run(agent, "Weather in Oslo?")
    assert ran == ["Oslo"]
    assert result.final_output == "It is rainy in Oslo."
    sent = service.upstream.requests[-1]["messages"]
    assert sent[0] == {"role": "system", "content": "Answer about the weather."}
    assert sent[-1] == {"role": "tool", "tool_call_id": "call_a", "content": "rainy in Oslo"}
    for response in result.raw_responses:
        assert response.response_id is not None
        await verified(service, response.response_id)
    # streamed, too
    service.upstream.enqueue(
        Reply(chunks=[], tool_calls=[{"name": "get_weather", "arguments": {"city": "Rome"}, "id": "call_b"}], finish_reason="tool_calls"),
        Reply(chunks=["Rainy ", "in Rome."]),
    )
    streamed = Runner.run_streamed(agent, "Weather in Rome?")
    deltas = [e.data.delta async for e in streamed.stream_events() if e.type == "raw_response_event" and e.data.type == "response.output_text.delta"]
    assert ran == ["Oslo", "Rome"] and deltas == ["Rainy ", "in Rome."]
    assert streamed.final_output == "Rainy in Rome."


async def test_delete_and_input_items(service: Service) -> None:
    service.upstream.enqueue(Reply(text="first answer"))
    sdk = aclient(service)
    items: ResponseInputParam = [
        {"role": "developer", "content": "Be terse."},
        {"role": "user", "content": "one"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "two"}]},
    ]
    response = await sdk.responses.create(model="gpt-test", input=items)
    listed = await sdk.responses.input_items.list(response.id, order="asc")
    assert [(i.type, getattr(i, "role", None), message_text(i)) for i in listed.data] == [
        ("message", "developer", "Be terse."),
        ("message", "user", "one"),
        ("message", "user", "two"),
    ]
    newest_first = await sdk.responses.input_items.list(response.id, limit=2)
    assert [message_text(i) for i in newest_first.data] == ["two", "one"] and newest_first.has_more
    last_id = (newest_first.model_extra or {}).get("last_id")
    assert last_id == newest_first.data[-1].id
    status, body = await service.get(f"/v1/responses/{response.id}/input_items?after={last_id}")
    assert status == 200 and [i["content"][0]["text"] for i in body["data"]] == ["Be terse."]
    status, body = await service.get(f"/v1/responses/{response.id}/input_items?order=sideways")
    assert status == 400 and body["error"]["param"] == "order"
    async with service.http.delete(f"{service.v1}/responses/{response.id}") as resp:
        assert resp.status == 200
        assert await resp.json() == {"id": response.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.input_items.list(response.id)
    with pytest.raises(openai.NotFoundError, match="Previous response"):
        await sdk.responses.create(model="gpt-test", input="more", previous_response_id=response.id)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.delete(response.id)
    # The turn's log is the audit record: still there, still verifying.
    view = await verified(service, response.id)
    assert view["content"] == "first answer"
    # A turn made over chat completions is no response.
    service.upstream.enqueue(Reply(text="chat"))
    _, chat, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": [{"role": "user", "content": "x"}]})
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve("resp_" + headers["X-Turn-Id"])


@pytest.fixture
async def responses_upstream_service(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> AsyncIterator[Service]:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "lookup.py").write_text('class Tools:\n    def lookup(self, key: str) -> str:\n        """Looks a key up."""\n        return "value of " + key\n')
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, openai_api_mode="responses", tools_dir=str(tools))
    svc = await start_service(settings, upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


async def test_reasoning_items_go_back_to_a_responses_upstream(responses_upstream_service: Service) -> None:
    service = responses_upstream_service
    service.upstream.enqueue(Reply(reasoning=["Let me think."], text="Hi Ada."), Reply(text="Ada."))
    sdk = aclient(service)
    first = await sdk.responses.create(model="gpt-test", input="I am Ada.")
    assert [i.type for i in first.output] == ["reasoning", "message"]
    reasoning = first.output[0]
    assert isinstance(reasoning, ResponseReasoningItem) and reasoning.content is not None
    assert reasoning.content[0].text == "Let me think."
    upstream_reasoning_id = service.upstream.responses[-1]["output"][0]["id"] if hasattr(service.upstream, "responses") else None
    second = await sdk.responses.create(model="gpt-test", input="Who am I?", previous_response_id=first.id)
    assert second.output_text == "Ada."
    sent = service.upstream.requests[-1]["input"]
    kinds = [(i.get("type") or "message", i.get("role")) for i in sent]
    # the upstream's own reasoning item, before the answer it led to
    assert kinds == [("message", "user"), ("reasoning", None), ("message", "assistant"), ("message", "user")], sent
    assert sent[1]["id"].startswith("rs_") and upstream_reasoning_id in (None, sent[1]["id"])
    await verified(service, second.id)
    # In a server tool's loop too: the round's reasoning goes back before its call.
    service.upstream.enqueue(
        Reply(reasoning=["Need a lookup."], chunks=[], tool_calls=[{"name": "lookup", "arguments": {"key": "k"}, "id": "call_k"}], finish_reason="tool_calls"),
        Reply(text="It is the value of k."),
    )
    third = await sdk.responses.create(model="gpt-test", input="Look up k.", extra_body={"tool_ids": ["lookup"]})
    assert third.output_text == "It is the value of k."
    assert [i.type for i in third.output] == ["reasoning", "message"]  # server tool calls are not client calls
    sent = service.upstream.requests[-1]["input"]
    kinds = [i.get("type") for i in sent]
    assert kinds[-3:] == ["reasoning", "function_call", "function_call_output"], sent
    assert sent[-3]["id"].startswith("rs_") and sent[-1]["output"] == "value of k"
    await verified(service, third.id)
    # The tool-round cap reached: incomplete.
    service.upstream.enqueue(
        Reply(chunks=["Looking. "], tool_calls=[{"name": "lookup", "arguments": {"key": "j"}, "id": "call_j"}], finish_reason="tool_calls"),
    )
    capped = await sdk.responses.create(model="gpt-test", input="Look up j.", extra_body={"tool_ids": ["lookup"], "params": {"max_tool_call_iterations": 0}})
    assert capped.status == "incomplete" and capped.incomplete_details is not None
    assert capped.incomplete_details.reason == "max_tool_calls" and capped.output_text == "Looking. "
    await verified(service, capped.id)


async def test_branching_from_an_earlier_response(service: Service) -> None:
    service.upstream.enqueue(Reply(text="A1"), Reply(text="A2"), Reply(text="B2"), Reply(text="B3"))
    sdk = aclient(service)
    first = await sdk.responses.create(model="gpt-test", input="Q1")
    await sdk.responses.create(model="gpt-test", input="Q2", previous_response_id=first.id)
    # Another answer to a different second question: the conversation up to the first response only.
    branch = await sdk.responses.create(model="gpt-test", input="Q2b", previous_response_id=first.id)
    assert branch.output_text == "B2"
    sent = service.upstream.requests[-1]["messages"]
    assert [(m["role"], m["content"]) for m in sent] == [("user", "Q1"), ("assistant", "A1"), ("user", "Q2b")]
    # The branch goes on from itself.
    after = await sdk.responses.create(model="gpt-test", input="Q3", previous_response_id=branch.id)
    assert after.output_text == "B3"
    sent = service.upstream.requests[-1]["messages"]
    assert [(m["role"], m["content"]) for m in sent] == [
        ("user", "Q1"),
        ("assistant", "A1"),
        ("user", "Q2b"),
        ("assistant", "B2"),
        ("user", "Q3"),
    ]
    chats = {(await verified(service, r.id))["chat_id"] for r in (first, branch, after)}
    assert len(chats) == 2  # the branch has a chat of its own
    # what the branch was given is its own input
    items = await sdk.responses.input_items.list(branch.id)
    assert [message_text(i) for i in items.data] == ["Q2b"]


async def test_upstream_failure_and_length_limit(service: Service) -> None:
    service.upstream.enqueue(Reply(status=500, error_message="upstream exploded"), Reply(text="cut off here", finish_reason="length"))
    sdk = aclient(service)
    events = [e async for e in await sdk.responses.create(model="gpt-test", input="x", stream=True)]
    check_sequence(events)
    assert events[-1].type == "response.failed"
    failed = await sdk.responses.retrieve(events[-1].response.id)
    assert failed.status == "failed" and failed.error is not None and "exploded" in failed.error.message
    assert (await verified(service, failed.id))["status"] == "failed"
    cut = await sdk.responses.create(model="gpt-test", input="y")
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens" and cut.output_text == "cut off here"
    await verified(service, cut.id)


@pytest.fixture
async def unverified_service(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> AsyncIterator[Service]:
    """A service whose turns are not verified at the end (a test damages one)."""
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url), upstream)
    try:
        yield svc
    finally:
        await stop_service(svc, verify=False)


async def test_a_damaged_log_is_a_409(unverified_service: Service) -> None:
    from tests.test_receipts import edit

    service = unverified_service
    service.upstream.enqueue(Reply(text="to be forged"))
    sdk = aclient(service)
    response = await sdk.responses.create(model="gpt-test", input="x")
    await edit(service.settings.database_url, turn_of(response.id), 3)
    for path in (f"/v1/responses/{response.id}", f"/v1/responses/{response.id}?stream=true"):
        status, body = await service.get(path)
        assert status == 409 and body["error"]["code"] == "damaged_log", body
