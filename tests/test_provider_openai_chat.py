"""OpenAIChatProvider against real sockets: the ScriptedUpstream and raw handlers."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import openai
import pytest
from aiohttp import web

from adapters.providers.openai_chat import OpenAIChatProvider
from engine.ports import RawChunk, RawWarning, UpstreamError
from tests.polling import until
from tests.stepped import Stepped
from tests.upstream import Reply, ScriptedUpstream

KEY = "sk-test-SECRET-0123456789"
BODY = {"model": "gpt-test", "messages": [{"role": "user", "content": "Say hello"}]}
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
async def upstream() -> AsyncIterator[ScriptedUpstream]:
    async with ScriptedUpstream() as up:
        yield up


@pytest.fixture
async def provider(upstream: ScriptedUpstream) -> AsyncIterator[OpenAIChatProvider]:
    p = OpenAIChatProvider(upstream.url, KEY, idle_timeout=5.0)
    yield p
    await p.close()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
def raw_server(handler_server: Callable[..., Awaitable[str]]) -> Callable[[Handler], Awaitable[str]]:
    """One hand-written handler at ``/v1/chat/completions``; returns the provider's base URL."""
    return lambda handler: handler_server(handler, "/v1/chat/completions", "/v1")


async def collect_mixed(provider: OpenAIChatProvider, body: dict = BODY) -> list[RawChunk | RawWarning]:
    return [item async for item in provider.stream(body)]


async def collect(provider: OpenAIChatProvider, body: dict = BODY) -> list[RawChunk]:
    """The stream's chunks, where the test expects no warning among them."""
    items = await collect_mixed(provider, body)
    chunks = [i for i in items if isinstance(i, RawChunk)]
    assert len(chunks) == len(items), f"unexpected warnings: {items}"
    return chunks


async def collect_error(provider: OpenAIChatProvider, body: dict = BODY) -> tuple[list, UpstreamError]:
    items: list = []
    with pytest.raises(UpstreamError) as info:
        async for item in provider.stream(body):
            items.append(item)
    return items, info.value


def contents(items: list) -> list[str]:
    out = []
    for item in items:
        if isinstance(item, RawChunk):
            for choice in item.data.get("choices") or []:
                if "content" in choice["delta"] and choice["delta"]["content"]:
                    out.append(choice["delta"]["content"])
    return out


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chunk(content: str | None = None, finish: str | None = None) -> dict:
    delta = {} if content is None else {"content": content}
    return {
        "id": "chatcmpl-raw",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the happy path ----------------------------------------------------------------


async def test_stream_chunks_in_order(upstream: ScriptedUpstream, provider: OpenAIChatProvider) -> None:
    upstream.enqueue(Reply(chunks=["Hel", "lo", ", wor", "ld ✓"], usage={"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}))
    body = {**BODY, "temperature": 0.2}
    snapshot = json.loads(json.dumps(body))
    items = await collect(provider, body)

    assert all(isinstance(i, RawChunk) for i in items)
    data = [i.data for i in items]
    assert data[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert contents(items) == ["Hel", "lo", ", wor", "ld ✓"]
    assert data[-2]["choices"][0]["finish_reason"] == "stop"
    assert data[-2]["choices"][0]["delta"] == {}
    assert data[-1]["choices"] == []
    assert data[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}
    assert all(d["object"] == "chat.completion.chunk" and d["id"] == data[0]["id"] for d in data)

    # What was sent: stream + include_usage added, caller's dict untouched, auth header.
    assert body == snapshot
    sent = upstream.requests[-1]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert sent["temperature"] == 0.2 and sent["messages"] == BODY["messages"]
    assert upstream.request_headers[-1]["Authorization"] == f"Bearer {KEY}"


async def test_text_reasoning_and_default_usage(upstream: ScriptedUpstream, provider: OpenAIChatProvider) -> None:
    upstream.enqueue(Reply(text="abcdefghij", chunk_size=3, reasoning=["think", "ing"]))
    items = await collect(provider)
    assert contents(items) == ["abc", "def", "ghi", "j"]
    reasoning = [i.data["choices"][0]["delta"].get("reasoning_content") for i in items if i.data["choices"]]
    assert [r for r in reasoning if r] == ["think", "ing"]
    usage = items[-1].data["usage"]
    assert usage["completion_tokens"] == 6 and usage["total_tokens"] == usage["prompt_tokens"] + 6


async def test_no_auth_header_without_key(upstream: ScriptedUpstream) -> None:
    async with OpenAIChatProvider(upstream.url, None) as p:
        await collect(p)
    assert "Authorization" not in upstream.request_headers[-1]


async def test_done_ends_the_stream(raw_server, upstream: ScriptedUpstream) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(sse(chunk("a")) + b"data: [DONE]\n\n" + sse(chunk("after done")))
        await resp.write_eof()
        return resp

    async with OpenAIChatProvider(await raw_server(handler), KEY) as p:
        items = await collect(p)
    assert contents(items) == ["a"]  # ended at [DONE]: no finish reason needed, nothing after


async def test_missing_done_after_finish_ends_normally(raw_server) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(sse(chunk("a")) + sse(chunk(finish="length")))
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": {"total_tokens": 3}}).encode())  # no newline
        await resp.write_eof()
        return resp

    async with OpenAIChatProvider(await raw_server(handler), KEY) as p:
        items = await collect(p)
    assert contents(items) == ["a"]
    assert items[1].data["choices"][0]["finish_reason"] == "length"
    assert items[-1].data["usage"] == {"total_tokens": 3}  # last line without newline still parsed


async def test_comments_are_ignored(upstream: ScriptedUpstream, provider: OpenAIChatProvider) -> None:
    upstream.enqueue(Reply(chunks=["x", "y"], comments=True), Reply(chunks=["x", "y"]))
    with_comments = await collect(provider)
    without = await collect(provider)
    assert [type(i) for i in with_comments] == [type(i) for i in without]
    assert contents(with_comments) == ["x", "y"]
    assert len(with_comments) == len(without) == 5


async def test_crlf_and_lines_split_across_reads(raw_server) -> None:
    """CRLF endings, SSE fields we ignore, and bytes dribbled one at a time
    (splitting "data:", the JSON, a multi-byte character and CR from LF)."""
    payload = (
        b": hello\r\n\r\n"
        b"event: message\r\nid: 1\r\nretry: 1000\r\n"
        + b"data: "
        + json.dumps(chunk("h\u00e9llo \u2603"), ensure_ascii=False).encode()
        + b"\r\n\r\n"
        + b"data:"
        + json.dumps(chunk(" w\u00f6rld")).encode()
        + b"\r\n\r\n"
        + b"data: {broken\r\n\r\n"
        + b"data: "
        + json.dumps(chunk(finish="stop")).encode()
        + b"\r\n\r\n"
        + b"data: [DONE]\r\n\r\n"
    )

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        step = 1
        i = 0
        while i < len(payload):
            await resp.write(payload[i : i + step])
            await asyncio.sleep(0.0005)
            i += step
            step = step % 7 + 1  # 1..7-byte pieces
        await resp.write_eof()
        return resp

    async with OpenAIChatProvider(await raw_server(handler), KEY) as p:
        items = await collect_mixed(p)
    assert contents(items) == ["h\u00e9llo \u2603", " w\u00f6rld"]
    warnings = [i for i in items if isinstance(i, RawWarning)]
    assert len(warnings) == 1 and warnings[0].raw == "data: {broken"
    last = items[-1]
    assert isinstance(last, RawChunk) and last.data["choices"][0]["finish_reason"] == "stop"


def body_handler(payload: bytes) -> Handler:
    """Send ``payload`` in one write, then end the body."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(payload)
        await resp.write_eof()
        return resp

    return handler


def multiline(obj: dict) -> bytes:
    """``obj`` pretty-printed over several ``data:`` lines (one event)."""
    lines = json.dumps(obj, indent=2).encode().split(b"\n")
    return b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"


async def test_multiline_data_is_one_json_payload(raw_server) -> None:
    """The data lines of one event are one payload, joined with LF (the old
    per-line loop parsed each line alone: a warning for every line)."""
    first = b'data: {"id": "chatcmpl-raw", "object": "chat.completion.chunk",\ndata:  "choices": [{"index": 0,\n'
    first += b': a comment inside the event\nid: 4\ndata\ndata: "delta": {"content": "two lines"}, "finish_reason": null}]}\n\n'
    payload = first + multiline(chunk("pretty")) + multiline(chunk(finish="stop")) + b"data: [DONE]\n\n"
    async with OpenAIChatProvider(await raw_server(body_handler(payload)), KEY) as p:
        items = await collect(p)
    assert all(isinstance(i, RawChunk) for i in items)
    assert contents(items) == ["two lines", "pretty"]
    assert items[1].data == chunk("pretty") and items[-1].data["choices"][0]["finish_reason"] == "stop"


async def test_lone_cr_line_endings(raw_server) -> None:
    """CR alone ends a line too (the old framing split on LF only: one
    unparseable line, then upstream_truncated)."""
    payload = b": hi\r\r" + sse(chunk("a")) + sse(chunk("b")) + sse(chunk(finish="stop")) + b"data: [DONE]\n\n"
    async with OpenAIChatProvider(await raw_server(body_handler(payload.replace(b"\n", b"\r"))), KEY) as p:
        items = await collect(p)
    assert all(isinstance(i, RawChunk) for i in items)
    assert contents(items) == ["a", "b"] and items[-1].data["choices"][0]["finish_reason"] == "stop"


async def test_lines_cut_between_reads(raw_server) -> None:
    """Each piece is a separate read (tests.stepped): a ``data:`` prefix, a JSON
    payload and a CRLF are cut across reads, and a CRLF cut between CR and LF
    inside a multi-line event is one line end, not a blank line."""
    two, three = json.dumps(chunk("b")).encode(), json.dumps(chunk("c")).encode()
    steps = Stepped(
        sse(chunk("a")) + b"da",
        b"ta: " + two + b"\r\n\r\ndata: " + three[:20],
        three[20:] + b'\r\n\r\ndata: {"id": "chatcmpl-raw",\r',
        b'\ndata: "choices": [{"index": 0, "delta": {"content": "d"}, "finish_reason": "stop"}]}\r\n\r\ndata: [DONE]\r',
        b"\n\r\n",
    )
    async with OpenAIChatProvider(await raw_server(steps.handler), KEY, idle_timeout=5) as p:
        items = await steps.collect(p.stream(BODY))
    assert all(isinstance(i, RawChunk) for i in items)
    assert contents(items) == ["a", "b", "c", "d"]


async def test_comments_ids_retries_and_unknown_fields_change_nothing(raw_server) -> None:
    plain = sse(chunk("a")) + sse(chunk(finish="stop")) + b"data: [DONE]\n\n"
    noisy = (
        b"retry: 3000\n\n: keep-alive\n\nid: 1\nevent: message\n"
        + sse(chunk("a"))
        + b":\nid\nfoo: bar\n data: {}\ndata : {}\n\n"
        + sse(chunk(finish="stop"))
        + b": bye\n\ndata: [DONE]\n\n"
    )
    async with OpenAIChatProvider(await raw_server(body_handler(plain)), KEY) as p:
        expected = await collect(p)
    async with OpenAIChatProvider(await raw_server(body_handler(noisy)), KEY) as p:
        assert await collect(p) == expected


async def test_many_concurrent_streams(upstream: ScriptedUpstream) -> None:
    upstream.default = Reply(text="concurrent streams share one pooled session", chunk_size=5, delay=0.001)
    async with OpenAIChatProvider(upstream.url, KEY) as p:
        results = await asyncio.gather(*(collect(p) for _ in range(250)))
    assert all("".join(contents(r)) == "concurrent streams share one pooled session" for r in results)


# -- faults ------------------------------------------------------------------------


async def test_malformed_line_is_a_warning_and_stream_continues(upstream: ScriptedUpstream, provider: OpenAIChatProvider) -> None:
    upstream.enqueue(Reply(chunks=["a", "b", "c"], fault="malformed", fault_after=2))
    items = await collect_mixed(provider)
    kinds = [type(i).__name__ for i in items]
    assert kinds == ["RawChunk"] * 3 + ["RawWarning"] + ["RawChunk"] * 3
    warning = items[3]
    assert isinstance(warning, RawWarning)
    assert warning.raw == "data: {not json" and "not valid JSON" in warning.message
    assert contents(items) == ["a", "b", "c"]


async def test_malformed_raw_is_truncated(raw_server) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: " + b"x" * 5000 + b"\n\ndata: [1, 2]\n\n" + sse(chunk(finish="stop")))
        await resp.write_eof()
        return resp

    async with OpenAIChatProvider(await raw_server(handler), KEY) as p:
        items = await collect_mixed(p)
    assert isinstance(items[0], RawWarning) and len(items[0].raw) <= 500
    assert isinstance(items[1], RawWarning) and "not an object" in items[1].message
    assert isinstance(items[2], RawChunk)


async def test_http_500_is_an_http_error(upstream: ScriptedUpstream, provider: OpenAIChatProvider) -> None:
    upstream.enqueue(Reply(status=500, error_message="The server had an error while processing your request."))
    items, err = await collect_error(provider)
    assert items == []
    assert err.kind == "upstream_http_error" and err.status == 500
    assert "The server had an error while processing your request." in err.message
    assert "500" in str(err)


async def test_http_error_with_plain_text_body(raw_server) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(status=502, text="<html>Bad Gateway " + "z" * 2000 + "</html>")

    async with OpenAIChatProvider(await raw_server(handler), KEY) as p:
        _, err = await collect_error(p)
        assert err.kind == "upstream_http_error" and err.status == 502
        assert "Bad Gateway" in err.message and len(err.message) < 600
        with pytest.raises(UpstreamError) as info:
            await p.complete_chat(BODY)
        assert info.value.status == 502


async def test_error_object_inside_the_stream(raw_server) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(sse(chunk("a")) + sse({"error": {"message": "model overloaded", "code": 503}}))
        await resp.write_eof()
        return resp

    async with OpenAIChatProvider(await raw_server(handler), KEY) as p:
        items, err = await collect_error(p)
    assert contents(items) == ["a"]
    assert err.kind == "upstream_error" and "model overloaded" in err.message


async def test_disconnect_mid_body(upstream: ScriptedUpstream, provider: OpenAIChatProvider) -> None:
    upstream.enqueue(Reply(chunks=["a", "b", "c"], fault="disconnect", fault_after=2))
    items, err = await collect_error(provider)
    assert contents(items) == ["a", "b"]
    assert err.kind == "upstream_disconnected" and err.status is None


async def test_truncated_body(upstream: ScriptedUpstream, provider: OpenAIChatProvider) -> None:
    upstream.enqueue(Reply(chunks=["a", "b", "c"], fault="truncate", fault_after=1))
    items, err = await collect_error(provider)
    assert contents(items) == ["a"]
    assert err.kind == "upstream_truncated"


async def test_hang_hits_the_idle_timeout(upstream: ScriptedUpstream) -> None:
    upstream.enqueue(Reply(chunks=["a", "b"], fault="hang", fault_after=1))
    async with OpenAIChatProvider(upstream.url, KEY, idle_timeout=0.2) as p:
        loop = asyncio.get_running_loop()
        start = loop.time()
        items, err = await collect_error(p)
    assert contents(items) == ["a"]
    assert err.kind == "upstream_timeout"
    assert 0.15 < loop.time() - start < 2.0


async def test_slow_but_alive_stream_is_not_a_timeout(upstream: ScriptedUpstream) -> None:
    upstream.enqueue(Reply(chunks=["a", "b", "c", "d"], delay=0.1))
    async with OpenAIChatProvider(upstream.url, KEY, idle_timeout=0.25) as p:
        assert contents(await collect(p)) == ["a", "b", "c", "d"]  # 0.4 s total > idle_timeout


async def test_connection_refused() -> None:
    async with OpenAIChatProvider(f"http://127.0.0.1:{free_port()}/v1", KEY) as p:
        _, err = await collect_error(p)
        assert err.kind == "upstream_disconnected"
        for call in (p.complete_chat(BODY), p.list_models()):
            with pytest.raises(UpstreamError) as info:
                await call
            assert info.value.kind == "upstream_disconnected"


async def test_api_key_never_in_error_text(raw_server, upstream: ScriptedUpstream) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        return web.json_response({"error": {"message": f"Incorrect API key provided: {auth}"}}, status=401)

    errors: list[UpstreamError] = []
    async with OpenAIChatProvider(await raw_server(handler), KEY) as p:
        errors.append((await collect_error(p))[1])
        with pytest.raises(UpstreamError) as info:
            await p.complete_chat(BODY)
        errors.append(info.value)
    assert errors[0].status == 401 and "Incorrect API key provided" in errors[0].message

    upstream.enqueue(
        Reply(status=500, error_message=f"boom {KEY}"),
        Reply(chunks=["a", "b"], fault="disconnect", fault_after=1),
        Reply(fault="truncate", fault_after=99),  # past the last chunk: cut before the finish
        Reply(fault="hang"),
    )
    async with OpenAIChatProvider(upstream.url, KEY, idle_timeout=0.2) as p:
        for _ in range(4):
            errors.append((await collect_error(p))[1])
        assert KEY not in repr(p)
    async with OpenAIChatProvider(f"http://127.0.0.1:{free_port()}/v1", KEY) as p:
        errors.append((await collect_error(p))[1])

    assert [e.kind for e in errors[2:]] == [
        "upstream_http_error",
        "upstream_disconnected",
        "upstream_truncated",
        "upstream_timeout",
        "upstream_disconnected",
    ]
    for e in errors:
        assert KEY not in str(e) and KEY not in e.message and KEY not in repr(e)


# -- non-streaming and models -----------------------------------------------------


async def test_complete_chat(upstream: ScriptedUpstream, provider: OpenAIChatProvider) -> None:
    upstream.enqueue(Reply(text="All done.", reasoning=["hmm"], finish_reason="length"))
    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    result = await provider.complete_chat(body)
    assert result["object"] == "chat.completion"
    choice = result["choices"][0]
    assert choice["message"]["content"] == "All done." and choice["message"]["role"] == "assistant"
    assert choice["message"]["reasoning_content"] == "hmm"
    assert choice["finish_reason"] == "length"
    assert result["usage"]["total_tokens"] >= 1
    sent = upstream.requests[-1]
    assert sent["stream"] is False and "stream_options" not in sent
    assert body["stream"] is True  # caller's dict untouched


async def test_complete_chat_errors(upstream: ScriptedUpstream, provider: OpenAIChatProvider) -> None:
    upstream.enqueue(Reply(status=429, error_message="Rate limit reached"), Reply(fault="disconnect"), Reply(fault="malformed"))
    with pytest.raises(UpstreamError) as info:
        await provider.complete_chat(BODY)
    assert (info.value.kind, info.value.status) == ("upstream_http_error", 429)
    assert "Rate limit reached" in info.value.message
    with pytest.raises(UpstreamError) as info:
        await provider.complete_chat(BODY)
    assert info.value.kind == "upstream_disconnected"
    with pytest.raises(UpstreamError) as info:
        await provider.complete_chat(BODY)
    assert info.value.kind == "upstream_error"


async def test_list_models(provider: OpenAIChatProvider, upstream: ScriptedUpstream) -> None:
    upstream.models = ["gpt-test", "gpt-other"]
    models = await provider.list_models()
    assert [m["id"] for m in models] == ["gpt-test", "gpt-other"]
    assert all(m["object"] == "model" and m["owned_by"] == "scripted" for m in models)


async def test_caller_session_is_not_closed(upstream: ScriptedUpstream) -> None:
    async with aiohttp.ClientSession() as session:
        p = OpenAIChatProvider(upstream.url, KEY, session=session)
        assert contents(await collect(p))
        await p.close()
        assert not session.closed


# -- the scripted upstream itself ------------------------------------------------


async def test_prefill_continuation(upstream: ScriptedUpstream, provider: OpenAIChatProvider) -> None:
    upstream.enqueue(Reply(chunks=["The ", "quick ", "brown ", "fox"], reasoning=["r"]))
    body = {**BODY, "messages": [*BODY["messages"], {"role": "assistant", "content": "The qui"}]}
    items = await collect(provider, body)
    assert contents(items) == ["ck ", "brown ", "fox"]
    assert not any(i.data["choices"] and "reasoning_content" in i.data["choices"][0]["delta"] for i in items)

    upstream.enqueue(Reply(chunks=["Other ", "text"]))  # prefix does not match: whole reply
    assert contents(await collect(provider, body)) == ["Other ", "text"]


async def test_pause_and_release(upstream: ScriptedUpstream, provider: OpenAIChatProvider) -> None:
    upstream.enqueue(Reply(chunks=["a", "b", "c"], pause_after=2))
    got: list[str] = []

    async def consume() -> None:
        async for item in provider.stream(BODY):
            got.extend(contents([item]))

    task = asyncio.create_task(consume())
    await asyncio.wait_for(upstream.paused.wait(), 5)
    await until(lambda: len(got) >= 2, "the two chunks sent were read", within=5)
    assert got == ["a", "b"] and not task.done()
    upstream.release()
    await asyncio.wait_for(task, 5)
    assert got == ["a", "b", "c"] and not upstream.paused.is_set()


async def test_close_cuts_off_paused_streams() -> None:
    up = ScriptedUpstream(default=Reply(chunks=["a", "b"], pause_after=1))
    await up.start()
    async with OpenAIChatProvider(up.url, KEY) as p:
        task = asyncio.create_task(collect(p))
        await asyncio.wait_for(up.paused.wait(), 5)
        await asyncio.wait_for(up.close(), 5)
        with pytest.raises(UpstreamError) as info:
            await task
    assert info.value.kind == "upstream_disconnected"


def test_reply_validation() -> None:
    with pytest.raises(ValueError):
        Reply(fault="explode")
    with pytest.raises(ValueError):
        Reply(chunks=["a"], text="a")
    with pytest.raises(ValueError):
        Reply.from_dict({"txt": "typo"})
    assert Reply(text="abcdef", chunk_size=4).content_chunks() == ["abcd", "ef"]


async def test_standalone_process(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"chunks": ["from ", "a ", "process"]}, {"status": 503}]))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.upstream",
        "--port",
        "0",
        "--script",
        str(script),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        url = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        async with OpenAIChatProvider(url, KEY) as p:
            assert contents(await collect(p)) == ["from ", "a ", "process"]
            _, err = await collect_error(p)
            assert err.status == 503
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 10) == 0


# -- the bytes are real: the official SDK parses them ----------------------------


async def test_official_openai_sdk_parses_the_stream(upstream: ScriptedUpstream) -> None:
    upstream.enqueue(
        Reply(chunks=["Hello", " there", "!"]),
        Reply(
            chunks=["Let me check."],
            tool_calls=[{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call_1"}],
            finish_reason="tool_calls",
        ),
    )
    client = openai.AsyncOpenAI(base_url=upstream.url, api_key="x", max_retries=0)
    try:
        stream = await client.chat.completions.create(
            model="gpt-test",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        text, finish, usage, role = "", None, None, None
        async for ch in stream:
            if ch.usage is not None:
                usage = ch.usage
            for c in ch.choices:
                role = role or c.delta.role
                text += c.delta.content or ""
                finish = c.finish_reason or finish
        assert (role, text, finish) == ("assistant", "Hello there!", "stop")
        assert usage is not None and usage.completion_tokens == 3

        stream = await client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "weather?"}], stream=True)
        args, name, call_id = "", None, None
        async for ch in stream:
            assert ch.usage is None
            for c in ch.choices:
                for tc in c.delta.tool_calls or []:
                    assert tc.index == 0
                    name = name or (tc.function.name if tc.function else None)
                    call_id = call_id or tc.id
                    args += (tc.function.arguments or "") if tc.function else ""
                finish = c.finish_reason or finish
        assert (name, call_id, json.loads(args), finish) == ("get_weather", "call_1", {"city": "Paris"}, "tool_calls")

        completion = await client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hi"}])
        assert completion.choices[0].message.content == "Hello from the scripted upstream."
        models = await client.models.list()
        assert [m.id for m in models.data] == ["gpt-test"]
    finally:
        await client.close()


def accept_queue_full(port: int) -> bool:
    """Whether the IPv4 listener on ``port`` has a full accept queue (Linux:
    for a listening socket ``/proc/net/tcp`` shows the queued connections as
    rx_queue and the backlog as tx_queue; the kernel drops SYNs once
    queued > backlog)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].split(":")[1], 16) == port:
            backlog, queued = (int(n, 16) for n in fields[4].split(":"))
            return queued > backlog
    raise AssertionError(f"no listener on port {port}")


async def test_connect_timeout() -> None:
    """A listener whose accept queue is full drops SYNs, so connect() hangs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):  # fill the accept queue (backlog 0 holds one or two)
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            fillers.append(s)
        deadline = asyncio.get_running_loop().time() + 5
        while not accept_queue_full(port):  # the handshakes complete in the kernel
            assert asyncio.get_running_loop().time() < deadline, "the accept queue never filled"
            await asyncio.sleep(0.005)
        async with OpenAIChatProvider(f"http://127.0.0.1:{port}/v1", KEY, connect_timeout=0.3) as p:
            _, err = await collect_error(p)
        assert err.kind == "upstream_timeout" and "connect" in err.message
    finally:
        for s in fillers:
            s.close()
        listener.close()


async def test_long_line_in_many_small_reads(raw_server) -> None:
    big = "x" * 300_000  # > aiohttp's readline limit (128 KiB)

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        data = sse(chunk(big)) + sse(chunk("small")) + sse(chunk(finish="stop"))
        for i in range(0, len(data), 8192):
            await resp.write(data[i : i + 8192])
            await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    async with OpenAIChatProvider(await raw_server(handler), KEY) as p:
        items = await collect(p)
    assert contents(items) == [big, "small"]
