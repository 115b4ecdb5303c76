"""Web search, image generation and code execution in turns, both ways:
pre-injected with prompt-based function calling (``params.function_calling:
"default"``), and as the model's own builtin tools in native function calling.
One local server plays SearXNG (its JSON API), the web pages and an OpenAI
Images-compatible endpoint returning real PNG bytes; code runs in the real
sandbox. The oracle: the exact messages the scripted upstream received, what
clients were sent, and the recorded events (every turn also verifies at
teardown: no search, fetch, drawing or execution is repeated).
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.harness import Service, make_settings, sse_messages, sse_text, start_service, stop_service
from tests.oracle import check_stream_against_log
from tests.test_turn_filters import write_filters
from tests.upstream import Reply, ScriptedUpstream

# A long page: the answer is one paragraph among 300 about something else.
ALMANAC = "".join(
    f"<p>Paragraph {i}: the fishing fleet counted {i % 17 + 3} boats that season.</p>"
    if i != 240
    else "<p>The lighthouse lamp is lit at 18:40 in December.</p>"
    for i in range(300)
)
PAGES = {
    "/page/bread": ("<html><head><title>Bread hours</title></head><body><p>The Lisbon bakery opens at 7 am.</p></body></html>"),
    "/page/cats": ("<html><head><title>Cats</title></head><body><p>Cats sleep sixteen hours a day.</p></body></html>"),
    "/page/almanac": f"<html><head><title>Almanac</title></head><body>{ALMANAC}</body></html>",
}


def png(rgb: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    raw = b"".join(b"\x00" + bytes(rgb) * 2 for _ in range(2))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


@dataclass
class World:
    url: str
    searches: list[str] = field(default_factory=list)
    image_prompts: list[str] = field(default_factory=list)
    edits: int = 0


@pytest.fixture
async def world() -> AsyncIterator[World]:
    state: dict[str, World] = {}

    async def search(request: web.Request) -> web.Response:
        state["w"].searches.append(request.query.get("q", ""))
        base = state["w"].url
        results = [
            {"title": "Bread hours", "url": base + "/page/bread", "content": "opening hours"},
            {"title": "Cats", "url": base + "/page/cats", "content": "cat facts"},
        ]
        if "lighthouse" in request.query.get("q", ""):
            results = [{"title": "Almanac", "url": base + "/page/almanac", "content": "the harbour almanac"}]
        return web.json_response({"query": request.query.get("q"), "results": results})

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=PAGES[request.path], content_type="text/html")

    async def generations(request: web.Request) -> web.Response:
        body = await request.json()
        state["w"].image_prompts.append(body["prompt"])
        return web.json_response({"created": 1, "data": [{"b64_json": base64.b64encode(png()).decode()}]})

    async def edits(request: web.Request) -> web.Response:
        form = await request.post()
        state["w"].edits += 1
        state["w"].image_prompts.append(str(form["prompt"]))
        return web.json_response({"created": 1, "data": [{"b64_json": base64.b64encode(png((0, 0, 255))).decode()}]})

    app = web.Application()
    app.router.add_get("/search", search)
    for path in PAGES:
        app.router.add_get(path, page)
    app.router.add_post("/v1/images/generations", generations)
    app.router.add_post("/v1/images/edits", edits)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    state["w"] = World(f"http://127.0.0.1:{runner.addresses[0][1]}")
    try:
        yield state["w"]
    finally:
        await runner.cleanup()


@pytest.fixture
def more_settings() -> dict[str, Any]:
    """Settings a test adds (overridden with ``pytest.mark.parametrize``)."""
    return {}


@pytest.fixture
async def featured(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, world: World, more_settings: dict[str, Any]) -> AsyncIterator[Service]:
    settings = make_settings(
        tmp_path,
        upstream.url,
        database_url=database_url,
        web_search_engine="searxng",
        searxng_url=world.url,
        fetch_allow=["127.0.0.1"],
        images_base_url=world.url + "/v1",
        images_model="dall-e-3",
        **more_settings,
    )
    svc = await start_service(settings, upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


def body(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-test", "messages": [{"role": "user", "content": text}], **extra}


LEGACY = {"function_calling": "default"}


def turnlog_chunks(raw: str) -> list[dict[str, Any]]:
    return [json.loads(d)["turnlog"] for _, d in sse_messages(raw) if d != "[DONE]" and "turnlog" in json.loads(d)]


async def test_legacy_web_search_fetches_the_pages_into_the_context(featured: Service, world: World) -> None:
    up = featured.upstream
    up.task_replies.append(("queries", Reply(text='{"queries": ["lisbon bakery hours"]}')))
    up.enqueue(Reply(text="It opens at 7 [1]."))
    async with featured.http.post(
        featured.v1 + "/chat/completions", json=body("When does the bakery open?", features={"web_search": True}, params=LEGACY, stream=True)
    ) as resp:
        raw = await resp.text()
        turn_id = resp.headers["X-Turn-Id"]
    assert world.searches == ["lisbon bakery hours"]
    text = up.requests[-1]["messages"][-1]["content"]
    assert "The Lisbon bakery opens at 7 am." in text and "Cats sleep sixteen hours a day." in text
    assert text.endswith("When does the bakery open?") and text.count("<context>") == 1
    statuses = [c["progress"]["description"] for c in turnlog_chunks(raw) if "progress" in c]
    assert statuses == ["Searching the web", "Searched 2 sites"]
    assert raw.index("Searched 2 sites") < raw.index('"content":"It')
    view = await featured.turn(turn_id)
    assert [(s["id"], s["type"], s.get("url")) for s in view["sources"]] == [
        (1, "web_search", world.url + "/page/bread"),
        (2, "web_search", world.url + "/page/cats"),
    ]
    await check_stream_against_log(featured, turn_id, raw)


@pytest.mark.parametrize("full", [False, True])
async def test_legacy_web_search_keeps_the_passages_of_a_page_that_answer(featured: Service, world: World, full: bool) -> None:
    up = featured.upstream
    up.task_replies.append(("queries", Reply(text='{"queries": ["lighthouse lamp december"]}')))
    up.enqueue(Reply(text="At 18:40 [1]."))
    features = {"web_search": True, "web_search_full_context": True} if full else {"web_search": True}
    async with featured.http.post(
        featured.v1 + "/chat/completions", json=body("When is the lamp lit in winter?", features=features, params=LEGACY, stream=True)
    ) as resp:
        raw = await resp.text()
        turn_id = resp.headers["X-Turn-Id"]
    text = up.requests[-1]["messages"][-1]["content"]
    assert "The lighthouse lamp is lit at 18:40 in December." in text
    # The page is ~4,000 tokens: chunked and searched, only the passage around
    # the answer is the model's; with full context, the whole page.
    assert ("Paragraph 3:" in text) is full and ("Paragraph 299:" in text) is full
    step = next(e["data"]["detail"] for e in await featured.events(turn_id) if e["data"].get("step") == "web_search")
    [source] = step["sources"]
    if full:
        assert len(source["document"]) == 1 and "retrieval" not in step
    else:
        assert step["retrieval"] == "passages" and 0 < source["metadata"][0]["score"] <= 1 and source["distances"]
    await check_stream_against_log(featured, turn_id, raw)


@pytest.mark.parametrize("more_settings", [{"rerank_engine": "api", "rerank_url": "http://127.0.0.1:9/v1"}])
async def test_when_searching_the_pages_fails_their_snippets_stand_in(featured: Service, world: World) -> None:
    up = featured.upstream
    up.task_replies.append(("queries", Reply(text='{"queries": ["lighthouse lamp december"]}')))
    up.enqueue(Reply(text="I could not read the page."))
    status, data, headers = await featured.post("/v1/chat/completions", body("When is the lamp lit?", features={"web_search": True}, params=LEGACY))
    assert status == 200, data
    text = up.requests[-1]["messages"][-1]["content"]
    assert "the harbour almanac" in text and "Paragraph" not in text and "18:40" not in text, "the snippet, never the whole page"
    step = next(e["data"]["detail"] for e in await featured.events(headers["X-Turn-Id"]) if e["data"].get("step") == "web_search")
    assert "reranking failed" in step["retrieval_error"] and "127.0.0.1:9" in step["retrieval_error"]


async def test_legacy_web_search_with_an_echoed_template_searches_the_user_message_and_warns(featured: Service, world: World) -> None:
    up = featured.upstream
    up.task_replies.append(("queries", Reply(text='{"queries": ["query1", "query2"]}')))
    up.enqueue(Reply(text="It opens at 7 [1]."))
    status, data, headers = await featured.post("/v1/chat/completions", body("When does the bakery open?", features={"web_search": True}, params=LEGACY))
    assert status == 200, data
    assert world.searches == ["When does the bakery open?"]
    (warning,) = (await featured.turn(headers["X-Turn-Id"]))["warnings"]
    assert warning.startswith("web search: the task model gave no usable search queries") and "query1" in warning


async def test_native_search_and_fetch_are_the_models_tools_with_citations(featured: Service, world: World) -> None:
    up = featured.upstream
    up.enqueue(
        Reply(tool_calls=[{"name": "search_web", "arguments": {"query": "bakery hours"}, "id": "s1"}], finish_reason="tool_calls"),
        Reply(tool_calls=[{"name": "fetch_url", "arguments": {"url": world.url + "/page/bread"}, "id": "f1"}], finish_reason="tool_calls"),
        Reply(text="At 7 [1]."),
    )
    status, data, headers = await featured.post("/v1/chat/completions", body("When does the bakery open?", features={"web_search": True}))
    assert status == 200, data
    first, second, third = up.requests
    assert sorted(t["function"]["name"] for t in first["tools"]) == ["fetch_url", "search_web"]
    hits = json.loads(second["messages"][-1]["content"])
    assert [h["link"] for h in hits] == [world.url + "/page/bread", world.url + "/page/cats"]
    assert "The Lisbon bakery opens at 7 am." in third["messages"][-1]["content"]
    # the results are citations: the question now carries their markers, the
    # ids of the first round kept in the second
    question_then, question_now = second["messages"][0]["content"], third["messages"][0]["content"]
    assert question_then.endswith("When does the bakery open?") and question_now.endswith("When does the bakery open?")
    view = await featured.turn(headers["X-Turn-Id"])
    # one id per page, whichever tool cited it (the fetched page is the
    # search's first hit: the same citation [1])
    assert view["sources"] == [
        {"id": 1, "name": "Bread hours", "type": "web", "url": world.url + "/page/bread"},
        {"id": 2, "name": "Cats", "type": "web", "url": world.url + "/page/cats"},
    ]
    tags = [t.split(">")[0] for t in question_now.split("<context>")[1].split("<source ")[1:]]
    assert any(t.startswith('id="1" ') and "/page/bread" in t for t in tags)  # the fetched page, cited as [1]
    assert {t.split('"')[1] for t in tags} == {"1", "2"}


async def test_fetch_url_refuses_private_addresses_and_the_model_is_told(featured: Service) -> None:
    featured.upstream.enqueue(
        Reply(tool_calls=[{"name": "fetch_url", "arguments": {"url": "http://169.254.169.254/latest/meta-data"}, "id": "f1"}], finish_reason="tool_calls"),
        Reply(text="I could not read it."),
    )
    status, _, _ = await featured.post("/v1/chat/completions", body("read the metadata", features={"web_search": True}))
    assert status == 200
    result = json.loads(featured.upstream.requests[-1]["messages"][-1]["content"])
    assert "could not be fetched" in result["error"] and "169.254.169.254" in result["error"]


async def test_legacy_image_generation_stores_the_image_and_tells_the_model(featured: Service, world: World) -> None:
    featured.upstream.enqueue(Reply(text="Here is your cat."))
    async with featured.http.post(
        featured.v1 + "/chat/completions", json=body("Draw a red cat", features={"image_generation": True}, params=LEGACY, stream=True)
    ) as resp:
        raw = await resp.text()
    # The task model wrote the prompt first (the scripted upstream's default answer).
    assert world.image_prompts == ["A scripted, detailed image prompt."]
    files = [c["files"] for c in turnlog_chunks(raw) if "files" in c]
    assert len(files) == 1 and files[0][0]["type"] == "image" and files[0][0]["url"].startswith("/v1/blobs/")
    async with featured.http.get(featured.url + files[0][0]["url"]) as blob:
        assert blob.status == 200 and blob.content_type == "image/png"
        assert (await blob.read()).startswith(b"\x89PNG")
    system = featured.upstream.requests[-1]["messages"][0]
    assert system["role"] == "system" and system["content"].startswith("<context>The requested image has been created")
    assert sse_text(raw) == "Here is your cat."


async def test_legacy_image_prompt_is_written_by_the_task_model_and_recorded(featured: Service, world: World) -> None:
    up = featured.upstream
    up.task_replies.append(("prompt", Reply(text='Sure! {"prompt": "A red tabby cat curled on a blue velvet cushion, soft morning light, oil painting"}')))
    up.enqueue(Reply(text="Here is your cat."))
    async with featured.http.post(
        featured.v1 + "/chat/completions", json=body("Draw a red cat", features={"image_generation": True}, params=LEGACY, stream=True)
    ) as resp:
        raw = await resp.text()
        turn_id = resp.headers["X-Turn-Id"]
    assert world.image_prompts == ["A red tabby cat curled on a blue velvet cushion, soft morning light, oil painting"]
    [task] = up.task_requests
    asked = task["messages"][0]["content"]
    assert asked.startswith("### Task:") and "USER: Draw a red cat" in asked and '{"prompt":' in asked
    steps = {e["data"]["step"]: e["data"]["detail"] for e in await featured.events(turn_id) if e["type"] == "assembly.step"}
    assert steps["image_prompt"]["prompt"] == world.image_prompts[0] and steps["image_prompt"]["reply"].startswith("Sure!")
    assert steps["image_generation"]["prompt"] == world.image_prompts[0]
    # Replayed and verified from the log (here and at teardown): the task model is not asked again.
    await check_stream_against_log(featured, turn_id, raw)
    assert len(up.task_requests) == 1 and len(world.image_prompts) == 1


async def test_an_unusable_image_prompt_draws_the_users_words_with_a_warning(featured: Service, world: World) -> None:
    up = featured.upstream
    up.task_replies.append(("prompt", Reply(text="I would draw a lovely cat for you.")))
    up.enqueue(Reply(text="Here is your cat."))
    status, data, headers = await featured.post("/v1/chat/completions", body("Draw a red cat", features={"image_generation": True}, params=LEGACY))
    assert status == 200, data
    assert world.image_prompts == ["Draw a red cat"]
    step = next(e["data"]["detail"] for e in await featured.events(headers["X-Turn-Id"]) if e["data"].get("step") == "image_prompt")
    assert step["prompt"] == "Draw a red cat" and 'no JSON object with "prompt"' in step["warning"] and step["reply"].startswith("I would")


@pytest.mark.parametrize("more_settings", [{"task_model": "no-such-model"}])
async def test_a_failed_image_prompt_call_draws_the_users_words(featured: Service, world: World) -> None:
    featured.upstream.enqueue(Reply(text="Here is your cat."))
    status, data, headers = await featured.post("/v1/chat/completions", body("Draw a red cat", features={"image_generation": True}, params=LEGACY))
    assert status == 200, data
    assert world.image_prompts == ["Draw a red cat"]
    step = next(e["data"]["detail"] for e in await featured.events(headers["X-Turn-Id"]) if e["data"].get("step") == "image_prompt")
    assert "no-such-model" in step["warning"] and "reply" not in step


@pytest.mark.parametrize("more_settings", [{"image_prompt_enhance": False}])
async def test_image_prompt_enhancement_off_draws_the_users_words(featured: Service, world: World) -> None:
    featured.upstream.enqueue(Reply(text="Here is your cat."))
    status, data, headers = await featured.post("/v1/chat/completions", body("Draw a red cat", features={"image_generation": True}, params=LEGACY))
    assert status == 200, data
    assert world.image_prompts == ["Draw a red cat"] and featured.upstream.task_requests == []
    assert not [e for e in await featured.events(headers["X-Turn-Id"]) if e["data"].get("step") == "image_prompt"]


async def test_an_image_in_the_user_message_is_edited_and_sent_to_the_model_inline(featured: Service, world: World) -> None:
    # an image the service stored (a blob URL) in a user message: the upstream
    # gets it as a data URI, and image generation edits it
    featured.upstream.enqueue(Reply(text="first"), Reply(text="Made it blue."))
    status, _, _ = await featured.post("/v1/chat/completions", body("Draw a red cat", features={"image_generation": True}, params=LEGACY))
    url = next(
        e["data"]["detail"]["files"][0]["url"]
        for e in await featured.events((await featured.services.store.list_turns(limit=1))[0].id)
        if e["data"].get("step") == "image_generation"
    )
    content = [{"type": "text", "text": "Make it blue"}, {"type": "image_url", "image_url": {"url": url}}]
    request = {"model": "gpt-test", "messages": [{"role": "user", "content": content}], "features": {"image_generation": True}, "params": LEGACY}
    status, data, _ = await featured.post("/v1/chat/completions", request)
    assert status == 200, data
    assert world.edits == 1 and world.image_prompts[-1] == "Make it blue", "an edit is asked in the user's words"
    sent = featured.upstream.requests[-1]["messages"][-1]["content"]
    image = next(p for p in sent if p["type"] == "image_url")["image_url"]["url"]
    assert image.startswith("data:image/png;base64,") and base64.b64decode(image.split(",", 1)[1]).startswith(b"\x89PNG")


async def test_native_generate_image_tool(featured: Service, world: World) -> None:
    featured.upstream.enqueue(
        Reply(tool_calls=[{"name": "generate_image", "arguments": {"prompt": "a red cat"}, "id": "g1"}], finish_reason="tool_calls"),
        Reply(text="Done."),
    )
    status, _, headers = await featured.post("/v1/chat/completions", body("draw", features={"image_generation": True}))
    assert status == 200 and world.image_prompts == ["a red cat"]
    result = json.loads(featured.upstream.requests[-1]["messages"][-1]["content"])
    assert result["status"] == "created" and result["images"][0].startswith("/v1/blobs/")
    events = await featured.events(headers["X-Turn-Id"])
    emitted = [e["data"]["event"] for e in events if e["type"] == "tool.event"]
    assert emitted == [{"type": "files", "data": {"files": [{"type": "image", "url": result["images"][0], "mime": "image/png"}]}}]
    assert "base64," not in json.dumps([e["data"] for e in events])  # no image bytes in the log


async def test_native_execute_code_runs_in_the_sandbox(featured: Service) -> None:
    featured.upstream.enqueue(
        Reply(tool_calls=[{"name": "execute_code", "arguments": {"code": "x = 6 * 7\nprint(x)\nx + 1"}, "id": "c1"}], finish_reason="tool_calls"),
        Reply(text="42."),
    )
    status, _, _ = await featured.post("/v1/chat/completions", body("compute", features={"code_interpreter": True}))
    assert status == 200
    result = json.loads(featured.upstream.requests[-1]["messages"][-1]["content"])
    assert result["stdout"].strip() == "42" and result["result"] == "43"


@pytest.mark.parametrize("more_settings", [{"web_search_count": 1}])
async def test_the_number_of_results_kept_per_query_is_the_setting(featured: Service, world: World) -> None:
    up = featured.upstream
    up.task_replies.append(("queries", Reply(text='{"queries": ["lisbon bakery hours"]}')))
    up.enqueue(Reply(text="At 7."))
    status, _, headers = await featured.post("/v1/chat/completions", body("When does the bakery open?", features={"web_search": True}, params=LEGACY))
    assert status == 200
    text = up.requests[-1]["messages"][-1]["content"]
    assert "The Lisbon bakery opens at 7 am." in text and "Cats sleep" not in text
    assert [s["url"] for s in (await featured.turn(headers["X-Turn-Id"]))["sources"]] == [world.url + "/page/bread"]


@pytest.mark.parametrize("more_settings", [{"models": {"gpt-test": {"function_calling": "default"}}}])
async def test_a_model_configured_for_prompt_based_calling_gets_the_code_interpreter(featured: Service) -> None:
    up = featured.upstream
    up.enqueue(Reply(text='Let me run it.\n<code_interpreter type="code" lang="python">\nprint(6 * 7)\n</code_interpreter>'), Reply(text="42."))
    status, _, headers = await featured.post("/v1/chat/completions", body("compute", features={"code_interpreter": True}))
    assert status == 200
    first, second = up.requests
    assert "<code_interpreter" in first["messages"][-1]["content"] and "tools" not in first  # the prompt, no native tools
    assert "<code_interpreter_output>\n42\n" in second["messages"][-1]["content"]  # the block ran
    view = await featured.turn(headers["X-Turn-Id"])
    assert [i["type"] for i in view["output"]][:2] == ["message", "code_interpreter"]


async def test_a_builtin_the_model_was_not_offered_is_not_run(featured: Service, world: World) -> None:
    up = featured.upstream
    up.enqueue(
        Reply(tool_calls=[{"name": "search_web", "arguments": {"query": "bakery"}, "id": "s1"}], finish_reason="tool_calls"),
        Reply(text="I cannot search."),
    )
    status, _, _ = await featured.post("/v1/chat/completions", body("When does the bakery open?"))  # web search not switched on
    assert status == 200
    assert "tools" not in up.requests[0]
    assert up.requests[1]["messages"][-1]["content"] == 'Error: Tool "search_web" not found.' and world.searches == []


FEATURE_FILTER = """
    class Filter:
        def inlet(self, body):
            body.setdefault("features", {})["web_search"] = True
            return body
"""


@pytest.fixture
def with_filter(tmp_path: Path) -> dict[str, Any]:
    return {"filters_dir": str(write_filters(tmp_path / "filters", {"search_on": FEATURE_FILTER}))}


async def test_an_inlet_filter_that_switches_a_feature_on_gives_the_model_its_tools(
    tmp_path: Path, upstream: ScriptedUpstream, database_url: str, world: World, with_filter: dict[str, Any]
) -> None:
    settings = make_settings(
        tmp_path, upstream.url, database_url=database_url, web_search_engine="searxng", searxng_url=world.url, fetch_allow=["127.0.0.1"], **with_filter
    )
    svc = await start_service(settings, upstream)
    try:
        upstream.enqueue(
            Reply(tool_calls=[{"name": "search_web", "arguments": {"query": "bakery"}, "id": "s1"}], finish_reason="tool_calls"),
            Reply(text="At 7 [1]."),
        )
        status, data, _ = await svc.post("/v1/chat/completions", body("When does the bakery open?"))
        assert status == 200, data
        assert sorted(t["function"]["name"] for t in upstream.requests[0]["tools"]) == ["fetch_url", "search_web"]
        assert world.searches == ["bakery"] and "warnings" not in data.get("turnlog", {})
    finally:
        await stop_service(svc)
