"""Files in a turn: a request names files or collections; the turn waits for
those still being ingested (bounded), asks the task model for search queries,
retrieves, and puts the sources as ``<source id="N">`` blocks into the last user
message (or the system message) — exactly once per model request, also across a
3-round tool loop, with the ids the model cites kept for the whole turn. The
turn view and the stream carry the source list; what could not be used is said.
The oracle: the exact messages the scripted upstream received.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.documents import upload, wait_file
from tests.harness import Service, make_settings, sse_messages, start_service, stop_service
from tests.oracle import check_stream_against_log
from tests.tools_fixtures import write_tools
from tests.upstream import Reply, ScriptedUpstream

GUIDE = """# Sourdough guide

Feed the starter twice a day with equal weights of flour and water.

Proof the shaped dough in the fridge for 12 hours before baking.

Bake at 250 degrees for 20 minutes with steam, then 20 minutes without.
"""

OTHER = """# Bicycle maintenance

Oil the chain every 300 kilometres and check the tyre pressure weekly.
"""


@pytest.fixture
async def rag(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> AsyncIterator[Service]:
    settings = make_settings(
        tmp_path, upstream.url, database_url=database_url, chunk_tokens=24, chunk_overlap_tokens=4, tools_dir=str(write_tools(tmp_path / "tools"))
    )
    svc = await start_service(settings, upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


async def add(svc: Service, name: str, text: str) -> str:
    status, body = await upload(svc.http, svc.url, name, text.encode(), "text/markdown")
    assert status == 200, body
    assert (await wait_file(svc.http, svc.url, body["id"]))["status"] == "ready"
    return str(body["id"])


def question(text: str = "How long should the dough proof?") -> list[dict[str, Any]]:
    return [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": text}]


def source_blocks(text: str) -> list[str]:
    """The ``<source ...>`` blocks inside the ``<context>`` (the template's own
    guidelines mention the tag too)."""
    context = text[text.index("<context>") : text.index("</context>")]
    return context.split("<source ")[1:]


def user_text(message: dict[str, Any]) -> str:
    return message["content"] if isinstance(message["content"], str) else "".join(p.get("text", "") for p in message["content"])


async def test_sources_go_into_the_last_user_message_once(rag: Service) -> None:
    guide = await add(rag, "guide.md", GUIDE)
    await add(rag, "bikes.md", OTHER)  # not named by the request: never retrieved
    rag.upstream.task_replies.append(("queries", Reply(text='{"queries": ["dough proofing time fridge"]}')))
    rag.upstream.enqueue(Reply(text="12 hours in the fridge [1]."))
    status, data, headers = await rag.post("/v1/chat/completions", {"model": "gpt-test", "messages": question(), "files": [{"type": "file", "id": guide}]})
    assert status == 200, data
    (sent,) = rag.upstream.requests
    messages = sent["messages"]
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0] == {"role": "system", "content": "Answer briefly."}
    text = user_text(messages[1])
    assert text.endswith("How long should the dough proof?") and text.count("<context>") == 1
    blocks = source_blocks(text)
    assert blocks and all(b.startswith('id="1" name="guide.md"') for b in blocks)
    assert "Proof the shaped dough in the fridge for 12 hours" in text and "Bicycle" not in text
    # the task model wrote the query; the sources are in the view and were recorded
    assert "How long should the dough proof?" in rag.upstream.task_requests[0]["messages"][-1]["content"]
    view = await rag.turn(headers["X-Turn-Id"])
    assert view["sources"] == [{"id": 1, "name": "guide.md", "type": "file"}]
    events = await rag.events(headers["X-Turn-Id"])
    step = next(e["data"]["detail"] for e in events if e["data"].get("step") == "files")
    assert step["queries"] == ["dough proofing time fridge"] and step["files"][0]["status"] == "ready"


async def test_a_three_round_tool_loop_carries_the_sources_once_per_request(rag: Service) -> None:
    guide = await add(rag, "guide.md", GUIDE)
    up = rag.upstream

    def calls(n: int) -> Reply:
        return Reply(tool_calls=[{"name": "add", "arguments": {"a": n, "b": 1}, "id": f"call_{n}"}], finish_reason="tool_calls")

    up.enqueue(calls(1), calls(2), calls(3), Reply(text="Done [1]."))
    async with rag.http.post(
        rag.v1 + "/chat/completions",
        json={"model": "gpt-test", "messages": question(), "files": [{"type": "file", "id": guide}], "tool_ids": ["weather"], "stream": True},
    ) as resp:
        raw = await resp.text()
        turn_id = resp.headers["X-Turn-Id"]
    assert len(up.requests) == 4
    first = up.requests[0]["messages"]
    for n, request in enumerate(up.requests):
        messages = request["messages"]
        context = [m for m in messages if "<source " in json.dumps(m)]
        assert len(context) == 1, f"request {n}: the sources once"
        assert messages[: len(first)] == first, f"request {n}: the context is the first request's, not rebuilt or piled up"
        assert len(messages) == len(first) + 2 * n  # each round adds its call and its result, nothing else
    # the source list reached the streaming client, with the ids the model cites
    listed = [json.loads(d)["turnlog"]["sources"] for _, d in sse_messages(raw) if d != "[DONE]" and "sources" in json.loads(d).get("turnlog", {})]
    assert listed == [[{"id": 1, "name": "guide.md", "type": "file"}]]
    await check_stream_against_log(rag, turn_id, raw)


async def test_rag_system_context_puts_the_sources_in_the_system_message(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, rag_system_context=True), upstream)
    try:
        guide = await add(svc, "guide.md", GUIDE)
        upstream.enqueue(Reply(text="ok"))
        status, _, _ = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": question(), "files": [{"type": "file", "id": guide}]})
        assert status == 200
        messages = upstream.requests[-1]["messages"]
        # the user message only lists the attached file (for the model's file tools)
        attached = f'<attached_files>\n<file type="file" id="{guide}"/>\n</attached_files>\n\n'
        assert messages[1] == {"role": "user", "content": [{"type": "text", "text": attached}, {"type": "text", "text": "How long should the dough proof?"}]}
        assert messages[0]["content"].startswith("Answer briefly.") and '<source id="1" name="guide.md"' in messages[0]["content"]
    finally:
        await stop_service(svc)


async def test_full_context_sends_the_whole_document_without_queries(rag: Service) -> None:
    guide = await add(rag, "guide.md", GUIDE)
    rag.upstream.enqueue(Reply(text="ok"))
    status, _, headers = await rag.post(
        "/v1/chat/completions", {"model": "gpt-test", "messages": question(), "files": [{"type": "file", "id": guide, "context": "full"}]}
    )
    assert status == 200
    text = user_text(rag.upstream.requests[-1]["messages"][-1])
    for line in ("Feed the starter", "Proof the shaped dough", "Bake at 250 degrees"):
        assert line in text
    assert rag.upstream.task_requests == []  # no query generation
    step = next(e["data"]["detail"] for e in await rag.events(headers["X-Turn-Id"]) if e["data"].get("step") == "files")
    assert "queries" not in step


async def test_files_that_cannot_be_used_are_said_and_the_turn_goes_on(rag: Service) -> None:
    rag.upstream.enqueue(Reply(text="answer without files"))
    status, data, _ = await rag.post("/v1/chat/completions", {"model": "gpt-test", "messages": question(), "files": [{"type": "file", "id": "file_nobody"}]})
    assert status == 200 and data["choices"][0]["message"]["content"] == "answer without files"
    assert data["turnlog"]["warnings"] == ["file file_nobody was not used: no such file"]
    assert "<source" not in json.dumps(rag.upstream.requests[-1]["messages"])


async def test_an_echoed_query_template_falls_back_to_the_user_message_with_a_warning(rag: Service) -> None:
    """A task model that repeats the template's example gives no queries: the
    user's message is searched, and the client is told."""
    guide = await add(rag, "guide.md", GUIDE)
    rag.upstream.task_replies.append(("queries", Reply(text='{"queries": ["query1", "query2"]}')))
    rag.upstream.enqueue(Reply(text="12 hours."))
    status, data, headers = await rag.post("/v1/chat/completions", {"model": "gpt-test", "messages": question(), "files": [{"type": "file", "id": guide}]})
    assert status == 200, data
    assert "Proof the shaped dough in the fridge for 12 hours" in user_text(rag.upstream.requests[-1]["messages"][-1])
    events = await rag.events(headers["X-Turn-Id"])
    step = next(e["data"]["detail"] for e in events if e["data"].get("step") == "files")
    assert step["queries"] == ["How long should the dough proof?"]
    (warning,) = data["turnlog"]["warnings"]
    assert "no usable search queries" in warning and "query1" in warning and "user's message" in warning
    assert (await rag.turn(headers["X-Turn-Id"]))["warnings"] == [warning]


FETCH_TOOL = """
class Tools:
    def fetch_url(self, url: str) -> str:
        \"\"\"Fetch a page.\"\"\"
        return "The bakery opens at 7 am every day."
"""


async def test_tool_citations_rebuild_the_context_from_its_snapshot_with_stable_ids(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "web.py").write_text(FETCH_TOOL)
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, tools_dir=str(tools)), upstream)
    try:
        guide = await add(svc, "guide.md", GUIDE)
        upstream.enqueue(
            Reply(tool_calls=[{"name": "fetch_url", "arguments": {"url": "https://bakery.example/hours"}, "id": "f1"}], finish_reason="tool_calls"),
            Reply(text="Opens at 7 [2]; proof 12 hours [1]."),
        )
        status, data, headers = await svc.post(
            "/v1/chat/completions",
            {"model": "gpt-test", "messages": question(), "files": [{"type": "file", "id": guide}], "tool_ids": ["web"]},
        )
        assert status == 200, data
        first, second = (r["messages"] for r in upstream.requests)
        before, after = user_text(first[1]), user_text(second[1])

        def heads(text: str) -> list[str]:
            return [" ".join(b.split(">")[0].split()[:2]) for b in source_blocks(text)]

        assert heads(before) == ['id="1" name="guide.md"']
        # rebuilt from the pre-context message: the file keeps [1] (with its
        # text), the tool's page is [2] (a marker: its text is in the tool result)
        assert heads(after) == ['id="1" name="guide.md"', 'id="2" name="https://bakery.example/hours"']
        assert after.count("<context>") == 1 and after.endswith("How long should the dough proof?")
        assert "The bakery opens at 7 am" not in after.split("</context>")[0]
        assert second[2:] == [m for m in second[2:] if m["role"] in ("assistant", "tool")]  # the call and its result
        view = await svc.turn(headers["X-Turn-Id"])
        assert [s["id"] for s in view["sources"]] == [1, 2] and view["sources"][1]["name"] == "https://bakery.example/hours"
    finally:
        await stop_service(svc)


async def test_each_turns_files_are_listed_with_its_own_user_message(rag: Service) -> None:
    first = await add(rag, "guide.md", GUIDE)
    second = await add(rag, "bikes.md", OTHER)
    rag.upstream.enqueue(Reply(text="one"), Reply(text="two"), Reply(text="three"))
    for text, file_id in (("About bread?", first), ("About bikes?", second)):
        status, _, headers = await rag.post(
            "/v1/chat/completions",
            {"model": "gpt-test", "chat_id": "paired", "messages": [{"role": "user", "content": text}], "files": [{"type": "file", "id": file_id}]},
        )
        assert status == 200
        await rag.wait_status(headers["X-Turn-Id"], "completed")
    users = [m for m in rag.upstream.requests[-1]["messages"] if m["role"] == "user"]
    assert [u["content"][0]["text"] for u in users] == [
        f'<attached_files>\n<file type="file" id="{first}"/>\n</attached_files>\n\n',
        f'<attached_files>\n<file type="file" id="{second}"/>\n</attached_files>\n\n',
    ]
    assert "About bread?" in json.dumps(users[0]) and "About bikes?" in json.dumps(users[1])
    # prompt-based function calling: no file tools, no listing
    status, _, _ = await rag.post(
        "/v1/chat/completions",
        {
            "model": "gpt-test",
            "messages": [{"role": "user", "content": "q"}],
            "files": [{"type": "file", "id": first}],
            "params": {"function_calling": "default"},
        },
    )
    assert status == 200 and "<attached_files>" not in json.dumps(rag.upstream.requests[-1]["messages"])
