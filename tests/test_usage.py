"""Usage and quotas: ``GET /v1/usage`` sums what each user's turns spent from
the usage rollup (kept by the store in the commit of a turn's end), and
quotas refuse turns over them with 429 before anything is recorded."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from alembic import command
from sqlalchemy import Connection, text

from adapters.store.common import hash_api_key
from adapters.store.memory_usage import MemoryUsage
from adapters.store.migrate import alembic_config, migrate, migration_engine
from adapters.store.usage import SqlUsage, day_of
from engine.events import (
    ModelCompleted,
    ModelItem,
    ModelRequested,
    ToolsBatch,
    TurnCompleted,
    TurnFailed,
    TurnForked,
    TurnResumed,
    TurnStarted,
    make_event,
)
from engine.fold.turn_view import fold
from engine.ports import IndexUpdate, TurnRecord
from engine.run.fork import fork_log
from tests.backends import MEMORY, POSTGRES, SQLITE, SQLITE_ASYNC, Backend, Store
from tests.documents import upload, wait_file
from tests.harness import Service, make_settings, start_service, stop_service
from tests.processes import Server, cli
from tests.upstream import Reply, ScriptedUpstream

USER = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]


def _today() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d")


async def _chat(svc: Service, key: str, **body: Any) -> tuple[int, Any, dict[str, str]]:
    async with svc.http.post(svc.v1 + "/chat/completions", json={"messages": USER, **body}, headers={"Authorization": f"Bearer {key}"}) as resp:
        return resp.status, await resp.json(), dict(resp.headers)


async def _usage(svc: Service, key: str, query: str = "") -> tuple[int, Any]:
    async with svc.http.get(f"{svc.v1}/usage{query}", headers={"Authorization": f"Bearer {key}"}) as resp:
        return resp.status, await resp.json()


async def test_usage_sums_each_users_turns_per_model_and_day(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    svc = await start_service(make_settings(tmp_path, upstream.url, auth="on", database_url=database_url), upstream)
    try:
        store = svc.services.store
        alice, bob, root = await store.create_api_key("alice"), await store.create_api_key("bob"), await store.create_api_key("root", "admin")
        upstream.enqueue(
            Reply(text="one", usage={"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107}),
            # a client tool call: the turn ends with it
            Reply(
                tool_calls=[{"name": "lookup", "arguments": "{}", "id": "call_1"}],
                finish_reason="tool_calls",
                usage={"prompt_tokens": 50, "completion_tokens": 3},
            ),
            Reply(text="other", usage={"prompt_tokens": 20, "completion_tokens": 2}),
            Reply(text="bob's", usage={"prompt_tokens": 1000, "completion_tokens": 1}),
        )
        day = _today()
        assert (await _chat(svc, alice, model="gpt-test"))[0] == 200
        assert (await _chat(svc, alice, model="gpt-test", tools=TOOLS))[0] == 200
        assert (await _chat(svc, alice, model="gpt-other"))[0] == 200
        status, _, headers = await _chat(svc, bob, model="gpt-test")
        assert status == 200
        bobs_turn = headers["X-Turn-Id"]

        status, body = await _usage(svc, alice, "?group_by=model")
        assert status == 200, body
        assert body["object"] == "usage" and body["user"] == "alice"
        assert body["data"] == [
            {"model": "gpt-other", "turns": 1, "input_tokens": 20, "output_tokens": 2, "tool_calls": 0},
            {"model": "gpt-test", "turns": 2, "input_tokens": 150, "output_tokens": 10, "tool_calls": 1},
        ]
        assert body["total"] == {"turns": 3, "input_tokens": 170, "output_tokens": 12, "tool_calls": 1}
        status, body = await _usage(svc, alice, "?group_by=day")
        assert body["data"] == [{"day": day, "turns": 3, "input_tokens": 170, "output_tokens": 12, "tool_calls": 1}]
        # days outside the range: nothing
        tomorrow = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%d")
        status, body = await _usage(svc, alice, f"?since={tomorrow}&group_by=day")
        assert status == 200 and body["data"] == [] and body["total"]["turns"] == 0
        status, body = await _usage(svc, alice, f"?since={day}&until={day}")
        assert body["total"]["turns"] == 3

        # another user's: an admin's to read
        status, body = await _usage(svc, alice, "?user=bob")
        assert status == 403 and body["error"]["code"] == "admin_required"
        status, body = await _usage(svc, root, "?user=bob")
        assert status == 200 and body["total"] == {"turns": 1, "input_tokens": 1000, "output_tokens": 1, "tool_calls": 0}
        status, body = await _usage(svc, root, "")
        assert body["user"] == "root" and body["total"]["turns"] == 0

        # bad parameters name themselves
        for query, param in (
            ("?since=yesterday", "since"),
            ("?until=2026-13-01", "until"),
            ("?group_by=user", "group_by"),
            (f"?since={tomorrow}&until={day}", "since"),
        ):
            status, body = await _usage(svc, alice, query)
            assert status == 400 and body["error"]["param"] == param, (query, body)

        # The turn records the hash of the key that started it, never the key.
        events = (await svc.get(f"/v1/turns/{bobs_turn}/events", headers={"Authorization": f"Bearer {bob}"}))[1]["events"]
        assert events[0]["data"]["key_hash"] == hash_api_key(bob)
        assert bob not in json.dumps(events)
        usage = SqlUsage(store.engine)  # type: ignore[attr-defined]
        assert await usage.tokens_on(day, hash_api_key(bob)) == 1001
        assert await usage.tokens_on(day, None) == 1001 + 182

        # The rollup is a projection of the log: each turn's folded view sums to it.
        folded = [fold(r.id, await store.read(r.id)) for r in await store.list_turns(limit=100)]
        assert sum(int(str(v.usage["input_tokens"])) + int(str(v.usage["output_tokens"])) for v in folded if v.usage) == 1001 + 182

        # A fork records the key that made it, and counts as that key's turn.
        at = next(e["seq"] for e in events if e["type"] == "model.requested")
        upstream.enqueue(Reply(text="again", usage={"prompt_tokens": 3, "completion_tokens": 1}))
        async with svc.http.post(f"{svc.v1}/turns/{bobs_turn}/fork", json={"at": at}, headers={"Authorization": f"Bearer {bob}"}) as resp:
            assert resp.status == 201, await resp.text()
            forked = (await resp.json())["turn_id"]
        svc.headers = {"Authorization": f"Bearer {bob}"}
        await svc.wait_status(forked, "completed")
        assert (await svc.events(forked))[0]["data"]["key_hash"] == hash_api_key(bob)
        assert await usage.tokens_on(day, hash_api_key(bob)) == 1001 + 4
    finally:
        await stop_service(svc)


async def test_estimated_usage_is_flagged(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url), upstream)
    try:
        upstream.enqueue(
            Reply(text="counted by turnlog", ignore_include_usage=True), Reply(text="reported", usage={"prompt_tokens": 5, "completion_tokens": 1})
        )
        for _ in range(2):
            status, _, _ = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "stream": True})
            assert status == 200
        status, body = await svc.get("/v1/usage")
        assert status == 200 and body["user"] == "local", body
        assert body["total"]["turns"] == 2 and body["total"]["usage_estimated"] is True and body["total"]["estimated_turns"] == 1
        assert body["total"]["input_tokens"] > 5  # the estimate's prompt tokens are in the sum
    finally:
        await stop_service(svc)


async def test_a_turn_with_nul_characters_ends_and_is_counted(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    """JSON text may hold ``\\u0000``, which PostgreSQL's jsonb refuses: the
    rollup reads the turn around it instead of failing its terminal commit."""
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url), upstream)
    try:
        upstream.enqueue(Reply(text="x\x00y", usage={"prompt_tokens": 2, "completion_tokens": 1}))
        status, body, _ = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": [{"role": "user", "content": "a\x00b"}]})
        assert status == 200 and body["choices"][0]["message"]["content"] == "x\x00y", body
        status, body = await svc.get("/v1/usage")
        assert body["total"] == {"turns": 1, "input_tokens": 2, "output_tokens": 1, "tool_calls": 0}
    finally:
        await stop_service(svc)


async def test_background_task_model_calls_count_toward_the_turn(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url), upstream)
    try:
        upstream.enqueue(Reply(text="answer", usage={"prompt_tokens": 10, "completion_tokens": 2}))
        upstream.task_replies += [
            ("title", Reply(text='{"title": "T"}', usage={"prompt_tokens": 100, "completion_tokens": 1})),
            ("tags", Reply(text='{"tags": ["a"]}', usage={"prompt_tokens": 200, "completion_tokens": 2})),
            ("follow_ups", Reply(text='{"follow_ups": ["b"]}', usage={"prompt_tokens": 300, "completion_tokens": 3})),
        ]
        status, _, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "chat_id": "c"})
        assert status == 200
        view = await svc.wait_status(headers["X-Turn-Id"], "completed")
        assert (view["usage"]["input_tokens"], view["usage"]["output_tokens"]) == (610, 8)
        status, body = await svc.get("/v1/usage")
        assert body["total"] == {"turns": 1, "input_tokens": 610, "output_tokens": 8, "tool_calls": 0}
    finally:
        await stop_service(svc)  # verify: a re-run records the same usage


async def test_the_task_models_search_queries_count_toward_the_turn(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, chunk_tokens=24, chunk_overlap_tokens=4), upstream)
    try:
        status, body = await upload(svc.http, svc.url, "guide.md", b"# Proofing\n\nProof the shaped dough in the fridge for 12 hours.\n", "text/markdown")
        assert status == 200, body
        assert (await wait_file(svc.http, svc.url, body["id"]))["status"] == "ready"
        upstream.task_replies.append(("queries", Reply(text='{"queries": ["proofing time"]}', usage={"prompt_tokens": 40, "completion_tokens": 4})))
        upstream.enqueue(Reply(text="12 hours [1].", usage={"prompt_tokens": 100, "completion_tokens": 5}))
        request = {"model": "gpt-test", "messages": USER, "files": [{"type": "file", "id": body["id"]}]}
        status, data, headers = await svc.post("/v1/chat/completions", request)
        assert status == 200, data
        view = await svc.turn(headers["X-Turn-Id"])
        assert (view["usage"]["input_tokens"], view["usage"]["output_tokens"]) == (140, 9)
        status, body = await svc.get("/v1/usage")
        assert (body["total"]["input_tokens"], body["total"]["output_tokens"]) == (140, 9)
    finally:
        await stop_service(svc)


# --- the rollup, at the store: what a turn's end adds ---------------------------------


@pytest.fixture
async def store(store_backend: Backend) -> AsyncIterator[Store]:
    s = await store_backend.open(time.time)
    yield s
    await s.close()


def _view(status: str, input_tokens: int, output_tokens: int, calls: int = 0, estimated: bool = False) -> dict[str, Any]:
    view: dict[str, Any] = {
        "status": status,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        "output": [{"type": "function_call", "call_id": f"c{i}"} for i in range(calls)] + [{"type": "message"}],
    }
    if estimated:
        view["usage_estimated"] = True
    return view


@pytest.mark.backends(MEMORY, SQLITE, SQLITE_ASYNC, POSTGRES)
async def test_a_turns_end_rolls_up_in_its_commit_and_a_second_end_adds_the_difference(store: Store, store_backend: Backend) -> None:
    now = time.time()
    record = TurnRecord(id="turn_u1", chat_id="chat_u", user_id="ann", model="m1", status="running", created_at=now, updated_at=now, owner="o1")
    started = TurnStarted(chat_id="chat_u", user_id="ann", model="m1", request={}, key_hash="k" * 64)
    fencing = await store.start_turn(record, [make_event("turn_u1", 1, started, at=now)], lease_seconds=30)
    usage = MemoryUsage(store.database) if store_backend.name == MEMORY else SqlUsage(store.engine)  # type: ignore[union-attr]
    day = day_of(now)
    assert await usage.rows("ann", None, None) == []
    # Appends without an end add nothing.
    await store.append([make_event("turn_u1", 2, TurnFailed(error={"message": "x"}), at=now)], fencing=fencing, index=IndexUpdate(status="running"))
    assert await usage.rows("ann", None, None) == []
    await store.append(
        [make_event("turn_u1", 3, TurnFailed(error={"message": "x"}), at=now)],
        fencing=fencing,
        index=IndexUpdate(status="failed", view=_view("failed", 10, 2, calls=1)),
    )
    rows = await usage.rows("ann", None, None)
    assert [(r.day, r.model, r.counts) for r in rows] == [
        (day, "m1", {"turns": 1, "input_tokens": 10, "output_tokens": 2, "tool_calls": 1, "estimated_turns": 0})
    ]
    # Resumed and ended again: the same turn, only what it spent since.
    await store.append([make_event("turn_u1", 4, TurnResumed(from_seq=3, from_pos=0, epoch=1), at=now)], fencing=fencing, index=IndexUpdate(status="running"))
    await store.append(
        [make_event("turn_u1", 5, TurnCompleted(), at=now)],
        fencing=fencing,
        index=IndexUpdate(status="completed", view=_view("completed", 25, 4, calls=2, estimated=True)),
    )
    rows = await usage.rows("ann", None, None)
    assert [r.counts for r in rows] == [{"turns": 1, "input_tokens": 25, "output_tokens": 4, "tool_calls": 2, "estimated_turns": 1}]
    assert await usage.tokens_on(day, "k" * 64) == 29 and await usage.tokens_on(day, "other") == 0
    assert await usage.rows("bob", None, None) == []


async def _downgrade(url: str, revision: str) -> None:
    cfg, engine = alembic_config(url), migration_engine(url)

    def down(connection: Connection) -> None:
        cfg.attributes["connection"] = connection
        command.downgrade(cfg, revision)

    try:
        async with engine.begin() as conn:
            await conn.run_sync(down)
    finally:
        await engine.dispose()


@pytest.mark.backends(SQLITE, POSTGRES)
async def test_the_upgrade_sums_the_turns_that_had_ended_before_it(store_backend: Backend) -> None:
    """A database at the revision before the rollup, with ended turns (and one
    still running): the upgrade sums the ended ones; the running one is
    counted when it ends."""
    url = store_backend.url
    assert url is not None
    await _downgrade(url, "0012")  # (the fixture migrated to head)
    store = await store_backend.open(time.time)
    try:
        now = time.time()
        for n, (status, tokens) in enumerate((("completed", 10), ("failed", 5), ("running", 0))):
            turn_id = f"turn_old{n}"
            record = TurnRecord(id=turn_id, chat_id="c", user_id="old", model="m", status="running", created_at=now, updated_at=now, owner="o")
            fencing = await store.start_turn(
                record, [make_event(turn_id, 1, TurnStarted(chat_id="c", user_id="old", model="m", request={}), at=now)], lease_seconds=30
            )
            if status != "running":
                end = TurnCompleted() if status == "completed" else TurnFailed(error={"message": "x"})
                await store.append([make_event(turn_id, 2, end, at=now)], fencing=fencing, index=IndexUpdate(status=status, view=_view(status, tokens, 1)))
    finally:
        await store.close()
    await migrate(url)
    store = await store_backend.open(time.time)
    try:
        usage = SqlUsage(store.engine)  # type: ignore[union-attr]
        assert [r.counts for r in await usage.rows("old", None, None)] == [
            {"turns": 2, "input_tokens": 15, "output_tokens": 2, "tool_calls": 0, "estimated_turns": 0}
        ]
    finally:
        await store.close()


def test_a_fork_records_what_its_copied_events_spent() -> None:
    parent = [
        make_event("p", 1, TurnStarted(chat_id="c", user_id="u", model="m", request={}), at=1.0),
        make_event("p", 2, ModelRequested(), at=1.0),
        make_event("p", 3, ModelItem(item={"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}), at=1.0),
        make_event("p", 4, ModelCompleted(finish_reason="tool_calls", usage={"prompt_tokens": 50, "completion_tokens": 3}), at=1.0),
        make_event("p", 5, ToolsBatch(iteration=0, calls=[{"call_id": "c1", "name": "f", "arguments": "{}"}]), at=1.0),
    ]
    first = fork_log(parent, at=5, turn_id="f", chat_id="c2", key_hash="k" * 64)[0]
    assert first.type == "turn.forked" and first.data["key_hash"] == "k" * 64
    assert first.data["copied"] == {"input_tokens": 50, "output_tokens": 3, "tool_calls": 1}
    # nothing spent before the fork point: nothing recorded
    assert "copied" not in fork_log(parent, at=2, turn_id="f", chat_id="c2")[0].data


@pytest.mark.backends(MEMORY, SQLITE, SQLITE_ASYNC, POSTGRES)
async def test_a_forks_end_leaves_out_what_its_parent_counted(store: Store, store_backend: Backend) -> None:
    now = time.time()
    record = TurnRecord(id="turn_f1", chat_id="chat_f", user_id="ann", model="m1", status="running", created_at=now, updated_at=now, owner="o1")
    forked = TurnForked(parent_turn_id="turn_p", at=5, key_hash="k" * 64, copied={"input_tokens": 50, "output_tokens": 3, "tool_calls": 1})
    fencing = await store.start_turn(record, [make_event("turn_f1", 1, forked, at=now)], lease_seconds=30)
    end = IndexUpdate(status="completed", view=_view("completed", 60, 5, calls=2))  # the copies' 50/3/1 and its own 10/2/1
    await store.append([make_event("turn_f1", 2, TurnCompleted(), at=now)], fencing=fencing, index=end)
    usage = MemoryUsage(store.database) if store_backend.name == MEMORY else SqlUsage(store.engine)  # type: ignore[union-attr]
    assert [r.counts for r in await usage.rows("ann", None, None)] == [
        {"turns": 1, "input_tokens": 10, "output_tokens": 2, "tool_calls": 1, "estimated_turns": 0}
    ]
    assert await usage.tokens_on(day_of(now), "k" * 64) == 12


# --- quotas -------------------------------------------------------------------------


async def test_requests_per_minute_and_tokens_per_day_refuse_with_429_and_record_nothing(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, quota_requests_per_minute=2)
    svc = await start_service(settings, upstream)
    try:
        quotas = svc.services.quotas
        assert quotas is not None
        minute = time.time() // 60 * 60  # today's (the rollup's days are the real ones)
        quotas.clock = lambda: minute + 10  # 10 s into a minute: the window cannot end mid-test
        upstream.enqueue(
            Reply(text="a", usage={"prompt_tokens": 30, "completion_tokens": 1}), Reply(text="b", usage={"prompt_tokens": 1, "completion_tokens": 1})
        )
        admitted = [await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER}) for _ in range(2)]
        assert [status for status, _, _ in admitted] == [200, 200]
        status, body, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
        assert status == 429 and body["error"]["code"] == "rate_limit_exceeded" and body["error"]["type"] == "rate_limit_error"
        assert headers["Retry-After"] == "50"
        assert len(await svc.services.store.list_turns(limit=100)) == 2  # nothing recorded

        # The same on the WebSocket: an error message with retry_after.
        async with svc.http.ws_connect(svc.url + "/v1/ws") as ws:
            await ws.send_json({"type": "chat", "request": {"model": "gpt-test", "messages": USER}})
            message = await ws.receive_json(timeout=10)
        assert message == {"type": "error", "message": message["message"], "code": "rate_limit_exceeded", "retry_after": 50}
        # and on the Responses API
        status, body, headers = await svc.post("/v1/responses", {"model": "gpt-test", "input": "hi"})
        assert status == 429 and body["error"]["code"] == "rate_limit_exceeded" and headers["Retry-After"] == "50"
        assert len(await svc.services.store.list_turns(limit=100)) == 2

        # The next minute admits again; tokens per day: refused once the day's sum is over.
        for _, _, turn_headers in admitted:  # their background tasks done: the day's sum has them
            await svc.wait_status(turn_headers["X-Turn-Id"], "completed")
        quotas.clock = lambda: minute + 70
        quotas.service = type(quotas.service)(requests_per_minute=2, tokens_per_day=33)
        status, body, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
        assert status == 429 and "tokens per day" in body["error"]["message"], body
        assert int(headers["Retry-After"]) == 86400 - (minute + 70) % 86400
    finally:
        await stop_service(svc)


@pytest.mark.sqlite_only
async def test_a_keys_own_quotas_from_keys_create(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    settings = make_settings(tmp_path, upstream.url, auth="on")
    done = cli(settings.database_url, "keys", "create", "--user", "carol", "--requests-per-minute", "1")
    assert done.returncode == 0, done.stderr
    limited = done.stdout.strip()
    assert cli(settings.database_url, "keys", "create", "--user", "carol", "--tokens-per-day", "0").returncode == 2
    done = cli(settings.database_url, "keys", "create", "--user", "carol", "--tokens-per-day", "5")
    assert done.returncode == 0, done.stderr
    frugal = done.stdout.strip()
    svc = await start_service(settings, upstream)
    try:
        assert svc.services.quotas is not None
        minute = time.time() // 60 * 60
        svc.services.quotas.clock = lambda: minute + 10
        free = await svc.services.store.create_api_key("carol")
        assert (await _chat(svc, limited, model="gpt-test"))[0] == 200
        status, body, headers = await _chat(svc, limited, model="gpt-test")
        assert status == 429 and body["error"]["code"] == "rate_limit_exceeded" and headers["Retry-After"] == "50"
        assert (await _chat(svc, free, model="gpt-test"))[0] == 200  # the same user's other key: no quota

        # Tokens per day: the key's first turn spends 11 of its 5 (admitted: nothing
        # spent yet); the next is refused, another key of the same user is not.
        upstream.enqueue(Reply(text="x", usage={"prompt_tokens": 10, "completion_tokens": 1}))
        status, _, headers = await _chat(svc, frugal, model="gpt-test")
        assert status == 200
        svc.headers = {"Authorization": f"Bearer {frugal}"}
        await svc.wait_status(headers["X-Turn-Id"], "completed")
        status, body, headers = await _chat(svc, frugal, model="gpt-test")
        assert status == 429 and "this key's quota of 5 tokens per day" in body["error"]["message"], body
        assert (await _chat(svc, free, model="gpt-test"))[0] == 200
    finally:
        await stop_service(svc)


@pytest.mark.backends(POSTGRES)
async def test_two_processes_admit_exactly_60_of_61_requests_in_a_minute(pg_url: str, tmp_path: Path) -> None:
    """The counter row is shared: without it each process would admit its own 60."""
    upstream = ScriptedUpstream(models=["gpt-test"], default=Reply(text="ok"))
    await upstream.start()
    servers = [Server(pg_url, upstream.url, auto_resume=False, log_dir=tmp_path, TURNLOG_QUOTA_REQUESTS_PER_MINUTE="60") for _ in range(2)]
    try:
        async with aiohttp.ClientSession() as http:
            for server in servers:
                await server.ready(http)
            if time.time() % 60 > 30:  # the 61 requests must fall in one minute
                await asyncio.sleep(60.5 - time.time() % 60)
            minute = int(time.time() // 60)

            async def post(i: int) -> int:
                url = servers[i % 2].url + "/v1/chat/completions"
                async with http.post(url, json={"model": "gpt-test", "messages": USER}) as resp:
                    await resp.read()
                    return resp.status

            statuses = await asyncio.gather(*(post(i) for i in range(61)))
            assert int(time.time() // 60) == minute, "the requests spanned two minutes"
        assert sorted(statuses) == [200] * 60 + [429]
        from adapters.store import create_engine

        engine = create_engine(pg_url)
        try:
            async with engine.connect() as conn:
                assert (await conn.execute(text("SELECT count(*) FROM turns"))).scalar_one() == 60
        finally:
            await engine.dispose()
    finally:
        for server in servers:
            server.stop()
        await upstream.close()
