"""OpenAIResponsesProvider against real sockets: the ScriptedUpstream and raw handlers."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import openai
import pytest
from aiohttp import web

from adapters.providers.openai_chat import OpenAIChatProvider
from adapters.providers.openai_responses import OpenAIResponsesProvider
from engine.json_types import JsonObject
from engine.ports import ModelRequest, RawChunk, RawWarning, ResolvedModel, UpstreamError
from engine.protocols.client import LiveModelClient
from engine.protocols.model_events import (
    Finished,
    ModelEvent,
    ProviderItem,
    ReasoningDelta,
    ResponseStarted,
    TextDelta,
    ToolArgumentsDelta,
    ToolCall,
    ToolCallStarted,
)
from tests.polling import until
from tests.responses_events import FULL_STREAM, USAGE
from tests.stepped import Stepped
from tests.upstream import Reply, ScriptedUpstream

KEY = "sk-test-SECRET-0123456789"
BODY = {"model": "gpt-test", "input": [{"role": "user", "content": "Say hello"}]}

TEXT_EVENTS = [
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


@pytest.fixture
async def upstream() -> AsyncIterator[ScriptedUpstream]:
    async with ScriptedUpstream() as up:
        yield up


@pytest.fixture
async def provider(upstream: ScriptedUpstream) -> AsyncIterator[OpenAIResponsesProvider]:
    p = OpenAIResponsesProvider(upstream.url, KEY, idle_timeout=5.0)
    yield p
    await p.close()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
def raw_server(handler_server: Callable[..., Awaitable[str]]) -> Callable[[Handler], Awaitable[str]]:
    """One hand-written handler at ``/v1/responses``; returns the provider's base URL."""
    return lambda handler: handler_server(handler, "/v1/responses", "/v1")


async def collect_mixed(provider: OpenAIResponsesProvider, body: dict = BODY) -> list[RawChunk | RawWarning]:
    return [item async for item in provider.stream(body)]


async def collect(provider: OpenAIResponsesProvider, body: dict = BODY) -> list[RawChunk]:
    """The stream's chunks, where the test expects no warning among them."""
    items = await collect_mixed(provider, body)
    chunks = [i for i in items if isinstance(i, RawChunk)]
    assert len(chunks) == len(items), f"unexpected warnings: {items}"
    return chunks


async def collect_error(provider: OpenAIResponsesProvider, body: dict = BODY) -> tuple[list, UpstreamError]:
    items: list = []
    with pytest.raises(UpstreamError) as info:
        async for item in provider.stream(body):
            items.append(item)
    return items, info.value


def types(items: list) -> list[str]:
    return [i.data["type"] for i in items if isinstance(i, RawChunk)]


def deltas(items: list, kind: str = "response.output_text.delta") -> list[str]:
    return [i.data["delta"] for i in items if isinstance(i, RawChunk) and i.data["type"] == kind]


def event(type_: str, seq: int, **fields) -> bytes:
    obj = {"type": type_, **fields, "sequence_number": seq}
    return f"event: {type_}\ndata: {json.dumps(obj)}\n\n".encode()


def completed(seq: int = 9) -> bytes:
    return event("response.completed", seq, response={"id": "resp_raw", "status": "completed", "output": []})


def delta(text: str, seq: int) -> bytes:
    return event("response.output_text.delta", seq, item_id="msg_1", output_index=0, content_index=0, delta=text)


def sse_handler(payload: bytes, *, abort: bool = False) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(payload)
        if abort:
            transport = request.transport
            assert transport is not None
            # every byte handed to the kernel, which delivers them before the close
            await until(lambda: not transport.get_write_buffer_size(), "the write buffer drained", every=0.001)
            transport.abort()
            return resp
        await resp.write_eof()
        return resp

    return handler


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the happy path ----------------------------------------------------------------


async def test_text_stream(upstream: ScriptedUpstream, provider: OpenAIResponsesProvider) -> None:
    upstream.enqueue(Reply(chunks=["Hel", "lo ✓"], usage={"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}))
    body = {**BODY, "temperature": 0.2, "instructions": "be brief"}
    snapshot = json.loads(json.dumps(body))
    items = await collect(provider, body)

    assert all(isinstance(i, RawChunk) for i in items)
    assert types(items) == ["response.created", "response.in_progress", *TEXT_EVENTS, "response.completed"]
    assert [i.data["sequence_number"] for i in items] == list(range(len(items)))
    assert deltas(items) == ["Hel", "lo ✓"]
    by_type = {i.data["type"]: i.data for i in items}
    msg_id = by_type["response.output_item.added"]["item"]["id"]
    assert msg_id.startswith("msg_") and by_type["response.output_item.added"]["item"]["type"] == "message"
    assert by_type["response.output_text.done"]["text"] == "Hello ✓"
    final = items[-1].data["response"]
    assert final["id"].startswith("resp_") and final["id"] == items[0].data["response"]["id"]
    assert final["status"] == "completed" and final["instructions"] == "be brief"
    assert final["output"] == [by_type["response.output_item.done"]["item"]]
    assert final["output"][0]["content"][0] == {"type": "output_text", "annotations": [], "logprobs": [], "text": "Hello ✓"}
    assert final["usage"]["input_tokens"] == 7 and final["usage"]["output_tokens"] == 2
    assert final["usage"]["total_tokens"] == 9

    assert body == snapshot  # caller's dict untouched
    sent = upstream.requests[-1]
    assert sent["stream"] is True and sent["temperature"] == 0.2 and "stream_options" not in sent
    assert upstream.request_paths[-1] == "/v1/responses"
    assert upstream.request_headers[-1]["Authorization"] == f"Bearer {KEY}"


async def test_reasoning_then_text(upstream: ScriptedUpstream, provider: OpenAIResponsesProvider) -> None:
    upstream.enqueue(Reply(text="abcdef", chunk_size=3, reasoning=["think", "ing"]))
    items = await collect(provider)
    assert types(items)[2:9] == [
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
    ]
    assert deltas(items, "response.reasoning_summary_text.delta") == ["think", "ing"]
    assert deltas(items) == ["abc", "def"]
    assert items[2].data["item"]["type"] == "reasoning" and items[2].data["item"]["id"].startswith("rs_")
    assert {i.data["output_index"] for i in items if i.data["type"].startswith("response.reasoning")} == {0}
    assert {i.data["output_index"] for i in items if i.data["type"].startswith("response.output_text")} == {1}
    final = items[-1].data["response"]
    assert [o["type"] for o in final["output"]] == ["reasoning", "message"]
    assert final["output"][0]["summary"] == [{"type": "summary_text", "text": "thinking"}]
    usage = final["usage"]  # default: one token per piece
    assert usage["output_tokens"] == 4 and usage["output_tokens_details"]["reasoning_tokens"] == 2
    assert usage["total_tokens"] == usage["input_tokens"] + 4


async def test_tool_call_stream(upstream: ScriptedUpstream, provider: OpenAIResponsesProvider) -> None:
    upstream.enqueue(
        Reply(
            tool_calls=[
                {"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call_1"},
                {"name": "get_time", "arguments": "{}"},
            ],
            finish_reason="tool_calls",
            chunk_size=5,
        )
    )
    items = await collect(provider)
    kinds = types(items)
    assert "response.output_text.delta" not in kinds and "response.content_part.added" not in kinds
    added = [i.data for i in items if i.data["type"] == "response.output_item.added"]
    assert [a["item"]["type"] for a in added] == ["function_call", "function_call"]
    first = added[0]["item"]
    assert first["id"].startswith("fc_") and first["call_id"] == "call_1" and first["name"] == "get_weather"
    assert first["arguments"] == "" and first["status"] == "in_progress"
    assert added[1]["item"]["call_id"].startswith("call_") and added[1]["output_index"] == 1
    args = "".join(i.data["delta"] for i in items if i.data["type"] == "response.function_call_arguments.delta" and i.data["item_id"] == first["id"])
    assert json.loads(args) == {"city": "Paris"}
    assert len(deltas(items, "response.function_call_arguments.delta")) > 2  # streamed in fragments
    done = [i.data for i in items if i.data["type"] == "response.function_call_arguments.done"]
    assert done[0]["arguments"] == args and done[1]["arguments"] == "{}"
    final = items[-1].data["response"]
    assert kinds[-1] == "response.completed"
    assert [(o["type"], o["call_id"], o["status"]) for o in final["output"]] == [
        ("function_call", "call_1", "completed"),
        ("function_call", added[1]["item"]["call_id"], "completed"),
    ]


async def test_text_and_tool_call(upstream: ScriptedUpstream, provider: OpenAIResponsesProvider) -> None:
    upstream.enqueue(Reply(chunks=["Let me check."], tool_calls=[{"name": "f", "arguments": {}}], finish_reason="tool_calls"))
    items = await collect(provider)
    final = items[-1].data["response"]
    assert [o["type"] for o in final["output"]] == ["message", "function_call"]
    assert deltas(items) == ["Let me check."]


async def test_incomplete_and_failed_end_normally(upstream: ScriptedUpstream, provider: OpenAIResponsesProvider) -> None:
    upstream.enqueue(
        Reply(chunks=["a", "b"], finish_reason="length"),
        Reply(chunks=["a"], finish_reason="content_filter"),
        Reply(chunks=["a"], finish_reason="failed", error_message="The model crashed."),
    )
    items = await collect(provider)
    assert types(items)[-1] == "response.incomplete"
    final = items[-1].data["response"]
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete"
    items = await collect(provider)
    assert items[-1].data["response"]["incomplete_details"] == {"reason": "content_filter"}
    items = await collect(provider)
    assert types(items)[-1] == "response.failed"
    assert items[-1].data["response"]["error"] == {"code": "server_error", "message": "The model crashed."}


async def test_usage_in_responses_form_is_sent_as_given(upstream: ScriptedUpstream, provider: OpenAIResponsesProvider) -> None:
    usage = {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 4},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 1},
        "total_tokens": 13,
    }
    upstream.enqueue(Reply(chunks=["x"], usage=usage))
    items = await collect(provider)
    assert items[-1].data["response"]["usage"] == usage


async def test_comments_and_crlf_are_ignored(upstream: ScriptedUpstream, provider: OpenAIResponsesProvider, raw_server) -> None:
    upstream.enqueue(Reply(chunks=["x", "y"], comments=True))
    assert deltas(await collect(provider)) == ["x", "y"]

    payload = (delta("a", 0) + delta("b", 1) + completed(2)).replace(b"\n", b"\r\n")
    async with OpenAIResponsesProvider(await raw_server(sse_handler(payload)), KEY) as p:
        items = await collect(p)
    assert deltas(items) == ["a", "b"] and types(items)[-1] == "response.completed"


def pretty_event(type_: str, seq: int, **fields) -> bytes:
    """An event whose JSON is pretty-printed over several ``data:`` lines."""
    obj = {"type": type_, **fields, "sequence_number": seq}
    lines = json.dumps(obj, indent=2).encode().split(b"\n")
    return f"event: {type_}\n".encode() + b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"


async def test_multiline_data_and_lone_cr(raw_server) -> None:
    """One event's data lines are one JSON payload, and CR alone ends a line
    (the old framing parsed each data line alone, and split on LF only)."""
    payload = (
        pretty_event("response.output_text.delta", 0, item_id="msg_1", output_index=0, content_index=0, delta="a")
        + delta("b", 1)
        + pretty_event("response.completed", 2, response={"id": "resp_raw", "status": "completed", "output": []})
    )
    for body in (payload, payload.replace(b"\n", b"\r"), payload.replace(b"\n", b"\r\n")):
        async with OpenAIResponsesProvider(await raw_server(sse_handler(body)), KEY) as p:
            items = await collect(p)
        assert all(isinstance(i, RawChunk) for i in items)
        assert deltas(items) == ["a", "b"] and types(items)[-1] == "response.completed"


async def test_a_type_given_only_by_the_event_line(raw_server) -> None:
    """``event:`` names the event when the object has no ``type`` (the old
    transport ignored the line: every event typeless, then upstream_truncated).
    When both are there, the object's own type is kept."""
    payload = (
        b"event: response.output_text.delta\n"
        b'data: {"item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "a"}\n\n'
        b"event: response.output_text.done\n"
        + delta("b", 1).split(b"\n", 1)[1]
        + b'event: response.completed\ndata: {"response": {"id": "resp_raw", "status": "completed", "output": []}}\n\n'
    )
    async with OpenAIResponsesProvider(await raw_server(sse_handler(payload)), KEY) as p:
        items = await collect(p)
    assert types(items) == ["response.output_text.delta", "response.output_text.delta", "response.completed"]
    assert deltas(items) == ["a", "b"]


async def test_lines_cut_between_reads(raw_server) -> None:
    """Pieces are separate reads (tests.stepped): an ``event:`` line, a
    ``data:`` prefix and, inside a multi-line event, a CRLF between CR and LF
    (taken for two line ends, the LF would be a blank line and split the event)."""
    steps = Stepped(
        delta("a", 0) + b"event: response.output_te",
        b"xt.delta\n" + delta("b", 1).split(b"\n", 1)[1] + b"da",
        b"ta: " + delta("c", 2).split(b"data: ", 1)[1] + b'data: {"type": "response.completed", "sequence_number": 3,\r',
        b'\ndata: "response": {"id": "resp_raw", "status": "completed", "output": []}}\r\n\r\n',
    )
    async with OpenAIResponsesProvider(await raw_server(steps.handler), KEY, idle_timeout=5) as p:
        items = await steps.collect(p.stream(BODY))
    assert all(isinstance(i, RawChunk) for i in items)
    assert deltas(items) == ["a", "b", "c"] and types(items)[-1] == "response.completed"


async def test_ids_retries_and_comments_change_nothing(raw_server) -> None:
    plain = delta("a", 0) + completed(1)
    noisy = b"retry: 1000\n\n: ok\n\nid: 1\n" + delta("a", 0) + b"id: 2\n:\nfoo\n" + completed(1) + b": bye\n\n"
    async with OpenAIResponsesProvider(await raw_server(sse_handler(plain)), KEY) as p:
        expected = await collect(p)
    async with OpenAIResponsesProvider(await raw_server(sse_handler(noisy)), KEY) as p:
        assert await collect(p) == expected


async def test_many_concurrent_streams(upstream: ScriptedUpstream) -> None:
    upstream.default = Reply(text="concurrent responses streams", chunk_size=5, delay=0.001)
    async with OpenAIResponsesProvider(upstream.url, KEY) as p:
        results = await asyncio.gather(*(collect(p) for _ in range(100)))
    assert all("".join(deltas(r)) == "concurrent responses streams" for r in results)


# -- previous_response_id ----------------------------------------------------------


async def test_previous_response_id_chain(upstream: ScriptedUpstream, provider: OpenAIResponsesProvider) -> None:
    upstream.enqueue(Reply(chunks=["one"]), Reply(chunks=["two"]), Reply(chunks=["three"]))
    first = await collect(provider)
    rid = first[-1].data["response"]["id"]
    assert rid in upstream.response_ids

    chained = {"model": "gpt-test", "previous_response_id": rid, "input": [{"role": "user", "content": "more"}]}
    second = await collect(provider, chained)
    assert deltas(second) == ["two"] and second[-1].data["response"]["previous_response_id"] == rid

    # Unknown id: HTTP 400 previous_response_not_found, no reply used up, request recorded.
    pending = upstream.pending
    _, err = await collect_error(provider, {**chained, "previous_response_id": "resp_unknown"})
    assert (err.kind, err.status) == ("previous_response_not_found", 400)
    assert "resp_unknown" in err.message
    assert upstream.pending == pending and upstream.requests[-1]["previous_response_id"] == "resp_unknown"

    # Expiry: forgotten ids are unknown too; the full transcript still works.
    upstream.forget_responses()
    _, err = await collect_error(provider, chained)
    assert err.kind == "previous_response_not_found"
    assert deltas(await collect(provider)) == ["three"]
    assert upstream.request_paths == ["/v1/responses"] * 5


async def test_store_false_is_not_remembered(upstream: ScriptedUpstream, provider: OpenAIResponsesProvider) -> None:
    items = await collect(provider, {**BODY, "store": False})
    rid = items[-1].data["response"]["id"]
    assert items[-1].data["response"]["store"] is False and rid not in upstream.response_ids
    _, err = await collect_error(provider, {**BODY, "previous_response_id": rid})
    assert err.kind == "previous_response_not_found"


async def test_response_id_override(upstream: ScriptedUpstream, provider: OpenAIResponsesProvider) -> None:
    upstream.enqueue(Reply(chunks=["a"], response_id="resp_fixed"), Reply(chunks=["b"]))
    items = await collect(provider)
    assert {i.data["response"]["id"] for i in items if "response" in i.data} == {"resp_fixed"}
    items = await collect(provider, {**BODY, "previous_response_id": "resp_fixed"})
    assert deltas(items) == ["b"]


@pytest.mark.parametrize(
    ("status", "error", "kind"),
    [
        (404, {"message": "Previous response with id 'resp_x' not found.", "code": "previous_response_not_found"}, "previous_response_not_found"),
        (400, {"message": "Container is expired.", "param": "previous_response_id", "code": None}, "previous_response_not_found"),
        (400, {"message": "The previous_response_id 'resp_x' has expired."}, "previous_response_not_found"),
        (400, {"message": "Invalid value for 'temperature'.", "param": "temperature"}, "upstream_http_error"),
        (500, {"message": "previous_response_id lookup failed", "code": "server_error"}, "upstream_http_error"),
    ],
)
async def test_previous_response_error_mapping(raw_server, status: int, error: dict, kind: str) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": error}, status=status)

    async with OpenAIResponsesProvider(await raw_server(handler), KEY) as p:
        _, err = await collect_error(p)
        assert (err.kind, err.status) == (kind, status)
        with pytest.raises(UpstreamError) as info:
            await p.complete(BODY)
        assert (info.value.kind, info.value.status) == (kind, status)


# -- faults ------------------------------------------------------------------------


async def test_malformed_line_is_a_warning(upstream: ScriptedUpstream, provider: OpenAIResponsesProvider) -> None:
    upstream.enqueue(Reply(chunks=["a", "b"], fault="malformed", fault_after=1))
    items = await collect_mixed(provider)
    warnings = [i for i in items if isinstance(i, RawWarning)]
    assert len(warnings) == 1 and warnings[0].raw == "data: {not json" and "not valid JSON" in warnings[0].message
    assert deltas(items) == ["a", "b"] and types(items)[-1] == "response.completed"


async def test_disconnect_mid_body(upstream: ScriptedUpstream, provider: OpenAIResponsesProvider) -> None:
    upstream.enqueue(Reply(chunks=["a", "b", "c"], fault="disconnect", fault_after=2))
    items, err = await collect_error(provider)
    assert deltas(items) == ["a", "b"]
    assert err.kind == "upstream_disconnected" and err.status is None


async def test_truncated_body(upstream: ScriptedUpstream, provider: OpenAIResponsesProvider) -> None:
    upstream.enqueue(Reply(chunks=["a", "b"], fault="truncate", fault_after=1), Reply(chunks=["a"], fault="truncate", fault_after=9))
    items, err = await collect_error(provider)
    assert deltas(items) == ["a"] and err.kind == "upstream_truncated"
    items, err = await collect_error(provider)  # after the last delta, before output_text.done
    assert deltas(items) == ["a"] and err.kind == "upstream_truncated"


async def test_hang_hits_the_idle_timeout(upstream: ScriptedUpstream) -> None:
    upstream.enqueue(Reply(chunks=["a", "b"], fault="hang", fault_after=1))
    async with OpenAIResponsesProvider(upstream.url, KEY, idle_timeout=0.2) as p:
        loop = asyncio.get_running_loop()
        start = loop.time()
        items, err = await collect_error(p)
    assert deltas(items) == ["a"] and err.kind == "upstream_timeout"
    assert 0.15 < loop.time() - start < 2.0


async def test_pause_and_release(upstream: ScriptedUpstream, provider: OpenAIResponsesProvider) -> None:
    upstream.enqueue(Reply(chunks=["a", "b", "c"], pause_after=2))
    got: list[str] = []

    async def consume() -> None:
        async for item in provider.stream(BODY):
            got.extend(deltas([item]))

    task = asyncio.create_task(consume())
    await asyncio.wait_for(upstream.paused.wait(), 5)
    await until(lambda: len(got) >= 2, "the two chunks sent were read", within=5)
    assert got == ["a", "b"] and not task.done()
    upstream.release()
    await asyncio.wait_for(task, 5)
    assert got == ["a", "b", "c"]


async def test_http_errors_and_key_scrubbing(upstream: ScriptedUpstream, provider: OpenAIResponsesProvider) -> None:
    upstream.enqueue(Reply(status=500, error_message=f"boom {KEY}"), Reply(status=429, error_message="Rate limit reached"))
    items, err = await collect_error(provider)
    assert items == [] and (err.kind, err.status) == ("upstream_http_error", 500)
    assert "boom ***" in err.message and KEY not in err.message
    _, err = await collect_error(provider)
    assert (err.kind, err.status) == ("upstream_http_error", 429) and "Rate limit reached" in err.message
    assert KEY not in repr(provider)


async def test_connection_refused() -> None:
    async with OpenAIResponsesProvider(f"http://127.0.0.1:{free_port()}/v1", KEY) as p:
        _, err = await collect_error(p)
        assert err.kind == "upstream_disconnected"
        for call in (p.complete(BODY), p.list_models()):
            with pytest.raises(UpstreamError) as info:
                await call
            assert info.value.kind == "upstream_disconnected"


# -- how a stream ends (hand-written servers) --------------------------------------


async def test_done_is_tolerated_after_the_terminal_event(raw_server) -> None:
    payload = delta("a", 0) + completed(1) + b"data: [DONE]\n\n"
    async with OpenAIResponsesProvider(await raw_server(sse_handler(payload)), KEY) as p:
        items = await collect(p)
    assert types(items) == ["response.output_text.delta", "response.completed"]


async def test_done_without_terminal_event_is_truncated(raw_server) -> None:
    payload = delta("a", 0) + b"data: [DONE]\n\n" + completed(1)
    async with OpenAIResponsesProvider(await raw_server(sse_handler(payload)), KEY) as p:
        items, err = await collect_error(p)
    assert deltas(items) == ["a"] and err.kind == "upstream_truncated"


async def test_terminal_event_without_trailing_newline(raw_server) -> None:
    payload = delta("a", 0) + completed(1).rstrip(b"\n")
    async with OpenAIResponsesProvider(await raw_server(sse_handler(payload)), KEY) as p:
        items = await collect(p)
    assert types(items)[-1] == "response.completed"


async def test_connection_lost_after_the_terminal_event_is_a_normal_end(raw_server) -> None:
    payload = delta("a", 0) + completed(1)
    async with OpenAIResponsesProvider(await raw_server(sse_handler(payload, abort=True)), KEY) as p:
        items = await collect(p)
    assert types(items) == ["response.output_text.delta", "response.completed"]


async def test_error_event(raw_server) -> None:
    err_event = event("error", 1, code="server_error", message="The model is overloaded.", param=None)
    failed = event("response.failed", 2, response={"id": "resp_raw", "status": "failed", "error": {"code": "server_error", "message": "x"}})

    async with OpenAIResponsesProvider(await raw_server(sse_handler(delta("a", 0) + err_event)), KEY) as p:
        items, err = await collect_error(p)
    assert types(items) == ["response.output_text.delta", "error"]  # yielded, then raised
    assert err.kind == "upstream_error" and "The model is overloaded." in err.message

    async with OpenAIResponsesProvider(await raw_server(sse_handler(delta("a", 0) + err_event + failed)), KEY) as p:
        items = await collect(p)  # a terminal event follows: a normal end
    assert types(items)[-1] == "response.failed"

    gone = event("error", 0, code="previous_response_not_found", message="Previous response with id 'r' not found.", param="previous_response_id")
    async with OpenAIResponsesProvider(await raw_server(sse_handler(gone)), KEY) as p:
        _, err = await collect_error(p)
    assert err.kind == "previous_response_not_found"


async def test_non_object_data_is_a_warning(raw_server) -> None:
    payload = b"data: [1, 2]\n\n" + delta("a", 0) + completed(1)
    async with OpenAIResponsesProvider(await raw_server(sse_handler(payload)), KEY) as p:
        items = await collect_mixed(p)
    assert isinstance(items[0], RawWarning) and "not an object" in items[0].message
    assert types(items) == ["response.output_text.delta", "response.completed"]


# -- model events from real bytes (transport + ResponsesNormalizer) ------------------


def sse_events(events: list[dict]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


async def model_events(base_url: str) -> list[ModelEvent]:
    """The production path from the socket to model events: LiveModelClient."""
    counter = iter(range(1, 100))
    async with OpenAIResponsesProvider(base_url, KEY) as p:
        resolved = ResolvedModel(provider=p, upstream_model="gpt-test", api="responses")
        request = ModelRequest(messages=[{"role": "user", "content": "hi"}], params={})
        stream = LiveModelClient().stream(resolved, request, lambda prefix: f"{prefix}_{next(counter)}")
        return [event async for batch in stream for event in batch]


async def test_model_events_of_a_full_stream(raw_server) -> None:
    """Item order, text deltas, call arguments (as they stream, then whole), usage and the response id, as
    the engine gets them (tests/responses_events.py, served as SSE bytes)."""
    assert await model_events(await raw_server(sse_handler(sse_events(FULL_STREAM)))) == [
        ResponseStarted("resp_68a"),
        *(TextDelta(t) for t in ["Let", " me", " check", " the", " weather", "."]),
        ToolCallStarted("call_Kx1", "get_weather", "fc_68a1"),
        *(ToolArgumentsDelta("call_Kx1", t) for t in ['{"', "city", '":"', "Paris", '"}']),
        ToolCall("call_Kx1", "get_weather", '{"city":"Paris"}', item_id="fc_68a1"),
        Finished(reason="tool_calls", response_id="resp_68a", usage=USAGE, status="completed"),
    ]


async def test_model_events_when_text_and_reasoning_come_only_in_the_final_output(raw_server) -> None:
    """A server that streams only the lifecycle: the answer and the reasoning
    item are taken from response.completed (the turn used to end empty)."""
    reasoning: JsonObject = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Plan."}]}
    message = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Only here.", "annotations": []}],
    }
    stream = [
        {"type": "response.created", "sequence_number": 0, "response": {"id": "resp_q", "status": "in_progress", "output": []}},
        {"type": "response.reasoning_summary_text.delta", "sequence_number": 1, "output_index": 0, "summary_index": 0, "delta": "Plan."},
        {
            "type": "response.completed",
            "sequence_number": 2,
            "response": {"id": "resp_q", "status": "completed", "output": [reasoning, message], "usage": {"input_tokens": 2}},
        },
    ]
    assert await model_events(await raw_server(sse_handler(sse_events(stream)))) == [
        ResponseStarted("resp_q"),
        ReasoningDelta("Plan."),
        ProviderItem(reasoning),
        TextDelta("Only here."),
        Finished(reason="stop", response_id="resp_q", usage={"input_tokens": 2}, status="completed"),
    ]


# -- non-streaming and models -------------------------------------------------------


async def test_complete(upstream: ScriptedUpstream, provider: OpenAIResponsesProvider) -> None:
    upstream.enqueue(Reply(text="All done.", reasoning=["hmm"], tool_calls=[{"name": "f", "arguments": {"x": 1}, "id": "call_9"}]))
    body = {**BODY, "stream": True, "stream_options": {"include_obfuscation": False}}
    result = await provider.complete(body)
    assert result["object"] == "response" and result["status"] == "completed" and result["error"] is None
    assert [o["type"] for o in result["output"]] == ["reasoning", "message", "function_call"]
    assert result["output"][1]["content"][0]["text"] == "All done."
    assert result["output"][2]["call_id"] == "call_9" and json.loads(result["output"][2]["arguments"]) == {"x": 1}
    assert result["usage"]["total_tokens"] >= 1
    assert result["id"] in upstream.response_ids
    sent = upstream.requests[-1]
    assert sent["stream"] is False and "stream_options" not in sent
    assert body["stream"] is True  # caller's dict untouched


async def test_complete_failed_response_is_returned(upstream: ScriptedUpstream, provider: OpenAIResponsesProvider) -> None:
    upstream.enqueue(Reply(text="x", finish_reason="failed", error_message="nope"))
    result = await provider.complete(BODY)
    assert result["status"] == "failed" and result["error"]["message"] == "nope"


async def test_complete_errors(upstream: ScriptedUpstream, provider: OpenAIResponsesProvider) -> None:
    upstream.enqueue(Reply(status=429), Reply(fault="disconnect"), Reply(fault="malformed"), Reply(fault="truncate"))
    expected = [("upstream_http_error", 429), ("upstream_disconnected", None), ("upstream_error", None), ("upstream_error", None)]
    for kind, status in expected:
        with pytest.raises(UpstreamError) as info:
            await provider.complete(BODY)
        assert (info.value.kind, info.value.status) == (kind, status)
    with pytest.raises(UpstreamError) as info:
        await provider.complete({**BODY, "previous_response_id": "resp_nope"})
    assert (info.value.kind, info.value.status) == ("previous_response_not_found", 400)


async def test_list_models(provider: OpenAIResponsesProvider, upstream: ScriptedUpstream) -> None:
    upstream.models = ["gpt-test", "gpt-other"]
    assert [m["id"] for m in await provider.list_models()] == ["gpt-test", "gpt-other"]


async def test_caller_session_is_not_closed(upstream: ScriptedUpstream) -> None:
    async with aiohttp.ClientSession() as session:
        p = OpenAIResponsesProvider(upstream.url, KEY, session=session)
        assert deltas(await collect(p))
        await p.close()
        assert not session.closed


async def test_api_names_and_the_chat_alias(upstream: ScriptedUpstream) -> None:
    assert OpenAIResponsesProvider.api == "responses" and OpenAIChatProvider.api == "chat"
    upstream.enqueue(Reply(chunks=["via ", "stream"]))
    async with OpenAIChatProvider(upstream.url, KEY) as p:
        items = [i async for i in p.stream({"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]})]
    text = "".join(c["delta"].get("content") or "" for i in items if isinstance(i, RawChunk) for c in i.data["choices"])
    assert all(isinstance(i, RawChunk) for i in items)
    assert text == "via stream" and upstream.request_paths[-1] == "/v1/chat/completions"


# -- the bytes are real: the official SDK parses them --------------------------------


async def test_official_openai_sdk_parses_the_stream(upstream: ScriptedUpstream) -> None:
    from openai.types.responses import (
        ResponseCompletedEvent,
        ResponseFunctionCallArgumentsDeltaEvent,
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseReasoningItem,
        ResponseTextDeltaEvent,
    )

    upstream.enqueue(
        Reply(chunks=["Hello", " there", "!"], reasoning=["Greet", " them."]),
        Reply(
            chunks=["Let me check."],
            tool_calls=[{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call_1"}],
            finish_reason="tool_calls",
        ),
        Reply(text="Streamed via the helper.", reasoning=["r"]),
    )
    client = openai.AsyncOpenAI(base_url=upstream.url, api_key="x", max_retries=0)
    try:
        stream = await client.responses.create(model="gpt-test", input="hi", stream=True)
        events = [e async for e in stream]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        text = "".join(e.delta for e in events if isinstance(e, ResponseTextDeltaEvent))
        assert text == "Hello there!"
        done = events[-1]
        assert isinstance(done, ResponseCompletedEvent)
        response = done.response
        assert response.status == "completed" and response.output_text == "Hello there!"
        assert isinstance(response.output[0], ResponseReasoningItem)
        assert response.output[0].summary[0].text == "Greet them."
        assert isinstance(response.output[1], ResponseOutputMessage)
        assert response.usage is not None and response.usage.output_tokens == 5
        first_id = response.id

        stream = await client.responses.create(model="gpt-test", input="weather?", previous_response_id=first_id, stream=True)
        events = [e async for e in stream]
        args = "".join(e.delta for e in events if isinstance(e, ResponseFunctionCallArgumentsDeltaEvent))
        last = events[-1]
        assert isinstance(last, ResponseCompletedEvent)
        calls = [o for o in last.response.output if isinstance(o, ResponseFunctionToolCall)]
        assert len(calls) == 1 and calls[0].call_id == "call_1" and calls[0].name == "get_weather"
        assert json.loads(args) == json.loads(calls[0].arguments) == {"city": "Paris"}

        # The SDK's accumulating helper rebuilds the same response from the events.
        async with client.responses.stream(model="gpt-test", input="hi") as helper:
            async for _ in helper:
                pass
            final = await helper.get_final_response()
        assert final.output_text == "Streamed via the helper."

        result = await client.responses.create(model="gpt-test", input="hi")
        assert result.output_text == "Hello from the scripted upstream."

        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(model="gpt-test", input="hi", previous_response_id="resp_gone", stream=True)
        assert info.value.code == "previous_response_not_found"
        assert info.value.param == "previous_response_id"
    finally:
        await client.close()
