"""turnlog in front of a real model server: llama-cpp-python's, serving SmolLM2-135M.

Every other upstream in the suite is ours (tests.upstream); this one is not:
its bytes, its quirks (no usage in streams, whatever ``include_usage`` says)
and its generation (a process that really computes tokens) are the real
thing. Greedy decoding (temperature 0, a seed) makes its answers exact, so
the oracle for an answer through turnlog is the same request sent straight to
the server. The server comes from ``tests.llama_server`` (the ``real-model``
extra; skipped without it on a developer machine, a failure in CI).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from tests.fault_clients import kept_text
from tests.harness import Service, make_settings, sse_text, start_service, stop_service
from tests.llama_server import MODEL_ID, LlamaServer
from tests.processes import Server, get_json, wait_for

GREEDY: dict[str, Any] = {"temperature": 0, "seed": 7, "max_tokens": 24}
QUESTION: list[Any] = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


@pytest.fixture
async def real(tmp_path: Path, llama_server: LlamaServer) -> AsyncIterator[Service]:
    """turnlog (in this process, on SQLite) with the llama server as its only upstream;
    stopping it verifies every turn (the engine re-run against the log)."""
    svc = await start_service(make_settings(tmp_path, llama_server.url), None)
    try:
        yield svc
    finally:
        await stop_service(svc)


def sdk(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)


async def direct_answer(server: LlamaServer, messages: list[Any], **params: Any) -> tuple[str, dict[str, Any]]:
    """The server's own answer to ``messages`` and its usage, without turnlog."""
    completion = await sdk(server.url).chat.completions.create(model=MODEL_ID, messages=messages, **{**GREEDY, **params})
    assert completion.usage is not None
    return completion.choices[0].message.content or "", completion.usage.model_dump()


def cl100k_close(estimated: int, reported: int) -> bool:
    """An estimate in cl100k tokens against the model's own count (SmolLM2's
    tokenizer, also a BPE for English): the same order of magnitude."""
    return reported / 2 <= estimated <= reported * 2


async def test_plain_and_streamed_chat_answer_what_the_server_answers(real: Service, llama_server: LlamaServer) -> None:
    expected, server_usage = await direct_answer(llama_server, QUESTION)
    assert expected.strip(), "the model answered something"
    client = sdk(real.v1)

    plain = await client.chat.completions.with_raw_response.create(model=MODEL_ID, messages=QUESTION, **GREEDY)
    body = json.loads(plain.text)
    assert body["choices"][0]["message"]["content"] == expected
    turn = await real.turn(plain.headers["X-Turn-Id"])
    assert turn["status"] == "completed" and turn["content"] == expected
    # The server sent no usage in its stream: turnlog counted it (cl100k), and says so.
    usage = body["usage"]
    assert body["usage_estimated"] is True and turn["usage_estimated"] is True
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert cl100k_close(usage["prompt_tokens"], server_usage["prompt_tokens"]), (usage, server_usage)
    assert cl100k_close(usage["completion_tokens"], server_usage["completion_tokens"]), (usage, server_usage)

    async with real.http.post(
        real.v1 + "/chat/completions", json={"model": MODEL_ID, "messages": QUESTION, "stream": True, "stream_options": {"include_usage": True}, **GREEDY}
    ) as resp:
        assert resp.status == 200
        raw = await resp.text()
        turn_id = resp.headers["X-Turn-Id"]
    assert sse_text(raw) == expected
    assert (await real.turn(turn_id))["content"] == expected  # what is stored is what the client got
    usage_chunks = [json.loads(d[6:]) for d in raw.split("\n") if d.startswith("data: {") and '"usage":{' in d]
    assert [(c["usage"], c["usage_estimated"]) for c in usage_chunks] == [(usage, True)]  # the same request: the same count


async def test_responses_api_over_the_server(real: Service, llama_server: LlamaServer) -> None:
    expected, _ = await direct_answer(llama_server, QUESTION)
    raw = await sdk(real.v1).responses.with_raw_response.create(
        model=MODEL_ID, input=QUESTION[0]["content"], temperature=0, max_output_tokens=GREEDY["max_tokens"], extra_body={"seed": GREEDY["seed"]}
    )
    response = raw.parse()
    assert response.status == "completed" and response.output_text == expected
    body = json.loads(raw.text)
    assert body["usage_estimated"] is True and body["usage"]["output_tokens"] > 0
    turn = await real.turn(body["turnlog"]["turn_id"])
    assert turn["content"] == expected


async def test_a_websocket_turn(real: Service, llama_server: LlamaServer) -> None:
    expected, _ = await direct_answer(llama_server, QUESTION)
    texts: list[str] = []
    async with real.http.ws_connect(real.v1 + "/ws") as ws:
        await ws.send_json({"type": "chat", "deltas": False, "request": {"model": MODEL_ID, "messages": QUESTION, **GREEDY}})
        started = await ws.receive_json()
        assert started["type"] == "turn", started
        while True:
            msg = await ws.receive_json()
            assert msg["type"] == "event", msg
            event = msg["event"]
            if event["type"] == "model.delta":
                texts.append(event["data"]["text"])
            if event["type"] == "turn.completed":
                break
    assert "".join(texts) == expected
    assert (await real.turn(started["turn_id"]))["content"] == expected


IDLE = 0.02  # cores


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def cpu_rate(pid: int, seconds: float) -> float:
    """The process's CPU use (cores) over the next ``seconds``."""
    start, before = time.monotonic(), cpu_seconds(pid)
    await asyncio.sleep(seconds)  # a measurement window, not synchronization
    return (cpu_seconds(pid) - before) / (time.monotonic() - start)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads CPU times from /proc")
async def test_cancel_mid_answer_stops_the_generation(real: Service, llama_server: LlamaServer) -> None:
    story = [{"role": "user", "content": "Write a very long story about a dragon and a knight."}]
    body = {"model": MODEL_ID, "messages": story, "stream": True, **GREEDY, "max_tokens": 2000}
    async with real.http.post(real.v1 + "/chat/completions", json=body) as resp:
        turn_id = resp.headers["X-Turn-Id"]
        async for line in resp.content:  # until the answer has started
            if line.startswith(b"data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                break
        busy = await cpu_rate(llama_server.pid, 0.5)
        cancelled_at = time.monotonic()
        status, answer, _ = await real.post(f"/v1/turns/{turn_id}/cancel")
        assert status == 202 and answer["status"] == "cancelled", answer
        await resp.read()
    view = await real.wait_status(turn_id, "cancelled")
    assert view["content"], "it had answered something"
    # Idle, the server's process uses nothing; generating, one thread (less
    # on a loaded machine: the other tests' processes share the cores).
    assert busy > IDLE * 3, f"the server was generating: {busy:.2f} cores"
    # Within 2 s of the cancel, the server's CPU falls to idle: it stopped generating.
    rates = []
    while time.monotonic() - cancelled_at < 2.0:
        rates.append(await cpu_rate(llama_server.pid, 0.25))
        if rates[-1] < IDLE:
            break
    assert rates[-1] < IDLE, f"the server still computes after the cancel: {[round(r, 2) for r in rates]} cores"


WEATHER_TOOL = """
class Tools:
    def get_weather(self, city: str) -> str:
        \"\"\"The current weather of a city.

        :param city: the city's name
        \"\"\"
        return f"{city}: sunny and 21 degrees"
"""


class Relay:
    """An HTTP relay to the model server that keeps each request body: what
    turnlog really sent (the server's chat format shows nothing of it)."""

    def __init__(self, target: str) -> None:
        self.target = target.removesuffix("/v1")
        self.requests: list[dict[str, Any]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self.relay)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/v1"

    async def relay(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if body:
            self.requests.append(json.loads(body))
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with aiohttp.ClientSession() as http, http.request(request.method, self.target + request.path_qs, data=body or None, headers=headers) as up:
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": up.headers.get("Content-Type", "application/json")})
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def relayed(tmp_path: Path, llama_server: LlamaServer) -> AsyncIterator[tuple[Service, Relay]]:
    """turnlog with a server tool module (``weather``), its upstream the model server behind a relay."""
    relay = Relay(llama_server.url)
    await relay.start()
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "weather.py").write_text(WEATHER_TOOL)
    svc = await start_service(make_settings(tmp_path, relay.url, tools_dir=str(tools)), None)
    try:
        yield svc, relay
    finally:
        await stop_service(svc)
        await relay.close()


WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


async def test_native_tools_with_a_named_tool_choice(relayed: tuple[Service, Relay]) -> None:
    """``chatml-function-calling`` with ``tool_choice`` naming the tool: the
    model calls it (the server constrains the arguments to its schema), the
    tool runs, its result goes to the next call, which answers: the loop ends."""
    real, relay = relayed
    choice = {"type": "function", "function": {"name": "get_weather"}}
    body = {"model": MODEL_ID, "messages": WEATHER_QUESTION, "tool_ids": ["weather"], "tool_choice": choice, **GREEDY}
    status, answer, headers = await real.post("/v1/chat/completions", body)
    assert status == 200, answer
    view = await real.turn(headers["X-Turn-Id"])
    # The loop ended on an answer (its end: the model's stop or max_tokens), not on another call.
    assert view["status"] == "completed" and view["finish_reason"] in ("stop", "length")
    calls = [i for i in view["output"] if i["type"] == "function_call"]
    outputs = [i for i in view["output"] if i["type"] == "function_call_output"]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert [o["output"] for o in outputs] == ["Paris: sunny and 21 degrees"]
    first, second = relay.requests  # two model calls: the loop ended on an answer
    assert first["tool_choice"] == choice and "tool_choice" not in second and second["tools"] == first["tools"]
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": calls[0]["call_id"], "content": "Paris: sunny and 21 degrees"}
    assert answer["choices"][0]["message"]["content"] == view["content"] and view["content"].strip()


def holds_json_object(text: str) -> bool:
    decoder = json.JSONDecoder()
    for start in (i for i, c in enumerate(text) if c == "{"):
        try:
            if isinstance(decoder.raw_decode(text, start)[0], dict):
                return True
        except ValueError:
            pass
    return False


async def test_prompt_based_tools_with_a_model_that_answers_no_json(relayed: tuple[Service, Relay]) -> None:
    """``function_calling: "default"``: the model is asked to pick tools as a
    JSON object; SmolLM2-135M answers prose, so the turn answers without
    tools and warns. (The selection call is sampled, the server's defaults:
    should the model ever answer a JSON object, there is no warning.)"""
    real, relay = relayed
    body = {"model": MODEL_ID, "messages": WEATHER_QUESTION, "tool_ids": ["weather"], "params": {"function_calling": "default"}, **GREEDY}
    status, answer, headers = await real.post("/v1/chat/completions", body)
    assert status == 200, answer
    view = await real.turn(headers["X-Turn-Id"])
    assert view["status"] == "completed" and answer["choices"][0]["message"]["content"] == view["content"]
    selection, main = relay.requests  # the selection, then the answer: no tool loop
    assert "tools" not in selection and "tools" not in main and "get_weather" in selection["messages"][0]["content"]
    [step] = [e["data"]["detail"] for e in await real.events(view["id"]) if e["type"] == "assembly.step" and e["data"]["step"] == "legacy_tools"]
    warning = "tools were not used: the model's tool selection held no JSON object"
    if holds_json_object(step["reply"]):
        assert warning not in view["warnings"]
    else:
        assert step["calls"] == [] and view["warnings"] == [warning] and answer["turnlog"]["warnings"] == [warning]
        assert main["messages"] == WEATHER_QUESTION  # no tool results went in


LONG_QUESTION: list[Any] = [{"role": "user", "content": "Count from 1 to 60, separated by commas."}]
LONG = {"temperature": 0, "seed": 7, "max_tokens": 240}


async def test_kill9_mid_answer_restarts_into_one_stored_answer(http: aiohttp.ClientSession, tmp_path: Path, llama_server: LlamaServer) -> None:
    """``kill -9`` of turnlog mid-answer, then a restart on the same database:
    the turn resumes in this upstream's mode, ``restart`` (its chat template
    closes a partial assistant message, so it could not continue one). The
    stored answer is the model's one greedy answer, not the partial followed
    by a fresh one, and a client reading the turn from its start is told to
    drop the superseded text."""
    expected, _usage = await direct_answer(llama_server, LONG_QUESTION, **{k: v for k, v in LONG.items() if k != "temperature"})
    env = {"TURNLOG_RESUME": json.dumps({"openai": "restart"}), "TURNLOG_LEASE_SECONDS": "60"}
    db = tmp_path / "turnlog.db"
    first = Server(db, llama_server.url, auto_resume=False, log_dir=tmp_path, env=env)
    try:
        await first.ready(http)
        body = {"model": MODEL_ID, "messages": LONG_QUESTION, "stream": True, **LONG}
        resp = await http.post(first.url + "/v1/chat/completions", json=body)
        turn_id = resp.headers["X-Turn-Id"]
        # Killed once some of the answer is durable, well before its end.
        view = await wait_for(http, f"{first.url}/v1/turns/{turn_id}", lambda v: len(v["content"]) >= 12 or v["status"] != "running")
        assert view["status"] == "running", "the answer ended before the kill: make it longer"
        first.kill9()
        resp.close()
    finally:
        first.stop()
    partial = view["content"]
    second = Server(db, llama_server.url, auto_resume=True, log_dir=tmp_path, env=env)
    try:
        await second.ready(http)
        done = await wait_for(http, f"{second.url}/v1/turns/{turn_id}", lambda v: v["status"] in ("completed", "failed"), timeout=120)
        assert done["status"] == "completed", done
        assert done["content"] == expected, "one answer: the restarted call's, which is the model's greedy answer"
        assert partial and expected.startswith(partial) and done["content"] != partial + expected
        events = (await get_json(http, f"{second.url}/v1/turns/{turn_id}/events?limit=10000"))["events"]
        [resumed] = [e for e in events if e["type"] == "turn.resumed"]
        assert resumed["data"]["mode"] == "restart"
        async with http.get(f"{second.url}/v1/turns/{turn_id}/stream") as stream:
            raw = await stream.text()
        assert '"mode":"restart"' in raw.replace(" ", "")
        assert kept_text(raw) == expected  # a client applying the notice shows the stored answer only
    finally:
        second.stop()
