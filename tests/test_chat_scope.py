"""Chat ids are per user: two users choosing the same ``chat_id`` get two chats,
neither learns that the other's exists, and each sees the id it chose on every
surface (headers, turn views, events, chats, the inspector's views, the
WebSocket), while the log and the store hold a stored id of the user's own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from engine.json_types import JsonObject
from tests.harness import Service, make_settings, start_service, stop_service
from tests.upstream import Reply, ScriptedUpstream

QUIET: JsonObject = {"title": False, "tags": False, "follow_ups": False}


@pytest.fixture
async def authed(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> AsyncIterator[tuple[Service, str, str]]:
    svc = await start_service(make_settings(tmp_path, upstream.url, auth="on", database_url=database_url), upstream)
    store = svc.services.store
    alice, bob = await store.create_api_key("alice"), await store.create_api_key("bob")
    try:
        yield svc, alice, bob
    finally:
        await stop_service(svc)


def as_user(svc: Service, key: str) -> Service:
    svc.headers = {"Authorization": f"Bearer {key}"}
    return svc


async def _say(svc: Service, key: str, chat_id: str, text: str, answer: str) -> str:
    svc.upstream.enqueue(Reply(text=answer))
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": text}], "chat_id": chat_id, "background_tasks": QUIET}
    status, out, headers = await as_user(svc, key).post("/v1/chat/completions", body)
    assert status == 200, out
    assert headers["X-Chat-Id"] == chat_id
    return headers["X-Turn-Id"]


def _sent_texts(svc: Service) -> list[str]:
    """What the upstream's last request held, as texts (the chat's history)."""
    return [m["content"] for m in svc.upstream.requests[-1]["messages"] if isinstance(m.get("content"), str)]


async def test_two_users_same_chat_id_get_two_chats(authed: tuple[Service, str, str]) -> None:
    svc, alice, bob = authed
    a1 = await _say(svc, alice, "plans", "alice one", "for alice")
    # bob names the same id: his own new chat, not a 404 that says alice's exists
    b1 = await _say(svc, bob, "plans", "bob one", "for bob")
    assert _sent_texts(svc) == ["bob one"]  # nothing of alice's chat reached bob's turn
    a2 = await _say(svc, alice, "plans", "alice two", "again")
    assert _sent_texts(svc) == ["alice one", "for alice", "alice two"]

    store = svc.services.store
    stored: dict[str, str] = {}
    for turn_id in (a1, b1, a2):
        record = await store.get_turn(turn_id)
        assert record is not None
        stored[turn_id] = record.chat_id
    assert stored[a1] == stored[a2] != stored[b1]
    assert "plans" not in (stored[a1], stored[b1])  # the store keeps the scoped id
    started = (await store.read(a1))[0]
    assert started.type == "turn.started" and started.data["chat_id"] == stored[a1]
    assert started.data["request"]["chat_id"] == stored[a1]  # and so does the log

    for key, turns, texts in ((alice, [a1, a2], ["alice one", "for alice", "alice two", "again"]), (bob, [b1], ["bob one", "for bob"])):
        as_user(svc, key)
        status, chat = await svc.get("/v1/chats/plans")
        assert status == 200 and chat["id"] == "plans"
        assert [m["content"] for m in chat["messages"]] == texts
        status, chats = await svc.get("/v1/chats")
        assert [c["id"] for c in chats["data"]] == ["plans"]
        for turn_id in turns:
            assert (await svc.turn(turn_id))["chat_id"] == "plans"
            status, replay = await svc.get(f"/v1/turns/{turn_id}/replay")
            assert replay["chat_id"] == "plans"
            first = (await svc.events(turn_id))[0]
            assert first["data"]["chat_id"] == "plans" and first["data"]["request"]["chat_id"] == "plans"
            status, timeline = await svc.get(f"/v1/ui/turns/{turn_id}/timeline")
            assert timeline["events"][0]["data"]["chat_id"] == "plans"
            status, summary = await svc.get(f"/v1/ui/turns/{turn_id}/summary")
            assert summary["turn"]["chat_id"] == "plans"
            async with svc.http.get(svc.v1 + f"/turns/{turn_id}/stream", headers=svc.headers) as resp:
                assert resp.status == 200 and resp.headers["X-Chat-Id"] == "plans"
                await resp.read()
        status, listed = await svc.get("/v1/ui/turns?chat_id=plans")
        assert sorted(t["id"] for t in listed["data"]) == sorted(turns)
        assert {t["chat_id"] for t in listed["data"]} == {"plans"}


async def test_chats_from_before_the_scoping_still_resolve_for_their_owner(authed: tuple[Service, str, str]) -> None:
    """A chat stored under the client's id as it is (as every chat was before
    the scoping) stays that chat for its owner, and only for its owner."""
    svc, alice, bob = authed
    svc.upstream.enqueue(Reply(text="from before"))
    request: JsonObject = {"model": "gpt-test", "messages": [{"role": "user", "content": "old question"}], "chat_id": "old-chat", "background_tasks": QUIET}
    actor = await svc.services.supervisor.start_turn(request=request, user_id="alice", model="gpt-test")
    await as_user(svc, alice).wait_status(actor.turn_id, "completed")

    as_user(svc, alice)
    status, chat = await svc.get("/v1/chats/old-chat")
    assert status == 200 and chat["id"] == "old-chat" and len(chat["messages"]) == 2
    new = await _say(svc, alice, "old-chat", "new question", "continued")
    assert _sent_texts(svc) == ["old question", "from before", "new question"]
    record = await svc.services.store.get_turn(new)
    assert record is not None and record.chat_id == "old-chat"  # the same stored chat, not a new scoped one

    b = await _say(svc, bob, "old-chat", "bob here", "hi bob")
    assert _sent_texts(svc) == ["bob here"]
    status, chat = await as_user(svc, bob).get("/v1/chats/old-chat")
    assert status == 200 and [m["content"] for m in chat["messages"]] == ["bob here", "hi bob"]
    record = await svc.services.store.get_turn(b)
    assert record is not None and record.chat_id != "old-chat"


async def _ws_turn(svc: Service, key: str, chat_id: str, text: str) -> tuple[str, list[dict[str, Any]]]:
    """A turn over the WebSocket: the ``turn`` message and its events until it completes."""
    svc.upstream.enqueue(Reply(text=f"answer to {text}"))
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": text}], "chat_id": chat_id, "background_tasks": QUIET}
    events: list[dict[str, Any]] = []
    async with svc.http.ws_connect(svc.v1 + f"/ws?access_token={key}") as ws:
        await ws.send_json({"type": "chat", "request": body})
        first = await ws.receive_json()
        assert first["type"] == "turn" and first["chat_id"] == chat_id, first
        while True:
            message = await ws.receive_json()
            assert message["type"] != "error", message
            if message["type"] == "event":
                events.append(message["event"])
                if message["event"]["type"] == "turn.completed":
                    return first["turn_id"], events


async def test_websocket_shows_and_takes_the_chosen_chat_id(authed: tuple[Service, str, str]) -> None:
    svc, alice, bob = authed
    a_turn, a_events = await _ws_turn(svc, alice, "ws-chat", "alice asks")
    b_turn, b_events = await _ws_turn(svc, bob, "ws-chat", "bob asks")
    assert _sent_texts(svc) == ["bob asks"]
    for events in (a_events, b_events):
        assert events[0]["type"] == "turn.started"
        assert events[0]["data"]["chat_id"] == "ws-chat" and events[0]["data"]["request"]["chat_id"] == "ws-chat"
    a_stored, b_stored = await svc.services.store.get_turn(a_turn), await svc.services.store.get_turn(b_turn)
    assert a_stored is not None and b_stored is not None and a_stored.chat_id != b_stored.chat_id

    # subscribing by the chosen chat id finds the caller's chat (none of its
    # turns runs: nothing is sent); the next message answers the next request
    for key in (alice, bob):
        async with svc.http.ws_connect(svc.v1 + f"/ws?access_token={key}") as ws:
            await ws.send_json({"type": "subscribe", "chat_id": "ws-chat"})
            await ws.send_json({"type": "subscribe", "turn_id": "turn_missing"})
            message = await ws.receive_json()
            assert message["type"] == "error" and message["message"] == "turn not found", message
            await ws.send_json({"type": "subscribe", "chat_id": "no-such-chat"})
            message = await ws.receive_json()
            assert message["type"] == "error" and message["message"] == "chat not found", message
