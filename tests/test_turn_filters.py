"""Filters in a turn: ``inlet`` rewrites the request the upstream receives,
``stream`` rewrites each delta clients see (and the log keeps), ``outlet``
rewrites the finished answer — for every client, plain OpenAI SDK calls
included. An inlet that raises fails the turn with a recorded error; a stream
or outlet filter that raises is skipped and recorded. Every turn here also
passes ``turnlog verify`` (the harness re-runs each one at teardown).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest

from tests.harness import Service, make_settings, sse_messages, sse_text, start_service, stop_service
from tests.oracle import check_stream_against_log
from tests.upstream import Reply, ScriptedUpstream

USER = [{"role": "user", "content": "hello there"}]

FILTERS = {
    "shout": """
        from pydantic import BaseModel

        class Filter:
            class Valves(BaseModel):
                priority: int = 0
                suffix: str = "!"

            def __init__(self):
                self.valves = self.Valves()

            def inlet(self, body, __user__=None):
                for m in body["messages"]:
                    if m["role"] == "user":
                        m["content"] = m["content"].upper() + self.valves.suffix
                body["temperature"] = 0.25
                return body
    """,
    "tag_user": """
        class Filter:
            priority = 5

            async def inlet(self, body, __user__=None):
                body["messages"].insert(0, {"role": "system", "content": f"user={__user__['id']}"})
                return body
    """,
}

STREAM = """
    class Filter:
        def stream(self, event):
            delta = event["choices"][0]["delta"]
            if "content" in delta:
                delta["content"] = delta["content"].replace("cat", "dog")
            return event
"""

OUTLET = """
    class Filter:
        async def outlet(self, body, __user__=None):
            answer = body["messages"][-1]
            answer["content"] = answer["content"] + " [checked]"
            return body
"""

BROKEN_STREAM = """
    class Filter:
        def stream(self, event):
            raise RuntimeError("stream filter broke")
"""

BROKEN_OUTLET = """
    class Filter:
        def outlet(self, body):
            raise ValueError("outlet filter broke")
"""

BROKEN_INLET = """
    class Filter:
        def inlet(self, body):
            raise PermissionError("no questions on Sundays")
"""


def write_filters(folder: Path, modules: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in modules.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return folder


@pytest.fixture
def filter_modules() -> dict[str, str]:
    return dict(FILTERS)


@pytest.fixture
async def filtered(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, filter_modules: dict[str, str]) -> AsyncIterator[Service]:
    folder = write_filters(tmp_path / "filters", filter_modules)
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, filters_dir=str(folder), filters={"shout": {"suffix": "?!"}})
    svc = await start_service(settings, upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


async def test_inlet_filters_rewrite_what_the_upstream_receives_in_priority_order(filtered: Service) -> None:
    filtered.upstream.enqueue(Reply(text="ok"))
    status, data, headers = await filtered.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
    assert status == 200, data
    sent = filtered.upstream.requests[-1]
    # shout (priority 0, its valve from the TOML table) ran before tag_user (5)
    assert sent["messages"] == [{"role": "system", "content": "user=local"}, {"role": "user", "content": "HELLO THERE?!"}]
    assert sent["temperature"] == 0.25
    events = await filtered.events(headers["X-Turn-Id"])
    step = next(e["data"] for e in events if e["type"] == "assembly.step" and e["data"]["step"] == "inlet_filters")
    assert [r["filter"] for r in step["detail"]["runs"]] == ["shout", "tag_user"]
    assert "messages" in step["detail"]["changed"] and "temperature" in step["detail"]["changed"]


@pytest.mark.parametrize("filter_modules", [{"sunday": BROKEN_INLET}])
async def test_an_inlet_that_raises_fails_the_turn_with_a_recorded_error(filtered: Service) -> None:
    status, data, headers = await filtered.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
    assert status == 502, data
    assert "no questions on Sundays" in data["error"]["message"]
    view = await filtered.turn(headers["X-Turn-Id"])
    assert view["status"] == "failed" and view["error"]["type"] == "filter_error"
    events = await filtered.events(headers["X-Turn-Id"])
    assert [e["type"] for e in events] == ["turn.started", "assembly.step", "turn.failed"]
    assert events[1]["data"]["step"] == "inlet_filters" and "Sundays" in events[1]["data"]["detail"]["error"]
    assert filtered.upstream.requests == []  # the model was never asked


@pytest.mark.parametrize("filter_modules", [{"dogs": STREAM, "check": OUTLET}])
async def test_stream_and_outlet_filters_reach_streaming_clients(filtered: Service) -> None:
    filtered.upstream.enqueue(Reply(chunks=["The cat ", "sat on the ", "cat mat."]))
    async with filtered.http.post(filtered.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True}) as resp:
        raw = await resp.text()
        turn_id = resp.headers["X-Turn-Id"]
    # the deltas as the stream filter made them, live and in the log
    assert sse_text(raw) == "The dog sat on the dog mat."
    deltas = [e for e in await filtered.events(turn_id) if e["type"] == "model.delta"]
    assert "".join(e["data"]["text"] for e in deltas) == "The dog sat on the dog mat."
    # the outlet's version comes as an extension chunk, and is the turn's content
    chunks = [json.loads(d) for _, d in sse_messages(raw) if d != "[DONE]"]
    outlet = [c["turnlog"]["outlet"] for c in chunks if "outlet" in c.get("turnlog", {})]
    assert outlet == [{"content": "The dog sat on the dog mat. [checked]"}]
    view = await filtered.turn(turn_id)
    assert view["content"] == "The dog sat on the dog mat. [checked]"
    assert view["output"][-1]["content"][-1]["text"] == "The dog sat on the dog mat. [checked]"


@pytest.mark.parametrize("filter_modules", [{"check": OUTLET}])
async def test_outlet_runs_for_plain_openai_sdk_calls(filtered: Service) -> None:
    filtered.upstream.enqueue(Reply(text="Plain answer."))
    sdk = openai.AsyncOpenAI(base_url=filtered.v1, api_key="x", max_retries=0)
    done = await sdk.chat.completions.create(model="gpt-test", messages=USER)  # type: ignore[arg-type]
    await sdk.close()
    assert done.choices[0].message.content == "Plain answer. [checked]"


@pytest.mark.parametrize("filter_modules", [{"a_broken": BROKEN_STREAM, "b_broken": BROKEN_OUTLET, "dogs": STREAM}])
async def test_stream_and_outlet_filters_that_raise_are_skipped_and_recorded(filtered: Service) -> None:
    filtered.upstream.enqueue(Reply(chunks=["cat ", "cat ", "cat"]))
    async with filtered.http.post(filtered.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True}) as resp:
        raw = await resp.text()
        turn_id = resp.headers["X-Turn-Id"]
    assert sse_text(raw) == "dog dog dog"  # the other stream filter still ran
    view = await filtered.turn(turn_id)
    assert view["status"] == "completed" and view["content"] == "dog dog dog"
    # one warning for the broken stream filter, not one per delta
    assert view["warnings"] == ["stream filter a_broken failed and was skipped: RuntimeError: stream filter broke"]
    outlet = next(e["data"] for e in await filtered.events(turn_id) if e["type"] == "outlet.applied")
    assert outlet["content"] is None and outlet["runs"] == [{"filter": "b_broken", "changed": False, "error": "ValueError: outlet filter broke"}]
    await check_stream_against_log(filtered, turn_id, raw)
