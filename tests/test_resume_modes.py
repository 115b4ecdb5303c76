"""Resume modes: how each upstream goes on with a generation cut off by a crash.

``continue``: the partial answer is sent back as a final assistant message and
the model continues it (Ollama does). ``restart``: the partial answer stays in
the log, superseded, and the model answers afresh (OpenAI's APIs start a new
answer whatever the messages end with). The kill -9 tests of both modes are in
tests/test_crash_resume.py and tests/test_resume_notice.py; here: the settings,
which upstream gets which mode, and a Responses API stream across a restart.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.responses import ResponseCompletedEvent, ResponseOutputItemDoneEvent, ResponseOutputMessage, ResponseOutputText
from pydantic import ValidationError

from adapters.catalog import Catalog
from adapters.config import Settings
from adapters.providers.ollama import OllamaProvider
from adapters.providers.openai_chat import OpenAIChatProvider
from adapters.providers.openai_responses import OpenAIResponsesProvider
from engine.ports import ChatProvider
from tests.processes import Server, cli, get_json, wait_for
from tests.upstream import Reply, ScriptedUpstream

WORDS = [f" w{i}" for i in range(60)]
TEXT = "".join(WORDS)
WINDOW = 10
FIRST_PAUSE = 25
DURABLE = "".join(WORDS[: FIRST_PAUSE // WINDOW * WINDOW])  # two sealed windows
ENV = {"TURNLOG_FLUSH_INTERVAL": "60", "TURNLOG_FLUSH_MAX_CHUNKS": str(WINDOW)}
TIMEOUT = 20.0


# -- settings ---------------------------------------------------------------------------


def test_the_defaults_restart_openai_and_continue_ollama(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNLOG_RESUME", raising=False)
    monkeypatch.delenv("TURNLOG_RESUME_PARAMS", raising=False)
    settings = Settings()
    assert settings.resume == {"openai": "restart", "responses": "restart", "ollama": "continue"}
    assert settings.resume_params == {}


def test_an_upstream_not_named_keeps_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNLOG_RESUME", '{"openai": "continue"}')
    monkeypatch.setenv("TURNLOG_RESUME_PARAMS", '{"openai": {"continue_final_message": true, "add_generation_prompt": false}}')
    settings = Settings()
    assert settings.resume == {"openai": "continue", "responses": "restart", "ollama": "continue"}
    assert settings.resume_params == {"openai": {"continue_final_message": True, "add_generation_prompt": False}}


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("TURNLOG_RESUME", '{"openia": "restart"}', "TURNLOG_RESUME: unknown upstream(s) openia"),
        ("TURNLOG_RESUME", '{"openai": "retry"}', "Input should be 'continue' or 'restart'"),
        ("TURNLOG_RESUME", "restart", 'error parsing value for field "resume"'),
        ("TURNLOG_RESUME_PARAMS", '{"vllm": {"x": 1}}', "TURNLOG_RESUME_PARAMS: unknown upstream(s) vllm"),
        ("TURNLOG_RESUME_PARAMS", '{"openai": true}', "Input should be a valid dictionary"),
        ("TURNLOG_RESUME_PARAMS", '{"openai": {"messages": []}}', "openai: messages cannot be set"),
    ],
)
def test_a_bad_resume_setting_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises((ValidationError, ValueError), match=message.replace("(", r"\(").replace(")", r"\)")):
        Settings()


def test_serve_does_not_start_with_a_bad_resume_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNLOG_RESUME", '{"ollama": "rewind"}')
    done = cli(tmp_path / "turnlog.db", "serve", "--port", "0")
    assert done.returncode == 2
    assert "invalid configuration" in done.stderr and "resume.ollama" in done.stderr


async def test_each_upstream_resolves_to_its_mode_and_params(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    assert upstream.url is not None and upstream.root is not None
    settings = Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'x.db'}",
        resume={"ollama": "restart"},
        resume_params={"openai": {"continue_final_message": True}, "responses": {"x": 1}},
    )
    cases: list[tuple[ChatProvider, str, dict[str, Any]]] = [
        (OpenAIChatProvider(upstream.url, "k"), "restart", {"continue_final_message": True}),
        (OpenAIResponsesProvider(upstream.url, "k"), "restart", {"x": 1}),
        (OllamaProvider(upstream.root), "restart", {}),
    ]
    for provider, mode, params in cases:
        name = "ollama" if isinstance(provider, OllamaProvider) else "openai"
        catalog = Catalog(settings, {name: provider})
        try:
            resolved = await catalog.resolve("gpt-test")
            assert resolved is not None and (resolved.resume, resolved.resume_params) == (mode, params), provider
        finally:
            await catalog.close()
            await provider.close()


# -- the scripted upstream's two behaviours ------------------------------------------------


@pytest.mark.parametrize("mode, sent", [("continue", " w2 w3"), ("restart", " w0 w1 w2 w3")])
async def test_the_scripted_upstream_continues_or_restarts_a_final_assistant_message(mode: str, sent: str) -> None:
    async with ScriptedUpstream(resume=mode) as up, aiohttp.ClientSession() as http:
        up.enqueue(Reply(chunks=WORDS[:4]))
        body = {"model": "gpt-test", "stream": False, "messages": [{"role": "user", "content": "count"}, {"role": "assistant", "content": " w0 w1"}]}
        async with http.post(f"{up.url}/chat/completions", json=body) as resp:
            assert (await resp.json())["choices"][0]["message"]["content"] == sent


# -- a Responses API stream across a restart -------------------------------------------------


async def _read_events(resp: aiohttp.ClientResponse, done: Any) -> list[dict[str, Any]]:
    """Responses SSE events until ``done(events)``."""
    buf = ""
    events: list[dict[str, Any]] = []

    async def go() -> None:
        nonlocal buf
        while not done(events):
            chunk = await resp.content.readany()
            assert chunk, "the stream ended early"
            buf += chunk.decode()
            while "\n\n" in buf:
                message, buf = buf.split("\n\n", 1)
                data = [line[6:] for line in message.splitlines() if line.startswith("data: ")]
                if data:
                    events.append(json.loads(data[0]))

    await asyncio.wait_for(go(), TIMEOUT)
    return events


def _text(message: ResponseOutputMessage) -> str:
    part = message.content[0]
    assert isinstance(part, ResponseOutputText), part
    return part.text


def _deltas(events: list[Any], item_id: str | None) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta" and e.item_id == item_id)


@pytest.mark.parametrize("mode", ["continue", "restart"])
async def test_a_responses_stream_across_a_crash(http: aiohttp.ClientSession, tmp_path: Path, upstream: ScriptedUpstream, mode: str) -> None:
    upstream.resume = mode
    env = {**ENV, "TURNLOG_RESUME": json.dumps({"openai": mode})}
    upstream.enqueue(Reply(chunks=WORDS, delay=0.002, pause_after=FIRST_PAUSE), Reply(chunks=WORDS))
    db = tmp_path / "turnlog.db"
    first = Server(db, upstream.url, auto_resume=False, env=env)
    try:
        await first.ready(http)
        resp = await http.post(first.url + "/v1/responses", json={"model": "gpt-test", "input": "count", "stream": True})
        assert resp.status == 200
        created = await _read_events(resp, lambda es: any(e["type"] == "response.created" for e in es))
        response_id = created[0]["response"]["id"]
        turn_id = response_id.removeprefix("resp_")
        await asyncio.wait_for(upstream.paused.wait(), TIMEOUT)
        await wait_for(http, f"{first.url}/v1/turns/{turn_id}", lambda v: v["content"] == DURABLE)
        first.kill9()
        upstream.release()
        resp.close()
    finally:
        first.stop()
    second = Server(db, upstream.url, auto_resume=True, env=env)
    try:
        await second.ready(http)
        turn = await wait_for(http, f"{second.url}/v1/turns/{turn_id}", lambda v: v["status"] == "completed")
        assert turn["content"] == TEXT
        sdk = openai.AsyncOpenAI(base_url=second.url + "/v1", api_key="unused")
        events = [e async for e in await sdk.responses.retrieve(response_id, stream=True)]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        added = [e.item for e in events if e.type == "response.output_item.added"]
        done = [e.item for e in events if isinstance(e, ResponseOutputItemDoneEvent)]
        assert all(isinstance(i, ResponseOutputMessage) for i in done), done
        messages = [i for i in done if isinstance(i, ResponseOutputMessage)]
        final = events[-1]
        assert isinstance(final, ResponseCompletedEvent)
        if mode == "continue":
            # One message: the durable part, continued.
            assert [(i.type, i.status) for i in messages] == [("message", "completed")]
            assert _deltas(events, added[0].id) == TEXT
        else:
            # The partial message ends incomplete, the new answer is a new item.
            assert [(i.type, i.status) for i in messages] == [("message", "incomplete"), ("message", "completed")]
            assert added[0].id != added[1].id
            assert [_text(m) for m in messages] == [DURABLE, TEXT]
            assert _deltas(events, added[0].id) == DURABLE and _deltas(events, added[1].id) == TEXT
            assert [getattr(i, "status", None) for i in final.response.output] == ["incomplete", "completed"]
        # The retrieved response is the stream's end.
        retrieved = await sdk.responses.retrieve(response_id)
        assert retrieved.model_dump() == final.response.model_dump()
        await sdk.close()
        assert cli(db, "verify", turn_id).returncode == 0
        listing = await get_json(http, f"{second.url}/v1/turns/{turn_id}/events?limit=10000")
        assert [e["data"]["mode"] for e in listing["events"] if e["type"] == "turn.resumed"] == [mode]
    finally:
        second.stop()
