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

import openai
import pytest

from tests.harness import Service, make_settings, sse_text, start_service, stop_service
from tests.llama_server import MODEL_ID, LlamaServer

GREEDY: dict[str, Any] = {"temperature": 0, "seed": 7, "max_tokens": 24}
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


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


async def direct_answer(server: LlamaServer, messages: list[dict[str, Any]], **params: Any) -> tuple[str, dict[str, Any]]:
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

    async with real.http.post(real.v1 + "/chat/completions", json={"model": MODEL_ID, "messages": QUESTION, "stream": True, "stream_options": {"include_usage": True}, **GREEDY}) as resp:
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
