"""The agent loop over the Responses API (stateless and stateful) and Ollama."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.harness import Service, make_settings, sse_text, start_service, stop_service
from tests.oracle import check_completion_against_turn, check_stream_against_log, read_stream
from tests.tools_fixtures import write_tools
from tests.upstream import Reply, ScriptedUpstream

USER: list[ChatCompletionMessageParam] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add 2 and 3, then 4 and 5."}]


def calls(*pairs: tuple[str, dict | str, str]) -> Reply:
    return Reply(tool_calls=[{"name": n, "arguments": a, "id": i} for n, a, i in pairs], finish_reason="tool_calls")


async def _service(tmp_path: Path, upstream: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch, database_url: str, **settings: object) -> Service:
    monkeypatch.setenv("TURNLOG_TEST_TOOL_LOG", str(tmp_path / "tool.log"))
    tools = write_tools(tmp_path / "tools")
    return await start_service(make_settings(tmp_path, upstream.url, tools_dir=str(tools), database_url=database_url, **settings), upstream)


@pytest.fixture
async def responses(tmp_path: Path, upstream: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch, database_url: str) -> AsyncIterator[Service]:
    svc = await _service(tmp_path, upstream, monkeypatch, database_url, openai_api_mode="responses", responses_stateful=True)
    try:
        yield svc
    finally:
        await stop_service(svc)


@pytest.fixture
async def ollama(tmp_path: Path, upstream: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch, database_url: str) -> AsyncIterator[Service]:
    svc = await _service(tmp_path, upstream, monkeypatch, database_url, openai_base_url=None, ollama_base_url=upstream.root)
    try:
        yield svc
    finally:
        await stop_service(svc)


async def replay_equals_live(service: Service, turn_id: str, completion: dict) -> dict:
    """The answer the actor gave (``completion``, built from its own view of
    the turn it ended) and what a client following the turn is sent, against
    the fold of the log (``GET /v1/turns/{id}``, ``replay?upto=SEQ`` for every seq)."""
    view = await service.turn(turn_id)
    check_completion_against_turn(completion, view)
    await check_stream_against_log(service, turn_id, await read_stream(service, turn_id))
    return view


async def test_responses_stateful_sends_previous_response_id_and_only_new_items(responses: Service) -> None:
    up = responses.upstream
    up.enqueue(
        calls(("add", {"a": 2, "b": 3}, "call_1")),
        calls(("add", {"a": 4, "b": 5}, "call_2")),
        Reply(text="5 and 9."),
    )
    sdk = openai.AsyncOpenAI(base_url=responses.v1, api_key="x", max_retries=0)
    raw = await sdk.chat.completions.with_raw_response.create(model="gpt-test", messages=USER, extra_body={"tool_ids": ["weather"]})
    done = raw.parse()
    await sdk.close()
    assert done.choices[0].message.content == "5 and 9."
    assert up.request_paths == ["/v1/responses"] * 3
    first, second, third = up.requests
    assert "previous_response_id" not in first and first["instructions"] == "Be brief."
    assert [i["role"] for i in first["input"] if i.get("type", "message") == "message"] == ["user"]
    view = await replay_equals_live(responses, done.id.removeprefix("chatcmpl-"), raw.http_response.json())
    ids = view["response_ids"]
    assert len(ids) == 3 and set(ids) <= set(up.response_ids)  # every response id is on the log
    # the continuation carries the anchor and only the new tool output, not
    # what the server already stores under previous_response_id
    assert second["previous_response_id"] == ids[0]
    assert second["input"] == [{"type": "function_call_output", "call_id": "call_1", "output": "5"}]
    assert third["previous_response_id"] == ids[1]
    assert third["input"] == [{"type": "function_call_output", "call_id": "call_2", "output": "9"}]


async def test_responses_stateful_repeated_provider_call_id_answers_under_the_providers_id(responses: Service) -> None:
    up = responses.upstream
    up.enqueue(calls(("add", {"a": 2, "b": 3}, "call_1")), calls(("add", {"a": 4, "b": 5}, "call_1")), Reply(text="5 and 9."))
    status, body, headers = await responses.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "tool_ids": ["weather"]})
    assert status == 200, body
    view = await replay_equals_live(responses, headers["X-Turn-Id"], body)
    first, second = [i for i in view["output"] if i["type"] == "function_call"]
    assert first["call_id"] == "call_1" and second["call_id"] != "call_1" and second["provider_call_id"] == "call_1"
    outputs = [(i["call_id"], i["output"]) for i in view["output"] if i["type"] == "function_call_output"]
    assert outputs == [("call_1", "5"), (second["call_id"], "9")]
    # the stored response upstream knows its call as call_1
    assert up.requests[2]["input"] == [{"type": "function_call_output", "call_id": "call_1", "output": "9"}]


async def test_responses_expired_anchor_falls_back_to_the_full_transcript(responses: Service) -> None:
    up = responses.upstream

    up.enqueue(calls(("slow", {"seconds": 0.5}, "call_1")), Reply(text="It is 5."))
    forced = {"type": "function", "function": {"name": "slow"}}  # for the first call only, the fallback's too
    request = asyncio.create_task(
        responses.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "tool_ids": ["weather"], "tool_choice": forced})
    )
    deadline = asyncio.get_running_loop().time() + 10
    while not up.response_ids:  # the first response is stored upstream...
        assert not request.done() and asyncio.get_running_loop().time() < deadline, "no response was stored upstream"
        await asyncio.sleep(0.01)
    up.forget_responses()  # ...and expires while the tool runs
    status, body, headers = await request
    assert status == 200 and body["choices"][0]["message"]["content"] == "It is 5."
    refused, retried = up.requests[1], up.requests[2]
    assert "previous_response_id" in refused
    assert "previous_response_id" not in retried
    assert up.requests[0]["tool_choice"] == {"type": "function", "name": "slow"}
    assert "tool_choice" not in refused and "tool_choice" not in retried
    roles = [i.get("role") or i["type"] for i in retried["input"]]
    assert roles == ["user", "function_call", "function_call_output"]
    events = await responses.events(headers["X-Turn-Id"])
    fallback = [e for e in events if e["type"] == "model.fallback"]
    assert len(fallback) == 1 and fallback[0]["data"]["previous_response_id"] == refused["previous_response_id"]
    await replay_equals_live(responses, headers["X-Turn-Id"], body)


async def test_responses_streaming_text(responses: Service) -> None:
    responses.upstream.enqueue(Reply(text="Streaming over the Responses API.", chunk_size=5))
    async with responses.http.post(responses.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True}) as resp:
        assert sse_text(await resp.text()) == "Streaming over the Responses API."


async def test_ollama_tool_loop(ollama: Service) -> None:
    up = ollama.upstream
    up.enqueue(calls(("add", {"a": 2, "b": 3}, "o1"), ("add", {"a": 4, "b": 5}, "o2")), Reply(text="5 and 9"))
    status, body, headers = await ollama.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "tool_ids": ["weather"]})
    assert status == 200, body
    assert body["choices"][0]["message"]["content"] == "5 and 9"
    assert up.request_paths == ["/api/chat", "/api/chat"]
    second = up.requests[1]["messages"]
    assistant = [m for m in second if m["role"] == "assistant"][0]
    assert all(isinstance(c["function"]["arguments"], dict) for c in assistant["tool_calls"])  # Ollama wants objects
    assert [m["content"] for m in second if m["role"] == "tool"] == ["5", "9"]
    view = await replay_equals_live(ollama, headers["X-Turn-Id"], body)
    assert [i["output"] for i in view["output"] if i["type"] == "function_call_output"] == ["5", "9"]


async def test_responses_glued_json_arguments_become_separate_calls(responses: Service) -> None:
    up = responses.upstream
    up.enqueue(calls(("add", '{"a": 2, "b": 3}{"a": 4, "b": 5}', "call_1")), Reply(text="5 and 9."))
    status, body, headers = await responses.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "tool_ids": ["weather"]})
    assert status == 200, body
    view = await replay_equals_live(responses, headers["X-Turn-Id"], body)
    made = [i for i in view["output"] if i["type"] == "function_call"]
    assert [json.loads(c["arguments"]) for c in made] == [{"a": 2, "b": 3}, {"a": 4, "b": 5}]
    assert len({c["call_id"] for c in made}) == 2
    assert [i["output"] for i in view["output"] if i["type"] == "function_call_output"] == ["5", "9"]


async def test_responses_call_without_a_name_is_dropped_with_a_recorded_warning(
    tmp_path: Path, upstream: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch, database_url: str
) -> None:
    svc = await _service(tmp_path, upstream, monkeypatch, database_url, openai_api_mode="responses")
    try:
        upstream.enqueue(calls(("add", {"a": 2, "b": 3}, "call_1"), ("", {"a": 4}, "call_2")), Reply(text="5."))
        status, body, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "tool_ids": ["weather"]})
        assert status == 200, body
        view = await replay_equals_live(svc, headers["X-Turn-Id"], body)
        assert [i["call_id"] for i in view["output"] if i["type"] == "function_call"] == ["call_1"]
        sent = [i for i in upstream.requests[1]["input"] if i.get("type") == "function_call"]
        assert [i["name"] for i in sent] == ["add"]
        warnings = [e["data"]["message"] for e in await svc.events(headers["X-Turn-Id"]) if e["type"] == "model.warning"]
        assert len(warnings) == 1 and "call_2" in warnings[0]
    finally:
        await stop_service(svc)


async def test_responses_stateful_split_call_answers_the_providers_one_call(responses: Service) -> None:
    up = responses.upstream
    up.enqueue(calls(("add", '{"a": 2, "b": 3}{"a": 4, "b": 5}', "call_1")), Reply(text="5 and 9."))
    status, body, headers = await responses.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "tool_ids": ["weather"]})
    assert status == 200, body
    view = await replay_equals_live(responses, headers["X-Turn-Id"], body)
    assert [i["output"] for i in view["output"] if i["type"] == "function_call_output"] == ["5", "9"]
    # the stored response upstream has one call, call_1: it gets both results
    assert up.requests[1]["previous_response_id"]
    assert up.requests[1]["input"] == [{"type": "function_call_output", "call_id": "call_1", "output": "5\n9"}]
