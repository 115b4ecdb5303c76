"""``turnlog serve --demo``: the built-in scripted model and the ``clock`` tool,
through the real service (no scripted upstream involved)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import aiohttp
import pytest

from adapters.providers.demo import DemoProvider
from engine.ports import RawChunk
from tests.documents import upload, wait_file
from tests.harness import Service, make_settings, sse_messages, sse_text, start_service, stop_service
from tests.processes import Server, get_json, wait_for
from tests.upstream import ScriptedUpstream


def counted(n: int) -> str:
    return ", ".join(str(i) for i in range(1, n + 1)) + "."


@pytest.fixture
async def demo(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> AsyncIterator[Service]:
    """The service with ``--demo`` and no upstream; fast chunks (still paced)."""
    settings = make_settings(tmp_path, None, database_url=database_url, demo=True, demo_chunk_delay=0.002)
    assert settings.openai_base_url is None
    svc = await start_service(settings, upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)  # verifies every turn


def ask(text: str, **extra: object) -> dict[str, object]:
    return {"model": "demo", "messages": [{"role": "user", "content": text}], **extra}


async def test_demo_model_is_listed_and_streams_a_scripted_answer(demo: Service) -> None:
    status, listing = await demo.get("/v1/models")
    assert status == 200 and [m["id"] for m in listing["data"]] == ["demo"]
    async with demo.http.post(demo.v1 + "/chat/completions", json=ask("please count to 40", stream=True)) as resp:
        assert resp.status == 200
        raw = await resp.text()
        turn_id = resp.headers["X-Turn-Id"]
    assert sse_text(raw) == counted(40)
    chunks = [json.loads(d) for _, d in sse_messages(raw) if d != "[DONE]"]
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) == 40  # one chunk a number
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    view = await demo.turn(turn_id)
    assert view["status"] == "completed" and view["content"] == counted(40) and view["model"] == "demo"
    assert chunks[0]["id"] == f"chatcmpl-{turn_id}"


async def test_demo_answer_echoes_the_user_and_is_deterministic(demo: Service) -> None:
    answers = []
    for _ in range(2):
        status, data, _ = await demo.post("/v1/chat/completions", ask("Say hello"))
        assert status == 200
        answers.append(data["choices"][0]["message"]["content"])
    assert answers[0] == answers[1] and "You said: \u201cSay hello\u201d" in answers[0]


async def test_demo_tool_turn_runs_the_clock_tool(demo: Service) -> None:
    before = datetime.now().astimezone()
    status, data, headers = await demo.post("/v1/chat/completions", ask("what time is it?", tool_ids=["clock"]))
    assert status == 200, data
    content = data["choices"][0]["message"]["content"]
    stamp = re.search(r"answered: (\S+)\. ", content)
    # the script cannot tell a server tool from a client's: it claims no log record
    assert content.endswith("I read that result from the tool message in my request.") and "tool.completed" not in content
    assert stamp and abs((datetime.fromisoformat(stamp.group(1)) - before).total_seconds()) < 60
    events = await demo.events(headers["X-Turn-Id"])
    started = next(e["data"] for e in events if e["type"] == "tool.started")
    assert started["name"] == "get_time" and started["tool_id"] == "clock" and started["idempotent"] is True
    completed = next(e["data"] for e in events if e["type"] == "tool.completed")
    assert completed["status"] == "completed" and completed["output"] == stamp.group(1)
    view = await demo.turn(headers["X-Turn-Id"])
    assert [i["type"] for i in view["output"]] == ["function_call", "function_call_output", "message"]
    if demo.settings.database_url.startswith("sqlite"):
        from tests.test_cli import turnlog

        db = Path(demo.settings.database_url.removeprefix("sqlite+aiosqlite:///"))
        replay = turnlog(db, "replay", headers["X-Turn-Id"])
        assert replay.returncode == 0, replay.stderr
        summary = replay.stdout.splitlines()
        assert summary[summary.index("tool calls: 1") + 1] == f"  1. get_time({{}}) -> {stamp.group(1)!r}"
        assert summary[-1] == "verdict  the log replays to the stored view"


GUIDE = """# Sourdough guide

Feed the starter twice a day with equal weights of flour and water.

Proof the shaped dough in the fridge for 12 hours before baking.
"""


async def test_demo_answers_task_prompts_at_once_and_a_file_is_retrieved(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    """Files in prompt mode ask the task model for search queries, and a chat's
    first turn for a title, tags and follow-ups: the demo answers each at once
    with the JSON asked for, built from the user's message (the answer itself
    still paced at the default 0.1 s a chunk)."""
    settings = make_settings(tmp_path, None, database_url=database_url, demo=True, chunk_tokens=24, chunk_overlap_tokens=4)
    svc = await start_service(settings, upstream)
    try:
        status, body = await upload(svc.http, svc.url, "guide.md", GUIDE.encode(), "text/markdown")
        assert status == 200, body
        assert (await wait_file(svc.http, svc.url, body["id"]))["status"] == "ready"
        said = "How long should the dough proof? Count to 5"
        started = time.monotonic()
        status, data, headers = await svc.post(
            "/v1/chat/completions",
            {**ask(said), "params": {"function_calling": "default"}, "chat_id": "chat-demo-files", "files": [{"type": "file", "id": body["id"]}]},
        )
        assert status == 200, data
        view = await svc.wait_status(headers["X-Turn-Id"], "completed", "failed")
        took = time.monotonic() - started
        assert view["status"] == "completed" and took < 3.0, (view["status"], took)
        assert data["choices"][0]["message"]["content"] == counted(5)
        events = await svc.events(headers["X-Turn-Id"])
        step = next(e["data"]["detail"] for e in events if e["data"].get("step") == "files")
        assert step["queries"] == [said] and "query_warning" not in step
        assert any("Proof the shaped dough in the fridge for 12 hours" in doc for s in step["sources"] for doc in s["document"])
        assert view["sources"] == [{"id": 1, "name": "guide.md", "type": "file"}] and view["warnings"] == []
        assert view["title"] == "How long should the"
        assert view["tags"][0] == "Demo" and "Dough" in view["tags"]
        assert view["follow_ups"] and said[:20] in view["follow_ups"][0]
    finally:
        await stop_service(svc)


async def test_demo_answers_a_tool_selection_prompt_with_the_first_tool() -> None:
    from engine.tools.legacy import build_selection_request, parse_selection

    spec = {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}
    messages = build_selection_request([spec], [{"role": "user", "content": "time in Paris?"}])
    reply = await DemoProvider(chunk_delay=10).complete_chat({"model": "demo", "messages": messages})
    assert parse_selection(reply["choices"][0]["message"]["content"], {"get_time"}) == [("get_time", {"zone": "time in Paris?"})]


@pytest.mark.sqlite_only
async def test_turnlog_fork_demo_forks_a_demo_turn(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    """``turnlog fork --demo`` runs the fork on the demo model, as ``serve --demo``
    answers it (without it no upstream serves ``demo``)."""
    from tests.test_cli import turnlog

    settings = make_settings(tmp_path, None, database_url=database_url, demo=True, demo_chunk_delay=0)
    svc = await start_service(settings, upstream)
    try:
        status, _, headers = await svc.post("/v1/chat/completions", ask("count to 7"))
        assert status == 200
        parent = headers["X-Turn-Id"]
        at = next(e["seq"] for e in await svc.events(parent) if e["type"] == "model.requested")
        db = tmp_path / "turnlog.db"
        env = {"TURNLOG_OPENAI_BASE_URL": "", "TURNLOG_DEMO_CHUNK_DELAY": "0"}
        out = turnlog(db, "fork", parent, "--at", str(at), "--demo", **env)
        assert out.returncode == 0, out.stderr
        printed = json.loads(out.stdout)
        assert printed["status"] == "completed"
        view = await svc.turn(printed["turn_id"])
        assert view["content"] == counted(7) and view["model"] == "demo" and view["parent_turn_id"] == parent
    finally:
        await stop_service(svc)


async def test_demo_turn_can_be_cancelled_midway(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    settings = make_settings(tmp_path, None, database_url=database_url, demo=True, demo_chunk_delay=0.01)
    svc = await start_service(settings, upstream)
    try:
        async with svc.http.post(svc.v1 + "/chat/completions", json=ask("count to 5000", stream=True)) as resp:
            turn_id = resp.headers["X-Turn-Id"]
            seen = ""
            async for line in resp.content:  # until the answer has begun
                if line.startswith(b"data: {") and b'"content":"1, "' in line:
                    seen = "1, "
                    break
            assert seen
            status, cancelled, _ = await svc.post(f"/v1/turns/{turn_id}/cancel")
            assert status == 202 and cancelled["status"] == "cancelled"
            rest = (await resp.read()).decode()
        chunks = [json.loads(d) for _, d in sse_messages(rest) if d != "[DONE]"]
        assert rest.rstrip().endswith("data: [DONE]")
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and chunks[-1]["turnlog"] == {"status": "cancelled"}
        view = await svc.turn(turn_id)
        assert view["status"] == "cancelled"
        assert view["content"] and counted(5000).startswith(view["content"]) and view["content"] != counted(5000)
    finally:
        await stop_service(svc)


async def test_demo_continues_a_prefill_without_repeating_it() -> None:
    provider = DemoProvider(chunk_delay=0)
    messages = [{"role": "user", "content": "count to 12"}, {"role": "assistant", "content": "1, 2, 3, 4, 5"}]
    text = ""
    async for batch in provider.stream_batches({"model": "demo", "messages": messages}):
        for raw in batch:
            assert isinstance(raw, RawChunk)
            for choice in raw.data["choices"]:
                text += choice["delta"].get("content") or ""
    assert "1, 2, 3, 4, 5" + text == counted(12)


async def test_serve_demo_survives_a_crash_and_resumes_the_count(http: aiohttp.ClientSession, tmp_path: Path) -> None:
    """The walkthrough's crash-resume: kill -9 mid-answer, start again, the
    answer completes with nothing missing or repeated."""
    db = tmp_path / "demo.db"
    first = Server(db, None, auto_resume=False, args=("--demo",), TURNLOG_DEMO_CHUNK_DELAY="0.005")
    try:
        await first.ready(http)
        assert "demo mode: model 'demo' and tool 'clock' are on" in first.log_path.read_text()
        resp = await http.post(first.url + "/v1/chat/completions", json=ask("count to 3000", stream=True))
        turn_id = resp.headers["X-Turn-Id"]
        async for line in resp.content:
            if b'"content":"100, "' in line:
                break
        first.kill9()
        resp.close()
    finally:
        first.stop()
    second = Server(db, None, auto_resume=True, args=("--demo",), TURNLOG_DEMO_CHUNK_DELAY="0")
    try:
        await second.ready(http)
        done = await wait_for(http, f"{second.url}/v1/turns/{turn_id}", lambda v: v["status"] == "completed", timeout=60)
        assert done["content"] == counted(3000)
        events = (await get_json(http, f"{second.url}/v1/turns/{turn_id}/events?limit=10000"))["events"]
        types = [e["type"] for e in events]
        assert "turn.interrupted" in types and "turn.resumed" in types
        prefill = next(e["data"]["prefill"] for e in events if e["type"] == "model.requested" and e["data"]["resumed"])
        assert prefill and counted(3000).startswith(prefill)
    finally:
        second.stop()
