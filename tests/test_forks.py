"""Forks (``POST /v1/turns/{id}/fork``, ``turnlog fork``): a finished turn continued
from one of its events as a new turn, with another model or given tool outputs.

The oracles are what the scripted upstream received and the parent's stored
events; every turn here (forks included) is re-verified at teardown.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from adapters.cli import scratch_store
from engine.events import Event
from engine.run.verify import VerifyResult, verify_turn
from tests.harness import UPSTREAM_KEY, Service, make_settings, start_service, stop_service
from tests.oracle import check_stream_against_log, read_stream
from tests.processes import Server, cli, get_json, wait_for, wait_for_output
from tests.test_cli import turnlog
from tests.tools_fixtures import write_tools
from tests.upstream import Reply, ScriptedUpstream

USER = [{"role": "user", "content": "Add some numbers"}]


def add(a: int, b: int, id: str) -> dict[str, Any]:
    return {"name": "add", "arguments": {"a": a, "b": b}, "id": id}


def tool_reply(*calls: dict[str, Any]) -> Reply:
    return Reply(tool_calls=list(calls), finish_reason="tool_calls")


@pytest.fixture
async def agent(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Service]:
    monkeypatch.setenv("TURNLOG_TEST_TOOL_LOG", str(tmp_path / "tool.log"))
    tools = write_tools(tmp_path / "tools")
    svc = await start_service(make_settings(tmp_path, upstream.url, tools_dir=str(tools), database_url=database_url), upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


async def three_round_turn(service: Service) -> str:
    """A finished turn with three tool rounds (the second one with two calls)."""
    service.upstream.enqueue(
        tool_reply(add(1, 2, "c1")),
        tool_reply(add(3, 4, "c2a"), add(5, 6, "c2b")),
        tool_reply(add(7, 8, "c3")),
        Reply(text="3, 7, 11 and 15"),
    )
    body = {"model": "gpt-test", "messages": USER, "tool_ids": ["weather"]}
    status, data, headers = await service.post("/v1/chat/completions", body)
    assert status == 200, data
    assert data["choices"][0]["message"]["content"] == "3, 7, 11 and 15"
    return headers["X-Turn-Id"]


async def raw_events(service: Service, turn_id: str) -> bytes:
    async with service.http.get(f"{service.v1}/turns/{turn_id}/events?limit=10000", headers=service.headers) as resp:
        assert resp.status == 200
        return await resp.read()


def seqs_of(events: list[dict[str, Any]], type_: str) -> list[int]:
    return [e["seq"] for e in events if e["type"] == type_]


async def fork(service: Service, turn_id: str, **body: Any) -> str:
    status, data, headers = await service.post(f"/v1/turns/{turn_id}/fork", body)
    assert status == 201, data
    assert set(data) == {"turn_id", "chat_id"} and data["turn_id"] != turn_id
    assert headers["X-Turn-Id"] == data["turn_id"]
    return str(data["turn_id"])


async def finished(service: Service, turn_id: str) -> dict[str, Any]:
    """Follow the turn's stream to its end (checked against its log) and return the turn."""
    raw = await read_stream(service, turn_id)
    await check_stream_against_log(service, turn_id, raw)
    return await service.turn(turn_id)


def check_copied(fork_events: list[dict[str, Any]], parent_events: list[dict[str, Any]], at: int, *, model: str | None = None) -> None:
    """The fork's log: turn.forked, then the parent's events before ``at``, as the fork's."""
    first = fork_events[0]
    assert first["seq"] == 1 and first["type"] == "turn.forked"
    assert first["data"]["parent_turn_id"] and first["data"]["at"] == at
    copied = fork_events[1:at]
    assert [e["seq"] for e in copied] == list(range(2, at + 1))
    assert [e["type"] for e in copied] == [e["type"] for e in parent_events[: at - 1]]
    for mine, theirs in zip(copied, parent_events[: at - 1], strict=True):
        if mine["type"] == "turn.started":
            assert mine["data"]["model"] == (model or theirs["data"]["model"])
            assert mine["data"]["chat_id"] != theirs["data"]["chat_id"]
            assert mine["data"]["request"]["messages"] == theirs["data"]["request"]["messages"]
        elif mine["type"] == "model.delta":
            # one position later: turn.forked takes the first
            assert mine["data"] == {**theirs["data"], "pos": theirs["data"]["pos"] + 1}
        else:
            assert mine["data"] == theirs["data"], mine["type"]


async def verify_events(events: list[Event], folder: Path) -> VerifyResult:
    await asyncio.to_thread(folder.mkdir)
    scratch = await scratch_store(str(folder))
    try:
        return await verify_turn(events, scratch)
    finally:
        await scratch.close()


async def test_fork_at_the_second_batch_with_a_substituted_output(agent: Service, tmp_path: Path) -> None:
    up = agent.upstream
    parent_id = await three_round_turn(agent)
    parent_events = await agent.events(parent_id)
    parent_raw = await raw_events(agent, parent_id)
    parent_view = await agent.turn(parent_id)
    assert len(up.requests) == 4
    batches = seqs_of(parent_events, "tools.batch")
    assert len(batches) == 3
    at = batches[1]

    up.enqueue(Reply(text="forked: 3, 42, 11"))
    fork_id = await fork(agent, parent_id, at=at, tool_results={"c2a": "42"})
    view = await finished(agent, fork_id)
    assert view["status"] == "completed" and view["content"] == "forked: 3, 42, 11"
    assert view["parent_turn_id"] == parent_id and view["forked_at"] == at
    assert view["model"] == "gpt-test" and view["chat_id"] != parent_view["chat_id"]

    # One more model call, and it saw the given output for c2a and c2b's real one.
    assert len(up.requests) == 5
    sent = up.requests[4]["messages"]
    assert [(m["tool_call_id"], m["content"]) for m in sent if m["role"] == "tool"] == [("c1", "3"), ("c2a", "42"), ("c2b", "11")]
    assert sent[0] == USER[0]
    # The earlier rounds were not asked again: the fork's first request is the parent's third one
    # with the other output.
    assert up.requests[4]["tools"] == up.requests[2]["tools"]

    fork_events = await agent.events(fork_id)
    check_copied(fork_events, parent_events, at)
    live = fork_events[at:]
    assert live[0]["type"] == "tools.batch" and live[0]["data"] == parent_events[at - 1]["data"]
    started = {e["data"]["call_id"] for e in live if e["type"] == "tool.started"}
    assert started == {"c2b"}, "a substituted call is not run"
    substituted = [e["data"] for e in live if e["type"] == "tool.completed" and e["data"]["call_id"] == "c2a"]
    assert substituted == [
        {
            "v": 1,
            "call_id": "c2a",
            "name": "add",
            "output": "42",
            "status": "completed",
            "files": [],
            "embeds": [],
            "images": [],
            "sources": [],
            "error": None,
            "substituted": True,
        }
    ]
    outputs = [(i["call_id"], i["output"]) for i in view["output"] if i["type"] == "function_call_output"]
    assert outputs == [("c1", "3"), ("c2a", "42"), ("c2b", "11")]

    # The parent is untouched, byte for byte.
    assert await raw_events(agent, parent_id) == parent_raw
    assert await agent.turn(parent_id) == parent_view

    # The fork verifies from its own log (the teardown verifies it too), and a
    # forged substituted output does not: the re-run records what turn.forked says.
    stored = await agent.services.store.read(fork_id)
    assert (await verify_events(stored, tmp_path / "verify-ok")).ok
    forged = [e.model_copy(update={"data": {**e.data, "output": "41"}}) if e.type == "tool.completed" and e.data.get("substituted") else e for e in stored]
    result = await verify_events(forged, tmp_path / "verify-forged")
    assert not result.ok and any('"41"' in line for line in result.diff), result.diff

    # A fork of the fork, at its last model request, with another model: the
    # substitution it inherits is in its log (and re-made when it is verified).
    last_request = seqs_of(fork_events, "model.requested")[-1]
    up.enqueue(Reply(text="from the other model"))
    grandchild = await fork(agent, fork_id, at=last_request, model="gpt-other")
    view = await finished(agent, grandchild)
    assert view["content"] == "from the other model" and view["model"] == "gpt-other"
    assert view["parent_turn_id"] == fork_id
    assert up.requests[5]["model"] == "gpt-other" and up.requests[5]["messages"] == up.requests[4]["messages"]
    first = (await agent.events(grandchild))[0]["data"]
    assert first["tool_results"] == {"c2a": "42"} and first["model"] == "gpt-other"


async def test_fork_at_the_first_model_request_with_another_model(service: Service) -> None:
    up = service.upstream
    up.enqueue(Reply(text="answer of gpt-test"))
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": "Who are you?"}], "chat_id": "chat-forks"}
    status, data, headers = await service.post("/v1/chat/completions", body)
    assert status == 200, data
    parent_id = headers["X-Turn-Id"]
    await service.wait_status(parent_id, "completed")  # its background tasks too
    parent_events = await service.events(parent_id)
    parent_raw = await raw_events(service, parent_id)
    at = seqs_of(parent_events, "model.requested")[0]

    up.enqueue(Reply(text="answer of gpt-other"))
    fork_id = await fork(service, parent_id, at=at, model="gpt-other")
    view = await finished(service, fork_id)
    assert view["status"] == "completed" and view["content"] == "answer of gpt-other"
    assert view["model"] == "gpt-other" and view["parent_turn_id"] == parent_id and view["forked_at"] == at
    # The other model got the very context the parent's model got.
    assert len(up.requests) == 2
    assert up.requests[1]["model"] == "gpt-other" and up.requests[0]["model"] == "gpt-test"
    assert up.requests[1]["messages"] == up.requests[0]["messages"]
    fork_events = await service.events(fork_id)
    check_copied(fork_events, parent_events, at, model="gpt-other")
    assert fork_events[at]["type"] == "model.requested"
    # A new chat, holding the fork alone.
    status, chat = await service.get(f"/v1/chats/{view['chat_id']}")
    assert status == 200 and chat["messages"][-1]["content"] == "answer of gpt-other"
    assert await raw_events(service, parent_id) == parent_raw


async def test_fork_refusals_name_the_problem(agent: Service) -> None:
    parent_id = await three_round_turn(agent)
    await agent.wait_status(parent_id, "completed")
    events = await agent.events(parent_id)
    raw = await raw_events(agent, parent_id)
    batches = seqs_of(events, "tools.batch")
    requested = seqs_of(events, "model.requested")[0]
    completed = seqs_of(events, "tool.completed")[0]
    finalized = seqs_of(events, "turn.finalized")[0]
    last = events[-1]["seq"]

    async def refused(turn_id: str, body: Any, status: int) -> dict[str, Any]:
        got, data, _ = await agent.post(f"/v1/turns/{turn_id}/fork", body)
        assert got == status, data
        return dict(data["error"])

    assert (await refused("turn_nope", {"at": requested}, 404))["type"] == "not_found_error"
    for at in (0, last + 1):
        error = await refused(parent_id, {"at": at}, 400)
        assert error["param"] == "at" and f"1..{last}" in error["message"], error
    error = await refused(parent_id, {"at": 1}, 400)
    assert "turn.started" in error["message"]
    error = await refused(parent_id, {"at": finalized}, 400)
    assert "turn.finalized" in error["message"] and "answer was final" in error["message"]
    error = await refused(parent_id, {"at": completed}, 400)
    assert "is a tool.completed" in error["message"] and "tools.batch" in error["message"]
    error = await refused(parent_id, {"at": batches[1], "tool_results": {"c1": "9"}}, 400)
    assert error["param"] == "tool_results" and "'c1'" in error["message"] and "c2a, c2b" in error["message"]
    error = await refused(parent_id, {"at": requested, "tool_results": {"c1": "9"}}, 400)
    assert error["param"] == "tool_results" and "not a tools.batch" in error["message"]
    error = await refused(parent_id, {"at": requested, "model": "gpt-nope"}, 404)
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert (await refused(parent_id, {"at": str(requested)}, 400))["param"] == "at"
    assert (await refused(parent_id, {}, 400))["param"] == "at"
    assert (await refused(parent_id, {"at": requested, "seed": 1}, 400))["param"] == "seed"
    assert await raw_events(agent, parent_id) == raw
    turns = await agent.services.store.list_turns()
    assert [t.id for t in turns] == [parent_id], "a refused fork leaves nothing behind"


async def test_fork_in_the_background_phase_is_refused(service: Service) -> None:
    service.upstream.enqueue(Reply(text="titled"))
    status, data, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "chat_id": "chat-bg"})
    assert status == 200, data
    turn_id = headers["X-Turn-Id"]
    await service.wait_status(turn_id, "completed")
    events = await service.events(turn_id)
    for at in seqs_of(events, "background.started") + seqs_of(events, "background.result"):
        status, body, _ = await service.post(f"/v1/turns/{turn_id}/fork", {"at": at})
        assert status == 400 and "background phase" in body["error"]["message"], body


async def test_a_running_turn_cannot_be_forked(service: Service) -> None:
    up = service.upstream
    up.enqueue(Reply(chunks=["one ", "two ", "three"], pause_after=1))
    body = {"model": "gpt-test", "messages": USER, "stream": True}
    async with service.http.post(f"{service.v1}/chat/completions", json=body) as resp:
        assert resp.status == 200
        turn_id = resp.headers["X-Turn-Id"]
        await asyncio.wait_for(up.paused.wait(), 10)
        status, error, _ = await service.post(f"/v1/turns/{turn_id}/fork", {"at": 2})
        assert status == 409 and error["error"]["type"] == "conflict_error", error
        assert "only a turn that has ended" in error["error"]["message"]
        up.release()
        await resp.read()
    await service.wait_status(turn_id, "completed")


@pytest.fixture
async def two_users(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> AsyncIterator[tuple[Service, str, str]]:
    svc = await start_service(make_settings(tmp_path, upstream.url, auth="on", database_url=database_url), upstream)
    store = svc.services.store
    try:
        yield svc, await store.create_api_key("alice"), await store.create_api_key("bob")
    finally:
        await stop_service(svc)


async def test_someone_elses_turn_is_not_found(two_users: tuple[Service, str, str]) -> None:
    svc, alice, bob = two_users
    svc.upstream.enqueue(Reply(text="alice's"), Reply(text="alice's fork"))
    svc.headers = {"Authorization": f"Bearer {alice}"}
    status, _, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
    assert status == 200
    turn_id = headers["X-Turn-Id"]
    at = seqs_of(await svc.events(turn_id), "model.requested")[0]
    svc.headers = {"Authorization": f"Bearer {bob}"}
    status, body, _ = await svc.post(f"/v1/turns/{turn_id}/fork", {"at": at})
    assert status == 404 and body["error"]["type"] == "not_found_error"
    svc.headers = {"Authorization": f"Bearer {alice}"}
    fork_id = await fork(svc, turn_id, at=at)
    assert (await finished(svc, fork_id))["content"] == "alice's fork"
    svc.headers = {"Authorization": f"Bearer {bob}"}
    assert (await svc.get(f"/v1/turns/{fork_id}"))[0] == 404


@pytest.mark.sqlite_only
async def test_turnlog_fork_command(service: Service, tmp_path: Path) -> None:
    up = service.upstream
    up.enqueue(Reply(text="first model"))
    status, _, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
    assert status == 200
    parent_id = headers["X-Turn-Id"]
    await service.wait_status(parent_id, "completed")
    at = seqs_of(await service.events(parent_id), "model.requested")[0]
    parent_raw = await raw_events(service, parent_id)
    db = tmp_path / "turnlog.db"
    env = {"TURNLOG_OPENAI_BASE_URL": str(up.url), "TURNLOG_OPENAI_API_KEY": UPSTREAM_KEY}

    up.enqueue(Reply(text="second model, from the command line"))
    # In a thread: the scripted upstream answering the command runs on this loop.
    out = await asyncio.to_thread(turnlog, db, "fork", parent_id, "--at", str(at), "--model", "gpt-other", **env)
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    assert printed["status"] == "completed" and printed["turn_id"] != parent_id
    fork_id = printed["turn_id"]
    view = await service.turn(fork_id)
    assert view["content"] == "second model, from the command line" and view["model"] == "gpt-other"
    assert view["parent_turn_id"] == parent_id and view["forked_at"] == at and view["chat_id"] == printed["chat_id"]
    assert up.requests[-1]["model"] == "gpt-other" and up.requests[-1]["messages"] == up.requests[0]["messages"]
    verified = await asyncio.to_thread(turnlog, db, "verify", fork_id)
    assert verified.returncode == 0 and verified.stdout.startswith("ok:"), verified.stderr

    refused = await asyncio.to_thread(turnlog, db, "fork", parent_id, "--at", "1", **env)
    assert refused.returncode == 1 and "turn.started" in refused.stderr
    missing = await asyncio.to_thread(turnlog, db, "fork", "turn_nope", "--at", "2", **env)
    assert missing.returncode == 1 and "no turn turn_nope" in missing.stderr
    assert await raw_events(service, parent_id) == parent_raw


async def test_forks_of_a_turn_that_was_resumed_after_a_crash(
    http: aiohttp.ClientSession, tmp_path: Path, upstream: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parent whose log holds a kill -9 and the resume after it: a fork copying
    that part verifies (the crash is replayed where its log shows it), and a fork
    before it can give the interrupted call's result instead of running it."""
    tool_log = tmp_path / "tool.log"
    monkeypatch.setenv("TURNLOG_TEST_TOOL_LOG", str(tool_log))
    monkeypatch.setenv("TURNLOG_TEST_TOOL_SLEEP", "30")
    monkeypatch.setenv("TURNLOG_TOOLS_DIR", str(write_tools(tmp_path / "tools")))
    upstream.enqueue(
        Reply(tool_calls=[{"name": "send_email", "arguments": {"to": "bob@example.com"}, "id": "call_x"}], finish_reason="tool_calls"),
        Reply(text="It could not be sent."),
    )
    db = tmp_path / "turnlog.db"
    first = Server(db, upstream.url, auto_resume=True)
    try:
        await first.ready(http)
        body = {"model": "gpt-test", "messages": [{"role": "user", "content": "mail bob"}], "tool_ids": ["mail"]}
        pending = asyncio.create_task(http.post(first.url + "/v1/chat/completions", json=body))
        await wait_for_output(tool_log, "the tool's start")  # the tool runs: kill the process now
        first.kill9()
        with pytest.raises(aiohttp.ClientError):
            await pending
    finally:
        first.stop()
    monkeypatch.setenv("TURNLOG_TEST_TOOL_SLEEP", "0")
    second = Server(db, upstream.url, auto_resume=True)
    try:
        await second.ready(http)
        parent_id = cli(db, "turns", "list").stdout.splitlines()[1].split()[0]
        turns = f"{second.url}/v1/turns"
        await wait_for(http, f"{turns}/{parent_id}", lambda v: v["status"] == "completed")
        events = (await get_json(http, f"{turns}/{parent_id}/events?limit=10000"))["events"]
        types = [e["type"] for e in events]
        assert types.index("tool.started") < types.index("turn.interrupted") < types.index("turn.resumed") < types.index("tool.completed")
        parent_raw = json.dumps(events, sort_keys=True)

        # After the crash: the copy holds it; the other model answers.
        at = seqs_of(events, "model.requested")[-1]
        upstream.enqueue(Reply(text="the other model's take"))
        async with http.post(f"{turns}/{parent_id}/fork", json={"at": at, "model": "gpt-other"}) as resp:
            assert resp.status == 201, await resp.text()
            after_crash = (await resp.json())["turn_id"]
        view = await wait_for(http, f"{turns}/{after_crash}", lambda v: v["status"] == "completed")
        assert view["content"] == "the other model's take"
        assert upstream.requests[-1]["model"] == "gpt-other" and upstream.requests[-1]["messages"] == upstream.requests[1]["messages"]
        copied = [e["type"] for e in (await get_json(http, f"{turns}/{after_crash}/events?limit=10000"))["events"]]
        assert copied[1:at] == types[: at - 1] and "turn.resumed" in copied[1:at]

        # Before the crash, at the batch: the mail is not sent again, its result is given.
        batch = seqs_of(events, "tools.batch")[0]
        upstream.enqueue(Reply(text="Sent, then."))
        async with http.post(f"{turns}/{parent_id}/fork", json={"at": batch, "tool_results": {"call_x": "sent to bob@example.com"}}) as resp:
            assert resp.status == 201, await resp.text()
            before_crash = (await resp.json())["turn_id"]
        view = await wait_for(http, f"{turns}/{before_crash}", lambda v: v["status"] == "completed")
        assert view["content"] == "Sent, then."
        tool_messages = [m for m in upstream.requests[-1]["messages"] if m["role"] == "tool"]
        assert tool_messages == [{"role": "tool", "tool_call_id": "call_x", "content": "sent to bob@example.com"}]
        assert tool_log.read_text().splitlines() == ["send_email"], "only the parent's first process ran it"

        for turn_id in (parent_id, after_crash, before_crash):
            verified = cli(db, "verify", turn_id)
            assert verified.returncode == 0, verified.stderr
        assert json.dumps((await get_json(http, f"{turns}/{parent_id}/events?limit=10000"))["events"], sort_keys=True) == parent_raw
    finally:
        second.stop()


async def test_a_fork_s_chat_goes_on_with_the_history_the_parent_saw(service: Service) -> None:
    up = service.upstream
    chat = "chat-fork-history"
    first = [{"role": "user", "content": "My name is Ada."}]
    second = [{"role": "user", "content": "What is my name?"}]
    up.enqueue(Reply(text="Hello Ada."), Reply(text="Your name is Ada."))
    for messages in (first, second):
        status, data, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": messages, "chat_id": chat})
        assert status == 200, data
        await service.wait_status(headers["X-Turn-Id"], "completed")
    parent_id = headers["X-Turn-Id"]
    parent_saw = up.requests[-1]["messages"]
    assert [m["content"] for m in parent_saw] == ["My name is Ada.", "Hello Ada.", "What is my name?"]

    at = seqs_of(await service.events(parent_id), "model.requested")[0]
    up.enqueue(Reply(text="Ada, says the other model."))
    fork_id = await fork(service, parent_id, at=at, model="gpt-other")
    view = await finished(service, fork_id)
    assert view["content"] == "Ada, says the other model."
    assert up.requests[-1]["messages"] == parent_saw

    # The fork's chat holds the conversation the parent turn saw, then the fork's answer...
    status, shown = await service.get(f"/v1/chats/{view['chat_id']}")
    assert status == 200, shown
    assert [m["content"] for m in shown["messages"]] == [
        "My name is Ada.",
        "Hello Ada.",
        "What is my name?",
        "Ada, says the other model.",
    ]
    # ...and its next turn is sent all of it, as a turn of the parent's chat would be.
    up.enqueue(Reply(text="Still Ada."))
    more = [{"role": "user", "content": "And now?"}]
    status, data, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": more, "chat_id": view["chat_id"]})
    assert status == 200, data
    await service.wait_status(headers["X-Turn-Id"], "completed")
    assert [(m["role"], m["content"]) for m in up.requests[-1]["messages"]] == [
        ("user", "My name is Ada."),
        ("assistant", "Hello Ada."),
        ("user", "What is my name?"),
        ("assistant", "Ada, says the other model."),
        ("user", "And now?"),
    ]
    # The parent's chat is unchanged by all this.
    status, theirs = await service.get(f"/v1/chats/{chat}")
    assert [m["content"] for m in theirs["messages"]] == ["My name is Ada.", "Hello Ada.", "What is my name?", "Your name is Ada."]
