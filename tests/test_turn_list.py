"""``GET /v1/turns``: the caller's turns found by their words, filtered and
keyset paged, against the real service and the scripted upstream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness import Service, make_settings, start_service, stop_service
from tests.upstream import Reply, ScriptedUpstream


async def turn(svc: Service, messages: list[dict[str, Any]], reply: Reply, chat_id: str | None = None) -> str:
    svc.upstream.enqueue(reply)
    body: dict[str, Any] = {"model": "gpt-test", "messages": messages}
    if chat_id is not None:
        body["chat_id"] = chat_id
    _, _, headers = await svc.post("/v1/chat/completions", body)
    return headers["X-Turn-Id"]


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


async def ids(svc: Service, query: str) -> list[str]:
    status, body = await svc.get("/v1/turns?" + query)
    assert status == 200, body
    return [t["id"] for t in body["data"]]


async def test_turns_are_found_by_their_new_messages_and_answers_and_paged(service: Service) -> None:
    svc = service
    t1 = await turn(svc, [user("Tell me about zebras")], Reply(text="Zebras have stripes."), chat_id="c1")
    t2 = await turn(svc, [user("and okapis?")], Reply(text="Okapis are shy."), chat_id="c1")  # the history is stored
    # a client that sends the whole conversation again, without a chat id
    resent = [user("Tell me about zebras"), {"role": "assistant", "content": "Zebras have stripes."}, user("what about lions?")]
    t3 = await turn(svc, resent, Reply(text="Lions roar."))
    t4 = await turn(svc, [user("this one breaks")], Reply(status=500, error_message="upstream on fire"))

    assert await ids(svc, "q=zebras") == [t1]  # not the history t2 and t3 carry
    assert await ids(svc, "q=Lions") == [t3]
    assert await ids(svc, "q=roar") == [t3]
    assert await ids(svc, "q=stripe*") == [t1]
    assert await ids(svc, "status=failed") == [t4]
    assert await ids(svc, "failed=true") == [t4]
    assert await ids(svc, "tools=true") == []
    assert await ids(svc, "chat_id=c1") == [t2, t1]
    assert await ids(svc, "model=gpt-test&q=okapis") == [t2]
    status, body = await svc.get("/v1/turns?q=zebras")
    (item,) = body["data"]
    assert item["first_message"] == "Tell me about zebras" and item["chat_id"] == "c1" and item["status"] == "completed"
    assert item["model"] == "gpt-test" and item["used_tools"] is False
    shown = (await svc.get(f"/v1/turns/{t1}"))[1]
    assert shown.get("title") and item["title"] == shown["title"]  # the background task's title
    assert "title" not in (await svc.get("/v1/turns?q=okapis"))[1]["data"][0]  # a chat's first turn only has one
    created = item["created_at"]
    assert await ids(svc, f"since={created}&until={created + 0.000001}") == [t1]
    assert await ids(svc, "since=2000-01-01&until=2000-01-02") == []

    # keyset pages: each one starts after the last turn of the one before
    status, page = await svc.get("/v1/turns?limit=3")
    assert [t["id"] for t in page["data"]] == [t4, t3, t2] and page["next_before"] == t2
    status, page = await svc.get(f"/v1/turns?limit=3&before={t2}")
    assert [t["id"] for t in page["data"]] == [t1] and page["next_before"] is None

    status, chats = await svc.get("/v1/ui/chats")
    opened = {c["id"]: c["first_message"] for c in chats["data"]}
    assert opened["c1"] == "Tell me about zebras"  # its first turn's
    assert sorted(opened.values()) == ["Tell me about zebras", "this one breaks", "what about lions?"]

    status, counts = await svc.get("/v1/ui/turns/counts?q=zebras")
    assert counts == {"total": 1, "by_status": {"completed": 1}, "models": ["gpt-test"]}
    status, counts = await svc.get("/v1/ui/turns/counts?status=failed")  # status aside
    assert (counts["total"], counts["by_status"]) == (4, {"completed": 3, "failed": 1})


@pytest.mark.sqlite_only
@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("status=bogus", "status"),
        ("q=" + "x" * 201, "q"),
        ("q=" + "+".join(["w"] * 17), "q"),
        ("since=yesterday", "since"),
        ("until=nan", "until"),
        ("before=no-such-turn", "before"),
        ("limit=0", "limit"),
        ("limit=many", "limit"),
        ("tools=maybe", "tools"),
    ],
)
async def test_bad_queries_are_400s_naming_the_parameter(service: Service, query: str, param: str) -> None:
    status, body = await service.get("/v1/turns?" + query)
    assert status == 400, body
    assert body["error"]["param"] == param


@pytest.fixture
async def authed(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> Any:
    svc = await start_service(make_settings(tmp_path, upstream.url, auth="on", database_url=database_url), upstream)
    try:
        store = svc.services.store
        keys = {name: await store.create_api_key(name) for name in ("alice", "bob")}
        keys["root"] = await store.create_api_key("root", role="admin")
        yield svc, keys
    finally:
        await stop_service(svc)


@pytest.mark.sqlite_only
async def test_only_an_admin_reads_another_users_turns(authed: Any) -> None:
    svc, keys = authed
    made = {}
    for name in ("alice", "bob"):
        svc.headers = {"Authorization": f"Bearer {keys[name]}"}
        made[name] = await turn(svc, [user(f"zebra question from {name}")], Reply(text="ok"), chat_id="mine")
    svc.headers = {"Authorization": f"Bearer {keys['alice']}"}
    status, body = await svc.get("/v1/turns?q=zebra")
    assert [t["id"] for t in body["data"]] == [made["alice"]] and body["data"][0]["chat_id"] == "mine"
    status, body = await svc.get("/v1/turns?user=bob")
    assert status == 403 and body["error"]["param"] == "user"
    status, body = await svc.get(f"/v1/turns?before={made['bob']}")  # another's turn is no cursor of hers
    assert status == 400 and body["error"]["param"] == "before"
    svc.headers = {"Authorization": f"Bearer {keys['root']}"}
    status, body = await svc.get("/v1/turns?user=bob&q=zebra")
    assert status == 200 and [t["id"] for t in body["data"]] == [made["bob"]]
    assert body["data"][0]["chat_id"] == "mine"  # as bob sees it
    assert await ids(svc, "q=zebra") == []  # the admin's own turns: none
