"""kill -9 of a real ``turnlog serve`` mid-stream, restart on the same database, resume.

Every test runs in both resume modes, with an upstream that behaves so:
``continue`` (the upstream continues a final assistant message, as Ollama does)
and ``restart`` (it answers afresh whatever the messages end with, as OpenAI does).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from adapters.store import MemoryEventStore
from engine.events import Event
from engine.run.verify import verify_turn
from tests.fault_clients import kept_text
from tests.harness import sse_text
from tests.processes import Server, cli, get_json, wait_for, wait_for_output
from tests.upstream import Reply, ScriptedUpstream

TEXT = "".join(f"word{i:03d} " for i in range(150))


@pytest.fixture(params=["continue", "restart"])
def resume(request: pytest.FixtureRequest, upstream: ScriptedUpstream) -> dict[str, str]:
    """The resume mode, of the upstream and of the service's OpenAI upstream setting:
    the environment the servers get."""
    upstream.resume = request.param
    # The params go with a continuation only (vLLM would take e.g. continue_final_message;
    # the scripted upstream accepts what OpenAI accepts).
    return {"TURNLOG_RESUME": json.dumps({"openai": request.param}), "TURNLOG_RESUME_PARAMS": json.dumps({"openai": {"temperature": 0}})}


async def start_and_kill(http: aiohttp.ClientSession, tmp_path: Path, upstream: ScriptedUpstream, env: dict[str, str]) -> tuple[str, str, Path]:
    db = tmp_path / "turnlog.db"
    first = Server(db, upstream.url, auto_resume=False, env=env)
    try:
        await first.ready(http)
        resp = await http.post(
            first.url + "/v1/chat/completions", json={"model": "gpt-test", "messages": [{"role": "user", "content": "count"}], "stream": True}
        )
        turn_id = resp.headers["X-Turn-Id"]
        seen = ""
        async for chunk in resp.content.iter_any():
            seen += chunk.decode()
            if len(sse_text(seen[: seen.rfind("\n\n") + 2])) > 200:
                break
        # at least one batch is durable before the crash
        await wait_for(http, f"{first.url}/v1/turns/{turn_id}", lambda v: len(v["content"]) > 100)
        first.kill9()
        resp.close()
    finally:
        first.stop()
    return turn_id, sse_text(seen[: seen.rfind("\n\n") + 2]), db


async def test_kill9_then_resume_completes_without_duplicates(
    http: aiohttp.ClientSession, tmp_path: Path, upstream: ScriptedUpstream, resume: dict[str, str]
) -> None:
    mode = upstream.resume
    upstream.enqueue(Reply(text=TEXT, chunk_size=8, delay=0.01), Reply(text=TEXT, chunk_size=8))
    turn_id, seen_live, db = await start_and_kill(http, tmp_path, upstream, resume)
    assert TEXT.startswith(seen_live)

    second = Server(db, upstream.url, auto_resume=False, env=resume)
    try:
        await second.ready(http)
        turn_url = f"{second.url}/v1/turns/{turn_id}"
        # the new process records that the old owner is gone
        await wait_for(http, turn_url + "/events?limit=10000", lambda b: b["events"][-1]["type"] == "turn.interrupted")
        interrupted = await get_json(http, turn_url)
        assert interrupted["status"] == "interrupted"
        durable = interrupted["content"]
        assert durable and TEXT.startswith(durable)

        async with http.post(turn_url + "/resume") as resp:
            assert resp.status == 202, await resp.text()
        done = await wait_for(http, turn_url, lambda v: v["status"] == "completed")
        assert done["content"] == TEXT, "nothing duplicated, nothing missing"
        events = (await get_json(http, turn_url + "/events?limit=10000"))["events"]
        seqs = [e["seq"] for e in events]
        assert seqs == list(range(1, len(seqs) + 1))
        resumed = [e for e in events if e["type"] == "turn.resumed"]
        assert len(resumed) == 1 and resumed[0]["data"]["from_seq"] == interrupted["seq"]
        assert resumed[0]["data"]["mode"] == mode
        again = upstream.requests[-1]["messages"]
        at = next(i for i, e in enumerate(events) if e["type"] == "turn.resumed")
        requested = [e["data"] for e in events if e["type"] == "model.requested"]
        assert "temperature" not in upstream.requests[0]
        if mode == "continue":
            # the continuation asked the model to go on from the durable prefix, with the resume params
            assert again[-1] == {"role": "assistant", "content": durable}
            assert upstream.requests[-1]["temperature"] == 0
            assert requested[-1]["resume_params"] == {"temperature": 0} and requested[-1]["prefill"] == durable
        else:
            # the model was asked afresh; the partial answer stays in the log, superseded
            assert again == upstream.requests[0]["messages"] and again[-1]["role"] == "user"
            kept = "".join(e["data"]["text"] for e in events[:at] if e["type"] == "model.delta")
            assert kept == durable
            assert "temperature" not in upstream.requests[-1]
            assert "resume_params" not in requested[-1] and requested[-1]["prefill"] is None and requested[-1]["resumed"]
        # resuming again is a conflict
        async with http.post(turn_url + "/resume") as resp:
            assert resp.status == 409
        # a reconnecting SSE client gets the whole answer once (after a restart,
        # from the log's start: the partial answer, then the notice to drop it)
        async with http.get(turn_url + "/stream") as resp:
            body = await resp.text()
        assert kept_text(body) == TEXT
        assert (sse_text(body) == TEXT) == (mode == "continue")
        # the engine re-run against the recorded results reproduces the log, crash included
        assert cli(db, "verify", turn_id).returncode == 0
        if mode == "continue":
            await verifies_without_modes(db, turn_id)
    finally:
        second.stop()


async def verifies_without_modes(db: Path, turn_id: str) -> None:
    """The log as a version before resume modes wrote it (its turn.resumed has
    no mode) still verifies: it continued."""
    listing = cli(db, "turns", "events", turn_id)
    events = [Event(turn_id=turn_id, **json.loads(line)) for line in listing.stdout.splitlines()]
    old = [e.model_copy(update={"data": {k: v for k, v in e.data.items() if k != "mode"}}) if e.type == "turn.resumed" else e for e in events]
    assert old != events
    scratch = MemoryEventStore()
    try:
        result = await verify_turn(old, scratch)
    finally:
        await scratch.close()
    assert result.ok, result.diff


async def test_kill9_then_auto_resume_on_restart(http: aiohttp.ClientSession, tmp_path: Path, upstream: ScriptedUpstream, resume: dict[str, str]) -> None:
    upstream.enqueue(Reply(text=TEXT, chunk_size=8, delay=0.01), Reply(text=TEXT, chunk_size=8))
    turn_id, _, db = await start_and_kill(http, tmp_path, upstream, resume)
    second = Server(db, upstream.url, auto_resume=True, env=resume)
    try:
        await second.ready(http)
        done = await wait_for(http, f"{second.url}/v1/turns/{turn_id}", lambda v: v["status"] == "completed")
        assert done["content"] == TEXT
        events = (await get_json(http, f"{second.url}/v1/turns/{turn_id}/events?limit=10000"))["events"]
        types = [e["type"] for e in events]
        assert types.index("turn.interrupted") < types.index("turn.resumed") < types.index("turn.completed")
        assert next(e for e in events if e["type"] == "turn.resumed")["data"]["mode"] == upstream.resume
        assert [i["type"] for i in done["output"]] == ["message"] and done["output"][0]["status"] == "completed"
        assert cli(db, "verify", turn_id).returncode == 0
    finally:
        second.stop()


@pytest.mark.parametrize(
    "module, tool, expect_runs, expect_output",
    [
        ("mail", "send_email", 1, "was interrupted"),  # not idempotent: never run twice
        ("kv", "lookup", 2, "value of k"),  # idempotent: run again
    ],
)
async def test_kill9_between_tool_started_and_completed(
    http: aiohttp.ClientSession,
    tmp_path: Path,
    upstream: ScriptedUpstream,
    monkeypatch: pytest.MonkeyPatch,
    module: str,
    tool: str,
    expect_runs: int,
    expect_output: str,
    resume: dict[str, str],
) -> None:
    from tests.tools_fixtures import write_tools

    tool_log = tmp_path / "tool.log"
    monkeypatch.setenv("TURNLOG_TEST_TOOL_LOG", str(tool_log))
    monkeypatch.setenv("TURNLOG_TEST_TOOL_SLEEP", "30")
    monkeypatch.setenv("TURNLOG_TOOLS_DIR", str(write_tools(tmp_path / "tools")))
    arguments = {"to": "bob@example.com"} if tool == "send_email" else {"key": "k"}
    upstream.enqueue(
        Reply(tool_calls=[{"name": tool, "arguments": arguments, "id": "call_x"}], finish_reason="tool_calls"),
        Reply(text="All done."),
    )
    db = tmp_path / "turnlog.db"
    first = Server(db, upstream.url, auto_resume=True, env=resume)
    try:
        await first.ready(http)
        pending = asyncio.create_task(
            http.post(first.url + "/v1/chat/completions", json={"model": "gpt-test", "messages": [{"role": "user", "content": "go"}], "tool_ids": [module]})
        )
        await wait_for_output(tool_log, "the tool's start")  # the tool runs: kill the process now
        first.kill9()
        with pytest.raises(aiohttp.ClientError):
            await pending
    finally:
        first.stop()
    monkeypatch.setenv("TURNLOG_TEST_TOOL_SLEEP", "0")
    second = Server(db, upstream.url, auto_resume=True, env=resume)
    try:
        await second.ready(http)
        # the request died with the first process: find its turn with the CLI
        listing = cli(db, "turns", "list")
        turn_id = listing.stdout.splitlines()[1].split()[0]
        done = await wait_for(http, f"{second.url}/v1/turns/{turn_id}", lambda v: v["status"] == "completed")
        assert done["content"] == "All done."
        output = [i for i in done["output"] if i["type"] == "function_call_output"]
        assert len(output) == 1 and expect_output in output[0]["output"]
        assert tool_log.read_text().splitlines() == [tool] * expect_runs
        events = (await get_json(http, f"{second.url}/v1/turns/{turn_id}/events?limit=10000"))["events"]
        types = [e["type"] for e in events]
        assert types.count("tool.completed") == 1
        assert types.index("tool.started") < types.index("turn.interrupted") < types.index("turn.resumed") < types.index("tool.completed")
        # no model call was cut off: nothing to restart, whatever the upstream's mode
        assert next(e for e in events if e["type"] == "turn.resumed")["data"]["mode"] == "continue"
        verified = cli(db, "verify", turn_id)
        assert verified.returncode == 0, verified.stderr
    finally:
        second.stop()
