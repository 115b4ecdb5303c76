"""The inspector's JSON views (``/v1/ui/…``) without a browser: a timeline
scrolled page by page (each page continues the fold the page before it left),
and the turn listing's derived statuses (running, interrupted) paged by the
database.

The timeline's oracle is the turn's log as ``GET /v1/turns/{id}/events`` gives
it, folded one prefix at a time; the listing's is the leases the test wrote.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from engine.events import Event, TurnStarted, make_event
from engine.fold.spans import spans
from engine.fold.turn_view import TurnView
from engine.json_types import JsonValue
from engine.ports import TurnRecord
from tests.harness import Service, make_settings, start_service, stop_service
from tests.upstream import Reply, ScriptedUpstream

USER: list[JsonValue] = [{"role": "user", "content": "Tell me a long story"}]


async def timeline(svc: Service, turn_id: str, after: int, limit: int) -> dict[str, Any]:
    status, body = await svc.get(f"/v1/ui/turns/{turn_id}/timeline?after={after}&limit={limit}")
    assert status == 200, body
    return body


async def test_a_scrolled_timeline_gives_the_state_after_every_event(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    # One chunk per delta event: a long answer is a long log.
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, flush_max_chunks=1, flush_interval=0.001)
    svc = await start_service(settings, upstream)
    try:
        upstream.enqueue(Reply(chunks=[f"w{i} " for i in range(300)]))
        status, body, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
        assert status == 200, body
        turn_id = headers["X-Turn-Id"]
        log = await svc.events(turn_id)
        assert len(log) > 300
        view = TurnView(turn_id)
        states = []
        for event in log:
            view.apply(Event(turn_id=turn_id, seq=event["seq"], type=event["type"], at=event["at"], data=event["data"]))
            states.append(view.state)
        expected = [(e["seq"], e["type"], state) for e, state in zip(log, states, strict=True)]

        # scrolled to the end, a page at a time
        got: list[tuple[int, str, str]] = []
        after, more = 0, True
        while more:
            page = await timeline(svc, turn_id, after, 64)
            got += [(r["seq"], r["type"], r["state"]) for r in page["events"]]
            after, more = page["next_after"], page["has_more"]
        assert got == expected
        # pages asked out of order, twice, or past the end: the same rows
        for start in (100, 100, 64, 0, 250):
            page = await timeline(svc, turn_id, start, 50)
            assert [(r["seq"], r["type"], r["state"]) for r in page["events"]] == expected[start : start + 50], start
        page = await timeline(svc, turn_id, len(log), 50)
        assert page["events"] == [] and page["has_more"] is False and page["next_after"] == len(log)
    finally:
        await stop_service(svc)


async def test_running_and_interrupted_turns_are_paged_by_the_database(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    # No resume: the turns without an owner stay interrupted while they are listed.
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, auto_resume=False), upstream)
    try:
        store = svc.services.store
        now = time.time()

        async def running_row(turn_id: str, at: float, lease_seconds: float) -> None:
            started = TurnStarted(chat_id="chat-rows", user_id="local", model="gpt-test", stream=True, request={"messages": USER})
            record = TurnRecord(
                id=turn_id,
                chat_id="chat-rows",
                user_id="local",
                model="gpt-test",
                status="running",
                created_at=at,
                updated_at=at,
                owner="proc_elsewhere",
            )
            await store.start_turn(record, [make_event(turn_id, 1, started, at=at)], lease_seconds=lease_seconds)

        for i in range(5):  # interleaved in time: gone, held, gone, held, gone
            await running_row(f"turn_{'gone' if i % 2 == 0 else 'held'}_{i}", now + i, -60.0 if i % 2 == 0 else 600.0)

        async def listed(query: str) -> dict[str, Any]:
            status, body = await svc.get(f"/v1/ui/turns?{query}")
            assert status == 200, body
            return body

        first = await listed("status=interrupted&limit=2")
        assert [(t["id"], t["status"]) for t in first["data"]] == [("turn_gone_4", "interrupted"), ("turn_gone_2", "interrupted")]
        assert first["has_more"] is True
        rest = await listed("status=interrupted&limit=2&offset=2")
        assert [t["id"] for t in rest["data"]] == ["turn_gone_0"] and rest["has_more"] is False
        held = await listed("status=running&limit=1")
        assert [(t["id"], t["status"]) for t in held["data"]] == [("turn_held_3", "running")] and held["has_more"] is True
        held = await listed("status=running&limit=1&offset=1")
        assert [t["id"] for t in held["data"]] == ["turn_held_1"] and held["has_more"] is False
        everything = await listed("limit=10")
        assert [t["status"] for t in everything["data"]] == ["interrupted", "running", "interrupted", "running", "interrupted"]
    finally:
        await stop_service(svc, verify=False)  # the rows are the test's, not turns that ran


async def test_the_spans_of_a_tool_turn_point_at_its_events(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, monkeypatch: Any) -> None:
    from tests.tools_fixtures import write_tools

    monkeypatch.setenv("TURNLOG_TEST_TOOL_LOG", str(tmp_path / "tool.log"))
    settings = make_settings(tmp_path, upstream.url, tools_dir=str(write_tools(tmp_path / "tools")), database_url=database_url)
    svc = await start_service(settings, upstream)
    try:
        upstream.enqueue(
            Reply(tool_calls=[{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call_add"}], finish_reason="tool_calls"),
            Reply(text="It is 5.", chunk_size=3),
        )
        status, body, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "tool_ids": ["weather"]})
        assert status == 200, body
        turn_id = headers["X-Turn-Id"]
        log = await svc.events(turn_id)
        requested = [e["seq"] for e in log if e["type"] == "model.requested"]
        completed = [e["seq"] for e in log if e["type"] == "model.completed"]
        tool = [e["seq"] for e in log if e["type"] in ("tool.started", "tool.completed")]
        assert len(requested) == 2 and len(tool) == 2

        status, got = await svc.get(f"/v1/turns/{turn_id}/spans")
        assert status == 200, got
        assert (got["turn_id"], got["last_seq"], got["start"], got["end"]) == (turn_id, log[-1]["seq"], log[0]["at"], log[-1]["at"])
        models = [s for s in got["spans"] if s["kind"] == "model"]
        assert [(s["seq"], s["end_seq"], s["status"]) for s in models] == [(requested[0], completed[0], "completed"), (requested[1], completed[1], "completed")]
        tools = [s for s in got["spans"] if s["kind"] == "tool"]
        assert [(s["name"], s["seq"], s["end_seq"], s["status"]) for s in tools] == [("add", tool[0], tool[1], "completed")]
        assert got["spans"][0]["kind"] == "assembly" and got["marks"][-1]["type"] == "turn.completed"
        # a SQL store reads an outline (no delta text): the same spans as from the whole log
        whole = spans(turn_id, [Event(turn_id=turn_id, seq=e["seq"], type=e["type"], at=e["at"], data=e["data"]) for e in log])
        assert got == whole

        status, missing = await svc.get("/v1/turns/no-such-turn/spans")
        assert status == 404, missing
    finally:
        await stop_service(svc)
