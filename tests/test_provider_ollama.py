"""OllamaProvider against real sockets: the ScriptedUpstream (``/api/chat``) and raw handlers."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from adapters.providers.ollama import OllamaProvider
from engine.ports import RawChunk, RawWarning, UpstreamError
from tests.polling import until
from tests.upstream import Reply, ScriptedUpstream

BODY = {"model": "llama3.2", "messages": [{"role": "user", "content": "Say hello"}]}


@pytest.fixture
async def upstream() -> AsyncIterator[ScriptedUpstream]:
    async with ScriptedUpstream(models=["llama3.2:latest", "qwen3:0.6b"]) as up:
        yield up


@pytest.fixture
async def provider(upstream: ScriptedUpstream) -> AsyncIterator[OllamaProvider]:
    assert upstream.root is not None
    p = OllamaProvider(upstream.root, idle_timeout=5.0)
    yield p
    await p.close()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
def raw_server(handler_server: Callable[..., Awaitable[str]]) -> Callable[[Handler], Awaitable[str]]:
    """One hand-written handler at ``/api/chat``; returns the provider's base URL."""
    return lambda handler: handler_server(handler, "/api/chat", "")


def ndjson_handler(payload: bytes, *, abort: bool = False) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
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


def line(content: str = "", *, done: bool = False, **extra) -> bytes:
    obj = {"model": "m", "created_at": "2025-01-01T00:00:00Z", "message": {"role": "assistant", "content": content}, "done": done, **extra}
    return json.dumps(obj).encode() + b"\n"


async def collect_mixed(provider: OllamaProvider, body: dict = BODY) -> list[RawChunk | RawWarning]:
    return [item async for item in provider.stream(body)]


async def collect(provider: OllamaProvider, body: dict = BODY) -> list[RawChunk]:
    """The stream's chunks, where the test expects no warning among them."""
    items = await collect_mixed(provider, body)
    chunks = [i for i in items if isinstance(i, RawChunk)]
    assert len(chunks) == len(items), f"unexpected warnings: {items}"
    return chunks


async def collect_error(provider: OllamaProvider, body: dict = BODY) -> tuple[list, UpstreamError]:
    items: list = []
    with pytest.raises(UpstreamError) as info:
        async for item in provider.stream(body):
            items.append(item)
    return items, info.value


def contents(items: list) -> list[str]:
    return [i.data["message"]["content"] for i in items if isinstance(i, RawChunk) and not i.data.get("done") and i.data.get("message", {}).get("content")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the happy path ----------------------------------------------------------------


async def test_text_stream(upstream: ScriptedUpstream, provider: OllamaProvider) -> None:
    upstream.enqueue(Reply(chunks=["Hel", "lo ✓"], usage={"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}))
    body = {**BODY, "options": {"temperature": 0.2}}
    snapshot = json.loads(json.dumps(body))
    items = await collect(provider, body)

    assert all(isinstance(i, RawChunk) for i in items)
    assert contents(items) == ["Hel", "lo ✓"]
    for item in items[:-1]:
        assert item.data["done"] is False and item.data["model"] == "llama3.2"
        assert item.data["message"]["role"] == "assistant" and item.data["created_at"].endswith("Z")
    last = items[-1].data
    assert last["done"] is True and last["done_reason"] == "stop" and last["message"]["content"] == ""
    assert (last["prompt_eval_count"], last["eval_count"]) == (7, 2)
    assert all(isinstance(last[k], int) for k in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"))

    assert body == snapshot
    sent = upstream.requests[-1]
    assert sent["stream"] is True and sent["messages"] == BODY["messages"] and sent["options"] == {"temperature": 0.2}
    assert upstream.request_paths[-1] == "/api/chat"
    assert "Authorization" not in upstream.request_headers[-1]


async def test_thinking_tool_calls_and_length(upstream: ScriptedUpstream, provider: OllamaProvider) -> None:
    upstream.enqueue(
        Reply(
            chunks=["Checking."],
            reasoning=["The user ", "wants weather."],
            tool_calls=[
                {"name": "get_weather", "arguments": {"city": "Paris"}},
                {"name": "get_time", "arguments": '{"tz": "UTC"}'},
            ],
            finish_reason="length",
        )
    )
    items = await collect(provider)
    thinking = [i.data["message"].get("thinking") for i in items]
    assert [t for t in thinking if t] == ["The user ", "wants weather."]
    assert contents(items) == ["Checking."]
    calls = [i.data["message"]["tool_calls"] for i in items if "tool_calls" in i.data["message"]]
    assert calls == [
        [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"function": {"name": "get_time", "arguments": {"tz": "UTC"}}},
        ]
    ]  # whole, in one line, arguments as objects
    assert items[-1].data["done_reason"] == "length"


async def test_default_usage_counts(upstream: ScriptedUpstream, provider: OllamaProvider) -> None:
    upstream.enqueue(Reply(text="abcdef", chunk_size=2, reasoning=["r"]))
    last = (await collect(provider))[-1].data
    assert last["eval_count"] == 4 and last["prompt_eval_count"] >= 1


async def test_prefill_continuation(upstream: ScriptedUpstream, provider: OllamaProvider) -> None:
    upstream.enqueue(Reply(chunks=["The ", "quick ", "fox"]))
    body = {**BODY, "messages": [*BODY["messages"], {"role": "assistant", "content": "The qu"}]}
    assert contents(await collect(provider, body)) == ["ick ", "fox"]


async def test_many_concurrent_streams(upstream: ScriptedUpstream) -> None:
    upstream.default = Reply(text="concurrent ollama streams", chunk_size=5, delay=0.001)
    assert upstream.root is not None
    async with OllamaProvider(upstream.root) as p:
        results = await asyncio.gather(*(collect(p) for _ in range(100)))
    assert all("".join(contents(r)) == "concurrent ollama streams" for r in results)


# -- faults ------------------------------------------------------------------------


async def test_malformed_line_is_a_warning(upstream: ScriptedUpstream, provider: OllamaProvider) -> None:
    upstream.enqueue(Reply(chunks=["a", "b"], fault="malformed", fault_after=1))
    items = await collect_mixed(provider)
    assert [type(i).__name__ for i in items] == ["RawChunk", "RawWarning", "RawChunk", "RawChunk"]
    warning, last = items[1], items[-1]
    assert isinstance(warning, RawWarning) and isinstance(last, RawChunk)
    assert warning.raw == "{not json" and "not valid JSON" in warning.message
    assert contents(items) == ["a", "b"] and last.data["done"] is True


async def test_disconnect_mid_body(upstream: ScriptedUpstream, provider: OllamaProvider) -> None:
    upstream.enqueue(Reply(chunks=["a", "b", "c"], fault="disconnect", fault_after=2))
    items, err = await collect_error(provider)
    assert contents(items) == ["a", "b"] and err.kind == "upstream_disconnected" and err.status is None


async def test_truncated_body(upstream: ScriptedUpstream, provider: OllamaProvider) -> None:
    upstream.enqueue(Reply(chunks=["a", "b"], fault="truncate", fault_after=1), Reply(chunks=["a"], fault="truncate", fault_after=5))
    items, err = await collect_error(provider)
    assert contents(items) == ["a"] and err.kind == "upstream_truncated"
    items, err = await collect_error(provider)  # after the last chunk, before the done line
    assert contents(items) == ["a"] and err.kind == "upstream_truncated"


async def test_hang_hits_the_idle_timeout(upstream: ScriptedUpstream) -> None:
    upstream.enqueue(Reply(chunks=["a", "b"], fault="hang", fault_after=1))
    assert upstream.root is not None
    async with OllamaProvider(upstream.root, idle_timeout=0.2) as p:
        loop = asyncio.get_running_loop()
        start = loop.time()
        items, err = await collect_error(p)
    assert contents(items) == ["a"] and err.kind == "upstream_timeout"
    assert 0.15 < loop.time() - start < 2.0


async def test_pause_and_release(upstream: ScriptedUpstream, provider: OllamaProvider) -> None:
    upstream.enqueue(Reply(chunks=["a", "b", "c"], pause_after=1))
    task = asyncio.create_task(collect(provider))
    await asyncio.wait_for(upstream.paused.wait(), 5)
    assert not task.done()
    upstream.release()
    assert contents(await asyncio.wait_for(task, 5)) == ["a", "b", "c"]


async def test_http_error(upstream: ScriptedUpstream, provider: OllamaProvider) -> None:
    upstream.enqueue(Reply(status=404, error_message='model "nope" not found, try pulling it first'), Reply(status=500))
    items, err = await collect_error(provider)
    assert items == [] and (err.kind, err.status) == ("upstream_http_error", 404)
    assert 'model "nope" not found, try pulling it first' in err.message
    with pytest.raises(UpstreamError) as info:
        await provider.complete(BODY)
    assert (info.value.kind, info.value.status) == ("upstream_http_error", 500)
    assert "scripted failure" in info.value.message


async def test_error_object_inside_the_stream(raw_server) -> None:
    payload = line("a") + json.dumps({"error": "an error was encountered while running the model"}).encode() + b"\n"
    async with OllamaProvider(await raw_server(ndjson_handler(payload))) as p:
        items, err = await collect_error(p)
    assert contents(items) == ["a"]
    assert err.kind == "upstream_error" and "an error was encountered while running the model" in err.message


async def test_blank_lines_crlf_and_non_objects(raw_server) -> None:
    payload = (line("a") + b"\n" + b"[1, 2]\n" + line("b") + line(done=True, done_reason="stop")).replace(b"\n", b"\r\n")
    async with OllamaProvider(await raw_server(ndjson_handler(payload))) as p:
        items = await collect_mixed(p)
    assert [type(i).__name__ for i in items] == ["RawChunk", "RawWarning", "RawChunk", "RawChunk"]
    warning = items[1]
    assert isinstance(warning, RawWarning)
    assert "not an object" in warning.message and warning.raw == "[1, 2]"
    assert contents(items) == ["a", "b"]


async def test_done_line_without_newline_and_lost_connection_after_done(raw_server) -> None:
    payload = line("a") + line(done=True).rstrip(b"\n")
    async with OllamaProvider(await raw_server(ndjson_handler(payload))) as p:
        assert (await collect(p))[-1].data["done"] is True
    async with OllamaProvider(await raw_server(ndjson_handler(line("a") + line(done=True), abort=True))) as p:
        items = await collect(p)  # the reply was complete: a normal end
    assert contents(items) == ["a"] and items[-1].data["done"] is True


async def test_connection_refused() -> None:
    async with OllamaProvider(f"http://127.0.0.1:{free_port()}") as p:
        _, err = await collect_error(p)
        assert err.kind == "upstream_disconnected"
        with pytest.raises(UpstreamError) as info:
            await p.list_models()
        assert info.value.kind == "upstream_disconnected"


# -- non-streaming and models -------------------------------------------------------


async def test_complete(upstream: ScriptedUpstream, provider: OllamaProvider) -> None:
    upstream.enqueue(Reply(text="All done.", reasoning=["hmm"], tool_calls=[{"name": "f", "arguments": {"x": 1}}]))
    result = await provider.complete({**BODY, "stream": True})
    assert result["done"] is True and result["done_reason"] == "stop"
    assert result["message"] == {
        "role": "assistant",
        "content": "All done.",
        "thinking": "hmm",
        "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}],
    }
    assert upstream.requests[-1]["stream"] is False


async def test_list_models(provider: OllamaProvider, upstream: ScriptedUpstream) -> None:
    models = await provider.list_models()
    assert models == [
        {"id": "llama3.2:latest", "object": "model", "owned_by": "ollama", "created": 0},
        {"id": "qwen3:0.6b", "object": "model", "owned_by": "ollama", "created": 0},
    ]
    assert OllamaProvider.api == "ollama"


async def test_root_and_api_key(upstream: ScriptedUpstream) -> None:
    assert upstream.url == f"{upstream.root}/v1"
    async with OllamaProvider(upstream.root + "/", api_key="sk-proxy-secret") as p:
        assert p.base_url == upstream.root and "secret" not in repr(p)
        await collect(p)
    assert upstream.request_headers[-1]["Authorization"] == "Bearer sk-proxy-secret"
