"""The start of a turn: what its hot path relies on to stay cheap."""

from __future__ import annotations

from engine.machine import _DEST, TRANSITIONS, _live_table
from tests.harness import Service, sse_text
from tests.upstream import Reply


def test_the_live_table_is_the_transitions_machine_s_and_the_declared_one() -> None:
    # The live actor follows the table read out of the transitions.Machine;
    # followers and replays the one built from TRANSITIONS. They must agree
    # on every (state, event) pair, changing ones only.
    live = _live_table()
    assert live == _DEST
    assert {t for _, t in live} == {t for t, _, dest in TRANSITIONS if dest is not None}


async def test_a_client_gets_the_turn_id_once_its_model_request_is_in_the_log(service: Service) -> None:
    # The turn's first commit holds turn.started, its assembly and the
    # model.requested that sends it (one commit before the model request, not
    # two): when a client learns the turn's id, over SSE (headers) or over a
    # WebSocket (its "turn" message, sent as soon as the start returns), the
    # log already says the model was asked, and nothing later.
    first_events = ("turn.started", "assembly.step", "assembly.completed", "model.requested")
    service.upstream.enqueue(Reply(chunks=["one", "two"], pause_after=0))
    async with service.http.ws_connect(service.v1 + "/ws") as ws:
        await ws.send_json({"type": "chat", "request": {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}})
        ack = await ws.receive_json()
        assert ack["type"] == "turn"
        types = [e["type"] for e in await service.events(ack["turn_id"])]
        assert types[0] == "turn.started" and types[-1] == "model.requested", types
        assert all(t in first_events for t in types), types
    await service.upstream.paused.wait()  # the model was asked: let it answer
    service.upstream.release()
    await service.wait_status(ack["turn_id"], "completed")

    service.upstream.enqueue(Reply(chunks=["one", "two"], pause_after=0))
    body = {"model": "gpt-test", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with service.http.post(service.v1 + "/chat/completions", json=body, headers=service.headers) as resp:
        assert resp.status == 200
        turn_id = resp.headers["X-Turn-Id"]
        types = [e["type"] for e in await service.events(turn_id)]
        assert types[0] == "turn.started" and types[-1] == "model.requested", types
        await service.upstream.paused.wait()
        service.upstream.release()
        raw = (await resp.read()).decode()
    assert sse_text(raw) == "onetwo"
    view = await service.wait_status(turn_id, "completed")
    assert view["content"] == "onetwo"
