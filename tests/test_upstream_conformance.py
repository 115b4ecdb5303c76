"""Conformance with a vendor as strict as OpenAI.

The scripted upstream refuses, as OpenAI does, any top-level request field the
vendor does not accept (the fields come from the installed ``openai`` SDK's
request types). Against it: no turnlog extension field reaches an upstream;
an upstream's error is answered to the client as the error rules of docs/reference/basics.md say
(checked through real HTTP with the ``openai`` SDK, over SSE, the Responses
API and the WebSocket); a forcing ``tool_choice`` is sent on the first model
call only. Oracles: the SDK's own signatures and exceptions, what the upstream
recorded, and the statuses and bodies on the wire.
"""

from __future__ import annotations

import inspect
import json
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai.resources.chat.completions import AsyncCompletions
from openai.resources.responses import AsyncResponses
from openai.types.chat import ChatCompletionMessageParam

from engine.context.assemble import params_for_round
from tests.harness import Service, make_settings, start_service, stop_service
from tests.upstream import Reply, ScriptedUpstream
from tests.vendor_fields import CHAT_FIELDS, RESPONSES_FIELDS

USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What time is it?"}]


def body_of(error: openai.APIError) -> dict[str, Any]:
    """The error object an SDK exception carries (typed ``object`` by the SDK)."""
    assert isinstance(error.body, dict), error.body
    return error.body


CLOCK = '''
class Tools:
    def now(self) -> str:
        """The time."""
        return "12:00"
'''


def sdk(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0)


def _sdk_params(method: Any) -> set[str]:
    """The request fields an SDK ``create`` method takes (its keyword
    parameters, less the SDK's own transport options)."""
    own = {"self", "extra_headers", "extra_query", "extra_body", "timeout"}
    return set(inspect.signature(method).parameters) - own


# -- the double ---------------------------------------------------------------------


def test_the_accepted_fields_are_the_sdks() -> None:
    """An oracle apart from the TypedDicts the double reads: the SDK's
    ``create`` signatures name the same fields."""
    assert CHAT_FIELDS == _sdk_params(AsyncCompletions.create)
    assert RESPONSES_FIELDS == _sdk_params(AsyncResponses.create)


async def test_the_double_refuses_an_unknown_chat_field_as_openai_does(upstream: ScriptedUpstream) -> None:
    upstream.enqueue(Reply(text="never sent"))
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk(upstream.url).chat.completions.create(model="gpt-test", messages=USER, extra_body={"tool_approval": "ask"})
    assert caught.value.status_code == 400
    assert body_of(caught.value) == {
        "message": "Unrecognized request argument supplied: tool_approval",
        "type": "invalid_request_error",
        "param": "tool_approval",
        "code": None,
    }
    assert upstream.pending == 1  # recorded, no reply used up
    assert "tool_approval" in upstream.requests[-1]
    # Fields the vendor accepts pass, streaming or not.
    done = await sdk(upstream.url).chat.completions.create(model="gpt-test", messages=USER, temperature=0.2, seed=7, store=False, metadata={"a": "b"})
    assert done.choices[0].message.content == "never sent"
    stream = await sdk(upstream.url).chat.completions.create(model="gpt-test", messages=USER, stream=True, stream_options={"include_usage": True})
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


async def test_the_double_refuses_an_unknown_responses_field(upstream: ScriptedUpstream) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk(upstream.url).responses.create(model="gpt-test", input="hi", extra_body={"chat_id": "c1"})
    assert body_of(caught.value)["param"] == "chat_id"
    assert body_of(caught.value)["message"] == "Unrecognized request argument supplied: chat_id"
    done = await sdk(upstream.url).responses.create(model="gpt-test", input="hi", instructions="Be brief.", max_output_tokens=50)
    assert done.status == "completed"


async def test_the_ollama_double_ignores_unknown_fields(upstream: ScriptedUpstream) -> None:
    body = {"model": "gpt-test", "messages": USER, "stream": False, "tool_approval": "ask", "chat_id": "c1"}
    async with aiohttp.ClientSession() as http, http.post(f"{upstream.root}/api/chat", json=body) as resp:
        assert resp.status == 200
        assert (await resp.json())["message"]["content"]


# -- the service against it ----------------------------------------------------------


@pytest.fixture
async def tools_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "tools"
    folder.mkdir()
    (folder / "clock.py").write_text(textwrap.dedent(CLOCK))
    return folder


async def _service(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, tools: Path, **overrides: Any) -> Service:
    settings = make_settings(tmp_path, upstream.url, tools_dir=str(tools), database_url=database_url, **overrides)
    return await start_service(settings, upstream)


@pytest.fixture(params=["chat", "responses"])
async def svc(request: pytest.FixtureRequest, tmp_path: Path, upstream: ScriptedUpstream, database_url: str, tools_dir: Path) -> AsyncIterator[Service]:
    """turnlog over the strict double, speaking Chat Completions or Responses to it."""
    service = await _service(tmp_path, upstream, database_url, tools_dir, openai_api_mode=request.param)
    try:
        yield service
    finally:
        await stop_service(service)


def _vendor_fields(service: Service) -> frozenset[str]:
    return RESPONSES_FIELDS if service.settings.openai_api_mode == "responses" else CHAT_FIELDS


async def test_no_extension_field_reaches_the_upstream(svc: Service) -> None:
    """Every extension a client may send (turnlog's, Open WebUI's) stays
    home: the turn completes against the strict double."""
    svc.upstream.enqueue(Reply(tool_calls=[{"id": "c1", "name": "now", "arguments": {}}], finish_reason="tool_calls"), Reply(text="Noon."))
    body = {
        "model": "gpt-test",
        "messages": USER,
        "chat_id": "conformance-chat",
        "history": "client",
        "features": {"memory": False, "web_search": False},
        "files": [],
        "tool_ids": ["clock"],
        "direct_tools": [],
        "background_tasks": {"title": False, "tags": False, "follow_ups": False},
        "metadata": {"task": "title_generation", "chat_id": "conformance-chat"},
        "session_id": "s1",
        "id": "m1",
        "filter_ids": [],
        "variables": {"{{USER_NAME}}": "Ann"},
        "model_item": {"id": "gpt-test"},
        "params": {
            "tool_approval": "auto",
            "tool_approval_mode": "full",
            "function_calling": "native",
            "max_tool_call_iterations": 3,
            "stream_delta_chunk_size": 1,
            "reasoning_tags": False,
            "system": "You tell the time.",
            "temperature": 0.5,
        },
    }
    status, data, headers = await svc.post("/v1/chat/completions", body)
    assert status == 200, data
    assert data["choices"][0]["message"]["content"] == "Noon."
    assert len(svc.upstream.requests) == 2
    for sent in svc.upstream.requests:
        assert set(sent) <= _vendor_fields(svc), sent.keys()
        assert sent["temperature"] == 0.5  # a model parameter in ``params`` still goes
    assert (await svc.turn(headers["X-Turn-Id"]))["status"] == "completed"


async def test_tool_approval_ask_completes_against_the_strict_double(svc: Service) -> None:
    svc.upstream.enqueue(Reply(tool_calls=[{"id": "c1", "name": "now", "arguments": {}}], finish_reason="tool_calls"), Reply(text="Noon."))
    body = {"model": "gpt-test", "messages": USER, "tool_ids": ["clock"], "params": {"tool_approval": "ask"}}
    status, data, headers = await svc.post("/v1/chat/completions", body)
    assert status == 200, data
    turn_id = headers["X-Turn-Id"]
    assert (await svc.turn(turn_id))["status"] == "waiting"
    status, data, _ = await svc.post(f"/v1/turns/{turn_id}/approvals", {"call_id": "c1", "approve": True})
    assert status == 202, data
    view = await svc.wait_status(turn_id, "completed", "failed")
    assert view["status"] == "completed" and view["content"] == "Noon.", view


# -- a forcing tool_choice -----------------------------------------------------------


@pytest.mark.parametrize(
    "choice",
    ["required", {"type": "function", "function": {"name": "now"}}],
    ids=["required", "named"],
)
async def test_a_forcing_tool_choice_applies_to_the_first_call_only(svc: Service, choice: Any) -> None:
    svc.upstream.enqueue(
        Reply(tool_calls=[{"id": "c1", "name": "now", "arguments": {}}], finish_reason="tool_calls"),
        Reply(text="It is noon."),
    )
    body = {"model": "gpt-test", "messages": USER, "tool_ids": ["clock"], "tool_choice": choice}
    status, data, _ = await svc.post("/v1/chat/completions", body)
    assert status == 200, data
    assert data["choices"][0]["message"]["content"] == "It is noon."
    first, second = svc.upstream.requests
    if svc.settings.openai_api_mode == "responses":
        assert first["tool_choice"] == ("required" if choice == "required" else {"type": "function", "name": "now"})
    else:
        assert first["tool_choice"] == choice
    # Left out after the first call: auto wherever tools are sent (OpenAI's
    # default), and what servers that refuse an explicit streamed auto accept.
    assert "tool_choice" not in second and second["tools"]


async def test_auto_and_none_are_kept_on_every_round(svc: Service) -> None:
    svc.upstream.enqueue(Reply(tool_calls=[{"id": "c1", "name": "now", "arguments": {}}], finish_reason="tool_calls"), Reply(text="Noon."))
    status, data, _ = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "tool_ids": ["clock"], "tool_choice": "auto"})
    assert status == 200, data
    assert [r["tool_choice"] for r in svc.upstream.requests] == ["auto", "auto"]


CHAT_ALLOWED: dict[str, Any] = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "now"}}]}}
RESPONSES_ALLOWED = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "now"}]}


@pytest.mark.parametrize(
    ("choice", "later"),
    [
        ("required", None),  # left out: auto wherever tools are sent
        ({"type": "function", "function": {"name": "now"}}, None),
        ({"type": "function", "name": "now"}, None),
        ("auto", "auto"),
        ("none", "none"),
        (CHAT_ALLOWED, {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": CHAT_ALLOWED["allowed_tools"]["tools"]}}),
        (RESPONSES_ALLOWED, {**RESPONSES_ALLOWED, "mode": "auto"}),
    ],
)
def test_params_for_round(choice: Any, later: Any) -> None:
    params = {"tool_choice": choice, "temperature": 0.1}
    assert params_for_round(params, 0) == params
    expected = {"temperature": 0.1} if later is None else {"tool_choice": later, "temperature": 0.1}
    assert params_for_round(params, 1) == expected
    assert params_for_round(params, 3) == expected
    assert params["tool_choice"] == choice  # the recorded params are not changed
    assert params_for_round({"temperature": 0.1}, 2) == {"temperature": 0.1}


# -- upstream errors, as the client sees them ------------------------------------------


async def _verified_failed(service: Service, turn_id: str) -> dict[str, Any]:
    """The failed turn's view, once a re-run of its engine recorded the same failure."""
    status, result = await service.get(f"/v1/turns/{turn_id}/verify")
    assert status == 200 and result["ok"], result
    view = await service.turn(turn_id)
    assert view["status"] == "failed", view
    return view


async def test_a_clients_own_bad_field_is_its_400(svc: Service) -> None:
    client = sdk(svc.v1)
    svc.upstream.enqueue(Reply(text="never sent"))
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="gpt-test", messages=USER, extra_body={"bogus_field": 1})
    assert caught.value.status_code == 400
    assert body_of(caught.value) == {
        "message": "Unrecognized request argument supplied: bogus_field",
        "type": "invalid_request_error",
        "param": "bogus_field",
        "code": None,
    }
    await _verified_failed(svc, caught.value.response.headers["X-Turn-Id"])


async def test_a_clients_own_bad_field_in_a_stream_is_the_same_error_object(svc: Service) -> None:
    stream = await sdk(svc.v1).chat.completions.create(model="gpt-test", messages=USER, stream=True, extra_body={"bogus_field": 1})
    with pytest.raises(openai.APIError) as caught:
        async for _chunk in stream:
            pass
    assert body_of(caught.value) == {
        "message": "Unrecognized request argument supplied: bogus_field",
        "type": "invalid_request_error",
        "param": "bogus_field",
        "code": None,
    }


async def test_a_422_on_the_first_call_is_the_clients(svc: Service) -> None:
    svc.upstream.enqueue(Reply(status=422, error_message="'temperature' must be <= 2"))
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        await sdk(svc.v1).chat.completions.create(model="gpt-test", messages=USER, temperature=2)
    assert caught.value.status_code == 422
    assert body_of(caught.value)["message"] == "'temperature' must be <= 2"


async def test_a_400_on_a_later_round_is_a_502(svc: Service) -> None:
    svc.upstream.enqueue(
        Reply(tool_calls=[{"id": "c1", "name": "now", "arguments": {}}], finish_reason="tool_calls"),
        Reply(status=400, error_message="Invalid 'messages[2]': turnlog built it wrong"),
    )
    with pytest.raises(openai.InternalServerError) as caught:
        await sdk(svc.v1).chat.completions.create(model="gpt-test", messages=USER, extra_body={"tool_ids": ["clock"]})
    assert caught.value.status_code == 502
    assert body_of(caught.value)["type"] == "upstream_error"
    assert "turnlog built it wrong" in body_of(caught.value)["message"]


@pytest.mark.parametrize("status", [401, 403])
async def test_the_operators_key_refused_is_a_502(svc: Service, status: int) -> None:
    svc.upstream.enqueue(Reply(status=status, error_message="Incorrect API key provided"))
    with pytest.raises(openai.InternalServerError) as caught:
        await sdk(svc.v1).chat.completions.create(model="gpt-test", messages=USER)
    assert caught.value.status_code == 502
    assert body_of(caught.value)["type"] == "upstream_error"
    assert "Incorrect API key provided" in body_of(caught.value)["message"]


@pytest.mark.parametrize(("sent", "told"), [("17", "17"), ("0.2", "1"), (None, "5")], ids=["seconds", "rounded-up", "default"])
async def test_a_429_is_a_429_with_retry_after(svc: Service, sent: str | None, told: str) -> None:
    svc.upstream.enqueue(Reply(status=429, error_message="Rate limit reached", retry_after=sent))
    with pytest.raises(openai.RateLimitError) as caught:
        await sdk(svc.v1).chat.completions.create(model="gpt-test", messages=USER)
    assert caught.value.status_code == 429
    assert caught.value.response.headers["Retry-After"] == told
    assert "Rate limit reached" in body_of(caught.value)["message"]
    view = await _verified_failed(svc, caught.value.response.headers["X-Turn-Id"])
    assert view["error"]["status"] == 429


async def test_an_unreachable_upstream_is_a_503(tmp_path: Path, database_url: str, tools_dir: Path) -> None:
    gone = ScriptedUpstream(models=["gpt-test"])
    await gone.start()
    await gone.close()  # its port now refuses connections
    service = await _service(tmp_path, gone, database_url, tools_dir)
    try:
        with pytest.raises(openai.APIStatusError) as caught:
            await sdk(service.v1).chat.completions.create(model="gpt-test", messages=USER)
        assert caught.value.status_code == 503
        assert body_of(caught.value)["code"] == "upstream_unavailable"
        assert caught.value.response.headers["Retry-After"]
    finally:
        await stop_service(service)


async def test_the_responses_api_answers_the_clients_400(svc: Service) -> None:
    """A model parameter the client asked for (``params.custom_params``) that the upstream refuses."""
    body = {"params": {"custom_params": {"bogus_field": 1}}}
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk(svc.v1).responses.create(model="gpt-test", input="hi", extra_body=body)
    assert body_of(caught.value)["param"] == "bogus_field"
    assert body_of(caught.value)["message"] == "Unrecognized request argument supplied: bogus_field"


async def test_a_responses_stream_gets_the_error_event_then_failed(svc: Service) -> None:
    body = {"params": {"custom_params": {"bogus_field": 1}}}
    stream = await sdk(svc.v1).responses.create(model="gpt-test", input="hi", stream=True, extra_body=body)
    events = [event async for event in stream]
    error = next(e for e in events if e.type == "error")
    assert (error.param, error.message) == ("bogus_field", "Unrecognized request argument supplied: bogus_field")
    assert events[-1].type == "response.failed"


async def test_a_background_response_ends_failed_with_the_error(svc: Service) -> None:
    client = sdk(svc.v1)
    body = {"params": {"custom_params": {"bogus_field": 1}}}
    queued = await client.responses.create(model="gpt-test", input="hi", background=True, extra_body=body)
    # Answered with the response object, never the error's HTTP status (the
    # refusal may already be in when it is read: then it is failed already).
    assert queued.status in ("queued", "in_progress", "failed")
    # The stream of a stored response runs until it ends: no polling.
    async for _event in await client.responses.retrieve(queued.id, stream=True):
        pass
    failed = await client.responses.retrieve(queued.id)
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.message == "Unrecognized request argument supplied: bogus_field"


async def test_the_websocket_gets_the_error(svc: Service) -> None:
    request = {"model": "gpt-test", "messages": USER, "bogus_field": 1}
    async with svc.http.ws_connect(svc.v1 + "/ws") as ws:
        await ws.send_json({"type": "chat", "request": request})
        while True:
            message = json.loads((await ws.receive(timeout=10)).data)
            if message["type"] == "error":
                break
    assert message["status"] == 400 and message["param"] == "bogus_field"
    assert message["message"] == "Unrecognized request argument supplied: bogus_field"
