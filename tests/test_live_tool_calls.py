"""Tool calls visible while the model writes them.

The scripted upstream streams a call's arguments in fragments and stops before
the last one until the test releases it; the test releases it only after its
client has read the first fragment, so a pass proves the client saw the call
(``in_progress``) and its first argument fragment while the model was still
writing it. Each stream is then held against the log: the SSE body against
the fold of every prefix (tests/oracle.py), the WebSocket's fragments against
the recorded ``tool_arguments`` windows, and every turn through ``turnlog
verify`` (the engine re-run on the recorded results appends the same events)
when the service stops.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.harness import Service, make_settings, start_service, stop_service
from tests.oracle import check_stream_against_log, read_stream
from tests.tools_fixtures import write_tools
from tests.upstream import Reply, ScriptedUpstream

pytestmark = pytest.mark.live_paths

USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is 2 + 3?"}]
ARGUMENTS = '{"a": 2, "b": 3}'  # four fragments of four characters


def slow_call(call_id: str = "call_add", name: str = "add") -> Reply:
    return Reply(
        tool_calls=[{"name": name, "arguments": ARGUMENTS, "id": call_id}],
        finish_reason="tool_calls",
        chunk_size=4,
        pause_before_last_argument=True,
    )


@pytest.fixture
async def service(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, live_path: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Service]:
    monkeypatch.setenv("TURNLOG_TEST_TOOL_LOG", str(tmp_path / "tool.log"))
    tools = write_tools(tmp_path / "tools")
    settings = make_settings(tmp_path, upstream.url, tools_dir=str(tools), database_url=database_url, live_fast_paths=live_path == "fast")
    svc = await start_service(settings, upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


def _payload(block: bytes) -> dict[str, Any] | None:
    for line in block.decode().split("\n"):
        if line.startswith("data: {"):
            return dict(json.loads(line[6:]))
    return None


async def _read_until_first_fragment(resp: aiohttp.ClientResponse) -> tuple[bytes, list[dict[str, Any]]]:
    """The SSE body up to and including the first ``turnlog.tool_arguments``
    chunk, and the ``turnlog`` extensions read on the way."""
    raw = b""
    seen: list[dict[str, Any]] = []
    while True:
        block = await resp.content.readuntil(b"\n\n")
        assert block, "the stream ended before any argument fragment"
        raw += block
        payload = _payload(block)
        ext = (payload or {}).get("turnlog") or {}
        if ext:
            seen.append(ext)
        if "tool_arguments" in ext:
            return raw, seen


async def test_sse_shows_the_call_in_progress_and_its_arguments_as_they_stream(service: Service) -> None:
    up = service.upstream
    up.enqueue(slow_call(), Reply(text="It is 5."))
    body = {"model": "gpt-test", "messages": USER, "tool_ids": ["weather"], "stream": True}
    async with service.http.post(service.v1 + "/chat/completions", json=body, headers=service.headers) as resp:
        assert resp.status == 200
        turn_id = resp.headers["X-Turn-Id"]
        head, seen = await asyncio.wait_for(_read_until_first_fragment(resp), 10)
        # The model has not written the last fragment yet (it waits for us).
        assert up.paused.is_set()
        items = [e["item"] for e in seen if "item" in e]
        assert items[-1] == {"type": "function_call", "id": "call_add", "call_id": "call_add", "name": "add", "arguments": "", "status": "in_progress"}
        assert seen[-1] == {"tool_arguments": {"call_id": "call_add", "delta": ARGUMENTS[:4]}}
        up.release()
        raw = head + await resp.content.read()
    exts = [p.get("turnlog") or {} for p in map(_payload, raw.split(b"\n\n")) if p]
    fragments = [e["tool_arguments"]["delta"] for e in exts if "tool_arguments" in e]
    assert fragments == [ARGUMENTS[i : i + 4] for i in range(0, len(ARGUMENTS), 4)]
    done = [e["item"] for e in exts if e.get("item", {}).get("type") == "function_call" and e["item"]["status"] != "in_progress"]
    assert done[0]["arguments"] == ARGUMENTS
    # Replay equals live: what the client was sent at each position is what
    # the log folds to there (the fragments appended to the call they name),
    # for this client and for one that follows the finished turn.
    await check_stream_against_log(service, turn_id, raw.decode())
    async with service.http.get(f"{service.v1}/turns/{turn_id}/stream", headers={**service.headers, "Last-Event-ID": "0"}) as again:
        replayed = await again.text()
    await check_stream_against_log(service, turn_id, replayed)
    assert replayed.split("data: [DONE]")[0] == raw.decode().split("data: [DONE]")[0]


async def test_websocket_gets_the_item_event_then_argument_deltas(service: Service) -> None:
    up = service.upstream
    up.enqueue(slow_call(), Reply(text="It is 5."))
    messages: list[dict[str, Any]] = []
    async with service.http.ws_connect(service.v1 + "/ws", headers=service.headers) as ws:
        await ws.send_json({"type": "chat", "request": {"model": "gpt-test", "messages": USER, "tool_ids": ["weather"]}})

        async def until(done: Any) -> None:
            while True:
                messages.append(await ws.receive_json())
                if done(messages[-1]):
                    return

        await asyncio.wait_for(until(lambda m: m["type"] == "delta" and m["kind"] == "tool_arguments"), 10)
        assert up.paused.is_set()
        up.release()
        await asyncio.wait_for(until(lambda m: m["type"] == "event" and m["event"]["type"] == "turn.completed"), 10)
    turn_id = messages[0]["turn_id"]
    announced = next(i for i, m in enumerate(messages) if m["type"] == "event" and m["event"]["type"] == "model.item")
    assert messages[announced]["event"]["data"]["item"]["status"] == "in_progress"
    deltas = [m for m in messages if m["type"] == "delta" and m["kind"] == "tool_arguments"]
    assert [m["call_id"] for m in deltas] == ["call_add"] * 4
    assert "".join(m["content"] for m in deltas) == ARGUMENTS
    assert messages.index(deltas[0]) > announced
    # The fragments are the log's tool_arguments windows, at their positions.
    logged = [e for e in await service.events(turn_id) if e["type"] == "model.delta" and e["data"]["kind"] == "tool_arguments"]
    recorded = []
    for event in logged:
        d = event["data"]
        assert d["call_id"] == "call_add"
        offset = 0
        for i, n in enumerate(d["lens"]):
            recorded.append((event["seq"], d["pos"] + i, d["text"][offset : offset + n]))
            offset += n
    assert [(m["seq"], m["pos"], m["content"]) for m in deltas] == recorded
    view = await service.turn(turn_id)
    calls = [i for i in view["output"] if i["type"] == "function_call"]
    assert [(c["call_id"], c["arguments"], c["status"]) for c in calls] == [("call_add", ARGUMENTS, "completed")]


async def test_streamed_arguments_keep_the_log_compact(service: Service) -> None:
    """A call's argument fragments are group-committed like text: the windows,
    the announce and the whole call together stay within 3x the call's bytes."""
    arguments = json.dumps({"q": " ".join(f"word{i}" for i in range(600))})  # ~5,000 bytes, ~1,200 fragments
    service.upstream.enqueue(
        Reply(tool_calls=[{"name": "search", "arguments": arguments, "id": "call_s"}], finish_reason="tool_calls", chunk_size=4),
        Reply(text="Found."),
    )
    status, body, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "tool_ids": ["weather"]})
    assert status == 200, body
    events = await service.events(headers["X-Turn-Id"])
    windows = [e for e in events if e["type"] == "model.delta" and e["data"]["kind"] == "tool_arguments"]
    items = [e for e in events if e["type"] == "model.item"]
    assert "".join(e["data"]["text"] for e in windows) == arguments
    fragments = sum(len(e["data"]["lens"]) for e in windows)
    assert len(windows) < fragments / 10, "fragments are batched, not one event per fragment"
    log_bytes = sum(len(json.dumps(e["data"], separators=(",", ":"))) for e in windows + items)
    assert log_bytes <= 3 * len(arguments.encode())


async def test_responses_api_streams_a_function_call_while_the_model_writes_it(service: Service) -> None:
    """The real ``openai`` SDK on ``POST /v1/responses`` with a client function
    tool: ``output_item.added`` (in_progress) and the first arguments delta
    arrive before the model has written the last fragment."""
    tool: Any = {"type": "function", "name": "add", "description": "Adds", "parameters": {"type": "object", "properties": {}}}
    up = service.upstream
    up.enqueue(slow_call())
    sdk = openai.AsyncOpenAI(base_url=service.v1, api_key="unused", max_retries=0)
    stream = await sdk.responses.create(model="gpt-test", input="What is 2 + 3?", tools=[tool], stream=True)
    live: list[Any] = []

    async def until(kind: str) -> None:
        async for event in stream:
            live.append(event)
            if event.type == kind:
                return

    await asyncio.wait_for(until("response.function_call_arguments.delta"), 10)
    assert up.paused.is_set()
    up.release()
    await asyncio.wait_for(until("response.completed"), 10)
    types = [e.type for e in live if e.type.startswith(("response.output_item", "response.function_call"))]
    assert types == [
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * 4,
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    added = next(e for e in live if e.type == "response.output_item.added")
    assert (added.item.type, added.item.status, added.item.call_id, added.item.arguments) == ("function_call", "in_progress", "call_add", "")
    deltas = [e for e in live if e.type == "response.function_call_arguments.delta"]
    assert all(d.item_id == added.item.id for d in deltas) and "".join(d.delta for d in deltas) == ARGUMENTS
    final = live[-1].response
    assert [(i.call_id, i.arguments, i.status) for i in final.output if i.type == "function_call"] == [("call_add", ARGUMENTS, "completed")]
    # Replay gives the same sequence.
    replayed = [e async for e in await sdk.responses.retrieve(final.id, stream=True)]
    assert [e.model_dump() for e in replayed] == [e.model_dump() for e in live]


async def test_chat_completions_streams_a_client_tool_call_as_openai_does(service: Service) -> None:
    """The real ``openai`` SDK on a Chat Completions stream with a tool of the
    client's own: the call's ``tool_calls`` deltas arrive as the model writes
    them (id and name first, then each fragment), not all at the end."""
    tool: Any = {"type": "function", "function": {"name": "multiply", "parameters": {"type": "object", "properties": {}}}}
    up = service.upstream
    up.enqueue(slow_call("call_mul", "multiply"))
    sdk = openai.AsyncOpenAI(base_url=service.v1, api_key="unused", max_retries=0)
    stream = await sdk.chat.completions.create(model="gpt-test", messages=USER, tools=[tool], stream=True)
    deltas: list[Any] = []
    finish = None

    async def until_first_fragment() -> None:
        async for chunk in stream:
            for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                deltas.append(call)
                if call.function and call.function.arguments:
                    return

    await asyncio.wait_for(until_first_fragment(), 10)
    assert up.paused.is_set()
    up.release()
    async for chunk in stream:
        if chunk.choices:
            deltas.extend(chunk.choices[0].delta.tool_calls or [])
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert (deltas[0].index, deltas[0].id, deltas[0].function.name, deltas[0].function.arguments) == (0, "call_mul", "multiply", "")
    fragments = [d.function.arguments for d in deltas[1:]]
    assert all(d.index == 0 for d in deltas) and fragments == [ARGUMENTS[i : i + 4] for i in range(0, len(ARGUMENTS), 4)]
    # A client reading the finished turn from the log gets the same deltas.
    turn_id = (await service.get("/v1/turns?limit=1"))[1]["data"][0]["id"]
    raw = await read_stream(service, turn_id)
    await check_stream_against_log(service, turn_id, raw)
    replayed = [call for p in map(_payload, raw.encode().split(b"\n\n")) if p and p.get("choices") for call in p["choices"][0]["delta"].get("tool_calls") or []]
    assert replayed == [d.model_dump(exclude_none=True) for d in deltas]


async def test_a_call_cut_off_by_a_cancel_ends_incomplete(service: Service) -> None:
    """Cancelled while the model writes a call: the call it announced ends
    ``incomplete`` with the arguments written so far, live and in the log."""
    up = service.upstream
    up.enqueue(slow_call())
    body = {"model": "gpt-test", "messages": USER, "tool_ids": ["weather"], "stream": True}
    async with service.http.post(service.v1 + "/chat/completions", json=body, headers=service.headers) as resp:
        turn_id = resp.headers["X-Turn-Id"]
        head, _ = await asyncio.wait_for(_read_until_first_fragment(resp), 10)
        status, _, _ = await service.post(f"/v1/turns/{turn_id}/cancel")
        assert status == 202
        raw = head + await asyncio.wait_for(resp.content.read(), 10)
    up.release()
    written = ARGUMENTS[: len(ARGUMENTS) - 4]  # all but the fragment the model never sent
    view = await service.wait_status(turn_id, "cancelled")
    calls = [(i["call_id"], i["arguments"], i["status"]) for i in view["output"] if i["type"] == "function_call"]
    assert calls == [("call_add", written, "incomplete")]
    await check_stream_against_log(service, turn_id, raw.decode())
