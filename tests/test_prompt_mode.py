"""Prompt-based function calling (``function_calling: "default"``, Open WebUI
0.12's ``"legacy"``) through the HTTP API and the scripted upstream.

The oracles are independent of the engine: what the scripted upstream was sent
(which model picked the tools, the ``<source id>`` blocks the answering model
read), a tool module that writes a line each time it really runs, an executor
that records the code it was given, and the usage the upstream reported.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from adapters.config import load_settings
from engine.fold.accumulator import Accumulator
from tests.documents import upload, wait_file
from tests.expressions import ExpressionExecutor
from tests.harness import Service, make_settings, sse_messages, start_service, stop_service
from tests.oracle import check_stream_against_log
from tests.test_approval import ran, write_ledger
from tests.tools_fixtures import write_tools
from tests.upstream import Reply, ScriptedUpstream

PROMPT = {"function_calling": "default"}
GUIDE = "# Sourdough guide\n\nProof the shaped dough in the fridge for 12 hours before baking.\n"


def question(text: str = "How long should the dough proof, and what is 20 plus 22?") -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def select(name: str, **parameters: Any) -> Reply:
    """The tool-selection reply of the task model."""
    return Reply(text=json.dumps({"tool_calls": [{"name": name, "parameters": parameters}]}))


def source_ids(text: str) -> list[str]:
    context = text[text.index("<context>") : text.index("</context>")]
    return re.findall(r'<source id="(\d+)"', context)


@pytest.fixture
async def prompt(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Service]:
    monkeypatch.setenv("TURNLOG_TEST_TOOL_LOG", str(tmp_path / "tool.log"))
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, tools_dir=str(write_tools(tmp_path / "tools")))
    svc = await start_service(settings, upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


# -- the name: "legacy" is prompt mode ---------------------------------------------------


async def test_legacy_is_open_webui_s_name_for_prompt_mode(prompt: Service) -> None:
    prompt.upstream.enqueue(select("add", a=20, b=22), Reply(text="42 [1]."))
    body = {"model": "gpt-test", "messages": question("20 plus 22?"), "tool_ids": ["weather"], "params": {"function_calling": "legacy"}}
    status, data, _ = await prompt.post("/v1/chat/completions", body)
    assert status == 200, data
    selection, main = prompt.upstream.requests
    assert "tools" not in selection and "tools" not in main, "prompt mode offers no native tools"
    assert selection["messages"][1]["content"] == "Query: 20 plus 22?"
    assert '<source id="1" name="weather/add">42</source>' in main["messages"][-1]["content"]


def test_a_model_configured_legacy_is_prompt_based(tmp_path: Path) -> None:
    config = tmp_path / "turnlog.toml"
    config.write_text('[models."gpt-test"]\nfunction_calling = "legacy"\n')
    assert load_settings(config).models["gpt-test"].function_calling == "default"


async def test_an_unknown_function_calling_mode_is_a_400(prompt: Service) -> None:
    body = {"model": "gpt-test", "messages": question(), "params": {"function_calling": "prompt"}}
    status, data, _ = await prompt.post("/v1/chat/completions", body)
    assert status == 400, data
    assert "function_calling" in data["error"]["message"] and '"legacy"' in data["error"]["message"]
    assert prompt.upstream.requests == []


# -- the task model selects ---------------------------------------------------------------


async def test_the_task_model_selects_the_tools(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNLOG_TEST_TOOL_LOG", str(tmp_path / "tool.log"))
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, tools_dir=str(write_tools(tmp_path / "tools")), task_model="gpt-other")
    svc = await start_service(settings, upstream)
    try:
        upstream.enqueue(select("add", a=20, b=22), Reply(text="42 [1]."))
        status, data, headers = await svc.post(
            "/v1/chat/completions", {"model": "gpt-test", "messages": question("20 plus 22?"), "tool_ids": ["weather"], "params": PROMPT}
        )
        assert status == 200, data
        selection, main = upstream.requests
        assert selection["model"] == "gpt-other", "the task model picks the tools"
        assert main["model"] == "gpt-test", "the turn's model answers"
        step = next(e["data"]["detail"] for e in await svc.events(headers["X-Turn-Id"]) if e["data"].get("step") == "legacy_tools")
        assert step["model"] == "gpt-other"
    finally:
        await stop_service(svc)


# -- one numbering across tool results and files ------------------------------------------


async def test_tool_results_and_files_share_one_numbering(prompt: Service) -> None:
    status, file = await upload(prompt.http, prompt.url, "guide.md", GUIDE.encode(), "text/markdown")
    assert status == 200, file
    assert (await wait_file(prompt.http, prompt.url, file["id"]))["status"] == "ready"
    prompt.upstream.task_replies.append(("queries", Reply(text='{"queries": ["dough proofing time"]}')))
    prompt.upstream.enqueue(select("add", a=20, b=22), Reply(text="12 hours [2]; 42 [1]."))
    body = {
        "model": "gpt-test",
        "messages": question(),
        "tool_ids": ["weather"],
        "files": [{"type": "file", "id": file["id"]}],
        "params": PROMPT,
        "stream": True,
    }
    async with prompt.http.post(prompt.v1 + "/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        raw = await resp.text()
        turn_id = resp.headers["X-Turn-Id"]
    _selection, main = prompt.upstream.requests
    text = main["messages"][-1]["content"]
    assert text.count("<context>") == 1, "one context block, tool results and files together"
    assert sorted(set(source_ids(text))) == ["1", "2"] and source_ids(text).count("1") == 1, text
    assert '<source id="1" name="weather/add">42</source>' in text
    assert re.search(r'<source id="2" name="guide.md"[^>]*>[^<]*12 hours', text), text
    # The client's citation list follows the numbering the model read.
    expected = [{"id": 1, "name": "weather/add", "type": "tool"}, {"id": 2, "name": "guide.md", "type": "file"}]
    assert (await prompt.turn(turn_id))["sources"] == expected
    listed = [json.loads(d)["turnlog"]["sources"] for _, d in sse_messages(raw) if d != "[DONE]" and "sources" in json.loads(d).get("turnlog", {})]
    assert listed == [expected], "the tool's source reached the streaming client as a citation"
    await check_stream_against_log(prompt, turn_id, raw)


# -- approval ---------------------------------------------------------------------------------


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.txt"
    monkeypatch.setenv("TURNLOG_TEST_LEDGER", str(path))
    return path


@pytest.fixture
async def bank(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, ledger: Path) -> AsyncIterator[Service]:
    tools = write_ledger(tmp_path / "tools")
    settings = make_settings(tmp_path, upstream.url, tools_dir=str(tools), database_url=database_url, tools={"transfer": {"approval": "ask"}})
    svc = await start_service(settings, upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


PAY = [{"role": "user", "content": "Pay the rent"}]


@pytest.mark.parametrize("mode", ["default", "legacy"])
async def test_prompt_mode_refuses_a_tool_configured_to_ask(bank: Service, ledger: Path, mode: str) -> None:
    bank.upstream.enqueue(select("transfer", amount=700, to="landlord"), Reply(text="Rent paid."))
    body = {"model": "gpt-test", "messages": PAY, "tool_ids": ["ledger"], "params": {"function_calling": mode}}
    status, data, _ = await bank.post("/v1/chat/completions", body)
    assert status == 400, data
    message = data["error"]["message"]
    assert "transfer" in message and "approval" in message and "native" in message, message
    assert ran(ledger) == [], "never run unasked"
    assert bank.upstream.requests == []


async def test_prompt_mode_refuses_when_the_request_asks_for_approval(bank: Service, ledger: Path) -> None:
    bank.upstream.enqueue(select("balance"), Reply(text="1000."))
    body = {"model": "gpt-test", "messages": PAY, "tool_ids": ["ledger"], "params": {**PROMPT, "tool_approval": "ask"}}
    status, data, _ = await bank.post("/v1/chat/completions", body)
    assert status == 400, data
    assert "balance" in data["error"]["message"]
    assert ran(ledger) == []


async def test_native_mode_still_waits_for_the_decision(bank: Service, ledger: Path) -> None:
    bank.upstream.enqueue(Reply(tool_calls=[{"id": "c1", "name": "transfer", "arguments": {"amount": 1, "to": "x"}}], finish_reason="tool_calls"))
    status, data, headers = await bank.post("/v1/chat/completions", {"model": "gpt-test", "messages": PAY, "tool_ids": ["ledger"]})
    assert status == 200 and data["turnlog"]["status"] == "waiting", data
    assert ran(ledger) == []
    status, _, _ = await bank.post(f"/v1/turns/{headers['X-Turn-Id']}/cancel")
    assert status == 202


# -- legacy <code_interpreter>: reading stops at the closing tag -----------------------------


@pytest.fixture
async def coder(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> AsyncIterator[tuple[Service, ExpressionExecutor]]:
    executor = ExpressionExecutor()
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url), upstream, code_executor=executor)
    try:
        yield svc, executor
    finally:
        await stop_service(svc)


CODE = {"params": PROMPT, "features": {"code_interpreter": True}}
FIRST_USAGE = {"prompt_tokens": 100, "completion_tokens": 30, "total_tokens": 130}
SECOND_USAGE = {"prompt_tokens": 150, "completion_tokens": 5, "total_tokens": 155}


@pytest.mark.parametrize("stream", [False, True])
async def test_reading_stops_at_the_closing_tag_and_the_block_runs(coder: tuple[Service, ExpressionExecutor], stream: bool) -> None:
    svc, executor = coder
    svc.upstream.enqueue(
        Reply(
            chunks=[
                'Let me compute.\n<code_interpreter type="code" lang="python">\nprint(6 * ',
                "7)\n</code_inter",
                "preter> I guess it prints 41.",  # the model goes on writing, unasked
                " So the answer is 41.",
            ],
            usage=FIRST_USAGE,
        ),
        Reply(text="The answer is 42.", usage=SECOND_USAGE),
    )
    body = {"model": "gpt-test", "messages": question("6 times 7?"), "stream": stream, **CODE}
    async with svc.http.post(svc.v1 + "/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        raw = await resp.text()
        turn_id = resp.headers["X-Turn-Id"]
    assert executor.ran == ["print(6 * 7)"], "the block runs"
    first, second = svc.upstream.requests
    replayed = json.dumps(second["messages"])
    assert "guess" not in replayed and "answer is 41" not in replayed, "what the model wrote after the block is not sent back"
    view = await svc.turn(turn_id)
    assert not any(w in json.dumps(view["output"]) + view["content"] for w in ("guess", "answer is 41"))
    assert view["content"].endswith("The answer is 42.")
    code = [i for i in view["output"] if i["type"] == "code_interpreter"]
    assert [c["output"] for c in code] == [{"stdout": "42"}]
    # The upstream's usage of the cut response is kept.
    assert view["usage"]["input_tokens"] == 250 and view["usage"]["output_tokens"] == 35, view["usage"]
    warnings = [e["data"]["message"] for e in await svc.events(turn_id) if e["type"] == "model.warning"]
    assert any("</code_interpreter>" in w for w in warnings), warnings
    if stream:
        assert "guess" not in raw and "answer is 41" not in raw, "nor streamed to the client"


PROMPT_FILTER = """
class Filter:
    def inlet(self, body: dict, __user__: dict | None = None) -> dict:
        body["params"] = {**(body.get("params") or {}), "function_calling": "default"}
        return body
"""


async def test_a_filter_that_turns_prompt_mode_on_never_selects_a_tool_that_asks(
    tmp_path: Path, upstream: ScriptedUpstream, database_url: str, ledger: Path
) -> None:
    # The request is native (it passes the check at the start); the inlet
    # filter makes it prompt-based, so only the assembly can hold the tool back.
    filters = tmp_path / "filters"
    filters.mkdir()
    (filters / "prompt_mode.py").write_text(PROMPT_FILTER)
    settings = make_settings(
        tmp_path,
        upstream.url,
        database_url=database_url,
        tools_dir=str(write_ledger(tmp_path / "tools")),
        filters_dir=str(filters),
        tools={"transfer": {"approval": "ask"}},
    )
    svc = await start_service(settings, upstream)
    try:
        upstream.enqueue(select("transfer", amount=700, to="landlord"), Reply(text="Not paid."))
        status, data, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": PAY, "tool_ids": ["ledger"]})
        assert status == 200, data
        assert ran(ledger) == [], "never run unasked"
        selection, _main = upstream.requests
        offered = selection["messages"][0]["content"]
        assert '"balance"' in offered and '"transfer"' not in offered, "not offered for selection"
        step = next(e["data"]["detail"] for e in await svc.events(headers["X-Turn-Id"]) if e["data"].get("step") == "legacy_tools")
        assert step["needs_approval"] == ["transfer"] and step["calls"] == []
    finally:
        await stop_service(svc)


def _fold(chunks: list[str], *, stop_after_code: bool) -> Accumulator:
    counter = iter(range(1000))
    acc = Accumulator(id_factory=lambda prefix: f"{prefix}_{next(counter)}", code_interpreter=True, stop_after_code=stop_after_code)
    for chunk in chunks:
        acc.feed_text(chunk)
    acc.finish()
    return acc


CHUNKS = ["Run:\n<code_interpreter>print(1)</code_inter", "preter>\nIt prints 2.", " Done."]


def test_the_fold_ends_the_answer_at_the_closing_tag() -> None:
    acc = _fold(CHUNKS, stop_after_code=True)
    assert [i["type"] for i in acc.output] == ["message", "code_interpreter"]
    assert acc.pending_code is not None and acc.pending_code["code"] == "print(1)"
    assert acc.content == "Run:\n<code_interpreter>print(1)</code_interpreter>" and acc.code_closed


def test_logs_written_before_the_cut_fold_as_they_did() -> None:
    # No code_cut in their assembly: the text after the block stays (and the block never ran).
    acc = _fold(CHUNKS, stop_after_code=False)
    assert [i["type"] for i in acc.output] == ["message", "code_interpreter", "message"]
    assert acc.pending_code is None and acc.content == "".join(CHUNKS)


def test_an_empty_block_does_not_end_the_answer() -> None:
    acc = _fold(["<code_interpreter> </code_interpreter>", "No code after all."], stop_after_code=True)
    assert not acc.code_closed and acc.text == "No code after all."
