"""MCP tool servers end to end: turnlog against the ``mcp`` package's own server.

The server (tests/mcp_server.py) runs in a subprocess on a loopback port and
counts what crosses its wire; the oracle is what it saw (sessions created and
ended, each call and its arguments) and what the scripted upstream received,
checked against the turn's log and its fold — never turnlog's word alone.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from adapters.config import load_settings
from adapters.tools.mcp import McpServerConfig, McpServers, function_name, function_names
from engine.ports import NoTools
from engine.tools.calls import ToolContext, execute_tool_call
from tests.harness import Service, make_settings, start_service, stop_service
from tests.mcp_server import POSTER
from tests.oracle import check_completion_against_turn, check_stream_against_log, read_stream
from tests.processes import ROOT, free_port
from tests.upstream import Reply, ScriptedUpstream

USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Use the tools."}]
PIXEL_URL = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


# -- the MCP server ----------------------------------------------------------------


@pytest.fixture(scope="module")
def mcp_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``http://127.0.0.1:PORT/mcp`` of a running tests/mcp_server.py."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("mcp") / "mcp-server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tests.mcp_server", str(port)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while True:
                assert proc.poll() is None, log_path.read_text(errors="replace")
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=1).read()
                    break
                except OSError:
                    assert time.monotonic() < deadline, log_path.read_text(errors="replace")
                    time.sleep(0.05)
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


class Wire:
    """What the MCP server saw since this object was made."""

    def __init__(self, service: Service, mcp_url: str) -> None:
        self.service = service
        self.url = mcp_url.removesuffix("/mcp") + "/stats"
        self.base: dict[str, int] = {}

    async def _stats(self) -> dict[str, Any]:
        async with self.service.http.get(self.url) as resp:
            assert resp.status == 200
            body: dict[str, Any] = await resp.json()
            return body

    async def mark(self) -> None:
        self.base = {k: len(v) for k, v in (await self._stats()).items()}

    async def since(self) -> dict[str, list[Any]]:
        return {k: v[self.base.get(k, 0) :] for k, v in (await self._stats()).items()}

    async def wait_ended(self, sessions: list[str], timeout: float = 10.0) -> dict[str, list[Any]]:
        """The stats once every session in ``sessions`` has been ended by its client."""
        deadline = time.monotonic() + timeout
        while True:
            seen = await self.since()
            if set(sessions) <= set(seen["deleted"]):
                return seen
            assert time.monotonic() < deadline, f"sessions not closed: {sessions}; deleted: {seen['deleted']}"
            await asyncio.sleep(0.02)


# -- the service ------------------------------------------------------------------


@pytest.fixture
async def mcp_service(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, mcp_url: str) -> AsyncIterator[Service]:
    servers = {"tools": {"url": mcp_url, "timeout": 1.0}}
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, mcp_servers=servers), upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)  # verifies every finished turn (chain + re-run from the log)


def call(name: str, arguments: object, id: str) -> dict[str, Any]:
    return {"name": name, "arguments": arguments, "id": id}


def tool_reply(*calls: dict[str, Any]) -> Reply:
    return Reply(tool_calls=list(calls), finish_reason="tool_calls")


async def run(service: Service, **extra: Any) -> tuple[str, dict[str, Any]]:
    body = {"model": "gpt-test", "messages": USER, "tool_ids": ["mcp:tools"], **extra}
    status, data, headers = await service.post("/v1/chat/completions", body)
    assert status == 200, data
    return headers["X-Turn-Id"], data


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == kind]


async def verify(service: Service, turn_id: str) -> None:
    status, body = await service.get(f"/v1/turns/{turn_id}/verify")
    assert status == 200 and body["ok"], body


# -- tests ------------------------------------------------------------------------


async def test_list_and_calls_share_one_session_that_closes_with_the_turn(mcp_service: Service, mcp_url: str) -> None:
    wire = Wire(mcp_service, mcp_url)
    await wire.mark()
    up = mcp_service.upstream
    up.enqueue(
        tool_reply(call("tools_echo", {"text": "hi", "extra": 1}, "c1"), call("tools_add", {"a": 2, "b": 3}, "c2")),
        tool_reply(call("tools_echo", {"text": "again"}, "c3")),
        Reply(text="Done: hi, 5, again."),
    )
    client = openai.AsyncOpenAI(base_url=mcp_service.v1, api_key="unused")
    raw = await client.chat.completions.with_raw_response.create(model="gpt-test", messages=USER, extra_body={"tool_ids": ["mcp:tools"]})
    completion = raw.parse()
    turn_id = raw.headers["x-turn-id"]
    assert completion.choices[0].message.content == "Done: hi, 5, again."

    # The model was offered the server's tools, named server_tool, with the server's schemas.
    offered = {t["function"]["name"]: t["function"] for t in up.requests[0]["tools"]}
    assert {"tools_echo", "tools_add", "tools_pixel", "tools_documents", "tools_boom", "tools_hang"} <= set(offered)
    assert offered["tools_add"]["parameters"]["properties"].keys() == {"a", "b"}
    assert offered["tools_add"]["parameters"]["required"] == ["a", "b"]
    assert offered["tools_echo"]["description"] == "Say the text back."
    # The server's instructions are in the system message.
    system = up.requests[0]["messages"][0]
    assert system["role"] == "system" and "Numbers are added with the add tool." in system["content"]

    # The server saw one session, three calls in it with the arguments unfiltered
    # (the MCP bypass), and the session ended when the turn did.
    seen = await wire.since()
    assert len(seen["sessions"]) == 1, seen
    (session,) = seen["sessions"]
    seen = await wire.wait_ended([session])
    calls = [(c["session"], c["name"], c["arguments"]) for c in seen["calls"]]
    first_batch = [(session, "echo", {"text": "hi", "extra": 1}), (session, "add", {"a": 2, "b": 3})]
    assert sorted(calls[:2], key=repr) == sorted(first_batch, key=repr)  # one batch, run concurrently
    assert calls[2:] == [(session, "echo", {"text": "again"})]
    assert seen["deleted"] == [session]

    # The log records the calls and results; the model got those results back.
    events = await mcp_service.events(turn_id)
    step = [d for d in of_type(events, "assembly.step") if d["step"] == "tool_servers"]
    assert step and "tools_echo" in step[0]["detail"]["servers"]["mcp:tools"]
    started = {d["call_id"]: d for d in of_type(events, "tool.started")}
    assert json.loads(started["c1"]["arguments"]) == {"text": "hi", "extra": 1}
    assert started["c1"]["tool_id"] == "mcp:tools" and started["c1"]["kind"] == "server"
    completed = {d["call_id"]: d for d in of_type(events, "tool.completed")}
    assert completed["c1"]["output"] == "hi" and completed["c1"]["status"] == "completed"
    assert json.loads(completed["c2"]["output"]) == {"sum": 5}
    assert completed["c3"]["output"] == "again"
    tool_messages = {m["tool_call_id"]: m["content"] for m in up.requests[2]["messages"] if m["role"] == "tool"}
    assert tool_messages == {"c1": "hi", "c2": completed["c2"]["output"], "c3": "again"}

    check_completion_against_turn(raw.http_response.json(), await mcp_service.turn(turn_id))
    await check_stream_against_log(mcp_service, turn_id, await read_stream(mcp_service, turn_id))
    await verify(mcp_service, turn_id)
    calls_before = len((await wire.since())["calls"])
    await verify(mcp_service, turn_id)  # a replay never calls the server
    assert len((await wire.since())["calls"]) == calls_before


async def test_image_and_resource_results(mcp_service: Service) -> None:
    up = mcp_service.upstream
    up.enqueue(
        tool_reply(call("tools_pixel", {}, "p1"), call("tools_documents", {}, "d1"), call("tools_poster", {}, "l1")),
        Reply(text="A pixel, two documents and a poster."),
    )
    turn_id, _ = await run(mcp_service)
    completed = {d["call_id"]: d for d in of_type(await mcp_service.events(turn_id), "tool.completed")}
    # A large image is stored as a blob, as any tool's: the log holds its reference.
    (poster,) = completed["l1"]["files"]
    assert poster["type"] == "image" and poster["url"]["mime"] == "image/png"
    async with mcp_service.http.get(mcp_service.url + poster["url"]["url"]) as resp:
        assert resp.status == 200 and await resp.read() == POSTER
    # As Open WebUI processes MCP results: text parts are the text, image parts become image files.
    assert completed["p1"]["output"] == "a red pixel"
    assert completed["p1"]["images"] == [PIXEL_URL]
    assert completed["p1"]["files"] == [{"type": "image", "url": PIXEL_URL}]
    # A text resource is its text, a binary one a placeholder naming it.
    assert json.loads(completed["d1"]["output"]) == {"results": ["the notes", "[Resource: file:///a.zip] (binary data, mimeType: application/zip)"]}
    # The image reaches the model as an image, after the tool messages.
    sent = up.requests[1]["messages"]
    assert {"role": "tool", "tool_call_id": "p1", "content": "a red pixel"} in sent
    images = [m for m in sent if m["role"] == "user" and isinstance(m["content"], list)]
    assert {"type": "image_url", "image_url": {"url": PIXEL_URL}} in images[-1]["content"]
    await verify(mcp_service, turn_id)


async def test_a_raising_and_a_hanging_tool_are_error_results(mcp_service: Service, mcp_url: str) -> None:
    wire = Wire(mcp_service, mcp_url)
    await wire.mark()
    up = mcp_service.upstream
    up.enqueue(
        tool_reply(call("tools_boom", {"reason": "x"}, "b1"), call("tools_hang", {}, "h1")),
        tool_reply(call("tools_echo", {"text": "still here"}, "e1")),
        Reply(text="One failed, one hung, then it worked."),
    )
    turn_id, _ = await run(mcp_service)
    view = await mcp_service.turn(turn_id)
    assert view["status"] == "completed"
    completed = {d["call_id"]: d for d in of_type(await mcp_service.events(turn_id), "tool.completed")}
    assert completed["b1"]["status"] == "failed"
    assert json.loads(completed["b1"]["output"]) == {"error": "Error executing tool boom"}
    assert completed["h1"]["status"] == "failed"
    assert completed["h1"]["output"] == 'Error: Tool "tools_hang" did not finish within 1 seconds and was cancelled.'
    # The session outlived both failures: the next call used it.
    assert completed["e1"]["output"] == "still here"
    seen = await wire.since()
    assert len(seen["sessions"]) == 1 and {c["session"] for c in seen["calls"]} == set(seen["sessions"])
    await wire.wait_ended(seen["sessions"])
    await verify(mcp_service, turn_id)


async def test_a_cancel_during_a_call_ends_the_session(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, mcp_url: str) -> None:
    servers = {"tools": {"url": mcp_url, "timeout": 60}}
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, mcp_servers=servers), upstream)
    wire = Wire(svc, mcp_url)
    try:
        await wire.mark()
        upstream.enqueue(tool_reply(call("tools_hang", {}, "h1")))
        body = {"model": "gpt-test", "stream": True, "messages": USER, "tool_ids": ["mcp:tools"]}
        async with svc.http.post(svc.v1 + "/chat/completions", json=body) as resp:
            turn_id = resp.headers["X-Turn-Id"]
            deadline = time.monotonic() + 10
            while not (await wire.since())["calls"]:  # the server has the call
                assert time.monotonic() < deadline, "the call never reached the server"
                await asyncio.sleep(0.02)
            status, _, _ = await svc.post(f"/v1/turns/{turn_id}/cancel")
            assert status == 202
            await resp.text()
        assert (await svc.turn(turn_id))["status"] == "cancelled"
        seen = await wire.since()
        assert len(seen["sessions"]) == 1
        await wire.wait_ended(seen["sessions"])
    finally:
        await stop_service(svc)


async def test_prompt_based_function_calling_picks_and_runs_mcp_tools(mcp_service: Service, mcp_url: str) -> None:
    wire = Wire(mcp_service, mcp_url)
    await wire.mark()
    up = mcp_service.upstream
    up.enqueue(
        Reply(text='{"tool_calls": [{"name": "tools_add", "parameters": {"a": 20, "b": 22, "note": "kept"}}]}'),
        Reply(text="The sum is 42 [1]."),
    )
    turn_id, body = await run(mcp_service, params={"function_calling": "default"})
    assert body["choices"][0]["message"]["content"] == "The sum is 42 [1]."
    selection, main = up.requests
    assert "tools_add" in selection["messages"][0]["content"]  # the listed tools were offered for selection
    assert "tools" not in main
    assert '<source id="1" name="mcp:tools/tools_add">' in main["messages"][-1]["content"]
    seen = await wire.since()
    assert [(c["name"], c["arguments"]) for c in seen["calls"]] == [("add", {"a": 20, "b": 22, "note": "kept"})]
    await wire.wait_ended(seen["sessions"])
    await verify(mcp_service, turn_id)


async def test_unreachable_and_silent_servers_are_warnings(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, mcp_url: str) -> None:
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepts, reads, never answers

    black_hole = await asyncio.start_server(silent, "127.0.0.1", 0)
    hole_port = black_hole.sockets[0].getsockname()[1]
    servers = {
        "tools": {"url": mcp_url},
        "down": {"url": f"http://127.0.0.1:{free_port()}/mcp"},
        "silent": {"url": f"http://127.0.0.1:{hole_port}/mcp", "connect_timeout": 0.5},
    }
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, mcp_servers=servers), upstream)
    try:
        upstream.enqueue(Reply(text="Without two of the servers."))
        async with svc.http.post(
            svc.v1 + "/chat/completions",
            json={"model": "gpt-test", "stream": True, "messages": USER, "tool_ids": ["mcp:down", "mcp:silent", "mcp:tools"]},
        ) as resp:
            assert resp.status == 200
            turn_id = resp.headers["X-Turn-Id"]
            raw = await resp.text()
        view = await svc.turn(turn_id)
        assert view["status"] == "completed"
        assert any(w.startswith("Failed to connect to MCP server 'down':") for w in view["warnings"]), view["warnings"]
        assert any(w.startswith("Failed to connect to MCP server 'silent':") for w in view["warnings"]), view["warnings"]
        stream = await check_stream_against_log(svc, turn_id, raw)  # the stream carried the warnings
        assert stream is not None
        names = {t["function"]["name"] for t in upstream.requests[0]["tools"]}
        assert "tools_echo" in names and not any(n.startswith(("down_", "silent_")) for n in names)
        await verify(svc, turn_id)
        # Unknown servers are a 400 naming them, as unknown tool modules are.
        status, body, _ = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "tool_ids": ["mcp:nope"]})
        assert status == 400 and "mcp:nope" in body["error"]["message"]
    finally:
        await stop_service(svc)
        black_hole.close()
        for writer in held:
            writer.close()
        await black_hole.wait_closed()


# -- the adapter on its own ---------------------------------------------------------


def test_function_names_fit_64_characters_and_stay_unique() -> None:
    assert function_name("srv", "echo") == "srv_echo"
    assert function_name("srv", "a.b/c") == "srv_a_b_c"
    long_a, long_b = function_name("srv", "x" * 80 + "a"), function_name("srv", "x" * 80 + "b")
    assert len(long_a) == len(long_b) == 64 and long_a[:55] == long_b[:55] and long_a != long_b
    names = function_names("srv", ["a.b", "a_b"])
    assert len(names) == 2 and set(names.values()) == {"a.b", "a_b"}


async def test_a_resumed_turn_finds_its_tools_without_listing_first(mcp_url: str) -> None:
    """A turn resumed in another process calls a tool its assembly listed: the
    handle is found by name and the session opened at the call."""
    servers = McpServers({"tools": McpServerConfig(mcp_url)}, NoTools())
    assert servers.known_ids() == {"mcp:tools"}
    turn = servers.open(["mcp:tools"])
    try:
        handle = turn.handle("tools_echo")
        assert handle is not None and turn.handle("other_echo") is None
        ctx = ToolContext(user={}, messages=[], files=[], metadata={}, emit=None)
        execution = await execute_tool_call("tools_echo", '{"text": "resumed"}', {"tools_echo": handle}, ctx)
        assert execution.result.text == "resumed"
        missing = turn.handle("tools_nothing")
        assert missing is not None
        failed = await execute_tool_call("tools_nothing", "{}", {"tools_nothing": missing}, ctx)
        assert failed.result.status == "failed" and "has no tool named" in (failed.error or "")
    finally:
        await turn.close()


def test_configuration_from_the_environment_and_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNLOG_MCP_SERVERS", json.dumps({"a": {"url": "http://h/mcp", "headers": {"Authorization": "Bearer t"}}}))
    settings = load_settings(None)
    assert settings.mcp_servers["a"].url == "http://h/mcp" and settings.mcp_servers["a"].headers == {"Authorization": "Bearer t"}
    monkeypatch.delenv("TURNLOG_MCP_SERVERS")
    config = tmp_path / "turnlog.toml"
    config.write_text('[mcp.files]\nurl = "http://f/mcp"\ntimeout = 5\n\n[mcp.files.headers]\nX-Key = "k"\n')
    settings = load_settings(config)
    assert settings.mcp_servers["files"].timeout == 5 and settings.mcp_servers["files"].headers == {"X-Key": "k"}
    config.write_text('[mcp."bad name"]\nurl = "http://f/mcp"\n')
    with pytest.raises(ValueError, match="bad name"):
        load_settings(config)
    config.write_text('[mcp.f]\nurl = "http://f/mcp"\ntimout = 5\n')
    with pytest.raises(ValueError, match="timout"):
        load_settings(config)
