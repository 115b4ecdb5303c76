"""Tool approval: a turn waits, holding nothing, until a person decides each call.

The oracles are independent of the engine: a tool module that writes a line to
a file each time it really runs (did the call run, how often), the upstream's
record of what the model was sent (the rejection's reason), what the client
received (HTTP, SSE, WebSocket) against the fold of the log, and the
re-run of the engine (``verify``) for every turn that ended.
"""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from engine.events import ToolApproval, make_event
from engine.run.actor import index_update
from engine.run.folded import Folded
from tests.harness import Service, make_settings, retired, sse_text, start_service, stop_service
from tests.oracle import check_stream_against_log
from tests.processes import Server, get_json, wait_for
from tests.upstream import Reply, ScriptedUpstream

USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Pay the rent"}]
ASK = {"tool_approval": "ask"}

LEDGER = '''
import os


class Tools:
    def transfer(self, amount: int, to: str) -> str:
        """Send money.

        :param amount: how much
        :param to: to whom
        """
        with open(os.environ["TURNLOG_TEST_LEDGER"], "a") as fh:
            fh.write(f"transfer {amount} {to}\\n")
        return f"sent {amount} to {to}"

    def balance(self) -> str:
        """The account's balance."""
        with open(os.environ["TURNLOG_TEST_LEDGER"], "a") as fh:
            fh.write("balance\\n")
        return "1000"
'''


def write_ledger(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ledger.py").write_text(textwrap.dedent(LEDGER))
    return folder


def ran(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines() if ledger.exists() else []


def transfer(call_id: str, amount: int = 700, to: str = "landlord") -> dict[str, Any]:
    return {"id": call_id, "name": "transfer", "arguments": {"amount": amount, "to": to}}


def calls(*items: dict[str, Any]) -> Reply:
    return Reply(tool_calls=list(items), finish_reason="tool_calls")


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.txt"
    monkeypatch.setenv("TURNLOG_TEST_LEDGER", str(path))
    return path


@pytest.fixture
async def bank(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, ledger: Path) -> AsyncIterator[Service]:
    tools = write_ledger(tmp_path / "tools")
    settings = make_settings(tmp_path, upstream.url, tools_dir=str(tools), database_url=database_url)
    svc = await start_service(settings, upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


async def start(service: Service, params: dict[str, Any] | None = ASK, **extra: Any) -> tuple[str, dict[str, Any]]:
    """A non-streaming turn: its answer comes when the turn waits (or ends)."""
    body: dict[str, Any] = {"model": "gpt-test", "messages": USER, "tool_ids": ["ledger"], **extra}
    if params is not None:
        body["params"] = params
    status, data, headers = await service.post("/v1/chat/completions", body)
    assert status == 200, data
    return headers["X-Turn-Id"], data


async def decide(service: Service, turn_id: str, call_id: str, approve: bool, **extra: Any) -> tuple[int, Any]:
    status, data, _ = await service.post(f"/v1/turns/{turn_id}/approvals", {"call_id": call_id, "approve": approve, **extra})
    return status, data


async def verified(service: Service, turn_id: str) -> None:
    status, body = await service.get(f"/v1/turns/{turn_id}/verify")
    assert status == 200 and body["ok"], body


async def test_approve_runs_the_call_once_and_the_turn_completes(bank: Service, ledger: Path) -> None:
    bank.upstream.enqueue(calls(transfer("c1")), Reply(text="Rent paid."))
    turn_id, answer = await start(bank)
    # The client is answered when the turn starts waiting, told what waits.
    assert answer["turnlog"]["status"] == "waiting"
    assert [a["call_id"] for a in answer["turnlog"]["approvals"]] == ["c1"]
    view = await bank.turn(turn_id)
    assert (view["status"], view["state"]) == ("waiting", "awaiting_approval")
    assert view["approvals"] == [{"call_id": "c1", "name": "transfer", "arguments": '{"amount": 700, "to": "landlord"}', "status": "pending"}]
    await retired(bank, turn_id)
    assert turn_id not in bank.services.supervisor.actors, "a waiting turn holds no actor"
    record = await bank.services.store.get_turn(turn_id)
    assert record is not None and record.status == "waiting" and record.owner is None, "and no lease"
    assert ran(ledger) == [] and len(bank.upstream.requests) == 1

    status, body = await decide(bank, turn_id, "c1", True)
    assert status == 202 and body["status"] == "running", body
    view = await bank.wait_status(turn_id, "completed")
    assert view["content"] == "Rent paid."
    assert ran(ledger) == ["transfer 700 landlord"]
    sent = bank.upstream.requests[1]["messages"]
    assert sent[-1] == {"role": "tool", "tool_call_id": "c1", "content": "sent 700 to landlord"}
    types = [e["type"] for e in await bank.events(turn_id)]
    assert types.index("tool.approval_requested") < types.index("tool.approval") < types.index("tools.decided") < types.index("tool.started")
    assert view["approvals"][0]["status"] == "approved"

    # The same call again, and any decision on a turn that no longer waits: 409.
    status, body = await decide(bank, turn_id, "c1", False)
    assert status == 409 and body["error"]["code"] == "already_decided", body
    status, body = await decide(bank, turn_id, "nope", True)
    assert status == 409 and body["error"]["code"] == "turn_not_waiting", body
    await verified(bank, turn_id)


async def test_reject_gives_the_model_an_error_with_the_reason(bank: Service, ledger: Path) -> None:
    bank.upstream.enqueue(calls(transfer("c1", 9000, "stranger")), Reply(text="I did not send it."))
    turn_id, _ = await start(bank)
    status, body = await decide(bank, turn_id, "c1", False, reason="not my landlord")
    assert status == 202, body
    view = await bank.wait_status(turn_id, "completed")
    assert ran(ledger) == [], "a rejected call never runs"
    result = bank.upstream.requests[1]["messages"][-1]
    assert result["role"] == "tool" and result["tool_call_id"] == "c1"
    assert "rejected" in result["content"] and "not my landlord" in result["content"]
    assert view["approvals"][0] == {**view["approvals"][0], "status": "rejected", "reason": "not my landlord"}
    outputs = [i for i in view["output"] if i["type"] == "function_call_output"]
    assert outputs[0]["status"] == "failed"
    await verified(bank, turn_id)


async def test_a_batch_waits_for_every_decision_and_bad_decisions_are_4xx(bank: Service, ledger: Path) -> None:
    bank.upstream.enqueue(
        calls(transfer("c1"), transfer("c2", 50, "plumber"), {"id": "c3", "name": "balance", "arguments": {}}),
        Reply(text="Done."),
    )
    turn_id, _ = await start(bank)
    assert [a["call_id"] for a in (await bank.turn(turn_id))["approvals"]] == ["c1", "c2", "c3"]
    status, body = await decide(bank, turn_id, "unknown", True)
    assert status == 404 and body["error"]["code"] == "call_not_found", body
    for bad in ({"call_id": "c1"}, {"call_id": "c1", "approve": "yes"}, {"call_id": "", "approve": True}, {"call_id": "c1", "approve": True, "x": 1}):
        status, data, _ = await bank.post(f"/v1/turns/{turn_id}/approvals", bad)
        assert status == 400 and data["error"]["message"], (bad, data)
    async with bank.http.post(f"{bank.v1}/turns/{turn_id}/approvals", data=b"{not json", headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_json"
    status, data, _ = await bank.post("/v1/turns/turn_missing/approvals", {"call_id": "c1", "approve": True})
    assert status == 404, data

    assert (await decide(bank, turn_id, "c2", False, reason="later"))[1]["status"] == "waiting"
    assert (await decide(bank, turn_id, "c1", True))[1]["status"] == "waiting"
    status, body = await decide(bank, turn_id, "c2", True)
    assert status == 409 and body["error"]["code"] == "already_decided"
    view = await bank.turn(turn_id)
    assert (view["status"], view["state"]) == ("waiting", "awaiting_approval") and ran(ledger) == []
    assert (await decide(bank, turn_id, "c3", True))[1]["status"] == "running"
    await bank.wait_status(turn_id, "completed")
    assert sorted(ran(ledger)) == ["balance", "transfer 700 landlord"]
    results = {m["tool_call_id"]: m["content"] for m in bank.upstream.requests[1]["messages"] if m["role"] == "tool"}
    assert results["c1"] == "sent 700 to landlord" and results["c3"] == "1000" and "later" in results["c2"]
    await verified(bank, turn_id)


async def test_a_crash_right_after_the_last_decision_resumes_and_runs_the_batch(bank: Service, ledger: Path) -> None:
    """What a process that dies just after recording the last decision leaves
    behind: the decision on the log, its lease, no actor. The lease runs out,
    the turn is interrupted and resumed, and the batch runs with the recorded
    decision."""
    bank.upstream.enqueue(calls(transfer("c1")), Reply(text="Paid after a crash."))
    turn_id, _ = await start(bank)
    store = bank.services.store
    fencing = await store.claim_turn(turn_id, "proc_dead", lease_seconds=0.5)
    assert fencing is not None
    folded = Folded.of(turn_id, await store.read(turn_id))
    event = make_event(turn_id, folded.view.last_seq + 1, ToolApproval(call_id="c1", approve=True, by="anonymous"))
    folded.apply(event)
    await store.append([event], fencing=fencing, index=index_update(event, folded.view))
    view = await bank.wait_status(turn_id, "completed", timeout=20)
    assert view["content"] == "Paid after a crash." and ran(ledger) == ["transfer 700 landlord"]
    types = [e["type"] for e in await bank.events(turn_id)]
    assert types.index("tool.approval") < types.index("turn.interrupted") < types.index("turn.resumed") < types.index("tools.decided")
    await verified(bank, turn_id)


async def test_simultaneous_decisions_run_the_batch_once(bank: Service, ledger: Path) -> None:
    bank.upstream.enqueue(calls(transfer("c1"), transfer("c2", 5, "bank")), Reply(text="Both done."))
    turn_id, _ = await start(bank)
    answers = await asyncio.gather(decide(bank, turn_id, "c1", True), decide(bank, turn_id, "c2", True), decide(bank, turn_id, "c2", True))
    assert sorted(status for status, _ in answers) == [202, 202, 409], answers
    await bank.wait_status(turn_id, "completed")
    assert sorted(ran(ledger)) == ["transfer 5 bank", "transfer 700 landlord"]
    types = [e["type"] for e in await bank.events(turn_id)]
    assert types.count("tool.approval") == 2 and types.count("tools.decided") == 1
    await verified(bank, turn_id)


async def test_cancel_a_waiting_turn(bank: Service, ledger: Path) -> None:
    bank.upstream.enqueue(calls(transfer("c1")))
    turn_id, _ = await start(bank)
    status, body, _ = await bank.post(f"/v1/turns/{turn_id}/cancel")
    assert status == 202 and body["status"] == "cancelled", body
    view = await bank.turn(turn_id)
    assert view["status"] == "cancelled" and view["approvals"][0]["status"] == "cancelled"
    status, body = await decide(bank, turn_id, "c1", True)
    assert status == 409 and body["error"]["code"] == "turn_not_waiting"
    status, body, _ = await bank.post(f"/v1/turns/{turn_id}/resume")
    assert status == 409
    assert ran(ledger) == [] and len(bank.upstream.requests) == 1
    await verified(bank, turn_id)


async def test_a_tool_configured_to_ask_waits_without_the_request_asking(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, ledger: Path) -> None:
    tools = write_ledger(tmp_path / "tools")
    settings = make_settings(tmp_path, upstream.url, tools_dir=str(tools), database_url=database_url, tools={"transfer": {"approval": "ask"}})
    svc = await start_service(settings, upstream)
    try:
        upstream.enqueue(calls({"id": "b1", "name": "balance", "arguments": {}}), calls(transfer("t1")), Reply(text="ok"))
        turn_id, _ = await start(svc, params=None)
        view = await svc.turn(turn_id)
        # balance ran unasked in the first round; transfer waits in the second.
        assert view["status"] == "waiting" and [a["call_id"] for a in view["approvals"]] == ["t1"]
        assert ran(ledger) == ["balance"]
        status, data, _ = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "params": {"tool_approval": "sometimes"}})
        assert status == 400 and "tool_approval" in data["error"]["message"]
        assert (await decide(svc, turn_id, "t1", True))[0] == 202
        await svc.wait_status(turn_id, "completed")
        assert ran(ledger) == ["balance", "transfer 700 landlord"]
        await verified(svc, turn_id)
    finally:
        await stop_service(svc)


async def test_someone_elses_turn_is_404(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, ledger: Path) -> None:
    tools = write_ledger(tmp_path / "tools")
    settings = make_settings(tmp_path, upstream.url, tools_dir=str(tools), database_url=database_url, auth="on")
    svc = await start_service(settings, upstream)
    try:
        alice = await svc.services.store.create_api_key("alice")
        bob = await svc.services.store.create_api_key("bob")
        upstream.enqueue(calls(transfer("c1")), Reply(text="ok"))
        svc.headers = {"Authorization": f"Bearer {alice}"}
        turn_id, _ = await start(svc)
        svc.headers = {"Authorization": f"Bearer {bob}"}
        status, body = await decide(svc, turn_id, "c1", True)
        assert status == 404 and body["error"]["code"] == "not_found", body
        async with svc.http.ws_connect(svc.v1 + "/ws", headers=svc.headers) as ws:
            await ws.send_json({"type": "approval", "turn_id": turn_id, "call_id": "c1", "approve": True})
            reply = await ws.receive_json(timeout=10)
            assert reply["type"] == "error" and reply["code"] == "not_found"
        svc.headers = {}
        status, _ = await decide(svc, turn_id, "c1", True)
        assert status == 401
        svc.headers = {"Authorization": f"Bearer {alice}"}
        assert (await svc.turn(turn_id))["status"] == "waiting" and ran(ledger) == []
        assert (await decide(svc, turn_id, "c1", True))[0] == 202
        await svc.wait_status(turn_id, "completed")
    finally:
        await stop_service(svc)


async def test_websocket_approval_flow(bank: Service, ledger: Path) -> None:
    bank.upstream.enqueue(calls(transfer("c1")), Reply(text="Paid."))
    request = {"model": "gpt-test", "messages": USER, "tool_ids": ["ledger"], "params": ASK, "stream": True}
    async with bank.http.ws_connect(bank.v1 + "/ws") as ws:
        await ws.send_json({"type": "chat", "request": request})
        events: list[dict[str, Any]] = []
        asked: dict[str, Any] | None = None
        turn_id = ""
        while True:
            msg = await ws.receive_json(timeout=10)
            if msg["type"] == "turn":
                turn_id = msg["turn_id"]
            elif msg["type"] == "event":
                events.append(msg)
                if msg["event"]["type"] == "turn.completed":
                    break
            elif msg["type"] == "approval:request":
                asked = msg
                await ws.send_json({"type": "approval", "turn_id": turn_id, "call_id": msg["call_id"], "approve": True})
            elif msg["type"] == "approval":
                assert msg["status"] == "running"
                await ws.send_json({"type": "approval", "turn_id": turn_id, "call_id": "c1", "approve": True})
            elif msg["type"] == "error":
                assert msg["code"] == "already_decided", msg
    assert asked == {"type": "approval:request", "turn_id": turn_id, "call_id": "c1", "name": "transfer", "arguments": '{"amount": 700, "to": "landlord"}'}
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert [e["event"] for e in events] == [{k: e[k] for k in ("type", "at", "data")} for e in await bank.events(turn_id)]
    assert ran(ledger) == ["transfer 700 landlord"]


async def test_sse_client_gets_the_request_and_the_rest_of_the_answer(bank: Service, ledger: Path) -> None:
    """With the official SDK streaming: the request arrives mid-stream as a named
    ``turnlog`` event the SDK iterates over harmlessly; the stream goes on after
    the decision, and the client's stream equals the fold of the log."""
    bank.upstream.enqueue(calls(transfer("c1")), Reply(text="Rent paid after approval."))
    client = openai.AsyncOpenAI(base_url=bank.v1, api_key="unused", max_retries=0)
    raw = await client.chat.completions.with_raw_response.create(
        model="gpt-test",
        messages=USER,
        stream=True,
        extra_body={"tool_ids": ["ledger"], "params": ASK},
    )
    turn_id = raw.headers["x-turn-id"]
    stream = raw.parse()
    text, asked = "", []
    async for chunk in stream:
        extension = (chunk.model_extra or {}).get("turnlog") or {}
        if "approval_request" in extension:
            asked.append(extension["approval_request"])
            assert (await decide(bank, turn_id, extension["approval_request"]["call_id"], True))[0] == 202
        for choice in chunk.choices:
            text += choice.delta.content or ""
    await client.close()
    assert asked == [{"turn_id": turn_id, "call_id": "c1", "name": "transfer", "arguments": '{"amount": 700, "to": "landlord"}'}]
    assert text == "Rent paid after approval."
    # A raw reader: the named event, and the whole stream against the log.
    async with bank.http.get(f"{bank.v1}/turns/{turn_id}/stream") as resp:
        body = await resp.text()
    assert "event: turnlog\n" in body and '"approval_request"' in body
    await check_stream_against_log(bank, turn_id, body)


def _serve_env(tmp_path: Path, ledger: Path) -> dict[str, str]:
    return {"TURNLOG_TOOLS_DIR": str(write_ledger(tmp_path / "tools")), "TURNLOG_TEST_LEDGER": str(ledger)}


async def test_approve_after_kill9_and_restart(
    tmp_path: Path, upstream: ScriptedUpstream, database_url: str, ledger: Path, http: aiohttp.ClientSession
) -> None:
    db = Path(database_url.split("///", 1)[1]) if database_url.startswith("sqlite") else database_url
    env = _serve_env(tmp_path, ledger)
    upstream.enqueue(calls(transfer("c1")), Reply(text="Paid after a restart."))
    first = Server(db, upstream.url, auto_resume=True, log_dir=tmp_path, env=env)
    second: Server | None = None
    try:
        await first.ready(http)
        body = {"model": "gpt-test", "messages": USER, "tool_ids": ["ledger"], "params": ASK}
        async with http.post(first.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            turn_id = resp.headers["X-Turn-Id"]
        assert (await get_json(http, f"{first.url}/v1/turns/{turn_id}"))["status"] == "waiting"
        first.kill9()
        second = Server(db, upstream.url, auto_resume=True, log_dir=tmp_path, env=env)
        await second.ready(http)
        view = await get_json(http, f"{second.url}/v1/turns/{turn_id}")
        assert (view["status"], view["state"]) == ("waiting", "awaiting_approval"), "a restart neither resumes nor interrupts a waiting turn"
        async with http.post(f"{second.url}/v1/turns/{turn_id}/approvals", json={"call_id": "c1", "approve": True}) as resp:
            assert resp.status == 202, await resp.text()
        done = await wait_for(http, f"{second.url}/v1/turns/{turn_id}", lambda v: v["status"] == "completed")
        assert done["content"] == "Paid after a restart."
        assert ran(ledger) == ["transfer 700 landlord"]
        types = [e["type"] for e in (await get_json(http, f"{second.url}/v1/turns/{turn_id}/events"))["events"]]
        assert "turn.interrupted" not in types and "turn.resumed" not in types
        verdict = await get_json(http, f"{second.url}/v1/turns/{turn_id}/verify")
        assert verdict["ok"], verdict
    finally:
        first.stop()
        if second is not None:
            second.stop()


async def test_approve_on_another_postgresql_instance(
    pg_url: str, tmp_path: Path, upstream: ScriptedUpstream, ledger: Path, http: aiohttp.ClientSession
) -> None:
    env = _serve_env(tmp_path, ledger)
    a = Server(pg_url, upstream.url, auto_resume=True, log_dir=tmp_path, env=env)
    b = Server(pg_url, upstream.url, auto_resume=True, log_dir=tmp_path, env=env)
    try:
        await a.ready(http)
        await b.ready(http)
        upstream.enqueue(calls(transfer("c1")), Reply(text="Paid by B."))
        body = {"model": "gpt-test", "messages": USER, "tool_ids": ["ledger"], "params": ASK, "stream": True}
        resp = await http.post(a.url + "/v1/chat/completions", json=body)
        assert resp.status == 200
        turn_id = resp.headers["X-Turn-Id"]
        # The client's stream stays on A; the decision goes to B, which runs the rest.
        buffered = ""
        while '"approval_request"' not in buffered:
            line = await resp.content.readline()
            assert line, "the stream ended before the approval request"
            buffered += line.decode()
        async with http.post(f"{b.url}/v1/turns/{turn_id}/approvals", json={"call_id": "c1", "approve": True}) as decided:
            assert decided.status == 202, await decided.text()
        rest = buffered + (await resp.text())
        assert sse_text(rest) == "Paid by B.", "A's client gets the answer B's actor made"
        done = await wait_for(http, f"{a.url}/v1/turns/{turn_id}", lambda v: v["status"] == "completed")
        assert done["content"] == "Paid by B." and ran(ledger) == ["transfer 700 landlord"]
        verdict = await get_json(http, f"{a.url}/v1/turns/{turn_id}/verify")
        assert verdict["ok"], verdict
    finally:
        a.stop()
        b.stop()
