"""Auth isolation and bad input: every mistake a client can make gets a 4xx that names it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.harness import UPSTREAM_KEY, Service, make_settings, start_service, stop_service
from tests.upstream import Reply, ScriptedUpstream

USER = [{"role": "user", "content": "hello"}]


@pytest.fixture
async def authed(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> AsyncIterator[tuple[Service, str, str]]:
    svc = await start_service(make_settings(tmp_path, upstream.url, auth="on", database_url=database_url), upstream)
    store = svc.services.store
    alice = await store.create_api_key("alice")
    bob = await store.create_api_key("bob")
    try:
        yield svc, alice, bob
    finally:
        await stop_service(svc)


def as_user(svc: Service, key: str | None) -> Service:
    svc.headers = {"Authorization": f"Bearer {key}"} if key else {}
    return svc


async def test_auth_required_and_users_isolated(authed: tuple[Service, str, str]) -> None:
    svc, alice, bob = authed
    status, body, _ = await as_user(svc, None).post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
    assert status == 401 and body["error"]["code"] == "missing_api_key"
    status, body, _ = await as_user(svc, "tl-wrong").post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
    assert status == 401 and body["error"]["code"] == "invalid_api_key"

    status, body, headers = await as_user(svc, alice).post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "chat_id": "chat-alice"})
    assert status == 200, body
    turn_id = headers["X-Turn-Id"]
    assert (await as_user(svc, alice).get(f"/v1/turns/{turn_id}"))[0] == 200
    assert (await as_user(svc, alice).get("/v1/chats/chat-alice"))[0] == 200

    as_user(svc, bob)
    for path in (f"/v1/turns/{turn_id}", f"/v1/turns/{turn_id}/events", f"/v1/turns/{turn_id}/replay", f"/v1/turns/{turn_id}/stream", "/v1/chats/chat-alice"):
        status, body = await svc.get(path)
        assert status == 404 and body["error"]["type"] == "not_found_error", path
    assert (await svc.post(f"/v1/turns/{turn_id}/cancel"))[0] == 404
    assert (await svc.post(f"/v1/turns/{turn_id}/resume"))[0] == 404
    # (bob naming the same chat_id gets a chat of his own: tests/test_chat_scope.py)
    status, chats = await svc.get("/v1/chats")
    assert status == 200 and chats["data"] == []
    status, chats = await as_user(svc, alice).get("/v1/chats")
    assert [c["id"] for c in chats["data"]] == ["chat-alice"]


async def test_websocket_needs_a_key(authed: tuple[Service, str, str]) -> None:
    svc, alice, _ = authed
    async with svc.http.get(svc.v1 + "/ws") as resp:
        assert resp.status == 401
    async with svc.http.ws_connect(svc.v1 + f"/ws?access_token={alice}") as ws:
        await ws.send_json({"type": "subscribe", "turn_id": "turn_missing"})
        assert (await ws.receive_json())["code"] == "not_found"


@pytest.mark.parametrize(
    "raw, status, needle",
    [
        (b"{not json", 400, "malformed JSON"),
        (b"", 400, "empty"),
        (b"[1, 2]", 400, "JSON object"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', 400, "'model'"),
        (b'{"model": "gpt-test"}', 400, "'messages'"),
        (b'{"model": "gpt-test", "messages": []}', 400, "messages"),
        (b'{"model": "gpt-test", "messages": "hi"}', 400, "messages"),
        (b'{"model": "gpt-test", "messages": [{"role": "wizard", "content": "x"}]}', 400, "role"),
        (b'{"model": "gpt-test", "messages": [{"role": "user"}]}', 400, "content"),
        (b'{"model": "gpt-test", "messages": [{"role": "user", "content": "x"}], "stream": "yes please"}', 400, "stream"),
        (b'{"model": "gpt-test", "messages": [{"role": "user", "content": "x"}], "chat_id": "bad id!"}', 400, "chat_id"),
        (b'{"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}', 404, "no-such-model"),
    ],
)
async def test_bad_chat_requests(service: Service, raw: bytes, status: int, needle: str) -> None:
    async with service.http.post(service.v1 + "/chat/completions", data=raw, headers={"Content-Type": "application/json"}) as resp:
        body = await resp.json()
        assert resp.status == status, body
        assert needle in body["error"]["message"], body
        assert set(body["error"]) >= {"message", "type", "code"}


async def test_oversized_body_is_413(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    svc = await start_service(make_settings(tmp_path, upstream.url, max_body_bytes=1000), upstream)
    try:
        status, body, _ = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": [{"role": "user", "content": "x" * 5000}]})
        assert status == 413 and "too large" in body["error"]["message"]
    finally:
        await stop_service(svc)


async def test_bad_paths_and_queries(service: Service) -> None:
    for path, status in [
        ("/v1/turns/turn_unknown", 404),
        ("/v1/turns/turn_unknown/events", 404),
        ("/v1/chats/nope", 404),
        ("/v1/nothing-here", 404),
    ]:
        got, body = await service.get(path)
        assert got == status and "error" in body, path
    service.upstream.enqueue(Reply(text="x"))
    _, _, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
    turn_id = headers["X-Turn-Id"]
    for query in ("after=abc", "after=-1", "limit=0"):
        got, body = await service.get(f"/v1/turns/{turn_id}/events?{query}")
        assert got == 400, query
    got, body = await service.get(f"/v1/turns/{turn_id}/replay?upto=x")
    assert got == 400
    got, body = await service.get(f"/v1/turns/{turn_id}/stream", headers={"Last-Event-ID": "soon"})
    assert got == 400
    got, body = await service.get("/v1/chats?limit=zero")
    assert got == 400
    status, body, _ = await service.post(f"/v1/turns/{turn_id}/resume")
    assert status == 409
    async with service.http.get(service.v1 + "/chat/completions") as resp:
        assert resp.status == 405 and "error" in await resp.json()


@pytest.mark.sqlite_only
async def test_secrets_never_enter_the_log(service: Service, tmp_path: Path) -> None:
    service.upstream.enqueue(Reply(text="no secrets here"))
    status, _, _ = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "stream": False})
    assert status == 200
    # the upstream did get the key...
    assert service.upstream.request_headers[-1]["Authorization"] == f"Bearer {UPSTREAM_KEY}"
    await service.runner.cleanup()  # flush and close the database
    blob = await asyncio.to_thread(lambda: b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("turnlog.db")))
    assert b"no secrets here" in blob  # the log is really in these files
    assert UPSTREAM_KEY.encode() not in blob
